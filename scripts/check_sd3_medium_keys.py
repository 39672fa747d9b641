"""SD 3 Medium's Stability keys, as the tests write them, against diffusers 0.42.1's own single-file loader.

- Full size: the key set of ``sd3_medium.safetensors``' MMDiT that tests/checkpoint/test_sd3_medium.py writes
  (``flow_file_helpers.sd3_medium_shapes``, 491 tensors; meta tensors, nothing allocated) is called ``sd3`` by
  diffusers' ``infer_diffusers_model_type`` (SD 3 Medium: ``pos_embed`` 36864 long; 147456 is SD 3.5 Medium's), and
  ``convert_sd3_transformer_checkpoint_to_diffusers`` turns it into exactly the parameters (names and shapes) of
  ``SD3Transformer2DModel`` with stable-diffusion-3-medium-diffusers' config (``make_shipped_graphs.SD3M``, the
  shipped graph's), every key used.
- Tiny: the fixture's transformer (tests/data/pipelines/tiny-sd3-medium) written in Stability's keys by the tests'
  ``flow_file_helpers.sd3_transformer`` and read back by diffusers' converter gives the fixture's own values, so the
  tests' writer inverts diffusers' converter for this layout (no q/k norm, no ``attn2``).

    PYTHONPATH=scripts:scripts/_tvblock:core/src:tests/checkpoint /work/refvenv/bin/python scripts/check_sd3_medium_keys.py

Writes scripts/sd3_medium_keys_report.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts" / "_tvblock"), str(ROOT / "scripts"), str(ROOT / "core" / "src"),
                str(ROOT / "tests" / "checkpoint")]

import make_shipped_graphs as msg  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvblock  # noqa: E402,F401
from diffusers import SD3Transformer2DModel  # noqa: E402
from diffusers.loaders.single_file_utils import (  # noqa: E402
    convert_sd3_transformer_checkpoint_to_diffusers,
    infer_diffusers_model_type,
)
from flow_file_helpers import sd3_medium_shapes, sd3_transformer  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

REPORT = ROOT / "scripts" / "sd3_medium_keys_report.json"
MED = ROOT / "tests" / "data" / "pipelines" / "tiny-sd3-medium"


def full_size() -> dict:
    shapes = sd3_medium_shapes()
    ckpt = {k: torch.empty(v, dtype=torch.float16, device="meta") for k, v in shapes.items()}
    kind = infer_diffusers_model_type(ckpt)
    assert kind == "sd3", kind
    left = dict(ckpt)
    conv = convert_sd3_transformer_checkpoint_to_diffusers(left)
    with torch.device("meta"):
        model = SD3Transformer2DModel(**msg.SD3M)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in conv.items()}
    diff = sorted(set(want) ^ set(got)) + sorted(k for k in set(want) & set(got) if want[k] != got[k])
    assert not diff, diff[:10]
    assert not left, sorted(left)[:10]  # the converter pops every key it reads: none left over
    params = sum(int(np.prod(v)) for v in want.values())
    print(f"  full size: {len(shapes)} Stability keys -> diffusers model type {kind!r}; converted = "
          f"SD3Transformer2DModel(SD3M)'s {len(want)} parameters ({params / 1e6:.0f}M), names and shapes")
    return {"stability_keys": len(shapes), "diffusers_model_type": kind, "diffusers_parameters": len(want),
            "params": params, "keys_left_unconverted": len(left)}


def tiny() -> dict:
    p = {k: v.astype(np.float32) for k, v in load_file(str(MED / "transformer" /
                                                           "diffusion_pytorch_model.safetensors")).items()}
    pos = p.pop("pos_embed.pos_embed")
    st = sd3_transformer(p, pos.shape)
    st["pos_embed"] = pos
    conv = convert_sd3_transformer_checkpoint_to_diffusers({k: torch.from_numpy(v) for k, v in st.items()})
    full = {**p, "pos_embed.pos_embed": pos}
    assert set(conv) == set(full), sorted(set(conv) ^ set(full))[:10]
    worst = max(float(np.abs(conv[k].numpy() - v).max()) for k, v in full.items())
    assert worst == 0.0, worst
    print(f"  tiny: {len(st)} Stability keys -> diffusers' converter -> the fixture's {len(full)} tensors exactly")
    return {"stability_keys": len(st), "diffusers_tensors": len(full), "max_abs_diff": worst}


def main() -> None:
    report = {"full_size": full_size(), "tiny_fixture": tiny()}
    REPORT.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
