"""Reference for sdrt's ``seg_ufade20k`` preprocessor: sd-webui-controlnet's UniFormer segmentor run on the seeded
upernet_global_small.pth files that tests/pipelines/uniformer_helpers.py writes (the narrow one and the full-size
UniFormer-S one).

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_uniformer.py

The code is the extension's own (``annotator/uniformer`` and its vendored mmcv / mmseg, ``annotator/mmpkg``), taken
from its git repository (``EXT_GIT``, a bare clone) into a temporary folder at run time and imported from there
(nothing of it is kept; A1111's ``modules.devices`` and the extension's ``annotator_path`` are stubbed: CPU, no
download folder; mmcv's Config needs ``addict`` and ``yapf``, which the reference venv lacks: install them there
for this script only, ``/work/refvenv/bin/pip install addict yapf``, which brings yapf's ``platformdirs``; sdrt and
its tests never import them). ``init_segmentor`` builds the segmentor from the
extension's ``upernet_global_small.py`` config (for the narrow file with the backbone's widths and blocks and the
heads' channels overridden) and loads the file with mmcv's ``load_checkpoint``; each map is the processor's
``uniformer``: ``resize_image_with_pad`` (scripts/ref_mlsd.py's copy of the extension's), ``inference_segmentor``
(the ADE20K test pipeline: rescale to 2048 x 512, Normalize, the whole-image inference with its two resizes, softmax,
argmax), ``show_result_pyplot(..., get_palette('ade'), opacity=1)``, the crop.

Writes tests/data/uniformer/uniformer_refs.npz: the image; for the narrow file the maps at processor resolutions
44 (the image's own shorter side: no resize), 32 (area), 64 (bicubic) and 150 (bicubic to 205 x 150, padded to
256 x 192, which mmseg rescales by 8/3 to 683 x 512: no whole ratio anywhere), the class map at 44, the decode head's
logits at 44 (every 8th row and column); for the full-size file the map at 64 and its class map.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXT_GIT = os.environ.get("EXT_GIT", "/work/.mirror/Mikubill+sd-webui-controlnet/repo")


def _import_extension(tmp: Path):
    """The extension's uniformer package and vendored mmcv/mmseg, from its repository, importable."""
    files = subprocess.run(["git", f"--git-dir={EXT_GIT}", "archive", "HEAD", "annotator/uniformer",
                            "annotator/mmpkg", "annotator/__init__.py"], check=True, capture_output=True).stdout
    tmp.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "x", "-C", str(tmp)], input=files, check=True)
    import torch

    sys.path.insert(0, str(tmp))
    path = types.ModuleType("annotator.annotator_path")
    path.models_path = str(tmp / "downloads")
    sys.modules["annotator.annotator_path"] = path
    devices = types.ModuleType("modules.devices")
    devices.get_device_for = lambda name: torch.device("cpu")
    modules = types.ModuleType("modules")
    modules.devices = devices
    sys.modules["modules"], sys.modules["modules.devices"] = modules, devices
    import annotator.mmpkg.mmcv as mmcv
    from annotator.mmpkg.mmseg.core.evaluation import get_palette
    from annotator.uniformer import config_file
    from annotator.uniformer.inference import inference_segmentor, init_segmentor, show_result_pyplot

    return mmcv, config_file, init_segmentor, inference_segmentor, show_result_pyplot, get_palette


def main() -> None:
    from ref_mlsd import resize_image_with_pad
    from uniformer_helpers import narrow, test_image, write_file

    from sdrt.pipelines.uniformerseg import SMALL, expected_shapes

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        narrow_pth = write_file(tmp / "narrow")
        full_pth = write_file(tmp / "full", full=True)
        import torch  # after write_pth, which refuses to run beside torch

        torch.set_num_threads(2)
        mmcv, config_file, init_segmentor, inference_segmentor, show_result_pyplot, get_palette = \
            _import_extension(tmp / "ext")

        full = init_segmentor(config_file, str(full_pth), device="cpu")
        state = full.state_dict()
        mine = expected_shapes(SMALL)
        theirs = {k: tuple(v.shape) for k, v in state.items()
                  if not k.endswith("num_batches_tracked") and not k.startswith("auxiliary_head.")}
        assert mine == theirs, set(mine) ^ set(theirs)
        file_state = torch.load(full_pth)["state_dict"]
        assert set(file_state) == set(state) and all(file_state[k].shape == state[k].shape for k in state)
        print("full-size names/shapes match UniFormer-S + UperNet:", len(state), "tensors,",
              sum(v.numel() for v in state.values()), "values,", full_pth.stat().st_size, "bytes")

        cfg = narrow()
        conf = mmcv.Config.fromfile(config_file)
        conf.model.backbone.embed_dim = list(cfg.dims)
        conf.model.backbone.layers = list(cfg.layers)
        conf.model.decode_head.in_channels = list(cfg.dims)
        conf.model.decode_head.channels = cfg.channels
        conf.model.auxiliary_head.in_channels = cfg.dims[2]
        conf.model.auxiliary_head.channels = 16
        tiny = init_segmentor(conf, str(narrow_pth), device="cpu")
        palette = get_palette("ade")

        captured = {}
        tiny.decode_head.conv_seg.register_forward_hook(lambda m, i, o: captured.__setitem__("logits", o[0].numpy().copy()))

        def uniformer(model, img, res):
            """The processor's ``uniformer``: padded, segmented, painted, cropped; and the class map."""
            padded, (h, w) = resize_image_with_pad(img, res)
            result = inference_segmentor(model, padded)
            painted = show_result_pyplot(model, padded, result, palette, opacity=1)
            return painted[:h, :w], np.asarray(result[0])[:h, :w]

        image = test_image()
        out = {"image": image}
        for res in (44, 32, 64, 150):
            out[f"map_{res}"], labels = uniformer(tiny, image, res)
            if res == 44:
                out["labels_44"] = labels.astype(np.uint8)
                out["logits_44"] = captured["logits"][:, ::8, ::8]
                print("logits", captured["logits"].shape)
            print(f"map_{res}", out[f"map_{res}"].shape, "classes", len(np.unique(labels)))
        out["full_map_64"], labels = uniformer(full, image, 64)
        out["full_labels_64"] = labels.astype(np.uint8)
        print("full map", out["full_map_64"].shape, "classes", len(np.unique(labels)))
    dest = ROOT / "tests" / "data" / "uniformer" / "uniformer_refs.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
