"""What the request fuzz (tests/serve/test_serve_fuzz.py) found, each as a hand-written case: in process (Starlette's
TestClient on the ASGI app), on copies of the demo model under tiny limits."""

from __future__ import annotations

import pytest
from serve_helpers import needs_server

pytestmark = needs_server
pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")

T2I = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 1, "seed": 1}


@pytest.fixture(scope="module")
def client(models_dir):
    from starlette.testclient import TestClient

    from sdrt.serve import Limits, ServeConfig, create_app

    limits = Limits(max_width=64, max_height=64, max_steps=4, max_batch=1, max_images=1)
    with TestClient(create_app(ServeConfig(models=models_dir, backend="openvino", limits=limits)),
                    raise_server_exceptions=False) as c:
        yield c


def _refused(r, status: int) -> tuple[str, str]:
    assert r.status_code == status, (r.status_code, r.text)
    data = r.json()
    return data["detail"], data["field"]


@pytest.mark.parametrize("key", ["sd_model_checkpoint", "randn_source", "hires_fix_refiner_pass"])
@pytest.mark.parametrize("value", [0, False, [], {}])
def test_an_override_of_the_wrong_type_is_refused_not_dropped(client, key, value) -> None:
    """override_settings' model, random source and refiner pass that were 0, false, [] or {} ran with the server's
    option (``overrides.get(key) or options.get(key)``): a 200 that silently dropped what the client sent."""
    r = client.post("/sdapi/v1/txt2img", json={**T2I, "override_settings": {key: value}})
    assert r.status_code in (400, 422), r.text
    message, field = r.json()["detail"], r.json()["field"]
    assert field == f"override_settings.{key}" and f"override_settings.{key}" in message, message


def test_an_empty_override_still_means_the_servers_option(client) -> None:
    r = client.post("/sdapi/v1/txt2img", json={**T2I, "override_settings": {"sd_model_checkpoint": "",
                                                                              "randn_source": None}})
    assert r.status_code == 200, r.text


def test_a_samplers_own_step_check_names_sampler_name(client) -> None:
    """UniPC needs two steps, which only the run finds (img2img runs steps x denoising_strength): the 400's field was
    "sampler uni_pc", no request field, and the message named neither sampler_name nor the sampler as sent."""
    message, field = _refused(client.post("/sdapi/v1/txt2img", json={**T2I, "sampler_name": "UniPC", "steps": 1}),
                              400)
    assert field == "sampler_name"
    assert message == ("the model demo-a refused the request: sampler_name: uni_pc needs at least 2 steps, got 1; use "
                       "more steps, or euler for a single step")


def test_the_second_passs_sampler_check_names_hr_sampler_name(tmp_path) -> None:
    """The same check in the hires. fix's second pass names the second pass's own sampler field."""
    import shutil
    from pathlib import Path

    from starlette.testclient import TestClient

    from sdrt.serve import ServeConfig, create_app

    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sdxl-dyn", tmp_path / "dyn")
    body = {**T2I, "width": 32, "height": 32, "steps": 2, "enable_hr": True, "hr_scale": 2, "hr_upscaler": "Lanczos",
            "hr_sampler_name": "UniPC", "hr_second_pass_steps": 1, "denoising_strength": 1}
    with TestClient(create_app(ServeConfig(models=tmp_path, backend="openvino")), raise_server_exceptions=False) as c:
        message, field = _refused(c.post("/sdapi/v1/txt2img", json=body), 400)
        # (A1111's UniPC takes the hires steps less one and refuses fewer than its order, 3: sdrt.pipelines.compvis)
        assert field == "hr_sampler_name" and "hr_sampler_name: uni_pc needs at least 4 steps" in message, message
        body["sampler_name"] = "UniPC"  # both passes' sampler: the first pass's field
        body["steps"] = 1
        message, field = _refused(c.post("/sdapi/v1/txt2img", json=body), 400)
        assert field == "sampler_name", message


