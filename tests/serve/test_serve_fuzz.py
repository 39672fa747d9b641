"""Property-based fuzz of `sdrt serve`'s request bodies (hypothesis), in process (Starlette's TestClient on the
ASGI app, serving the 5 MB demo model on OpenVINO under tiny limits, so what passes the checks runs a 64x64 image
in 1-2 steps; ControlNet units on the tiny SD 1.5 ControlNet model).

Each example takes a valid body of one route and mutates a few of its fields (wrong JSON types, huge, negative and
non-finite numbers, numbers as odd strings, huge and unicode strings, lone surrogates, bad base64, base64 of
non-images, 1x1, odd-sized, exotic-mode and byte-mutated pictures, text-chunk bombs), drops fields, or sends a body
that is no JSON object or has the wrong content type; the GET routes get odd query strings. Every answer must be a
2xx or a 4xx, never a 500, and show no server path; a 4xx is JSON in the route's error shape with a one-line message
of bounded length, no traceback, naming a field (the mutated one, or the one it reports); a field sdrt reads sent
with the wrong JSON type is refused, never dropped or replaced; and the server still answers afterwards.

``SDRT_FUZZ_EXAMPLES`` sets the examples per test (default 60 here, about 30 s in all: the suite's budget; up to 200
the examples are derandomized, the same each run); a longer run:

    SDRT_FUZZ_EXAMPLES=2000 pytest tests/serve/test_serve_fuzz.py -q --hypothesis-show-statistics
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import struct
import zlib

import pytest
from serve_helpers import needs_server

# Pillow warns on the corrupt pictures the fuzz sends ("Corrupt EXIF data", "Tag data larger than file")
pytestmark = [needs_server, pytest.mark.filterwarnings("ignore::UserWarning:PIL")]
pytest.importorskip("starlette", reason="sdrt serve needs starlette: pip install 'sdrt[serve]'")
hypothesis = pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis: pip install hypothesis")
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
Image = pytest.importorskip("PIL.Image", reason="building test images needs Pillow")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("SDRT_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 200, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])

OK_STATUS = {200, 400, 404, 405, 413, 415, 422}
T2I = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 1, "seed": 1}


# ---------------------------------------------------------------------------------------------------- pictures
def _encoded(img, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _pictures() -> dict[str, bytes]:
    import numpy as np

    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (64, 64, 3), np.uint8))
    out = {
        "png64": _encoded(rgb), "png1x1": _encoded(Image.new("RGB", (1, 1), (9, 9, 9))),
        "png7x3": _encoded(Image.new("RGB", (7, 3))), "png65x9": _encoded(Image.new("RGB", (65, 9))),
        "png8x8": _encoded(Image.new("RGB", (8, 8))), "png64x8": _encoded(Image.new("RGB", (64, 8))),
        "L": _encoded(rgb.convert("L")), "LA": _encoded(rgb.convert("LA")), "1": _encoded(rgb.convert("1")),
        "P": _encoded(rgb.convert("P")), "RGBA": _encoded(rgb.convert("RGBA")),
        "RGBA-clear": _encoded(Image.new("RGBA", (64, 64), (0, 0, 0, 0))),
        "I;16": _encoded(Image.fromarray(rng.integers(0, 65535, (64, 64), np.uint16))),
        "I": _encoded(Image.fromarray(rng.integers(-5, 70000, (16, 16), np.int32)), "TIFF"),
        "F": _encoded(Image.fromarray(rng.standard_normal((16, 16)).astype(np.float32)), "TIFF"),
        "F-nan": _encoded(Image.fromarray(np.full((8, 8), np.nan, np.float32)), "TIFF"),
        "CMYK": _encoded(rgb.convert("CMYK"), "JPEG"), "jpeg": _encoded(rgb, "JPEG"), "webp": _encoded(rgb, "WEBP"),
        "gif": _encoded(rgb.convert("P"), "GIF"), "bmp": _encoded(rgb, "BMP"), "ico": _encoded(rgb, "ICO"),
        "tiff-lzw": _encoded(rgb, "TIFF", compression="tiff_lzw"),
        "anim-gif": _encoded(rgb.convert("P"), "GIF", save_all=True, append_images=[Image.new("P", (64, 64))]),
        "YCbCr": _encoded(rgb.convert("YCbCr"), "JPEG"),
        "huge-header": _encoded(Image.new("1", (3000, 3000))),  # 9 Mpixels in a few KB: over the pixel limit
    }
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: exif_transpose turns 64x8 into 8x64
    out["exif-rotated"] = _encoded(Image.new("RGB", (64, 8)), "JPEG", exif=exif.tobytes())
    png = out["png64"]
    out["png-cut"] = png[: len(png) // 2]
    out["png-header-only"] = png[:33]
    # text chunks that inflate to 3 x 16 MB (a few KB sent), and a JPEG whose EXIF block is no TIFF structure
    bomb = zlib.compress(b"a" * (16 * 2**20), 9)
    out["ztxt-bomb"] = png[:33] + b"".join(_chunk(b"zTXt", b"k%d\0\0" % i + bomb) for i in range(3)) + png[33:]
    out["exif-broken"] = _encoded(Image.new("RGB", (8, 8)), "JPEG",
                                  exif=b"Exif\x00\x00MM\x00\x01\x00\x00\x00\x08" + bytes(32))
    tiff = _encoded(Image.fromarray(np.zeros((8, 8), np.float32)), "TIFF")
    out["tiff-rational-offset"] = tiff.replace(b"\x11\x01\x04\x00", b"\x11\x01\x05\x00")
    return out


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


PICTURES = _pictures()
NOT_IMAGES = [b"", b"hello", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"\xff\xd8\xff", b"RIFF\x00\x00\x00\x00WEBP", b"%PDF-1.4",
              b"<svg xmlns='http://www.w3.org/2000/svg'/>", b"BM" + b"\x00" * 60, b"II*\x00" + b"\x00" * 20,
              b"\x00" * 100, json.dumps({"a": 1}).encode()]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """``seed`` with 1-6 edits: bit flips, odd bytes, inserts, deletes, truncation, a copied run."""
    b = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        if not b:
            b += draw(st.binary(min_size=1, max_size=8))
        i = draw(st.integers(0, len(b) - 1))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "copy"]))
        if op == "flip":
            b[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            b[i] = draw(st.sampled_from([0x00, 0x01, 0x05, 0x7F, 0x80, 0xFF]))
        elif op == "insert":
            b[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del b[i:i + draw(st.integers(1, 16))]
        elif op == "truncate":
            del b[i:]
        else:
            j = draw(st.integers(0, len(b) - 1))
            b[i:i] = b[j:j + draw(st.integers(1, 32))]
    return bytes(b)


#: small pictures whose bytes the fuzz mutates (Pillow's decoders on broken files)
SMALL = [k for k, v in PICTURES.items() if len(v) < 4000 and k != "ztxt-bomb"]


def picture_bytes() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(sorted(PICTURES)).map(PICTURES.__getitem__),
                     st.sampled_from(SMALL).map(PICTURES.__getitem__).flatmap(mutated))


def images() -> st.SearchStrategy:
    """A picture as requests send one: base64 (plain, data: URL, URL-safe, wrapped), or bad base64 / no image."""
    pictures = picture_bytes()
    good = st.one_of(pictures.map(_b64), pictures.map(lambda r: "data:image/png;base64," + _b64(r)),
                     pictures.map(lambda r: base64.urlsafe_b64encode(r).decode().rstrip("=")),
                     pictures.map(lambda r: "\n".join(re.findall(".{1,76}", _b64(r)))))
    bad = st.one_of(st.sampled_from(NOT_IMAGES).map(_b64),
                    st.sampled_from(["%%%", "data:", "data:image/png;base64,", "====", "a", "ab=c", "\u00e9\u00e9",
                                     "http://127.0.0.1/x.png", " ", "\x00"]),
                    st.binary(max_size=64).map(_b64), st.text(max_size=20))
    return st.one_of(good, good, bad)


# ---------------------------------------------------------------------------------------------------- JSON values
ODD_STRINGS = ["", " ", "0", "1", "-1", "64", " 64 ", "+8", "1.5", "1e1", "1e999", "-1e999", "NaN", "nan", "inf",
               "-Infinity", "0x10", "1_000", "\u0663", "\uff16\uff14", "true", "false", "yes", "null", "None",
               "[]", "{}", "\u00e9\u4e2d\U0001f600", "\ud800", "x" * 5000, "a\nb", "\r\n", "\x00", "\t",
               "Euler a", "Karras", "automatic", "Use same sampler", "Latent", "Lanczos", "None", "demo-a", "demo-b",
               "../../etc/passwd", "/etc/passwd", "C:\\x", "<lora:x:1>", "<lora:x:abc>", "[a:b:0.5]", "a AND b",
               "canny", "ip-adapter_clip_sd15", "Crop and Resize", "Balanced", "Both", "first pass", "GPU"]
ODD_NUMBERS = [0, 1, -1, 2, 3, 7, 8, 63, 64, 65, 128, 2048, 10**6, 2**31, 2**32, 2**32 - 1, 2**53 + 1, 2**63,
               2**64, 10**30, -(2**63), 10**400, 0.0, -0.0, 0.5, 1.5, 63.9, 64.0, 1e-300, 5e-324, 1e308, -1e308,
               1.7976931348623157e308, math.inf, -math.inf, math.nan]


def scalars() -> st.SearchStrategy:
    return st.one_of(st.none(), st.booleans(), st.sampled_from(ODD_NUMBERS), st.integers(-300, 300),
                     st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(ODD_STRINGS),
                     st.text(max_size=30), st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                                                   min_size=1, max_size=3))


def values(picture: bool = False) -> st.SearchStrategy:
    """Any JSON value (nested lists and objects too), with the odd numbers and strings above; ``picture``: images."""
    leaf = st.one_of(scalars(), images()) if picture else scalars()
    return st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                        max_leaves=6)


# ---------------------------------------------------------------------------------------------------- the client
def _dumps(body) -> bytes:
    """JSON as a client writes it: non-finite numbers as the NaN/Infinity literals Python's json writes (a 400)."""
    return json.dumps(body).encode()


