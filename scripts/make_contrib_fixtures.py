"""Optimize a Stable Diffusion ONNX folder with onnxruntime's transformer optimizer (com.microsoft contrib ops).

Writes what Olive and ``onnxruntime.transformers.models.stable_diffusion.optimize_pipeline`` give users, so that
sdrt's contrib-op rewrite (``sdrt.graph.contrib``) is tested on the real thing:

    /work/refvenv/bin/python scripts/make_contrib_fixtures.py                      # the committed tiny folders
    /work/refvenv/bin/python scripts/make_contrib_fixtures.py SRC DST --style ort --float16   # any folder

Styles (``--style``):

- ``ort``: optimize_pipeline's settings (GroupNorm channels-last, SkipGroupNorm, NhwcConv, BiasSplitGelu, BiasAdd;
  packed QKV/KV MultiHeadAttention only with ``--float16``, as optimize_pipeline does);
- ``olive``: Olive's DirectML SD settings (GroupNorm channels-first, packed QKV/KV, no BiasAdd, no SkipLayerNorm).

onnxruntime 1.32's UNet attention fusion calls ``int()`` on a one-element array, which numpy 2.4 refuses
("only 0-dimensional arrays can be converted to Python scalars"); ``_patch_num_heads`` reads the value with
``.item()`` instead (same result). Needs onnxruntime (no torch).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "pipelines"

#: part folder -> onnxruntime.transformers model type (optimize_pipeline's mapping)
MODEL_TYPES = {"unet": "unet", "vae_encoder": "vae", "vae_decoder": "vae", "text_encoder": "clip",
               "text_encoder_2": "clip"}

#: the committed fixtures: (source folder, target folder, style, float16)
FIXTURES = [("tiny-sd15", "tiny-sd15-ort", "ort", False),
            ("tiny-sd15", "tiny-sd15-ort-fp16", "ort", True),
            ("tiny-sdxl", "tiny-sdxl-olive-fp16", "olive", True)]


def _patch_num_heads() -> None:
    import onnxruntime.transformers.optimizer  # noqa: F401  (puts its folder on sys.path: modules load by bare name)

    fau = importlib.import_module("fusion_attention_unet")

    def get_num_heads(self, reshape_q, is_torch2=False):  # noqa: ANN001, ANN202
        if is_torch2:
            parent = self.model.get_parent(reshape_q, 1)
            if parent is None or parent.op_type != "Concat" or len(parent.input) != 4:
                return 0
            value = self.model.get_constant_value(parent.input[2])
        else:
            value = self.model.get_constant_value(reshape_q.input[1])
            value = value[2] if isinstance(value, np.ndarray) and value.shape == (4,) else None
        if isinstance(value, np.ndarray) and value.size == 1:
            value = int(value.reshape(()).item())
        return value if isinstance(value, int) and value > 0 else 0

    fau.FusionAttentionUnet.get_num_heads = get_num_heads


def options(model_type: str, style: str, float16: bool):  # noqa: ANN201
    from onnxruntime.transformers.fusion_options import FusionOptions

    opts = FusionOptions(model_type)
    if model_type == "unet":
        opts.enable_packed_kv = opts.enable_packed_qkv = float16 or style == "olive"
    if style == "olive":  # Olive's examples/directml/stable_diffusion config (optimization_options)
        opts.enable_skip_layer_norm = False
        opts.enable_bias_skip_layer_norm = False
        opts.enable_gelu_approximation = False
        opts.enable_nhwc_conv = False
        opts.enable_bias_splitgelu = False
        opts.enable_bias_add = False
        opts.group_norm_channels_last = False
        opts.use_multi_head_attention = True
    return opts


def optimize_folder(src: Path, dst: Path, style: str, float16: bool) -> dict[str, dict[str, int]]:
    from onnxruntime.transformers.optimizer import optimize_model

    _patch_num_heads()
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.onnx", "*.onnx_data", "refs.*"))
    counts = {}
    for part, model_type in MODEL_TYPES.items():
        path = src / part / "model.onnx"
        if not path.exists():
            continue
        m = optimize_model(str(path), model_type=model_type, num_heads=0, hidden_size=0, opt_level=0,
                           optimization_options=options(model_type, style, float16), use_gpu=True)
        if float16 and not (part == "vae_decoder" and "sdxl" in src.name):  # optimize_pipeline keeps SDXL's VAE fp32
            m.convert_float_to_float16(keep_io_types=False)
        counts[part] = {f"{n.domain}.{n.op_type}": 0 for n in m.model.graph.node if n.domain}
        for n in m.model.graph.node:
            if n.domain:
                counts[part][f"{n.domain}.{n.op_type}"] += 1
        big = sum(t.ByteSize() for t in m.model.graph.initializer) > 2**30
        m.save_model_to_file(str(dst / part / "model.onnx"), use_external_data_format=big)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", type=Path)
    ap.add_argument("dst", nargs="?", type=Path)
    ap.add_argument("--style", choices=("ort", "olive"), default="ort")
    ap.add_argument("--float16", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    jobs = [(a.src, a.dst, a.style, a.float16)] if a.src else \
        [(DATA / s, DATA / d, style, f16) for s, d, style, f16 in FIXTURES]
    for src, dst, style, f16 in jobs:
        counts = optimize_folder(src, dst, style, f16)
        print(dst.name, json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
