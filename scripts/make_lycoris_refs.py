"""LyCORIS LoHa and LoKr files, and the weight change peft's own LoHa/LoKr layers merge from the same factors.

Writes ``tests/data/lora/lycoris_{loha,lokr}.safetensors`` (kohya-style names as LyCORIS saves them:
``lora_unet_fc.hada_w1_a`` ..., ``.alpha``) for a tiny model (``fc``: Linear 48 -> 32, ``conv``: Conv2d 8 -> 16,
3x3), and ``lycoris_refs.npz``: ``<kind>/<module>.weight`` = peft's ``merge_and_unload()`` minus the weight
before, at adapter scale 1 (peft scales by ``alpha / r``; LoKr with ``lokr_w2`` decomposed, where peft and
LyCORIS/ComfyUI agree on that scale). peft's code is the independent implementation.

``dora_and_tucker`` writes ``lycoris_dora.safetensors``, ``lycoris_tucker.safetensors``, ``peft_dora.safetensors`` and
``dora_tucker_refs.npz`` (whole merged weights): DoRA and Tucker conv factors as LyCORIS's own modules
(lycoris-lora 4.1.3, which needs einops and toml) and peft merge them; see the functions' docstrings.

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




class Wide(torch.nn.Module):
    """The modules of the DoRA and Tucker files: linear (one square), and 3x3 convs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(48, 32)
        self.sq = torch.nn.Linear(24, 24)
        self.ha = torch.nn.Linear(40, 24)
        self.kr = torch.nn.Linear(32, 64)
        self.conv = torch.nn.Conv2d(8, 16, 3)
        self.conv2 = torch.nn.Conv2d(8, 16, 3)
        self.conv3 = torch.nn.Conv2d(16, 32, 3)


def _randomize(params, g: torch.Generator) -> None:
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def lycoris_files(refs: dict) -> None:
    """``lycoris_dora.safetensors`` (LyCORIS's own modules, kohya names: LoCon on ``fc`` with ``dora_scale`` on the
    output axis, LyCORIS's default, and on ``sq`` on the input axis (``wd_on_out=False``), Tucker LoCon on
    ``conv``, LoHa on ``ha``, LoKr on ``kr``, each with DoRA) and ``lycoris_tucker.safetensors`` (Tucker conv
    factors without DoRA: LyCORIS's LoCon ``lora_mid`` on ``conv``, peft's LoHa ``hada_t1``/``hada_t2`` on
    ``conv2`` and LoKr ``lokr_t2`` on ``conv3``, ``use_effective_conv2d=True``). References: LyCORIS's
    ``get_merged_weight(multiplier=1)`` and peft's ``merge_and_unload()``, the whole merged weight."""
    from lycoris.modules.locon import LoConModule
    from lycoris.modules.loha import LohaModule
    from lycoris.modules.lokr import LokrModule

    torch.manual_seed(3)
    model = Wide()
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for k, v in base.items():
        if k.endswith(".weight"):
            refs[f"wide/{k}"] = v.numpy()
    g = torch.Generator().manual_seed(4)
    dora_mods = {"fc": (LoConModule, dict(lora_dim=4, alpha=2.0)),
                 "sq": (LoConModule, dict(lora_dim=4, alpha=2.0, wd_on_out=False)),
                 "conv": (LoConModule, dict(lora_dim=4, alpha=3.0, use_tucker=True)),
                 # alpha = rank: LyCORIS 4.1.3's LoHa and LoKr scale alpha / rank twice (get_weight, then
                 # get_diff_weight); ComfyUI, A1111 and peft once, as the LoHa/LoKr files above check
                 "ha": (LohaModule, dict(lora_dim=4, alpha=4.0)),
                 "kr": (LokrModule, dict(lora_dim=2, alpha=2.0, factor=4))}
    tucker_mods = {"conv": (LoConModule, dict(lora_dim=4, alpha=3.0, use_tucker=True))}
    for fname, mods, wd in (("lycoris_dora", dora_mods, True), ("lycoris_tucker", tucker_mods, False)):
        tensors = {}
        for mod, (cls, kw) in mods.items():
            org = getattr(model, mod)
            m = cls(f"lora_unet_{mod}", org, 1.0, weight_decompose=wd, **kw)
            _randomize([p for n, p in m.named_parameters() if n != "dora_scale"], g)
            if wd:  # the trained magnitude: the base's norm, moved
                with torch.no_grad():
                    m.dora_scale.mul_(1.0 + 0.2 * torch.randn(m.dora_scale.shape, generator=g))
            sd = m.state_dict()
            tensors.update({f"lora_unet_{mod}.{k}": v.detach().clone().contiguous() for k, v in sd.items()})
            with torch.no_grad():
                refs[f"{fname}/{mod}.weight"] = m.get_merged_weight(1.0)[0].float().numpy()
        if not wd:  # peft's Tucker LoHa (conv2) and LoKr (conv3)
            for mod, cfg in (("conv2", LoHaConfig(r=4, alpha=2.0, target_modules=["conv2"], use_effective_conv2d=True)),
                             ("conv3", LoKrConfig(r=2, alpha=3.0, target_modules=["conv3"], decompose_factor=4,
                                                  use_effective_conv2d=True))):
                fresh = Wide()
                fresh.load_state_dict(base)
                pm = get_peft_model(fresh, cfg)
                for name, param in pm.named_parameters():
                    if name.endswith(".default"):
                        _randomize([param], g)
                        tensors[f"lora_unet_{mod}.{name.split('.')[-2]}"] = param.detach().clone().contiguous()
                tensors[f"lora_unet_{mod}.alpha"] = torch.tensor(cfg.alpha)
                refs[f"{fname}/{mod}.weight"] = pm.merge_and_unload().state_dict()[f"{mod}.weight"].numpy()
        save_file(tensors, str(OUT / f"{fname}.safetensors"))
        print(fname, {k: tuple(v.shape) for k, v in tensors.items()})


