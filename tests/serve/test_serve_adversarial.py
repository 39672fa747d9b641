"""What real clients send beyond the happy path, against a live server: a client that goes away mid-job,
fields A1111 does not have (ignored, and named back), known fields sdrt does not honour (named), A1111's
``randn_source``, ``/png-info`` (webuiapi's ``png_info``), the hires. upscaler lists, and base64 as other
encoders write it."""

from __future__ import annotations

import base64
import io
import json
import threading
import time

import numpy as np
import pytest
from serve_helpers import needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
Image = pytest.importorskip("PIL.Image", reason="building test images needs Pillow")

OK = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 3, "seed": 1}
LONG = {**OK, "steps": 150, "n_iter": 32}  # ~10 s on a 2-core CPU


def _info(r) -> dict:
    assert r.status_code == 200, r.text
    return json.loads(r.json()["info"])


def _status(client) -> dict:
    return client.get("/sdrt/status").json()


def _wait(pred, seconds: float = 60) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_a_client_that_disconnects_frees_the_worker(server) -> None:
    """A client that gives up (a timeout, a closed browser tab) has its job stopped at the next step, and a job it
    left in the queue never runs: before, both ran to the end while every later request waited."""
    with httpx.Client(base_url=server, timeout=120) as client:
        client.post("/sdapi/v1/txt2img", json=OK)  # compiled and warm
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server}/sdapi/v1/txt2img", json=LONG, timeout=1.0)
        assert _wait(lambda: _status(client)["running"] == 0, 10), "the abandoned job kept running"
        start = time.time()
        assert client.post("/sdapi/v1/txt2img", json=OK).status_code == 200
        assert time.time() - start < 5

        # a queued job whose client goes away: it is dropped when the worker reaches it
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=client.post("/sdapi/v1/txt2img",
                                                                     json={**LONG, "force_task_id": "keeper"})))
        t.start()
        assert _wait(lambda: _status(client)["running"] == 1)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server}/sdapi/v1/txt2img", json={**LONG, "force_task_id": "leaver"}, timeout=0.5)
        client.post("/sdapi/v1/interrupt")
        t.join(timeout=60)
        assert _info(out["r"])["sdrt_interrupted"] is True
        assert _wait(lambda: client.post("/internal/progress", json={"id_task": "leaver"}).json()["completed"], 10)
        assert client.post("/internal/progress", json={"id_task": "leaver"}).json()["textinfo"] == "interrupted"
        assert _status(client)["running"] == 0 and _status(client)["queued"] == 0


def test_unknown_fields_are_ignored_and_named(server) -> None:
    """SillyTavern sends its own url/auth and SD.Next's clip_skip: A1111 drops them; sdrt drops them and says so,
    never echoing them (auth holds a password)."""
    r = httpx.post(f"{server}/sdapi/v1/txt2img", timeout=120,
                   json={**OK, "url": "http://127.0.0.1:7860", "auth": "user:secret", "clip_skip": 2})
    info = _info(r)
    assert info["sdrt_ignored_fields"] == ["auth", "clip_skip", "url"]
    assert info["sdrt_not_honoured"] == []
    assert "auth" not in r.json()["parameters"] and "secret" not in r.text


def test_known_fields_sdrt_does_not_run_are_named(server) -> None:
    cases = [  # (extra fields, the start of the note); each was dropped without a word
        ({"sampler_name": "DDIM", "eta": 1.0}, "eta: DDIM runs at eta 0 here"),
        ({"sampler_name": "Euler a", "eta": 0.0}, "eta: Euler a runs at eta 1 here"),
        ({"sampler_name": "DPM fast", "eta": 0.5}, "eta: DPM fast runs at eta 1 here"),  # A1111's k-diffusion eta
        ({"sampler_name": "dpm_adaptive", "eta": 1.0}, "eta: dpm_adaptive runs at eta 0 here"),  # ComfyUI's: 0
        ({"prompt": "x <lora:a:1>", "disable_extra_networks": True}, None),  # no LoRA here: a 400 (below)
        ({"latent_mask": "abc"}, "latent_mask: a separate latent mask"),
    ]
    with httpx.Client(base_url=server, timeout=120) as client:
        for extra, note in cases:
            r = client.post("/sdapi/v1/txt2img", json={**OK, **extra})
            if note is None:
                assert r.status_code == 400 and "not a LoRA of this server" in r.json()["detail"]
                continue
            assert [n for n in _info(r)["sdrt_not_honoured"] if n.startswith(note)], (extra, r.json()["info"])
        # eta where A1111 also runs it as sdrt does, and on a sampler that takes none: nothing to say
        for extra in ({"sampler_name": "Euler a", "eta": 1}, {"sampler_name": "DDIM", "eta": 0},
                      {"sampler_name": "DPM++ 2M", "eta": 0.3}, {"sampler_name": "DPM adaptive", "eta": 1.0}):
            assert _info(client.post("/sdapi/v1/txt2img", json={**OK, **extra}))["sdrt_not_honoured"] == [], extra


