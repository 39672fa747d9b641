"""XLabs-AI's Flux.1 ControlNets (``flux-canny-controlnet-v3.safetensors``, depth, hed, v1-v3): their keys and the
control-image embedding they add to sdrt's Flux ControlNet graph (:mod:`sdrt.checkpoint.fluxcontrolnet`).

XLabs' ``ControlNetFlux`` is what diffusers 0.42 runs as ``FluxControlNetModel(conditioning_embedding_channels=16,
patch_size=2, num_single_layers=0)``: Flux's embeddings and its first ``n`` double blocks, one zero linear per block
(``controlnet_blocks.j``), and, instead of VAE latents, the control picture in pixels (RGB in [-1, 1], the output
size) through ``input_hint_block`` (eight 3x3 convolutions of 16 channels, SiLU between, three of them stride 2:
the latent grid), packed into 2x2 patches of 64 values and embedded by ``pos_embed_input`` (diffusers'
``controlnet_x_embedder``). Its residuals go to the transformer's double blocks in turn (block ``k`` takes residual
``k % n``: diffusers' ``controlnet_blocks_repeat``), none to the single blocks.

The files hold Black Forest Labs' names (``img_in``, ``txt_in``, ``time_in``, ``vector_in``, ``guidance_in``,
``double_blocks.N`` with fused ``qkv``), converted by :func:`sdrt.checkpoint.flow.convert_flux`;
``input_hint_block.{0,2,..,14}`` and ``pos_embed_input`` are renamed here. A file already in diffusers' names
(``input_hint_block.conv_in``) binds as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from .ldm import Source

#: diffusers' names of the hint block's convolutions, in order (``ControlNetConditioningEmbedding`` with
#: ``block_out_channels=(16, 16, 16, 16)``): every second one of ``blocks`` has stride 2
HINT = ("conv_in", *(f"blocks.{i}" for i in range(6)), "conv_out")
HINT_CHANNELS = 16


def is_bfl(keys: Mapping[str, Any]) -> bool:
    """True for XLabs' own key layout (``double_blocks.N`` with ``controlnet_blocks.N``)."""
    return any(k.startswith("double_blocks.") for k in keys) and any(k.startswith("controlnet_blocks.") for k in keys)


def has_hint(keys: Mapping[str, Any]) -> bool:
    return any(k.startswith("input_hint_block.") for k in keys)


def check(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why a file with an ``input_hint_block`` is not XLabs' design (a phrase), or None."""
    bfl = is_bfl(shapes)
    convs = [f"input_hint_block.{2 * i}.weight" for i in range(len(HINT))] if bfl else \
        [f"input_hint_block.{n}.weight" for n in HINT]
    missing = [k for k in convs if k not in shapes]
    embed = "pos_embed_input.weight" if bfl else "controlnet_x_embedder.weight"
    if missing or embed not in shapes:
        return (f"a Flux ControlNet with an input_hint_block but without {(missing or [embed])[0]} (not XLabs' "
                "design: eight convolutions and a patch embedding)")
    if "controlnet_blocks.0.weight" not in shapes:  # TheMistoAI's MistoLine keeps its own block layers
        block = next((k for k in shapes if k.startswith("controlnet_blocks.0.")), "controlnet_blocks.0")
        return (f"a Flux ControlNet with input_hint_block and {block} (not XLabs' design, e.g. MistoLine's), which "
                "sdrt does not run")
    out = shapes[convs[-1]]
    emb = shapes[embed]
    if len(out) != 4 or len(emb) != 2 or emb[1] != 4 * out[0]:
        return (f"a Flux ControlNet whose input_hint_block gives {out[0] if out else '?'} channels and whose patch "
                f"embedding reads {emb[1] if len(emb) == 2 else '?'} (XLabs' design: 16 and 64)")
    return None


def sources(shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Source], list[str]]:
    """``({diffusers FluxControlNetModel name: Source}, keys not used)`` for an XLabs file in its own names."""
    from .flow import convert_flux

    out, unknown = convert_flux(shapes)
    rest = []
    for k in unknown:
        if m := re.match(r"input_hint_block\.(\d+)\.(weight|bias)$", k):
            i = int(m[1])
            if i % 2 == 0 and i // 2 < len(HINT):
                out[f"input_hint_block.{HINT[i // 2]}.{m[2]}"] = Source(k)
                continue
        elif m := re.match(r"pos_embed_input\.(weight|bias)$", k):
            out[f"controlnet_x_embedder.{m[1]}"] = Source(k)
            continue
        elif re.match(r"controlnet_blocks\.\d+\.(weight|bias)$", k):
            out[k] = Source(k)
            continue
        rest.append(k)
    return out, rest


def hint_nodes(width: int, external: Callable[[str, list[int]], Any], out: str) -> tuple[list[Any], list[Any]]:
    """``(initializers, nodes)`` embedding the graph input ``controlnet_cond`` (``[batch, 3, height, width]``, RGB
    in [-1, 1]) into ``out`` (``[batch, tokens, width]``): the hint convolutions, then the 2x2 patches and
    ``controlnet_x_embedder`` as one 2x2 stride-2 convolution whose kernel is that linear's weight reshaped
    (``[width, 64]`` -> ``[width, 16, 2, 2]``: the patch's values are ordered channel, row, column, as diffusers
    packs them), its output flattened to tokens. ``external(name, dims)`` makes a weight-free initializer."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    inits: list[Any] = []
    nodes: list[Any] = []
    x = "controlnet_cond"
    c = HINT_CHANNELS
    for k, name in enumerate(HINT):
        prefix = f"input_hint_block.{name}"
        inits += [external(f"{prefix}.weight", [c, 3 if k == 0 else c, 3, 3]), external(f"{prefix}.bias", [c])]
        stride = 2 if name.startswith("blocks.") and int(name.split(".")[1]) % 2 == 1 else 1
        y = f"sdrt_hint_{k}"
        nodes.append(onnx.helper.make_node("Conv", [x, f"{prefix}.weight", f"{prefix}.bias"], [y], name=y,
                                           kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride]))
        if name != "conv_out":
            nodes += [onnx.helper.make_node("Sigmoid", [y], [y + "_sig"]),
                      onnx.helper.make_node("Mul", [y, y + "_sig"], [y + "_silu"])]
            y += "_silu"
        x = y
    inits += [external("controlnet_x_embedder.weight", [width, 4 * c]), external("controlnet_x_embedder.bias",
                                                                                  [width])]

    def const(name: str, values: list[int]) -> Any:
        return onnx.helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64),
                                                                                           name))

    nodes += [const("sdrt_patch_kernel_shape", [width, c, 2, 2]), const("sdrt_tokens_shape", [0, 0, -1]),
              onnx.helper.make_node("Reshape", ["controlnet_x_embedder.weight", "sdrt_patch_kernel_shape"],
                                    ["sdrt_patch_kernel"]),
              onnx.helper.make_node("Conv", [x, "sdrt_patch_kernel", "controlnet_x_embedder.bias"], ["sdrt_patches"],
                                    name="sdrt_patch_embed", kernel_shape=[2, 2], strides=[2, 2]),
              onnx.helper.make_node("Reshape", ["sdrt_patches", "sdrt_tokens_shape"], ["sdrt_patch_tokens"]),
              onnx.helper.make_node("Transpose", ["sdrt_patch_tokens"], [out], perm=[0, 2, 1])]
    return inits, nodes
