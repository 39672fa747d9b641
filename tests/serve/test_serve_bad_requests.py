"""Bad requests get a 4xx with a message naming what was wrong, never a 500, and the server keeps
serving. Run with ``-s`` to print the list (kind, status, message)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
Image = pytest.importorskip("PIL.Image", reason="building test images needs Pillow")

OK = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 4, "seed": 1}


def _png(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _cases():
    tiny = _png(Image.new("RGB", (64, 64), (1, 2, 3)))
    huge = _png(Image.new("1", (8200, 8200)))  # 67 Mpixels in a few KB of PNG
    noise = base64.b64decode(_png(Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8))))
    cut = base64.b64encode(noise[: len(noise) // 2]).decode()  # an upload cut short, inside the pixel data
    t2i, i2i, oai = "/sdapi/v1/txt2img", "/sdapi/v1/img2img", "/v1/images/generations"
    # (kind, method, path, json body or raw bytes, status, words the message must hold)
    return [
        ("malformed JSON", "POST", t2i, b'{"prompt": "x",', 400, "not valid JSON"),
        ("NaN literal", "POST", t2i, b'{"prompt": "x", "cfg_scale": NaN}', 400, "NaN is not a JSON number"),
        ("empty body", "POST", t2i, b"", 400, "empty"),
        ("body not UTF-8", "POST", t2i, b'{"prompt": "\xff\xfe"}', 400, "not UTF-8"),
        ("JSON array, not object", "POST", t2i, [1, 2], 422, "must be a JSON object"),
        ("steps as a string", "POST", t2i, {**OK, "steps": "many"}, 422, "steps must be an integer"),
        ("steps 0", "POST", t2i, {**OK, "steps": 0}, 400, "steps must be at least 1"),
        ("steps over the limit", "POST", t2i, {**OK, "steps": 10000}, 400, "limit of 150"),
        ("width over the limit", "POST", t2i, {**OK, "width": 4096}, 400, "width is 4096, above"),
        ("negative height", "POST", t2i, {**OK, "height": -8}, 400, "height must be at least 8"),
        ("batch_size over the limit", "POST", t2i, {**OK, "batch_size": 100}, 400, "batch_size is 100"),
        ("too many images", "POST", t2i, {**OK, "batch_size": 8, "n_iter": 8}, 400, "64 images"),
        ("cfg_scale as a string", "POST", t2i, {**OK, "cfg_scale": "high"}, 422, "cfg_scale must be a number"),
        ("sampler_name as a number", "POST", t2i, {**OK, "sampler_name": 7}, 422, "sampler_name must be a string"),
        ("unknown sampler", "POST", t2i, {**OK, "sampler_name": "Bogus Sampler"}, 400, "Bogus Sampler"),
        ("unknown sampler: every name listed", "POST", t2i, {**OK, "sampler_name": "Bogus Sampler"}, 400,
         "use one of the known names. A1111 labels: Euler, Euler a, LMS"),
        ("mistyped sampler: the closest named", "POST", t2i, {**OK, "sampler_name": "DPM fats"}, 400,
         "unknown sampler 'DPM fats' (the closest known: 'DPM fast')"),
        ("a sampler sdrt lacks", "POST", t2i, {**OK, "sampler_name": "Restart"}, 400,
         "the sampler 'Restart' is not available in sdrt"),
        ("unknown scheduler", "POST", t2i, {**OK, "scheduler": "zigzag"}, 400, "zigzag"),
        ("seed as a string", "POST", t2i, {**OK, "seed": "lucky"}, 422, "seed must be an integer"),
        ("seed out of range", "POST", t2i, {**OK, "seed": 2**64}, 400,
         "seed must be -9223372036854775808 to 18446744073709551615, got 18446744073709551616"),
        ("seeds past 2**64", "POST", t2i, {**OK, "seed": 2**64 - 2, "batch_size": 4}, 400,
         "leaves no room for 4 consecutive seeds below 2**64"),
        # a lone surrogate escape (no UTF-8 text holds one) in any string: was a 500 writing the PNG or the reply
        ("lone surrogate in the prompt", "POST", t2i, b'{"prompt": "x \\ud800"}', 400,
         "prompt holds a lone surrogate U+D800 at character 2"),
        ("lone surrogate in the negative prompt", "POST", t2i, b'{"prompt": "x", "negative_prompt": "\\udce9"}', 400,
         "negative_prompt holds a lone surrogate U+DCE9"),
        ("lone surrogate in a task id", "POST", t2i, b'{"prompt": "x", "force_task_id": "\\uDFFF"}', 400,
         "force_task_id holds a lone surrogate"),
        ("lone surrogate in a style", "POST", t2i, b'{"prompt": "x", "styles": ["a", "\\ud800"]}', 400,
         "styles[1] holds a lone surrogate"),
        ("lone surrogate in a key", "POST", t2i, b'{"prompt": "x", "\\ud800": 1}', 400, "a key of the body holds a lone"),
        ("OpenAI: lone surrogate in the prompt", "POST", oai, b'{"prompt": "\\ud800"}', 400, "lone surrogate"),
        ("a surrogate pair is text", "POST", t2i, b'{"prompt": "x \\ud83d\\ude00", "steps": 0}', 400,
         "steps must be at least 1"),
        ("JSON nested too deeply", "POST", t2i, b'{"prompt": "x", "a": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400,
         "nests too deeply"),
        ("cfg_scale 1e308", "POST", t2i, {**OK, "cfg_scale": 1e308}, 400, "cfg_scale must be at most 100"),
        ("prompt too long", "POST", t2i, {**OK, "prompt": "a " * 20000}, 400, "prompt has 40000 characters"),
        ("model path in override_settings", "POST", t2i,
         {**OK, "override_settings": {"sd_model_checkpoint": "../../etc/passwd"}}, 400, "no model named"),
        ("override_settings not an object", "POST", t2i, {**OK, "override_settings": "fast"}, 422,
         "override_settings must be an object"),
        ("LoRA path in the prompt", "POST", t2i, {**OK, "prompt": "x <lora:../../secret:1>"}, 400,
         "not a LoRA of this server"),
        ("LoRA weight not a number", "POST", t2i, {**OK, "prompt": "x <lora:a:abc>"}, 400,
         "the weight 'abc' of <lora:a:abc> is not a number"),
        ("OpenAI: LoRA weight not a number", "POST", "/v1/images/generations", {"prompt": "x <lora:a:abc>"}, 400,
         "the weight 'abc' of <lora:a:abc> is not a number"),
        ("size the model cannot take", "POST", t2i, {**OK, "width": 128, "height": 128}, 400,
         "the model demo-a refused the request"),
        ("img2img without init_images", "POST", i2i, OK, 400, "img2img needs init_images"),
        ("init image not base64", "POST", i2i, {**OK, "init_images": ["%%%not base64%%%"]}, 400, "not valid base64"),
        ("init image not an image", "POST", i2i, {**OK, "init_images": [base64.b64encode(b"hello").decode()]}, 400,
         "not a readable image"),
        ("init image over the pixel limit", "POST", i2i, {**OK, "init_images": [huge]}, 400, "8200x8200, above"),
        ("denoising_strength 0", "POST", i2i, {**OK, "init_images": [tiny], "denoising_strength": 0}, 400,
         "denoising_strength must be above 0"),
        ("denoising_strength 1.5", "POST", i2i, {**OK, "init_images": [tiny], "denoising_strength": 1.5}, 400,
         "at most 1"),
        ("mask not base64", "POST", i2i, {**OK, "init_images": [tiny], "mask": "???"}, 400, "mask is not valid base64"),
        ("body over the size limit", "POST", t2i, {**OK, "comments": {"x": "y" * (2 * 2**20)}}, 413, "limit of"),
        ("unknown model in options", "POST", "/sdapi/v1/options", {"sd_model_checkpoint": "/etc/passwd"}, 400,
         "no model named '/etc/passwd'"),
        ("options not an object", "POST", "/sdapi/v1/options", ["x"], 422, "must be a JSON object"),
        # both were a 200: gif was read back while images stayed PNG, null changed nothing
        ("options: samples_format gif", "POST", "/sdapi/v1/options", {"samples_format": "gif"}, 400,
         "samples_format 'gif' is not supported: this server writes png only"),
        ("options: samples_format 5", "POST", "/sdapi/v1/options", {"samples_format": 5}, 400,
         "samples_format 5 is not supported"),
        ("options: sd_model_checkpoint null", "POST", "/sdapi/v1/options", {"sd_model_checkpoint": None}, 400,
         "sd_model_checkpoint must name a model of this server, got null"),
        ("options: sd_vae not listed", "POST", "/sdapi/v1/options", {"sd_vae": "/etc/passwd"}, 400,
         "sd_vae: no VAE file named '/etc/passwd'; this server's VAE files: none; put VAE .safetensors files in a VAE"),
        ("options: a module path with ..", "POST", "/sdapi/v1/options", {"forge_additional_modules": ["../x/ae.safetensors"]},
         400, "forge_additional_modules[0]: '../x/ae.safetensors' is a path"),
        ("options: modules not a list", "POST", "/sdapi/v1/options", {"forge_additional_modules": {"a": 1}}, 422,
         "forge_additional_modules must be a list"),
        ("sd_vae override not listed", "POST", t2i, {**OK, "override_settings": {"sd_vae": "ae.safetensors"}}, 400,
         "override_settings.sd_vae: no VAE file named 'ae.safetensors'"),
        ("wrong method", "GET", t2i, None, 405, "GET is not allowed"),
        ("unknown route", "GET", "/sdapi/v1/nothing-here", None, 404, "no route"),
        ("a 20000-character route is not echoed whole", "GET", "/x" * 10000, None, 404,
         "no route " + "/x" * 100 + "..."),
        ("OpenAI: no prompt", "POST", oai, {"n": 1}, 400, "prompt is required"),
        ("OpenAI: bad size", "POST", oai, {"prompt": "x", "size": "huge"}, 400, "size must be WIDTHxHEIGHT"),
        # size errors spoke of width= (the Python keyword); the caller sent size
        ("OpenAI: size not a multiple of 8", "POST", oai, {"prompt": "x", "size": "65x64"}, 400,
         "size 65x64: width 65 is not a multiple of 8; pass a size whose sides are multiples of 8"),
        # a size the model cannot make: its fix read "pass width=64 and height=64", fields the caller has not
        ("OpenAI: size the model cannot take", "POST", oai, {"prompt": "x", "size": "128x128"}, 400,
         "size 128x128: the model demo-a refused the request: this model makes 64x64 images only (its unet is "
         "exported for that size) and 128x128 was asked; pass size 64x64, or leave size unset"),
        # a cut upload said only "(OSError)"
        ("init image truncated", "POST", i2i, {**OK, "init_images": [cut]}, 400,
         "init_images[0] is not a readable image (the image file is truncated (an incomplete upload?))"),
        ("OpenAI: size far too large", "POST", oai, {"prompt": "x", "size": "99999999x99999999"}, 400,
         "size 99999999x99999999 is above this server's limit"),  # was "size must be WIDTHxHEIGHT"
        ("OpenAI: unknown field", "POST", oai, {"prompt": "x", "sizee": "64x64"}, 400,
         "unrecognized request argument 'sizee'"),  # was dropped silently
        ("OpenAI: stream", "POST", oai, {"prompt": "x", "stream": True}, 400, "stream is not supported"),
        ("OpenAI: n 0", "POST", oai, {"prompt": "x", "n": 0}, 400, "n must be at least 1"),
        ("OpenAI: unknown response_format", "POST", oai, {"prompt": "x", "response_format": "jpeg"}, 400,
         "response_format must be"),
        ("OpenAI: LoRA path in the prompt", "POST", oai, {"prompt": "x <lora:/etc/x:1>"}, 400,
         "not a LoRA of this server"),
        ("OpenAI: unknown model", "POST", oai, {"prompt": "x", "model": "dall-e-3"}, 400, "no model named 'dall-e-3'"),
        ("progress body not an object", "POST", "/internal/progress", "task", 422, "JSON object"),
    ]


@pytest.fixture(scope="module")
def small_server(models_dir):
    from sdrt.serve import Limits, ServeConfig

    with live_server(ServeConfig(models=models_dir, backend="openvino", limits=Limits(max_body_bytes=2**20))) as url:
        yield url


def test_bad_requests_are_4xx_and_the_server_keeps_serving(small_server) -> None:
    cases = _cases()
    assert len(cases) >= 20
    rows = []
    with httpx.Client(base_url=small_server, timeout=60) as client:
        for kind, method, path, body, status, words in cases:
            if isinstance(body, bytes):
                r = client.request(method, path, content=body, headers={"content-type": "application/json"})
            else:
                r = client.request(method, path, json=body)
            data = r.json()
            message = data["error"]["message"] if path.startswith("/v1/") else data["detail"]
            rows.append(f"{kind:34s} {r.status_code}  {message[:150]}")
            assert r.status_code == status, (kind, r.status_code, message)
            assert words in message, (kind, message)
        ok = client.post("/sdapi/v1/txt2img", json=OK)
        assert ok.status_code == 200 and len(ok.json()["images"]) == 1
    print("\n" + "\n".join(rows) + f"\nthen a good txt2img: {ok.status_code}")


def test_queue_full_is_503(models_dir) -> None:
    import threading
    import time

    from sdrt.serve import Limits, ServeConfig

    with live_server(ServeConfig(models=models_dir, backend="openvino", limits=Limits(max_queue=1))) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            long = {**OK, "steps": 150, "n_iter": 32}
            threads = [threading.Thread(target=client.post, args=("/sdapi/v1/txt2img",), kwargs={"json": long})
                       for _ in range(2)]
            threads[0].start()
            while client.get("/sdrt/status").json()["running"] < 1:  # the one worker is busy
                pass
            threads[1].start()
            while client.get("/sdrt/status").json()["queued"] < 1:  # and one job waits
                pass
            r = client.post("/sdapi/v1/txt2img", json=OK)
            assert r.status_code == 503 and "queue is full" in r.json()["detail"]
            assert r.headers["retry-after"] == "2"
            for t in threads:  # interrupt each long job once it runs
                deadline = time.time() + 120
                while t.is_alive() and time.time() < deadline:
                    client.post("/sdapi/v1/interrupt")
                    t.join(timeout=0.2)
            assert client.post("/sdapi/v1/txt2img", json=OK).status_code == 200


def test_a_pipeline_refusal_names_request_fields_without_python_keyword_syntax() -> None:
    """An inpainting model sent no mask: the fix read "pass init_images and mask=" ({@mask=}, the Python keyword)."""
    from sdrt.errors import InputError
    from sdrt.serve.errors import from_pipeline

    exc = InputError("this is an inpainting UNet (9 input channels): it needs an init image and a mask", where="mask",
                     fix="pass {@init_image=} and {@mask=}, or use an ordinary model")
    err = from_pipeline(exc)
    assert err.message.endswith("; pass init_images and mask, or use an ordinary model") and err.field == "mask"
