"""Reference for sdrt's HED and PiDiNet soft-edge preprocessors (softedge_hed, softedge_hedsafe, scribble_hed,
softedge_pidinet, softedge_pidisafe, scribble_pidinet): the networks are controlnet_aux 0.0.10's
``ControlNetHED_Apache2`` and ``pidinet()`` (the extension's annotator/hed and annotator/pidinet networks, the same
code), loaded from the seeded full-size files that tests/pipelines/softedge_helpers.py writes, as the extension
loads them (``torch.load``, PiDiNet's ``state_dict`` with ``module.`` dropped; unconverted pixel-difference convs);
everything around them is done as sd-webui-controlnet's scripts/processor.py and annotator/{hed,pidinet} do it
(resize_image_with_pad, apply_hed / apply_pidinet, safe_step, remove_pad, the scribble nms + blur + threshold),
with OpenCV and controlnet_aux's util (HWC3, nms, safe_step: the extension's functions).

TEED (softedge_teed) likewise: controlnet_aux's TED (the extension's annotator/teed network) on the seeded
7_model.pth, the extension's TEEDDetector steps around it, at Safe Steps 0, 2 (the default) and 5.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_softedge.py

Writes tests/data/softedge/refs.npz: the images; per case (resolution 72: the 100x72 image's own shorter side, so
the resize is a copy and only the padding acts; 96: OpenCV's cubic enlargement; 40: the 56x40 "small" image at its
own size, 64x64 padded, for the slow reference backend) the padded input the
networks read, the raw soft edges, and the six maps; and OpenCV's float INTER_LINEAR of small random planes.
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
    """The extension's: shorter side to ``resolution`` (cubic up, area otherwise), edges repeated to 64."""
    import cv2

    h_raw, w_raw = img.shape[:2]
    k = float(resolution) / float(min(h_raw, w_raw))
    h, w = int(np.round(float(h_raw) * k)), int(np.round(float(w_raw) * k))
    img = cv2.resize(img, (w, h), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    ph, pw = int(np.ceil(h / 64.0) * 64 - h), int(np.ceil(w / 64.0) * 64 - w)
    padded = np.pad(img, [[0, ph], [0, pw], [0, 0]], mode="edge")
    return np.ascontiguousarray(padded), (lambda x: np.ascontiguousarray(x[:h, :w]).copy())


def main() -> None:
    from softedge_helpers import test_image, write_hed, write_pidi, write_teed

    with tempfile.TemporaryDirectory() as tmp:
        hed_file = write_hed(Path(tmp) / "hed")
        pidi_file = write_pidi(Path(tmp) / "pidinet")
        teed_file = write_teed(Path(tmp) / "TEED")
        import cv2
        import torch  # after the files are written (write_pth refuses to run beside torch)
        from einops import rearrange

        torch.set_num_threads(2)
        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        pkg = types.ModuleType("controlnet_aux")
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg
        util = importlib.import_module("controlnet_aux.util")
        hed_mod = importlib.import_module("controlnet_aux.hed")
        pidi_model = importlib.import_module("controlnet_aux.pidi.model")
        ted = importlib.import_module("controlnet_aux.teed.ted")
        teed = ted.TED()
        teed.load_state_dict(torch.load(str(teed_file), map_location="cpu"))  # the extension's unsafe_torch_load
        teed.eval()

        hed = hed_mod.ControlNetHED_Apache2()
        hed.load_state_dict(torch.load(str(hed_file), map_location="cpu"))
        hed.float().eval()
        pidi = pidi_model.pidinet()
        ckp = torch.load(str(pidi_file), map_location="cpu")
        ckp = ckp.get("state_dict", ckp)
        pidi.load_state_dict({k.replace("module.", ""): v for k, v in ckp.items()})
        pidi.eval()

        def hed_edge(img: np.ndarray) -> np.ndarray:  # apply_hed up to the sigmoid
            H, W, _ = img.shape
            with torch.no_grad():
                x = rearrange(torch.from_numpy(img.copy()).float(), "h w c -> 1 c h w")
                edges = [e.detach().cpu().numpy().astype(np.float32)[0, 0] for e in hed(x)]
            edges = [cv2.resize(e, (W, H), interpolation=cv2.INTER_LINEAR) for e in edges]
            edges = np.stack(edges, axis=2)
            return 1 / (1 + np.exp(-np.mean(edges, axis=2).astype(np.float64)))

        def pidi_edge(img: np.ndarray) -> np.ndarray:  # apply_pidinet up to the last output
            bgr = img[:, :, ::-1].copy()
            with torch.no_grad():
                x = rearrange(torch.from_numpy(bgr).float() / 255.0, "h w c -> 1 c h w")
                return pidi(x)[-1].cpu().numpy()[0, 0]

        def teed_edge(img: np.ndarray) -> np.ndarray:  # TEEDDetector.__call__ up to the sigmoid
            H, W, _ = img.shape
            with torch.no_grad():
                x = rearrange(torch.from_numpy(img.copy()).float(), "h w c -> 1 c h w")
                edges = [e.detach().cpu().numpy().astype(np.float32)[0, 0] for e in teed(x)]
            edges = [cv2.resize(e, (W, H), interpolation=cv2.INTER_LINEAR) for e in edges]
            edges = np.stack(edges, axis=2)
            return 1 / (1 + np.exp(-np.mean(edges, axis=2).astype(np.float64)))

        def teed_map(edge: np.ndarray, safe_steps: int) -> np.ndarray:
            if safe_steps != 0:
                edge = util.safe_step(edge, safe_steps)
            return (edge * 255.0).clip(0, 255).astype(np.uint8)

        def to_map(edge: np.ndarray, safe: bool) -> np.ndarray:
            if safe:
                edge = util.safe_step(edge)
            return (edge * 255.0).clip(0, 255).astype(np.uint8)

        def scribble(result: np.ndarray) -> np.ndarray:  # scribble_hed / scribble_pidinet after the crop
            result = util.nms(result, 127, 3.0)
            result = cv2.GaussianBlur(result, (0, 0), 3.0)
            result[result > 4] = 255
            result[result < 255] = 0
            return result

        image, small = test_image(), test_image(56, 40, seed=6)
        out: dict[str, np.ndarray] = {"image": image, "small": small}
        for res, img in ((72, image), (96, image), (40, small)):
            padded, remove_pad = resize_image_with_pad(util.HWC3(img), res)
            he, pe = hed_edge(padded), pidi_edge(padded)
            out[f"input/{res}"] = padded
            out[f"hed_edge/{res}"] = he.astype(np.float32)
            out[f"pidi_edge/{res}"] = pe.astype(np.float32)
            te = teed_edge(padded)
            out[f"teed_edge/{res}"] = te.astype(np.float32)
            maps = {"softedge_hed": remove_pad(to_map(he, False)), "softedge_hedsafe": remove_pad(to_map(he, True)),
                    "softedge_pidinet": remove_pad(to_map(pe, False)),
                    "softedge_pidisafe": remove_pad(to_map(pe, True))}
            maps.update({f"softedge_teed_{k}": remove_pad(teed_map(te, k)) for k in (0, 2, 5)})
            maps["scribble_hed"] = scribble(maps["softedge_hed"])
            maps["scribble_pidinet"] = scribble(maps["softedge_pidinet"])
            for name, m in maps.items():
                out[f"map/{name}/{res}"] = m
                print(res, name, m.shape, "mean", round(float(m.mean()), 1), "levels", len(np.unique(m)),
                      "white", round(float((m == 255).mean()), 3))
    rng = np.random.default_rng(11)
    for f in (2, 4, 8, 16):
        a = (rng.standard_normal((5, 4)) * 3).astype(np.float32)
        out[f"lin_in/{f}"] = a
        out[f"lin_out/{f}"] = cv2.resize(a, (4 * f, 5 * f), interpolation=cv2.INTER_LINEAR)
    dest = ROOT / "tests" / "data" / "softedge" / "refs.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
