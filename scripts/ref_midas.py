"""Reference for sdrt's ``depth_midas`` / ``normal_midas``: controlnet_aux 0.0.10's MiDaS (the extension's
annotator/midas code, file for file the same DPT, vit and blocks modules) on seeded weights.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_midas.py [--full]

The weights come from tests/pipelines/midas_helpers.py (seeded numpy); they are loaded strictly into controlnet_aux's
own ``DPTDepthModel`` (timm's ``vit_base_resnet50_384`` inside), saved with ``torch.save`` and read back through the
model's own ``path=`` loading, so the names and shapes are the real file's. The small network (``SMALL``: reduced
widths) is built by handing controlnet_aux's ``_make_vit_b_rn50_backbone`` a smaller timm hybrid ViT; everything
else is controlnet_aux's code. Around the network the script does what the extension's ``midas`` /
``midas_normal`` do: ``resize_image_with_pad`` (HWC3, INTER_CUBIC when enlarging / INTER_AREA, rounded sides,
edge padding to 64), then ``MidasDetector.__call__`` on the padded image at its own size (its resizes are then
identities, and its body is the extension's ``apply_midas``), then the padding cropped off.

Writes tests/data/midas/layout.json (every tensor of the full-size model: names and shapes) and
tests/data/midas/refs.npz (images, raw depths, maps, and cv2.Sobel of a random plane); with --full also
tests/data/midas/full_refs.npz (the full-size network on its seeded weights, once, at 64x64).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import OrderedDict
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "midas"


def resize_image_with_pad(img: np.ndarray, resolution: int) -> tuple[np.ndarray, tuple[int, int]]:
    import cv2

    h, w = img.shape[:2]
    k = float(resolution) / float(min(h, w))
    th, tw = int(np.round(float(h) * k)), int(np.round(float(w) * k))
    img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    ph, pw = int(np.ceil(th / 64.0) * 64 - th), int(np.ceil(tw / 64.0) * 64 - tw)
    return np.pad(img, [[0, ph], [0, pw], [0, 0]], mode="edge"), (th, tw)


def small_model_factory(size: dict):
    """A ``_make_pretrained_vitb_rn50_384`` that builds the small hybrid with timm's classes."""
    from controlnet_aux.midas.midas import vit
    from timm.layers import StdConv2dSame
    from timm.models.resnetv2 import ResNetV2
    from timm.models.vision_transformer import VisionTransformer
    from timm.models.vision_transformer_hybrid import HybridEmbed

    def make(pretrained, use_readout="ignore", hooks=None, use_vit_only=False):
        backbone = ResNetV2(layers=size["layers"], channels=size["channels"], stem_chs=size["stem"], num_classes=0,
                            global_pool="", preact=False, stem_type="same",
                            conv_layer=partial(StdConv2dSame, eps=1e-8))
        model = VisionTransformer(img_size=16 * size["grid"], patch_size=1, embed_dim=size["embed"],
                                  depth=size["depth"], num_heads=size["embed"] // 64,
                                  mlp_ratio=size["mlp"] / size["embed"],
                                  embed_layer=partial(HybridEmbed, backbone=backbone))
        c = size["channels"]
        return vit._make_vit_b_rn50_backbone(model, features=[c[0], c[1], size["embed"], size["embed"]],
                                             size=[16 * size["grid"]] * 2, hooks=hooks or [0, 1, 8, 11],
                                             vit_features=size["embed"], use_vit_only=use_vit_only,
                                             use_readout=use_readout)
    return make


def build(arrays: dict[str, np.ndarray], tmp: Path, size: dict | None):
    """controlnet_aux's DPTDepthModel (small when ``size``), the arrays loaded strictly, saved with torch.save and
    loaded again through the model's ``path=`` (BaseModel.load)."""
    import torch
    from controlnet_aux.midas.midas import blocks, dpt_depth

    saved = blocks._make_pretrained_vitb_rn50_384, blocks._make_scratch
    if size is not None:
        c = size["channels"]
        blocks._make_pretrained_vitb_rn50_384 = small_model_factory(size)
        blocks._make_scratch = lambda in_shape, out_shape, **kw: saved[1](
            [c[0], c[1], size["embed"], size["embed"]], out_shape, **kw)
    try:
        kw = {} if size is None else {"features": size["features"]}
        model = dpt_depth.DPTDepthModel(path=None, backbone="vitb_rn50_384", non_negative=True, **kw)
        state = model.state_dict()
        extra = sorted(set(arrays) - set(state))
        assert not extra, extra[:5]
        for k, v in state.items():
            if k in arrays:
                assert tuple(v.shape) == arrays[k].shape, (k, v.shape, arrays[k].shape)
        full = OrderedDict((k, torch.from_numpy(arrays[k]) if k in arrays else v) for k, v in state.items())
        missing = [k for k in state if k not in arrays]
        print("tensors", len(state), "not in sdrt's list (unused by the forward):", missing)
        model.load_state_dict(full, strict=True)
        path = tmp / "dpt_hybrid-midas-501f0c75.pt"
        torch.save(model.state_dict(), path)
        model = dpt_depth.DPTDepthModel(path=str(path), backbone="vitb_rn50_384", non_negative=True, **kw)
    finally:
        blocks._make_pretrained_vitb_rn50_384, blocks._make_scratch = saved
    return model.eval()


