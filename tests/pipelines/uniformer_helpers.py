"""``upernet_global_small.pth`` files from a fixed seed, written with numpy and pickle only (no torch).

The file is an mmcv checkpoint: ``{"meta": {...}, "state_dict": ...}`` of mmseg's ``EncoderDecoder`` (UniFormer
backbone, UperNet decode head, FCN auxiliary head), BatchNorms with ``num_batches_tracked`` as ``torch.save``
writes them. :func:`write_file` writes the full-size one (UniFormer-S, 512-channel head: 52 M values, 210 MB) or
``NARROW``: the same names with widths 16/32/64/128, blocks 2/2/2/1 (the attention stages keep their 64-wide heads)
and a 32-channel head, which the tests run because it compiles and runs at 512 x 512 in seconds. Weights are
He-scaled normals, norms near identity, each residual branch's last layer scaled by 0.2 (so that the values stay
within tens through the blocks, as a trained network's do). ``scripts/ref_uniformer.py`` loads the same files with
``torch.load`` and runs the extension's segmentor on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 20261210


def narrow():
    from sdrt.pipelines.uniformerseg import Config

    return Config((16, 32, 64, 128), (2, 2, 2, 1), 32)


def _aux(cfg) -> dict[str, tuple[int, ...]]:
    """The FCN auxiliary head's tensors (in the file, never run): 256 channels (narrow: 16) on stage 3."""
    c = 256 if cfg.channels == 512 else 16
    out = {"auxiliary_head.conv_seg.weight": (150, c, 1, 1), "auxiliary_head.conv_seg.bias": (150,),
           "auxiliary_head.convs.0.conv.weight": (c, cfg.dims[2], 3, 3)}
    for p in ("weight", "bias", "running_mean", "running_var"):
        out[f"auxiliary_head.convs.0.bn.{p}"] = (c,)
    return out


def make_weights(full: bool = False, seed: int = SEED) -> dict[str, np.ndarray]:
    from sdrt.pipelines.uniformerseg import SMALL, expected_shapes

    cfg = SMALL if full else narrow()
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in {**expected_shapes(cfg), **_aux(cfg)}.items():
        if name.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("running_mean"):
            a = rng.standard_normal(shape) * 0.1
        elif len(shape) == 1 and name.endswith(".weight"):  # a norm's scale
            a = 1.0 + rng.standard_normal(shape) * 0.1
        elif name.endswith(".bias"):
            a = rng.standard_normal(shape) * 0.05
        else:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
            if name.endswith(("conv2.weight", "mlp.fc2.weight", "attn.proj.weight", "pos_embed.weight")):
                a *= 0.2
        out[name] = np.asarray(a, np.float32)
        if name.endswith("running_var"):  # torch.save's order: weight, bias, running_mean, running_var, count
            out[name[: -len("running_var")] + "num_batches_tracked"] = np.array(0, np.int64)
    return out


def write_file(folder: Path, full: bool = False) -> Path:
    """``folder/upernet_global_small.pth``: the narrow network, or the full-size one, under ``state_dict`` beside
    mmcv's ``meta`` (the classes and palette ``init_segmentor`` reads)."""
    from openpose_helpers import write_pth

    from sdrt.pipelines.segpalette import ADE20K
    from sdrt.pipelines.uniformerseg import UNIFORMER_FILE

    folder.mkdir(parents=True, exist_ok=True)
    meta = {"mmseg_version": "0.11.0", "CLASSES": tuple(f"class{i}" for i in range(150)),
            "PALETTE": [list(map(int, c)) for c in ADE20K], "iter": 160000}
    return write_pth(folder / UNIFORMER_FILE, make_weights(full), key="state_dict", extra={"meta": meta})


def test_image(h: int = 60, w: int = 44) -> np.ndarray:
    """An RGB image with smooth shading and flat patches from the seed."""
    rng = np.random.default_rng(SEED + 1)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((3 * xx + yy) * 2) % 256], -1)
    img = img.astype(np.float64)
    for _ in range(5):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(5, 16)
        m = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        img[m] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)
