"""Reference for sdrt's lineart_realistic / lineart_coarse / lineart_anime preprocessors: controlnet_aux 0.0.10's
networks (informative-drawings' Generator, the anime UnetGenerator; the extension's annotator code has the same
classes) loaded with ``torch.load`` from the seeded full-size files that tests/pipelines/lineart_helpers.py
writes, and the extension's code around them (scripts/preprocessor/legacy/processor.py: resize_image_with_pad,
the detector, ``255 - line``, remove_pad; annotator/lineart_anime: the INTER_CUBIC resizes to multiples of 256
and back), written here from its reading.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_lineart.py [EXTENSION]

lineart_anime_denoise's network (MangaLineExtraction's res_skip, annotator/manga_line) is not in controlnet_aux:
its class is read from a checkout of sd-webui-controlnet, EXTENSION (a work tree, or a git directory read with
``git show HEAD:...``; default: the mirror this was written against), its A1111 imports stubbed.

Writes tests/data/lineart/refs.npz: the image, the padded input and each map at two processor resolutions, and OpenCV's INTER_CUBIC
of small random uint8 and float32 arrays.
"""

from __future__ import annotations

import functools
import importlib
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESOLUTIONS = (72, 100)
EXTENSION = "/work/.mirror/Mikubill+sd-webui-controlnet/repo"


def _aux(name: str):
    site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
    if "controlnet_aux" not in sys.modules:  # its package __init__ imports every annotator; only these are needed
        pkg = types.ModuleType("controlnet_aux")
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg
    return importlib.import_module(f"controlnet_aux.{name}")


def manga_class(extension: str):
    """The extension's ``res_skip`` class, from its annotator/manga_line/__init__.py."""
    import subprocess

    rel = "annotator/manga_line/__init__.py"
    path = Path(extension) / rel
    if path.is_file():
        src = path.read_text()
    else:
        src = subprocess.run(["git", "-C", extension, "show", f"HEAD:{rel}"], capture_output=True, text=True,
                             check=True).stdout
    mods, paths = types.ModuleType("modules"), types.ModuleType("annotator.annotator_path")
    mods.devices = types.ModuleType("modules.devices")
    paths.models_path = "/nonexistent"
    sys.modules.update({"modules": mods, "modules.devices": mods.devices,
                        "annotator": types.ModuleType("annotator"), "annotator.annotator_path": paths})
    ns: dict = {}
    exec(compile(src, rel, "exec"), ns)  # noqa: S102 - the extension's own file, read to run its network
    return ns["res_skip"]


def manga_line(model, img):
    """MangaLineExtration.__call__: OpenCV's grey, fed as 0-255, ``255 - y`` clipped to uint8 (no other
    inversion: the processor returns it as is)."""
    import cv2
    import torch

    g = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    with torch.no_grad():
        y = model(torch.from_numpy(np.ascontiguousarray(g)).float()[None, None]).numpy()[0, 0]
    return (255 - y).clip(0, 255).astype(np.uint8)


