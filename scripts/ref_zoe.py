"""Reference for sdrt's ``depth_zoe`` preprocessor: ZoeDepth as sd-webui-controlnet runs it, on the seeded
ZoeD_M12_N.pt files that tests/pipelines/zoe_helpers.py writes (the narrow one and, with --full, the full-size one).

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_zoe.py [--full]

The network is controlnet_aux 0.0.10's ZoeDepth (the extension's annotator/zoe/zoedepth, the same code but for timm
1.0 adapters): ``ZoeDepth.build_from_config(get_config("zoedepth", "infer"))`` for the full-size file; for the narrow
one the same classes at smaller sizes (timm's ``beit_large_patch16_384`` at width 32 with 2 heads, controlnet_aux's
``_make_beit_backbone`` with reassemble widths 8/16/32/32, ``_make_scratch`` and ``DPTDepthModel`` with 16 features,
``MidasCore`` with the infer config's 384 x 512 kept-aspect resize, ``ZoeDepth`` with a bin embedding of 16). The
state dict is the file's ``model`` entry less the ``relative_position_index`` buffers timm 1.0 does not keep, loaded
strictly.

Around the network: the extension's processor ``zoe_depth`` pads with ``resize_image_with_pad`` (shorter side to the
resolution, INTER_CUBIC up / INTER_AREA down, edges repeated to multiples of 64) and crops the map back; in between,
its ``ZoeDetector.__call__``: ``x / 255``, ``model.infer`` (flip and pad augmentation), percentiles 2 / 85, inverted.
Here that middle part is written out as the extension's lines (controlnet_aux's ``ZoeDetector.__call__`` adds its own
resizes; the extension wins).

Writes tests/data/zoe/zoe_refs.npz (narrow) or zoe_full_refs.npz (--full).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
warnings.filterwarnings("ignore")


def narrow_model():
    import controlnet_aux.zoe.zoedepth.models.base_models.midas_repo.midas.backbones.beit as beit
    import controlnet_aux.zoe.zoedepth.models.base_models.midas_repo.midas.blocks as blocks
    from controlnet_aux.zoe.zoedepth.models.base_models.midas import MidasCore
    from controlnet_aux.zoe.zoedepth.models.base_models.midas_repo.midas.dpt_depth import DPTDepthModel
    from controlnet_aux.zoe.zoedepth.models.zoedepth.zoedepth_v1 import ZoeDepth
    from controlnet_aux.zoe.zoedepth.utils.config import get_config

    post = [8, 16, 32, 32]
    create, backbone, scratch = beit.create_model_adapter, beit._make_beit_backbone, blocks._make_scratch
    beit.create_model_adapter = lambda name, pretrained=False, **kw: create(name, pretrained=False, embed_dim=32,
                                                                            num_heads=2, mlp_ratio=2.0)
    beit._make_beit_backbone = lambda model, features, size=(384, 384), hooks=(0, 4, 8, 11), vit_features=768, \
        use_readout="ignore", **kw: backbone(model, features=post, size=list(size), hooks=hooks, vit_features=32,
                                             use_readout=use_readout)
    blocks._make_scratch = lambda in_shape, out_shape, groups=1, expand=False: scratch(post, out_shape, groups, expand)
    try:
        midas = DPTDepthModel(path=None, backbone="beitl16_384", non_negative=True, features=16)
    finally:
        beit.create_model_adapter, beit._make_beit_backbone, blocks._make_scratch = create, backbone, scratch
    conf = get_config("zoedepth", "infer")
    core = MidasCore(midas, trainable=False, fetch_features=True, freeze_bn=True, img_size=conf["img_size"],
                     keep_aspect_ratio=conf["force_keep_ar"])
    core.output_channels = [16] * 5
    conf["bin_embedding_dim"] = 16
    return ZoeDepth(core, **conf)


def full_model():
    from controlnet_aux.zoe.zoedepth.models.zoedepth.zoedepth_v1 import ZoeDepth
    from controlnet_aux.zoe.zoedepth.utils.config import get_config

    return ZoeDepth.build_from_config(get_config("zoedepth", "infer"))


def load(model, path):
    import torch
    import torch.nn as nn

    sd = torch.load(path, map_location="cpu")["model"]
    sd = {k: v for k, v in sd.items() if "relative_position_index" not in k}
    nn.Module.load_state_dict(model, sd, strict=True)
    return model.eval()


def resize_image_with_pad(img, resolution):
    """The extension's processor helper (HWC3 of an RGB image is itself)."""
    import cv2

    h, w = img.shape[:2]
    k = float(resolution) / float(min(h, w))
    interpolation = cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA
    ht, wt = int(np.round(float(h) * k)), int(np.round(float(w) * k))
    img = cv2.resize(img, (wt, ht), interpolation=interpolation)
    return np.pad(img, [[0, -ht % 64], [0, -wt % 64], [0, 0]], mode="edge"), (ht, wt)


def detect(model, img):
    """annotator/zoe ZoeDetector.__call__ on the padded image: (raw averaged depth, map)."""
    import torch
    from einops import rearrange

    with torch.no_grad():
        x = torch.from_numpy(img).float() / 255.0
        x = rearrange(x, "h w c -> 1 c h w")
        depth = model.infer(x)[0, 0].cpu().numpy()
    raw = depth.copy()
    vmin, vmax = np.percentile(depth, 2), np.percentile(depth, 85)
    depth -= vmin
    depth /= vmax - vmin
    depth = 1.0 - depth
    return raw, (depth * 255.0).clip(0, 255).astype(np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "pipelines"))
    from zoe_helpers import test_image, write_file

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_file(Path(tmp), tiny=not args.full)  # before torch is imported (written without it)
        import torch

        torch.set_num_threads(2)
        model = load(full_model() if args.full else narrow_model(), path)
        image = test_image()
        out["image"] = image
        h, w = image.shape[:2]
        cases = {"own": None} if args.full else {"own": None, "r64": 64, "r96": 96, "wide": None}
        for tag, res in cases.items():
            if tag == "wide":  # a long picture at its own size: a small non-square network input (96 x 512)
                image = out["wide_image"] = test_image(60, 380)
                h, w = image.shape[:2]
            if res is None:
                padded, (ht, wt) = np.pad(image, [[0, -h % 64], [0, -w % 64], [0, 0]], mode="edge"), (h, w)
            else:
                padded, (ht, wt) = resize_image_with_pad(image, res)
            raw, m = detect(model, padded)
            out[f"{tag}_raw"] = raw.astype(np.float32)
            out[f"{tag}_map"] = m[:ht, :wt].copy()
            print(tag, padded.shape, raw.shape, float(raw.min()), float(raw.max()))
    name = "zoe_full_refs.npz" if args.full else "zoe_refs.npz"
    np.savez_compressed(ROOT / "tests" / "data" / "zoe" / name, **out)


if __name__ == "__main__":
    main()
