"""A tiny SDXL Control-LoRA (Stability AI's control-lora layout) and diffusers' image with the ControlNet it makes.

    /work/refvenv/bin/python scripts/gen_controllora_refs.py   # tests/data/pipelines/tiny-sdxl-controlnet/controllora/

The base is tiny-sdxl-controlnet's pipeline (``gen_pipeline_refs.build("sdxl")``, checked against the folder's
exported UNet). The file is written in the real files' key naming (LDM names, no prefix; the names are checked
by running diffusers' own ``convert_controlnet_checkpoint`` on them): ``lora_controlnet`` (an empty marker), the
ControlNet's own tensors in full (``input_hint_block.*``, ``zero_convs.N.0.*``, ``middle_block_out.0.*``), the
UNet copy's norms and biases in full, and for each Linear/Conv weight of the copy ``<module>.up`` / ``.down``.
The ControlNet diffusers runs is the published rule, done here in torch: the UNet's weight plus
``up.flatten(1) @ down.flatten(1)`` reshaped, the full tensors as they are. ``refs.npz`` holds the image of
``StableDiffusionXLControlNetPipeline`` (Euler, seed 101, scale 0.9) and the control image.

It also lists the key names and shapes a full-size rank-128 file has against SDXL's UNet config (meta tensors,
nothing downloaded), prints the counts and writes them to ``full_size_rank128_keys.json`` (the tests bind a sparse
file of those shapes onto the shipped graphs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_controlnet_refs as C  # noqa: E402
import gen_pipeline_refs as G  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import ControlNetModel, UNet2DConditionModel  # noqa: E402
from diffusers.loaders.single_file_utils import convert_controlnet_checkpoint  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

OUT = G.OUT / "tiny-sdxl-controlnet" / "controllora"
RANK = 4
_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1", "norm2": "out_layers.0",
           "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}


def ldm_name(name: str, layers: int, n_hint: int) -> str:
    """A ControlNetModel parameter's name in the LDM (cldm) layout the control-lora files use."""
    p = name.split(".")
    if p[0] == "conv_in":
        return "input_blocks.0.0." + p[1]
    if p[0] == "time_embedding":
        return f"time_embed.{ {'linear_1': 0, 'linear_2': 2}[p[1]]}.{p[2]}"
    if p[0] == "add_embedding":
        return f"label_emb.0.{ {'linear_1': 0, 'linear_2': 2}[p[1]]}.{p[2]}"
    if p[0] == "controlnet_cond_embedding":
        idx = 0 if p[1] == "conv_in" else 2 * (n_hint + 1) if p[1] == "conv_out" else 2 * (int(p[2]) + 1)
        return f"input_hint_block.{idx}.{p[-1]}"
    if p[0] == "controlnet_down_blocks":
        return f"zero_convs.{p[1]}.0.{p[2]}"
    if p[0] == "controlnet_mid_block":
        return f"middle_block_out.0.{p[1]}"
    if p[0] == "down_blocks":
        i = int(p[1])
        if p[2] == "downsamplers":
            return f"input_blocks.{(i + 1) * (layers + 1)}.0.op.{p[-1]}"
        j = int(p[3])
        blk = f"input_blocks.{1 + i * (layers + 1) + j}"
        if p[2] == "resnets":
            return f"{blk}.0.{_RESNET[p[4]]}.{p[5]}"
        return f"{blk}.1." + ".".join(p[4:])
    if p[0] == "mid_block":
        if p[1] == "resnets":
            return f"middle_block.{2 * int(p[2])}.{_RESNET[p[3]]}.{p[4]}"
        return "middle_block.1." + ".".join(p[3:])
    raise KeyError(name)


def ldm_names(net: ControlNetModel) -> dict[str, str]:
    cfg = net.config
    n_hint = 2 * (len(cfg.conditioning_embedding_out_channels) - 1)  # two convolutions per width step
    names = {k: ldm_name(k, cfg.layers_per_block, n_hint) for k in net.state_dict()}
    back = convert_controlnet_checkpoint({v: torch.zeros(1) for v in names.values()}, dict(cfg))
    # diffusers' converter leaves SDXL's label_emb out (its ControlNet loader reads it with the UNet's names)
    want = {k for k in names if not k.startswith("add_embedding.")}
    assert set(back) == want, (sorted(want - set(back))[:5], sorted(set(back) - want)[:5])
    return names


def is_pair(name: str, shape: tuple[int, ...]) -> bool:
    """A Linear/Conv weight of the UNet copy (stored as up/down), not the ControlNet's own layers."""
    return name.endswith(".weight") and len(shape) >= 2 and not name.startswith("controlnet_")