def resize_image_with_pad(img, resolution):
    import cv2

    h, w = img.shape[:2]
    k = float(resolution) / float(min(h, w))
    ht, wt = int(np.round(float(h) * k)), int(np.round(float(w) * k))
    img = cv2.resize(img, (wt, ht), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    ph, pw = int(np.ceil(ht / 64.0) * 64 - ht), int(np.ceil(wt / 64.0) * 64 - wt)
    return np.pad(img, [[0, ph], [0, pw], [0, 0]], mode="edge"), (ht, wt)


def generator_line(model, img):
    import torch

    with torch.no_grad():
        x = torch.from_numpy(img).float() / 255.0
        line = model(x.permute(2, 0, 1)[None])[0][0].numpy()
    return (line * 255.0).clip(0, 255).astype(np.uint8)


def anime_line(model, img):
    import cv2
    import torch

    h, w = img.shape[:2]
    hn, wn = 256 * int(np.ceil(float(h) / 256.0)), 256 * int(np.ceil(float(w) / 256.0))
    x = cv2.resize(img, (wn, hn), interpolation=cv2.INTER_CUBIC)
    with torch.no_grad():
        feed = torch.from_numpy(x).float() / 127.5 - 1.0
        line = (model(feed.permute(2, 0, 1)[None])[0, 0] * 127.5 + 127.5).numpy()
    line = cv2.resize(line, (w, h), interpolation=cv2.INTER_CUBIC)
    return line.clip(0, 255).astype(np.uint8)


def main() -> None:
    from lineart_helpers import COARSE_SEED, make_anime, make_generator, make_manga, test_image, write_pth

    extension = sys.argv[1] if len(sys.argv) > 1 else EXTENSION

    with tempfile.TemporaryDirectory() as tmp:
        sk = write_pth(Path(tmp) / "sk_model.pth", make_generator())
        sk2 = write_pth(Path(tmp) / "sk_model2.pth", make_generator(COARSE_SEED))
        netg = write_pth(Path(tmp) / "netG.pth", make_anime())
        erika = write_pth(Path(tmp) / "erika.pth", make_manga())
        import cv2
        import torch
        import torch.nn as nn

        torch.set_num_threads(2)
        gen = _aux("lineart").Generator(3, 1, 3)
        gen.load_state_dict(torch.load(sk, map_location="cpu"))
        gen.eval()
        coarse = _aux("lineart").Generator(3, 1, 3)
        coarse.load_state_dict(torch.load(sk2, map_location="cpu"))
        coarse.eval()
        norm = functools.partial(nn.InstanceNorm2d, affine=False, track_running_stats=False)
        unet = _aux("lineart_anime").UnetGenerator(3, 1, 8, 64, norm_layer=norm, use_dropout=False)
        ckpt = torch.load(netg, map_location="cpu")
        unet.load_state_dict({k.replace("module.", ""): v for k, v in ckpt.items()})
        unet.eval()
        manga = manga_class(extension)()
        manga.load_state_dict(torch.load(erika, map_location="cpu"))  # num_batches_tracked: filled in (no metadata)
        manga.eval()
        image = test_image()
        out = {"image": image}
        for res in RESOLUTIONS:
            img, (ht, wt) = resize_image_with_pad(image, res)
            out[f"input_{res}"] = img  # what the detectors read (OpenCV's resize; sdrt's is a level off on a few)
            out[f"realistic_{res}"] = (255 - generator_line(gen, img))[:ht, :wt]
            out[f"anime_{res}"] = (255 - anime_line(unet, img))[:ht, :wt]
            out[f"coarse_{res}"] = (255 - generator_line(coarse, img))[:ht, :wt]
            out[f"manga_{res}"] = manga_line(manga, img)[:ht, :wt]
    rng = np.random.default_rng(11)
    prims = {"cu8_in": rng.integers(0, 256, (40, 56, 3), dtype=np.uint8),
             "cf_in": (rng.standard_normal((96, 120)) * 60 + 127).astype(np.float32)}
    prims["cu8_out"] = cv2.resize(prims["cu8_in"], (256, 256), interpolation=cv2.INTER_CUBIC)
    prims["cu8_odd_out"] = cv2.resize(prims["cu8_in"], (77, 45), interpolation=cv2.INTER_CUBIC)
    prims["cf_out"] = cv2.resize(prims["cf_in"], (48, 40), interpolation=cv2.INTER_CUBIC)
    prims["cf_odd_out"] = cv2.resize(prims["cf_in"], (77, 131), interpolation=cv2.INTER_CUBIC)
    out.update(prims)
    for k, v in out.items():
        if not k.endswith(("_in", "_out")):
            print(k, v.shape, v.dtype, float(v.min()), float(v.max()), float(v.mean()))
    dest = ROOT / "tests" / "data" / "lineart" / "refs.npz"
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size)


if __name__ == "__main__":
    main()
