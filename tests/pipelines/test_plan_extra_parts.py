"""The memory plan counts every part a run uses, not only the model's own: ControlNets (kept loaded beside the
UNet), an IP-Adapter's image encoder (released after encoding when the budget is short) and the hires fix's
model upscaler. The expected bytes come from the files' tensor headers (onnx, the safetensors header), not
from sdrt's plan code."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from pipeline_helpers import register

from sdrt import pipelines
from sdrt.pipelines import IPAdapter

DATA = Path(__file__).resolve().parents[1] / "data"
CN = DATA / "pipelines" / "tiny-sd15-controlnet"
IPA = DATA / "ipadapter"
KW = dict(steps=2, sampler="Euler", cfg=5.0, seed=3, width=64, height=64)


def onnx_bytes(path: Path, skip: frozenset[str] = frozenset()) -> int:
    """Initializer bytes of an ONNX file from its tensor protos (external data not read)."""
    m = onnx.load(str(path), load_external_data=False)
    return sum(math.prod(t.dims) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
               for t in m.graph.initializer if t.name not in skip)


def safetensors_header(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    return head


def need(pl, footprint: float = 2.0) -> float:
    return footprint * pl.weight_bytes + pl.activation_bytes


@pytest.fixture(autouse=True)
def _reference():
    register("reference")


@pytest.fixture
def tiny_encoder_graph(monkeypatch):
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: IPA / "clip_vision.onnx" if name == "clip_vision_h"
                        else real(name))


def ip_unit() -> IPAdapter:
    image = np.load(IPA / "refs.npz")["ip_image"]
    return IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=image, scale=0.7, image_encoder=IPA / "image_encoder")


def nets(*names: str) -> list:
    edges = np.load(CN / "refs.npz")["edges"]
    return [(n, edges, 1.0) for n in names]


def test_a_second_controlnet_adds_its_bytes_to_the_plan():
    """tiny-sd15-controlnet's UNet takes residuals, so its plain run already runs the folder's first net (at scale
    0); a second net adds its own weights (the ONNX file's initializers) x 2 and its activations to the peak."""
    with pipelines.load(CN, backend="reference") as pipe:
        plain = pipe.plan("a fox", **KW).memory
        two = pipe.plan("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).memory
    expected = onnx_bytes(CN / "controlnet_2" / "model.onnx")
    got = two.placement("controlnet_2")
    assert got is not None and got.weight_bytes == expected, (got, expected)
    assert got.role == "controlnet" and got.releasable and got.activation_bytes > 0
    assert plain.placement("controlnet").weight_bytes == onnx_bytes(CN / "controlnet" / "model.onnx")
    assert two.peak_bytes - plain.peak_bytes == int(2 * expected + got.activation_bytes)
    assert "controlnet_2" in two.format()
    d = two.to_dict()  # the plan as data (RunPlan.to_dict) lists it with its bytes
    assert any(p["part"] == "controlnet_2" and p["weight_bytes"] == expected for p in d["parts"])


def test_the_image_encoder_adds_its_bytes_to_the_plan(tiny_encoder_graph):
    """The encoder's weights: the safetensors file's float32 tensors plus the graph's own constants (position ids,
    shapes: initializers the file does not hold)."""
    folder = DATA / "pipelines" / "tiny-sd15"
    head = safetensors_header(IPA / "image_encoder" / "model.safetensors")
    assert {v["dtype"] for v in head.values()} == {"F32"}
    expected = sum(4 * math.prod(v["shape"]) for v in head.values()) + onnx_bytes(IPA / "clip_vision.onnx", frozenset(head))
    with pipelines.load(folder, backend="reference") as pipe:
        plain = pipe.plan("a fox", **KW).memory
        withip = pipe.plan("a fox", ip_adapter=ip_unit(), **KW).memory
    enc = withip.placement("image_encoder")
    assert enc is not None and enc.weight_bytes == expected, (enc, expected)
    assert enc.role == "image_encoder" and enc.releasable and enc.activation_bytes > 0
    assert plain.placement("image_encoder") is None
    assert withip.placement("unet").activation_bytes > 0  # the UNet with IP attention, as the run edits it
    # every part resident: the peak is base + the sum of the parts' needs; the encoder's is one of them (the UNet
    # also grows by the adapter's IP projections, which it binds)
    assert withip.peak_bytes == int(withip.base_bytes + sum(need(p) for p in withip.parts))
    unet_growth = need(withip.placement("unet")) - need(plain.placement("unet"))
    assert withip.peak_bytes - plain.peak_bytes == int(2 * expected + enc.activation_bytes + unet_growth)


def test_a_budget_that_fits_the_plain_run_releases_with_the_image_encoder(tiny_encoder_graph):
    """A budget just above the plain run's peak: with the adapter the parts no longer fit together, so the plan
    releases some, and the run under it makes the same image, the encoder released after use exactly when the
    plan says so; a budget that leaves no room for the encoder beside the others releases it too."""
    folder = DATA / "pipelines" / "tiny-sd15"
    with pipelines.load(folder, backend="reference") as pipe:
        free = pipe.generate("a fox", ip_adapter=ip_unit(), **KW).images[0]
        plain = pipe.plan("a fox", **KW).memory
        pipe.memory = plain.peak_bytes + 1024
        plain = pipe.plan("a fox", **KW).memory
        assert plain.fits and all(p.placement == "resident" for p in plain.parts)  # it fits the plain run
        withip = pipe.plan("a fox", ip_adapter=ip_unit(), **KW).memory
        assert any(p.placement == "released" for p in withip.parts) and withip.fits, withip.format()
        got = pipe.generate("a fox", ip_adapter=ip_unit(), **KW).images[0]
        placed = pipe._memory_plan.placement("image_encoder")
        assert placed is not None
        assert bool(next(iter(pipe.__dict__["_ip_encoders"].values())).sessions) == (placed.placement == "resident")
        # room for the largest part and the process, nothing beside: every part released, the encoder too
        pipe.memory = withip.base_bytes + int(max(need(p) for p in withip.parts)) + 1024
        tight = pipe.plan("a fox", ip_adapter=ip_unit(), **KW).memory
        assert tight.placement("image_encoder").placement == "released", tight.format()
        again = pipe.generate("a fox", ip_adapter=ip_unit(), **KW).images[0]
        assert not next(iter(pipe.__dict__["_ip_encoders"].values())).sessions  # released after encoding
    assert np.array_equal(got, free) and np.array_equal(again, free)


def test_a_budget_that_fits_one_net_but_not_two_releases_parts_and_runs():
    """A budget that holds the plain run all resident: with a second net the parts no longer fit together, so the
    plan releases some (the nets among them: released after their last pass, held beside the UNet while it runs),
    the run makes the same image, and a net the plan releases has no session after the run while a resident one
    keeps its own; a budget that leaves nothing beside the nets for the UNet says it does not fit."""
    with pipelines.load(CN, backend="reference") as pipe:
        free = pipe.generate("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).images[0]
        plain = pipe.plan("a fox", **KW).memory
        pipe.memory = plain.peak_bytes + 1024
        assert pipe.plan("a fox", **KW).memory.fits
        two = pipe.plan("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).memory
        assert any(p.placement == "released" for p in two.parts), two.format()
        assert two.fits and two.peak_bytes <= pipe.memory, two.format()
        got = pipe.generate("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).images[0]
        placed = {n: pipe._memory_plan.placement(n).placement for n in ("controlnet", "controlnet_2")}
        assert {n: bool(pipe.control_parts[n].sessions) for n in placed} == {
            n: p == "resident" for n, p in placed.items()}, placed
        # the nets alone beside the process: no room left to stream the UNet in
        pipe.memory = two.base_bytes + int(need(two.placement("controlnet")) + need(two.placement("controlnet_2")))
        short = pipe.plan("a fox", controlnets=nets("controlnet", "controlnet_2"), **KW).memory
        assert not short.fits and "DOES NOT FIT" in short.format(), short.format()
    assert np.array_equal(got, free)


@pytest.mark.parametrize("upscaler", ["compact_x2.safetensors", "rrdb_x2_new.safetensors"])
def test_the_hires_fix_model_upscaler_adds_its_float32_bytes(upscaler):
    """The hires fix's model upscaler (ESRGAN family) runs every tensor as float32 and is kept between jobs: the
    plan counts its header's element count x 4 bytes, resident, beside the Lanczos run's parts."""
    path = DATA / "upscalers" / upscaler
    expected = sum(4 * math.prod(v["shape"]) for v in safetensors_header(path).values())
    hr = dict(hires_scale=2, hires_steps=1, hires_denoise=0.5)
    with pipelines.load(DATA / "pipelines" / "tiny-sdxl-dyn", backend="reference") as pipe:
        lanczos = pipe.plan("a cat", hires_upscaler="Lanczos", **hr, **KW).memory
        model = pipe.plan("a cat", hires_upscaler=str(path), **hr, **KW).memory
    up = model.placement("upscaler")
    assert lanczos.placement("upscaler") is None
    assert up is not None and up.weight_bytes == expected and up.role == "upscaler" and up.releasable
    assert model.peak_bytes - lanczos.peak_bytes == 2 * expected
    assert "upscaler" in model.format()


def test_dry_run_lists_the_controlnets_with_their_bytes(capsys, tmp_path):
    from PIL import Image

    from sdrt.cli import main

    edges = tmp_path / "edges.png"
    Image.fromarray(np.load(CN / "refs.npz")["edges"]).save(edges)
    assert main(["generate", str(CN), "a fox", "--dry-run", "--steps", "2", "--width", "64", "--height", "64",
                 "--backend", "reference", "--memory", "8GB", "--controlnet", str(CN / "controlnet"),
                 "--control-image", str(edges), "--controlnet", str(CN / "controlnet_2"),
                 "--control-image", str(edges)]) == 0
    out = capsys.readouterr().out
    kib = onnx_bytes(CN / "controlnet_2" / "model.onnx") / 2**20
    line = next(x for x in out.splitlines() if x.strip().startswith("controlnet_2 ") and "weights" in x)
    assert f"weights {kib:.1f} MiB" in " ".join(line.split()) and line.rstrip().endswith("controlnet"), out


def test_pinned_parts_stay_and_a_streamed_denoiser_gets_what_they_leave():
    """plan_memory's pinned parts (ControlNets) are resident whatever the budget, low_memory included, and the
    streamed denoiser's group cap is what is left beside them: (budget - base - 2 x net) / 2."""
    from sdrt.pipelines.budget import plan_memory

    weights = {"text_encoder": 10, "unet": 1000, "vae_decoder": 20, "controlnet": 100}
    plan = plan_memory(weights, "unet", 800, base=100, pinned=["controlnet"])
    assert plan.placement("controlnet").placement == "resident" and not plan.placement("controlnet").releasable
    assert plan.placement("unet").placement == "streamed"
    assert plan.placement("unet").cap_bytes == (800 - 100 - 2 * 100) // 2
    assert plan.fits and plan.peak_bytes <= 800
    low = plan_memory(weights, "unet", None, release_all=True, pinned=["controlnet"])
    assert [p.placement for p in low.parts] == ["released", "released", "released", "resident"]


def test_a_flux_controlnet_file_adds_its_bytes():
    """A Flux.1 ControlNet .safetensors bound onto its shipped-style graph: counted with the file's float32 tensors
    (and the graph's few constants), kept beside the transformer."""
    from sdrt.checkpoint.controlnet import open_controlnet
    from sdrt.pipelines.controlnet import ControlNet

    nets_dir = DATA / "pipelines" / "tiny-flux-controlnet"
    case = json.loads((nets_dir / "refs.json").read_text())[0]
    refs = np.load(nets_dir / "refs.npz")
    kw = dict(steps=2, seed=case["seed"], width=case["width"], height=case["height"], sampler="Euler",
              guidance=case["guidance"], max_sequence_length=case["max_sequence_length"])
    units = [ControlNet(open_controlnet(nets_dir / n / "diffusion_pytorch_model.safetensors",
                                        graph=nets_dir / "flux_dev_transformer.onnx"),
                        refs[f"{case['name']}/control_image_{k}"], case["scale"][k], case["start"][k], case["end"][k],
                        union_mode=case["mode"]) for k, n in enumerate(case["nets"])]
    file_bytes = {f"controlnet:{n}": sum(4 * math.prod(v["shape"]) for v in safetensors_header(
        nets_dir / n / "diffusion_pytorch_model.safetensors").values()) for n in case["nets"]}
    with pipelines.load(DATA / "pipelines" / "tiny-flux-dev", backend="reference") as pipe:
        plain = pipe.plan(case["prompt"], **kw).memory
        with_nets = pipe.plan(case["prompt"], controlnets=units, **kw).memory
    for name, expected in file_bytes.items():
        pl = with_nets.placement(name)
        assert pl is not None and pl.role == "controlnet" and pl.releasable, with_nets.format()
        assert expected <= pl.weight_bytes <= expected + 4096, (pl.weight_bytes, expected)
    assert with_nets.peak_bytes - plain.peak_bytes >= 2 * sum(file_bytes.values())
    # the transformer's activations at the graph it runs (with the nets' residual inputs), as without nets
    assert with_nets.placement("transformer").activation_bytes > 0 and plain.placement("transformer").activation_bytes
