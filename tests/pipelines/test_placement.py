"""Parts placed per device (sdrt.pipelines.budget: place_parts, plan_placed; sdrt.runtime.cpu_device).

The decisions are checked against GPUs of the device library (their memory sizes); the device-selection path
runs for real with the CPU devices this machine has: a pipeline whose text encoders are placed on another
backend's CPU device makes the image the unplaced pipeline makes. No GPU runs here."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_helpers import DATA, register

from sdrt.cli import main
from sdrt.cost.devices import find
from sdrt.errors import InputError
from sdrt.pipelines import load
from sdrt.pipelines.budget import parse_placement, place_parts, plan_placed

GB = 10**9
#: SDXL's parts at 16 bits (bytes of weights), as a GPU backend holds them
SDXL = {"text_encoder": int(0.25 * GB), "text_encoder_2": int(1.39 * GB), "unet": int(5.14 * GB),
        "vae_decoder": int(0.10 * GB), "vae_encoder": int(0.07 * GB)}
ROLES = {"text_encoder": "text", "text_encoder_2": "text", "unet": "denoiser", "vae_decoder": "vae_decoder",
         "vae_encoder": "vae_encoder"}
HOST = "openvino:CPU"


def _plan(gpu: str, asked=None, host=HOST, **kw):
    spec = find(gpu)
    return plan_placed(SDXL, ROLES, "unet", spec.memory_bytes, base=0, accelerator=spec.kind == "gpu",
                       device="trt:cuda:0", host=host, host_budget=32 * GB, host_base=int(0.3 * GB), asked=asked,
                       budget_source="reported by the device", host_budget_source="available to the OS", **kw)


def _where(plan) -> dict[str, str]:
    return {p.part: p.device or "gpu" for p in plan.parts}


def test_everything_stays_on_a_gpu_it_fits():
    plan = _plan("RTX 4090 24GB")
    assert set(_where(plan).values()) == {"gpu"} and {p.placement for p in plan.parts} == {"resident"}
    assert plan.host_peak_bytes == 0 and "on openvino:CPU" not in plan.format()


def test_the_text_encoders_move_first_then_the_vae():
    twelve = _plan("RTX 3060 12GB")  # 2 x all = 13.9 GB > 12 GiB; UNet + VAE fit
    assert _where(twelve) == {"text_encoder": HOST, "text_encoder_2": HOST, "unet": "gpu", "vae_decoder": "gpu",
                              "vae_encoder": "gpu"}
    assert twelve.placement("unet").placement == "resident" and twelve.fits
    # the GPU holds the UNet and the VAE; the host the encoders (its base counted), each against its own budget
    assert twelve.peak_bytes == 2 * (SDXL["unet"] + SDXL["vae_decoder"] + SDXL["vae_encoder"])
    assert twelve.host_peak_bytes == int(0.3 * GB) + 2 * (SDXL["text_encoder"] + SDXL["text_encoder_2"])
    text = "\n".join(twelve.format().splitlines()[:2])
    assert "on openvino:CPU: budget 29.80 GiB (available to the OS)" in text
    eight = _plan("RTX 4060 8GB")  # the UNet alone is over 8 GiB at 2x: it streams, and the VAE moves too
    assert _where(eight) == {"text_encoder": HOST, "text_encoder_2": HOST, "unet": "gpu", "vae_decoder": HOST,
                             "vae_encoder": HOST}
    assert eight.placement("unet").placement == "streamed" and eight.peak_bytes <= find("RTX 4060 8GB").memory_bytes
    assert "vae_decoder      resident" in eight.format() and "on openvino:CPU" in eight.format()


def test_asked_places_are_kept():
    forced = _plan("RTX 4090 24GB", asked={"vae": "cpu"})  # as --vae-on-cpu: moved although everything fits
    assert _where(forced)["vae_decoder"] == HOST and _where(forced)["text_encoder"] == "gpu"
    kept = _plan("RTX 4060 8GB", asked={"text": "device", "vae_decoder": "device"})  # pinned to the GPU
    assert _where(kept) == {"text_encoder": "gpu", "text_encoder_2": "gpu", "unet": "gpu", "vae_decoder": "gpu",
                            "vae_encoder": HOST}
    assert {kept.placement(p).placement for p in ("text_encoder", "text_encoder_2", "vae_decoder")} == {"released"}


def test_no_cpu_beside_the_gpu():
    assert set(_where(_plan("RTX 3060 12GB", host=None)).values()) == {"gpu"}  # nothing can move
    with pytest.raises(InputError, match="no backend here offers a CPU device"):
        _plan("RTX 3060 12GB", asked={"text": "cpu"}, host=None)


def test_on_a_cpu_device_nothing_moves():
    assert set(place_parts({"a": 9.0, "b": 9.0}, {"a": "text", "b": "denoiser"}, 1.0, accelerator=False,
                           asked={"text": "cpu"}).values()) == {"device"}
    assert place_parts({"a": 1.0}, {"a": "text"}, None, accelerator=False, asked={"a": "openvino:CPU"}) == \
        {"a": "openvino:CPU"}  # a named device is where the part goes


def test_placement_is_read_in_the_callers_words():
    assert parse_placement("text=cpu, vae=CPU") == {"text": "cpu", "vae": "cpu"}
    assert parse_placement({"unet": "device", "text_encoder": "openvino:CPU"}) == \
        {"unet": "device", "text_encoder": "openvino:CPU"}
    for bad in ("text", "text=gpu0", {"text": 1}, 3):
        with pytest.raises(InputError) as e:
            parse_placement(bad)
        assert "placement" in str(e.value)
    with pytest.raises(InputError, match="neither a role"):
        parse_placement({"transformer": "cpu"}, ROLES)
    register("reference")
    with pytest.raises(InputError, match="placement"):
        load(DATA / "tiny-sd15", backend="reference", placement={"vea": "cpu"})


def test_the_cpu_device_beside_a_backend():
    register("openvino")
    register("reference")
    from sdrt.plugins import get_registry
    from sdrt.runtime import cpu_device

    reg = get_registry()
    be, dev = cpu_device(reg.backends["reference"])
    assert (be.name, dev.kind) == ("reference", "cpu")  # its own CPU first
    be, dev = cpu_device()
    assert dev.kind == "cpu" and be.priority >= reg.backends["reference"].priority


def test_parts_placed_on_another_cpu_device_make_the_same_image(monkeypatch):
    """The text encoders and the VAE run on OpenVINO's CPU device beside a reference-backend UNet: the
    placement path (the plan, the parts retargeted, compiled there) with real devices; float32 on both."""
    register("reference")
    register("openvino")
    monkeypatch.setenv("SDRT_PRECISION", "fp32")
    kw = dict(steps=2, seed=3, width=64, height=64)
    plain = load(DATA / "tiny-sd15", backend="reference").generate("a red fox", **kw)
    pipe = load(DATA / "tiny-sd15", backend="reference", placement={"text": "openvino:CPU", "vae": "openvino:CPU"})
    plan = pipe.plan("a red fox", **kw).memory
    assert {p.part: p.device for p in plan.parts} == {"text_encoder": "openvino:CPU", "unet": "",
                                                     "vae_decoder": "openvino:CPU", "vae_encoder": "openvino:CPU"}
    assert "text_encoder     resident" in plan.format() and ", on openvino:CPU" in plan.format()
    got = pipe.generate("a red fox", **kw)
    assert pipe.text_encoder.backend == "openvino" and pipe.vae_decoder.backend == "openvino"
    assert pipe.unet.backend == "reference"
    assert np.abs(got.images[0].astype(int) - plain.images[0].astype(int)).max() <= 1


def test_cli_flags_ask_for_the_cpu(capsys, tmp_path):
    from sdrt.cli.generate_memory import options

    class Args:
        memory = None
        share_blocks = False
        text_on_cpu = True
        vae_on_cpu = True

    assert options(Args())["placement"] == {"text": "cpu", "vae": "cpu"}
    register("reference")
    assert main(["generate", str(DATA / "tiny-sd15"), "a fox", "--backend", "reference", "--steps", "1",
                 "--width", "64", "--height", "64", "--clip-on-cpu", "--vae-on-cpu", "--dry-run"]) == 0
    assert "unet" in capsys.readouterr().out  # on a CPU device the parts stay where they are