LONG = "y" * 30000


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/sdapi/v1/txt2img", {**T2I, "sampler_name": LONG}, "sampler_name"),
    ("/sdapi/v1/txt2img", {**T2I, "sampler_index": LONG}, "sampler_index"),
    ("/sdapi/v1/txt2img", {**T2I, "scheduler": LONG}, "scheduler"),
    ("/sdapi/v1/options", {"samples_format": LONG}, "samples_format"),
    ("/sdapi/v1/options", {"samples_format": [LONG]}, "samples_format"),
    ("/v1/images/generations", {"prompt": "x", "response_format": LONG}, "response_format"),
    ("/v1/images/generations", {"prompt": "x", "output_format": LONG}, "output_format"),
    ("/v1/images/generations", {"prompt": "x", LONG: 1}, "y" * 100),
    ("/v1/images/edits", {"prompt": "x", "image": "", LONG: 1}, "y" * 100),
], ids=["sampler_name", "sampler_index", "scheduler", "samples_format", "samples_format-list", "response_format",
        "output_format", "openai-key", "edits-key"])
def test_a_long_value_is_not_echoed_whole(client, path, body, field) -> None:
    """An unknown sampler, schedule, samples_format, response_format or output_format, and an unknown OpenAI argument,
    were echoed whole in the 400: a 30000-character value made a 30000-character message (and field)."""
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    data = r.json()
    message, got = (data["error"]["message"], data["error"]["param"]) if path.startswith("/v1/") else \
        (data["detail"], data["field"])
    assert got == field and len(message) < 1000 and field in message, (len(message), message[:200])


def test_a_models_file_is_named_not_its_server_path(client, models_dir) -> None:
    """A clip skip the text encoder cannot give said where the encoder's graph is on the server
    (/tmp/.../demo-a/text_encoder/model.onnx): the server answers with names, never paths."""
    message, field = _refused(client.post("/sdapi/v1/txt2img", json={
        **T2I, "override_settings": {"CLIP_stop_at_last_layers": 12}}), 400)
    assert field == "override_settings.CLIP_stop_at_last_layers"  # the request's override, named in full
    assert str(models_dir) not in message and "(demo-a/text_encoder/model.onnx)" in message, message


@pytest.mark.parametrize(("sizes", "field"), [({"hr_resize_x": 8, "hr_resize_y": 8}, "hr_resize_x"),
                                              ({"hr_resize_y": 8}, "hr_resize_y")])
def test_a_fixed_size_models_hires_refusal_names_the_field_sent(client, sizes, field) -> None:
    """The model's refusal of a second pass at another size named hr_scale ("leave hr_scale unset") for a request
    that sent hr_resize_x / hr_resize_y and no hr_scale."""
    body = {**T2I, "width": None, "height": None, "enable_hr": True, **sizes}
    message, got = _refused(client.post("/sdapi/v1/txt2img", json=body), 400)
    assert got == field and f"leave {field} unset" in message and "hr_scale" not in message, message


def _chunk(kind: bytes, body: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_png_info_refuses_a_text_bomb(client) -> None:
    """zTXt chunks were each inflated up to 16 MB with no bound on their sum: 12 of them (a 200 KB upload) answered
    192 MB of JSON, and a 32 MB upload could ask for ~30 GB. The text of a PNG is read up to 16 MB in all."""
    import base64
    import io
    import time
    import zlib

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    png = buf.getvalue()
    bomb = zlib.compress(b"a" * (16 * 2**20), 9)
    chunks = b"".join(_chunk(b"zTXt", f"k{i}".encode() + b"\0\0" + bomb) for i in range(12))
    start = time.time()
    message, field = _refused(client.post("/sdapi/v1/png-info", json={
        "image": base64.b64encode(png[:33] + chunks + png[33:]).decode()}), 400)
    assert field == "image" and "16 MB" in message, message
    assert time.time() - start < 20

    # a repeated key is read once: the first is kept (A1111's reader keeps the first), the rest is not inflated
    chunks = _chunk(b"tEXt", b"parameters\0a cat") + b"".join(
        _chunk(b"zTXt", b"parameters\0\0" + bomb) for _ in range(12))
    r = client.post("/sdapi/v1/png-info", json={"image": base64.b64encode(png[:33] + chunks + png[33:]).decode()})
    assert r.status_code == 200 and r.json()["info"] == "a cat", r.text[:300]


def _tiff_with_a_fraction_for_its_strip_offset() -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.float32)).save(buf, format="TIFF")
    raw = buf.getvalue()
    assert raw.count(b"\x11\x01\x04\x00") == 1  # tag 273, StripOffsets, a LONG
    return raw.replace(b"\x11\x01\x04\x00", b"\x11\x01\x05\x00")  # now a RATIONAL: Pillow seeks to a fraction


