"""Check sdrt.testing's transformer bench blocks against diffusers' own modules (tiny size, same weights).

    /work/refvenv/bin/python scripts/check_dit_blocks.py

Builds each block with ``sdrt.testing.dit_blocks`` (no torch), loads its initializers into diffusers'
``FluxTransformerBlock``, ``FluxSingleTransformerBlock`` and ``JointTransformerBlock`` (qk_norm rms_norm),
runs both (onnxruntime, torch) on the block's feeds and prints the largest difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core" / "src"))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from diffusers.models.attention import JointTransformerBlock  # noqa: E402
from diffusers.models.transformers.transformer_flux import (  # noqa: E402
    FluxSingleTransformerBlock,
    FluxTransformerBlock,
)
from onnx import numpy_helper  # noqa: E402

from sdrt.testing import dit_blocks  # noqa: E402


def state(model, prefix: str) -> dict[str, torch.Tensor]:
    out = {}
    for t in model.graph.initializer:
        if not t.name.startswith(prefix):
            continue
        arr = numpy_helper.to_array(t)
        key = t.name[len(prefix):]
        if key.endswith(".weight.T"):
            key, arr = key[: -len(".T")], arr.T
        out[key] = torch.from_numpy(np.ascontiguousarray(arr))
    return out


def main() -> None:
    for name, make in dit_blocks.BUILDERS.items():
        model, feeds = make("tiny")
        cfg = dit_blocks.SIZES[name]["tiny"]
        d, heads = cfg["dim"], cfg["heads"]
        if name == "flux_double_block":
            block, prefix = FluxTransformerBlock(d, heads, d // heads), "transformer_blocks.0."
        elif name == "flux_single_block":
            block, prefix = FluxSingleTransformerBlock(d, heads, d // heads), "single_transformer_blocks.0."
        else:
            block = JointTransformerBlock(d, heads, d // heads, context_pre_only=False, qk_norm="rms_norm")
            prefix = "transformer_blocks.0."
        missing, unexpected = block.load_state_dict(state(model, prefix), strict=False)
        assert not unexpected, unexpected
        left = list(missing)  # every parameter of the torch module must come from the ONNX block
        block.eval()
        t = {k: torch.from_numpy(v) for k, v in feeds.items()}
        with torch.no_grad():
            rot = (t["freqs_cos"], t["freqs_sin"]) if "freqs_cos" in t else None
            if name == "flux_double_block":
                enc, img = block(t["hidden_states"], t["encoder_hidden_states"], t["temb"], image_rotary_emb=rot)
                want = [enc, img]
            elif name == "flux_single_block":
                n_txt = cfg["txt"]
                enc, img = block(t["hidden_states"][:, n_txt:], t["hidden_states"][:, :n_txt], t["temb"],
                                 image_rotary_emb=rot)
                want = [torch.cat([enc, img], 1)]
            else:
                enc, img = block(t["hidden_states"], t["encoder_hidden_states"], t["temb"])
                want = [enc, img]
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        err = max(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want))
        print(f"{name}: max |onnx - diffusers| {err:.2e}; torch params not in the ONNX block: {left}")
        assert err < 1e-4 and not left, name


if __name__ == "__main__":
    main()
