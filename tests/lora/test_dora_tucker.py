"""DoRA and Tucker-decomposed conv layers against their reference merges.

Data: ``scripts/make_lycoris_refs.py`` (``dora_and_tucker``) on a tiny model (``fc`` Linear 48 -> 32, ``sq`` 24 -> 24,
``ha`` 40 -> 24, ``kr`` 32 -> 64, ``conv``/``conv2`` Conv2d 8 -> 16 3x3, ``conv3`` 16 -> 32 3x3):

- ``lycoris_dora.safetensors``: LyCORIS's own modules (lycoris-lora 4.1.3), kohya names with ``dora_scale``: LoCon
  on ``fc`` (norm per output row, LyCORIS's default ``wd_on_out``) and on ``sq`` (per input column), Tucker LoCon
  on ``conv``, LoHa on ``ha``, LoKr on ``kr``; reference: LyCORIS's ``get_merged_weight(multiplier=1)``;
- ``lycoris_tucker.safetensors``: Tucker conv factors: LyCORIS's ``lora_mid`` (``conv``), peft's LoHa
  ``hada_t1``/``hada_t2`` (``conv2``) and LoKr ``lokr_t2`` (``conv3``) with ``use_effective_conv2d=True``;
  references: LyCORIS's merge and peft's ``merge_and_unload()``;
- ``peft_dora.safetensors``: peft's ``LoraConfig(use_dora=True)`` (``lora_magnitude_vector``, lora_alpha 8 at rank
  4 kept outside the file); reference: ``merge_and_unload()`` at adapter scale 1 and 0.5.

Tolerance: float32 (the merged weights are of order 1; 2e-6 absolute is a few ulps after the norms).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import WeightsError
from sdrt.lora import Dora, Lora, merge
from sdrt.weights import Weights

D = Path(__file__).resolve().parents[1] / "data" / "lora"
ATOL = 2e-6


@pytest.fixture(scope="module")
def refs():
    return np.load(D / "dora_tucker_refs.npz")


def _base(refs, mods):
    return {f"{m}.weight": refs[f"wide/{m}.weight"] for m in mods}


def _check(merged, refs, prefix, mods, tol=ATOL):
    for m in mods:
        want = refs[f"{prefix}/{m}.weight"]
        np.testing.assert_allclose(np.asarray(merged[f"{m}.weight"]), want, rtol=0, atol=tol * max(
            1.0, float(np.abs(want).max())), err_msg=m)


def test_lycoris_dora_matches_lycoris_merge(refs):
    mods = ("fc", "sq", "conv", "ha", "kr")
    lora = Lora.open(D / "lycoris_dora.safetensors")
    assert {k: lora.layers[f"lora_unet_{k}"].dora.convention for k in mods} == dict.fromkeys(mods, "lycoris")
    assert lora.layers["lora_unet_conv"].mid is not None
    base = _base(refs, mods)
    merged = merge(Weights.from_arrays(base), [(lora, 1.0)])
    _check(merged, refs, "lycoris_dora", mods)
    back = merged.unmerge()
    for k, b in base.items():
        assert np.asarray(back[k]).tobytes() == b.tobytes()


def test_lycoris_dora_strength_moves_linearly_from_the_base(refs):
    """The LyCORIS convention at strength s (ComfyUI's and A1111's): W + s * (merged at 1 - W); 0 keeps W."""
    mods = ("fc", "sq", "conv", "ha", "kr")
    base = _base(refs, mods)
    lora = Lora.open(D / "lycoris_dora.safetensors")
    for s in (0.6, 0.0):
        merged = merge(Weights.from_arrays(base), [(lora, s)])
        for m in mods:
            w = base[f"{m}.weight"]
            want = w + np.float32(s) * (refs[f"lycoris_dora/{m}.weight"] - w)
            np.testing.assert_allclose(np.asarray(merged[f"{m}.weight"]), want, rtol=0, atol=4 * ATOL, err_msg=m)


def test_lycoris_dora_on_a_transposed_matmul_weight(refs):
    """A weight stored [in, out] (ONNX MatMul): the norm is still per output row of torch's layout."""
    base = refs["wide/fc.weight"]
    lora = Lora.open(D / "lycoris_dora.safetensors")
    sub = Lora({"lora_unet_fc": lora.layers["lora_unet_fc"]}, lora.format)
    merged = merge(Weights.from_arrays({"fc.weight": np.ascontiguousarray(base.T)}), [(sub, 1.0)])
    np.testing.assert_allclose(np.asarray(merged["fc.weight"]).T, refs["lycoris_dora/fc.weight"], atol=ATOL)