@pytest.mark.parametrize(("path", "key"), [("/sdapi/v1/img2img", "init_images"), ("/sdapi/v1/png-info", "image"),
                                           ("/sdapi/v1/extra-single-image", "image"),
                                           ("/controlnet/detect", "controlnet_input_images")])
def test_a_picture_pillow_fails_on_with_a_type_error_is_a_400(client, path, key) -> None:
    """Pillow's TIFF reader raised TypeError ("'IFDRational' object cannot be interpreted as an integer") on a
    broken strip offset, which open_image did not catch (it caught OSError, ValueError, SyntaxError): a 500 on
    every route that reads a picture."""
    import base64

    b64 = base64.b64encode(_tiff_with_a_fraction_for_its_strip_offset()).decode()
    body = {**T2I, "init_images": [b64]} if key == "init_images" else \
        {"controlnet_module": "none", key: [b64]} if key.startswith("controlnet") else {key: b64}
    message, field = _refused(client.post(path, json=body), 400)
    assert field.startswith(key) and "is not a readable image (TypeError)" in message, message


def test_png_info_of_a_jpeg_with_a_broken_exif_block_is_a_400(client) -> None:
    """The EXIF UserComment of a JPEG whose EXIF block is no TIFF structure: Pillow's SyntaxError ("not a TIFF
    file") was a 500."""
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="JPEG", exif=b"Exif\x00\x00MM\x00\x01\x00\x00\x00\x08" + bytes(32))
    message, field = _refused(client.post("/sdapi/v1/png-info",
                                          json={"image": base64.b64encode(buf.getvalue()).decode()}), 400)
    assert field == "image" and message.startswith("image's EXIF data cannot be read (SyntaxError)"), message


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"sampler_index": "Restart"}, "sampler_index", "sampler_index: the sampler 'Restart' is not available in sdrt"),
    ({"sampler_name": "Restart"}, "sampler_name", "sampler_name: the sampler 'Restart' is not available in sdrt"),
    ({"sampler_index": "Bogus"}, "sampler_index", "sampler_index: unknown sampler 'Bogus'"),
])
def test_a_refused_sampler_is_said_of_the_field_that_sent_it(client, body, field, words) -> None:
    """A sampler sent as sampler_index (A1111's older field, which webuiapi still sends) was refused as sampler_name,
    and the message ("the sampler 'Restart' is not available in sdrt") named no field."""
    message, got = _refused(client.post("/sdapi/v1/txt2img", json={**T2I, **body}), 400)
    assert got == field and message.startswith(words), message


@pytest.mark.parametrize(("sizes", "field"), [({"resize_mode": 1}, "upscaling_resize_w"),
                                              ({"resize_mode": 1, "upscaling_resize_w": 16}, "upscaling_resize_h"),
                                              ({"resize_mode": 0, "upscaling_resize": 8}, "upscaling_resize")])
def test_an_extras_upscale_too_large_names_the_field_that_sized_it(client, sizes, field) -> None:
    """resize_mode 1 scales to upscaling_resize_w x upscaling_resize_h (512 each unset); over the server's side
    limit its 400 named upscaling_resize, which that mode does not read, and the message named no field."""
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, format="PNG")
    body = {"image": base64.b64encode(buf.getvalue()).decode(), "upscaler_1": "Lanczos", **sizes}
    message, got = _refused(client.post("/sdapi/v1/extra-single-image", json=body), 400)
    assert got == field and message.startswith(f"{field}: upscaling 32x32 "), message


