"""Reference for sdrt's ``openpose`` (body) preprocessor: controlnet_aux 0.0.10's OpenposeDetector (the
extension's body.py, model.py and draw_poses, same code) on the seeded full-size body_pose_model.pth that
tests/pipelines/openpose_helpers.py writes, drawn at the image's size with hands and face off.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_openpose_body.py

Writes tests/data/openpose/body_refs.npz: the image, the map, candidate and subset. controlnet_aux's package
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
    out = ROOT / "tests" / "data" / "openpose" / "body_refs.npz"
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, image=image, map=canvas, candidate=np.asarray(candidate, np.float64).reshape(-1, 4),
                        subset=np.asarray(subset, np.float64).reshape(-1, 20))
    print("wrote", out)


if __name__ == "__main__":
    main()
