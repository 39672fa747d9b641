"""Black Forest Labs' FLUX.1 Canny/Depth control LoRAs on a Flux.1 dev model, against diffusers.

tests/data/lora/flux_control_lora_{bfl,diffusers}.safetensors: one random rank-4 control LoRA for tiny-flux-dev's
transformer, in BFL's layout (``img_in.lora_A.weight`` [4, 128], fused ``qkv`` / ``linear1``, ``lora_B.bias`` on
every layer, the qk-norm ``*.scale`` whole) and in diffusers' (scripts/gen_flux_control_lora_refs.py). The
reference images: diffusers 0.42.1's ``FluxControlPipeline`` with ``load_lora_weights`` (x_embedder zero-padded to
128 inputs, the norms loaded whole) and ``fuse_lora(lora_scale=s)``. Here tiny-flux-dev as release files (BFL's
transformer keys, bound onto its weight-free graphs) takes the LoRA: its transformer runs the 128-input graph.
Tolerance: 1 level of 255.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import test_flow_single_files as flow

from sdrt import pipelines
from sdrt.errors import InputError, WeightsError
from sdrt.lora import Lora

LORA = Path(__file__).resolve().parents[1] / "data" / "lora"
FILES = {"bfl": LORA / "flux_control_lora_bfl.safetensors", "diffusers": LORA / "flux_control_lora_diffusers.safetensors"}
CASES = {c["name"]: c for c in json.loads((LORA / "flux_control_lora_refs.json").read_text())}
REFS = np.load(LORA / "flux_control_lora_refs.npz")


def _kw(case: dict, control=None) -> dict:
    return dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], sampler="Euler",
                guidance=case["guidance"], max_sequence_length=case["max_sequence_length"],
                control_image=REFS["control_image"] if control is None else control)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return flow._files("flux-dev", tmp_path_factory.mktemp("flux-dev"))


def _load(f: dict, backend: str = "reference", loras=None, lora_dir=None):
    pipe = pipelines.load(f["file"], backend=backend, text_encoders=f["text_encoders"], vae=f["vae"],
                          graph_paths=f["graphs"], tokenizers=f["tokenizers"], family=f["family"])
    if loras:
        pipe.set_loras(loras)
    if lora_dir is not None:
        pipe.weights.lora_dir = lora_dir
    return pipe


def _diff(got, name: str) -> int:
    want = REFS[f"{name}/image"].astype(int)
    got = np.stack(got).astype(int)
    assert got.shape == want.shape
    return int(np.abs(got - want).max())


def test_reads_as_a_control_lora():
    for layout, path in FILES.items():
        lora = Lora.open(path)
        assert lora.control is not None, layout
        assert len(lora.control.sets) == 8 and len(lora.control.biases) == len(lora.layers), layout


@pytest.mark.parametrize("layout", ["bfl", "diffusers"])
@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_image_matches_diffusers(files, layout, backend, request):
    if backend != "reference":
        request.applymarker(pytest.mark.needs_backend(backend))
        pytest.importorskip(f"sdrt_{backend}")
    case = CASES["scale1"]
    with _load(files, backend, loras=[(FILES[layout], case["scale"])]) as pipe:
        assert pipe.flux_tool == "control"
        diff = _diff(pipe(case["prompt"], **_kw(case)), case["name"])
    assert diff <= 1, f"{layout} on {backend}: {diff} levels from diffusers' image"


def test_scale_matters_and_prompt_tag_works(files, tmp_path):
    """The LoRA at 0.5 gives diffusers' image at 0.5 (norms whole, deltas and biases halved), through a prompt tag;
    the image at scale 1 is far from it."""
    (tmp_path / "canny.safetensors").write_bytes(FILES["bfl"].read_bytes())
    half = CASES["scale0.5"]
    with _load(files, lora_dir=tmp_path) as pipe:
        assert pipe.flux_tool is None
        got = pipe(half["prompt"] + " <lora:canny:0.5>", **_kw(half))
        assert pipe.flux_tool == "control"
    assert _diff(got, "scale0.5") <= 1
    assert _diff(got, "scale1") > 10


def test_control_image_matters_and_is_required(files):
    case = CASES["scale1"]
    with _load(files, loras=[(FILES["bfl"], 1.0)]) as pipe:
        assert _diff(pipe(case["prompt"], **_kw(case)), "scale1") <= 1
        other = np.zeros_like(REFS["control_image"])
        assert _diff(pipe(case["prompt"], **_kw(case, other)), "scale1") > 10
        kw = _kw(case)
        kw.pop("control_image")
        with pytest.raises(InputError, match="control image") as e:
            pipe(case["prompt"], **kw)
        assert "\n" not in str(e.value)
        pipe.set_loras([])  # back to Flux.1 dev: its own graph and weights
        assert pipe.flux_tool is None
        pipe(case["prompt"], **kw)


def test_refusals_are_one_line(files, tmp_path):
    with _load(files) as pipe:
        with pytest.raises(WeightsError, match="Flux Control LoRAs at once"):
            pipe.set_loras([(FILES["bfl"], 1.0), (FILES["diffusers"], 1.0)])
        assert pipe.flux_tool is None
    for kind, says in (("flux-schnell", "this is Flux.1 schnell"), ("chroma", "made for Flux.1 dev, and this is a "
                                                                             "Chroma")):
        f = flow._files(kind, tmp_path / kind)
        with _load(f) as pipe:
            with pytest.raises(WeightsError, match=says) as e:
                pipe.set_loras([(FILES["bfl"], 1.0)])
            assert "\n" not in str(e.value) and not pipe.weights.loras


def test_with_an_ordinary_lora_and_in_the_infotext(files):
    """The control LoRA at 1 with an ordinary Flux LoRA at 0.8 (diffusers: set_adapters, fuse_lora); both named in
    the PNG's ``Lora hashes``."""
    case = CASES["mixed"]
    with _load(files, loras=[(FILES["bfl"], case["scale"]), (LORA / "flux_peft.safetensors", case["other"])]) as pipe:
        gen = pipe.generate(case["prompt"], **_kw(case))
        assert _diff(gen.images, "mixed") <= 1
        assert _diff(gen.images, "scale1") > 10
        hashes = str(gen.settings[0]["Lora hashes"])
        assert "flux_control_lora_bfl: " in hashes and "flux_peft: " in hashes


