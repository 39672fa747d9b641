"""What an exploratory sweep of the A1111 and OpenAI routes on the demo model found (each failed before its fix)."""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time

import httpx
import numpy as np
import pytest
from serve_helpers import live_server, needs_server, png_b64, png_rgb, serve_app

from sdrt import pipelines

pytestmark = needs_server


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(pipelines.DEMO_MODEL, root / "demo")
    (root / "ControlNet").mkdir()
    (root / "ControlNet" / "cn.safetensors").write_bytes(b"xx")  # a truncated download
    (root / "ESRGAN").mkdir()
    (root / "ESRGAN" / "up.safetensors").write_bytes(b"xx")
    return root


@pytest.fixture(scope="module")
def url(root):
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root, backend="openvino")) as u:
        yield u


def test_an_unreadable_controlnet_file_is_named_by_its_name_and_not_listed(url, root):
    with httpx.Client(base_url=url, timeout=300) as c:
        assert [u["name"] for u in c.get("/sdapi/v1/upscalers").json()] == ["None", "Lanczos", "Nearest"]
        assert c.get("/controlnet/model_list").json()["model_list"] == []  # as the broken upscaler is left out
        unit = {"model": "cn [e3b0c442]", "image": png_b64(np.zeros((64, 64, 3), np.uint8))}
        r = c.post("/sdapi/v1/txt2img", json={"steps": 1, "width": 64, "height": 64,
                                              "alwayson_scripts": {"controlnet": {"args": [unit]}}})
    assert r.status_code == 400, r.text
    body = r.json()
    assert str(root) not in r.text and "/ControlNet/" not in r.text, body["message"]  # no server path
    assert body["field"] == "alwayson_scripts.controlnet.args[0].model"
    assert "cn.safetensors cannot be read" in body["message"], body["message"]


@pytest.mark.parametrize("query", ["skip_current_image=banana", "skip_current_image=2"])
def test_progress_refuses_a_query_flag_that_is_no_boolean(url, query):
    with httpx.Client(base_url=url, timeout=300) as c:
        r = c.get(f"/sdapi/v1/progress?{query}")
        assert r.status_code == 422, r.text  # as /controlnet/model_list?update=banana
        assert r.json()["field"] == "skip_current_image"
        assert "skip_current_image must be true or false" in r.json()["message"]
        assert c.get("/sdapi/v1/progress?skip_current_image=true").status_code == 200


@pytest.mark.parametrize("size", ["70x64", "65x64", "10x10"])
def test_an_edit_size_off_the_grid_is_refused_as_generations_refuses_it(url, size):
    picture = base64.b64decode(png_b64(np.zeros((64, 64, 3), np.uint8)))
    with httpx.Client(base_url=url, timeout=300) as c:
        gen = c.post("/v1/images/generations", json={"prompt": "x", "size": size, "steps": 1})
        edit = c.post("/v1/images/edits", files={"image": ("a.png", picture, "image/png")},
                      data={"prompt": "x", "size": size, "steps": "1"})
    assert gen.status_code == 400, gen.text
    assert edit.status_code == 400, edit.text  # 70x64 ran at 64x64 with a note naming width, a field edits lacks
    error = edit.json()["error"]
    assert error["param"] == "size" and error == gen.json()["error"], (error, gen.json())
    assert error["message"].startswith(f"size {size}: width {size.split('x')[0]} is not a multiple of 8; "), error
    assert "width:" not in error["message"] and "height" not in error["message"], error


def _refusal(r, status: int = 400) -> tuple[str, str | None]:
    assert r.status_code == status, r.text
    return r.json()["message"], r.json().get("field")


def test_a_body_that_is_no_json_is_said_in_plain_words(url):
    with httpx.Client(base_url=url, timeout=300) as c:
        post = lambda text: c.post("/sdapi/v1/txt2img", content=text,  # noqa: E731
                                   headers={"content-type": "application/json"})
        message, _ = _refusal(post('{"prompt": "ab'))
        assert message == "the request body is not valid JSON (Unterminated string starting at line 1 column 12)"
        message, _ = _refusal(post('{"seed": ' + "9" * 5000 + "}"))
        assert "sys.set_int_max_str_digits" not in message  # Python's advice, for the server's code
        assert message.startswith("the request body holds a number of 5000 digits, more than the 4300"), message


def test_a_value_outside_a_fields_range_is_not_called_a_server_limit(url):
    picture = png_b64(np.zeros((64, 64, 3), np.uint8))
    img2img = {"steps": 1, "init_images": [picture]}
    with httpx.Client(base_url=url, timeout=300) as c:
        assert _refusal(c.post("/sdapi/v1/img2img", json={**img2img, "resize_mode": 7})) == (
            "resize_mode must be 0 to 3, got 7", "resize_mode")
        assert _refusal(c.post("/sdapi/v1/img2img", json={**img2img, "mask": picture, "inpainting_fill": 9})) == (
            "inpainting_fill must be 0 to 3, got 9", "inpainting_fill")
        assert _refusal(c.post("/sdapi/v1/extra-single-image", json={"image": picture, "resize_mode": 5})) == (
            "resize_mode must be 0 or 1, got 5", "resize_mode")


