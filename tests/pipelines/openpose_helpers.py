"""A full-size ``body_pose_model.pth`` from a fixed seed, written with numpy and pickle only (no torch).

The weights are He-scaled normals at the published shapes, steered so that the random network finds people:
the last heatmap layer is scaled so several peaks pass body.py's 0.1, and each limb's PAF pair gets a constant
direction (bias) so that some limbs connect. ``scripts/ref_openpose_body.py`` loads the same file with
``torch.load`` and runs controlnet_aux's ``Body`` on it.
"""

from __future__ import annotations

import pickle
import sys
import types
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

SEED = 20261201


def make_weights(seed: int = SEED) -> dict[str, np.ndarray]:
    from sdrt.pipelines.openposebody import LIMBS, PAF_CHANNELS, expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes().items():
        if name.endswith(".bias"):
            out[name] = (rng.standard_normal(shape) * 0.01).astype(np.float32)
        else:
            fan_in = shape[1] * shape[2] * shape[3]
            out[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    heat_w = "Mconv7_stage6_L2.weight"
    out[heat_w] *= np.float32(6.0)
    out["Mconv7_stage6_L2.bias"][:] = np.float32(-0.05)
    paf_w = "Mconv7_stage6_L1.weight"
    out[paf_w] *= np.float32(0.05)
    dirs = rng.uniform(0, 2 * np.pi, len(LIMBS))
    for (cx, cy), t in zip(PAF_CHANNELS, dirs):
        out["Mconv7_stage6_L1.bias"][cx] = np.float32(np.cos(t))
        out["Mconv7_stage6_L1.bias"][cy] = np.float32(np.sin(t))
    return out


#: the hand network's keypoints that the seeded file never finds (their last bias sinks every value), and the face's
HAND_MISSING = (3, 11, 17)
FACE_MISSING = (5, 30, 70)


def make_cpm_weights(out: int, seed: int, missing: tuple[int, ...]) -> dict[str, np.ndarray]:
    """A full-size ``hand_pose_model.pth`` (``out`` 22) or ``facenet.pth`` (71): He-scaled normals at the
    published names and shapes; the last layer's bias of the ``missing`` channels at -1000 so that nothing passes
    the threshold there (hand.py's (0, 0) keypoint, face.py's left-out one), the others finding their peaks."""
    from sdrt.pipelines.openposehand import cpm_shapes

    rng = np.random.default_rng(seed)
    out_w: dict[str, np.ndarray] = {}
    for name, shape in cpm_shapes(out).items():
        if name.endswith(".bias"):
            out_w[name] = (rng.standard_normal(shape) * 0.01).astype(np.float32)
        else:
            fan_in = shape[1] * shape[2] * shape[3]
            out_w[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    for c in missing:
        out_w["Mconv7_stage6.bias"][c] = np.float32(-1000.0)
    return out_w


def make_hand_weights() -> dict[str, np.ndarray]:
    return make_cpm_weights(22, SEED + 2, HAND_MISSING)


def make_face_weights() -> dict[str, np.ndarray]:
    return make_cpm_weights(71, SEED + 3, FACE_MISSING)


def parts_image() -> np.ndarray:
    """The 64x72 crop of :func:`test_image` where the seeded body file finds a right hand box inside the image, a
    left one clipped at the top (faceDetect and handDetect clip) and 3 face boxes, so the hand and face tests run
    each network a few times only."""
    return np.ascontiguousarray(test_image()[16:80, 72:144])


def _rebuild_tensor_v2(*args):  # pragma: no cover - a name for pickle, never called here
    raise AssertionError


class FloatStorage:  # pragma: no cover - a name for pickle
    pass


class LongStorage:  # pragma: no cover - a name for pickle (BatchNorm's num_batches_tracked)
    pass


def write_pth(path: Path, arrays: dict[str, np.ndarray], key: str | None = None, extra: dict | None = None) -> Path:
    """``torch.save(state_dict)``'s zip layout: data.pkl (rebuild calls over persistent storages) and one raw
    little-endian storage per tensor (float32; int64 arrays as int64); ``key``: the state dict saved inside a dict
    under it (``{"state_dict": ...}``, as training scripts save); ``extra``: plain entries saved beside it (mmcv's
    ``meta``)."""
    torch_mod = types.ModuleType("torch")
    utils_mod = types.ModuleType("torch._utils")
    torch_mod.FloatStorage, torch_mod.LongStorage = FloatStorage, LongStorage
    utils_mod._rebuild_tensor_v2 = _rebuild_tensor_v2
    FloatStorage.__module__ = LongStorage.__module__ = "torch"
    _rebuild_tensor_v2.__module__ = "torch._utils"
    saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
    if saved["torch"] is not None:
        raise RuntimeError("write_pth runs without torch")

    class _Storage:
        def __init__(self, key: str, n: int, long: bool = False) -> None:
            self.key, self.n, self.long = key, n, long

    class _Tensor:
        def __init__(self, key: str, shape: tuple[int, ...], long: bool = False) -> None:
            self.key, self.shape, self.long = key, shape, long

        def __reduce__(self):
            stride, acc = [], 1
            for d in reversed(self.shape):
                stride.insert(0, acc)
                acc *= d
            return (_rebuild_tensor_v2, (_Storage(self.key, acc, self.long), 0, tuple(self.shape), tuple(stride), False,
                                         OrderedDict()))

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, _Storage):
                return ("storage", LongStorage if obj.long else FloatStorage, obj.key, "cpu", obj.n)
            return None

    state = OrderedDict((name, _Tensor(str(i), a.shape, a.dtype == np.int64)) for i, (name, a) in enumerate(arrays.items()))
    top = state if key is None else {**(extra or {}), key: state}
    sys.modules["torch"], sys.modules["torch._utils"] = torch_mod, utils_mod
    try:
        import io

        buf = io.BytesIO()
        _Pickler(buf, protocol=2).dump(top)
    finally:
        for k in saved:
            sys.modules.pop(k, None)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        for i, a in enumerate(arrays.values()):
            z.writestr(f"archive/data/{i}", np.ascontiguousarray(a, "<i8" if a.dtype == np.int64 else "<f4").tobytes())
        z.writestr("archive/version", "3\n")
    return path


def test_image() -> np.ndarray:
    """A 200x152 RGB image with some structure (gradients and blobs) from the seed."""
    rng = np.random.default_rng(SEED + 1)
    yy, xx = np.mgrid[0:200, 0:152]
    img = np.stack([(xx * 255 // 151), (yy * 255 // 199), ((xx + yy) * 2) % 256], -1).astype(np.float64)
    for _ in range(12):
        cy, cx, r = rng.uniform(0, 200), rng.uniform(0, 152), rng.uniform(6, 20)
        col = rng.uniform(0, 255, 3)
        m = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        img[m] = col
    return img.astype(np.uint8)
