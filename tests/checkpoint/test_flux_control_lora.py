"""Black Forest Labs' FLUX.1 Canny/Depth control LoRAs on a Flux.1 dev model, against diffusers.

tests/data/lora/flux_control_lora_{bfl,diffusers}.safetensors: one random rank-4 control LoRA for tiny-flux-dev's
transformer on every linear layer, in BFL's layout (``img_in.lora_A.weight`` [4, 128], fused ``qkv`` / ``linear1``,
``final_layer.adaLN_modulation.1``, ``lora_B.bias`` on every layer, the qk-norm ``*.scale`` whole) and in diffusers'
as diffusers' own BFL converter writes it, but for the final adaLN's ``lora_A``, which that converter swaps by
mistake (scripts/gen_flux_control_lora_refs.py). The
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


def _full_size_bfl_keys() -> dict[str, tuple[int, ...]]:
    """Every tensor diffusers' ``_convert_bfl_flux_control_lora_to_diffusers`` takes from BFL's file (19 + 38 blocks,
    width 3072), rank 1, with a ``lora_B.bias`` on every layer."""
    d, mlp = 3072, 12288
    mods = {"img_in": (d, 128), "txt_in": (d, 4096), "time_in.in_layer": (d, 256), "time_in.out_layer": (d, d),
            "vector_in.in_layer": (d, 768), "vector_in.out_layer": (d, d), "guidance_in.in_layer": (d, 256),
            "guidance_in.out_layer": (d, d), "final_layer.linear": (64, d), "final_layer.adaLN_modulation.1": (2 * d, d)}
    for i in range(19):
        for s in ("img", "txt"):
            mods.update({f"double_blocks.{i}.{s}_mod.lin": (6 * d, d), f"double_blocks.{i}.{s}_attn.qkv": (3 * d, d),
                         f"double_blocks.{i}.{s}_attn.proj": (d, d), f"double_blocks.{i}.{s}_mlp.0": (mlp, d),
                         f"double_blocks.{i}.{s}_mlp.2": (d, mlp)})
    for i in range(38):
        mods.update({f"single_blocks.{i}.modulation.lin": (3 * d, d), f"single_blocks.{i}.linear1": (3 * d + mlp, d),
                     f"single_blocks.{i}.linear2": (d, d + mlp)})
    keys: dict[str, tuple[int, ...]] = {}
    for m, (o, i) in mods.items():
        keys.update({f"{m}.lora_A.weight": (1, i), f"{m}.lora_B.weight": (o, 1), f"{m}.lora_B.bias": (o,)})
    for i in range(19):
        for s in ("img", "txt"):
            keys.update({f"double_blocks.{i}.{s}_attn.norm.{n}_norm.scale": (128,) for n in ("query", "key")})
    for i in range(38):
        keys.update({f"single_blocks.{i}.norm.{n}_norm.scale": (128,) for n in ("query", "key")})
    return keys


def test_full_size_bfl_control_lora_finds_every_place_in_the_shipped_graph(tmp_path, monkeypatch):
    """BFL's full-size key set (shapes as flux1-canny-dev-lora.safetensors has them, rank 1 here): every low-rank
    layer, bias and norm scale lands on an initializer of the shipped 128-input graph with its shape."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    from sdrt.checkpoint import param_map, shipped_graph
    from sdrt.graph import Graph
    from sdrt.pipelines import fluxcontrollora
    from sdrt.pipelines.weights import transformer_lora

    lora = Lora.from_arrays({k: np.full(s, 0.01, np.float32) for k, s in _full_size_bfl_keys().items()},
                            source="flux1-canny-dev-lora.safetensors")
    assert lora.control is not None and len(lora.control.sets) == 2 * (2 * 19 + 38)
    path = fluxcontrollora.widened_graph(shipped_graph("flux_dev_transformer"))
    assert path == shipped_graph("flux_control_transformer")
    graph = Graph.load(path, load_external=False)
    pmap = param_map(graph)
    assert pmap["x_embedder.weight"].shape == (3072, 128)
    split = transformer_lora(lora, graph)
    assert set(split.targets) == set(split.layers)  # every layer, fused ones split, has its initializer
    # biases and norms on zero base values (the large weights are not made)
    small = {s.init: np.zeros(s.shape, np.float32) for c, s in pmap.items() if not c.endswith(".weight")
             or "norm" in c}
    extras = fluxcontrollora.extras(lora, 0.5, graph, small)
    wanted = {pmap[c].init for c in pmap if c.endswith(".bias") and not c.startswith(("pos_embed", "norm_out.norm"))}
    assert wanted <= set(extras)  # every linear layer's bias moves
    norms = [pmap[c].init for c in pmap if c.endswith(("norm_q.weight", "norm_k.weight", "added_q.weight", "added_k.weight"))]
    assert len(norms) == 2 * (2 * 19 + 38) and all(np.allclose(extras[n], 0.01) for n in norms)  # whole, not 0.5x
    bias = pmap["x_embedder.bias"].init
    assert np.allclose(extras[bias], 0.5 * 0.01)  # s * alpha / rank * lora_B.bias, alpha = rank


def test_a_diffusers_folder_takes_it(files, tmp_path):
    """Flux.1 dev as a diffusers folder (``transformer/diffusion_pytorch_model.safetensors`` in diffusers' keys)."""
    import shutil

    import single_file_helpers as h
    from flow_file_helpers import diffusers_params

    src = flow.PIPES / "tiny-flux-dev"
    root = tmp_path / "FLUX.1-dev"
    (root / "transformer").mkdir(parents=True)
    h.write(root / "transformer" / "diffusion_pytorch_model.safetensors",
            diffusers_params(src / "transformer" / "model.onnx"))
    shutil.copy(src / "transformer" / "config.json", root / "transformer" / "config.json")
    flow.flux_dev_folder_parts(root)
    case = CASES["scale1"]
    with pipelines.load(root, backend="reference", graph_paths=files["graphs"]) as pipe:
        pipe.set_loras([(FILES["bfl"], 1.0)])
        assert pipe.flux_tool == "control"
        assert _diff(pipe(case["prompt"], **_kw(case)), "scale1") <= 1


def test_scale_zero_runs_as_diffusers_at_weight_zero_and_says_so(files, caplog):
    """At scale 0 diffusers (fuse_lora(lora_scale=0)) still runs the control model: the 128-input x_embedder and the
    LoRA's norms, loaded whole; only the deltas go. sdrt gives that image, and says so: a warning when the LoRA
    comes in, and the missing control image's refusal names the LoRA at scale 0 and how to run Flux.1 dev."""
    import logging

    case = CASES["scale0"]
    with caplog.at_level(logging.WARNING, logger="sdrt"), _load(files, loras=[(FILES["bfl"], 0.0)]) as pipe:
        said = [r.getMessage() for r in caplog.records if "at scale 0" in r.getMessage()]
        assert len(said) == 1 and "leave the LoRA out to run Flux.1 dev" in said[0], said
        assert pipe.flux_tool == "control"
        assert _diff(pipe(case["prompt"], **_kw(case)), "scale0") <= 1
        assert _diff(pipe(case["prompt"], **_kw(case)), "scale1") > 10
        kw = _kw(case)
        kw.pop("control_image")
        with pytest.raises(InputError, match="control image") as e:
            pipe(case["prompt"], **kw)
        msg = str(e.value)
        assert "flux_control_lora_bfl (at scale 0) makes this Flux.1 dev model" in msg, msg
        assert "leave the LoRA out for Flux.1 dev" in msg and "\n" not in msg
