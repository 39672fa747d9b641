"""LyCORIS LoHa and LoKr layers against peft's own LoHa/LoKr merge of the same factors.

Data: ``scripts/make_lycoris_refs.py`` (a Linear 48 -> 32 and a 3x3 Conv2d 8 -> 16, peft ``merge_and_unload``).
LoKr with both factors whole (the conv here) is scaled 1, as LyCORIS (which then writes alpha = rank) and
ComfyUI apply it; peft scales it alpha / r, so its reference is taken back by that factor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import WeightsError
from sdrt.lora import Lora, merge
from sdrt.weights import Weights

D = Path(__file__).resolve().parents[1] / "data" / "lora"


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_lycoris_merge_matches_peft(kind):
    refs = np.load(D / "lycoris_refs.npz")
    base = {k: refs[f"base/{k}"] for k in ("fc.weight", "conv.weight")}
    lora = Lora.open(D / f"lycoris_{kind}.safetensors")
    assert lora.format == "lycoris" and len(lora.layers) == 2
    merged = merge(Weights.from_arrays(base), [(lora, 1.0)])
    for k, b in base.items():
        want = refs[f"{kind}/{k}"]
        if kind == "lokr" and k == "conv.weight":
            want = want / 0.75  # peft: alpha / r = 3 / 4; LyCORIS and ComfyUI: 1 for whole factors
        np.testing.assert_allclose(np.asarray(merged[k]) - b, want, atol=1e-5, err_msg=k)
    back = merged.unmerge()
    for k, b in base.items():
        assert np.asarray(back[k]).tobytes() == b.tobytes()


def test_lycoris_with_missing_or_half_tucker_factors_is_one_error():
    arrays = {"lora_unet_fc.hada_w1_a": np.ones((32, 4), np.float32), "lora_unet_fc.hada_w1_b": np.ones((4, 48), np.float32),
              "lora_unet_fc.hada_w2_a": np.ones((32, 4), np.float32)}
    with pytest.raises(WeightsError, match="lora_unet_fc .loha: has .*needs") as e:
        Lora.from_arrays(arrays)
    assert "\n" not in str(e.value)
    arrays["lora_unet_fc.hada_w2_b"] = np.ones((4, 48), np.float32)
    arrays["lora_unet_fc.hada_t1"] = np.ones((4, 4, 3, 3), np.float32)
    with pytest.raises(WeightsError, match="needs hada_t1, hada_t2, hada_w1_a"):  # hada_t2 is missing
        Lora.from_arrays(arrays)
    arrays["lora_unet_fc.hada_t2"] = np.ones((4, 4, 3, 3), np.float32)
    with pytest.raises(WeightsError, match="Tucker factors hada_t1"):  # [r, out] / [r, in] beside a core
        Lora.from_arrays(arrays)
    with pytest.raises(WeightsError, match="do not make one"):
        Lora.from_arrays({"m.hada_w1_a": np.ones((32, 4), np.float32), "m.hada_w1_b": np.ones((3, 48), np.float32),
                          "m.hada_w2_a": np.ones((32, 4), np.float32), "m.hada_w2_b": np.ones((4, 48), np.float32)})


@pytest.mark.parametrize(("name", "what"), [("ckpt/sd1/ldm.safetensors", "SD 1.x"),
                                            ("ckpt/sd1/emb.safetensors", "textual-inversion embedding")])
def test_a_checkpoint_or_embedding_given_as_a_lora_says_what_it_is(name, what):
    with pytest.raises(WeightsError, match=f"is not a LoRA: it looks like {what}") as e:
        Lora.open(D.parent / name)
    assert "\n" not in str(e.value)


def test_a_peft_lora_given_as_the_model_says_it_is_a_lora():
    from sdrt.checkpoint import open_single_file

    with pytest.raises(Exception, match=r"looks like LoRA .not a checkpoint: pass it with pipe\.set_loras") as e:
        open_single_file(D / "flux_peft.safetensors")
    assert "--lora" not in str(e.value)  # the API's words only