def peft_dora_file(refs: dict) -> None:
    """``peft_dora.safetensors``: peft's DoRA (``LoraConfig(use_dora=True)``, ``lora_alpha`` 8 at rank 4, kept in
    adapter_config.json, not the file) on ``fc`` and ``conv``, keys as ``get_peft_model_state_dict`` writes them
    (``base_model.model.fc.lora_magnitude_vector``); references: ``merge_and_unload()`` at adapter scale 1 and
    0.5 (``scale_layer``)."""
    from peft import LoraConfig, get_peft_model_state_dict

    for scale in (1.0, 0.5):
        torch.manual_seed(3)
        model = Wide()
        pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, use_dora=True, target_modules=["fc", "conv"]))
        g = torch.Generator().manual_seed(5)
        _randomize([p for n, p in pm.named_parameters() if "lora_A" in n or "lora_B" in n], g)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_magnitude_vector" in n:
                    p.mul_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        if scale == 1.0:
            sd = {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(pm).items()}
            save_file(sd, str(OUT / "peft_dora.safetensors"))
            print("peft_dora", {k: tuple(v.shape) for k, v in sd.items()})
        else:
            for mod in pm.modules():
                if hasattr(mod, "scale_layer") and hasattr(mod, "lora_A"):
                    mod.scale_layer(scale)
        merged = pm.merge_and_unload().state_dict()
        for k in ("fc.weight", "conv.weight"):
            refs[f"peft_dora@{scale}/{k}"] = merged[k].numpy()


def dora_and_tucker() -> None:
    refs: dict = {}
    lycoris_files(refs)
    peft_dora_file(refs)
    np.savez_compressed(OUT / "dora_tucker_refs.npz", **{k: np.asarray(v, np.float32) for k, v in refs.items()})


if __name__ == "__main__":
    main()
    dora_and_tucker()
