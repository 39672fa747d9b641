"""Safe by default: localhost unless told, HTTP basic (A1111's --api-auth) or bearer tokens, and
names that resolve only inside the configured folders."""

from __future__ import annotations

import base64

import pytest
from serve_helpers import live_server, needs_server

from sdrt.errors import InputError

httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_allowed() -> None:
    from sdrt.serve.auth import allowed, parse_api_auth

    users = parse_api_auth("alice:s3cret, bob:pw:with:colons")
    assert users == (("alice", "s3cret"), ("bob", "pw:with:colons"))
    assert allowed(_basic("alice", "s3cret"), users, ())
    assert allowed(_basic("bob", "pw:with:colons"), users, ())
    assert not allowed(_basic("alice", "wrong"), users, ())
    assert not allowed(_basic("mallory", "s3cret"), users, ())
    assert not allowed("Basic %%%", users, ())
    assert not allowed(None, users, ())
    assert allowed("Bearer tok-1", (), ("tok-1",)) and not allowed("Bearer tok-2", (), ("tok-1",))
    assert allowed(None, (), ())  # nothing configured: open (the CLI binds to localhost then)
    for bad in ("alice", ":pw", "alice:", ""):
        with pytest.raises(InputError, match="--api-auth takes user:password"):
            parse_api_auth(bad)


def test_cli_defaults_and_flags(tmp_path) -> None:
    from sdrt.cli import build_parser
    from sdrt.cli.serve import config_from_args

    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.port == 7860
    config = config_from_args(args)
    assert config.models is None and config.devices == (None,) and config.auth == () and config.tokens == ()
    args = build_parser().parse_args(["serve", "--models", str(tmp_path), "--device", "CPU", "--device", "CPU",
                                      "--api-auth", "u:p", "--api-token", "t", "--max-size", "1024",
                                      "--max-steps", "50", "--max-body-mb", "4"])
    config = config_from_args(args)
    assert config.devices == ("CPU", "CPU") and config.auth == (("u", "p"),) and config.tokens == ("t",)
    assert config.limits.max_width == 1024 and config.limits.max_steps == 50
    assert config.limits.max_body_bytes == 4 * 2**20
    assert config.vae_dir is None and config.text_encoder_dir is None  # the models folder's VAE/, text_encoder/
    config = config_from_args(build_parser().parse_args(["serve", "--vae-dir", str(tmp_path), "--text-encoder-dir",
                                                         str(tmp_path)]))
    assert config.vae_dir == config.text_encoder_dir == tmp_path.resolve()
    from sdrt.serve.state import ServerState

    with pytest.raises(InputError, match="no model named 'nope'"):
        ServerState(config_from_args(build_parser().parse_args(["serve", "--default-model", "nope"])))
    for argv, words in ((["--models", str(tmp_path / "none")], "is not a folder"),
                        (["--max-steps", "0"], "--max-steps 0 is below 1"),
                        (["--max-steps", "100000"], "--max-steps 100000 is above 10000, the most sdrt generates"),
                        (["--max-size", "100000"], "--max-size 100000 is above 16384"),
                        (["--max-batch", "1000"], "--max-batch 1000 is above 256"),
                        (["--vae-dir", str(tmp_path / "none")], "--vae-dir .* is not a folder"),
                        (["--text-encoder-dir", str(tmp_path / "none")], "--text-encoder-dir .* is not a folder"),
                        (["--api-auth", "nocolon"], "user:password"),
                        (["--api-token", " "], "empty --api-token"),
                        (["--port", "99999"], "--port 99999 is not a TCP port"),
                        (["--ray-gpus", "2"], "--ray-gpus applies to a Ray Serve deployment, and --ray was not given"),
                        (["--ray-address", "auto"], "--ray-address applies to a Ray Serve deployment"),
                        (["--checkpoint-base", "nope"], "no --models was given"),
                        (["--models", str(tmp_path), "--checkpoint-base", "nope"],
                         f"--models {tmp_path} holds no model folder named 'nope'")):
        with pytest.raises(InputError, match=words):
            config_from_args(build_parser().parse_args(["serve", *argv]))


def test_a_port_in_use_or_an_address_not_here_is_an_error_about_the_flag(capsys) -> None:
    """Before the server starts, in one line: not uvicorn's log line after sdrt printed its URL."""
    import socket

    from sdrt.cli import main

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    err = capsys.readouterr()
    assert f"port {port} on 127.0.0.1 is in use. Where: --port." in err.err and "sdrt serve: http" not in err.out
    assert main(["serve", "--host", "192.0.2.1"]) == 1  # TEST-NET-1: never an address of this machine
    assert "cannot listen on 192.0.2.1:7860" in capsys.readouterr().err


def test_names_resolve_only_inside_the_folders(models_dir, tmp_path) -> None:
    from sdrt.serve.errors import ApiError
    from sdrt.serve.registry import Registry

    loras = tmp_path / "loras"
    loras.mkdir()
    (loras / "ink.safetensors").write_bytes(b"\0" * 16)
    (tmp_path / "secret.safetensors").write_bytes(b"\0" * 16)
    reg = Registry(models_dir, lora_dir=loras)
    assert [m.name for m in reg.models] == ["demo-a", "demo-b"]  # notes.txt is not a model
    assert reg.model("demo-b").path == models_dir / "demo-b"
    assert reg.model("DEMO-B [whatever]").name == "demo-b"
    for name in ("../demo-a", str(models_dir / "demo-a"), "/etc/passwd", "demo-a/../demo-b", "notes.txt", ""):
        with pytest.raises(ApiError, match="no model named"):
            reg.model(name)
    reg.check_loras(["ink"])
    for name in ("../secret", str(tmp_path / "secret"), "ink.safetensors", "ink/../ink"):
        with pytest.raises(ApiError, match="not a LoRA of this server"):
            reg.check_loras([name])