def test_tucker_conv_factors_match_lycoris_and_peft(refs):
    mods = ("conv", "conv2", "conv3")
    lora = Lora.open(D / "lycoris_tucker.safetensors")
    assert lora.format == "lycoris" and sorted(lora.layers) == [f"lora_unet_{m}" for m in mods]
    base = _base(refs, mods)
    merged = merge(Weights.from_arrays(base), [(lora, 1.0)])
    _check(merged, refs, "lycoris_tucker", mods)
    half = merge(Weights.from_arrays(base), [(lora, 0.5)])
    for m in mods:
        w = base[f"{m}.weight"]
        np.testing.assert_allclose(np.asarray(half[f"{m}.weight"]) - w, 0.5 * (refs[f"lycoris_tucker/{m}.weight"] - w),
                                   atol=ATOL, err_msg=m)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_peft_dora_matches_peft_merge(refs, scale):
    lora = Lora.open(D / "peft_dora.safetensors", alpha=8.0)
    assert {layer.dora.convention for layer in lora.layers.values()} == {"peft"}
    base = _base(refs, ("fc", "conv"))
    merged = merge(Weights.from_arrays(base), [(lora, scale)])
    _check(merged, refs, f"peft_dora@{scale}", ("fc", "conv"))


def test_dora_magnitude_axis_by_convention():
    m_out, m_in = np.ones((4, 1), np.float32), np.ones((1, 6), np.float32)
    assert Dora(m_out, "lycoris").axis(4, 6) == "out"
    assert Dora(m_in, "lycoris").axis(4, 6) == "in"
    assert Dora(np.ones((1, 4, 1, 1)), "peft").axis(4, 6) == "out"  # peft's conv magnitude
    assert Dora(np.ones(5), "lycoris").axis(4, 6) is None


def test_bad_dora_files_are_one_error():
    down, up = np.ones((2, 6), np.float32), np.ones((4, 2), np.float32)
    with pytest.raises(WeightsError, match="a DoRA magnitude without a LoRA") as e:
        Lora.from_arrays({"lora_unet_a.lora_down.weight": down, "lora_unet_a.lora_up.weight": up,
                          "lora_unet_b.dora_scale": np.ones((4, 1), np.float32)})
    assert "\n" not in str(e.value)
    with pytest.raises(WeightsError, match="expected one finite vector"):
        Lora.from_arrays({"lora_unet_a.lora_down.weight": down, "lora_unet_a.lora_up.weight": up,
                          "lora_unet_a.dora_scale": np.full((4, 1), np.nan, np.float32)})
    lora = Lora.from_arrays({"lora_unet_a.lora_down.weight": down, "lora_unet_a.lora_up.weight": up,
                             "lora_unet_a.dora_scale": np.ones((5, 1), np.float32)})
    with pytest.raises(WeightsError, match=r"DoRA magnitude \[5, 1\] fits neither the output \(4\) nor the input \(6\)"):
        merge(Weights.from_arrays({"a.weight": np.ones((4, 6), np.float32)}), lora)
    with pytest.raises(WeightsError, match="Tucker lora_mid"):
        Lora.from_arrays({"m.lora_down.weight": np.ones((2, 6, 1, 1), np.float32),
                          "m.lora_up.weight": np.ones((4, 2, 1, 1), np.float32),
                          "m.lora_mid.weight": np.ones((3, 2, 3, 3), np.float32)})


