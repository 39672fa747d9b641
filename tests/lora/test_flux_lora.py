"""Flux.1 LoRAs in the four layouts people download, against diffusers' ``load_lora_weights`` + ``fuse_lora``.

Data: ``scripts/make_flow_lora_refs.py`` (tests/data/lora/): diffusers/PEFT keys, kohya's flattened Black Forest
Labs names (fused ``qkv``), ComfyUI's dotted BFL names and XLabs' ``processor.qkv_lora1`` layers, on the tiny Flux.1 dev folder; diffusers' change of
every parameter at ``lora_scale=0.8``. diffusers leaves ComfyUI's ``diffusion_model.`` keys unused (nothing
changes), so that file is checked against the kohya file with the same factors. Fused ``linear1`` is split at
Flux.1's own width by diffusers' converter, so it is checked on the shipped full-width graph (probe vectors).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lora_helpers import transformer_deltas

from sdrt import pipelines
from sdrt.checkpoint import param_map, shipped_graph
from sdrt.errors import SdrtError
from sdrt.graph import Graph
from sdrt.lora import Lora
from sdrt.pipelines.weights import transformer_lora

ROOT = Path(__file__).resolve().parents[1] / "data"
D = ROOT / "lora"
FLUX = ROOT / "pipelines" / "tiny-flux-dev"
SCALE = 0.8


@pytest.fixture
def pipe(registry):
    with pipelines.load(FLUX, backend="reference") as p:
        yield p


def _deltas(pipe, name: str) -> dict[str, np.ndarray]:
    """``{diffusers parameter: merged - base}`` (torch layout) of the transformer with one LoRA set."""
    return transformer_deltas(pipe, D / f"{name}.safetensors", SCALE)


@pytest.mark.parametrize("name", ["flux_peft", "flux_kohya", "flux_xlabs"])
def test_flux_lora_matches_diffusers_fuse_lora(pipe, name):
    refs = np.load(D / "flux_lora_refs.npz")
    want = {k.split("/", 1)[1]: refs[k] for k in refs.files if k.startswith(name + "/")}
    got = _deltas(pipe, name)
    assert set(got) == set(want)
    for k, ref in want.items():
        np.testing.assert_allclose(got[k], ref, atol=2e-5 * max(1.0, float(np.abs(ref).max())), err_msg=k)
    pipe.set_loras([])


def test_comfyui_dotted_bfl_names_equal_kohya(pipe):
    kohya, comfy = _deltas(pipe, "flux_kohya"), _deltas(pipe, "flux_comfy")
    assert set(kohya) == set(comfy) and len(kohya) == 11
    for k in kohya:
        np.testing.assert_array_equal(kohya[k], comfy[k])
    pipe.set_loras([])


#: as in scripts/make_flow_lora_refs.py: kohya modules and their (out, in) sizes at Flux.1's width
FULL = {"single_blocks.7.linear1": (21504, 3072), "double_blocks.3.txt_attn.qkv": (9216, 3072),
        "double_blocks.3.img_mod.lin": (18432, 3072)}


def full_width_lora() -> Lora:
    rng = np.random.default_rng(7)
    arrays = {}
    for mod, (o, i) in FULL.items():
        k = "lora_unet_" + mod.replace(".", "_")
        arrays[f"{k}.lora_down.weight"] = rng.standard_normal((4, i)).astype(np.float32)
        arrays[f"{k}.lora_up.weight"] = rng.standard_normal((o, 4)).astype(np.float32)
        arrays[f"{k}.alpha"] = np.array(8.0, np.float32)
    return Lora.from_arrays(arrays)


def test_fused_layers_split_as_diffusers_at_full_width():
    graph = Graph.load(shipped_graph("flux_dev_transformer"))
    by_init = {s.init: c[: -len(".weight")] for c, s in param_map(graph).items() if c.endswith(".weight")}
    lora = transformer_lora(full_width_lora(), graph)
    refs = np.load(D / "flux_lora_refs.npz")
    want = {k.split("/", 1)[1]: refs[k] for k in refs.files if k.startswith("full/")}
    probe = np.random.default_rng(8).standard_normal(3072).astype(np.float32)
    got = {}
    for key, layer in lora.layers.items():
        mod = by_init[lora.targets[key]]
        got[mod] = (np.asarray(layer.up, np.float64) @ (np.asarray(layer.down, np.float64) @ probe) * (
            layer.alpha / layer.rank))[::16]  # the rows the reference keeps
    assert set(got) == set(want) and len(got) == 8
    for k, ref in want.items():
        np.testing.assert_allclose(got[k], ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()), err_msg=k)


def test_sd1_lora_on_flux_is_one_error_naming_it(pipe):
    with pytest.raises(SdrtError, match=r"lora_kohya.safetensors looks like a LoRA for SD 1.x/2.x, and 40 of its 40 layers do not fit this Flux.1") as e:
        pipe.set_loras([(ROOT / "ckpt" / "sd1" / "lora_kohya.safetensors", 1.0)])
    assert "\n" not in str(e.value)


def test_flux_lora_reaches_the_transformer_session_and_unapplies_bit_for_bit(pipe):
    """The merged weights are what the transformer runs with (they were merged, then never bound: a Flux LoRA left
    the image unchanged), diffusers' change on top of the base; removing the LoRA gives the image before, bit for bit."""
    kw = dict(steps=2, seed=1, width=64, height=64)
    before = np.asarray(pipe("a fox", **kw)[0], np.int16)
    pipe.set_loras([(D / "flux_kohya.safetensors", SCALE)])
    part = pipe.parts["transformer"]
    bound = part.weights_factory()
    graph = part.graph
    refs = np.load(D / "flux_lora_refs.npz")
    pmap = param_map(graph)
    for k in (k for k in refs.files if k.startswith("flux_kohya/")):
        slot = pmap[k.split("/", 1)[1]]
        base = np.asarray(graph.initializer_arrays([slot.init])[slot.init], np.float32)
        delta = refs[k].T if slot.layout == "T" else refs[k]
        np.testing.assert_allclose(np.asarray(bound[slot.init], np.float32), base + delta, atol=2e-5 * max(
            1.0, float(np.abs(delta).max())), err_msg=k)
    with_lora = np.asarray(pipe("a fox", **kw)[0], np.int16)
    assert np.abs(with_lora - before).mean() > 1.0
    pipe.set_loras([])
    assert np.array_equal(np.asarray(pipe("a fox", **kw)[0], np.int16), before)


