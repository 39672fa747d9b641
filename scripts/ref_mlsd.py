"""Reference for sdrt's ``mlsd`` preprocessor: M-LSD as sd-webui-controlnet runs it, on the seeded full-size
mlsd_large_512_fp32.pth that tests/pipelines/mlsd_helpers.py writes.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_mlsd.py

The network and the line decoding are controlnet_aux 0.0.10's (``MobileV2_MLSD_Large`` and ``pred_lines``, the
extension's annotator/mlsd code less its device handling), loaded with ``torch.load`` and
``load_state_dict(strict=True)``. Around them, this script follows the extension: its processor's
``resize_image_with_pad`` (shorter side to the resolution, INTER_CUBIC up / INTER_AREA down, edges repeated to
multiples of 64), ``apply_mlsd`` (``pred_lines`` at the padded image's own size, each line drawn with
``cv2.line(..., [255, 255, 255], 1)`` inside its ``try``/``except``, channel 0) and the crop back. controlnet_aux's
own ``MLSDdetector.__call__`` resizes to multiples of 64 instead of padding; the extension wins.

Writes tests/data/mlsd/mlsd_refs.npz: the image; maps at three resolutions and two threshold pairs (and OpenCV's
padded input at 96, where its bicubic enlarges); the lines and
the network's channels 7-11 for the image padded at its own size; and cv2.line of random segments (many past the
edges, some far) on a small canvas, one canvas per segment.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def resize_image_with_pad(img, resolution):
    """sd-webui-controlnet's scripts/preprocessor/legacy/processor.py resize_image_with_pad (an RGB image)."""
    import cv2

    h_raw, w_raw = img.shape[:2]
    k = float(resolution) / float(min(h_raw, w_raw))
    interpolation = cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA
    h_t, w_t = int(np.round(float(h_raw) * k)), int(np.round(float(w_raw) * k))
    img = cv2.resize(img, (w_t, h_t), interpolation=interpolation)
    h_pad, w_pad = int(np.ceil(h_t / 64.0) * 64 - h_t), int(np.ceil(w_t / 64.0) * 64 - w_t)
    return np.pad(img, [[0, h_pad], [0, w_pad], [0, 0]], mode="edge"), (h_t, w_t)


def apply_mlsd(model, pred_lines, img, thr_v, thr_d):
    """The extension's annotator/mlsd apply_mlsd after the model is loaded."""
    import cv2
    import torch

    img_output = np.zeros_like(img)
    try:
        with torch.no_grad():
            lines = pred_lines(img, model, [img.shape[0], img.shape[1]], thr_v, thr_d)
            for line in lines:
                x_start, y_start, x_end, y_end = [int(val) for val in line]
                cv2.line(img_output, (x_start, y_start), (x_end, y_end), [255, 255, 255], 1)
    except Exception as exc:  # noqa: BLE001 - the extension's bare except, reported here
        print("apply_mlsd: the extension's except caught", type(exc).__name__, exc)
    return img_output[:, :, 0]


def mlsd(model, pred_lines, img, res, thr_v, thr_d):
    """The extension's processor ``mlsd``: padded, detected, cropped."""
    padded, (h, w) = resize_image_with_pad(img, res)
    return apply_mlsd(model, pred_lines, padded, thr_v, thr_d)[:h, :w]


