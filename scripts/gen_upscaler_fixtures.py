"""Small ESRGAN-family upscalers with random weights, and spandrel's output on a test image (torch venv).

    /work/refvenv/bin/pip install spandrel
    /work/refvenv/bin/python scripts/gen_upscaler_fixtures.py

Writes tests/data/upscalers/: each model built with spandrel's architecture classes and seeded random
weights, saved as ``<name>.safetensors`` (and two as ``<name>.pth``, a plain state dict), loaded back through
``spandrel.ModelLoader`` (so spandrel's detection reads the same files sdrt does), and run on a random
RGB test image in [0, 1]; ``refs.npz`` holds the image (``image``) and each output (``<name>``), with the
scale spandrel detected (``<name>/scale``).

- ``rrdb_x4_new``: RRDBNet nf 8, nb 2, scale 4, saved in the new (Real-ESRGAN) key layout
  (``conv_first``, ``body.N.rdbK.convJ``, ``conv_up1``...);
- ``rrdb_x4_old``: the same weights in spandrel's old layout (``model.0``, ``model.1.sub.N.RDBK.convJ.0``);
- ``rrdb_x2_new``: RRDBNet nf 8, nb 1, scale 2 with pixel unshuffle (RealESRGAN_x2plus's layout);
- ``rrdb_x1_new``: RRDBNet nf 8, nb 1, pixel unshuffle 4 then x4 (scale 1, Real-ESRGAN's x1 layout);
- ``compact_x4``: SRVGGNetCompact nf 8, 3 convs, scale 4, PReLU (realesr-general-x4v3's layout);
- ``compact_x2``: SRVGGNetCompact nf 6, 2 convs, scale 2.

spandrel's RRDB fixes the growth channels at 32.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from spandrel import ModelLoader
from spandrel.architectures.Compact import Compact
from spandrel.architectures.ESRGAN import ESRGAN

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "upscalers"
#: the models also written as PyTorch pickles (.pth), for the .pth tests
PTH = ("rrdb_x4_old", "compact_x2")


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif p.ndim == 1:  # PReLU slopes
                p.copy_(torch.rand(p.shape, generator=g) * 0.4)
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / fan_in) ** 0.5)


def to_new_layout(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """spandrel's old RRDBNet keys -> the new layout (Real-ESRGAN's RRDBNet)."""
    n = max(int(k.split(".")[1]) for k in sd if k.startswith("model."))
    nb = max(int(m.group(1)) for k in sd if (m := re.match(r"model\.1\.sub\.(\d+)\.RDB", k))) + 1
    out = {}
    ups = sorted({int(k.split(".")[1]) for k in sd if k.startswith("model.") and 2 < int(k.split(".")[1]) < n - 2})
    for k, v in sd.items():
        if m := re.match(r"model\.1\.sub\.(\d+)\.RDB(\d)\.conv(\d)\.0\.(weight|bias)", k):
            out[f"body.{m[1]}.rdb{m[2]}.conv{m[3]}.{m[4]}"] = v
        elif k.startswith(f"model.1.sub.{nb}."):
            out["conv_body." + k.split(".")[-1]] = v
        elif k.startswith("model.0."):
            out["conv_first." + k.split(".")[-1]] = v
        elif k.startswith(f"model.{n}."):
            out["conv_last." + k.split(".")[-1]] = v
        elif k.startswith(f"model.{n - 2}."):
            out["conv_hr." + k.split(".")[-1]] = v
        else:
            i = int(k.split(".")[1])
            out[f"conv_up{ups.index(i) + 1}." + k.split(".")[-1]] = v
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    image = np.random.default_rng(7).random((1, 3, 24, 20), dtype=np.float32)
    refs: dict[str, np.ndarray] = {"image": image}
    x4 = ESRGAN(in_nc=3, out_nc=3, num_filters=8, num_blocks=2, scale=4)
    randomize(x4, 1)
    x2 = ESRGAN(in_nc=12, out_nc=3, num_filters=8, num_blocks=1, scale=4, shuffle_factor=2)
    randomize(x2, 2)
    x1 = ESRGAN(in_nc=48, out_nc=3, num_filters=8, num_blocks=1, scale=4, shuffle_factor=4)
    randomize(x1, 5)
    c4 = Compact(num_in_ch=3, num_out_ch=3, num_feat=8, num_conv=3, upscale=4)
    randomize(c4, 3)
    c2 = Compact(num_in_ch=3, num_out_ch=3, num_feat=6, num_conv=2, upscale=2)
    randomize(c2, 4)
    models = {
        "rrdb_x4_new": to_new_layout(x4.state_dict()),
        "rrdb_x4_old": dict(x4.state_dict()),
        "rrdb_x2_new": to_new_layout(x2.state_dict()),
        "rrdb_x1_new": to_new_layout(x1.state_dict()),
        "compact_x4": dict(c4.state_dict()),
        "compact_x2": dict(c2.state_dict()),
    }
    for name, sd in models.items():
        sd = {k: v.detach().contiguous().clone() for k, v in sd.items()}
        save_file(sd, str(OUT / f"{name}.safetensors"))
        if name in PTH:
            torch.save(sd, OUT / f"{name}.pth")
        desc = ModelLoader().load_from_file(OUT / f"{name}.safetensors")
        desc.model.eval()
        with torch.no_grad():
            y = desc.model(torch.from_numpy(image)).numpy()
        refs[name] = y.astype(np.float32)
        refs[f"{name}/scale"] = np.array(desc.scale)
        print(name, desc.architecture.id, "scale", desc.scale, tuple(y.shape), f"{sum(v.numel() for v in sd.values())} params")
    np.savez_compressed(OUT / "refs.npz", **refs)
    print(OUT / "refs.npz")


if __name__ == "__main__":
    main()