def test_an_override_is_named_by_its_full_path(url):
    with httpx.Client(base_url=url, timeout=300) as c:
        clip = c.post("/sdapi/v1/txt2img", json={"steps": 1, "override_settings": {"CLIP_stop_at_last_layers": 100}})
        model = c.post("/sdapi/v1/txt2img", json={"steps": 1, "override_settings": {"sd_model_checkpoint": "nope"}})
    assert _refusal(model)[1] == "override_settings.sd_model_checkpoint"
    assert _refusal(clip) == ("override_settings.CLIP_stop_at_last_layers must be 1 to 12, got 100",
                              "override_settings.CLIP_stop_at_last_layers")


def test_a_full_queue_of_one_job_says_job(root):
    from sdrt.serve import ServeConfig, create_app
    from sdrt.serve.config import Limits

    app = create_app(ServeConfig(models=root, backend="openvino", limits=Limits(max_queue=1)))
    worker = app.state.sdrt.queue.workers[0]
    body = {"prompt": "x", "steps": 1, "width": 64, "height": 64}
    with serve_app(app) as u, httpx.Client(base_url=u, timeout=300) as c:
        with worker.busy:  # the worker held (as /reload-checkpoint holds it): one job taken, one waiting
            posts = [threading.Thread(target=lambda: httpx.post(f"{u}/sdapi/v1/txt2img", json=body, timeout=300))
                     for _ in range(2)]
            for t in posts:
                t.start()
                time.sleep(0.5)
            deadline = time.monotonic() + 30
            while app.state.sdrt.queue.queued() < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            full = c.post("/sdapi/v1/txt2img", json=body)
        for t in posts:
            t.join(timeout=120)
    assert _refusal(full, 503)[0] == "the queue is full (1 job waiting); try again shortly"


def test_a_clip_skip_option_deeper_than_the_model_runs_at_its_deepest(url):
    """The demo model's text encoder has 3 hidden states: the server-wide option 5 made every plain request a 400
    until someone reset it; a request that sends 5 itself is still refused."""
    body = {"steps": 1, "seed": 3, "width": 64, "height": 64}
    with httpx.Client(base_url=url, timeout=300) as c:
        at_3 = c.post("/sdapi/v1/txt2img", json={**body, "override_settings": {"CLIP_stop_at_last_layers": 3}})
        assert at_3.status_code == 200, at_3.text
        assert c.post("/sdapi/v1/options", json={"CLIP_stop_at_last_layers": 5}).status_code == 200
        try:
            plain = c.post("/sdapi/v1/txt2img", json=body)
            sent = c.post("/sdapi/v1/txt2img", json={**body, "override_settings": {"CLIP_stop_at_last_layers": 5}})
        finally:
            assert c.post("/sdapi/v1/options", json={"CLIP_stop_at_last_layers": 1}).status_code == 200
    assert plain.status_code == 200, plain.text
    info = json.loads(plain.json()["info"])
    assert "CLIP_stop_at_last_layers: the server's option 5 ran at 3 on demo, whose text encoder has 3 hidden " \
           "states" in info["sdrt_not_honoured"], info["sdrt_not_honoured"]
    assert "Clip skip: 3" in info["infotexts"][0]
    assert plain.json()["images"] == at_3.json()["images"]  # the same image as clip skip 3 sent
    message, field = _refusal(sent)
    assert field == "override_settings.CLIP_stop_at_last_layers", (field, message)
    assert "its largest clip skip is 3; use an override_settings.CLIP_stop_at_last_layers from 1 to 3" in message


def _infotext(b64: str) -> str:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(b64))).info.get("parameters", "")


def test_openai_generations_keep_the_servers_options_as_txt2img_does(url):
    # the server's options (POST /sdapi/v1/options) hold on /v1/images/generations as on txt2img and on
    # /v1/images/edits: the generations route ran without them (randn_source, CLIP_stop_at_last_layers, ...)
    with httpx.Client(base_url=url, timeout=300) as c:
        before = c.get("/sdapi/v1/options").json()["randn_source"]
        assert c.post("/sdapi/v1/options", json={"randn_source": "NV"}).status_code == 200
        try:
            job = {"prompt": "a cat", "size": "64x64", "steps": 1, "seed": 7}
            r = c.post("/v1/images/generations", json=job)
            a1111 = c.post("/sdapi/v1/txt2img", json={"prompt": "a cat", "width": 64, "height": 64, "steps": 1,
                                                       "seed": 7})
        finally:
            c.post("/sdapi/v1/options", json={"randn_source": before})
        assert r.status_code == 200, r.text
        openai_text = _infotext(r.json()["data"][0]["b64_json"])
        assert "RNG: NV" in openai_text, openai_text
        assert np.array_equal(png_rgb(r.json()["data"][0]["b64_json"]), png_rgb(a1111.json()["images"][0]))
        r = c.post("/v1/images/generations", json={"prompt": "a cat", "size": "65x64", "n": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "size", r.text
        r = c.post("/v1/images/generations", json={"prompt": "a cat", "size": "64x64", "n": 0})
        assert r.status_code in (400, 422) and r.json()["error"]["param"] == "n", r.text
