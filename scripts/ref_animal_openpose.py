"""Reference animal pose maps for sdrt.pipelines.animalpose (the ``animal_openpose`` preprocessor).

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_animal_openpose.py [EXT]

EXT: a checkout of sd-webui-controlnet (default: the mirror at /work/.mirror/Mikubill+sd-webui-controlnet/repo, a
bare git directory: its files are read with ``git show``). Its ``annotator/openpose/animalpose.py``,
``cv_ox_det.py``, ``cv_ox_pose.py`` and ``types.py`` are copied into a temporary folder (never into this
repository) and loaded there under a stub package: the extension's ``AnimalPose`` runs the two ONNX stand-ins of
``tests/pipelines/animal_graphs.py`` with OpenCV's ``cv2.dnn`` (its path; onnxruntime's too, for comparison) on the
image after the extension's ``resize_image_with_pad``; the map is its ``draw_animalposes`` cropped back, the JSON its
``encode_poses_as_json`` (written out here: that module's ``__init__`` loads the torch OpenPose models).

Writes tests/data/control/animal_refs.npz: per case the padded input, the boxes, the animals (x, y, score), the
map and the JSON; and ``draw_animalposes`` alone on random animals (points outside the canvas too).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "control" / "animal_refs.npz"
sys.path.insert(0, str(ROOT / "tests" / "pipelines"))
import animal_graphs  # noqa: E402
from gen_dwpose_refs import images, resize_image_with_pad  # noqa: E402

FILES = ("animalpose.py", "cv_ox_det.py", "cv_ox_pose.py", "types.py")


def extension_modules(ext: str, into: Path):
    for name in FILES:
        text = subprocess.run(["git", "--git-dir", ext, "show", f"HEAD:annotator/openpose/{name}"], check=True,
                              capture_output=True, text=True).stdout
        (into / name).write_text(text)
    pkg = types.ModuleType("extpose")
    pkg.__path__ = [str(into)]
    sys.modules["extpose"] = pkg
    mods = {}
    for name in ("types", "cv_ox_det", "cv_ox_pose", "animalpose"):
        spec = importlib.util.spec_from_file_location(f"extpose.{name}", into / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"extpose.{name}"] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods


def encode(animals, h: int, w: int) -> dict:  # the extension's encode_poses_as_json with no people
    def compress(keypoints):
        if not keypoints:
            return None
        return [v for k in keypoints for v in ([float(k.x), float(k.y), 1.0] if k is not None else [0.0, 0.0, 0.0])]

    return {"people": [], "animals": [compress(a) for a in animals], "canvas_height": h, "canvas_width": w}


def main() -> None:
    ext = sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror/Mikubill+sd-webui-controlnet/repo"
    import onnxruntime as ort

    tmp = Path(tempfile.mkdtemp())
    mods = extension_modules(ext, tmp)
    ap_mod, det_mod = mods["animalpose"], mods["cv_ox_det"]
    det, pose = animal_graphs.write(tmp / "models")
    none_det = tmp / "none" / "yolox_l.onnx"
    none_det.parent.mkdir()
    animal_graphs.detector(none_det, animal_graphs.NONE)
    data: dict[str, np.ndarray] = {}
    imgs = images()
    for name, img in imgs.items():
        data[f"image/{name}"] = img
    cases = [("stripes", 256, det), ("stripes", 160, det), ("checks", 192, det), ("checks", 192, none_det)]
    meta = {}
    for name, res, det_path in cases:
        key = f"{name}_{res}" + ("_none" if det_path == none_det else "")
        padded, (ht, wt) = resize_image_with_pad(imgs[name], res)
        data[f"input/{key}"] = padded
        ext_ap = ap_mod.AnimalPose(str(det_path), str(pose))  # cv2.dnn, as the extension loads them
        animals = ext_ap(padded.copy())
        h, w = padded.shape[:2]
        canvas = ap_mod.draw_animalposes(animals, h, w)
        data[f"map/{key}"] = np.ascontiguousarray(canvas[:ht, :wt])
        data[f"animals/{key}"] = np.array([[[k.x, k.y, k.score] for k in a] for a in animals]).reshape(-1, 17, 3)
        boxes = det_mod.inference_detector(ext_ap.session_det, padded.copy(), detect_classes=list(range(14, 24)))
        data[f"boxes/{key}"] = np.zeros((0, 4)) if boxes is None else boxes
        js = encode(animals, h, w)
        data[f"json/{key}"] = np.frombuffer(json.dumps(js).encode(), np.uint8)
        # onnxruntime (ComfyUI's path) through the same functions, for comparison
        ort_ap = ap_mod.AnimalPose.__new__(ap_mod.AnimalPose)
        ort_ap.session_det = ort.InferenceSession(str(det_path), providers=["CPUExecutionProvider"])
        ort_ap.session_pose = ort.InferenceSession(str(pose), providers=["CPUExecutionProvider"])
        ort_ap.model_input_size = (256, 256)
        o = ort_ap(padded.copy())
        diff = max((abs(a.x - b.x) + abs(a.y - b.y) for x, y in zip(animals, o) for a, b in zip(x, y)), default=0)
        meta[key] = {"animals": len(animals), "resolution": res}
        print(key, "animals", len(animals), "boxes", data[f"boxes/{key}"].shape, "map pixels",
              int((canvas > 0).any(2).sum()), "ort vs cv2.dnn: animals", len(o), "largest keypoint move", diff)
    rng = np.random.default_rng(5)
    kp = mods["types"].Keypoint
    drawn = []
    for k in range(3):
        pts = rng.uniform(-40, 200, (rng.integers(1, 4), 17, 2))
        animals = [[kp(float(x), float(y), 1.0) for x, y in a] for a in pts]
        data[f"draw/points/{k}"] = pts
        drawn.append(ap_mod.draw_animalposes(animals, 150, 170))
        data[f"draw/map/{k}"] = drawn[-1]
    data["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **data)
    print("wrote", OUT, OUT.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