def _finite(body) -> bool:
    try:
        json.dumps(body, allow_nan=False)
    except ValueError:
        return False
    return True


def _message(path: str, data) -> tuple[str, object]:
    if path.startswith("/v1/"):
        return data["error"]["message"], data["error"].get("param")
    return data["detail"], data.get("field")


#: folders of this machine that no answer may show (the models folders the servers serve)
SERVER_PATHS: list[str] = []


def check(r, path: str, mutated: list[str] | None = None) -> None:
    """The policy: a 2xx or a 4xx, never a 5xx; no server path in any answer; a 4xx is JSON with a one-line message
    of bounded length, no traceback, naming a field (``mutated``: the fields this example changed, one of which the
    message or the error's field must name, or the field it names is in the message)."""
    event(f"{path} {r.status_code}")
    for folder in SERVER_PATHS:
        assert folder not in r.text, (path, r.text[:500])
    assert r.status_code in OK_STATUS, (path, r.status_code, r.text[:2000])
    data = r.json()
    if r.status_code < 400:
        return
    message, field = _message(path, data)
    assert isinstance(message, str) and message.strip(), (path, data)
    assert "\n" not in message and "\r" not in message, (path, message)
    assert "Traceback" not in message and 'File "' not in message, (path, message)
    assert " object at 0x" not in message and "<sdrt." not in message, (path, message)  # no internals
    assert len(message) < 4000, (path, len(message), message[:300])
    if mutated:
        named = [k for k in mutated if k in message or (field and str(field).startswith(k)) or
                 (field and k.startswith(str(field)))]
        assert named or (field and str(field) in message), (path, mutated, field, message)


