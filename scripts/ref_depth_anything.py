"""Reference for sdrt's ``depth_anything`` / ``depth_anything_v2`` preprocessors: transformers 5.24's
``DepthAnythingForDepthEstimation`` (the independent network) loaded from the seeded files that
tests/pipelines/depthanything_helpers.py writes in the ORIGINAL layout (``depth_anything_vitl14.pth`` /
``depth_anything_v2_vitl.pth`` names and shapes), with the extension's steps around it done with OpenCV and torch
as its ``annotator/depth_anything*.py`` and ``resize_image_with_pad`` do them.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_depth_anything.py

The original layout is mapped onto transformers' names here (fused qkv split, layer scale, DPT head), every
original tensor consumed exactly once and the model loaded strictly. DINOv2, which the extension runs, resizes the
position embeddings with ``F.interpolate(scale_factor=(g + 0.1) / 37, mode="bicubic")``; transformers passes the
output size instead (no 0.1 offset). The extension's references patch transformers' ``interpolate_pos_encoding``
to DINOv2's arguments (the same torch call); one more reference keeps transformers' own.

Writes tests/data/depthanything/refs.npz (``--no-full``: all but the ViT-L run, whose references it keeps).
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SMALL = 140  # a smaller lower bound than the extension's 518, for the quick cases (a multiple of 14)


def to_transformers(sd: dict, depth: int) -> dict:
    """The original state dict under transformers' DepthAnythingForDepthEstimation names."""
    out, used = {}, set()

    def take(src: str, dst: str, value=None) -> None:
        used.add(src)
        out[dst] = sd[src] if value is None else value

    e = "backbone.embeddings."
    take("pretrained.cls_token", e + "cls_token")
    take("pretrained.mask_token", e + "mask_token")
    take("pretrained.pos_embed", e + "position_embeddings")
    take("pretrained.patch_embed.proj.weight", e + "patch_embeddings.projection.weight")
    take("pretrained.patch_embed.proj.bias", e + "patch_embeddings.projection.bias")
    for i in range(depth):
        s, t = f"pretrained.blocks.{i}.", f"backbone.encoder.layer.{i}."
        for a, b in (("norm1", "norm1"), ("norm2", "norm2"), ("attn.proj", "attention.o_proj"),
                     ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
            take(s + a + ".weight", t + b + ".weight")
            take(s + a + ".bias", t + b + ".bias")
        take(s + "ls1.gamma", t + "layer_scale1.lambda1")
        take(s + "ls2.gamma", t + "layer_scale2.lambda1")
        for part in ("weight", "bias"):
            q, k, v = sd[s + "attn.qkv." + part].chunk(3, dim=0)
            used.add(s + "attn.qkv." + part)
            out[t + "attention.q_proj." + part] = q
            out[t + "attention.k_proj." + part] = k
            out[t + "attention.v_proj." + part] = v
    take("pretrained.norm.weight", "backbone.layernorm.weight")
    take("pretrained.norm.bias", "backbone.layernorm.bias")
    h = "depth_head."
    for i in range(4):
        for part in ("weight", "bias"):
            take(f"{h}projects.{i}.{part}", f"neck.reassemble_stage.layers.{i}.projection.{part}")
            if i != 2:
                take(f"{h}resize_layers.{i}.{part}", f"neck.reassemble_stage.layers.{i}.resize.{part}")
        take(f"{h}scratch.layer{i + 1}_rn.weight", f"neck.convs.{i}.weight")
    for r in (1, 2, 3, 4):  # refinenet4 fuses first: transformers' fusion layer 0
        s, t = f"{h}scratch.refinenet{r}.", f"neck.fusion_stage.layers.{4 - r}."
        for part in ("weight", "bias"):
            take(s + "out_conv." + part, t + "projection." + part)
            for u in (1, 2):
                for c in (1, 2):
                    take(f"{s}resConfUnit{u}.conv{c}.{part}", f"{t}residual_layer{u}.convolution{c}.{part}")
    for a, b in (("output_conv1", "conv1"), ("output_conv2.0", "conv2"), ("output_conv2.2", "conv3")):
        for part in ("weight", "bias"):
            take(f"{h}scratch.{a}.{part}", f"head.{b}.{part}")
    left = set(sd) - used
    assert not left, f"original tensors not consumed: {sorted(left)[:5]}"
    return out


def build(sd: dict, cfg: tuple, v2: bool):
    import torch
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config

    d, depth, mlp, grid, f, oc = cfg
    if v2:
        blocks = {12: [2, 5, 8, 11], 24: [4, 11, 17, 23], 40: [9, 19, 29, 39]}[depth]
    else:
        blocks = list(range(depth - 4, depth))
    backbone = Dinov2Config(hidden_size=d, num_hidden_layers=depth, num_attention_heads=d // 64, mlp_ratio=mlp // d,
                            image_size=grid * 14, patch_size=14, layer_norm_eps=1e-6, layerscale_value=1.0,
                            out_indices=[b + 1 for b in blocks], reshape_hidden_states=False, apply_layernorm=True)
    config = DepthAnythingConfig(backbone_config=backbone, patch_size=14, reassemble_hidden_size=d,
                                 reassemble_factors=[4, 2, 1, 0.5], neck_hidden_sizes=list(oc),
                                 fusion_hidden_size=f, head_hidden_size=32, depth_estimation_type="relative")
    model = DepthAnythingForDepthEstimation(config).eval()
    model.load_state_dict(to_transformers(sd, depth), strict=True)
    return model.to(torch.float32)


def dinov2_pos(self, embeddings, height, width):
    """DINOv2's ``interpolate_pos_encoding`` (the extension's): scale factor ``(grid + 0.1) / M``."""
    import torch
    import torch.nn.functional as F

    n = embeddings.shape[1] - 1
    pos = self.position_embeddings
    m = pos.shape[1] - 1
    gh, gw = height // 14, width // 14
    if n == m and height == width:
        return pos
    side = int(math.sqrt(m))
    patch = pos[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2).float()
    patch = F.interpolate(patch, scale_factor=((gh + 0.1) / side, (gw + 0.1) / side), mode="bicubic",
                          antialias=False)
    assert patch.shape[-2:] == (gh, gw)
    patch = patch.permute(0, 2, 3, 1).reshape(1, gh * gw, -1)
    return torch.cat((pos[:, :1], patch), dim=1)


def ext_size(h: int, w: int, size: int) -> tuple[int, int]:
    """The Depth Anything ``Resize(size, size, keep_aspect_ratio, ensure_multiple_of=14, lower_bound)``."""
    sh, sw = size / h, size / w
    if sw > sh:
        sh = sw
    else:
        sw = sh

    def c(x: float) -> int:
        y = (np.round(x / 14) * 14).astype(int)
        if y < size:
            y = (np.ceil(x / 14) * 14).astype(int)
        return int(y)

    return c(sh * h), c(sw * w)


def extension(model, rgb: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(network input, prediction, map, depth at the image size) of the extension's DepthAnythingDetector(colored=False) on ``rgb``."""
    import cv2
    import torch
    import torch.nn.functional as F

    h, w = rgb.shape[:2]
    img = cv2.cvtColor(rgb, cv2.COLOR_BGR2RGB) / 255.0
    nh, nw = ext_size(h, w, size)
    img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_CUBIC)
    img = (img - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    x = np.ascontiguousarray(np.transpose(img, (2, 0, 1))).astype(np.float32)
    with torch.no_grad():
        depth = model(pixel_values=torch.from_numpy(x)[None]).predicted_depth  # (1, nh, nw)
        up = F.interpolate(depth[None], (h, w), mode="bilinear", align_corners=False)[0, 0]
        d = (up - up.min()) / (up.max() - up.min()) * 255.0
    return x, depth[0].numpy(), d.numpy().astype(np.uint8), up.numpy()


def resize_image_with_pad(rgb: np.ndarray, resolution: int):
    import cv2

    h, w = rgb.shape[:2]
    k = float(resolution) / float(min(h, w))
    th, tw = int(np.round(float(h) * k)), int(np.round(float(w) * k))
    img = cv2.resize(rgb, (tw, th), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    ph, pw = int(np.ceil(th / 64.0) * 64 - th), int(np.ceil(tw / 64.0) * 64 - tw)
    return np.pad(img, [[0, ph], [0, pw], [0, 0]], mode="edge"), (th, tw)


def main() -> None:
    from depthanything_helpers import TINY, VITL, make_weights, test_image
    from openpose_helpers import write_pth

    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = write_pth(Path(tmp) / "tiny.pth", make_weights(TINY))
        full = write_pth(Path(tmp) / "depth_anything_vitl14.pth", make_weights(VITL)) if "--no-full" not in sys.argv \
            else None
        import cv2
        import torch
        from transformers.models.dinov2 import modeling_dinov2

        torch.set_num_threads(2)
        own_pos = modeling_dinov2.Dinov2Embeddings.interpolate_pos_encoding
        image = test_image()
        out["image"] = image
        sd = torch.load(tiny, weights_only=True)
        v1, v2 = build(sd, TINY, False), build(sd, TINY, True)
        # transformers' own position embeddings (size=, no offset)
        _, out["tiny_v1_own_pred"], _, _ = extension(v1, image, SMALL)
        modeling_dinov2.Dinov2Embeddings.interpolate_pos_encoding = dinov2_pos
        out["tiny_input"], out["tiny_v1_pred"], out["tiny_v1_map"], out["tiny_v1_depth"] = extension(v1, image, SMALL)
        _, out["tiny_v2_pred"], out["tiny_v2_map"], _ = extension(v2, image, SMALL)
        # the preprocessor at processor resolution 96 (resize_image_with_pad), the extension's 518
        padded, (th, tw) = resize_image_with_pad(image, 96)
        out["res96_input"] = padded
        _, _, m, _ = extension(v1, padded, 518)
        out["res96_v1_map"] = m[:th, :tw]
        _, _, m, _ = extension(v2, padded, 518)
        out["res96_v2_map"] = m[:th, :tw]
        print("tiny:", out["tiny_v1_pred"].shape, "v1 range", out["tiny_v1_pred"].min(), out["tiny_v1_pred"].max(),
              "positive", float((out["tiny_v1_pred"] > 0).mean()), "own-pos diff",
              float(np.abs(out["tiny_v1_own_pred"] - out["tiny_v1_pred"]).max()))
        if full is not None:
            del sd, v1, v2
            t = time.time()
            big = test_image(74, 78, seed=7)
            model = build(torch.load(full, weights_only=True), VITL, False)
            out["full_image"] = big
            _, pred, out["full_map"], out["full_depth"] = extension(model, big, 518)
            print("ViT-L at 518:", pred.shape, "range", pred.min(), pred.max(), "positive",
                  float((pred > 0).mean()), f"{time.time() - t:.1f} s")
            del model
        modeling_dinov2.Dinov2Embeddings.interpolate_pos_encoding = own_pos
    import torch.nn.functional as F

    rng = np.random.default_rng(3)
    out["cubic_in"] = rng.uniform(-2, 3, (20, 17, 3))
    out["cubic_up"] = cv2.resize(out["cubic_in"], (45, 37), interpolation=cv2.INTER_CUBIC)
    out["cubic_down"] = cv2.resize(out["cubic_in"], (13, 11), interpolation=cv2.INTER_CUBIC)
    out["bil_in"] = rng.standard_normal((9, 11)).astype(np.float32)
    t = torch.from_numpy(out["bil_in"])[None, None]
    out["bil_up"] = F.interpolate(t, (23, 31), mode="bilinear", align_corners=False)[0, 0].numpy()
    out["bil_down"] = F.interpolate(t, (5, 4), mode="bilinear", align_corners=False)[0, 0].numpy()
    pos = torch.from_numpy(rng.standard_normal((1, 37 * 37 + 1, 8)).astype(np.float32))
    out["pos_in"] = pos.numpy()
    grid = pos[:, 1:].reshape(1, 37, 37, 8).permute(0, 3, 1, 2)
    for name, kw in (("pos_dinov2", dict(scale_factor=((10 + 0.1) / 37, (12 + 0.1) / 37))),
                     ("pos_size", dict(size=(10, 12)))):
        g = F.interpolate(grid, mode="bicubic", align_corners=False, **kw)
        out[name] = g.permute(0, 2, 3, 1).reshape(1, 120, 8).numpy()
    dest = ROOT / "tests" / "data" / "depthanything" / "refs.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if "--no-full" in sys.argv and dest.is_file():  # keep the full-size run's references
        old = np.load(dest)
        out.update({k: old[k] for k in old.files if k.startswith("full_")})
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