@pytest.mark.parametrize("keys", [
    # Black Forest Labs' names (flux1-canny-dev-lora): a wider img_in, biases, whole QK norms
    {"img_in.lora_A.weight": (4, 128), "img_in.lora_B.weight": (24, 4), "img_in.lora_B.bias": (24,),
     "double_blocks.0.img_attn.norm.query_norm.scale": (8,), "double_blocks.0.img_attn.qkv.lora_A.weight": (4, 24),
     "double_blocks.0.img_attn.qkv.lora_B.weight": (72, 4)},
    # diffusers' conversion of one
    {"transformer.x_embedder.lora_A.weight": (4, 128), "transformer.x_embedder.lora_B.weight": (24, 4)},
    # the norms alone
    {"double_blocks.0.img_attn.norm.key_norm.scale": (8,), "double_blocks.0.img_attn.qkv.lora_A.weight": (4, 24),
     "double_blocks.0.img_attn.qkv.lora_B.weight": (72, 4)},
])
def test_flux_control_lora_on_an_onnx_folder_is_refused_in_one_line(pipe, tmp_path, keys):
    """An ONNX folder's transformer holds its own x_embedder: sdrt does not rewrite it to take the control LoRA's
    128 channels (a single file or diffusers folder does: tests/checkpoint/test_flux_control_lora.py)."""
    from safetensors.numpy import save_file

    save_file({k: np.zeros(s, np.float32) for k, s in keys.items()}, str(tmp_path / "canny.safetensors"))
    with pytest.raises(SdrtError, match=r"canny is a Flux Control LoRA \(Black Forest Labs' FLUX.1 Canny/Depth dev "
                       r"LoRA: .*\); it widens .* ONNX folder's transformer graph holds its own weights.*"
                       r"FLUX.1-Canny-dev") as e:
        pipe.set_loras([(tmp_path / "canny.safetensors", 1.0)])
    assert "\n" not in str(e.value)
    assert not pipe.weights.loras


def test_a_chroma_lora_merges_into_its_approximator_and_blocks(registry, tmp_path):
    """Chroma's transformer has ``distilled_guidance_layer.layers.N`` (the approximator): counting them read the
    word ``layers`` as the index, so every LoRA on Chroma was a ValueError traceback. A kohya file (Black Forest
    Labs' names, as ComfyUI trains Chroma LoRAs) now merges: each layer's change is scale * alpha / rank * up @ down."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    mods = {"distilled_guidance_layer.layers.1.in_layer": "distilled_guidance_layer.layers.1.linear_1",
            "double_blocks.0.img_attn.proj": "transformer_blocks.0.attn.to_out.0"}
    arrays, want = {}, {}
    for bfl, canon in mods.items():
        k = "lora_unet_" + bfl.replace(".", "_")
        down, up = rng.standard_normal((2, 32)).astype(np.float32), rng.standard_normal((32, 2)).astype(np.float32)
        arrays.update({f"{k}.lora_down.weight": down, f"{k}.lora_up.weight": up, f"{k}.alpha": np.array(4.0, np.float32)})
        want[canon] = 0.5 * 4.0 / 2 * (up @ down)
    save_file(arrays, str(tmp_path / "chroma_lora.safetensors"))
    with pipelines.load(ROOT / "pipelines" / "tiny-chroma", backend="reference") as pipe:
        pipe.set_loras([(tmp_path / "chroma_lora.safetensors", 0.5)])
        merged = pipe.weights._merge(pipe.weights.loras)["transformer"]
        graph = pipe.parts["transformer"].graph
        pmap = param_map(graph)
        for canon, delta in want.items():
            slot = pmap[canon + ".weight"]
            base = np.asarray(graph.initializer_arrays([slot.init])[slot.init], np.float32)
            got = np.asarray(merged[slot.init], np.float32) - base
            np.testing.assert_allclose(got.T if slot.layout == "T" else got, delta, atol=1e-5, err_msg=canon)
        # a Flux LoRA on Chroma: Chroma has no per-block modulation (norm1.linear); said in one sentence (it read
        # "flux_peft.safetensors 1 of its 7 layers do not fit", no verb, when the family was not named)
        with pytest.raises(SdrtError, match=r"^flux_peft\.safetensors: 1 of its 7 layers do not fit this Chroma model"):
            pipe.set_loras([(D / "flux_peft.safetensors", 0.5)])