def test_hires_upscalers_are_listed_and_none_is_a_lanczos_resize(server) -> None:
    """/upscalers and /latent-upscale-modes list what hr_upscaler takes (they listed only "None", and "None" ran
    as Latent with a note, where A1111 resizes with Lanczos)."""
    api = webuiapi.WebUIApi(baseurl=f"{server}/sdapi/v1")
    names = [u["name"] for u in api.get_upscalers()] + [u["name"] for u in api.get_latent_upscale_modes()]
    assert names[:3] == ["None", "Lanczos", "Nearest"] and "Latent (bicubic antialiased)" in names
    from sdrt.serve.a1111 import _hires
    from sdrt.serve.config import Limits

    for name in names:  # (hr_scale 1 on this 64x64-only model would be no second pass, as in A1111)
        kwargs: dict = {"width": 64, "height": 64}
        notes: list[str] = []
        _hires({"enable_hr": True, "hr_scale": 2, "hr_upscaler": name, "denoising_strength": 0.5}, kwargs, Limits(),
               notes)
        assert notes == [] and kwargs["hires_upscaler"] == ("Lanczos" if name == "None" else name), (name, notes)


def test_randn_source_is_honoured(server) -> None:
    """A1111's randn_source option (GPU, CPU, NV) was stored and read back while every image used the CPU stream."""
    with httpx.Client(base_url=server, timeout=120) as client:
        assert client.get("/sdapi/v1/options").json()["randn_source"] == "CPU"
        cpu = _info(client.post("/sdapi/v1/txt2img", json={**OK, "batch_size": 2}))
        assert cpu["all_seeds"] == [1, 1]  # diffusers' stream: one seed per run
        gpu = _info(client.post("/sdapi/v1/txt2img", json={**OK, "batch_size": 2,
                                                             "override_settings": {"randn_source": "GPU"}}))
        assert gpu["all_seeds"] == [1, 2] and "RNG" not in gpu["infotexts"][0]  # A1111's per-image seeds
        try:
            assert client.post("/sdapi/v1/options", json={"randn_source": "nv"}).status_code == 200
            assert client.get("/sdapi/v1/options").json()["randn_source"] == "NV"
            nv = _info(client.post("/sdapi/v1/txt2img", json=OK))
            assert "RNG: NV" in nv["infotexts"][0]
            bad = client.post("/sdapi/v1/options", json={"randn_source": "TPU"})
            assert bad.status_code == 400 and bad.json()["field"] == "randn_source"
        finally:
            client.post("/sdapi/v1/options", json={"randn_source": "CPU"})
        bad = client.post("/sdapi/v1/txt2img", json={**OK, "override_settings": {"randn_source": 1}})
        assert bad.status_code == 400 and bad.json()["field"] == "override_settings.randn_source"


