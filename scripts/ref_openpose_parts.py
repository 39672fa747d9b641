"""Reference for sdrt's ``openpose_hand``, ``openpose_face``, ``openpose_faceonly`` and ``openpose_full``:
controlnet_aux 0.0.10's OpenposeDetector with its Body, Hand and Face (the extension's body.py, hand.py, face.py,
model.py and util.handDetect / faceDetect, the same code) on the seeded full-size body_pose_model.pth,
hand_pose_model.pth and facenet.pth that tests/pipelines/openpose_helpers.py writes, on its 64x64 parts_image.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_openpose_parts.py

Writes tests/data/openpose/parts_refs.npz: the image; each person's body (fractions, NaN where missing), left and
right hand (float32 fractions, NaN when the hand is absent) and face keypoints (float32 fractions, ``face_n`` of
them, -1 without a face); the hand and face boxes and the peaks the networks found in them; the maps the four
modules draw (draw_poses with the extension's body / hand / face flags); the JSON the extension's
``json_pose_callback`` receives for openpose_full (its ``encode_poses_as_json``: body, face, hands as flat x, y,
1.0 lists, None for an absent part); both networks' heatmaps of a seeded 64x64 input; torch's bilinear
(align_corners=True) resize and skimage's 8-connected ``label`` of small random arrays.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _keypoints(points, n, dtype):
    out = np.full((n, 2), np.nan, dtype)
    for i, k in enumerate(points or []):
        if k is not None:
            out[i] = (k.x, k.y)
    return out


def _flat(points):
    """The extension's OpenPose JSON list of one part (x, y, 1.0 per keypoint; 0, 0, 0 for a missing one)."""
    if not points:
        return None
    return [v for k in points for v in ((float(k.x), float(k.y), 1.0) if k is not None else (0.0, 0.0, 0.0))]


def main() -> None:
    from openpose_helpers import make_face_weights, make_hand_weights, make_weights, parts_image, write_pth

    with tempfile.TemporaryDirectory() as tmp:
        body_pth = write_pth(Path(tmp) / "body_pose_model.pth", make_weights())
        hand_pth = write_pth(Path(tmp) / "hand_pose_model.pth", make_hand_weights())
        face_pth = write_pth(Path(tmp) / "facenet.pth", make_face_weights())
        import torch  # after write_pth, which refuses to run beside torch

        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        pkg = types.ModuleType("controlnet_aux")
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg  # only open_pose, not every annotator the package imports
        op = importlib.import_module("controlnet_aux.open_pose")
        from controlnet_aux.open_pose import util
        from controlnet_aux.open_pose.body import Body
        from controlnet_aux.open_pose.face import Face
        from controlnet_aux.open_pose.hand import Hand

        torch.set_num_threads(2)
        body, hand, face = Body(str(body_pth)), Hand(str(hand_pth)), Face(str(face_pth))
        calls: dict[str, list] = {"hand": [], "face": []}
        hand_call, face_call = Hand.__call__, Face.compute_peaks_from_heatmaps

        def hand_spy(self, crop):
            peaks = hand_call(self, crop)
            calls["hand"].append(np.asarray(peaks))
            return peaks

        def face_spy(self, heatmaps):
            peaks = face_call(self, heatmaps)
            calls["face"].append(np.asarray(peaks).reshape(-1, 2))
            return peaks

        Hand.__call__, Face.compute_peaks_from_heatmaps = hand_spy, face_spy
        det = op.OpenposeDetector(body, hand, face)
        image = parts_image()
        h, w = image.shape[:2]
        poses = det.detect_poses(image, include_hand=True, include_face=True)
        bgr = image[:, :, ::-1].copy()
        cand, subset = body(bgr)
        bodies = body.format_body_result(cand, subset)
        hand_boxes = [(i, *b) for i, bd in enumerate(bodies) for b in util.handDetect(bd, bgr)]
        face_boxes = [(i, *util.faceDetect(bd, bgr)) for i, bd in enumerate(bodies) if util.faceDetect(bd, bgr)]
        maps = {name: op.draw_poses(poses, h, w, draw_body=b, draw_hand=hd, draw_face=f)
                for name, b, hd, f in (("openpose_hand", True, True, False), ("openpose_face", True, False, True),
                                       ("openpose_faceonly", False, False, True),
                                       ("openpose_full", True, True, True))}
        pose_json = {"people": [{"pose_keypoints_2d": _flat(p.body.keypoints), "face_keypoints_2d": _flat(p.face),
                                 "hand_left_keypoints_2d": _flat(p.left_hand),
                                 "hand_right_keypoints_2d": _flat(p.right_hand)} for p in poses],
                     "animals": [], "canvas_height": h, "canvas_width": w}
        rng = np.random.default_rng(11)
        x = torch.from_numpy(rng.uniform(-0.5, 0.5, (1, 3, 64, 64)).astype(np.float32))
        with torch.no_grad():
            hand_net = hand.model(x).numpy()[0]
            face_net = face.model(x)[-1].numpy()[0]
            bil_in = (rng.standard_normal((3, 48, 48)) * 2).astype(np.float32)
            bil_29 = torch.nn.functional.interpolate(torch.from_numpy(bil_in)[None], (29, 37), mode="bilinear",
                                                     align_corners=True).numpy()[0]
            bil_53 = torch.nn.functional.interpolate(torch.from_numpy(bil_in)[None], (53, 53), mode="bilinear",
                                                     align_corners=True).numpy()[0]
    from skimage.measure import label

    blobs = rng.uniform(0, 1, (40, 50)) > 0.55
    labels = label(blobs.astype(np.uint8), connectivity=2)
    face_n = np.array([-1 if p.face is None else len(p.face) for p in poses])
    print("people", len(poses), "hand boxes", hand_boxes, "face boxes", face_boxes, "face keypoints", face_n.tolist(),
          "hand peaks missing", [int((c == 0).all(1).sum()) for c in calls["hand"]],
          "lit", {k: int(m.any(-1).sum()) for k, m in maps.items()})
    out = ROOT / "tests" / "data" / "openpose" / "parts_refs.npz"
    np.savez_compressed(
        out, image=image,
        body=np.stack([_keypoints(p.body.keypoints, 18, np.float64) for p in poses]),
        left=np.stack([_keypoints(p.left_hand, 21, np.float32) for p in poses]),
        right=np.stack([_keypoints(p.right_hand, 21, np.float32) for p in poses]),
        face=np.stack([_keypoints(p.face, 71, np.float32) for p in poses]), face_n=face_n,
        hand_boxes=np.array(hand_boxes, np.int64).reshape(-1, 5), face_boxes=np.array(face_boxes).reshape(-1, 4),
        hand_peaks=np.array(calls["hand"]).reshape(-1, 21, 2),
        face_peaks=np.concatenate(calls["face"]) if calls["face"] else np.zeros((0, 2)),
        face_peaks_n=np.array([len(c) for c in calls["face"]]),
        json=np.array(json.dumps(pose_json)), hand_net=hand_net, face_net=face_net,
        net_in=x.numpy(), bil_in=bil_in, bil_29=bil_29, bil_53=bil_53, blobs=blobs, labels=labels,
        **{f"map_{k}": m for k, m in maps.items()})
    print("wrote", out, out.stat().st_size)


if __name__ == "__main__":
    main()