@pytest.fixture(scope="module")
def client(models_dir, tmp_path_factory):
    import shutil
    from pathlib import Path

    from starlette.testclient import TestClient

    from sdrt.serve import Limits, ServeConfig, create_app

    loras = tmp_path_factory.mktemp("fuzz-loras")  # a LoRA of another family, and a file that is no safetensors
    shutil.copy(Path(__file__).resolve().parents[1] / "data" / "ckpt" / "sd1" / "lora_kohya.safetensors",
                loras / "k.safetensors")
    (loras / "bad.safetensors").write_bytes(b"not a safetensors file")
    SERVER_PATHS.append(str(loras))

    limits = Limits(max_width=128, max_height=128, max_steps=2, max_batch=1, max_images=2, max_body_bytes=2**20,
                    max_prompt_chars=2000, max_queue=8)
    app = create_app(ServeConfig(models=models_dir, lora_dir=loras, backend="openvino", limits=limits))
    SERVER_PATHS.append(str(models_dir))
    with TestClient(app, raise_server_exceptions=False) as c:
        defaults = app.state.sdrt.default_options()
        c.post("/sdapi/v1/txt2img", json=T2I).raise_for_status()  # compiled once, before the examples' clock
        c.app_state = app.state.sdrt
        c.defaults = defaults
        yield c
        assert c.post("/sdapi/v1/txt2img", json=T2I).status_code == 200  # still serving


@pytest.fixture(scope="module")
def cn_client(tmp_path_factory):
    """A server of the tiny SD 1.5 ControlNet model (tests/data/pipelines/tiny-sd15-controlnet) with a net in the
    models folder's ControlNet/, so that units get past the model lookup to their other fields."""
    import shutil
    from pathlib import Path

    from starlette.testclient import TestClient

    from sdrt.serve import Limits, ServeConfig, create_app

    data = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
    root = tmp_path_factory.mktemp("fuzz-cn")
    shutil.copytree(data, root / "tiny-cn")
    (root / "ControlNet").mkdir()
    shutil.copytree(data / "controlnet_2", root / "ControlNet" / "tiny_scribble")
    limits = Limits(max_width=64, max_height=64, max_steps=2, max_batch=1, max_images=1, max_body_bytes=2**20,
                    max_prompt_chars=2000, max_queue=8)
    app = create_app(ServeConfig(models=root, backend="openvino", limits=limits))
    SERVER_PATHS.append(str(root))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
        assert c.post("/sdapi/v1/txt2img", json=T2I).status_code == 200  # still serving


@pytest.fixture(autouse=True)
def _fresh_options(client):
    """The fuzz of /options stores what it may; every test starts from the server's own options."""
    yield
    with client.app_state._lock:
        client.app_state._options = dict(client.defaults)


SAMPLERS = ["Euler", "Euler a", "LMS", "Heun", "DPM2 a", "DPM++ 2M", "DPM++ SDE", "DPM++ 2M SDE", "DPM++ 3M SDE",
            "DDIM", "DDPM", "LCM", "UniPC", "iPNDM", "DEIS", "DPM fast", "DPM adaptive", "PLMS", "DPM++ 2M Karras",
            "Restart", "euler_ancestral", "k_euler", "Euler A", " Euler ", "Use same sampler"]
