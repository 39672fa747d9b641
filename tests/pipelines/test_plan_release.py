"""The parts a run uses besides the model's own are released once their last use in the run is over, in low-memory
mode and when the memory plan releases them: ControlNets after the last denoising pass that runs them (the hires
pass when their ``hr_option`` takes part in it), the hires fix's model upscaler after the upscale. The plan's
per-part peaks say so (a ControlNet counts beside the denoiser, not beside the VAE decode), a ControlNet swapped for
another of the same count is sized anew, and ``low_memory=None`` counts the extra parts when it decides.

Byte counts come from the ONNX protos and the files on disk, not from sdrt's plan code."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from pipeline_helpers import register

from sdrt import pipelines
from sdrt.pipelines.controlnet import ControlNet

DATA = Path(__file__).resolve().parents[1] / "data"
CN = DATA / "pipelines" / "tiny-sd15-controlnet"
KW = dict(steps=2, sampler="Euler", cfg=5.0, seed=3, width=64, height=64)
HR = dict(hires_scale=2, hires_steps=1, hires_denoise=0.5)


@pytest.fixture(autouse=True)
def _reference():
    register("reference")


def onnx_bytes(path: Path) -> int:
    m = onnx.load(str(path), load_external_data=False)
    return sum(math.prod(t.dims) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in m.graph.initializer)


def need(pl) -> float:
    return 2.0 * pl.weight_bytes + pl.activation_bytes


def edges() -> np.ndarray:
    return np.load(CN / "refs.npz")["edges"]


def nets(*names: str) -> list:
    return [(n, edges(), 1.0) for n in names]


def test_low_memory_releases_the_controlnets_after_the_denoising_and_the_plan_says_so():
    """Low-memory mode: after the run both nets' sessions and graphs are gone, the image is the one every part
    resident makes, and the plan counts the nets in the UNet's phase (beside it at every step) but not in the VAE
    decode's (released before it)."""
    with pipelines.load(CN, backend="reference") as pipe:
        free = pipe.generate("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).images[0]
    with pipelines.load(CN, backend="reference", low_memory=True) as pipe:
        got = pipe.generate("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).images[0]
        for name in ("controlnet", "controlnet_2"):
            part = pipe.control_parts[name]
            assert not part.sessions and part._graph is None, name
        plan = pipe.plan("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).memory
    assert np.array_equal(got, free)
    by = {p.part: p for p in plan.parts}
    assert by["controlnet"].placement == by["controlnet_2"].placement == "released", plan.format()
    nets_need = need(by["controlnet"]) + need(by["controlnet_2"])
    assert by["unet"].peak_bytes == int(plan.base_bytes + need(by["unet"]) + nets_need)
    assert by["controlnet"].peak_bytes == by["unet"].peak_bytes  # it runs in the UNet's phase
    assert by["vae_decoder"].peak_bytes == int(plan.base_bytes + need(by["vae_decoder"]))  # no net beside it
    assert by["text_encoder"].peak_bytes == int(plan.base_bytes + need(by["text_encoder"]))


def test_a_net_left_out_of_the_hires_pass_is_released_before_it():
    """hr_option "Low res only": its net is released after the first pass, so the hires pass runs without it loaded,
    while the "Both" net stays loaded through the hires pass and goes after it (tiny Flux.1 dev with two Flux
    ControlNet files, 64x64 then 96x96: tiny-sd15-controlnet's UNet is fixed at 64x64)."""
    from sdrt.checkpoint.controlnet import open_controlnet

    nets_dir = DATA / "pipelines" / "tiny-flux-controlnet"
    refs = np.load(nets_dir / "refs.npz")
    units = [ControlNet(open_controlnet(nets_dir / n / "diffusion_pytorch_model.safetensors",
                                        graph=nets_dir / "flux_dev_transformer.onnx"),
                        refs[f"multi/control_image_{k}"], 0.6, hr_option=option)
             for k, (n, option) in enumerate([("canny", "Low res only"), ("canny2", "Both")])]
    seen: list[tuple[int, bool, bool]] = []
    with pipelines.load(DATA / "pipelines" / "tiny-flux-dev", backend="reference", low_memory=True) as pipe:
        def step(i: int, total: int, _latents) -> None:
            parts = pipe.control_parts
            seen.append((i, bool(parts["controlnet:canny"].sessions), bool(parts["controlnet:canny2"].sessions)))

        pipe.generate("a cat", controlnets=units, steps=2, width=64, height=64, seed=4, sampler="Euler",
                      guidance=3.5, max_sequence_length=32, hires_scale=1.5, hires_steps=2, hires_denoise=0.6,
                      hires_upscaler="Lanczos", callback=step)
        after = {n: bool(p.sessions) for n, p in pipe.control_parts.items()}
    first = [s for s in seen if s[0] <= 2]
    second = [s for s in seen if s[0] > 2]
    assert first and second, seen
    assert all(a and b for _, a, b in first), seen  # the first pass runs both
    assert all(not a and b for _, a, b in second), seen  # the hires pass: only the "Both" net is loaded
    assert after == {"controlnet:canny": False, "controlnet:canny2": False}


def test_the_model_upscaler_is_released_after_the_upscale():
    """Low-memory mode: the hires fix's model upscaler holds no session and no float32 weights once it has upscaled
    (the hires pass's steps already run without it), and the plan places it released and counts it while it runs
    (beside the UNet and the VAE decoder, still loaded between the passes), not in the final decode."""
    path = DATA / "upscalers" / "rrdb_x2_new.safetensors"
    loaded: list[bool] = []
    with pipelines.load(DATA / "pipelines" / "tiny-sdxl-dyn", backend="reference", low_memory=True) as pipe:
        def step(i: int, total: int, _latents) -> None:
            if i > KW["steps"]:
                loaded.append(any(u.loaded for u in pipe.__dict__["_upscalers"].values()))

        pipe.generate("a cat", hires_upscaler=str(path), callback=step, **HR, **{**KW, "width": 32, "height": 32})
        ups = pipe.__dict__["_upscalers"]
        plan = pipe.plan("a cat", hires_upscaler=str(path), **HR, **{**KW, "width": 32, "height": 32}).memory
    assert ups and not any(u.loaded for u in ups.values())
    assert loaded and not any(loaded)
    by = {p.part: p for p in plan.parts}
    up = by["upscaler"]
    assert up.placement == "released" and up.releasable, plan.format()
    assert up.peak_bytes == int(plan.base_bytes + need(up) + need(by["unet"]) + need(by["vae_decoder"]))
    assert by["vae_decoder"].peak_bytes == int(plan.base_bytes + need(by["vae_decoder"]))


def _padded_net(src: Path, out: Path, pad: int) -> Path:
    """``src``'s ControlNet folder copied to ``out`` with an unused ``pad``-float initializer added (a net of the same
    interface and more weight bytes)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        shutil.copy(f, out / f.name)
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    model.graph.initializer.append(numpy_helper.from_array(np.ones(pad, np.float32), "unused_pad"))
    onnx.save(model, str(out / "model.onnx"))
    return out


def test_a_controlnet_swapped_for_another_of_the_same_count_is_sized_anew(tmp_path):
    """Two jobs name one ControlNet each, from folders of the same name (so the same part name): the second job's
    plan sizes the second net, not the first's figures; a net rewritten in place is sized anew too."""
    small = tmp_path / "a" / "net"
    shutil.copytree(CN / "controlnet", small)
    big = _padded_net(CN / "controlnet_2", tmp_path / "b" / "net", 64 * 1024)
    sizes = {small: onnx_bytes(small / "model.onnx"), big: onnx_bytes(big / "model.onnx")}
    assert sizes[big] - sizes[small] == 4 * 64 * 1024
    with pipelines.load(CN, backend="reference") as pipe:
        for net in (small, big, small):
            pipe.generate("a fox", controlnets=[(str(net), edges(), 1.0)], **KW)
            got = pipe._memory_plan.placement("controlnet:net")
            assert got is not None and got.weight_bytes == sizes[net], (net, got)
        # the same path written anew (a bigger net): a new version of its files
        _padded_net(CN / "controlnet", tmp_path / "c" / "net", 32 * 1024)
        for f in (tmp_path / "c" / "net").iterdir():
            shutil.copy(f, small / f.name)
        pipe.generate("a fox", controlnets=[(str(small), edges(), 1.0)], **KW)
        got = pipe._memory_plan.placement("controlnet:net")
        assert got.weight_bytes == onnx_bytes(small / "model.onnx") == sizes[small] + 4 * 32 * 1024


def test_the_automatic_choice_counts_the_extra_parts(monkeypatch):
    """``low_memory=None`` on a device that reports its memory: low memory when the parts would need more than half
    of it (2 x their bytes). The device's memory is set so that the model's files and the one net of the plain run
    fit, and with a second net they do not: the plain run keeps everything loaded, the run with both nets picks low
    memory and releases them after the denoising."""
    import sdrt.runtime as rt

    own = sum(f.stat().st_size for part in ("text_encoder", "unet", "vae_decoder", "vae_encoder")
              for f in (CN / part).iterdir() if f.name.startswith("model.onnx"))
    one, two = onnx_bytes(CN / "controlnet" / "model.onnx"), onnx_bytes(CN / "controlnet_2" / "model.onnx")
    memory = 4 * (own + one + two // 2)  # own + one < memory / 4 < own + one + two
    real = rt.select

    def reporting(backend="auto", device=None, registry=None):
        be, dev = real(backend, device, registry)
        return be, dataclasses.replace(dev, memory_bytes=memory)

    monkeypatch.setattr(rt, "select", reporting)
    # the budget given apart (memory=), so that only the automatic choice can release a part
    with pipelines.load(CN, backend="reference", low_memory=None, memory="16GiB") as pipe:
        pipe.generate("a fox", **KW)  # the folder's first net at scale 0: the plain run's one extra part
        assert pipe.is_low_memory is False
        assert pipe.control_parts["controlnet"].sessions  # kept for the next job
        pipe.generate("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW)
        assert pipe.is_low_memory is True
        assert not pipe.control_parts["controlnet"].sessions and not pipe.control_parts["controlnet_2"].sessions
        plan = pipe.plan("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).memory
        assert all(p.placement == "released" for p in plan.parts), plan.format()


@pytest.mark.parametrize("low_memory", [True, False])
def test_a_model_upscaler_written_anew_at_its_path_is_read_anew(tmp_path, low_memory):
    """The next job names the same upscaler path, whose file was written over with another model in between: it
    upscales with the new file, as a fresh pipeline does (and as a ControlNet file written anew is read anew).
    Until 2026-12-01 the pipeline kept the first file's upscaler by path; released after its upscale, it then
    rebuilt its weights from the first file's header over the new file's bytes."""
    path = tmp_path / "up.safetensors"
    shutil.copy(DATA / "upscalers" / "compact_x2.safetensors", path)
    kw = dict(hires_upscaler=str(path), **HR, **{**KW, "width": 32, "height": 32})
    folder = DATA / "pipelines" / "tiny-sdxl-dyn"
    with pipelines.load(folder, backend="reference", low_memory=low_memory) as pipe:
        first = pipe.generate("a cat", **kw).images[0]
        shutil.copy(DATA / "upscalers" / "rrdb_x2_new.safetensors", path)  # written over in place
        second = pipe.generate("a cat", **kw).images[0]
    with pipelines.load(folder, backend="reference", low_memory=low_memory) as pipe:
        want = pipe.generate("a cat", **kw).images[0]
    assert np.abs(first.astype(int) - want.astype(int)).max() > 0  # the two upscalers differ
    assert np.array_equal(second, want)


def test_a_low_memory_value_set_by_hand_stands_even_when_the_automatic_choice_made_it(monkeypatch):
    """``low_memory=None`` picks False for the plain run; the caller then sets ``pipe.low_memory = False`` by hand
    (everything kept loaded, whatever comes): the run with both nets keeps it, as docs/memory.md says of a value
    set by hand. Until 2026-12-01 a hand-set value equal to the automatic one was taken for the automatic one and
    decided again (low memory for the run with both nets)."""
    import sdrt.runtime as rt

    own = sum(f.stat().st_size for part in ("text_encoder", "unet", "vae_decoder", "vae_encoder")
              for f in (CN / part).iterdir() if f.name.startswith("model.onnx"))
    one, two = onnx_bytes(CN / "controlnet" / "model.onnx"), onnx_bytes(CN / "controlnet_2" / "model.onnx")
    memory = 4 * (own + one + two // 2)
    real = rt.select

    def reporting(backend="auto", device=None, registry=None):
        be, dev = real(backend, device, registry)
        return be, dataclasses.replace(dev, memory_bytes=memory)

    monkeypatch.setattr(rt, "select", reporting)
    with pipelines.load(CN, backend="reference", low_memory=None, memory="16GiB") as pipe:
        pipe.generate("a fox", **KW)
        assert pipe.is_low_memory is False
        pipe.low_memory = False  # by hand
        pipe.generate("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW)
        assert pipe.is_low_memory is False
        assert pipe.control_parts["controlnet"].sessions and pipe.control_parts["controlnet_2"].sessions
        pipe.low_memory = None  # the automatic choice again: decided for the job's parts
        pipe.generate("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW)
        assert pipe.is_low_memory is True
