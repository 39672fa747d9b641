"""Reference DWPose maps for sdrt.pipelines.posedetect / posemaps (the dw_openpose_full preprocessor).

    /work/refvenv/bin/python scripts/gen_dwpose_refs.py    # tests/data/control/dwpose_refs.npz

Needs opencv-python-headless, onnxruntime, matplotlib and the ``dwpose`` 1.0.1 wheel (``pip install --no-deps
dwpose==1.0.1``: ComfyUI controlnet_aux's DWPose code; its ``dw_onnx/cv_ox_det.py``, ``cv_ox_pose.py`` and the
drawing in ``util.py`` are sd-webui-controlnet's ``annotator/openpose`` files, the same lines) in /work/refvenv;
sdrt never imports any of them. The wheel's package ``__init__`` downloads a torchvision model, so its modules are
loaded by path under a stub package. Its ``Wholebody`` runs the two ONNX stand-ins of
``tests/pipelines/dwpose_graphs.py`` with onnxruntime (ComfyUI's path) and with OpenCV's ``cv2.dnn`` (the
extension's path); the map is drawn by its ``draw_poses`` after sd-webui-controlnet's ``resize_image_with_pad``
(OpenCV's resize, edges repeated to multiples of 64, the map cropped back), as the extension's
``dw_openpose_full`` module runs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "control" / "dwpose_refs.npz"
sys.path.insert(0, str(ROOT / "tests" / "pipelines"))
import dwpose_graphs  # noqa: E402

SITE = Path(cv2.__file__).resolve().parents[1]
DW = SITE / "dwpose"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def dwpose_modules():
    pkg = types.ModuleType("dwref")
    pkg.__path__ = [str(DW)]
    sys.modules["dwref"] = pkg
    typ = _load("dwref.types", DW / "types.py")
    body = types.ModuleType("dwref.body")  # body.py needs torch models; util only wants its two types
    body.Keypoint, body.BodyResult = typ.Keypoint, typ.BodyResult
    sys.modules["dwref.body"] = body
    util = _load("dwref.util", DW / "util.py")
    sub = types.ModuleType("dwref.dw_onnx")
    sub.__path__ = [str(DW / "dw_onnx")]
    sys.modules["dwref.dw_onnx"] = sub
    det = _load("dwref.dw_onnx.cv_ox_det", DW / "dw_onnx" / "cv_ox_det.py")
    pose = _load("dwref.dw_onnx.cv_ox_pose", DW / "dw_onnx" / "cv_ox_pose.py")
    whole = _load("dwref.wholebody", DW / "wholebody.py")
    return util, det, pose, whole


def resize_image_with_pad(img: np.ndarray, resolution: int):
    """sd-webui-controlnet's ``resize_image_with_pad`` (its lines, with OpenCV)."""
    h, w = img.shape[:2]
    k = float(resolution) / float(min(h, w))
    interp = cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA
    ht, wt = int(np.round(float(h) * k)), int(np.round(float(w) * k))
    img = cv2.resize(img, (wt, ht), interpolation=interp)
    hp, wp = int(np.ceil(ht / 64.0) * 64 - ht), int(np.ceil(wt / 64.0) * 64 - wt)
    return np.pad(img, [[0, hp], [0, wp], [0, 0]], mode="edge"), (ht, wt)