SCHEDULES = ["Automatic", "automatic", "Uniform", "Karras", "Exponential", "Polyexponential", "SGM Uniform",
             "KL Optimal", "Align Your Steps", "Simple", "DDIM", "Beta", "Linear Quadratic", "karras",
             "Use same scheduler", ""]
PROMPTS = ["", " ", "a (cat:1.5) [dog] BREAK sky", "(((((((((((((((((((((x)))))))))))))))))))))", "(a:1e30)",
           "(a:-5)", "(a:0)", "[[[[", ")))]]]", "\\", "a\\(b\\)", "a AND b", "[a|b]", "[a:b:0.5]", "[a:b:40]",
           "<hypernet:x:1>", "<lora:x:1>", "<lora:k:0.5>", "<lora:bad:1>", "<lora:K:1>", "<lora::>", "<lora:x:1e999>", "<lora:x:nan>", "BREAK", "BREAK BREAK",
           "word " * 200, "\U0001f600" * 100, "\x00", "\t\n", "<", ">", "embedding:x"]
PLAUSIBLE = {
    "steps": [1, 2, "2", 3, 0, 1.0], "cfg_scale": [0, 1, 7, 0.5, "7.5", 100, 1e-9], "width": [8, 16, 56, 63, 64, 65,
                                                                                                "64", 72, 128],
    "height": [8, 16, 56, 63, 64, 65, "64", 72, 128], "seed": [-1, 0, 2**32 - 1, 2**32 - 2, "5", 2**32],
    "subseed": [-1, 0, 2**32 - 1, 7], "subseed_strength": [0, 0.5, 1, 1e-9], "batch_size": [1, 2],
    "n_iter": [1, 2], "sampler_name": SAMPLERS, "sampler_index": SAMPLERS, "scheduler": SCHEDULES,
    "denoising_strength": [1e-9, 0.01, 0.5, 1, 0.999], "enable_hr": [True, "true", 1],
    "hr_scale": [1, 1.01, 1.125, 2, 0.5], "hr_resize_x": [0, 8, 64, 72, 128], "hr_resize_y": [0, 8, 64, 72, 128],
    "hr_upscaler": ["Latent", "Latent (nearest)", "Lanczos", "None", "ESRGAN_4x", "Nearest", "", "latent"],
    "hr_second_pass_steps": [0, 1, 2, 3], "hr_sampler_name": SAMPLERS, "hr_scheduler": SCHEDULES,
    "hr_prompt": PROMPTS, "hr_negative_prompt": PROMPTS, "hr_checkpoint_name": ["demo-b", "Use same checkpoint", ""],
    "refiner_checkpoint": ["demo-b", "demo-a", "None", "", "x", "demo-b [6004f95cb3]"],
    "refiner_switch_at": [0, 0.01, 0.5, 1, 1.5], "resize_mode": [0, 1, 2, 3, 4, "3"], "mask_blur": [0, 1, 64, 65],
    "mask_blur_x": [0, 1, 64], "mask_blur_y": [0, 1, 64], "inpainting_fill": [0, 1, 2, 3, 4],
    "inpaint_full_res": [True, False, 0, 1, "true"], "inpaint_full_res_padding": [0, 4096, 32, 1],
    "inpainting_mask_invert": [0, 1, 2, True], "mask_round": [True, False], "image_cfg_scale": [0, 1.5, 1, 100],
    "eta": [0, 1, 0.5, 1e9], "distilled_cfg_scale": [3.5, 0], "s_churn": [0, 1], "s_noise": [1, 0.5],
    "s_tmax": [0, 1e30], "s_tmin": [0, 1], "prompt": PROMPTS, "negative_prompt": PROMPTS,
    "styles": [[], ["x"]], "tiling": [True, False], "restore_faces": [True, False],
    "force_task_id": ["", "t1", "x" * 200, "x" * 201], "send_images": [False, True], "save_images": [True],
    "include_init_images": [True], "latent_mask": ["", "x"], "script_name": ["", "x/y plot"],
    "script_args": [[], [1, 2]], "comments": [{}, {"a": "b"}], "disable_extra_networks": [True],
    "override_settings_restore_afterwards": [False], "firstphase_width": [0, 64], "firstphase_height": [0, 64],
    "seed_resize_from_h": [-1, 0, 64], "seed_resize_from_w": [-1, 64], "infotext": ["", "Steps: 2"],
    "do_not_save_samples": [True], "do_not_save_grid": [True], "firstpass_image": [""],
}


def field_values(key: str, picture: bool = False) -> st.SearchStrategy:
    """Mostly values near the field's valid ones (each example then reaches the deeper checks and the run), else
    any JSON value."""
    near = PLAUSIBLE.get(key)
    if picture:
        return st.one_of(images(), images(), values(picture=True))
    if near is None:
        return st.one_of(values(), st.sampled_from(WRONG))
    return st.one_of(st.sampled_from(near), st.sampled_from(near), values(), st.sampled_from(WRONG))


#: values every field gets now and then: the wrong types a client's falsy default has, and a long string
WRONG = [0, False, [], {}, "", "x" * 5000, [None], {"a": 1}]