def test_png_info_reads_back_what_txt2img_wrote(server) -> None:
    api = webuiapi.WebUIApi(baseurl=f"{server}/sdapi/v1")
    r = api.txt2img(prompt='a cat, "quoted"', negative_prompt="dog", seed=9, width=64, height=64, steps=3)
    got = api.png_info(r.images[0])  # /png-info was a 404
    assert got.info == r.info["infotexts"][0]
    p = got.parameters
    assert p["Prompt"] == 'a cat, "quoted"' and p["Negative prompt"] == "dog"
    assert p["Seed"] == "9" and p["Steps"] == "3" and p["Size-1"] == "64" and p["Model"] == "demo-a"
    with httpx.Client(base_url=server, timeout=60) as client:
        plain = base64.b64encode(_png(Image.new("RGB", (8, 8)))).decode()
        assert client.post("/sdapi/v1/png-info", json={"image": plain}).json() == {"info": "", "items": {},
                                                                                   "parameters": {}}
        bad = client.post("/sdapi/v1/png-info", json={"image": "bm90IGFuIGltYWdl"})
        assert bad.status_code == 400 and bad.json()["field"] == "image"


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_init_images_as_other_encoders_write_them_and_not_echoed(server) -> None:
    """MIME-wrapped base64 (76-character lines, as Java's and Python's encodebytes write it), the URL-safe
    alphabet and dropped padding were 400s "not valid base64"; A1111's decoder takes them. ``init_images`` and
    ``mask`` are A1111 fields (they were missing from the known ones), echoed in ``parameters`` only with
    include_init_images, as A1111 does."""
    raw = _png(Image.new("RGB", (64, 64), (200, 30, 30)))
    with httpx.Client(base_url=server, timeout=120) as client:
        for text in (base64.encodebytes(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip("=")):
            r = client.post("/sdapi/v1/img2img", json={**OK, "init_images": [text], "mask": text})
            assert r.status_code == 200, r.text
            assert r.json()["parameters"]["init_images"] is None and r.json()["parameters"]["mask"] is None
            assert _info(r)["sdrt_ignored_fields"] == []
        r = client.post("/sdapi/v1/img2img", json={**OK, "init_images": [base64.b64encode(raw).decode()],
                                                     "include_init_images": True})
        assert r.json()["parameters"]["init_images"] == [base64.b64encode(raw).decode()]


def test_numbers_and_booleans_sent_as_strings_are_taken_as_a1111_takes_them(server) -> None:
    """A1111's pydantic models take "20" for steps and "true" for a boolean (HTML forms and some bots send them);
    they were 422s. A fraction for an integer stays a 422 (pydantic would cut 4.5 to 4 without a word)."""
    with httpx.Client(base_url=server, timeout=120) as client:
        info = _info(client.post("/sdapi/v1/txt2img", json={**OK, "steps": "3", "seed": "11", "cfg_scale": "6.5",
                                                             "width": "64", "send_images": "true"}))
        assert info["steps"] == 3 and info["seed"] == 11 and info["cfg_scale"] == 6.5
        for body, field in (({**OK, "steps": 4.5}, "steps"), ({**OK, "steps": "4.5"}, "steps"),
                            ({**OK, "seed": "lucky"}, "seed"), ({**OK, "send_images": "maybe"}, "send_images")):
            r = client.post("/sdapi/v1/txt2img", json=body)
            assert r.status_code == 422 and r.json()["field"] == field, (body, r.text)


def test_a_refusal_by_the_model_names_the_field(server) -> None:
    """The demo model's fixed 64x64 export refuses a 128x128 init image: the 400 names init_images (field was null,
    and the message carried "Where: init_image. What to do: ...")."""
    raw = base64.b64encode(_png(Image.new("RGB", (128, 128)))).decode()
    r = httpx.post(f"{server}/sdapi/v1/img2img", json={**OK, "width": None, "height": None, "init_images": [raw]},
                   timeout=120)
    assert r.status_code == 400 and r.json()["field"] == "init_images", r.text
    assert r.json()["detail"].startswith("the model demo-a refused the request: ") and "Where:" not in r.text
    # the size was the picture's: what to do in the request's fields (it read "pass init_images 64 and init_images
    # 64, or leave them unset", and SD3's "init_images 512 is above the 256 pixels a side ...; use 256 or less")
    assert r.json()["detail"].endswith("this model makes 64x64 images only (its unet is exported for that size) and "
                                       "128x128 was asked: the size is init_images[0]'s, as the request sets no width "
                                       "and height; pass width and height (the picture is fitted to that size, at most "
                                       "2048x2048 on this server), or send a picture of a size it takes"), r.text
    r = httpx.post(f"{server}/v1/images/edits", files={"image": ("a.png", _png(Image.new("RGB", (128, 128))),
                                                                 "image/png")}, data={"prompt": "x"}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "image", r.text
    assert r.json()["error"]["message"].endswith("128x128 was asked: the size is image's, as the request sets no size; "
                                                 "pass size (the picture is fitted to that size, at most 2048x2048 on "
                                                 "this server), or send a picture of a size it takes"), r.text


def test_serve_refuses_a_models_folder_with_nothing_to_serve(tmp_path, capsys) -> None:
    """It started with a warning, then answered every generation with 503 "the models folder holds no model"."""
    from serve_helpers import free_port

    from sdrt.cli import main

    (tmp_path / "notes.txt").write_text("not a model")
    assert main(["serve", "--models", str(tmp_path), "--port", str(free_port())]) == 1
    err = capsys.readouterr()
    assert f"--models {tmp_path} holds no model" in err.err and "sdrt serve: http" not in err.out


def test_openai_size_refusal_model_retrieve_and_routes_sdrt_lacks(server) -> None:
    with httpx.Client(base_url=server, timeout=120) as client:
        # the fixed-shape demo model refuses 128x128: the OpenAI caller sent size, so param is size (was width)
        r = client.post("/v1/images/generations", json={"prompt": "x", "size": "128x128", "steps": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "size", r.text
        assert r.json()["error"]["message"].startswith("size 128x128: the model demo-a refused the request")
        # the OpenAI SDK's models.retrieve
        assert client.get("/v1/models/demo-b").json() == {"id": "demo-b", "object": "model", "created": 0,
                                                          "owned_by": "sdrt"}
        missing = client.get("/v1/models/dall-e-3")
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
        # routes sdrt does not have: still a 404, saying what to use
        variations = client.post("/v1/images/variations", json={"n": 1})
        assert variations.status_code == 404 and "POST /sdapi/v1/img2img" in variations.json()["error"]["message"]
        r = client.post("/sdapi/v1/interrogate", json={"image": ""})
        assert r.status_code == 404 and "no image captioner" in r.json()["detail"]
        memory = client.get("/sdapi/v1/memory").json()  # webuiapi.get_memory
        assert memory["ram"]["total"] > memory["ram"]["free"] > 0 and "error" in memory["cuda"]


def test_a_side_that_is_no_multiple_of_8_runs_rounded_down_as_in_a1111(server) -> None:
    """A1111 makes a latent of width // 8 (a client asking 1433x660 gets 1432x656); this was a 400. The rounding is
    named. OpenAI's route keeps its 400 about size, as OpenAI refuses a size it does not make."""
    with httpx.Client(base_url=server, timeout=120) as client:
        r = client.post("/sdapi/v1/txt2img", json={**OK, "width": 71, "height": 64})
        info = _info(r)
        assert info["width"] == 64 and Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).size == (64, 64)
        assert info["sdrt_not_honoured"] == ["width: 71 ran as 64, a multiple of 8, as A1111 runs it"]
        r = client.post("/v1/images/generations", json={"prompt": "x", "size": "71x64"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "size"


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """A server of three families: tiny Flux.1 dev (guidance-distilled, flow matching), tiny SD 1.5 and tiny SDXL
    with dynamic sizes."""
    from pathlib import Path

    from serve_helpers import live_server

    from sdrt.serve import ServeConfig

    data = Path(__file__).resolve().parent.parent / "data" / "pipelines"
    root = tmp_path_factory.mktemp("families")
    for name in ("tiny-flux-dev", "tiny-sd15", "tiny-sdxl-dyn"):
        (root / name).symlink_to(data / name)
    with live_server(ServeConfig(models=root, backend="openvino")) as url:
        yield url


def _on(model: str, **body) -> dict:
    return {"prompt": "a cat", "negative_prompt": "a dog", "steps": 3, "seed": 1, "width": 64, "height": 64,
            "override_settings": {"sd_model_checkpoint": model}, **body}


def test_hires_fix_on_flux_dev(families) -> None:
    """The second pass gave the transformer no guidance input: every hires. fix on Flux dev was a 400 "wrong input
    names: missing 'guidance'" (sdrt.pipelines.extras._hires_pass)."""
    r = httpx.post(f"{families}/sdapi/v1/txt2img", json=_on("tiny-flux-dev", enable_hr=True, hr_scale=1.5),
                   timeout=300)
    info = _info(r)
    assert Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).size == (96, 96)
    assert "Hires upscale: 1.5" in info["infotexts"][0] and "Distilled CFG Scale: 3.5" in info["infotexts"][0]


def test_resize_mode_3_encodes_the_picture_at_its_own_size_and_resizes_its_latents(families) -> None:
    """A1111's "Just resize (latent upscale)": it ran as 0 and was named as not honoured. On tiny SDXL (dynamic
    sizes) the 64x64 picture is encoded as it is and its latents are resized to 128x96; with a mask (fitted to the
    size) and inpainting_fill 0 too."""
    picture = Image.new("RGB", (64, 64), (200, 40, 30))
    picture.paste((20, 200, 40), (0, 0, 32, 64))
    raw = base64.b64encode(_png(picture)).decode()
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    with httpx.Client(base_url=families, timeout=300) as client:
        runs = {}
        for mode in (0, 3):
            r = client.post("/sdapi/v1/img2img", json=_on("tiny-sdxl-dyn", init_images=[raw], resize_mode=mode,
                                                          width=128, height=96, denoising_strength=0.5))
            info = _info(r)
            assert info["sdrt_not_honoured"] == [], info["sdrt_not_honoured"]
            runs[mode] = Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0])))
            assert runs[mode].size == (128, 96)
        assert not np.array_equal(np.asarray(runs[0]), np.asarray(runs[3]))
        r = client.post("/sdapi/v1/img2img", json=_on("tiny-sdxl-dyn", init_images=[raw], resize_mode=3, width=128,
                                                      height=96, mask=base64.b64encode(_png(mask)).decode(),
                                                      inpainting_fill=0))
        assert _info(r)["sdrt_not_honoured"] == [] and r.status_code == 200
        big = base64.b64encode(_png(picture.resize((512, 512)))).decode()  # 64x the model's pixels, encoded whole
        r = client.post("/sdapi/v1/img2img", json=_on("tiny-sdxl-dyn", init_images=[big], resize_mode=3, width=64,
                                                      height=64))
        assert r.status_code == 400 and "resize_mode='Just Resize'" in r.json()["detail"], r.text


