"""Full-depth, full-width Flux.1 dev as the GGUF files people download, with random weights and no torch.

Writes into OUT (default /work/models/flux-gguf):

- ``flux1-dev-Q8_0.gguf`` / ``flux1-dev-Q4_K.gguf``: the transformer in Black Forest Labs' keys (19 double +
  38 single blocks, width 3072), as city96's conversions lay it out: every 2-D weight of the blocks in the
  block type, the rest (embedders, final layer, biases, norm scales) in F16/F32;
- ``t5xxl-encoder-Q8_0.gguf``: T5-XXL's encoder (24 layers, width 4096) in llama.cpp's names (gguf's
  ``T5ENCODER`` table, as city96's ``t5-v1_1-xxl-encoder-Q8_0.gguf``), matmul weights and the embedding in Q8_0;
- ``clip_l.safetensors``: CLIP-L's text tower in transformers' names, fp16;
- ``ae.safetensors``: a link to an existing full-size 16-channel AE file (``--ae``), or none.

The blocks are random, not quantized from floats: each Q8_0 block is a float16 scale and 32 random int8
values, each Q4_K super-block random 6-bit scales/mins and 4-bit values under scales chosen so the weights have
a spread near 0.02 (a transformer's usual init). The files are valid GGUF of those types; the image they give is
noise, which is all a time and memory check needs. Tensors are written one at a time (gguf's
``add_tensor_info`` then ``write_tensor_data``), so memory stays at one tensor.

    /work/venv/bin/python scripts/make_flux_gguf_full.py --types Q4_K,Q8_0 --ae /work/models/single/ae.safetensors
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "core" / "src"))

D, MLP = 3072, 12288


def flux_shapes(double: int = 19, single: int = 38) -> dict[str, tuple[int, ...]]:
    """Flux.1 dev's tensors as Black Forest Labs publish them (``flux1-dev.safetensors``)."""
    d, m = D, MLP
    s = {"img_in.weight": (d, 64), "img_in.bias": (d,), "txt_in.weight": (d, 4096), "txt_in.bias": (d,),
         "time_in.in_layer.weight": (d, 256), "time_in.in_layer.bias": (d,), "time_in.out_layer.weight": (d, d),
         "time_in.out_layer.bias": (d,), "vector_in.in_layer.weight": (d, 768), "vector_in.in_layer.bias": (d,),
         "vector_in.out_layer.weight": (d, d), "vector_in.out_layer.bias": (d,),
         "guidance_in.in_layer.weight": (d, 256), "guidance_in.in_layer.bias": (d,),
         "guidance_in.out_layer.weight": (d, d), "guidance_in.out_layer.bias": (d,),
         "final_layer.linear.weight": (64, d), "final_layer.linear.bias": (64,),
         "final_layer.adaLN_modulation.1.weight": (2 * d, d), "final_layer.adaLN_modulation.1.bias": (2 * d,)}
    for i in range(double):
        for side in ("img", "txt"):
            p = f"double_blocks.{i}.{side}_"
            s.update({p + "mod.lin.weight": (6 * d, d), p + "mod.lin.bias": (6 * d,),
                      p + "attn.qkv.weight": (3 * d, d), p + "attn.qkv.bias": (3 * d,),
                      p + "attn.norm.query_norm.scale": (128,), p + "attn.norm.key_norm.scale": (128,),
                      p + "attn.proj.weight": (d, d), p + "attn.proj.bias": (d,),
                      p + "mlp.0.weight": (m, d), p + "mlp.0.bias": (m,), p + "mlp.2.weight": (d, m),
                      p + "mlp.2.bias": (d,)})
    for i in range(single):
        p = f"single_blocks.{i}."
        s.update({p + "linear1.weight": (3 * d + m, d), p + "linear1.bias": (3 * d + m,),
                  p + "linear2.weight": (d, d + m), p + "linear2.bias": (d,), p + "norm.query_norm.scale": (128,),
                  p + "norm.key_norm.scale": (128,), p + "modulation.lin.weight": (3 * d, d),
                  p + "modulation.lin.bias": (3 * d,)})
    return s


def shipped_shapes(name: str) -> dict[str, tuple[int, ...]]:
    """The tensors a release file of this text encoder holds (transformers' names), from sdrt's shipped graph."""
    from sdrt.checkpoint.graphs import shipped_graph
    from sdrt.graph import Graph

    g = Graph.load(shipped_graph(name))
    return {t.name: tuple(t.dims) for t in g.model.graph.initializer if t.external_data}