def mutate(draw, base: dict, keys: list[str], picture_keys: frozenset[str] = frozenset()) -> tuple[dict, list[str]]:
    body = dict(base)
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4, unique=True))
    for key in chosen:
        if draw(st.integers(0, 9)) == 0:
            body.pop(key, None)
        else:
            body[key] = draw(field_values(key, key in picture_keys))
    return body, chosen


def post(client, path: str, body, mutated: list[str] | None = None, *, content_type: str | None = None):
    raw = body if isinstance(body, bytes) else _dumps(body)
    headers = {"content-type": content_type or "application/json"}
    r = client.post(path, content=raw, headers=headers)
    # a body with NaN or Infinity is refused whole (not JSON): no field to name
    check(r, path, None if isinstance(body, bytes) or not _finite(body) else mutated)
    return r


# ---------------------------------------------------------------------------------------------------- the routes
from sdrt.serve.a1111 import _KNOWN as A1111_FIELDS  # noqa: E402

A1111_KEYS = sorted(A1111_FIELDS - {"alwayson_scripts", "override_settings"})
IMAGE_KEYS = frozenset({"init_images", "mask", "firstpass_image", "latent_mask"})


@SETTINGS
@given(data=st.data())
def test_fuzz_txt2img_and_img2img_fields(client, data):
    mode = data.draw(st.sampled_from(["txt2img", "img2img"]))
    base = dict(T2I)
    if mode == "img2img":
        base["init_images"] = [_b64(PICTURES["png64"])]
        if data.draw(st.booleans()):
            base["mask"] = _b64(PICTURES["RGBA-clear"])
    if data.draw(st.integers(0, 4)) == 0:  # the model's own size, or a hires. fix from it
        base.update(width=None, height=None)
    body, keys = mutate(data.draw, base, A1111_KEYS + ["init_images", "mask"] * 3, IMAGE_KEYS)
    if "init_images" in keys and data.draw(st.booleans()):  # a list of pictures, as A1111 takes them
        body["init_images"] = data.draw(st.lists(images(), max_size=2))
    r = post(client, f"/sdapi/v1/{mode}", body, keys)
    wrong = [k for k in keys if k in body and _wrong_type(body[k], READ[mode].get(k))]
    if wrong and _finite(body):  # a field sdrt reads, of the wrong JSON type: refused, never dropped or guessed
        assert r.status_code in (400, 422), (wrong, body.get(wrong[0]), r.text[:300])


#: the JSON kind of each field a txt2img / img2img body has, of those sdrt reads whatever else the body holds
_ALWAYS = {**dict.fromkeys(["prompt", "negative_prompt", "sampler_name", "scheduler", "force_task_id", "latent_mask",
                            "refiner_checkpoint"], "str"),
           **dict.fromkeys(["steps", "batch_size", "n_iter", "width", "height", "seed", "subseed"], "int"),
           **dict.fromkeys(["cfg_scale", "distilled_cfg_scale", "image_cfg_scale", "subseed_strength", "eta"], "number"),
           **dict.fromkeys(["send_images", "save_images", "do_not_save_samples", "do_not_save_grid",
                            "override_settings_restore_afterwards", "disable_extra_networks"], "bool"),
           "styles": "list", "script_args": "list", "override_settings": "object"}
READ = {"txt2img": {**_ALWAYS, "enable_hr": "bool"}, "img2img": {**_ALWAYS, "init_images": "list", "resize_mode": "int",
                                        "include_init_images": "bool", "denoising_strength": "number"}}
#: the options and override_settings sdrt reads, by kind (upscaler_for_img2img and img2img_fix_steps: img2img's)
OPTION_KINDS = {"sd_model_checkpoint": "str", "sd_vae": "str", "randn_source": "str", "hires_fix_refiner_pass": "str",
                "forge_additional_modules": "list", "CLIP_stop_at_last_layers": "int", "img2img_fix_steps": "bool",
                "refiner_switch_by_sample_steps": "bool"}


def _wrong_type(value, kind: str | None) -> bool:
    """Whether ``value`` is no ``kind`` at all (not even a number or boolean in a string, which A1111's pydantic takes);
    null is every field's default."""
    if value is None or kind is None:
        return False
    if kind == "str":
        return not isinstance(value, str)
    if kind in ("list", "object"):
        return not isinstance(value, list if kind == "list" else dict)
    return isinstance(value, (list, dict))


PLAUSIBLE.update({
    "sd_model_checkpoint": ["demo-a", "demo-b", "demo-b [6004f95cb3]", "DEMO-A", "x/demo-a", "../demo-a", None],
    "CLIP_stop_at_last_layers": [1, 2, 3, 4, 12, 13, "2"], "sd_vae": ["Automatic", "None", "x.safetensors"],
    "randn_source": ["GPU", "CPU", "NV", "cpu", "gpu "], "forge_additional_modules": [[], ["x.safetensors"], None],
    "hires_fix_refiner_pass": ["first pass", "second pass", "both passes", "Both Passes"],
    "img2img_fix_steps": [True, False, "true"], "refiner_switch_by_sample_steps": [True, False],
    "upscaler_for_img2img": ["None", "Lanczos", "Nearest", "ESRGAN_4x", None], "samples_format": ["png", "jpg"]})
