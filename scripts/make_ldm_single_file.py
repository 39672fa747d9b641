"""A diffusers SD 1.x folder -> one LDM ("original Stable Diffusion") .safetensors, as A1111 and
stable-diffusion.cpp load it: ``model.diffusion_model.*``, ``first_stage_model.*``,
``cond_stage_model.transformer.text_model.*``.

The key map is the inverse of the one diffusers applies when it reads such a file (its single-file loader),
written out here: UNet blocks by index (``down_blocks.i.resnets.j`` -> ``input_blocks.3i+j+1.0``, ...), ResNet
and VAE sub-layer names, and the VAE's attention Linear weights reshaped to 1x1 convolutions. The text encoder's
keys always carry ``text_model.``, as every released SD 1.x file has them: transformers 5 saves ``CLIPTextModel``
without that prefix, and stable-diffusion.cpp then cannot tell the file's version ("get sd version from file
failed").

    /work/refvenv/bin/python scripts/make_ldm_single_file.py /work/models/sd15-full/diffusers OUT.safetensors
"""

from __future__ import annotations

import argparse
from pathlib import Path

from safetensors.numpy import load_file, save_file

_UNET_FIXED = {
    "time_embedding.linear_1.": "time_embed.0.", "time_embedding.linear_2.": "time_embed.2.",
    "conv_in.": "input_blocks.0.0.", "conv_norm_out.": "out.0.", "conv_out.": "out.2.",
}
_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0", "conv2": "out_layers.3",
           "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}


def _unet_prefixes() -> list[tuple[str, str]]:
    out = []
    for i in range(4):
        for j in range(2):
            out.append((f"down_blocks.{i}.resnets.{j}.", f"input_blocks.{3 * i + j + 1}.0."))
            if i < 3:
                out.append((f"down_blocks.{i}.attentions.{j}.", f"input_blocks.{3 * i + j + 1}.1."))
        for j in range(3):
            out.append((f"up_blocks.{i}.resnets.{j}.", f"output_blocks.{3 * i + j}.0."))
            if i > 0:
                out.append((f"up_blocks.{i}.attentions.{j}.", f"output_blocks.{3 * i + j}.1."))
        if i < 3:
            out.append((f"down_blocks.{i}.downsamplers.0.conv.", f"input_blocks.{3 * (i + 1)}.0.op."))
            out.append((f"up_blocks.{i}.upsamplers.0.", f"output_blocks.{3 * i + 2}.{1 if i == 0 else 2}."))
    out.append(("mid_block.attentions.0.", "middle_block.1."))
    for j in range(2):
        out.append((f"mid_block.resnets.{j}.", f"middle_block.{2 * j}."))
    return out


def unet_key(k: str) -> str:
    for hf, sd in _UNET_FIXED.items():
        if k.startswith(hf):
            return sd + k[len(hf):]
    for hf, sd in _unet_prefixes():
        if k.startswith(hf):
            rest = k[len(hf):]
            if ".resnets." in hf:
                head, _, tail = rest.partition(".")
                rest = f"{_RESNET.get(head, head)}.{tail}"
            return sd + rest
    raise KeyError(f"no LDM name for UNet key {k}")


def _vae_prefixes() -> list[tuple[str, str]]:
    out = []
    for i in range(4):
        for j in range(2):
            out.append((f"encoder.down_blocks.{i}.resnets.{j}.", f"encoder.down.{i}.block.{j}."))
        if i < 3:
            out.append((f"encoder.down_blocks.{i}.downsamplers.0.", f"encoder.down.{i}.downsample."))
            out.append((f"decoder.up_blocks.{i}.upsamplers.0.", f"decoder.up.{3 - i}.upsample."))
        for j in range(3):
            out.append((f"decoder.up_blocks.{i}.resnets.{j}.", f"decoder.up.{3 - i}.block.{j}."))
    for part in ("encoder", "decoder"):
        for i in range(2):
            out.append((f"{part}.mid_block.resnets.{i}.", f"{part}.mid.block_{i + 1}."))
        out.append((f"{part}.mid_block.attentions.0.", f"{part}.mid.attn_1."))
        out.append((f"{part}.conv_norm_out.", f"{part}.norm_out."))
    return out


_VAE_ATTN = {"group_norm.": "norm.", "to_q.": "q.", "to_k.": "k.", "to_v.": "v.", "to_out.0.": "proj_out."}


def vae_key(k: str) -> tuple[str, bool]:
    """The LDM name, and whether the weight is an attention Linear that LDM keeps as a 1x1 conv."""
    for hf, sd in _vae_prefixes():
        if k.startswith(hf):
            rest = k[len(hf):]
            if hf.endswith("attentions.0."):
                for a, b in _VAE_ATTN.items():
                    if rest.startswith(a):
                        return sd + b + rest[len(a):], b != "norm." and rest.endswith("weight")
            return sd + rest.replace("conv_shortcut", "nin_shortcut"), False
    return k, False  # quant_conv, post_quant_conv, conv_in, conv_out keep their names


def convert(folder: Path, out: Path) -> None:
    sd: dict = {}
    for k, v in load_file(str(folder / "unet" / "diffusion_pytorch_model.safetensors")).items():
        sd["model.diffusion_model." + unet_key(k)] = v
    for k, v in load_file(str(folder / "vae" / "diffusion_pytorch_model.safetensors")).items():
        name, conv = vae_key(k)
        sd["first_stage_model." + name] = v.reshape(*v.shape, 1, 1) if conv and v.ndim == 2 else v
    for k, v in load_file(str(folder / "text_encoder" / "model.safetensors")).items():
        sd["cond_stage_model.transformer.text_model." + k.removeprefix("text_model.")] = v
    save_file(sd, str(out))
    print(f"{out}: {len(sd)} tensors")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    convert(args.folder, args.out)


if __name__ == "__main__":
    main()