def run_extension(model, image: np.ndarray, resolution: int | None, bg_th: float):
    """(padded input, raw depth, depth map, normal map) as the extension's midas / midas_normal make them."""
    import torch
    from controlnet_aux.midas import MidasDetector
    from controlnet_aux.util import HWC3

    img = HWC3(image)
    if resolution is None:
        h, w = img.shape[:2]
        padded = np.pad(img, [[0, -h % 64], [0, -w % 64], [0, 0]], mode="edge")
        crop = (h, w)
    else:
        padded, crop = resize_image_with_pad(img, resolution)
    det = MidasDetector(model)
    side = min(padded.shape[:2])
    depth_map, normal_map = det(padded, bg_th=bg_th, depth_and_normal=True, detect_resolution=side,
                                image_resolution=side)
    with torch.no_grad():
        x = torch.from_numpy(padded).float() / 127.5 - 1.0
        raw = model(x.permute(2, 0, 1)[None])[0].numpy()
    return padded, raw, depth_map[:crop[0], :crop[1]], normal_map[:crop[0], :crop[1]]


def main() -> None:
    import torch
    from controlnet_aux.midas.midas import dpt_depth
    from midas_helpers import SMALL, make_weights, sample_image

    torch.set_num_threads(2)
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    real = dpt_depth.DPTDepthModel(path=None, backbone="vitb_rn50_384", non_negative=True)
    layout = {k: list(v.shape) for k, v in real.state_dict().items()}
    del real
    (OUT / "layout.json").write_text(json.dumps({
        "about": "every tensor of controlnet_aux 0.0.10's DPTDepthModel(backbone='vitb_rn50_384') (timm "
                 "vit_base_resnet50_384 inside), the layout of dpt_hybrid-midas-501f0c75.pt; scripts/ref_midas.py",
        "tensors": layout}, indent=0) + "\n")
    print("layout", len(layout), "tensors", sum(int(np.prod(s)) for s in layout.values()), "numbers")

    import cv2

    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build(make_weights(SMALL), Path(tmp), SMALL)
        cases = {"a": (sample_image(100, 70), 64, 0.4), "b": (sample_image(64, 64), None, 0.1)}
        for key, (image, res, bg) in cases.items():
            padded, raw, dmap, nmap = run_extension(model, image, res, bg)
            out.update({f"{key}_image": image, f"{key}_padded": padded, f"{key}_raw": raw, f"{key}_depth": dmap,
                        f"{key}_normal": nmap})
            print(key, image.shape, "->", padded.shape, "depth", float(raw.min()), float(raw.max()),
                  "zero", float((raw == 0).mean()), "normal bg", float((nmap == [255, 127, 127]).all(-1).mean()))
        del model
        if "--full" in sys.argv:
            full = build(make_weights(None), Path(tmp), None)
            image = sample_image(64, 64)
            padded, raw, dmap, nmap = run_extension(full, image, None, 0.4)
            np.savez_compressed(OUT / "full_refs.npz", image=image, raw=raw, depth=dmap, normal=nmap)
            print("full", float(raw.min()), float(raw.max()))
    # the extension's post-processing alone, on a depth with a positive minimum and flat areas: controlnet_aux's
    # MidasDetector around a stand-in network that returns this depth
    yy, xx = np.mgrid[0:64, 0:128].astype(np.float32)
    plane = (2.5 + np.sin(xx / 9.0) * 1.5 + yy / 40.0).astype(np.float32)
    plane[10:30, 20:60] = np.float32(2.0)
    plane = np.round(plane * 64) / 64  # steps: flat runs and exact zeros in the Sobel

    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))  # MidasDetector reads its device off a parameter

        def forward(self, x):
            return torch.from_numpy(plane)[None]

    from controlnet_aux.midas import MidasDetector

    for bg in (0.1, 0.4):
        dmap, nmap = MidasDetector(Fixed())(np.zeros((64, 128, 3), np.uint8), bg_th=bg, depth_and_normal=True,
                                            detect_resolution=64, image_resolution=64)
        out[f"post_depth_{bg}"], out[f"post_normal_{bg}"] = dmap[..., 0], nmap
    out["post_in"] = plane
    rng = np.random.default_rng(3)
    for key, shape in (("sobel", (23, 31)), ("sobel_even", (40, 70)), ("sobel_wide", (64, 128))):
        plane = (rng.standard_normal(shape) * 4).astype(np.float32)
        out[f"{key}_in"] = plane
        out[f"{key}_x"] = cv2.Sobel(plane, cv2.CV_32F, 1, 0, ksize=3)
        out[f"{key}_y"] = cv2.Sobel(plane, cv2.CV_32F, 0, 1, ksize=3)
    np.savez_compressed(OUT / "refs.npz", **out)
    print("wrote", OUT / "refs.npz")


if __name__ == "__main__":
    main()