def test_resize_mode_3_on_a_fixed_size_vae_encoder_is_named_as_not_honoured(families) -> None:
    """tiny-sd15's VAE encoder takes 64x64 only: a 128x64 picture cannot be encoded at its own size, so the latent
    upscale runs as just resize. That was said in the server's log only; the request hears it now."""
    picture = Image.new("RGB", (128, 64), (200, 40, 30))
    raw = base64.b64encode(_png(picture)).decode()
    with httpx.Client(base_url=families, timeout=300) as client:
        r = client.post("/sdapi/v1/img2img", json=_on("tiny-sd15", init_images=[raw], resize_mode=3,
                                                      denoising_strength=0.5))
        assert _info(r)["sdrt_not_honoured"] == [
            "resize_mode: 3 (latent upscale) ran as 0 (just resize): this model's VAE encoder is exported for 64x64 "
            "only"]
        same = client.post("/sdapi/v1/img2img", json=_on("tiny-sd15", init_images=[base64.b64encode(
            _png(picture.resize((64, 64)))).decode()], resize_mode=3, denoising_strength=0.5))
        assert _info(same)["sdrt_not_honoured"] == []  # a picture of the run's size: nothing to resize


#: what a job with a negative prompt at Flux's default cfg_scale 1 says (one pass: the negative prompt is unused)
UNUSED_NEGATIVE = ("negative_prompt: cfg_scale 1 runs one pass, with the prompt only; a cfg_scale above 1 runs the "
                   "negative prompt's pass")


