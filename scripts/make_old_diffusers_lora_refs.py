"""An SD 1.x LoRA in diffusers' older (2023) format, and what diffusers' ``load_lora_weights`` + ``fuse_lora`` does.

diffusers' attention-processor LoRAs (``pytorch_lora_weights.safetensors`` from its 2023 training scripts):
UNet keys ``unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.processor.to_q_lora.down.weight`` (the first
such files had no ``unet.`` prefix; diffusers 0.42 no longer reads those, the test checks sdrt reads both alike)
(``to_out_lora`` is ``to_out.0``), text-encoder keys ``text_encoder.text_model.encoder.layers.0.self_attn.to_k_lora.
up.weight`` and ``...mlp.fc1.lora_linear_layer.down.weight``; no alpha. Written for the tiny SD 1.x parts of
tests/data/ckpt/sd1 (``gen_checkpoint_data.py``'s ``make_unet()`` and ``make_te("l")``) as
``tests/data/lora/sd1_old_diffusers.safetensors``; ``sd1_old_diffusers_refs.npz``: every parameter diffusers'
``fuse_lora(lora_scale=0.8)`` changes, ``<part>/<name>`` (float32, torch layout).

    PYTHONPATH=scripts/_tvblock:scripts /work/refvenv/bin/python scripts/make_old_diffusers_lora_refs.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from diffusers import StableDiffusionPipeline
from gen_checkpoint_data import fused_deltas, make_te, make_unet
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "lora"
SCALE = 0.8


def main() -> None:
    unet, te = make_unet(0), make_te("l", 0)
    g = torch.Generator().manual_seed(5)
    lora = {}

    def add(prefix: str, out_f: int, in_f: int) -> None:
        lora[f"{prefix}.down.weight"] = (torch.randn(4, in_f, generator=g) * 0.5).half()
        lora[f"{prefix}.up.weight"] = (torch.randn(out_f, 4, generator=g) * 0.5).half()

    usd, tsd = unet.state_dict(), te.state_dict()
    for blk in ("down_blocks.0.attentions.0.transformer_blocks.0", "up_blocks.1.attentions.1.transformer_blocks.0"):
        for attn in ("attn1", "attn2"):
            for which, mod in (("to_q", "to_q"), ("to_k", "to_k"), ("to_v", "to_v"), ("to_out", "to_out.0")):
                w = usd[f"{blk}.{attn}.{mod}.weight"]
                add(f"unet.{blk}.{attn}.processor.{which}_lora", w.shape[0], w.shape[1])
    for which, mod in (("to_q", "q_proj"), ("to_out", "out_proj")):
        w = tsd[f"encoder.layers.0.self_attn.{mod}.weight"]
        add(f"text_encoder.text_model.encoder.layers.0.self_attn.{which}_lora", w.shape[0], w.shape[1])
    w = tsd["encoder.layers.1.mlp.fc1.weight"]
    add("text_encoder.text_model.encoder.layers.1.mlp.fc1.lora_linear_layer", w.shape[0], w.shape[1])
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(lora, str(OUT / "sd1_old_diffusers.safetensors"))

    pipe = StableDiffusionPipeline(vae=None, text_encoder=te, tokenizer=None, unet=unet, scheduler=None,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    refs = fused_deltas(pipe, {"unet": unet, "text_encoder": te}, OUT / "sd1_old_diffusers.safetensors", SCALE)
    print(f"{len(refs)} parameters changed:", sorted(refs))
    np.savez_compressed(OUT / "sd1_old_diffusers_refs.npz", **refs)


if __name__ == "__main__":
    main()