def images() -> dict[str, np.ndarray]:
    out = {}
    yy, xx = np.mgrid[0:150, 0:200].astype(np.float64)
    a = np.stack([120 + 80 * np.sin(xx / 9.0), 100 + 50 * np.cos(yy / 13.0), 90 + 0.3 * xx], -1)
    a[:, 40:46, 0] = 250  # bright red stripes: the crops' column profiles move the argmax
    a[:, 120:123, 0] = 240
    out["stripes"] = np.clip(a, 0, 255).astype(np.uint8)
    yy, xx = np.mgrid[0:170, 0:130].astype(np.float64)
    b = np.stack([60 + 60 * ((xx // 16 + yy // 16) % 2), 128 + 0 * xx, 200 - yy], -1)
    b[50:58, :, 0] = 255
    out["checks"] = np.clip(b, 0, 255).astype(np.uint8)
    return out


CASES = [("stripes", 256), ("stripes", 160), ("checks", 192)]


def main() -> None:
    util, det_mod, pose_mod, whole_mod = dwpose_modules()
    import onnxruntime as ort

    tmp = Path(tempfile.mkdtemp())
    det_path, pose_path = dwpose_graphs.write(tmp)
    data: dict[str, np.ndarray] = {}
    imgs = images()
    for name, img in imgs.items():
        data[f"image/{name}"] = img
    sessions = {
        "ort": (ort.InferenceSession(det_path, providers=["CPUExecutionProvider"]),
                ort.InferenceSession(pose_path, providers=["CPUExecutionProvider"])),
        "cv2": (cv2.dnn.readNetFromONNX(det_path), cv2.dnn.readNetFromONNX(pose_path)),
    }
    meta = {}
    for name, res in CASES:
        padded, (ht, wt) = resize_image_with_pad(imgs[name], res)
        key = f"{name}_{res}"
        data[f"input/{key}"] = padded
        for kind, (sd, sp) in sessions.items():
            wb = whole_mod.Wholebody.__new__(whole_mod.Wholebody)
            wb.det, wb.pose = sd, sp
            wb.det_filename, wb.pose_filename = "yolox_l.onnx", "dw-ll_ucoco_384.onnx"
            wb.pose_input_size = (288, 384)
            info = wb(padded.copy())
            poses = whole_mod.Wholebody.format_result(info)
            h, w = padded.shape[:2]
            canvas = np.zeros((h, w, 3), np.uint8)
            for p in poses:  # the extension's draw_poses with body, hands and face
                canvas = util.draw_bodypose(canvas, p.body.keypoints)
                canvas = util.draw_handpose(canvas, p.left_hand)
                canvas = util.draw_handpose(canvas, p.right_hand)
                canvas = util.draw_facepose(canvas, p.face)
            data[f"keypoints/{kind}/{key}"] = np.zeros((0, 134, 3)) if info is None else info
            data[f"map/{kind}/{key}"] = np.ascontiguousarray(canvas[:ht, :wt])
            boxes = det_mod.inference_detector(sd, padded.copy())
            data[f"boxes/{kind}/{key}"] = boxes
            meta[key] = {"people": len(poses), "resolution": res}
            print(key, kind, "people", len(poses), "boxes", None if boxes is None else boxes.shape,
                  "map pixels", int((canvas > 0).any(2).sum()))
        diff = data[f"map/ort/{key}"] != data[f"map/cv2/{key}"]
        print(key, "ort vs cv2.dnn map: pixels differ", int(diff.any(2).sum()))
    # drawing alone: normalised and pixel JSON people, as the extension's renderer reads them
    rng = np.random.default_rng(3)
    pose_json = {"people": [], "canvas_width": 180, "canvas_height": 140}
    for scale in (180.0, 1.0):
        body = [[float(rng.uniform(5, 175) / (180 / scale)), float(rng.uniform(5, 135) / (180 / scale)),
                 float(rng.random() > 0.15)] for _ in range(18)]
        hand = [[float(rng.uniform(20, 170)), float(rng.uniform(20, 130)), 1.0] for _ in range(21)]
        face = [[float(rng.uniform(30, 150)), float(rng.uniform(10, 60)), float(rng.random() > 0.1)] for _ in range(70)]
        pose_json["people"].append({"pose_keypoints_2d": sum(body, []), "hand_left_keypoints_2d": sum(hand, []),
                                    "hand_right_keypoints_2d": None, "face_keypoints_2d": sum(face, [])})
    kp = sys.modules["dwref.types"].Keypoint

    def dec(nums):  # the extension's decode_json_as_poses: c below 1 is a missing keypoint
        if not nums:
            return None
        return [kp(x, y) if c >= 1.0 else None for x, y, c in zip(nums[0::3], nums[1::3], nums[2::3])]

    people = []
    for p in pose_json["people"]:
        people.append((dec(p["pose_keypoints_2d"]), dec(p["hand_left_keypoints_2d"]),
                       dec(p["hand_right_keypoints_2d"]), dec(p["face_keypoints_2d"])))
    canvas = np.zeros((140, 180, 3), np.uint8)
    for b, lh, rh, f in people:
        canvas = util.draw_bodypose(canvas, b)
        canvas = util.draw_handpose(canvas, lh)
        canvas = util.draw_handpose(canvas, rh)
        canvas = util.draw_facepose(canvas, f)
    # OpenCV's primitives alone, where the maps above may not reach: ellipses of every angle and long axes (the
    # sine table's 7 digits show), their fill with edges going left and right, thick lines, circles at the border
    rng = np.random.default_rng(11)
    n = 240
    cases = np.stack([rng.integers(-8, 56, n), rng.integers(-8, 56, n), rng.integers(0, 40, n),
                      rng.integers(1, 6, n), rng.integers(-360, 361, n)], 1)
    polys, fills = [], np.zeros((n, 48, 48), np.uint8)
    for k, (cx, cy, ax, bx, ang) in enumerate(cases):
        poly = cv2.ellipse2Poly((int(cx), int(cy)), (int(ax), int(bx)), int(ang), 0, 360, 1)
        polys.append(poly)
        tile = np.zeros((48, 48, 3), np.uint8)
        cv2.fillConvexPoly(tile, poly, [200, 100, 50])
        fills[k] = tile[..., 0]
    data["draw/ellipse_cases"] = cases
    data["draw/ellipse_counts"] = np.array([len(p) for p in polys])
    data["draw/ellipse_points"] = np.concatenate(polys)
    data["draw/ellipse_fills"] = fills
    big = [cv2.ellipse2Poly((0, 0), (100000, 70000), a, 0, 360, 1) for a in (0, 17, 45, 133)]
    data["draw/big_ellipses"] = np.stack(big)
    lines = np.concatenate([rng.integers(-30, 78, (n, 4)), rng.integers(1, 4, (n, 1))], 1)  # ends outside too
    strokes = np.zeros((n, 48, 48), np.uint8)
    for k, (x1, y1, x2, y2, t) in enumerate(lines):
        tile = np.zeros((48, 48, 3), np.uint8)
        cv2.line(tile, (int(x1), int(y1)), (int(x2), int(y2)), np.array([255.0, 0, 0]), thickness=int(t))
        cv2.circle(tile, (int(x2) - 24, int(y1)), int(t) + 2, (255, 0, 0), thickness=-1)
        strokes[k] = tile[..., 0]
    data["draw/line_cases"] = lines
    data["draw/lines"] = strokes
    data["json/render"] = np.frombuffer(json.dumps(pose_json).encode(), np.uint8)
    data["map/render"] = canvas
    data["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **data)
    print("wrote", OUT, OUT.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
