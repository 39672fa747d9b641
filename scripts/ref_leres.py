"""Reference for sdrt's ``depth_leres`` preprocessor: LeReS as sd-webui-controlnet runs it, on the seeded res101.pth
files that tests/pipelines/leres_helpers.py writes (the full-size ResNeXt-101 32x8d one and the narrow one).

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_leres.py

The network is controlnet_aux 0.0.10's ``leres.leres`` ``RelDepthModel(backbone='resnext101')`` (the extension's
annotator/leres/leres, the same code), loaded as both load it: the checkpoint's ``depth_model`` entry,
``strip_prefix_if_present(..., "module.")``, ``load_state_dict`` strict. For the narrow file the same classes are put
together at smaller sizes: controlnet_aux's ``ResNet`` with its ``Bottleneck`` and ``_make_layer`` (planes 8, 16, 32,
64, 4 groups of width 16 per 64 planes, a 16-channel stem) and its ``Decoder`` with ``FTB``/``FFM``/``AO`` of widths
16/16/16/32; their forwards are controlnet_aux's own.

Around the network: the extension's processor ``leres`` pads with ``resize_image_with_pad`` (shorter side to the
resolution, INTER_CUBIC up / INTER_AREA down, edges repeated to multiples of 64) and crops the map back; in between,
``apply_leres`` (``estimateleres``, the 16-bit scaling, ``convertScaleAbs``, the two thresholds and the inversion).
Here that middle part is controlnet_aux's ``LeresDetector.__call__`` on the padded image with ``detect_resolution``
and ``image_resolution`` its shorter side: its ``resize_image`` and final ``cv2.resize`` are then same-size copies,
and what is left is the extension's ``apply_leres`` line for line (controlnet_aux resizes to multiples of 64 instead
of padding; the extension wins).

Writes tests/data/leres/leres_refs.npz: the image; for the narrow file the maps at the image's own resolution, at 64
(shrinking) and 96 (enlarging, with OpenCV's padded input), with thresholds (near 20 %, background 30 %) at 64, and
the raw depth of the image padded at its own size; for the full-size file the map and raw depth of a 64 x 48 image.
"""

from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def narrow_model():
    """RelDepthModel's module tree at the narrow sizes, from controlnet_aux's classes."""
    import torch.nn as nn
    from controlnet_aux.leres.leres import network_auxi as network
    from controlnet_aux.leres.leres.multi_depth_model_woauxi import DepthModel, RelDepthModel
    from controlnet_aux.leres.leres.Resnext_torch import Bottleneck, ResNet

    enc = ResNet.__new__(ResNet)
    nn.Module.__init__(enc)
    enc._norm_layer = nn.BatchNorm2d
    enc.inplanes, enc.dilation, enc.groups, enc.base_width = 16, 1, 4, 16
    enc.conv1 = nn.Conv2d(3, 16, kernel_size=7, stride=2, padding=3, bias=False)
    enc.bn1 = nn.BatchNorm2d(16)
    enc.relu = nn.ReLU(inplace=True)
    enc.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
    enc.layer1 = enc._make_layer(Bottleneck, 8, 1)
    enc.layer2 = enc._make_layer(Bottleneck, 16, 2, stride=2)
    enc.layer3 = enc._make_layer(Bottleneck, 32, 2, stride=2)
    enc.layer4 = enc._make_layer(Bottleneck, 64, 1, stride=2)
    depthnet = network.DepthNet.__new__(network.DepthNet)
    nn.Module.__init__(depthnet)
    depthnet.encoder = enc
    dec = network.Decoder()
    dec.conv = network.FTB(inchannels=256, midchannels=32)
    dec.conv1 = nn.Conv2d(32, 16, kernel_size=3, padding=1, stride=1, bias=True)
    dec.ffm2 = network.FFM(inchannels=128, midchannels=16, outchannels=16, upfactor=2)
    dec.ffm1 = network.FFM(inchannels=64, midchannels=16, outchannels=16, upfactor=2)
    dec.ffm0 = network.FFM(inchannels=32, midchannels=16, outchannels=16, upfactor=2)
    dec.outconv = network.AO(inchannels=16, outchannels=1, upfactor=2)
    dm = DepthModel.__new__(DepthModel)
    nn.Module.__init__(dm)
    dm.encoder_modules, dm.decoder_modules = depthnet, dec
    rel = RelDepthModel.__new__(RelDepthModel)
    nn.Module.__init__(rel)
    rel.depth_model = dm
    return rel


def load(model, path):
    """Both loaders' lines: ``depth_model``, ``module.`` stripped, strict."""
    import torch
    from controlnet_aux.leres.leres.net_tools import strip_prefix_if_present

    checkpoint = torch.load(path, map_location=torch.device("cpu"))
    model.load_state_dict(strip_prefix_if_present(checkpoint["depth_model"], "module."), strict=True)
    return model.eval()


def leres(model, img, res, thr_a=0, thr_b=0):
    """The extension's processor ``leres`` (boost off): padded, ``apply_leres``, cropped; and the raw depth."""
    from controlnet_aux.leres import LeresDetector
    from controlnet_aux.leres.leres.depthmap import estimateleres
    from ref_mlsd import resize_image_with_pad

    padded, (h, w) = resize_image_with_pad(img, res)
    side = min(padded.shape[:2])
    made = LeresDetector(model, None)(padded, thr_a, thr_b, boost=False, detect_resolution=side,
                                      image_resolution=side, output_type="np")
    assert made.shape[:2] == padded.shape[:2] and (made[..., 0] == made[..., 2]).all()
    raw = estimateleres(padded, model, padded.shape[1], padded.shape[0])
    return made[:h, :w, 0].copy(), padded, np.asarray(raw, np.float32)


def main() -> None:
    from leres_helpers import test_image, write_file

    with tempfile.TemporaryDirectory() as tmp:
        tiny_pth = write_file(Path(tmp) / "tiny", tiny=True)
        full_pth = write_file(Path(tmp) / "full", tiny=False)
        import torch  # after write_pth, which refuses to run beside torch

        torch.set_num_threads(2)
        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        pkg = types.ModuleType("controlnet_aux")  # its __init__ imports every annotator; only leres is needed
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg
        from controlnet_aux.leres.leres.multi_depth_model_woauxi import RelDepthModel

        state = torch.load(full_pth)
        assert list(state) == ["depth_model"] and all(k.startswith("module.") for k in state["depth_model"])
        n = sum(v.numel() for v in state["depth_model"].values() if v.dtype == torch.float32)
        print("full-size file", full_pth.stat().st_size, "bytes,", n, "values")
        del state
        full = load(RelDepthModel(backbone="resnext101"), full_pth)
        tiny = load(narrow_model(), tiny_pth)

    image = test_image()
    h, w = image.shape[:2]
    out = {"image": image}
    for key, res, a, b in (("map_own", min(h, w), 0, 0), ("map_64", 64, 0, 0), ("map_96", 96, 0, 0),
                           ("map_64_thr", 64, 20, 30)):
        out[key], padded, raw = leres(tiny, image, res, a, b)
        if key == "map_own":
            out["raw_own"] = raw
        if key == "map_96":
            out["pad_96"] = padded
        print(key, out[key].shape, out[key].mean(), out[key].min(), out[key].max())
    small = test_image(64, 48)
    out["full_image"] = small
    out["full_map"], _, out["full_raw"] = leres(full, small, 48)
    print("full", out["full_map"].shape, out["full_map"].mean(), out["full_raw"].min(), out["full_raw"].max())
    dest = ROOT / "tests" / "data" / "leres" / "leres_refs.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