def main() -> None:
    from mlsd_helpers import test_image, write_file

    with tempfile.TemporaryDirectory() as tmp:
        pth = write_file(Path(tmp))
        import torch  # after write_pth, which refuses to run beside torch

        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        pkg = types.ModuleType("controlnet_aux")  # its __init__ imports every annotator; only mlsd is needed
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg
        large = importlib.import_module("controlnet_aux.mlsd.models.mbv2_mlsd_large")
        utils = importlib.import_module("controlnet_aux.mlsd.utils")
        model = large.MobileV2_MLSD_Large()
        state = torch.load(pth)
        assert any(k.endswith("num_batches_tracked") for k in state)
        model.load_state_dict(state, strict=True)
        model.eval()
    torch.set_num_threads(2)
    image = test_image()
    h, w = image.shape[:2]
    out = {"image": image}
    for key, res, tv, td in (("map_own", min(h, w), 0.1, 0.1), ("map_64", 64, 0.1, 0.1),
                             ("map_96", 96, 0.1, 0.1), ("map_own_strict", min(h, w), 0.3, 4.0)):
        out[key] = mlsd(model, utils.pred_lines, image, res, tv, td)
        print(key, out[key].shape, "lit", int((out[key] > 0).sum()))
    # OpenCV's INTER_CUBIC (enlarging to 96) differs from sdrt's bicubic by a level on a few values: its padded
    # image is kept, so that the map can be checked from the same input as well as through sdrt's resize
    out["pad_96"] = resize_image_with_pad(image, 96)[0]
    padded, _ = resize_image_with_pad(image, min(h, w))
    out["lines_own"] = np.asarray(utils.pred_lines(padded, model, list(padded.shape[:2]), 0.1, 0.1), np.float64)
    x = np.concatenate([padded, np.ones(padded.shape[:2] + (1,))], axis=-1).transpose(2, 0, 1)[None]
    x = torch.from_numpy((x.astype("float32") / 127.5) - 1.0).float()
    with torch.no_grad():
        out["net_own"] = model(x)[0, :5].numpy()  # forward returns the head's channels 7..: centres, displacements
    print("lines", len(out["lines_own"]), "net", out["net_own"].shape)

    # the decoding alone, on a made-up head output with over 200 local maxima (so the top-200 cut binds) and some
    # flat tops (two equal neighbours, both kept by max_pool2d's ==), through pred_lines with a stand-in model
    rng = np.random.default_rng(5)
    tp = np.zeros((1, 9, 60, 50), np.float32)
    tp[0, 0] = rng.standard_normal((60, 50)) * 2.0
    tp[0, 1:5] = rng.standard_normal((4, 60, 50)) * 4.0
    flat = 0
    for y, x in zip(*np.nonzero(tp[0, 0] > 3.5)):
        if x + 1 < 50 and flat < 6:
            tp[0, 0, y, x + 1] = tp[0, 0, y, x]
            flat += 1

    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            assert tuple(x.shape) == (1, 4, 120, 100)
            return torch.from_numpy(tp)

    fake = np.zeros((120, 100, 3), np.uint8)
    out["dec_head"] = tp[0]
    with torch.no_grad():
        out["dec_lines"] = np.asarray(utils.pred_lines(fake, Fixed(), [120, 100], 0.96, 3.0), np.float64)
        pts, scores, _ = utils.deccode_output_score_and_ptss(torch.from_numpy(tp), 200, 3)
    out["dec_pts"], out["dec_scores"] = np.asarray(pts, np.int64), np.asarray(scores, np.float32)
    print("decode: lines", len(out["dec_lines"]), "200th score", scores[-1], "flat tops", flat)

    import cv2

    rng = np.random.default_rng(11)
    ch, cw, n = 37, 53, 400
    segs = np.concatenate([rng.integers(-20, 75, (n - 40, 4)), rng.integers(-5000, 5000, (30, 4)),
                           rng.integers(-(2 ** 31), 2 ** 31 - 1, (10, 4))]).astype(np.int64)
    canvases = np.zeros((len(segs), ch, cw), np.uint8)
    for i, (x0, y0, x1, y1) in enumerate(segs):
        c = np.zeros((ch, cw, 3), np.uint8)
        cv2.line(c, (int(x0), int(y0)), (int(x1), int(y1)), [255, 255, 255], 1)
        canvases[i] = c[:, :, 0]
    out["cv_segments"], out["cv_lines"] = segs, canvases
    dest = ROOT / "tests" / "data" / "mlsd" / "mlsd_refs.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
