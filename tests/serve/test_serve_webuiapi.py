"""The ``webuiapi`` package (an A1111 API client no one here wrote) against a live server:
txt2img, img2img (+ inpainting), options (``sd_model_checkpoint`` switches the model), progress
and interrupt. The PNGs are read back with ``sd-parsers``."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
from serve_helpers import needs_server

pytestmark = needs_server
webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
sd_parsers = pytest.importorskip("sd_parsers", reason="sd-parsers is a test dependency: pip install sd-parsers")
Image = pytest.importorskip("PIL.Image", reason="webuiapi needs Pillow")


def _api(url: str):
    host, port = url.removeprefix("http://").split(":")
    return webuiapi.WebUIApi(host=host, port=int(port), sampler="Euler a", steps=12)


def _parsed(img):
    return sd_parsers.ParserManager().parse(img)


def test_txt2img(server) -> None:
    api = _api(server)
    r = api.txt2img(prompt="a red circle on a blue background", negative_prompt="green", seed=7, width=64,
                    height=64, cfg_scale=6, batch_size=2)
    assert len(r.images) == 2 and r.images[0].size == (64, 64)
    assert r.info["all_seeds"] == [7, 7] and r.info["sd_model_name"] == "demo-a"
    assert r.info["sdrt_not_honoured"] == []  # webuiapi's defaults ask for nothing sdrt lacks
    info = _parsed(r.images[1])
    assert info.generator.value == "AUTOMATIC1111"
    assert info.full_prompt == "a red circle on a blue background" and info.full_negative_prompt == "green"
    sampler = info.samplers[0]
    assert sampler.name == "Euler a" and sampler.parameters["steps"] == "12" and sampler.parameters["seed"] == "7"
    assert sampler.parameters["cfg_scale"] == "6" and info.metadata["Size"] == "64x64"
    assert "Batch pos: 1" in r.info["infotexts"][1]
    # the same request again gives the same pictures
    again = api.txt2img(prompt="a red circle on a blue background", negative_prompt="green", seed=7, width=64,
                        height=64, cfg_scale=6, batch_size=2)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(again.images, r.images))


def test_overrides_kept_afterwards_are_said_to_apply_to_the_request_only(server) -> None:
    """webuiapi's override_settings_restore_afterwards=False asks A1111 to keep the overrides as options; sdrt applies
    them to the request only, and took the field in silence. It is named now (only with overrides to keep)."""
    api = _api(server)
    kw = dict(prompt="a red circle", seed=7, width=64, height=64, steps=1)
    r = api.txt2img(**kw, override_settings={"CLIP_stop_at_last_layers": 1}, override_settings_restore_afterwards=False)
    assert [n for n in r.info["sdrt_not_honoured"] if n.startswith("override_settings_restore_afterwards")] == [
        "override_settings_restore_afterwards: false: override_settings apply to this request only; POST them to "
        "/sdapi/v1/options to keep them"], r.info["sdrt_not_honoured"]
    assert api.txt2img(**kw, override_settings_restore_afterwards=False).info["sdrt_not_honoured"] == []


def test_a_negative_prompt_that_cfg_1_leaves_unused_is_named(server) -> None:
    """At cfg_scale 1 (Flux's default) the run makes one pass and the negative prompt does nothing: the command line
    and the API warn, and the server said nothing. It is named in info.sdrt_not_honoured."""
    api = _api(server)
    kw = dict(prompt="a red circle", seed=7, width=64, height=64, steps=1)
    r = api.txt2img(**kw, negative_prompt="green", cfg_scale=1)
    assert r.info["sdrt_not_honoured"] == ["negative_prompt: cfg_scale 1 runs one pass, with the prompt only; a "
                                           "cfg_scale above 1 runs the negative prompt's pass"], r.info
    assert api.txt2img(**kw, negative_prompt="green", cfg_scale=2).info["sdrt_not_honoured"] == []
    assert api.txt2img(**kw, negative_prompt="", cfg_scale=1).info["sdrt_not_honoured"] == []


def test_a_scheduler_beside_a_label_that_names_its_own_runs_the_labels_as_a1111_and_says_so(server) -> None:
    """A client that saved "DPM++ 2M Karras" sends its scheduler menu's value beside it: A1111 runs Karras (the label's
    suffix wins), and so does sdrt, listing the scheduler it did not use (the command line refuses the pair)."""
    r = _api(server).txt2img(prompt="a red circle", seed=7, width=64, height=64, steps=3,
                             sampler_name="DPM++ 2M Karras", scheduler="Exponential")
    assert r.info["sdrt_not_honoured"] == ["scheduler: the sampler 'DPM++ 2M Karras' names its schedule (karras), "
                                           "which A1111 runs instead of 'Exponential'"]
    assert "Schedule type: Karras" in r.info["infotexts"][0]


def test_img2img_and_inpainting(server) -> None:
    api = _api(server)
    src = Image.new("RGB", (64, 64), (20, 40, 200))
    r = api.img2img(images=[src], prompt="a red circle", seed=3, width=64, height=64, denoising_strength=0.6)
    assert len(r.images) == 1 and r.images[0].size == (64, 64)
    assert r.info["denoising_strength"] == 0.6
    assert _parsed(r.images[0]).metadata.get("Denoising strength") == "0.6"
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    r = api.img2img(images=[src], mask_image=mask, prompt="a yellow square", seed=3, width=64, height=64,
                    denoising_strength=0.9, inpainting_fill=1, inpaint_full_res=False)
    out = np.asarray(r.images[0]).astype(int)
    # outside the (blurred) mask the picture stays near the source colour; inside it changed
    assert np.abs(out[:6, :6] - [20, 40, 200]).max() < 60
    assert np.abs(out[28:36, 28:36] - [20, 40, 200]).mean() > np.abs(out[:6, :6] - [20, 40, 200]).mean()
    # a larger init image is resized to the requested size (A1111's resize_mode 0)
    big = api.img2img(images=[Image.new("RGB", (128, 96), (200, 30, 30))], prompt="x", seed=1, width=64, height=64)
    assert big.images[0].size == (64, 64)


def test_options_switch_model(server) -> None:
    api = _api(server)
    titles = api.util_get_model_names()
    assert [t.split(" [")[0] for t in titles] == ["demo-a", "demo-b"]
    assert api.util_get_current_model().startswith("demo-a")
    api.util_set_model("demo-b")
    assert api.util_get_current_model().startswith("demo-b")
    r = api.txt2img(prompt="a red circle", seed=1, width=64, height=64)
    assert r.info["sd_model_name"] == "demo-b"
    assert _parsed(r.images[0]).samplers[0].model.name == "demo-b"
    api.set_options({"sd_model_checkpoint": titles[0]})
    assert api.get_options()["sd_model_checkpoint"] == titles[0]
    names = api.util_get_sampler_names()
    assert "DPM++ 2M" in names and "Euler a" in names
    assert "karras" in api.util_get_scheduler_names()


def test_progress_and_interrupt(server) -> None:
    """A long job (32 runs of 150 steps) reports progress, then an interrupt ends it early."""
    api = _api(server)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=api.txt2img(prompt="a blue square", seed=1, width=64, height=64,
                                                                 steps=150, n_iter=32)))
    start = time.time()
    t.start()
    seen = []
    while time.time() - start < 30:
        p = api.get_progress()
        if p["state"]["job_count"] and p["progress"] > 0.05:
            seen.append(p)
            break
        time.sleep(0.05)
    assert seen, "no progress reported"
    p = seen[0]
    assert 0 < p["progress"] < 1 and p["state"]["sampling_steps"] == 150 and p["eta_relative"] > 0
    # A1111's meaning: job_count is the job's runs (n_iter), job_no the 0-based run in progress, job_timestamp the
    # job's start (YYYYmmddHHMMSS); it said job_count 1 (the jobs running) beside job_no 7, and a timestamp of "0"
    assert p["state"]["job_count"] == 32 and 0 <= p["state"]["job_no"] < 32, p["state"]
    assert re.fullmatch(r"20\d{12}", p["state"]["job_timestamp"]), p["state"]
    assert p["current_image"]  # a live preview
    api.interrupt()
    t.join(timeout=60)
    r = out["r"]
    assert r.info["sdrt_interrupted"] is True
    assert len(r.images) < 32
    # the worker stays usable, and the server is idle again
    assert len(api.txt2img(prompt="a red circle", seed=2, width=64, height=64).images) == 1
    idle = api.get_progress()
    assert idle["progress"] == 0 and idle["state"]["job_count"] == 0


def test_skip_moves_to_the_next_run(server) -> None:
    api = _api(server)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=api.txt2img(prompt="a blue square", seed=1, width=64, height=64,
                                                                 steps=150, n_iter=3)))
    t.start()
    deadline = time.time() + 30
    while time.time() < deadline and not api.get_progress()["state"]["sampling_step"]:
        time.sleep(0.01)
    api.skip()
    t.join(timeout=60)
    r = out["r"]
    # A1111 answers a skipped run with its image decoded from where it stopped, then runs the others
    assert r.info["sdrt_skipped_runs"] == 1 and len(r.images) == 3 and not r.info["sdrt_interrupted"]
