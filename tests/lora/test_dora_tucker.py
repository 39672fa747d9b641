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