def test_distilled_cfg_scale_and_the_cfg_default_follow_the_model(families) -> None:
    """Forge's distilled_cfg_scale is Flux dev's guidance input (it was named as not honoured, and 3.5 always ran);
    on a model without one it is named. cfg_scale left out is the family's (Flux 1, SD 7 as A1111): it was 7
    everywhere, which on Flux with a negative prompt runs true CFG at 7, two passes a step."""
    with httpx.Client(base_url=families, timeout=300) as client:
        flux = _info(client.post("/sdapi/v1/txt2img", json=_on("tiny-flux-dev", distilled_cfg_scale=2)))
        assert "Distilled CFG Scale: 2," in flux["infotexts"][0] + "," and flux["sdrt_not_honoured"] == [UNUSED_NEGATIVE]
        assert flux["cfg_scale"] == 1 and "CFG scale: 1," in flux["infotexts"][0]
        sd = _info(client.post("/sdapi/v1/txt2img", json=_on("tiny-sd15", distilled_cfg_scale=2)))
        assert sd["sdrt_not_honoured"] == ["distilled_cfg_scale: tiny-sd15 is no guidance-distilled model (Flux dev "
                                           "is); cfg_scale is its guidance"]
        assert sd["cfg_scale"] == 7 and "Distilled" not in sd["infotexts"][0]
        # Easy Diffusion always sends Forge's default 3.5: nothing to say about it
        assert _info(client.post("/sdapi/v1/txt2img", json=_on("tiny-sd15", distilled_cfg_scale=3.5)))[
            "sdrt_not_honoured"] == []
        oai = client.post("/v1/images/generations", json={"prompt": "a cat", "model": "tiny-flux-dev", "size": "64x64",
                                                          "steps": 2})
        assert oai.status_code == 200, oai.text


def test_a_clip_skip_the_export_cannot_give_runs_at_1_and_is_named(families) -> None:
    """CLIP skip 2 (an A1111 user's usual server-wide option) on a model whose text encoder has no hidden_states
    outputs (tiny Flux dev here; Optimum's SD 1.x exports) failed every request with a 400; it runs at 1, named once
    per job. tiny-sd15's encoder has them: clip skip 2 runs."""
    with httpx.Client(base_url=families, timeout=300) as client:
        try:
            assert client.post("/sdapi/v1/options", json={"CLIP_stop_at_last_layers": 2}).status_code == 200
            flux = _info(client.post("/sdapi/v1/txt2img", json={**_on("tiny-flux-dev"), "n_iter": 2}))
            assert len(flux["all_seeds"]) == 2 and flux["sdrt_not_honoured"] == [UNUSED_NEGATIVE,
                "CLIP_stop_at_last_layers: 2 ran at 1 on tiny-flux-dev: clip skip 2 picks a CLIP layer's hidden "
                "states, and Flux.1 reads only its CLIP encoder's pooled output"]
            sd = _info(client.post("/sdapi/v1/txt2img", json=_on("tiny-sd15")))
            assert "Clip skip: 2" in sd["infotexts"][0] and sd["sdrt_not_honoured"] == []
        finally:
            client.post("/sdapi/v1/options", json={"CLIP_stop_at_last_layers": 1})


def test_a_size_off_the_unet_exports_old_grid_runs(families) -> None:
    """tiny-sdxl-dyn halves its latent once: 72 pixels (latent 9) failed ONNX shape inference (a 400 carrying onnx's
    "[ShapeInferenceError] ... Concat ... Inferred=9 Declared=10", then "multiples of 16 pixels; use 64 or 80"). Its
    upsampler now takes the skip's size (sdrt.graph.upsample), so any multiple of 8 runs, as in A1111: the first
    pass at 72 wide, and a hires pass of 1.125 x 64 = 72."""
    from PIL import Image

    with httpx.Client(base_url=families, timeout=300) as client:
        r = client.post("/sdapi/v1/txt2img", json=_on("tiny-sdxl-dyn", width=72))
        assert _info(r)["width"] == 72
        assert Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).size == (72, 64)
        r = client.post("/sdapi/v1/txt2img", json=_on("tiny-sdxl-dyn", enable_hr=True, hr_scale=1.125))
        assert Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).size == (72, 72), r.text