OVERRIDES = ["sd_model_checkpoint", "CLIP_stop_at_last_layers", "sd_vae", "randn_source", "forge_additional_modules",
             "hires_fix_refiner_pass", "img2img_fix_steps", "refiner_switch_by_sample_steps", "upscaler_for_img2img",
             "samples_format", "some_other_option"]


@SETTINGS
@given(data=st.data())
def test_fuzz_override_settings_and_options(client, data):
    keys = data.draw(st.lists(st.sampled_from(OVERRIDES), min_size=1, max_size=3, unique=True))
    settings_ = {k: data.draw(field_values(k)) for k in keys}
    if data.draw(st.booleans()):
        body = {**T2I, "override_settings": settings_}
        r = post(client, "/sdapi/v1/txt2img", body, [f"override_settings.{k}" for k in keys] + ["override_settings"])
    else:
        r = post(client, "/sdapi/v1/options", settings_, keys)
        check(client.get("/sdapi/v1/options"), "/sdapi/v1/options")
    read = OPTION_KINDS if r.request.url.path.endswith("options") else \
        {k: v for k, v in OPTION_KINDS.items() if k != "img2img_fix_steps"}  # txt2img reads no img2img option
    wrong = [k for k in keys if settings_[k] != "" and _wrong_type(settings_[k], read.get(k))]  # "": the option
    if wrong and _finite(settings_):  # an option of the wrong type: refused, never the server's option instead
        assert r.status_code in (400, 422), (wrong, settings_[wrong[0]], r.text[:300])


UNIT_KEYS = ["enabled", "image", "input_image", "mask", "mask_image", "module", "model", "weight", "resize_mode",
             "low_vram", "processor_res", "threshold_a", "threshold_b", "guidance_start", "guidance_end", "guidance",
             "pixel_perfect", "control_mode", "guess_mode", "hr_option", "advanced_weighting",
             "inpaint_crop_input_image"]
PLAUSIBLE.update({
    "enabled": [True, False, "true", 0], "module": ["none", "canny", "invert", "threshold", "scribble",
                                                    "tile_resample", "lineart_standard", "scribble_xdog", "shuffle",
                                                    "color", "blur_gaussian", "recolor_luminance", "recolor_intensity",
                                                    "t2ia_color_grid", "CANNY", "ip-adapter_clip_sd15", "depth",
                                                    "inpaint_only", "reference_only", None],
    "model": ["tiny_scribble", "controlnet", "controlnet_2", "TINY_SCRIBBLE", "tiny_scribble [abc]", "None", None,
              ""],
    "weight": [0, 1, 2, 10, 10.5, -1], "processor_res": [-1, 0, 1, 8, 64, 65, 2048, 1e6],
    "threshold_a": [-1, 0, 1, 64, 255, 256, 1e9, 0.001], "threshold_b": [-1, 0, 1, 255, 256, 1e9],
    "guidance_start": [0, 0.5, 1, 1.1], "guidance_end": [0, 0.5, 1, 2], "guidance": [0, 1],
    "pixel_perfect": [True, False], "control_mode": [0, 1, 2, 3, "Balanced", "ControlNet is more important"],
    "guess_mode": [True, False], "hr_option": [0, 1, 2, 3, "Both", "High res only"],
    "advanced_weighting": [None, [], [1.0] * 13], "inpaint_crop_input_image": [True, False],
    "low_vram": [True], "lowvram": [True],
    "controlnet_module": ["canny", "threshold", "tile_resample", "shuffle", "blur_gaussian", "color", "invert",
                          "recolor_luminance", "recolor_intensity", "scribble_xdog", "lineart_standard", "scribble",
                          "none", "depth"],
    "controlnet_processor_res": [-1, 0, 1, 8, 64, 2048, 4097], "controlnet_threshold_a": [-1, 0, 1, 8, 64, 255, 1e6],
    "controlnet_threshold_b": [-1, 0, 1, 255, 256],
    "resize_mode": [0, 1, 2, 3, 4, "3", "Crop and Resize", "Just Resize", "Resize and Fill", "Envelope"],
})


