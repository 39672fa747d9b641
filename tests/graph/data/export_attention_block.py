"""Regenerate tests/graph/data/attention_block.onnx and attention_block_ref.npz with torch.

    python -m venv /tmp/t && /tmp/t/bin/pip install torch==2.13.0 onnx numpy
    /tmp/t/bin/python tests/graph/data/export_attention_block.py

Only this script uses torch; the tests read the committed .onnx and .npz.
The module is a small Stable Diffusion spatial-transformer block (GroupNorm,
1x1 conv proj_in, self-attention with bias-free Linear q/k/v, proj_out,
residual) exported with dynamic batch/height/width axes by the TorchScript
exporter, which writes the runtime-shape chains (Shape/Gather/Unsqueeze/
Concat/Reshape) that static-shape backends must fold. The .npz holds inputs
and torch's outputs at two shapes, plus a kohya-format LoRA for
``attn.to_q`` / ``proj_in`` and torch's output with it merged into the weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).parent


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h = self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, n, h, c // h).transpose(1, 2)

        q, k, v = split(self.to_q(x)), split(self.to_k(x)), split(self.to_v(x))
        w = torch.softmax(q @ k.transpose(-1, -2) / (c // h) ** 0.5, dim=-1)
        out = (w @ v).transpose(1, 2).reshape(b, n, c)
        return self.to_out(out)


class Block(nn.Module):
    def __init__(self, channels: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, channels)
        self.proj_in = nn.Conv2d(channels, channels, 1)
        self.attn = Attention(channels, heads)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        y = self.proj_in(self.norm(x))
        y = y.reshape(b, c, hh * ww).transpose(1, 2)
        y = self.attn(y)
        y = y.transpose(1, 2).reshape(b, c, hh, ww)
        return x + self.proj_out(y)


def main() -> None:
    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 16, 4, 6)
    torch.onnx.export(
        block, (x,), str(HERE / "attention_block.onnx"), input_names=["sample"], output_names=["out"],
        dynamic_axes={"sample": {0: "batch", 2: "height", 3: "width"}, "out": {0: "batch", 2: "height", 3: "width"}},
        opset_version=17, dynamo=False,
    )
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(2, 16, 4, 6, generator=g)
    x2 = torch.randn(1, 16, 3, 5, generator=g)
    ref = {}
    with torch.no_grad():
        ref["x1"], ref["y1"] = x1.numpy(), block(x1).numpy()
        ref["x2"], ref["y2"] = x2.numpy(), block(x2).numpy()
        # a kohya LoRA: rank 4, alpha 2, on attn.to_q (Linear -> anonymous transposed MatMul) and proj_in (1x1 conv)
        lora = {}
        for module, w in (("attn_to_q", block.attn.to_q.weight), ("proj_in", block.proj_in.weight)):
            out_f, in_f = w.shape[0], w.shape[1]
            down = torch.randn(4, in_f, generator=g) * 0.3
            up = torch.randn(out_f, 4, generator=g) * 0.3
            lora[f"lora_unet_{module}.lora_down.weight"] = down.numpy()
            lora[f"lora_unet_{module}.lora_up.weight"] = up.numpy()
            lora[f"lora_unet_{module}.alpha"] = np.array(2.0, np.float32)
            w += 0.75 * (2.0 / 4) * (up @ down).reshape(w.shape)  # merged at scale 0.75
        ref["y1_lora"] = block(x1).numpy()
    np.savez(HERE / "attention_block_ref.npz", **ref, **{"lora." + k: v for k, v in lora.items()})
    print("wrote", HERE / "attention_block.onnx", (HERE / "attention_block.onnx").stat().st_size, "bytes")


if __name__ == "__main__":
    main()
