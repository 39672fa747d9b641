"""LyCORIS LoHa and LoKr files, and the weight change peft's own LoHa/LoKr layers merge from the same factors.

Writes ``tests/data/lora/lycoris_{loha,lokr}.safetensors`` (kohya-style names as LyCORIS saves them:
``lora_unet_fc.hada_w1_a`` ..., ``.alpha``) for a tiny model (``fc``: Linear 48 -> 32, ``conv``: Conv2d 8 -> 16,
3x3), and ``lycoris_refs.npz``: ``<kind>/<module>.weight`` = peft's ``merge_and_unload()`` minus the weight
before, at adapter scale 1 (peft scales by ``alpha / r``; LoKr with ``lokr_w2`` decomposed, where peft and
LyCORIS/ComfyUI agree on that scale). peft's code is the independent implementation.

    /work/refvenv/bin/python scripts/make_lycoris_refs.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from peft import LoHaConfig, LoKrConfig, get_peft_model
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "lora"


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(48, 32)
        self.conv = torch.nn.Conv2d(8, 16, 3)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    refs = {}
    for kind, cfg in (("loha", LoHaConfig(r=4, alpha=2.0, target_modules=["fc", "conv"])),
                      ("lokr", LoKrConfig(r=4, alpha=3.0, target_modules=["fc", "conv"], decompose_factor=4))):
        torch.manual_seed(0)
        model = Tiny()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        pm = get_peft_model(model, cfg)
        g = torch.Generator().manual_seed(1 if kind == "loha" else 2)
        tensors = {}
        for name, param in pm.named_parameters():
            if ".default" not in name and not name.endswith(".default"):
                continue
            with torch.no_grad():
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)
            mod = name.split(".")[-3] if name.endswith(".default") else name.split(".")[-2]
            tensor_name = name.split(".")[-2]
            tensors[f"lora_unet_{mod}.{tensor_name}"] = param.detach().clone().contiguous()
        for mod in ("fc", "conv"):
            tensors[f"lora_unet_{mod}.alpha"] = torch.tensor(cfg.alpha)
        merged = pm.merge_and_unload().state_dict()
        for k in ("fc.weight", "conv.weight"):
            refs[f"{kind}/{k}"] = (merged[k] - before[k]).numpy().astype(np.float32)
            refs[f"base/{k}"] = before[k].numpy().astype(np.float32)
        save_file(tensors, str(OUT / f"lycoris_{kind}.safetensors"))
        print(kind, sorted(tensors), {k: tuple(v.shape) for k, v in tensors.items()})
    np.savez_compressed(OUT / "lycoris_refs.npz", **refs)


if __name__ == "__main__":
    main()