@needs_server
def test_auth_on_every_route(models_dir) -> None:
    from sdrt.serve import ServeConfig

    config = ServeConfig(models=models_dir, backend="openvino", auth=(("alice", "s3cret"),), tokens=("tok",))
    with live_server(config) as url, httpx.Client(base_url=url, timeout=60) as c:
        for method, path in (("GET", "/sdapi/v1/sd-models"), ("GET", "/sdapi/v1/options"),
                             ("POST", "/sdapi/v1/txt2img"), ("POST", "/sdapi/v1/interrupt"),
                             ("POST", "/v1/images/generations"), ("GET", "/internal/ping"), ("GET", "/nothing")):
            r = c.request(method, path, json={"prompt": "x"})
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"] == 'Basic realm="sdrt"'
        assert c.get("/sdapi/v1/options", headers={"Authorization": _basic("alice", "wrong")}).status_code == 401
        assert c.get("/sdapi/v1/options", headers={"Authorization": _basic("alice", "s3cret")}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer tok"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer nope"}).json()["error"]["type"] == \
            "invalid_request_error"
        # no CORS unless asked: a browser page elsewhere gets no Access-Control-Allow-Origin
        r = c.get("/sdapi/v1/options", headers={"Origin": "http://evil.example", "Authorization": "Bearer tok"})
        assert "access-control-allow-origin" not in r.headers


@needs_server
def test_cors_allow_origins(models_dir) -> None:
    from sdrt.serve import ServeConfig

    config = ServeConfig(models=models_dir, backend="openvino", tokens=("tok",), cors_origins=("http://app.local",))
    with live_server(config) as url, httpx.Client(base_url=url, timeout=60) as c:
        pre = c.options("/sdapi/v1/txt2img", headers={"Origin": "http://app.local", "Access-Control-Request-Method":
                                                      "POST", "Access-Control-Request-Headers": "authorization"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://app.local"
        r = c.get("/sdapi/v1/options", headers={"Origin": "http://app.local", "Authorization": "Bearer tok"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.local"
        other = c.get("/sdapi/v1/options", headers={"Origin": "http://evil.example", "Authorization": "Bearer tok"})
        assert "access-control-allow-origin" not in other.headers


def test_a_folder_whose_model_index_is_broken_is_not_listed(tmp_path, caplog) -> None:
    """A model folder whose model_index.json is not valid JSON was listed in sd-models and failed every request
    naming it with a 500; it is skipped with a warning, and a request naming it is a 400 that says why."""
    import shutil

    from sdrt import pipelines
    from sdrt.serve.errors import ApiError
    from sdrt.serve.registry import Registry

    for name in ("demo-b", "demo-c"):
        shutil.copytree(pipelines.DEMO_MODEL, tmp_path / name)
    (tmp_path / "demo-c" / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline", ')
    with caplog.at_level("WARNING", logger="sdrt.serve.registry"):
        reg = Registry(tmp_path)
    assert [m.name for m in reg.models] == ["demo-b"]
    assert "not serving" in caplog.text and "demo-c" in caplog.text
    with pytest.raises(ApiError) as exc:
        reg.model("demo-c")
    assert exc.value.status == 400 and "demo-c is not served: the model_index.json is not valid JSON" in str(
        exc.value), str(exc.value)


def test_a_folder_missing_a_part_is_not_listed(tmp_path, caplog) -> None:
    """A model folder missing a part (a Flux export whose T5 failed, a transformer folder alone) was listed in
    sd-models, and a request naming it was a 500 "internal error" carrying the loader's message; it is skipped with a
    warning, and a request naming it is a 400 that says which part is missing."""
    from pathlib import Path

    from sdrt.serve.errors import ApiError
    from sdrt.serve.registry import Registry

    flux = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-flux-dev"
    (tmp_path / "whole").mkdir()
    (tmp_path / "no-t5").mkdir()
    for p in flux.iterdir():
        (tmp_path / "whole" / p.name).symlink_to(p)
        if p.name != "text_encoder_2":
            (tmp_path / "no-t5" / p.name).symlink_to(p)
    with caplog.at_level("WARNING", logger="sdrt.serve.registry"):
        reg = Registry(tmp_path)
    assert [m.name for m in reg.models] == ["whole"]
    assert "not serving" in caplog.text and "no-t5" in caplog.text
    with pytest.raises(ApiError) as exc:
        reg.model("no-t5")
    assert exc.value.status == 400 and "no-t5 is not served: the model folder lacks text_encoder_2" in str(
        exc.value), str(exc.value)


def test_models_naming_one_model_folder_or_file_says_to_pass_the_folder_holding_it(tmp_path) -> None:
    """A newcomer's first try, `sdrt serve --models my-model` (or `--models model.safetensors`): one line naming
    the folder that holds it, not "holds no model" after a warning, nor "is not a folder"."""
    from sdrt.cli import build_parser
    from sdrt.cli.serve import config_from_args

    model = tmp_path / "my-model"
    model.mkdir()
    (model / "model_index.json").write_text("{}")
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(b"")
    for path in (model, ckpt):
        with pytest.raises(InputError, match=f"takes the folder that holds models.*--models {tmp_path}"):
            config_from_args(build_parser().parse_args(["serve", "--models", str(path)]))