def control_lora(net: ControlNetModel, names: dict[str, str], seed: int) -> tuple[dict, dict]:
    """``(file tensors, merged ControlNetModel state dict)``: the copy's weights as base + up @ down."""
    g = torch.Generator().manual_seed(seed)
    base = net.state_dict()
    file: dict[str, torch.Tensor] = {"lora_controlnet": torch.tensor([])}
    merged: dict[str, torch.Tensor] = {}
    same: dict[tuple, torch.Tensor] = {}
    for name, w in base.items():
        ldm = names[name]
        if is_pair(name, tuple(w.shape)):
            out, rest = w.shape[0], w.shape[1:]
            up = torch.randn((out, RANK) + (1, 1) * (len(rest) == 3), generator=g) * 0.15
            down = torch.randn((RANK,) + tuple(rest), generator=g) * 0.15
            file[ldm[:-len(".weight")] + ".up"] = up
            file[ldm[:-len(".weight")] + ".down"] = down
            merged[name] = w + torch.mm(up.flatten(1), down.flatten(1)).reshape(w.shape)
        else:
            gain = C.COND_GAIN if name.startswith("controlnet_cond_embedding.conv_out") else 1.0
            if name.startswith("controlnet_"):
                full = torch.randn(w.shape, generator=g) * 0.1 * gain
            else:  # equal base tensors get equal changes: the tiny export stores equal weights once
                key = (tuple(w.shape), w.numpy().tobytes())
                if key not in same:
                    same[key] = w + torch.randn(w.shape, generator=g) * 0.05
                full = same[key].clone()
            file[ldm] = full
            merged[name] = full
    return file, merged


def full_size_check() -> None:
    """The key names and shapes of a rank-128 SDXL control-lora file against SDXL's UNet (meta tensors)."""
    cfg = dict(sample_size=128, in_channels=4, out_channels=4, down_block_types=(
        "DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"), up_block_types=(
        "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(320, 640, 1280),
        layers_per_block=2, transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
        cross_attention_dim=2048, use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816)
    with torch.device("meta"):
        unet = UNet2DConditionModel(**cfg)
        net = ControlNetModel.from_unet(unet)
    names = ldm_names(net)
    sd = net.state_dict()
    pairs = [k for k, v in sd.items() if is_pair(k, tuple(v.shape))]
    full = [k for k in sd if k not in pairs]
    unet_sd = unet.state_dict()
    assert all(k in unet_sd and unet_sd[k].shape == sd[k].shape for k in pairs)
    keys: dict[str, list[int]] = {"lora_controlnet": [0]}
    for k, v in sd.items():
        if k in pairs:
            mod, rest = names[k][:-len(".weight")], list(v.shape[1:])
            keys[mod + ".up"] = [int(v.shape[0]), 128] + [1, 1] * (len(rest) == 3)
            keys[mod + ".down"] = [128] + [int(d) for d in rest]
        else:
            keys[names[k]] = [int(d) for d in v.shape]
    (OUT / "full_size_rank128_keys.json").write_text(json.dumps(keys, separators=(",", ":")))
    print(f"full size: {len(sd)} ControlNet parameters; {len(pairs)} up/down pairs (rank 128: "
          f"{sum(128 * (v.shape[0] + int(np.prod(v.shape[1:]))) for k, v in sd.items() if k in pairs) / 1e6:.1f} M "
          f"values), {len(full)} in full ({sum(1 for k in full if k.startswith('controlnet_'))} ControlNet-only); "
          f"merged copy {sum(v.numel() for v in sd.values()) * 2 / 2**30:.2f} GiB fp16; e.g. "
          f"{names[pairs[0]]} -> .up {[sd[pairs[0]].shape[0], 128]}")


def main() -> None:
    torch.manual_seed(0)
    pipe = G.build("sdxl")
    folder = G.OUT / "tiny-sdxl-controlnet"
    # the UNet is the folder's: one of its exported weights checked
    net = ControlNetModel.from_unet(pipe.unet, conditioning_embedding_out_channels=(8, 8, 8, 8)).eval()
    names = ldm_names(net)
    file, merged = control_lora(net, names, 7)
    net.load_state_dict(merged)
    OUT.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in file.items()}, str(OUT / "control-lora-canny-rank4.safetensors"))
    edges = C.control_edges()
    case = dict(prompt=G.PROMPT, negative_prompt=G.NEGATIVE, steps=8, cfg=7.0, width=C.SIZE, height=C.SIZE,
                sampler="Euler", seed=101, controlnets=["cl"], control_images=["edges"], scale=[0.9], start=[0.0],
                end=[1.0])
    img = C.run_case(pipe, {"cl": net}, case, {"edges": edges})[0]
    plain = C.run_case(pipe, {"cl": net}, dict(case, scale=[0.0]), {"edges": edges})[0]
    moved = float(np.abs(img.astype(int) - plain.astype(int)).mean())
    print(f"tiny: {len(file)} tensors; the Control-LoRA moves the image by {moved:.1f} levels on average")
    assert moved > 5
    np.savez_compressed(OUT / "refs.npz", image=img, edges=edges)
    (OUT / "refs.json").write_text(json.dumps(dict(case, file="control-lora-canny-rank4.safetensors"), indent=1))
    full_size_check()
    _ = folder


if __name__ == "__main__":
    main()
