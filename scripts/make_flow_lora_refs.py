"""Flux.1 LoRAs as people download them, and what diffusers' ``load_lora_weights`` + ``fuse_lora`` does with them.

Writes ``tests/data/lora/`` (a few kB): three LoRAs for the tiny Flux.1 dev transformer of
``tests/data/pipelines/tiny-flux-dev`` (1 double + 2 single blocks, 32 wide), random weights, rank 4:

- ``flux_peft.safetensors``: diffusers / PEFT keys (``transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight``),
  as diffusers' trainers and ai-toolkit save them; no alpha (alpha = rank);
- ``flux_kohya.safetensors``: kohya sd-scripts' keys in Black Forest Labs' module names, flattened
  (``lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight``, ``.alpha`` 2.0): fused ``qkv`` and ``linear1``;
- ``flux_comfy.safetensors``: the same layers in ComfyUI's dotted BFL names (``diffusion_model.double_blocks.0.
  img_attn.qkv.lora_A.weight``), alpha as ``.alpha``;
- ``flux_xlabs.safetensors``: XLabs' attention LoRAs (``double_blocks.0.processor.qkv_lora1.down.weight``, image
  stream 1, text stream 2; a single block's ``qkv_lora``), no alpha.

The reference (``flux_lora_refs.npz``): for each file, diffusers' ``FluxPipeline.load_lora_weights`` then
``fuse_lora(lora_scale=0.8)`` on a FluxTransformer2DModel of the same config; the change of every parameter
(fused minus before, float32, torch layout) under ``<file>/<diffusers parameter name>``. diffusers converts the
kohya file with its own ``_convert_kohya_flux_lora_to_diffusers``, independent of sdrt's split of fused layers.

    /work/refvenv/bin/python scripts/make_flow_lora_refs.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "lora"
CONFIG = ROOT / "tests" / "data" / "pipelines" / "tiny-flux-dev" / "transformer" / "config.json"
RANK, SCALE = 4, 0.8


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in json.loads(CONFIG.read_text()).items() if not k.startswith("_")}
    torch.manual_seed(0)
    model = FluxTransformer2DModel(**cfg).eval()
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    g = torch.Generator().manual_seed(1)

    def pair(out_f: int, in_f: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(RANK, in_f, generator=g) * 0.5).half(), (torch.randn(out_f, RANK, generator=g) * 0.5).half()

    sd = model.state_dict()
    peft = {}
    for mod in ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_v_proj", "transformer_blocks.0.ff.net.2",
                "transformer_blocks.0.norm1.linear", "single_transformer_blocks.1.attn.to_k",
                "single_transformer_blocks.0.proj_mlp", "single_transformer_blocks.0.proj_out"):
        w = sd[mod + ".weight"]
        a, b = pair(*w.shape)
        peft[f"transformer.{mod}.lora_A.weight"], peft[f"transformer.{mod}.lora_B.weight"] = a, b
    save_file(peft, str(OUT / "flux_peft.safetensors"))

    bfl = {"double_blocks.0.img_attn.qkv": (3 * d, d), "double_blocks.0.txt_attn.qkv": (3 * d, d),
           "double_blocks.0.img_attn.proj": (d, d), "double_blocks.0.txt_mlp.0": (4 * d, d),
           "double_blocks.0.img_mod.lin": (6 * d, d),
           "single_blocks.1.linear2": (d, 5 * d), "single_blocks.1.modulation.lin": (3 * d, d)}
    kohya, comfy = {}, {}
    for mod, (o, i) in bfl.items():
        a, b = pair(o, i)
        k = "lora_unet_" + mod.replace(".", "_")
        kohya.update({f"{k}.lora_down.weight": a, f"{k}.lora_up.weight": b, f"{k}.alpha": torch.tensor(2.0)})
        comfy.update({f"diffusion_model.{mod}.lora_A.weight": a, f"diffusion_model.{mod}.lora_B.weight": b,
                      f"diffusion_model.{mod}.alpha": torch.tensor(2.0)})
    save_file(kohya, str(OUT / "flux_kohya.safetensors"))
    save_file(comfy, str(OUT / "flux_comfy.safetensors"))
    xlabs = {}
    for mod, (o, i) in {"double_blocks.0.processor.qkv_lora1": (3 * d, d), "double_blocks.0.processor.qkv_lora2":
                        (3 * d, d), "double_blocks.0.processor.proj_lora1": (d, d),
                        "double_blocks.0.processor.proj_lora2": (d, d), "single_blocks.1.processor.qkv_lora":
                        (3 * d, d)}.items():
        a, b = pair(o, i)
        xlabs.update({f"{mod}.down.weight": a, f"{mod}.up.weight": b})
    save_file(xlabs, str(OUT / "flux_xlabs.safetensors"))

    refs = {}
    for name in ("flux_peft", "flux_kohya", "flux_comfy", "flux_xlabs"):
        torch.manual_seed(0)
        tr = FluxTransformer2DModel(**cfg).eval()
        before = {k: v.clone() for k, v in tr.state_dict().items()}
        pipe = FluxPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                            tokenizer_2=None, transformer=tr)
        try:
            pipe.load_lora_weights(str(OUT / f"{name}.safetensors"), adapter_name="x")
        except Exception as exc:  # noqa: BLE001  (a format diffusers does not read: no reference for it)
            print(f"{name}: diffusers cannot load it: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        pipe.fuse_lora(lora_scale=SCALE, adapter_names=["x"])
        pipe.unload_lora_weights()
        after = tr.state_dict()
        changed = 0
        for k, v in after.items():
            delta = (v.float() - before[k].float()).numpy()
            if np.abs(delta).max() > 0:
                refs[f"{name}/{k}"] = delta.astype(np.float32)
                changed += 1
        print(f"{name}: {changed} parameters changed")
    refs.update(full_width_refs())
    np.savez_compressed(OUT / "flux_lora_refs.npz", **refs)


def full_width_refs() -> dict[str, np.ndarray]:
    """diffusers' kohya converter at Flux.1's own width (it splits ``linear1`` at 3072, 3072, 3072, 12288 whatever
    the model): a LoRA on ``single_blocks.7.linear1``, ``double_blocks.3.txt_attn.qkv`` and ``double_blocks.3.img_mod.
    lin`` (rank 4, alpha 8, seeded numpy, ``full_width_lora`` in tests/lora/test_flux_lora.py writes the same), each
    diffusers module's delta ``B @ A`` applied to a seeded probe vector, every 16th row (the deltas are 3072 x 3072)."""
    from diffusers.loaders.lora_conversion_utils import _convert_kohya_flux_lora_to_diffusers

    rng = np.random.default_rng(7)
    sds = {}
    for mod, (o, i) in FULL.items():
        k = "lora_unet_" + mod.replace(".", "_")
        sds[f"{k}.lora_down.weight"] = torch.from_numpy(rng.standard_normal((4, i)).astype(np.float32))
        sds[f"{k}.lora_up.weight"] = torch.from_numpy(rng.standard_normal((o, 4)).astype(np.float32))
        sds[f"{k}.alpha"] = torch.tensor(8.0)
    probe = np.random.default_rng(8).standard_normal(3072).astype(np.float32)
    conv = _convert_kohya_flux_lora_to_diffusers(dict(sds))
    out = {}
    for key in conv:
        if key.endswith(".lora_A.weight"):
            mod = key[: -len(".lora_A.weight")].removeprefix("transformer.")
            a, b = conv[key].double().numpy(), conv[key.replace("lora_A", "lora_B")].double().numpy()
            out[f"full/{mod}"] = (b @ (a @ probe))[::16].astype(np.float32)  # every 16th row: the file stays small
    print(f"full width: {len(out)} diffusers modules")
    return out


#: kohya modules of the full-width check and their (out, in) sizes
FULL = {"single_blocks.7.linear1": (21504, 3072), "double_blocks.3.txt_attn.qkv": (9216, 3072),
        "double_blocks.3.img_mod.lin": (18432, 3072)}


if __name__ == "__main__":
    main()