@pytest.mark.parametrize("key", ["n", "prompt", "steps"])
def test_an_edit_forms_text_field_sent_as_a_file_is_named_as_such(client, key) -> None:
    """``n`` sent as a file part answered "n must be an integer, got Upload ('<sdrt.serve.openai_edits.Upload object
    a')": the server's own object, not what the client sent."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64)).save(buf, format="PNG")
    fields = {"prompt": "a cat", "steps": "1"}
    files = {"image": ("in.png", buf.getvalue(), "image/png"), key: ("x.txt", b"1", "text/plain")}
    r = client.post("/v1/images/edits", data={k: v for k, v in fields.items() if k != key}, files=files)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == key and error["message"] == f"{key} must be a text field of the form, got a file"


def test_a_broken_lora_is_named_with_its_field(models_dir, tmp_path) -> None:
    """A prompt's LoRA whose file is no safetensors was refused with "header length ... does not fit the file (22
    bytes)": neither the LoRA nor the field (prompt or negative_prompt) it came from was named."""
    from starlette.testclient import TestClient

    from sdrt.serve import ServeConfig, create_app

    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with TestClient(create_app(ServeConfig(models=models_dir, lora_dir=tmp_path, backend="openvino")),
                    raise_server_exceptions=False) as c:
        for key in ("prompt", "negative_prompt"):
            message, field = _refused(c.post("/sdapi/v1/txt2img", json={**T2I, key: "x <lora:bad:1>"}), 400)
            assert field == key and message.startswith(
                f"the model demo-a refused the request: <lora:bad:1> in {key}: bad.safetensors cannot be read as a "
                "LoRA: header length"), message
            assert str(tmp_path) not in message


def test_a_superscript_digit_in_a_units_number_field_is_a_400() -> None:
    """'²' passes str.isdigit() but not int(): a unit's resize_mode or a numbered choice (control_mode) of '²' raised
    ValueError, a 500 (the CLI's flags had the same defect); read with isdecimal() it is a 400 naming the field."""
    from sdrt.serve.controlnet import _choice, resize_mode
    from sdrt.serve.errors import ApiError

    for call in (lambda: resize_mode("²", "args[0].resize_mode"),
                 lambda: _choice("²", ("Balanced", "My prompt is more important"), "args[0].control_mode")):
        with pytest.raises(ApiError) as info:
            call()
        assert info.value.status == 400 and "args[0]." in info.value.field


def test_a_content_length_of_a_superscript_digit_is_refused() -> None:
    """A Content-Length header of '²' (latin-1, as ASGI servers decode headers) is a 400, not int()'s ValueError."""
    import asyncio

    from starlette.requests import Request

    from sdrt.serve.errors import ApiError
    from sdrt.serve.http import read_body

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": [(b"content-length", "²".encode(
        "latin-1"))]}, receive)
    with pytest.raises(ApiError) as info:
        asyncio.run(read_body(request, 1000))
    assert info.value.status == 400


def test_a_broken_exif_block_reads_as_no_rotation_without_warnings_in_the_log() -> None:
    """An upload whose EXIF block is cut short put Pillow's "Corrupt EXIF data" UserWarnings in the server's log
    (from the open and from exif_transpose); the picture reads as no rotation, as Pillow and A1111 read it."""
    import io
    import warnings

    pytest.importorskip("PIL")
    from PIL import Image

    from sdrt.serve.b64images import open_image

    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 10, 10)).save(buf, "JPEG")
    exif = b"Exif\x00\x00II*\x00\x08\x00\x00\x00\xff\xff" + b"\x01" * 20  # 65535 entries, 20 bytes of them
    jpeg = buf.getvalue()
    broken = jpeg[:2] + b"\xff\xe1" + (len(exif) + 2).to_bytes(2, "big") + exif + jpeg[2:]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        img = open_image(broken, "init_images[0]", 10**6)
    assert img.size == (8, 6)
