"""Single files written from ONNX model folders, for the single-file pipeline tests (no torch).

``ldm_tensors(parts, ...)`` reads each part's parameters from its graph (``sdrt.checkpoint.param_map``: the
canonical diffusers/transformers name of every initializer, and its layout) and names them as an A1111/LDM
single file does: ``model.diffusion_model.*`` (``ldm.unet_to_ldm``), ``cond_stage_model.transformer.*`` /
``conditioner.embedders.0.transformer.*`` (transformers' CLIP names), ``conditioner.embedders.1.model.*``
(OpenCLIP's: fused ``in_proj``, ``resblocks``, ``text_projection`` as ``x @ P``), and ``vae_tensors`` a VAE
in diffusers' names (as diffusers' ``sdxl-vae`` ships). ``sparse=True`` gives shapes only (for headers of
full-size files). ``stripped(folder, parts, out)`` writes a folder's graphs without their weights, as sdrt
ships its graphs: every initializer an external reference to a file that is not there.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sdrt.checkpoint import param_map
from sdrt.checkpoint.ldm import unet_ldm_layout, unet_to_ldm
from sdrt.graph import Graph
from sdrt.graph.strip import strip
from sdrt.weights import stfile

_OPENCLIP = (("layer_norm1.", "ln_1."), ("layer_norm2.", "ln_2."), ("self_attn.out_proj.", "attn.out_proj."),
             ("mlp.fc1.", "mlp.c_fc."), ("mlp.fc2.", "mlp.c_proj."))


def _torch_layout(graph: Graph, sparse: bool) -> dict[str, np.ndarray | tuple[int, ...]]:
    """``{canonical name: array (or shape)}`` in torch's layout, from a graph's own initializers."""
    out: dict[str, np.ndarray | tuple[int, ...]] = {}
    pmap = param_map(graph)
    arrays = {} if sparse else graph.initializer_arrays(sorted({s.init for s in pmap.values()}))
    for canon, slot in pmap.items():
        if sparse:
            out[canon] = tuple(reversed(slot.shape)) if slot.layout == "T" else tuple(slot.shape)
        else:
            a = np.asarray(arrays[slot.init])
            out[canon] = np.ascontiguousarray(a.T) if slot.layout == "T" else a
    return out


def unet_tensors(graph: Graph, sparse: bool = False) -> dict:
    params = _torch_layout(graph, sparse)
    lpb, attn_up = unet_ldm_layout(params)
    out = {}
    for canon, v in params.items():
        name = unet_to_ldm(canon, lpb, attn_up)
        assert name is not None, canon
        out["model.diffusion_model." + name] = v
    return out


def clip_tensors(graph: Graph, prefix: str, sparse: bool = False) -> dict:
    """transformers' CLIP names under ``prefix`` (``...transformer.`` + ``text_model.``)."""
    return {prefix + ("" if c == "text_projection.weight" else "text_model.") + c: v
            for c, v in _torch_layout(graph, sparse).items()}


def openclip_tensors(graph: Graph, prefix: str, sparse: bool = False) -> dict:
    """OpenCLIP's text-tower names under ``prefix`` (SDXL's ``conditioner.embedders.1.model.``)."""
    params = _torch_layout(graph, sparse)
    top = {"embeddings.token_embedding.weight": "token_embedding.weight",
           "embeddings.position_embedding.weight": "positional_embedding",
           "final_layer_norm.weight": "ln_final.weight", "final_layer_norm.bias": "ln_final.bias"}
    out: dict = {}
    fused: dict[str, dict[str, object]] = {}
    for canon, v in params.items():
        if canon in top:
            out[prefix + top[canon]] = v
        elif canon == "text_projection.weight":  # applied as x @ P: [d, p]
            out[prefix + "text_projection"] = tuple(reversed(v)) if sparse else np.ascontiguousarray(v.T)
        else:
            layer, rest = canon.split(".")[2], ".".join(canon.split(".")[3:])
            base = f"{prefix}transformer.resblocks.{layer}."
            if rest.startswith(("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")):
                kind = rest.rsplit(".", 1)[1]
                fused.setdefault(f"{base}attn.in_proj_{kind}", {})[rest[10]] = v
                continue
            for new, old in _OPENCLIP:
                if rest.startswith(new):
                    out[base + old + rest[len(new):]] = v
                    break
            else:
                raise AssertionError(canon)
    for name, qkv in fused.items():
        q, k, v = qkv["q"], qkv["k"], qkv["v"]
        out[name] = (3 * q[0], *q[1:]) if sparse else np.concatenate([q, k, v])
    return out


def vae_tensors(decoder: Graph, encoder: Graph | None = None, prefix: str = "", sparse: bool = False) -> dict:
    """A VAE in diffusers' ``AutoencoderKL`` names (a separate VAE file as diffusers publishes them)."""
    out = {prefix + c: v for c, v in _torch_layout(decoder, sparse).items()}
    if encoder is not None:
        out.update({prefix + c: v for c, v in _torch_layout(encoder, sparse).items()})
    return out


def write(path: Path, tensors: dict, dtype=np.float32) -> Path:
    """A .safetensors file of these tensors (real arrays; shapes are written as zeros of ``dtype``)."""
    items = {k: (np.zeros(v, dtype) if isinstance(v, tuple) else np.ascontiguousarray(v, dtype=dtype))
             for k, v in tensors.items()}
    stfile.write(path, items)
    return path


def sparse(path: Path, shapes: dict, dtype: str = "F16") -> Path:
    """A valid safetensors file whose data are zeros the file system does not store (headers only matter).
    ``shapes``: ``{key: shape}`` in ``dtype``, or ``{key: (shape, dtype)}`` for mixed dtypes."""
    size = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1}
    header, off = {}, 0
    for name, v in shapes.items():
        shape, dt = v if len(v) == 2 and isinstance(v[1], str) else (v, dtype)
        n = int(np.prod(shape)) * size[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + off)
    return path


def stripped(folder: Path, parts: list[str], out: Path) -> dict[str, Path]:
    """``{part: weight-free .onnx}``: each part's graph stripped, its weights file removed (as sdrt ships graphs)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for part in parts:
        result = strip(Graph.load(folder / part / "model.onnx"), out / f"{part}.onnx")
        result.weights_path.unlink()
        paths[part] = result.graph_path
    return paths


def sd15_onnx_folder(tmp_path: Path, vae_name: str = "vae.safetensors") -> tuple[Path, Path, Path]:
    """``(folder, clip, vae)``: an Optimum-layout ONNX folder of SD 1.5's full-size architecture (sdrt's shipped
    graphs, CLIP's release tokenizer) and full-size CLIP-L and VAE files for it (headers only, sparse)."""
    import json
    import shutil

    from sdrt.checkpoint import release_tokenizer, shipped_graph
    from sdrt.graph import Graph

    folder = tmp_path / "sd15-onnx"
    for part, name in (("unet", "sd1_unet"), ("text_encoder", "clip_l"), ("vae_decoder", "vae4_decoder"),
                       ("vae_encoder", "vae4_encoder")):
        (folder / part).mkdir(parents=True)
        shutil.copyfile(shipped_graph(name), folder / part / "model.onnx")
    shutil.copytree(release_tokenizer("clip"), folder / "tokenizer")
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))

    def g(name: str) -> Graph:
        return Graph.load(shipped_graph(name))

    clip = sparse(tmp_path / "clip_l.safetensors", clip_tensors(g("clip_l"), "", sparse=True))
    vae = sparse(tmp_path / vae_name, vae_tensors(g("vae4_decoder"), g("vae4_encoder"), sparse=True))
    return folder, clip, vae
