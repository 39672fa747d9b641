"""An SDXL LoRA as kohya's sd-scripts saves it (LDM UNet names, ``lora_te1_``/``lora_te2_``), against diffusers.

Data: ``scripts/make_sdxl_lora_refs.py``: diffusers' ``load_lora_weights`` + ``fuse_lora(lora_scale=0.8)`` on the
tiny SDXL parts of tests/data/ckpt/sdxl. diffusers 0.42 drops kohya's text-encoder attention layers (it renames
them ``to_q_lora`` and applies them nowhere), so those two are checked against kohya's formula
``scale * alpha / rank * up @ down`` instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from lora_helpers import DATA, merged_parts

from sdrt.checkpoint import param_map
from sdrt.graph import Graph
from sdrt.lora import Lora, merge
from sdrt.pipelines.weights import _route, _targets

SCALE = 0.8


def test_sdxl_kohya_lora_matches_diffusers_fuse_lora():
    lora = Lora.open(DATA / "lora" / "sdxl_kohya.safetensors")
    refs = np.load(DATA / "lora" / "sdxl_lora_refs.npz")
    want = {k: refs[k] for k in refs.files}
    parts = merged_parts(lora, "sdxl", SCALE)
    assert sorted(parts) == ["text_encoder", "text_encoder_2", "unet"]
    got = {k: d for part in parts.values() for k, d in part.deltas.items()}
    kohya = {}
    for name, part in parts.items():
        for key, init in part.targets.items():
            canon = part.by_init[init][0].removeprefix("text_model.")
            kohya[f"{name}/{canon}"] = part.layers[key].delta(SCALE)
    want = {k.replace("/text_model.", "/"): v for k, v in want.items()}
    assert len(got) == 10 and set(want) <= set(got)
    for k, v in got.items():
        ref = want.get(k)
        if ref is None:  # the text-encoder attention layers diffusers drops
            assert "self_attn" in k
            ref = kohya[k]
        np.testing.assert_allclose(v, ref.reshape(v.shape), atol=2e-5 * max(1.0, float(np.abs(ref).max())), err_msg=k)


def test_sdxl_lora_on_sd1_says_what_it_is(registry):
    import pytest

    from sdrt import pipelines
    from sdrt.errors import SdrtError

    with pipelines.load(DATA / "pipelines" / "tiny-sd15", backend="reference") as pipe:
        with pytest.raises(SdrtError, match=r"for no part of this SD 1.x model \(the file looks like a LoRA for SDXL\)"):
            pipe.set_loras([(DATA / "lora" / "sdxl_kohya.safetensors", 1.0)])


def test_lora_family_from_key_names():
    from sdrt.pipelines.weights import lora_family

    assert lora_family(["lora_unet_double_blocks_0_img_attn_qkv"]) == "Flux.1 / Chroma"
    assert lora_family(["transformer.transformer_blocks.5.attn.add_q_proj"]) == "SD 3.x / Flux.1"
    assert lora_family(["lora_unet_joint_blocks_0_x_block_attn_qkv"]) == "SD 3.x"
    assert lora_family(["unet.down_blocks.1.attentions.0.transformer_blocks.1.attn1.to_q"]) == "SDXL"
    assert lora_family(["lora_te1_text_model_encoder_layers_0_mlp_fc1"]) == "SDXL"
    assert lora_family(["lora_unet_down_blocks_0_attentions_0_proj_in", "lora_te_text_model_encoder_layers_0_mlp_fc1"]) \
        == "SD 1.x/2.x"
    assert lora_family(["something"]) is None
    # attention-only MMDiT LoRAs in diffusers' names: an SDXL UNet's transformer_blocks sit in down/mid/up blocks
    attn = [f"transformer.transformer_blocks.{b}.attn.to_{n}" for b in (0, 1) for n in "qkv"]
    assert lora_family(attn) == "SD 3.x / Flux.1"  # the names do not say which
    assert lora_family([*attn, "transformer.transformer_blocks.23.attn.to_q"]) == "SD 3.x"  # Flux.1 has 19
    assert lora_family([*attn, "transformer.transformer_blocks.0.attn2.to_q"]) == "SD 3.x"  # 3.5 Medium
    assert lora_family(["lora_transformer_transformer_blocks_20_attn_to_q"]) == "SD 3.x"
    assert lora_family([*attn, "transformer.x_embedder"]) == "Flux.1 / Chroma"


def test_sd3_attention_only_lora_on_sd1_and_sdxl_says_sd3(registry, tmp_path):
    from safetensors.numpy import save_file

    from sdrt import pipelines
    from sdrt.errors import SdrtError

    t = {}
    for b in (0, 12, 23):
        for n in ("to_q", "to_k", "to_v", "to_out.0"):
            t[f"transformer.transformer_blocks.{b}.attn.{n}.lora_A.weight"] = np.ones((2, 1536), np.float32)
            t[f"transformer.transformer_blocks.{b}.attn.{n}.lora_B.weight"] = np.ones((1536, 2), np.float32)
    save_file(t, str(tmp_path / "sd3_attn.safetensors"))
    for folder, label in (("tiny-sd15", "SD 1.x"), ("tiny-sdxl", "SDXL")):
        with pipelines.load(DATA / "pipelines" / folder, backend="reference") as pipe:
            with pytest.raises(SdrtError, match=rf"sd3_attn.safetensors looks like a LoRA for SD 3.x, and 12 of its "
                               rf"12 layers do not fit this {label} model") as e:
                pipe.set_loras([(tmp_path / "sd3_attn.safetensors", 1.0)])
            assert "\n" not in str(e.value)


def test_comfyui_dotted_ldm_unet_names_equal_kohya():
    """ComfyUI's saved SDXL LoRAs name UNet modules the LDM way, dotted, under ``diffusion_model.``: the same
    weights as kohya's flattened names."""
    from sdrt.checkpoint.ldm import unet_ldm_layout, unet_to_ldm

    graph = Graph.load(DATA / "ckpt" / "sdxl" / "unet" / "model.onnx")
    pmap = param_map(graph)
    lpb, attn_up = unet_ldm_layout(pmap)
    rng = np.random.default_rng(1)
    kohya, comfy = {}, {}
    for mod in ("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k", "mid_block.attentions.0.proj_in"):
        w = pmap[mod + ".weight"]
        o, i = (w.shape[1], w.shape[0]) if w.layout == "T" else w.shape
        down, up = rng.standard_normal((2, i)).astype(np.float32), rng.standard_normal((o, 2)).astype(np.float32)
        ldm = unet_to_ldm(mod, lpb, attn_up)
        kohya.update({f"lora_unet_{ldm.replace('.', '_')}.lora_down.weight": down,
                      f"lora_unet_{ldm.replace('.', '_')}.lora_up.weight": up})
        comfy.update({f"diffusion_model.{ldm}.lora_down.weight": down, f"diffusion_model.{ldm}.lora_up.weight": up})
    a, b = Lora.from_arrays(kohya), Lora.from_arrays(comfy)
    assert {_route(k) for k in b.layers} == {"unet"}
    ta, tb = _targets(graph, a.layers, "unet"), _targets(graph, b.layers, "unet")
    assert len(ta) == len(tb) == 2
    ma = merge(graph, [(a, 1.0)], graph=graph, targets=ta)
    mb = merge(graph, [(b, 1.0)], graph=graph, targets=tb)
    assert set(ma.originals) == set(mb.originals)
    for name in ma.originals:
        np.testing.assert_array_equal(ma[name], mb[name])
