"""An SDXL LoRA as kohya's sd-scripts saves it, and what diffusers' ``load_lora_weights`` + ``fuse_lora`` does with it.

Writes ``tests/data/lora/sdxl_kohya.safetensors`` for the tiny SDXL parts of ``tests/data/ckpt/sdxl``
(``gen_checkpoint_data.py``'s ``make_unet(sdxl=True)``, CLIP-L-like ``make_te("l")`` and the projected
``make_te("h")``): UNet modules in LDM names (``lora_unet_input_blocks_1_1_transformer_blocks_0_attn2_to_k``,
``lora_unet_output_blocks_1_0_conv1`` a 3x3 LoCon conv, ``lora_unet_middle_block_1_proj_in``), ``lora_te1_`` and
``lora_te2_`` text-encoder modules; fp16 factors, alpha 2, rank 4. ``sdxl_lora_refs.npz``: each part's parameter
change under ``<part>/<diffusers name>`` after ``StableDiffusionXLPipeline.load_lora_weights`` and
``fuse_lora(lora_scale=0.8)`` (diffusers maps the LDM names back with its own converter). diffusers 0.42 with
transformers 5 renames kohya's text-encoder attention layers to ``self_attn.to_q_lora`` and then applies them
nowhere (the two attention layers here do not change), so the test checks those two against kohya's formula.

    PYTHONPATH=scripts/_tvblock:scripts /work/refvenv/bin/python scripts/make_sdxl_lora_refs.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from diffusers import StableDiffusionXLPipeline
from gen_checkpoint_data import fused_deltas, make_te, make_unet, unet_to_ldm
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "lora"
SCALE = 0.8
UNET = ("down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k", "down_blocks.1.attentions.0.proj_in",
        "mid_block.attentions.0.transformer_blocks.0.ff.net.2", "up_blocks.0.resnets.0.conv1",
        "up_blocks.1.attentions.0.transformer_blocks.0.attn1.to_out.0", "mid_block.attentions.0.proj_in")
TE1 = ("text_model.encoder.layers.0.self_attn.q_proj", "text_model.encoder.layers.1.mlp.fc1")
TE2 = ("text_model.encoder.layers.0.self_attn.v_proj", "text_model.encoder.layers.1.mlp.fc2")


def main() -> None:
    unet, te1, te2 = make_unet(0, sdxl=True), make_te("l", 0), make_te("h", 0, projection=True)
    g = torch.Generator().manual_seed(3)
    lora = {}

    def add(kohya: str, w: torch.Tensor) -> None:
        conv = w.ndim == 4
        down = torch.randn(4, w.shape[1], *(w.shape[2:] if conv else ()), generator=g) * 0.5
        up = torch.randn(w.shape[0], 4, *((1, 1) if conv else ()), generator=g) * 0.5
        lora.update({f"{kohya}.lora_down.weight": down.half(), f"{kohya}.lora_up.weight": up.half(),
                     f"{kohya}.alpha": torch.tensor(2.0).half()})

    usd = unet.state_dict()
    for mod in UNET:
        (ldm,) = unet_to_ldm({mod + ".weight": None}, [True, True])
        add("lora_unet_" + ldm.removeprefix("model.diffusion_model.").removesuffix(".weight").replace(".", "_"),
            usd[mod + ".weight"])
    for prefix, te, mods in (("lora_te1_", te1, TE1), ("lora_te2_", te2, TE2)):
        sd = te.state_dict()
        for mod in mods:
            w = sd.get(mod + ".weight", sd.get(mod.removeprefix("text_model.") + ".weight"))  # transformers 5: no text_model.
            add(prefix + mod.replace(".", "_"), w)
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(lora, str(OUT / "sdxl_kohya.safetensors"))

    pipe = StableDiffusionXLPipeline(vae=None, text_encoder=te1, text_encoder_2=te2, tokenizer=None, tokenizer_2=None,
                                     unet=unet, scheduler=None)
    refs = fused_deltas(pipe, {"unet": unet, "text_encoder": te1, "text_encoder_2": te2},
                        OUT / "sdxl_kohya.safetensors", SCALE)
    print(f"{len(refs)} parameters changed:", sorted(refs))
    np.savez_compressed(OUT / "sdxl_lora_refs.npz", **refs)


if __name__ == "__main__":
    main()
