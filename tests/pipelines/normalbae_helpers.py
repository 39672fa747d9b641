"""``scannet.pt`` files from a fixed seed, written with numpy and pickle only (no torch).

The file is a training checkpoint: ``{"model": state_dict}`` of Bae et al.'s ``NNET`` (BN decoder), BatchNorms
with ``num_batches_tracked`` as ``torch.save`` writes them. :func:`write_file` writes the full-size one (B5's
encoder, 72.6 M values, 290 MB, names with DataParallel's ``module.`` prefix) or ``TINY``: the same layout with
gen-efficientnet's channel multiplier 0.25 and depth multiplier 0.5 (11 blocks, 8 to 80 channels, a 320-channel
head) and a 64-wide first decoder stage, which most tests run because it compiles in a second. Weights are
He-scaled normals, BatchNorms near identity (a block's last one scaled by 0.2, so that the values
stay within tens through B5's 39 blocks, as a trained network's do). ``scripts/ref_normalbae.py`` loads the same files with ``torch.load``
and runs the extension's NNET on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 20261203


def _tiny():
    from sdrt.pipelines.normalbae import STRIDES, Block, Config

    chans, repeats, kernels = (8, 8, 16, 24, 32, 48, 80), (1, 1, 1, 2, 2, 2, 1), (3, 3, 5, 3, 5, 5, 3)
    stages, cin = [], 8
    for s in range(7):
        blocks = []
        for i in range(repeats[s]):
            hidden = cin if s == 0 else cin * 6
            blocks.append(Block("ds" if s == 0 else "ir", cin, hidden, chans[s], kernels[s], max(1, int(cin * 0.25)),
                                STRIDES[s] if i == 0 else 1))
            cin = chans[s]
        stages.append(tuple(blocks))
    return Config(8, tuple(stages), 320, 64)


def make_weights(tiny: bool = True, seed: int = SEED, prefix: str = "") -> dict[str, np.ndarray]:
    from sdrt.pipelines.normalbae import B5, expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(_tiny() if tiny else B5).items():
        if name.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("running_mean"):
            a = rng.standard_normal(shape) * 0.1
        elif len(shape) == 1 and name.endswith(".weight"):  # a BatchNorm's scale
            a = 1.0 + rng.standard_normal(shape) * 0.1
            if name.endswith(".bn3.weight") or (".blocks.0." in name and name.endswith(".bn2.weight")):
                a *= 0.2  # a block's projection: small, so that 39 residual blocks do not grow the values thousandfold
        elif name.endswith(".bias"):
            a = rng.standard_normal(shape) * 0.05
        else:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        out[prefix + name] = np.asarray(a, np.float32)
        if name.endswith("running_var"):  # torch.save's order: weight, bias, running_mean, running_var, count
            out[prefix + name[: -len("running_var")] + "num_batches_tracked"] = np.array(0, np.int64)
    return out


def write_file(folder: Path, tiny: bool = True) -> Path:
    """``folder/scannet.pt``: the tiny network, or the full-size one (with ``module.`` prefixes)."""
    from openpose_helpers import write_pth

    from sdrt.pipelines.normalbae import NORMALBAE_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / NORMALBAE_FILE, make_weights(tiny, prefix="" if tiny else "module."), key="model")


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