def _sd15_dora_file(path: Path, graph) -> dict[str, str]:
    """A kohya DoRA + Tucker LoRA for tiny-sd15's UNet, written with numpy: DoRA on two square attention weights
    (stored [in, out] in the graph; magnitude per output row and per input column), Tucker LoCon with DoRA on a 3x3
    conv, Tucker LoHa on another. Returns ``{kohya module: diffusers module}``."""
    from safetensors.numpy import save_file

    from sdrt.checkpoint import param_map

    pmap = param_map(graph)
    rng = np.random.default_rng(7)
    mods = {"lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q":
            "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q",
            "lora_unet_mid_block_attentions_0_transformer_blocks_0_attn1_to_q":
            "mid_block.attentions.0.transformer_blocks.0.attn1.to_q",
            "lora_unet_down_blocks_1_resnets_0_conv2": "down_blocks.1.resnets.0.conv2",
            "lora_unet_mid_block_resnets_0_conv1": "mid_block.resnets.0.conv1"}
    t: dict[str, np.ndarray] = {}

    def f(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    for i, (k, m) in enumerate(mods.items()):
        slot = pmap[m + ".weight"]
        o, n = (slot.shape[1], slot.shape[0]) if slot.layout == "T" else slot.shape[:2]
        t[f"{k}.alpha"] = np.array(2.0, np.float32)
        if i < 2:
            t[f"{k}.lora_down.weight"], t[f"{k}.lora_up.weight"] = f(2, n), f(o, 2)
            t[f"{k}.dora_scale"] = np.abs(f(o, 1) + 1) if i == 0 else np.abs(f(1, n) + 1)
        elif i == 2:
            t[f"{k}.lora_down.weight"], t[f"{k}.lora_up.weight"] = f(2, n, 1, 1), f(o, 2, 1, 1)
            t[f"{k}.lora_mid.weight"], t[f"{k}.dora_scale"] = f(2, 2, 3, 3), np.abs(f(o, 1, 1, 1) + 1)
        else:
            for h in ("1", "2"):
                t[f"{k}.hada_w{h}_a"], t[f"{k}.hada_w{h}_b"], t[f"{k}.hada_t{h}"] = f(2, o), f(2, n), f(2, 2, 3, 3)
    save_file(t, str(path))
    return mods


def test_dora_and_tucker_lora_in_the_sd15_pipeline_change_the_image_and_unapply_bit_for_bit(registry, tmp_path):
    """With a kohya DoRA + Tucker file and a PEFT DoRA file (diffusers' ``unet.`` names) set, the pipeline binds
    what ``merge`` makes of the torch-layout weights (the square attention weights are stored transposed), the image
    changes, and removing the LoRAs gives the image before, bit for bit."""
    from sdrt import pipelines
    from sdrt.checkpoint import param_map

    with pipelines.load(D.parent / "pipelines" / "tiny-sd15", backend="reference") as pipe:
        kw = dict(steps=2, seed=1, width=64, height=64)
        before = np.asarray(pipe("a fox", **kw)[0], np.int16)
        graph = pipe.parts["unet"].graph
        mods = _sd15_dora_file(tmp_path / "dora.safetensors", graph)
        # a PEFT DoRA file (diffusers' names, lora_magnitude_vector) on another attention weight, merged after
        from safetensors.numpy import save_file

        rng = np.random.default_rng(8)
        peft_mod = "mid_block.attentions.0.transformer_blocks.0.attn2.to_q"
        save_file({f"unet.{peft_mod}.lora_A.weight": rng.standard_normal((2, 16)).astype(np.float32) * 0.3,
                   f"unet.{peft_mod}.lora_B.weight": rng.standard_normal((16, 2)).astype(np.float32) * 0.3,
                   f"unet.{peft_mod}.lora_magnitude_vector": np.abs(rng.standard_normal(16).astype(np.float32) + 1)},
                  str(tmp_path / "peft_dora.safetensors"))
        mods[f"unet.{peft_mod}"] = peft_mod
        pipe.set_loras([(tmp_path / "dora.safetensors", 0.8), (tmp_path / "peft_dora.safetensors", 0.5)])
        bound = pipe.parts["unet"].weights_factory()
        pmap = param_map(graph)
        slots = {m: pmap[m + ".weight"] for m in mods.values()}
        base = graph.initializer_arrays([s.init for s in slots.values()])
        torch_layout = {f"{m}.weight": (base[s.init].T if s.layout == "T" else base[s.init]) for m, s in slots.items()}
        lora = Lora.open(tmp_path / "dora.safetensors")
        assert sum(layer.dora is not None for layer in lora.layers.values()) == 3
        peft = Lora.open(tmp_path / "peft_dora.safetensors")
        want = merge(Weights.from_arrays(torch_layout), [(lora, 0.8), (peft, 0.5)],
                     targets={k: f"{m}.weight" for k, m in mods.items()})
        for m, s in slots.items():
            got = np.asarray(bound[s.init], np.float32)
            np.testing.assert_allclose(got.T if s.layout == "T" else got, want[f"{m}.weight"], atol=1e-6, err_msg=m)
        with_lora = np.asarray(pipe("a fox", **kw)[0], np.int16)
        assert np.abs(with_lora - before).mean() > 1.0
        pipe.set_loras([])
        assert np.array_equal(np.asarray(pipe("a fox", **kw)[0], np.int16), before)


def test_dora_on_a_fused_flux_qkv_splits_by_rows(registry, tmp_path):
    """Kohya's Flux names fuse q, k, v (``img_attn_qkv``); a magnitude per output row splits with the rows, so the
    three merged weights are the fused weight's DoRA merge, cut in three. A magnitude per input column spans all
    three and is refused in one line."""
    from safetensors.numpy import save_file

    from sdrt import pipelines
    from sdrt.checkpoint import param_map
    from sdrt.errors import SdrtError

    rng = np.random.default_rng(3)
    with pipelines.load(D.parent / "pipelines" / "tiny-flux-dev", backend="reference") as pipe:
        graph = pipe.parts["transformer"].graph
        pmap = param_map(graph)
        names = [f"transformer_blocks.0.attn.to_{n}.weight" for n in "qkv"]
        base = graph.initializer_arrays([pmap[n].init for n in names])
        parts = [base[pmap[n].init].T if pmap[n].layout == "T" else base[pmap[n].init] for n in names]
        fused_w = np.concatenate(parts).astype(np.float32)
        o, i = fused_w.shape
        k = "lora_unet_double_blocks_0_img_attn_qkv"
        t = {f"{k}.lora_down.weight": rng.standard_normal((2, i)).astype(np.float32) * 0.3,
             f"{k}.lora_up.weight": rng.standard_normal((o, 2)).astype(np.float32) * 0.3,
             f"{k}.alpha": np.array(1.0, np.float32),
             f"{k}.dora_scale": np.abs(rng.standard_normal((o, 1)).astype(np.float32) + 1)}
        save_file(t, str(tmp_path / "qkv.safetensors"))
        lora = Lora.open(tmp_path / "qkv.safetensors")
        want = lora.layers[k].dora.apply(fused_w, lora.layers[k].delta(1.0), 0.7)
        pipe.set_loras([(tmp_path / "qkv.safetensors", 0.7)])
        merged = pipe.weights._merge(pipe.weights.loras)["transformer"]
        for j, n in enumerate(names):
            got = np.asarray(merged[pmap[n].init], np.float32)
            got = got.T if pmap[n].layout == "T" else got
            np.testing.assert_allclose(got, want[j * (o // 3):(j + 1) * (o // 3)], atol=1e-6, err_msg=n)
        pipe.set_loras([])
        t[f"{k}.dora_scale"] = np.ones((1, i), np.float32)
        save_file(t, str(tmp_path / "qkv_in.safetensors"))
        with pytest.raises(SdrtError, match="per input column of a fused weight") as e:
            pipe.set_loras([(tmp_path / "qkv_in.safetensors", 1.0)])
        assert "\n" not in str(e.value)