def test_doubled_slashes_and_a_current_model_that_went_away(tmp_path) -> None:
    """A base URL given with a trailing slash (``http://host:7860/``) joined with ``/sdapi/v1/...`` was a 404; a
    model folder renamed under a running server, then /refresh-checkpoints, left sd_model_checkpoint naming it and
    every request without its own model a 400 "no model named"."""
    import shutil

    from serve_helpers import live_server

    from sdrt import pipelines
    from sdrt.serve import ServeConfig

    for name in ("alpha", "beta"):
        shutil.copytree(pipelines.DEMO_MODEL, tmp_path / name)
    with live_server(ServeConfig(models=tmp_path, backend="openvino")) as url:
        api = webuiapi.WebUIApi(baseurl=f"{url}/sdapi/v1/")  # webuiapi then asks for .../sdapi/v1//txt2img
        assert len(api.txt2img(prompt="x", seed=1, width=64, height=64, steps=2).images) == 1
        with httpx.Client(base_url=url, timeout=120) as client:
            assert httpx.get(f"{url}//sdapi/v1//options").status_code == 200
            assert client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "beta"}).status_code == 200
            (tmp_path / "beta").rename(tmp_path / "gamma")
            assert client.post("/sdapi/v1/refresh-checkpoints").status_code == 200
            assert client.get("/sdapi/v1/options").json()["sd_model_checkpoint"].startswith("alpha [")
            assert _info(client.post("/sdapi/v1/txt2img", json=OK))["sd_model_name"] == "alpha"


def test_an_error_message_is_one_line() -> None:
    from sdrt.serve.http import error_response

    body = json.loads(error_response("/sdapi/v1/txt2img", 400, "shape inference failed:\n (op: Concat)\n\n more",
                                     "width").body)
    assert body["detail"] == "shape inference failed:; (op: Concat); more" and body["field"] == "width"


def test_a_body_with_a_utf8_bom_is_json(server) -> None:
    """Windows tools (PowerShell's Set-Content -Encoding utf8, Notepad) write a BOM; A1111's json.loads(bytes) takes
    it, and sdrt answered 400 "Unexpected UTF-8 BOM"."""
    body = b"\xef\xbb\xbf" + json.dumps(OK).encode()
    r = httpx.post(f"{server}/sdapi/v1/txt2img", content=body, headers={"content-type": "application/json"},
                   timeout=120)
    assert r.status_code == 200, r.text


