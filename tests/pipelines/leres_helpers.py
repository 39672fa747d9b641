"""``res101.pth`` files from a fixed seed, written with numpy and pickle only (no torch).

The file is LeReS's checkpoint: ``{"depth_model": state_dict}`` of ``RelDepthModel(backbone='resnext101')`` with
DataParallel's ``module.`` prefix on every name, BatchNorms with ``num_batches_tracked`` as ``torch.save`` writes
them. :func:`write_file` writes the full-size one (ResNeXt-101 32x8d and the LeReS decoder, 115.6 M values, 462 MB)
or ``NARROW``: the same layout with a 16-channel stem, stages of 1, 2, 2 and 1 bottlenecks of widths 8 to 64 in 4
groups (outputs 32 to 256) and decoder widths 16/16/16/32, which most tests run because it compiles in a second.
Weights are He-scaled normals, BatchNorms near identity (a bottleneck's last one scaled by 0.2, so that the values
stay within bounds through the 23 blocks of stage 3, as a trained network's do). ``scripts/ref_leres.py`` loads the
same files with ``torch.load`` and runs controlnet_aux's LeReS network (the extension's) on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 20261204


def narrow():
    from sdrt.pipelines.leresdepth import Config

    return Config(16, (1, 2, 2, 1), (8, 16, 32, 64), (32, 64, 128, 256), 4, (16, 16, 16, 32))


def make_weights(tiny: bool = True, seed: int = SEED, prefix: str = "module.") -> dict[str, np.ndarray]:
    from sdrt.pipelines.leresdepth import PUBLISHED, expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(narrow() if tiny else PUBLISHED).items():
        if name.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("running_mean"):
            a = rng.standard_normal(shape) * 0.1
        elif len(shape) == 1 and name.endswith(".weight"):  # a BatchNorm's scale
            a = 1.0 + rng.standard_normal(shape) * 0.1
            if name.endswith(".bn3.weight"):
                a *= 0.2  # a bottleneck's last: small, so that 23 residual blocks do not grow the values thousandfold
        elif name.endswith(".bias"):
            a = rng.standard_normal(shape) * 0.05
        else:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        out[prefix + name] = np.asarray(a, np.float32)
        if name.endswith("running_var"):  # torch.save's order: weight, bias, running_mean, running_var, count
            out[prefix + name[: -len("running_var")] + "num_batches_tracked"] = np.array(0, np.int64)
    return out


def write_file(folder: Path, tiny: bool = True, name: str | None = None) -> Path:
    """``folder/res101.pth``: the narrow network, or the full-size one, under ``depth_model`` with ``module.``."""
    from openpose_helpers import write_pth

    from sdrt.pipelines.leresdepth import LERES_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / (name or LERES_FILE), make_weights(tiny), key="depth_model")


def test_image(h: int = 90, w: int = 70) -> np.ndarray:
    """An RGB image with smooth shading and flat patches from the seed."""
    rng = np.random.default_rng(SEED + 1)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((3 * xx + yy) * 2) % 256], -1)
    img = img.astype(np.float64)
    for _ in range(6):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(5, 18)
        m = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        img[m] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)


#: the narrow merge network's width (the published latest_net_G.pth: 64)
NARROW_NGF = 4


def make_generator(ngf: int = NARROW_NGF, seed: int = SEED + 2) -> dict[str, np.ndarray]:
    """Seeded weights of pix2pix's ``UnetGenerator(2, 1, 10, ngf)`` without normalisation (latest_net_G.pth's
    layout): normals scaled by each layer's fan-in (a transposed convolution's input reaches each output through a
    quarter of its 4x4 taps), the last bias small."""
    from sdrt.pipelines.leresboost import generator_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in generator_shapes(ngf).items():
        if len(shape) == 1:
            a = rng.standard_normal(shape) * 0.05
        else:
            transposed = name.endswith(("3.weight", "5.weight")) and not name.endswith(".model.0.weight")
            fan = shape[0] * 4 if transposed else int(np.prod(shape[1:]))
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(1.0 / fan))
        out[name] = np.asarray(a, np.float32)
    return out


def write_generator(folder: Path, ngf: int = NARROW_NGF) -> Path:
    """``folder/latest_net_G.pth``: the generator's state dict as pix2pix saves it (no prefix, no wrapper)."""
    from openpose_helpers import write_pth

    from sdrt.pipelines.leresboost import PIX2PIX_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / PIX2PIX_FILE, make_generator(ngf))


def boost_image(h: int = 448, w: int = 448, fy: float = 1.0, fx: float = 0.15) -> np.ndarray:
    """A smooth picture with a busy strip at its left (stripes and blobs, ``fy`` x ``fx`` of it): at 448 x 448 its
    gradients give R_x 448 and six patches."""
    rng = np.random.default_rng(SEED + 3)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 200 // max(w - 1, 1), yy * 200 // max(h - 1, 1), np.full_like(xx, 90)], -1).astype(float)
    busy = (yy < h * fy) & (xx < w * fx)
    img[busy] = np.stack([((xx + yy) // 6 % 2) * 200, ((xx - yy) // 9 % 2) * 180, (xx // 4 % 3) * 80], -1)[busy]
    for _ in range(8):
        cy, cx, r = rng.uniform(0, h * fy), rng.uniform(0, w * fx), rng.uniform(6, 20)
        m = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        img[m] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)
