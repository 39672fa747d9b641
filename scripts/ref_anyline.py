"""Reference for sdrt's ``softedge_anyline`` (MistoLine's Anyline): sd-webui-controlnet's ``PreprocessorAnyline``
(scripts/preprocessor/teed.py) step for step, with controlnet_aux 0.0.10's TED (the extension's annotator/teed
network) on the seeded full-size ``MTEED.pth`` that tests/pipelines/anyline_helpers.py writes, loaded with
``torch.load`` as the extension's ``TEEDDetector(mteed=True)`` loads it, and OpenCV for everything the extension
does with it:

- ``resize_image_with_pad`` (the extension's), ``TEEDDetector.__call__`` (four outputs resized with
  ``cv2.resize`` INTER_LINEAR, mean, sigmoid, ``safe_step``, x255 to uint8), ``HWC3``;
- ``lineart_standard`` (scripts/preprocessor/legacy/processor.py) called as the extension calls it, on the already
  padded image with the resolution again (its own ``resize_image_with_pad`` and ``remove_pad``), ``HWC3``;
- ``get_intensity_mask(0, 1)``, ``morphology.remove_small_objects(min_size=36, connectivity=1)`` on the
  three-channel bool array, ``lineart * cleaned``, ``combine_layers`` in uint8, ``remove_pad``.

skimage 0.26 (refvenv) reads ``min_size=36`` as its new inclusive ``max_size=36``; the extension runs under A1111's
pinned scikit-image 0.21, where objects below 36 go: called here as ``max_size=35``, the same for whole sizes.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_anyline.py

Writes tests/data/anyline/refs.npz: the images; per case (the 100x72 image at resolution 64: area shrink and
padding; at 128: cubic enlargement; the 40x40 image at 64 for the slow reference backend) the padded input, the
MTEED map, the kept line layer and the final map at Safe Steps 2 (the default), 0 and 5; and random masks with
skimage's 12-pixel rule for the numpy connected components.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def resize_image_with_pad(img: np.ndarray, resolution: int):
    import cv2

    if img.ndim == 2:
        img = np.concatenate([img[:, :, None]] * 3, axis=2)
    h_raw, w_raw, _ = img.shape
    k = float(resolution) / float(min(h_raw, w_raw))
    h, w = int(np.round(float(h_raw) * k)), int(np.round(float(w_raw) * k))
    img = cv2.resize(img, (w, h), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    ph, pw = int(np.ceil(float(h) / 64.0) * 64 - h), int(np.ceil(float(w) / 64.0) * 64 - w)
    padded = np.pad(img, [[0, ph], [0, pw], [0, 0]], mode="edge")
    return np.ascontiguousarray(padded), (lambda x: np.ascontiguousarray(x[:h, :w]))


def lineart_standard(img: np.ndarray, res: int) -> np.ndarray:
    import cv2

    img, remove_pad = resize_image_with_pad(img, res)
    x = img.astype(np.float32)
    g = cv2.GaussianBlur(x, (0, 0), 6.0)
    intensity = np.min(g - x, axis=2).clip(0, 255)
    intensity /= max(16, np.median(intensity[intensity > 8]))
    intensity *= 127
    return remove_pad(intensity.clip(0, 255).astype(np.uint8))


def main() -> None:
    from anyline_helpers import line_image, write_mteed
    from softedge_helpers import test_image

    with tempfile.TemporaryDirectory() as tmp:
        mteed_file = write_mteed(Path(tmp) / "TEED")
        import cv2
        import torch  # after the file is written (write_pth refuses to run beside torch)
        from einops import rearrange
        from skimage import morphology

        torch.set_num_threads(2)
        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        pkg = types.ModuleType("controlnet_aux")
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg
        util = importlib.import_module("controlnet_aux.util")
        ted = importlib.import_module("controlnet_aux.teed.ted")
        net = ted.TED()
        net.load_state_dict(torch.load(str(mteed_file), map_location="cpu"))
        net.eval()

        def mteed(image: np.ndarray, safe_steps: int) -> np.ndarray:  # TEEDDetector.__call__
            H, W, _ = image.shape
            with torch.no_grad():
                x = rearrange(torch.from_numpy(image.copy()).float(), "h w c -> 1 c h w")
                edges = [e.detach().cpu().numpy().astype(np.float32)[0, 0] for e in net(x)]
            edges = [cv2.resize(e, (W, H), interpolation=cv2.INTER_LINEAR) for e in edges]
            edges = np.stack(edges, axis=2)
            edge = 1 / (1 + np.exp(-np.mean(edges, axis=2).astype(np.float64)))
            if safe_steps != 0:
                edge = util.safe_step(edge, safe_steps)
            return (edge * 255.0).clip(0, 255).astype(np.uint8)

        def get_intensity_mask(a, lower_bound, upper_bound):
            mask = a[:, :, 0]
            mask = np.where((mask >= lower_bound) & (mask <= upper_bound), mask, 0)
            return np.expand_dims(mask, 2).repeat(3, axis=2)

        def combine_layers(base_layer, top_layer):
            mask = top_layer.astype(bool)
            temp = 1 - (1 - top_layer) * (1 - base_layer)
            return base_layer * (~mask) + temp * mask

        def anyline(image: np.ndarray, resolution: int, safe_steps: int):  # PreprocessorAnyline.__call__
            img, remove_pad = resize_image_with_pad(image, resolution)
            mteed_result = util.HWC3(mteed(img, safe_steps))
            lineart_result = util.HWC3(lineart_standard(img, resolution))
            lineart_result = get_intensity_mask(lineart_result, lower_bound=0, upper_bound=1)
            cleaned = morphology.remove_small_objects(lineart_result.astype(bool), max_size=35, connectivity=1)
            lineart_result = lineart_result * cleaned
            final = combine_layers(mteed_result, lineart_result)
            assert final.dtype == np.uint8
            return img, remove_pad(mteed_result), remove_pad(lineart_result), remove_pad(final)

        out: dict[str, np.ndarray] = {"image": line_image(), "small": line_image(40, 40, seed=8, slope=2.0),
                                      "photo": test_image()}
        for case, key, res in (("64", "image", 64), ("128", "image", 128), ("small", "small", 64),
                               ("photo", "photo", 128)):
            for steps in (2, 0, 5):
                img, m, layer, final = anyline(out[key], res, steps)
                if steps == 2:
                    out[f"input/{case}"] = img
                    out[f"layer/{case}"] = layer[:, :, 0].astype(bool)
                out[f"mteed/{case}/{steps}"] = m[:, :, 0]
                out[f"map/{case}/{steps}"] = final
                assert np.array_equal(final[:, :, 0], final[:, :, 2])
            lv = lineart_standard(img, res)
            ones = (lv == 1).sum()
            print(case, "padded", img.shape, "map", final.shape, "level-1 pixels", int(ones), "kept",
                  int(out[f"layer/{case}"].sum()), "mteed levels", np.unique(out[f"mteed/{case}/2"]))
    rng = np.random.default_rng(12)
    for k in range(6):
        h, w = (int(v) for v in rng.integers(5, 48, 2))
        m = rng.random((h, w)) < rng.uniform(0.15, 0.6)
        out[f"cc_in/{k}"] = m
        out[f"cc_out/{k}"] = morphology.remove_small_objects(np.repeat(m[:, :, None], 3, 2), max_size=35,
                                                             connectivity=1)[:, :, 0]
    dest = ROOT / "tests" / "data" / "anyline" / "refs.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **out)
    sizes = [np.bincount(__import__("scipy.ndimage", fromlist=["label"]).label(out[f"cc_in/{k}"])[0].ravel())[1:]
             for k in range(6)]
    print("random masks: components of exactly 12 pixels", sum(int((s == 12).sum()) for s in sizes))
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
