"""diffusers' older LoRA files (attention processors: ``attn1.processor.to_q_lora.down.weight``, text encoder
``self_attn.to_q_lora`` and ``mlp.fc1.lora_linear_layer``) against diffusers' ``load_lora_weights`` + ``fuse_lora``.

Data: ``scripts/make_old_diffusers_lora_refs.py`` on the tiny SD 1.x parts of tests/data/ckpt/sd1.
"""

from __future__ import annotations

import numpy as np
from lora_helpers import DATA, merged_parts

from sdrt.lora import Lora
from sdrt.weights import Weights

SCALE = 0.8


def _deltas(lora: Lora) -> dict[str, np.ndarray]:
    return {k: d for part in merged_parts(lora, "sd1", SCALE).values() for k, d in part.deltas.items()}


def test_old_diffusers_lora_matches_diffusers_fuse_lora():
    lora = Lora.open(DATA / "lora" / "sd1_old_diffusers.safetensors")
    refs = np.load(DATA / "lora" / "sd1_old_diffusers_refs.npz")
    want = {k.replace("/text_model.", "/"): refs[k] for k in refs.files}
    got = _deltas(lora)
    assert set(got) == set(want) and len(got) == 19
    for k, ref in want.items():
        np.testing.assert_allclose(got[k], ref, atol=2e-5 * max(1.0, float(np.abs(ref).max())), err_msg=k)
    # the first such files had no unet. prefix: the same layers
    bare = Lora.from_arrays({k.removeprefix("unet."): v for k, v in Weights.open(lora.source).items()})
    for k, v in _deltas(bare).items():
        np.testing.assert_array_equal(v, got[k])