@SETTINGS
@given(data=st.data())
def test_fuzz_controlnet_units(cn_client, data):
    unit = {"enabled": True, "image": _b64(PICTURES["png64"]), "module": "none", "model": "tiny_scribble"}
    unit, keys = mutate(data.draw, unit, UNIT_KEYS, frozenset({"image", "input_image", "mask", "mask_image"}))
    where = "alwayson_scripts.controlnet.args[0]"
    shape = data.draw(st.integers(0, 7))
    if shape == 0:  # the script's object itself of a wrong shape
        scripts = {"controlnet": data.draw(values())}
        keys, where = ["alwayson_scripts"], "alwayson_scripts"
    elif shape == 1:
        scripts = {"controlnet": {"args": data.draw(values())}}
        keys, where = ["alwayson_scripts"], "alwayson_scripts"
    elif shape == 2:  # Forge's Kontext script's positional args
        scripts = {"Forge FluxKontext": {"args": data.draw(st.lists(values(picture=True), max_size=5))}}
        keys, where = ["alwayson_scripts"], "alwayson_scripts"
    elif shape == 3:  # two units
        scripts = {"controlnet": {"args": [unit, dict(unit)]}}
        keys = [f"{where}.{k}" for k in keys] + [f"alwayson_scripts.controlnet.args[1].{k}" for k in keys]
    else:
        scripts = {"controlnet": {"args": [unit]}}
        keys = [f"{where}.{k}" for k in keys]
    mode = data.draw(st.sampled_from(["txt2img", "img2img"]))
    body = {**T2I, "alwayson_scripts": scripts}
    if mode == "img2img":
        body["init_images"] = [_b64(PICTURES[data.draw(st.sampled_from(["png64", "png7x3", "RGBA", "png1x1"]))])]
        if data.draw(st.booleans()):
            body["mask"] = _b64(PICTURES["RGBA-clear"])
            body["inpaint_full_res"] = data.draw(st.booleans())
    if data.draw(st.integers(0, 3)) == 0:
        body.update(enable_hr=True, hr_scale=data.draw(st.sampled_from([1, 1.5])), width=32, height=32)
    post(cn_client, f"/sdapi/v1/{mode}", body, keys + [where])


DETECT_KEYS = ["controlnet_module", "controlnet_input_images", "controlnet_images", "controlnet_processor_res",
               "controlnet_threshold_a", "controlnet_threshold_b"]


@SETTINGS
@given(data=st.data())
def test_fuzz_detect_png_info_and_extras(client, data):
    route = data.draw(st.sampled_from(["detect", "png-info", "extra-single-image", "extra-batch-images"]))
    if route == "detect":
        base = {"controlnet_module": data.draw(st.sampled_from(["canny", "threshold", "tile_resample", "shuffle",
                                                                  "blur_gaussian", "color", "invert",
                                                                  "recolor_luminance", "scribble_xdog"])),
                "controlnet_input_images": [_b64(PICTURES["png8x8"])], "controlnet_processor_res": 64}
        body, keys = mutate(data.draw, base, DETECT_KEYS, frozenset())
        if data.draw(st.booleans()):
            body["controlnet_input_images"] = data.draw(st.lists(images(), min_size=1, max_size=2))
            keys = [*keys, "controlnet_input_images"]
        post(client, "/controlnet/detect", body, keys)
    elif route == "png-info":
        body, keys = mutate(data.draw, {"image": _b64(PICTURES["png64"])}, ["image"], frozenset({"image"}))
        post(client, "/sdapi/v1/png-info", body, keys)
    elif route == "extra-single-image":
        base = {"image": _b64(PICTURES["png8x8"]), "upscaling_resize": 2, "upscaler_1": "Lanczos"}
        body, keys = mutate(data.draw, base, ["image", "resize_mode", "upscaling_resize", "upscaling_resize_w",
                                              "upscaling_resize_h", "upscaling_crop", "upscaler_1", "upscaler_2",
                                              "extras_upscaler_2_visibility", "gfpgan_visibility",
                                              "codeformer_visibility", "upscale_first"], frozenset({"image"}))
        post(client, "/sdapi/v1/extra-single-image", body, keys)
    else:
        items = data.draw(st.lists(st.one_of(st.fixed_dictionaries({"data": images(), "name": values()}),
                                             values(picture=True)), min_size=0, max_size=3))
        post(client, "/sdapi/v1/extra-batch-images", {"imageList": items, "upscaling_resize": 1.5},
             ["imageList"])


PLAUSIBLE.update({"n": [1, 2, "1", 0], "size": ["64x64", "auto", "", "8x8", "64x8", "72x72", "0x0", "64X64", "64*64",
                                             " 64x64", "1x1"],
                  "response_format": ["b64_json", "url", "png"], "output_format": ["png", "jpeg", "webp"],
                  "stream": [False, True, "false", "true"], "strength": [0, 1e-9, 0.5, 1, 1.5],
                  "quality": ["high", "auto"], "background": ["transparent"], "user": ["x"]})
EDIT_KEYS = ["prompt", "model", "n", "size", "response_format", "output_format", "stream", "negative_prompt", "steps",
             "seed", "cfg_scale", "sampler_name", "strength", "quality", "background", "user"]


def _form_value(v) -> bytes:
    """A form field's bytes as a client may send them: UTF-8 (a lone surrogate as the bytes no UTF-8 text has)."""
    return (v if isinstance(v, str) else json.dumps(v)).encode("utf-8", "surrogatepass")


