"""Reference for sdrt's ``seg_anime_face`` preprocessor: sd-webui-controlnet's anime face segmentation run on the
seeded UNet.pth that tests/pipelines/animeface_helpers.py writes (the published architecture and size).

    PYTHONPATH=scripts:core/src:tests/pipelines:tests /work/refvenv/bin/python scripts/ref_anime_face.py

The code is the extension's own ``annotator/anime_face_segment/__init__.py`` (``UNet``, ``AnimeFaceSegment``), taken
from its git repository (``EXT_GIT``) into a temporary folder at run time and imported from there (nothing of it is
kept); A1111's ``modules.devices`` and the extension's ``annotator_path`` are stubbed (CPU; the download folder is the
temporary one holding the seeded file, so nothing is downloaded), and torchvision's ``mobilenet_v2`` is built
without its ImageNet weights (the file's state dict replaces them all). Each map is the processor's
``anime_face_segment``: ``resize_image_with_pad`` (scripts/ref_mlsd.py's copy of the extension's), the module's
``__call__`` (torchvision ``Resize(512, BICUBIC)`` on a PIL image, ``ToTensor``, the UNet, argmax, its palette) and
``remove_pad`` (the top-left h x w of the map, whatever its size).

Writes tests/data/animeface/animeface_refs.npz: the image, the maps at processor resolutions 44 (the image's own), 150
(padded 256 x 192, read at 682 x 512: the decoder's skips are not twice the size below them),
64 and 512 (the map at the processor size), and the decoder's last scores at 44 and of the image padded to
256 x 192 (read at 682 x 512, no OpenCV resize before it) (every 8th row and column).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXT_GIT = os.environ.get("EXT_GIT", "/work/.mirror/Mikubill+sd-webui-controlnet/repo")


def main() -> None:
    from animeface_helpers import test_image, write_file
    from ref_mlsd import resize_image_with_pad

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pth = write_file(tmp / "seeded")
        import torch  # after write_pth, which refuses to run beside torch
        import torchvision

        torch.set_num_threads(2)
        (tmp / "downloads" / "anime_face_segment").mkdir(parents=True)
        shutil.copy(pth, tmp / "downloads" / "anime_face_segment" / "UNet.pth")
        src = subprocess.run(["git", f"--git-dir={EXT_GIT}", "archive", "HEAD", "annotator/anime_face_segment"],
                             check=True, capture_output=True).stdout
        subprocess.run(["tar", "x", "-C", str(tmp)], input=src, check=True)
        path = types.ModuleType("annotator.annotator_path")
        path.models_path = str(tmp / "downloads")
        devices = types.ModuleType("modules.devices")
        devices.get_device_for = lambda name: torch.device("cpu")
        modules = types.ModuleType("modules")
        modules.devices = devices
        annotator = types.ModuleType("annotator")
        annotator.__path__ = [str(tmp / "annotator")]
        sys.modules.update({"annotator": annotator, "annotator.annotator_path": path, "modules": modules,
                            "modules.devices": devices})
        plain = torchvision.models.mobilenet_v2
        torchvision.models.mobilenet_v2 = lambda weights=None, **kw: plain(weights=None, **kw)
        from annotator.anime_face_segment import AnimeFaceSegment

        seg = AnimeFaceSegment()
        captured = {}

        def anime_face(img, res):
            padded, (h, w) = resize_image_with_pad(img, res)
            return seg(padded)[:h, :w]

        image = test_image()
        out = {"image": image}
        for res in (44, 64, 150, 512):
            out[f"map_{res}"] = anime_face(image, res)
            print(f"map_{res}", out[f"map_{res}"].shape, len(np.unique(out[f"map_{res}"].reshape(-1, 3), axis=0)))
        seg.model.de_block0[1].register_forward_hook(lambda m, i, o: captured.__setitem__("s", o[0].numpy().copy()))
        anime_face(image, 44)  # no OpenCV resize before the network: its input is Pillow's alone
        out["scores_44"] = captured["s"][:, ::8, ::8]
        seg(np.pad(image, ((0, 196), (0, 148), (0, 0)), mode="edge"))  # 256 x 192, read at 682 x 512
        out["scores_682"] = captured["s"][:, ::8, ::8]
    dest = ROOT / "tests" / "data" / "animeface" / "animeface_refs.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
