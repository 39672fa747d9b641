"""Reference for sdrt's ``openpose`` (body) preprocessor: controlnet_aux 0.0.10's OpenposeDetector (the
extension's body.py, model.py and draw_poses, same code) on the seeded full-size body_pose_model.pth that
tests/pipelines/openpose_helpers.py writes, drawn at the image's size with hands and face off.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_openpose_body.py

Writes tests/data/openpose/body_refs.npz: the image, the map, candidate and subset, and OpenCV's Lanczos-4
(float32, uint8) and area (float32) resizes and scipy's gaussian_filter(sigma=3) of small random arrays. controlnet_aux's package
__init__ imports every annotator (torchvision, timm); only its open_pose package is loaded here, with
face.py's torchvision import stubbed (the face model is not used).
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from openpose_helpers import make_weights, test_image, write_pth

    with tempfile.TemporaryDirectory() as tmp:
        pth = write_pth(Path(tmp) / "body_pose_model.pth", make_weights())
        import torch  # after write_pth, which refuses to run beside torch

        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        pkg = types.ModuleType("controlnet_aux")
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg
        tv, tvt = types.ModuleType("torchvision"), types.ModuleType("torchvision.transforms")
        tvt.ToPILImage = tvt.ToTensor = object  # face.py's imports; the face model is not used here
        sys.modules.setdefault("torchvision", tv)
        sys.modules.setdefault("torchvision.transforms", tvt)
        op = importlib.import_module("controlnet_aux.open_pose")
        from controlnet_aux.open_pose.body import Body

        body = Body(str(pth))
        det = op.OpenposeDetector(body, None, None)
        torch.set_num_threads(2)
        image = test_image()
        poses = det.detect_poses(image, include_hand=False, include_face=False)
        h, w = image.shape[:2]
        canvas = op.draw_poses(poses, h, w, draw_body=True, draw_hand=False, draw_face=False)
        candidate, subset = body(np.ascontiguousarray(image[:, :, ::-1]))
    print("candidates", len(candidate), "people", len(subset), "parts", [int(s[-1]) for s in subset],
          "lit pixels", int((canvas.sum(-1) > 0).sum()))
    import cv2
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(7)
    prims = {"lz_in": (rng.standard_normal((23, 19)) * 3).astype(np.float32),
             "lz8_in": rng.integers(0, 256, (30, 21, 3), dtype=np.uint8),
             "area_in": (rng.standard_normal((184, 144)) * 3).astype(np.float32),
             "gauss_in": rng.standard_normal((40, 31)) * 2}
    prims["lz_out"] = cv2.resize(prims["lz_in"], (19 * 8, 23 * 8), interpolation=cv2.INTER_LANCZOS4)
    prims["lz_odd_out"] = cv2.resize(prims["lz_in"], (37, 61), interpolation=cv2.INTER_LANCZOS4)
    prims["lz8_out"] = cv2.resize(prims["lz8_in"], (34, 49), interpolation=cv2.INTER_LANCZOS4)
    prims["area_out"] = cv2.resize(prims["area_in"], (117, 150), interpolation=cv2.INTER_AREA)
    prims["gauss_out"] = gaussian_filter(prims["gauss_in"], sigma=3)
    out = ROOT / "tests" / "data" / "openpose" / "body_refs.npz"
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, image=image, map=canvas, candidate=np.asarray(candidate, np.float64).reshape(-1, 4),
                        subset=np.asarray(subset, np.float64).reshape(-1, 20), **prims)
    print("wrote", out)


if __name__ == "__main__":
    main()