def test_run_plan_says_the_control_lora_makes_it_canny_depth(files, tmp_path):
    """A run plan made before the LoRA is active (a prompt tag; the CLI's --dry-run --lora) runs the 128-input
    transformer and says so; without a control image it is the one-line error the run gives."""
    (tmp_path / "canny.safetensors").write_bytes(FILES["bfl"].read_bytes())
    case = CASES["scale1"]
    with _load(files, lora_dir=tmp_path) as pipe:
        plan = pipe.plan(case["prompt"] + " <lora:canny:1>", **_kw(case))
        assert "Flux.1 Canny/Depth (Flux.1 dev + control LoRA canny)" in plan.format()
        tr = next(p for p in plan.parts if p.part == "transformer")
        assert all(dict((k, s) for k, s, _ in sig)["hidden_states"][2] == 128 for sig, _ in tr.signatures)
        assert pipe.flux_tool is None  # a plan changes nothing
        kw = _kw(case)
        kw.pop("control_image")
        with pytest.raises(InputError, match="control LoRA canny makes this Flux.1 dev model a Canny/Depth model"):
            pipe.plan(case["prompt"] + " <lora:canny:1>", **kw)
        pipe.weights.planned = [FILES["diffusers"]]
        assert "control LoRA flux_control_lora_diffusers" in pipe.plan(case["prompt"], **_kw(case)).format()


@pytest.mark.needs_backend("ggml")
def test_gguf_dev_model_takes_the_control_lora_on_ggml(files, tmp_path):
    """Flux.1 dev as city96's GGUF files hold it (BFL keys, big matrices Q8_0): the control LoRA widens its
    dequantized img_in; diffusers' image within the GGUF Flux test's bound (35 dB PSNR)."""
    pytest.importorskip("gguf", reason="the optional gguf package is not installed (pip install gguf)")
    from flow_file_helpers import bfl_transformer, diffusers_params
    from test_gguf_flux import _psnr, _write

    params = bfl_transformer(diffusers_params(flow.PIPES / "tiny-flux-dev" / "transformer" / "model.onnx"))
    path = tmp_path / "flux1-dev-Q8_0.gguf"
    _write(path, params, "Q8_0")
    case = CASES["scale1"]
    with pipelines.load(path, backend="ggml", text_encoders=files["text_encoders"], vae=files["vae"],
                        graph_paths=files["graphs"], tokenizers=files["tokenizers"], family="flux-dev") as pipe:
        pipe.set_loras([(FILES["bfl"], 1.0)])
        assert pipe.flux_tool == "control"
        got = np.stack(pipe(case["prompt"], **_kw(case)))
    assert _psnr(got, REFS["scale1/image"]) >= 35, _psnr(got, REFS["scale1/image"])


def test_on_and_off(files):
    """Flux.1 dev's image, then the control LoRA's, then dev's again bit for bit after it goes."""
    case = CASES["scale1"]
    kw = _kw(case)
    kw.pop("control_image")
    with _load(files) as pipe:
        before = np.stack(pipe(case["prompt"], **kw))
        pipe.set_loras([(FILES["diffusers"], 1.0)])
        assert pipe.flux_tool == "control"
        assert _diff(pipe(case["prompt"], **_kw(case)), "scale1") <= 1
        pipe.set_loras([])
        assert pipe.flux_tool is None
        assert np.array_equal(np.stack(pipe(case["prompt"], **kw)), before)


def test_a_fill_model_refuses_it(tmp_path):
    from test_flux_tools_files import _fill_files

    f = _fill_files(tmp_path)
    with flow._load(f) as pipe:
        with pytest.raises(WeightsError, match="already takes 384 input channels") as e:
            pipe.set_loras([(FILES["bfl"], 1.0)])
        assert "\n" not in str(e.value) and pipe.flux_tool == "fill"