def q8_0_blocks(shape: tuple[int, ...], rng: np.random.Generator, std: float) -> np.ndarray:
    rows, cols = shape
    blk = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
    out = np.empty(rows * cols // 32, blk)
    out["d"] = (std / 73.3) * rng.uniform(0.8, 1.2, out.shape[0])  # uniform int8 in [-127, 127]: std 73.3
    out["qs"] = rng.integers(-127, 128, (out.shape[0], 32), dtype=np.int8)
    return out.view(np.uint8).reshape(rows, -1)


def q4_k_blocks(shape: tuple[int, ...], rng: np.random.Generator, std: float) -> np.ndarray:
    rows, cols = shape
    blk = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
    out = np.empty(rows * cols // 256, blk)
    d = (std / 145.0) * rng.uniform(0.8, 1.2, out.shape[0])  # scale (0..63, mean 31.5) x 4-bit (0..15, std 4.6)
    out["d"] = d
    out["dmin"] = 7.5 * d  # mean of scale x q is 7.5 x scale: a min near it keeps the weights near zero mean
    out["scales"] = rng.integers(0, 256, (out.shape[0], 12), dtype=np.uint8)
    out["qs"] = rng.integers(0, 256, (out.shape[0], 128), dtype=np.uint8)
    return out.view(np.uint8).reshape(rows, -1)


BLOCKS = {"Q8_0": (q8_0_blocks, 32), "Q4_K": (q4_k_blocks, 256)}


def plain(shape: tuple[int, ...], rng: np.random.Generator, name: str, dtype: type) -> np.ndarray:
    if name.endswith(".bias"):
        return (rng.standard_normal(shape) * 0.01).astype(dtype)
    if len(shape) == 1:  # norm weights and the q/k norm scales
        return np.ones(shape, dtype)
    return (rng.standard_normal(shape, np.float32) * 0.02).astype(dtype)


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[tuple[int, ...], str]], seed: int) -> None:
    """``{name: (numpy shape, type)}``, types ``Q8_0``/``Q4_K``/``F16``/``F32``, one tensor in memory at a time."""
    import gguf

    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".part")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_file_type({"Q8_0": 7, "Q4_K": 15}.get(next((t for _, t in tensors.values() if t in BLOCKS), "F16"), 1))
    for name, (shape, t) in tensors.items():
        if t in BLOCKS:
            nbytes = shape[0] * shape[1] // BLOCKS[t][1] * gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][1]
            w.add_tensor_info(name, (shape[0], nbytes // shape[0]), np.dtype(np.uint8), nbytes,
                              raw_dtype=gguf.GGMLQuantizationType[t])
        else:
            dt = np.dtype(np.float16 if t == "F16" else np.float32)
            w.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.time()
    for i, (name, (shape, t)) in enumerate(tensors.items()):
        if t in BLOCKS:
            data = BLOCKS[t][0](shape, rng, 0.02)
        else:
            data = plain(shape, rng, name, np.float16 if t == "F16" else np.float32)
        w.write_tensor_data(data)
        if i % 50 == 0:
            print(f"  {path.name}: {i + 1}/{len(tensors)} tensors, {time.time() - t0:.0f} s", flush=True)
    w.close()
    os.replace(tmp, path)
    print(f"{path}: {path.stat().st_size / 1e9:.2f} GB")


def flux_types(qtype: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """city96's layout: the blocks' 2-D weights in ``qtype``; embedders, final layer, biases, scales in F16/F32."""
    out = {}
    for name, shape in flux_shapes().items():
        if len(shape) == 2 and name.startswith(("double_blocks.", "single_blocks.")):
            out[name] = (shape, qtype)
        elif len(shape) == 2:
            out[name] = (shape, "F16")
        else:
            out[name] = (shape, "F32")
    return out


def t5_types() -> dict[str, tuple[tuple[int, ...], str]]:
    from gguf.constants import MODEL_ARCH
    from gguf.tensor_mapping import get_tensor_name_map

    names = get_tensor_name_map(MODEL_ARCH.T5ENCODER, 24)
    out = {}
    for name, shape in shipped_shapes("t5xxl").items():
        new = names.get_name(name, try_suffixes=(".weight",))
        if new is None:
            raise SystemExit(f"no llama.cpp name for {name}")
        q = len(shape) == 2 and "relative_attention_bias" not in name and shape[1] % 32 == 0
        out[new] = (shape, "Q8_0" if q else "F32")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/work/models/flux-gguf"))
    ap.add_argument("--types", default="Q4_K,Q8_0", help="transformer files to write (Q8_0, Q4_K)")
    ap.add_argument("--ae", type=Path, help="an existing full-size 16-channel ae.safetensors to link beside them")
    ap.add_argument("--skip-encoders", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for t in [t for t in args.types.split(",") if t]:
        p = args.out / f"flux1-dev-{t}.gguf"
        if not p.exists():
            write_gguf(p, "flux", flux_types(t), seed=1)
    if not args.skip_encoders:
        p = args.out / "t5xxl-encoder-Q8_0.gguf"
        if not p.exists():
            write_gguf(p, "t5encoder", t5_types(), seed=2)
        p = args.out / "clip_l.safetensors"
        if not p.exists():
            from safetensors.numpy import save_file

            rng = np.random.default_rng(3)
            save_file({k: plain(s, rng, k, np.float16) for k, s in shipped_shapes("clip_l").items()}, str(p))
            print(f"{p}: {p.stat().st_size / 1e9:.2f} GB")
    if args.ae and not (args.out / "ae.safetensors").exists():
        (args.out / "ae.safetensors").symlink_to(args.ae.resolve())


if __name__ == "__main__":
    main()
