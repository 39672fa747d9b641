"""Reference for sdrt's ``depth_leres++`` preprocessor: LeReS inside BoostingMonocularDepth's merge as
sd-webui-controlnet runs it, on the seeded files tests/pipelines/leres_helpers.py writes (the narrow res101.pth and a
narrow latest_net_G.pth; the full-size latest_net_G.pth for the merge network alone).

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_leres_boost.py

The networks are controlnet_aux 0.0.10's (the extension's annotator/leres code): the narrow ``RelDepthModel`` of
scripts/ref_leres.py and ``Pix2Pix4DepthModel`` (its options parsed by ``TestOptions().parse()``, CPU, its ``netG``
the ``UnetGenerator(2, 1, 10, ngf)`` of ``networks`` with no normalisation, ``load_networks('latest')`` from the
folder, ``eval()``), as the extension builds it; for the narrow file ``netG`` is that generator at ``ngf`` 4. Around
them: the extension's processor ``leres`` (``resize_image_with_pad`` and the crop) and, in between,
controlnet_aux's ``LeresDetector.__call__(boost=True)`` on the padded image at its own size, which is the extension's
``apply_leres`` (``estimateboost(img, model, 0, pix2pixmodel, max(width, height))``: the two files' ``depthmap.py``
differ only in where the R_max option and the device come from).

Writes tests/data/leres/leres_boost_refs.npz: a 200 x 150 image's map (no patches: its padded longer side is under
R_x), with and without the sliders, and its merged depth; a 448 x 448 picture's map, its merged depth (every 4th row
and column) and the R_x and patch scale BoostingMonocularDepth's ``calculateprocessingres`` gives it (its patches
run); the generators' raw outputs (every 8th row and column) for a seeded pair, narrow and full-size; R_x and the
patch scale of a few more pictures (``res_cases``; ``--res-cases`` adds them alone); the patches ``generatepatchs``
selects on a few pictures at a few factors, grown inside the image (``patch_cases``; ``--patch-cases`` adds them alone).
"""

from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def pair(seed: int = 11) -> np.ndarray:
    """A seeded (2, 1024, 1024) float32 input: smooth ramps and bumps, the merge network's kind of input."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:1024, 0:1024] / 1023.0
    a = np.sin(3 * xx + rng.uniform()) * np.cos(2 * yy) + 0.3 * rng.standard_normal((1024, 1024)) * 0.1
    b = xx * yy + 0.2 * np.sin(9 * xx)
    return np.stack([a, b]).astype(np.float32)


def pix2pix(folder: Path, ngf: int):
    """The extension's Pix2Pix4DepthModel, loaded from ``folder`` (its netG at width ``ngf``)."""
    from controlnet_aux.leres.pix2pix.models import networks
    from controlnet_aux.leres.pix2pix.models.pix2pix4depth_model import Pix2Pix4DepthModel
    from controlnet_aux.leres.pix2pix.options.test_options import TestOptions

    argv, sys.argv = sys.argv, [sys.argv[0]]
    try:
        opt = TestOptions().parse()
    finally:
        sys.argv = argv
    opt.gpu_ids = []
    model = Pix2Pix4DepthModel(opt)
    if ngf != 64:
        model.netG = networks.UnetGenerator(2, 1, 10, ngf, norm_layer=networks.get_norm_layer("none"))
    model.save_dir = str(folder)
    model.load_networks("latest")
    model.eval()
    return model


