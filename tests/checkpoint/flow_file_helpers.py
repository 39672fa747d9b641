"""Flow-model single files as their publishers ship them, written from tiny diffusers-exported ONNX folders (no torch).

The parameters come out of each tiny graph in diffusers' / transformers' names (``single_file_helpers``'s
``_torch_layout``: every initializer under its canonical name, in torch's layout) and are renamed here into the
publishers' keys. The renaming is written from the publishers' side, independently of sdrt's forward maps
(``sdrt.checkpoint.flow``): it inverts diffusers' own single-file converters,
``convert_flux_transformer_checkpoint_to_diffusers`` / ``convert_chroma_transformer_checkpoint_to_diffusers``
(Black Forest Labs' ``double_blocks.N.img_attn.qkv``, ``single_blocks.N.linear1`` = q, k, v and the MLP input
stacked, the final adaLN's (shift, scale) against diffusers' (scale, shift)), ``convert_sd3_transformer_checkpoint
_to_diffusers`` (Stability's ``joint_blocks.N.{x,context}_block``; the last context block's modulation and the
final one swapped likewise) and ``convert_ldm_vae_checkpoint`` (LDM's ``encoder.down.N.block.M``, decoder
``up`` blocks in reverse order, ``mid.attn_1`` with 1x1-conv q/k/v). Text encoders are written in transformers'
names, as ComfyUI's ``clip_l.safetensors`` / ``clip_g.safetensors`` / ``t5xxl_fp16.safetensors`` hold them.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from single_file_helpers import _torch_layout

from sdrt.checkpoint import param_map
from sdrt.graph import Graph
from sdrt.graph.strip import strip
from sdrt.weights import Weights


def diffusers_params(graph_path: Path) -> dict[str, np.ndarray]:
    """``{diffusers/transformers name: array in torch's layout}`` of a tiny graph (the export's ``tr.`` wrapper
    prefix dropped; 1-D parameters that the graph holds as ``[C, 1, 1]`` flattened back)."""
    out = {}
    for name, a in _torch_layout(Graph.load(graph_path), sparse=False).items():
        a = np.asarray(a, np.float32)
        if a.ndim > 1 and a.shape[1:] == (1,) * (a.ndim - 1) and name.endswith((".weight", ".bias")) and (
                "norm" in name or "group_norm" in name):
            a = a.reshape(-1)
        out[name.removeprefix("tr.")] = a
    return out


def _swap(a: np.ndarray) -> np.ndarray:
    """diffusers' (scale, shift) halves <-> the publishers' (shift, scale)."""
    first, second = np.split(a, 2, axis=0)
    return np.concatenate([second, first], axis=0)


def _cat(p: dict, names: list[str], t: str) -> np.ndarray:
    return np.concatenate([p[f"{n}.{t}"] for n in names], axis=0)


def bfl_transformer(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A diffusers Flux / Chroma transformer's parameters in Black Forest Labs' keys (no prefix)."""
    out: dict[str, np.ndarray] = {}
    top = {"context_embedder": "txt_in", "x_embedder": "img_in", "proj_out": "final_layer.linear",
           "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
           "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
           "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
           "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
           "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
           "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
           "distilled_guidance_layer.in_proj": "distilled_guidance_layer.in_proj",
           "distilled_guidance_layer.out_proj": "distilled_guidance_layer.out_proj"}
    double = {"norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin", "ff.net.0.proj": "img_mlp.0",
              "ff.net.2": "img_mlp.2", "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2",
              "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj"}
    double_norms = {"attn.norm_q": "img_attn.norm.query_norm", "attn.norm_k": "img_attn.norm.key_norm",
                    "attn.norm_added_q": "txt_attn.norm.query_norm", "attn.norm_added_k": "txt_attn.norm.key_norm"}
    single = {"norm.linear": "modulation.lin", "proj_out": "linear2"}
    single_norms = {"attn.norm_q": "norm.query_norm", "attn.norm_k": "norm.key_norm"}
    done: set[str] = set()
    for name in p:
        base, t = name.rsplit(".", 1)
        if base in top:
            out[f"{top[base]}.{t}"] = p[name]
        elif base == "norm_out.linear":
            out[f"final_layer.adaLN_modulation.1.{t}"] = _swap(p[name])
        elif m := re.match(r"distilled_guidance_layer\.layers\.(\d+)\.linear_([12])$", base):
            out[f"distilled_guidance_layer.layers.{m[1]}.{'in_layer' if m[2] == '1' else 'out_layer'}.{t}"] = p[name]
        elif m := re.match(r"distilled_guidance_layer\.norms\.(\d+)$", base):
            out[f"distilled_guidance_layer.norms.{m[1]}.scale"] = p[name]
        elif m := re.match(r"transformer_blocks\.(\d+)\.(.+)$", base):
            i, rest, pre = m[1], m[2], f"transformer_blocks.{m[1]}."
            if rest in double:
                out[f"double_blocks.{i}.{double[rest]}.{t}"] = p[name]
            elif rest in double_norms:
                out[f"double_blocks.{i}.{double_norms[rest]}.scale"] = p[name]
            elif rest in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                          "attn.add_v_proj"):
                side = "img" if "to_" in rest else "txt"
                key = f"double_blocks.{i}.{side}_attn.qkv.{t}"
                if key not in done:
                    names = ["attn.to_q", "attn.to_k", "attn.to_v"] if side == "img" else \
                        ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]
                    out[key] = _cat(p, [pre + n for n in names], t)
                    done.add(key)
            else:
                raise AssertionError(name)
        elif m := re.match(r"single_transformer_blocks\.(\d+)\.(.+)$", base):
            i, rest, pre = m[1], m[2], f"single_transformer_blocks.{m[1]}."
            if rest in single:
                out[f"single_blocks.{i}.{single[rest]}.{t}"] = p[name]
            elif rest in single_norms:
                out[f"single_blocks.{i}.{single_norms[rest]}.scale"] = p[name]
            elif rest in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"):
                key = f"single_blocks.{i}.linear1.{t}"
                if key not in done:
                    out[key] = _cat(p, [pre + n for n in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")], t)
                    done.add(key)
            else:
                raise AssertionError(name)
        else:
            raise AssertionError(name)
    return out


def sd3_transformer(p: dict[str, np.ndarray], pos_embed: tuple[int, ...]) -> dict[str, np.ndarray]:
    """A diffusers SD3 transformer's parameters in Stability's keys (``sd3.5_medium.safetensors``; no prefix).
    ``pos_embed``: the shape of the fixed sin-cos table Stability's files carry (the tiny export folds it into a
    constant, so it is written as zeros: a graph that read it would give another image)."""
    last = max(int(m[1]) for k in p if (m := re.match(r"transformer_blocks\.(\d+)\.", k)))
    top = {"pos_embed.proj": "x_embedder.proj", "context_embedder": "context_embedder", "proj_out": "final_layer.linear",
           "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
           "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
           "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
           "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2"}
    plain = {"attn.to_out.0": "x_block.attn.proj", "attn.to_add_out": "context_block.attn.proj",
             "attn2.to_out.0": "x_block.attn2.proj", "ff.net.0.proj": "x_block.mlp.fc1", "ff.net.2": "x_block.mlp.fc2",
             "ff_context.net.0.proj": "context_block.mlp.fc1", "ff_context.net.2": "context_block.mlp.fc2",
             "norm1.linear": "x_block.adaLN_modulation.1", "attn.norm_q": "x_block.attn.ln_q",
             "attn.norm_k": "x_block.attn.ln_k", "attn.norm_added_q": "context_block.attn.ln_q",
             "attn.norm_added_k": "context_block.attn.ln_k", "attn2.norm_q": "x_block.attn2.ln_q",
             "attn2.norm_k": "x_block.attn2.ln_k"}
    qkv = {"x_block.attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
           "context_block.attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
           "x_block.attn2.qkv": ("attn2.to_q", "attn2.to_k", "attn2.to_v")}
    out: dict[str, np.ndarray] = {"pos_embed": np.zeros(pos_embed, np.float32)}
    for name in p:
        base, t = name.rsplit(".", 1)
        if base in top:
            out[f"{top[base]}.{t}"] = p[name]
        elif base == "norm_out.linear":
            out[f"final_layer.adaLN_modulation.1.{t}"] = _swap(p[name])
        elif m := re.match(r"transformer_blocks\.(\d+)\.(.+)$", base):
            i, rest = int(m[1]), m[2]
            if rest in plain:
                out[f"joint_blocks.{i}.{plain[rest]}.{t}"] = p[name]
            elif rest == "norm1_context.linear":
                out[f"joint_blocks.{i}.context_block.adaLN_modulation.1.{t}"] = _swap(p[name]) if i == last else p[name]
            elif not any(rest in parts for parts in qkv.values()):
                raise AssertionError(name)
        else:
            raise AssertionError(name)
    for i in range(last + 1):
        for key, parts in qkv.items():
            for t in ("weight", "bias"):
                names = [f"transformer_blocks.{i}.{n}.{t}" for n in parts]
                if all(n in p for n in names):
                    out[f"joint_blocks.{i}.{key}.{t}"] = np.concatenate([p[n] for n in names], axis=0)
    return out


def sd3_medium_shapes(prefix: str = "model.diffusion_model.", depth: int = 24, d: int = 1536) -> dict:
    """sd3_medium.safetensors' MMDiT, names and shapes (Stability's MMDiT: 24 joint blocks of 1536 =
    24 heads x 64, no q/k norm, one attention per block, the last block's context side pre-only: qkv and a 2d
    adaLN). scripts/check_sd3_medium_keys.py has diffusers' single-file loader call this key set ``sd3`` and
    convert it into exactly the parameters of SD3Transformer2DModel with SD 3 Medium's config."""
    s = {"pos_embed": (1, 192 * 192, d), "x_embedder.proj.weight": (d, 16, 2, 2), "x_embedder.proj.bias": (d,),
         "t_embedder.mlp.0.weight": (d, 256), "t_embedder.mlp.0.bias": (d,), "t_embedder.mlp.2.weight": (d, d),
         "t_embedder.mlp.2.bias": (d,), "y_embedder.mlp.0.weight": (d, 2048), "y_embedder.mlp.0.bias": (d,),
         "y_embedder.mlp.2.weight": (d, d), "y_embedder.mlp.2.bias": (d,), "context_embedder.weight": (d, 4096),
         "context_embedder.bias": (d,), "final_layer.linear.weight": (64, d), "final_layer.linear.bias": (64,),
         "final_layer.adaLN_modulation.1.weight": (2 * d, d), "final_layer.adaLN_modulation.1.bias": (2 * d,)}
    for i in range(depth):
        for side in ("x_block", "context_block"):
            b = f"joint_blocks.{i}.{side}."
            pre_only = side == "context_block" and i == depth - 1
            m = 2 if pre_only else 6
            s.update({b + "attn.qkv.weight": (3 * d, d), b + "attn.qkv.bias": (3 * d,),
                      b + "adaLN_modulation.1.weight": (m * d, d), b + "adaLN_modulation.1.bias": (m * d,)})
            if not pre_only:
                s.update({b + "attn.proj.weight": (d, d), b + "attn.proj.bias": (d,), b + "mlp.fc1.weight": (4 * d, d),
                          b + "mlp.fc1.bias": (4 * d,), b + "mlp.fc2.weight": (d, 4 * d), b + "mlp.fc2.bias": (d,)})
    return {prefix + k: v for k, v in s.items()}


def ldm_vae(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A diffusers ``AutoencoderKL``'s parameters in LDM keys (BFL's ``ae.safetensors``; ``first_stage_model.*``)."""
    ups = 1 + max(int(m[1]) for k in p if (m := re.match(r"decoder\.up_blocks\.(\d+)\.", k)))
    out: dict[str, np.ndarray] = {}
    attn = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    for name, a in p.items():
        new = re.sub(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.down.\1.block.\2.", name)
        new = re.sub(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", new)
        new = re.sub(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.",
                     lambda m: f"decoder.up.{ups - 1 - int(m[1])}.block.{m[2]}.", new)
        new = re.sub(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.",
                     lambda m: f"decoder.up.{ups - 1 - int(m[1])}.upsample.", new)
        new = new.replace("mid_block.resnets.0.", "mid.block_1.").replace("mid_block.resnets.1.", "mid.block_2.")
        new = new.replace(".conv_shortcut.", ".nin_shortcut.").replace(".conv_norm_out.", ".norm_out.")
        if m := re.match(r"^(encoder|decoder)\.mid_block\.attentions\.0\.(.+)\.(weight|bias)$", new):
            new = f"{m[1]}.mid.attn_1.{attn[m[2]]}.{m[3]}"
            if m[3] == "weight" and m[2] != "group_norm":
                a = a.reshape(*a.shape, 1, 1)  # LDM's q/k/v/proj_out are 1x1 convolutions
        assert "_blocks" not in new and "attentions" not in new, name
        out[new] = a
    return out


def t5_file(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' ``T5EncoderModel`` names as ``t5xxl_fp16.safetensors`` holds them (``shared.weight``)."""
    out = {k: v for k, v in p.items() if k.startswith("encoder.") and k != "encoder.shared.weight"}
    out["shared.weight"] = p["model.shared.weight"] if "model.shared.weight" in p else p["shared.weight"]
    return out


def clip_file(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' ``CLIPTextModel(WithProjection)`` names (``text_model.*``, ``text_projection.weight``)."""
    return {(k if k == "text_projection.weight" else "text_model." + k): v for k, v in p.items()}


def stripped(folder: Path, parts: list[str], out: Path) -> dict[str, Path]:
    """``{part: weight-free .onnx}`` as ``single_file_helpers.stripped``, except that constants the export folded
    out of no parameter stay in the graph, as ``Constant`` nodes (tiny-sd3's transformer holds SD 3's position table
    as an unnamed ``Slice`` input; sdrt's shipped graphs name it ``pos_embed.pos_embed``): every parameter, and
    nothing else, is left to the file."""
    import onnx
    from onnx import numpy_helper

    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for part in parts:
        graph = Graph.load(folder / part / "model.onnx")
        params = {s.init for s in param_map(graph).values()}
        result = strip(graph, out / f"{part}.onnx")
        model = onnx.load(str(result.graph_path), load_external_data=False)
        weights = Weights.open(result.weights_path)
        consts = [t for t in model.graph.initializer if t.name not in params and t.external_data]
        for t in consts:  # a Constant node: not an initializer, so nothing a checkpoint binds
            value = numpy_helper.from_array(np.asarray(weights[t.name]), t.name)
            model.graph.node.insert(0, onnx.helper.make_node("Constant", [], [t.name], value=value))
            model.graph.initializer.remove(t)
        del weights
        onnx.save(model, str(result.graph_path))
        result.weights_path.unlink()
        paths[part] = result.graph_path
    return paths