def multipart(parts: list[tuple[str, str | None, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body of ``(name, filename or None, bytes)`` parts, and its content type."""
    boundary = "fuzzboundary7MA4YWxkTrZu0gW"
    out = b""
    for name, filename, raw in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        out += b"Content-Type: image/png\r\n" if filename else b""
        out += b"\r\n" + raw + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@SETTINGS
@given(data=st.data())
def test_fuzz_openai_edits(client, data):
    """``/v1/images/edits`` as a multipart form (OpenAI's SDK's) or JSON, with mutated fields and files; and
    ``/v1/images/generations`` with the same fields."""
    fields = {"prompt": "a cat", "steps": "1", "seed": "1", "size": "64x64"}
    keys = data.draw(st.lists(st.sampled_from(EDIT_KEYS), max_size=3, unique=True))
    image_raw = data.draw(st.one_of(picture_bytes(), st.sampled_from(NOT_IMAGES), st.binary(max_size=64)))
    mask_raw = data.draw(st.one_of(st.none(), st.sampled_from(["RGBA-clear", "RGBA", "png64", "png1x1", "LA", "P"]
                                                               ).map(PICTURES.__getitem__), st.binary(max_size=32)))
    mutated = list(keys) + ["image", "mask"] * (image_raw not in PICTURES.values() or mask_raw is not None)
    if data.draw(st.integers(0, 3)) == 0:  # /v1/images/generations: the same fields as JSON, no picture
        body = {**fields, **{k: data.draw(field_values(k)) for k in keys if k != "strength"}}
        post(client, "/v1/images/generations", body, [k for k in keys if k != "strength"])
        return
    if data.draw(st.booleans()):  # multipart, as the SDK sends it
        parts = [(k, None, _form_value(v)) for k, v in fields.items() if k not in keys]
        parts += [(k, None, _form_value(data.draw(field_values(k)))) for k in keys]
        parts.append((data.draw(st.sampled_from(["image", "image[]", "images"])), "in.png", image_raw))
        if mask_raw is not None:
            parts.append(("mask", "mask.png", mask_raw))
        if data.draw(st.integers(0, 5)) == 0:
            parts.append(("image[]", "second.png", PICTURES["png64"]))
        if data.draw(st.integers(0, 5)) == 0:  # a text field sent twice, or as a file
            parts.append((data.draw(st.sampled_from(EDIT_KEYS)), data.draw(st.sampled_from([None, "x.txt"])), b"2"))
        raw, content_type = multipart(parts)
        r = client.post("/v1/images/edits", content=raw, headers={"content-type": content_type})
        check(r, "/v1/images/edits", mutated)
    else:
        body: dict = {**fields, "image": _b64(image_raw)}
        if mask_raw is not None:
            body["mask"] = _b64(mask_raw)
        for k in keys:
            body[k] = data.draw(field_values(k))
        post(client, "/v1/images/edits", body, mutated)


ROUTES = ["/sdapi/v1/txt2img", "/sdapi/v1/img2img", "/sdapi/v1/options", "/sdapi/v1/png-info",
          "/sdapi/v1/extra-single-image", "/sdapi/v1/extra-batch-images", "/controlnet/detect", "/v1/images/edits",
          "/v1/images/generations", "/internal/progress"]


@SETTINGS
@given(path=st.sampled_from(ROUTES), raw=st.one_of(
    st.binary(max_size=200), st.sampled_from([b"", b" ", b"null", b"[]", b"{}", b"1", b'"x"', b"true", b"{\"a\":",
                                              b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00", b"{\"prompt\": NaN}",
                                              b"{\"prompt\": 1e999}", b'{"prompt": "\\ud800"}', b'{"\\udfff": 1}',
                                              b"[" * 5000, b'{"a": ' * 3000]),
    values().map(_dumps)),
    content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                  "multipart/form-data", "multipart/form-data; boundary=xyz", "", "image/png",
                                  "application/json; charset=latin-1"]))
def test_fuzz_raw_bodies_and_content_types(client, path, raw, content_type):
    post(client, path, raw, None, content_type=content_type)


GETS = ["/sdapi/v1/progress", "/controlnet/model_list", "/controlnet/module_list", "/sdapi/v1/options",
        "/sdapi/v1/sd-models", "/sdapi/v1/samplers", "/v1/models", "/sdrt/status", "/sdapi/v1/upscalers",
        "/sdapi/v1/embeddings", "/sdapi/v1/loras", "/controlnet/version", "/sdapi/v1/memory"]
QUERY_NAMES = ["skip_current_image", "update", "alias_names", "x", "", "a[]", "\u00e9"]


@SETTINGS
@given(path=st.one_of(st.sampled_from(GETS), st.text(max_size=40).map(lambda t: "/v1/models/" + t)),
       query=st.lists(st.tuples(st.sampled_from(QUERY_NAMES), st.one_of(st.sampled_from(ODD_STRINGS[:40]),
                                                                         st.text(max_size=20))), max_size=3),
       raw_query=st.one_of(st.none(), st.binary(max_size=40)))
def test_fuzz_get_routes_with_odd_queries(client, path, query, raw_query):
    from urllib.parse import quote

    if raw_query is not None:
        qs = quote(raw_query, safe="=&%;+")
    else:
        qs = "&".join(f"{quote(k.encode('utf-8', 'surrogatepass'))}={quote(v.encode('utf-8', 'surrogatepass'))}"
                      for k, v in query)
    p = quote(path.encode("utf-8", "surrogatepass"), safe="/")
    r = client.get(f"{p}?{qs}" if qs else p)
    check(r, path)