def raw_merge(model, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model.netG(torch.from_numpy(x)[None])[0, 0].numpy()


def boosted(model, merge, img, res, thr_a=0, thr_b=0):
    """The extension's processor ``leres`` with boost: padded, ``apply_leres(boost=True)``, cropped; the merged
    depth of the padded image too."""
    from controlnet_aux.leres import LeresDetector
    from controlnet_aux.leres.leres.depthmap import estimateboost
    from ref_mlsd import resize_image_with_pad

    padded, (h, w) = resize_image_with_pad(img, res)
    side = min(padded.shape[:2])
    made = LeresDetector(model, merge)(padded, thr_a, thr_b, boost=True, detect_resolution=side,
                                      image_resolution=side, output_type="np")
    assert made.shape[:2] == padded.shape[:2]
    raw = estimateboost(padded, model, 0, merge, max(padded.shape[:2]))
    return made[:h, :w, 0].copy(), padded, np.asarray(raw, np.float32)


#: images whose R_x and patch scale are recorded (``res_cases``): boost_image's busy part (fy, fx), or test_image
RES_CASES = (("boost", 1.0, 0.15), ("boost", 0.7, 0.7), ("boost", 1.0, 0.75), ("boost", 0.2, 0.2), ("test", 300, 400),
             ("test", 512, 640))


def res_case(kind: str, a: float, b: float) -> np.ndarray:
    from leres_helpers import boost_image, test_image

    return boost_image(fy=a, fx=b) if kind == "boost" else test_image(int(a), int(b))


def res_cases() -> np.ndarray:
    """``calculateprocessingres(img, 448, 0.2, 3, 1600)`` (R_x, patch scale) of each of RES_CASES, as
    ``estimateboost`` calls it."""
    from controlnet_aux.leres.leres import depthmap

    return np.array([depthmap.calculateprocessingres(res_case(*c), 448, 0.2, 3, 1600) for c in RES_CASES])


#: images and factors whose selected patches are recorded (``patch_cases``): patch_image's (height, width, busy
#: centre y, x as fractions), factor; patches inside the image that grow by int(32 / factor) while dense enough
PATCH_CASES = (((1400, 1800, 0.5, 0.5), 0.32), ((1400, 1800, 0.35, 0.6), 0.6), ((1800, 1400, 0.6, 0.4), 0.2),
               ((1600, 1600, 0.5, 0.3), 1.0))


def patch_image(h: int, w: int, cy: float, cx: float) -> np.ndarray:
    """A smooth picture with a busy disc (stripes) of radius a fifth of the shorter side about (cy, cx)."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 200 // (w - 1), yy * 200 // (h - 1), np.full_like(xx, 90)], -1).astype(float)
    busy = (yy - cy * h) ** 2 + (xx - cx * w) ** 2 < (min(h, w) / 5) ** 2
    img[busy] = np.stack([((xx + yy) // 7 % 2) * 220, ((xx - 2 * yy) // 11 % 2) * 160, (xx // 5 % 3) * 70], -1)[busy]
    return img.astype(np.uint8)


def patch_cases() -> np.ndarray:
    """The extension's ``generatepatchs(img, 896)`` (with ``adaptiveselection``'s global ``factor``) of each of
    PATCH_CASES: rows (case, x, y, w, h) in its order (biggest first)."""
    from controlnet_aux.leres.leres import depthmap

    rows = []
    for i, (spec, factor) in enumerate(PATCH_CASES):
        depthmap.factor = factor
        for _, p in depthmap.generatepatchs(patch_image(*spec), 896):
            rows.append([i, *p["rect"]])
    return np.array(rows, np.int64)


def main() -> None:
    from leres_helpers import NARROW_NGF, boost_image, test_image, write_file, write_generator

    with tempfile.TemporaryDirectory() as tmp:
        tiny_pth = write_file(Path(tmp) / "tiny", tiny=True)
        tiny_g = write_generator(Path(tmp) / "tiny", NARROW_NGF)
        full_g = write_generator(Path(tmp) / "full", 64)
        import torch  # after write_pth, which refuses to run beside torch

        torch.set_num_threads(2)
        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        pkg = types.ModuleType("controlnet_aux")  # its __init__ imports every annotator; only leres is needed
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg
        from ref_leres import load, narrow_model

        leres = load(narrow_model(), tiny_pth)
        merge = pix2pix(tiny_g.parent, NARROW_NGF)
        full_merge = pix2pix(full_g.parent, 64)
        print("full-size generator", full_g.stat().st_size, "bytes,",
              sum(p.numel() for p in full_merge.netG.parameters()), "values")

    from controlnet_aux.leres.leres import depthmap

    out = {}
    x = pair()
    out["pair_tiny"] = raw_merge(merge, x)[::8, ::8].copy()
    out["pair_full"] = raw_merge(full_merge, x)[::8, ::8].copy()
    print("merge raw", out["pair_tiny"].std(), out["pair_full"].std())

    small = test_image(150, 200)  # padded 192 x 256: under R_x, the double estimate alone
    out["small_image"] = small
    out["small_map"], padded, out["small_raw"] = boosted(leres, merge, small, 150)
    out["small_map_thr"], _, _ = boosted(leres, merge, small, 150, 10, 40)
    print("small", padded.shape, out["small_map"].mean(), out["small_map"].std())

    big = boost_image()
    out["big_image"] = big
    r, scale = depthmap.calculateprocessingres(big, 448, 0.2, 3, 1600)
    depthmap.factor = factor = max(min(1, 4 * scale * r / 1600), 0.2)
    out["big_r"], out["big_scale"] = np.array(r), np.array(scale)
    print("big: R_x", r, "patch scale", scale, "factor", factor)
    out["big_map"], padded, raw = boosted(leres, merge, big, 448)
    out["big_raw"] = raw[::4, ::4].copy()  # every 4th row and column: the fixtures stay small
    print("big", padded.shape, out["big_map"].mean(), out["big_map"].std())
    out["res_cases"] = res_cases()
    print("res cases", out["res_cases"].tolist())
    out["patch_cases"] = patch_cases()
    dest = ROOT / "tests" / "data" / "leres" / "leres_boost_refs.npz"
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    if sys.argv[1:] in (["--res-cases"], ["--patch-cases"]):  # only those, added to the file main() wrote
        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        sys.modules["controlnet_aux"] = types.ModuleType("controlnet_aux")
        sys.modules["controlnet_aux"].__path__ = [str(site / "controlnet_aux")]
        dest = ROOT / "tests" / "data" / "leres" / "leres_boost_refs.npz"
        data = dict(np.load(dest))
        if sys.argv[1] == "--res-cases":
            data["res_cases"] = res_cases()
            print("res cases", data["res_cases"].tolist())
        else:
            data["patch_cases"] = patch_cases()
            print("patch cases", data["patch_cases"].tolist())
        np.savez_compressed(dest, **data)
    else:
        main()
