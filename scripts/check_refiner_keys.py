"""The SDXL refiner's single-file key map against diffusers' own converter, at full size, without weights.

    PYTHONPATH=scripts/_tvblock:core/src /work/refvenv/bin/python scripts/check_refiner_keys.py

1. The refiner UNet (make_shipped_graphs.SDXL_REFINER_UNET) is built on torch's meta device; its parameter names
   are written in the LDM layout by sdrt's inverse map (``ldm.unet_to_ldm``), as ``model.diffusion_model.*`` keys
   beside OpenCLIP-G's ``conditioner.embedders.0.model.*`` names (the release's layout).
2. diffusers 0.42.1's ``infer_diffusers_model_type`` must call that key set ``xl_refiner``, and its
   ``convert_ldm_unet_checkpoint`` must give back every parameter of the module, by name and shape, each the very
   tensor object of the LDM key sdrt's forward map (``ldm.convert_unet``) reads it from (meta tensors: the check
   is of names, shapes and which key feeds which parameter, not of values).

Prints one line; writes nothing.
"""

from __future__ import annotations

import sys

import torch
import tvblock  # noqa: F401  (before diffusers)
from diffusers import UNet2DConditionModel
from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint, infer_diffusers_model_type

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from make_shipped_graphs import CLIP_G, SDXL_REFINER_UNET  # noqa: E402

from sdrt.checkpoint import ldm  # noqa: E402


def main() -> None:
    with torch.device("meta"):
        unet = UNet2DConditionModel(**SDXL_REFINER_UNET)
    params = dict(unet.state_dict())
    lpb, attn_up = ldm.unet_ldm_layout(params)
    checkpoint: dict[str, torch.Tensor] = {}
    for name, t in params.items():
        key = ldm.unet_to_ldm(name, lpb, attn_up)
        assert key is not None, name
        checkpoint[ldm.UNET_PREFIX + key] = torch.empty(t.shape, device="meta")
    w = CLIP_G["hidden_size"]
    for i in range(CLIP_G["num_hidden_layers"]):  # the keys diffusers' model-type detection looks at
        p = f"conditioner.embedders.0.model.transformer.resblocks.{i}."
        checkpoint[p + "mlp.c_proj.bias"] = torch.empty(w, device="meta")
    checkpoint["conditioner.embedders.0.model.text_projection"] = torch.empty(w, w, device="meta")
    kind = infer_diffusers_model_type(checkpoint)
    assert kind == "xl_refiner", kind
    converted = convert_ldm_unet_checkpoint(checkpoint, dict(unet.config))
    missing = sorted(set(params) - set(converted))
    extra = sorted(set(converted) - set(params))
    assert not missing and not extra, (missing[:5], extra[:5])
    ours, unknown = ldm.convert_unet([k for k in checkpoint if k.startswith(ldm.UNET_PREFIX)])
    assert not unknown, unknown[:5]
    assert set(ours) == set(params), sorted(set(ours) ^ set(params))[:5]
    wrong = []
    for name, t in params.items():
        src = ours[name]
        theirs = converted[name]
        if tuple(theirs.shape) != tuple(t.shape):
            wrong.append(f"{name}: diffusers {tuple(theirs.shape)} vs module {tuple(t.shape)}")
        elif src.op == "copy" and theirs is not checkpoint[src.key]:
            wrong.append(f"{name}: sdrt reads {src.key}, diffusers another key")
        elif src.op != "copy":
            wrong.append(f"{name}: sdrt op {src.op} on {src.key}")
    assert not wrong, wrong[:5]
    print(f"sdxl refiner UNet: {len(params)} parameters ({sum(t.numel() for t in params.values()) / 1e6:.0f}M), "
          f"diffusers calls the key set {kind!r}; convert_ldm_unet_checkpoint gives every parameter, each from the "
          "LDM key sdrt's ldm.convert_unet reads it from")


if __name__ == "__main__":
    main()
