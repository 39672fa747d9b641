"""Reference for sdrt's ``inpaint_only+lama`` preprocessor: the extension's own LaMa generator
(``annotator/lama/saicinpainting/training/modules/ffc.py``'s ``FFCResNetGenerator``, built from its
``annotator/lama/config.yaml`` as ``load_checkpoint`` builds it) with the extension's code around it
(``scripts/preprocessor/lama_inpaint.py``, ``annotator/lama/__init__.py``: resize_image_with_pad at 256, the mask
``> 0.5``, the picture zeroed under it, the output kept under the mask, ``* 255`` clipped and truncated, remove_pad,
``cv2.resize`` back, the blend by ``a / 255``), written here from its reading.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_lama.py [EXTENSION]

EXTENSION: a git directory of sd-webui-controlnet (default: the mirror this was written against); its LaMa package
is read with ``git show`` into a temporary folder at reference time (kornia's rotate and pytorch_lightning, which
the generator does not use, stubbed). Checks that sdrt's expected names and shapes for the published file
(ngf 64, 18 blocks) are exactly the generator's state dict, then runs the small seeded generator that
tests/pipelines/lama_helpers.py writes. Writes tests/data/lama/refs.npz.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXTENSION = "/work/.mirror/Mikubill+sd-webui-controlnet/repo"
PACKAGE = "annotator/lama"


def _generator_class(extension: str):
    git = ["git", f"--git-dir={extension}"]
    files = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", PACKAGE], capture_output=True, text=True,
                           check=True).stdout.split()
    tmp = Path(tempfile.mkdtemp(prefix="ref_lama_"))
    for rel in files:
        if rel.endswith((".py", ".yaml")):
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(subprocess.run([*git, "show", f"HEAD:{rel}"], capture_output=True, check=True).stdout)
    (tmp / "annotator" / "__init__.py").write_text("")
    (tmp / "annotator" / "lama" / "__init__.py").write_text("")  # its own imports A1111's modules: not needed
    kornia = types.ModuleType("kornia")
    geometry = types.ModuleType("kornia.geometry")
    transform = types.ModuleType("kornia.geometry.transform")
    transform.rotate = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("unused"))
    kornia.geometry, geometry.transform = geometry, transform
    lightning = types.ModuleType("pytorch_lightning")
    lightning.seed_everything = lambda *a, **k: None
    sys.modules.update({"kornia": kornia, "kornia.geometry": geometry, "kornia.geometry.transform": transform,
                        "pytorch_lightning": lightning})
    sys.path.insert(0, str(tmp))
    import yaml
    from annotator.lama.saicinpainting.training.modules.ffc import FFCResNetGenerator

    cfg = yaml.safe_load((tmp / PACKAGE / "config.yaml").read_text())["generator"]
    return FFCResNetGenerator, cfg


def _kwargs(cfg: dict, ngf: int | None = None, blocks: int | None = None) -> dict:
    """The generator's arguments from the extension's config (``${...}`` interpolations resolved by hand, as OmegaConf
    would: downsample_conv_kwargs' ratios are init_conv_kwargs' ratio_gout, resnet's ratio_gout its ratio_gin)."""
    init = dict(cfg["init_conv_kwargs"])
    down = {"ratio_gin": init["ratio_gout"], "ratio_gout": init["ratio_gout"],
            "enable_lfu": cfg["downsample_conv_kwargs"]["enable_lfu"]}
    res = dict(cfg["resnet_conv_kwargs"])
    res["ratio_gout"] = res["ratio_gin"]
    kw = {k: v for k, v in cfg.items() if k not in ("kind", "init_conv_kwargs", "downsample_conv_kwargs",
                                                    "resnet_conv_kwargs")}
    kw.update(init_conv_kwargs=init, downsample_conv_kwargs=down, resnet_conv_kwargs=res)
    if ngf is not None:
        kw["ngf"], kw["n_blocks"] = ngf, blocks
    return kw


def resize_image_with_pad(img: np.ndarray, resolution: int):
    import cv2

    h, w = img.shape[:2]
    k = float(resolution) / float(min(h, w))
    th, tw = int(np.round(float(h) * k)), int(np.round(float(w) * k))
    img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    pad = lambda x: int(np.ceil(float(x) / 64.0) * 64 - x)  # noqa: E731
    return np.pad(img, [[0, pad(th)], [0, pad(tw)], [0, 0]], mode="edge"), (th, tw)


def lama_inpaint(img: np.ndarray, model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The extension's PreprocessorLamaInpaint.__call__ with LamaInpainting.__call__: (map, feed, raw output)."""
    import cv2
    import torch

    H, W, _ = img.shape
    raw_color, raw_mask = img[:, :, 0:3].copy(), img[:, :, 3:4].copy()
    img_res, (th, tw) = resize_image_with_pad(img, 256)
    color = np.ascontiguousarray(img_res[:, :, 0:3]).astype(np.float32) / 255.0
    mask = np.ascontiguousarray(img_res[:, :, 3:4]).astype(np.float32) / 255.0
    with torch.no_grad():
        color = torch.from_numpy(color).float()
        mask = torch.from_numpy(mask).float()
        mask = (mask > 0.5).float()
        color = color * (1 - mask)
        feed = torch.cat([color, mask], dim=2).permute(2, 0, 1)[None]
        raw = model(feed)
        result = raw[0].permute(1, 2, 0)
        result = result * mask + color * (1 - mask)
        result *= 255.0
        prd = result.detach().cpu().numpy().clip(0, 255).astype(np.uint8)
    prd = np.ascontiguousarray(prd[:th, :tw])
    prd = cv2.resize(prd, (W, H))
    alpha = raw_mask.astype(np.float32) / 255.0
    fin = prd.astype(np.float32) * alpha + raw_color.astype(np.float32) * (1 - alpha)
    fin = fin.clip(0, 255).astype(np.uint8)
    return np.concatenate([fin, raw_mask], axis=2), feed[0].numpy(), raw[0].numpy()


def main() -> None:
    import torch
    from lama_helpers import BLOCKS, NGF, lama_rgba, make_lama

    from sdrt.pipelines.lamafill import expected_shapes

    cls, cfg = _generator_class(sys.argv[1] if len(sys.argv) > 1 else EXTENSION)
    full = cls(**_kwargs(cfg))
    state = {k: tuple(v.shape) for k, v in full.state_dict().items() if not k.endswith("num_batches_tracked")}
    want = expected_shapes(64, 18)
    assert state == want, (set(state) ^ set(want), [k for k in state if k in want and state[k] != want[k]][:5])
    params = sum(int(np.prod(s)) for s in state.values())
    print(f"big-lama (the extension's config.yaml): {len(state)} tensors (+ num_batches_tracked), {params:,} "
          "parameters: names and shapes equal sdrt's expected_shapes(64, 18)")
    del full

    small = cls(**_kwargs(cfg, NGF, BLOCKS)).eval()
    arrays = make_lama()
    small.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()}, strict=True)
    out = {}
    for key, (h, w) in {"up": (72, 100), "down": (264, 280)}.items():
        rgba = lama_rgba(h, w)
        made, feed, raw = lama_inpaint(rgba, small)
        out[f"{key}_rgba"], out[f"{key}_map"] = rgba, made
        if key == "up":  # the generator's output on its first 64 rows (the whole of it would be 1.2 MB)
            out["up_raw"] = np.ascontiguousarray(raw[:, :64], np.float32)
        print(key, rgba.shape, "feed", feed.shape, "raw output range", float(raw.min()), float(raw.max()),
              "changed pixels", int((made[:, :, :3] != rgba[:, :, :3]).any(axis=2).sum()))
    path = ROOT / "tests" / "data" / "lama" / "refs.npz"
    np.savez_compressed(path, **out)
    print("wrote", path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