def test_sizes_taken_from_the_model_or_the_image_stay_within_the_limits(models_dir) -> None:
    """--max-size held only for width and height sent: an img2img without them ran at the init image's size (a
    4096x4096 photo passed the pixel limit of 4 x max-size^2), and a hires. fix without them at the model's size
    times hr_scale."""
    from serve_helpers import live_server

    from sdrt.serve import Limits, ServeConfig

    big = base64.b64encode(_png(Image.new("RGB", (128, 128), (9, 9, 9)))).decode()  # 4 x 64^2 pixels
    with live_server(ServeConfig(models=models_dir, backend="openvino", limits=Limits(max_width=64, max_height=64))) \
            as url, httpx.Client(base_url=url, timeout=120) as client:
        r = client.post("/sdapi/v1/img2img", json={**OK, "width": None, "height": None, "init_images": [big]})
        info = _info(r)
        assert (info["width"], info["height"]) == (64, 64), info
        assert info["sdrt_not_honoured"][0].startswith("width/height: init_images[0] is 128x128, above this server's "
                                                       "limit of 64x64; it ran scaled down")
        r = client.post("/sdapi/v1/txt2img", json={**OK, "width": None, "height": None, "enable_hr": True})
        assert r.status_code == 400 and r.json()["field"] == "hr_scale", r.text
        assert "makes 128x128 from demo-a's own size, above this server's limit of 64x64" in r.json()["detail"]
    with live_server(ServeConfig(models=models_dir, backend="openvino", limits=Limits(max_width=32, max_height=32))) \
            as url, httpx.Client(base_url=url, timeout=120) as client:
        r = client.post("/sdapi/v1/txt2img", json={"prompt": "x", "steps": 2})  # the demo model's own 64x64
        assert r.status_code == 400 and r.json()["field"] == "width", r.text
        assert "whose own size 64x64 is above this server's limit of 32x32" in r.json()["detail"]
        r = client.post("/v1/images/generations", json={"prompt": "x", "steps": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "size", r.text


def test_finished_jobs_keep_no_images(models_dir) -> None:
    """The last 512 finished jobs were kept whole for /internal/progress, with every image each made (its future's
    result) and its init image: gigabytes on a busy server. Now a few numbers each."""
    import gc
    import weakref

    from sdrt.serve import ServeConfig
    from sdrt.serve.a1111 import parse
    from sdrt.serve.jobs import FinishedJob
    from sdrt.serve.state import ServerState

    st = ServerState(ServeConfig(models=models_dir, backend="openvino"))
    try:
        req = parse({**OK, "batch_size": 2}, "txt2img", st.registry, st.limits, st.options())
        job = st.queue.submit(req.work, "kept-light")
        result = job.future.result(timeout=120)
        assert len(result.images) == 2
        images = weakref.ref(result)
        assert _wait(lambda: isinstance(st.queue.find("kept-light"), FinishedJob), 10)
        del job, result, req
        gc.collect()
        assert images() is None, gc.get_referrers(images())
        assert st.queue.find("kept-light").state == "done"
    finally:
        st.close()


def test_a1111_prompt_syntax_sdrt_does_not_run_is_named(server) -> None:
    """Prompt editing, alternation and AND ran as plain words without a word; emphasis, [de-emphasis],
    escaped brackets and <lora:> tags are sdrt's own syntax and say nothing."""
    with httpx.Client(base_url=server, timeout=120) as client:
        info = _info(client.post("/sdapi/v1/txt2img", json={**OK, "prompt": "a [cat:dog:0.5] AND a hat",
                                                             "negative_prompt": "[red|blue]"}))
        assert info["sdrt_not_honoured"] == [
            "prompt: A1111's prompt editing [from:to:when] and AND (composable diffusion) is not supported; the text "
            "ran as written", "negative_prompt: A1111's alternation [a|b] is not supported; the text ran as written"]
        plain = {**OK, "prompt": "a (cat:1.2) [blurry] \\[x:y\\] ANDROID"}  # BREAK: two chunks, the demo takes one
        assert _info(client.post("/sdapi/v1/txt2img", json=plain))["sdrt_not_honoured"] == []


def test_a_model_named_with_its_subfolder_is_found(models_dir) -> None:
    """A1111 titles models in subfolders "sub/name.safetensors", and Easy Diffusion sends its own relative path
    ("stable-diffusion/name.safetensors"): they were 400s "no model named". Only a relative name's last part is
    looked up, among the listed models; "..", absolute paths and drives stay unknown names."""
    from sdrt.serve.errors import ApiError
    from sdrt.serve.registry import Registry

    reg = Registry(models_dir)
    for name in ("stable-diffusion/demo-b", "sd\\demo-b.safetensors", "a/b/DEMO-B.ckpt", "models/demo-b [123]"):
        assert reg.model(name).name == "demo-b", name
    for name in ("../demo-b", "demo-a/../demo-b", str(models_dir / "demo-b"), "c:/x/demo-b", "./demo-b", "x//demo-b"):
        with pytest.raises(ApiError, match="no model named"):
            reg.model(name)


def test_live_previews_on_every_family(families) -> None:
    """/progress's current_image was made from the noisy latent with SD 1.x's factors, so a 16-channel model (Flux,
    SD3, Chroma) had none, and Pipeline.preview() raised on them (it used SD 1.x's factors for every family but SDXL).
    Now it is the step's denoised estimate in the family's own colours."""
    with httpx.Client(base_url=families, timeout=300) as client:
        out: dict = {}
        body = {**_on("tiny-flux-dev"), "steps": 150, "n_iter": 32, "force_task_id": "flux-preview"}
        t = threading.Thread(target=lambda: out.update(r=client.post("/sdapi/v1/txt2img", json=body)))
        t.start()
        try:
            assert _wait(lambda: client.get("/sdapi/v1/progress").json()["current_image"] is not None, 60)
            image = Image.open(io.BytesIO(base64.b64decode(client.get("/sdapi/v1/progress").json()["current_image"])))
            assert image.size == (8, 8)  # the latent grid: 64 / 8
            live = client.post("/internal/progress", json={"id_task": "flux-preview", "live_preview": True}).json()
            assert live["live_preview"] and live["active"]
        finally:
            client.post("/sdapi/v1/interrupt")
            t.join(timeout=120)
        assert _info(out["r"])["sdrt_interrupted"] is True


def test_a_client_that_hangs_up_mid_body_is_not_a_server_fault(server, caplog) -> None:
    """Starlette's ClientDisconnect while the body was read was logged as "unexpected error" with a traceback
    (a 500 no one received)."""
    import logging
    import socket

    host, port = server.removeprefix("http://").split(":")
    with caplog.at_level(logging.ERROR, logger="sdrt.serve"):
        for head in (b"Content-Length: 1000\r\n\r\n{\"prompt\":", b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n"):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(b"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + head)
                time.sleep(0.2)
        time.sleep(0.5)
        assert httpx.post(f"{server}/sdapi/v1/txt2img", json=OK, timeout=120).status_code == 200
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]


def test_png_info_reads_a1111s_jpeg_comment(server) -> None:
    """A1111 writes a JPEG's or WebP's parameters as the EXIF UserComment (piexif's UNICODE, UTF-16 big-endian)."""
    exif = Image.Exif()
    exif.get_ifd(0x8769)[0x9286] = b"UNICODE\0" + "a cat\nSteps: 20, Sampler: Euler a, Seed: 5".encode("utf-16-be")
    for fmt in ("JPEG", "WEBP"):
        buf = io.BytesIO()
        Image.new("RGB", (16, 16)).save(buf, format=fmt, exif=exif.tobytes())
        got = httpx.post(f"{server}/sdapi/v1/png-info", json={"image": base64.b64encode(buf.getvalue()).decode()},
                         timeout=60).json()
        assert got["info"] == "a cat\nSteps: 20, Sampler: Euler a, Seed: 5", fmt
        assert got["parameters"]["Sampler"] == "Euler a" and got["parameters"]["Prompt"] == "a cat"


def test_random_bodies_never_make_a_500(server) -> None:
    """A seeded fuzz: A1111's and OpenAI's fields set to values of every JSON type (and images, LoRA tags, prompt
    syntax); every answer is JSON, under 500, and an A1111 error carries a one-line detail."""
    import random

    from sdrt.serve.a1111 import _KNOWN

    rng = random.Random(7)
    img = base64.b64encode(_png(Image.new("RGB", (64, 64)))).decode()
    values = [None, True, False, 0, 1, -1, 2, 7, 64, 1.5, -0.5, 1e9, 2**40, "", "x", "64", "true", "Euler a", "Karras",
              "None", [], [1], ["a"], [img], {}, {"a": 1}, {"sd_model_checkpoint": "demo-b"},
              {"CLIP_stop_at_last_layers": "2"}, img, "data:image/png;base64," + img, "\u00e9\u4e2d", "<lora:x:1>",
              "[a:b:0.5]"]
    openai_keys = ["prompt", "n", "size", "model", "steps", "seed", "cfg_scale", "sampler_name", "negative_prompt",
                   "quality", "response_format"]
    with httpx.Client(base_url=server, timeout=120) as client:
        for _ in range(200):
            route = rng.choice(["/sdapi/v1/txt2img", "/sdapi/v1/img2img", "/v1/images/generations",
                                "/sdapi/v1/png-info", "/internal/progress"])
            body: dict = {"prompt": "a cat", "steps": 2, **({"init_images": [img]} if "img2img" in route else {})}
            keys = openai_keys if route.startswith("/v1/") else ["image", "id_task", "live_preview"] \
                if route in ("/sdapi/v1/png-info", "/internal/progress") else sorted(_KNOWN)
            for key in rng.sample(keys, rng.randint(1, min(6, len(keys)))):
                body[key] = rng.choice(values)
            r = client.post(route, json=body)
            assert r.status_code < 500, (route, body, r.text)
            data = r.json()
            if r.status_code >= 400 and route.startswith("/sdapi"):
                assert data["detail"] and "\n" not in data["detail"], (route, body, data)


def test_hires_limit_is_checked_on_the_size_that_runs() -> None:
    """hr_scale 1.5 on 1368 wide makes int(2052) // 8 * 8 = 2048, within a 2048 limit (the pipeline rounds down to
    the latent grid, as A1111 does): it was refused as 2052; 1376 wide makes 2064 and stays refused."""
    from sdrt.serve.a1111 import _hires
    from sdrt.serve.config import Limits
    from sdrt.serve.errors import ApiError

    kwargs: dict = {"width": 1368, "height": 512}
    _hires({"enable_hr": True, "hr_scale": 1.5}, kwargs, Limits(), [])
    assert kwargs["hires_scale"] == 1.5
    with pytest.raises(ApiError) as err:
        _hires({"enable_hr": True, "hr_scale": 1.5}, {"width": 1376, "height": 512}, Limits(), [])
    assert err.value.field == "hr_scale" and "makes 2064x768" in err.value.message


def test_brackets_with_a_colon_but_no_step_are_not_prompt_editing() -> None:
    """A1111's prompt editing ends in a number (``[from:to:when]``, ``[to:when]``); ``[a:b]`` is de-emphasized text
    there and runs alike here, so nothing is named (it was named as prompt editing)."""
    from sdrt.serve.a1111 import _prompt_syntax

    assert _prompt_syntax("a [cat:dog] photo, [best: quality]", "prompt") == []
    for text in ("a [cat:dog:0.5]", "a [dog:10]", "a [cat::.25]", "a [cat: dog : 3 ]"):
        assert _prompt_syntax(text, "prompt") == [
            "prompt: A1111's prompt editing [from:to:when] is not supported; the text ran as written"], text
