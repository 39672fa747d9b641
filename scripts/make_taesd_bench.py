"""A full-size TAESD decoder (diffusers' AutoencoderTiny with its default, real TAESD widths; random weights)
exported to ONNX, for timing previews against a step (``python -m bench.preview --taesd FILE``).

    /work/refvenv/bin/python scripts/make_taesd_bench.py /tmp/taesd-decoder.onnx [--scaled]

Random weights take the same time as TAESD's trained ones (the same layers, 64 channels, three upsamplings);
nothing is committed. Input ``latent_sample`` (1, 4, h, w), output ``sample`` (1, 3, 8h, 8w). torch's
default initialisation gives a nearly flat image (a spread of 2-3 levels); ``--scaled`` draws the weights as
``scripts/gen_preview_refs.py`` does (each layer's activations O(1)), so the image has structure to compare
previews on (``python -m bench.preview --quality``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]  # as gen_pipeline_refs: the venv's one does not load

import torch  # noqa: E402
from diffusers import AutoencoderTiny  # noqa: E402


class _Decode(torch.nn.Module):
    def __init__(self, vae: AutoencoderTiny) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample):
        return self.vae.decode(latent_sample, return_dict=False)[0]


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--scaled"]
    out = Path(args[0] if args else "/tmp/taesd-decoder.onnx")
    torch.manual_seed(0)
    vae = AutoencoderTiny().eval()  # the default config is TAESD's
    if "--scaled" in sys.argv:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in vae.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() ** 0.5 if p.ndim >= 2 else 20.0))
    params = sum(p.numel() for p in vae.decoder.parameters())
    with torch.no_grad():
        torch.onnx.export(_Decode(vae), (torch.randn(1, 4, 64, 64),), str(out), input_names=["latent_sample"],
                          output_names=["sample"], opset_version=17, dynamo=False,
                          dynamic_axes={"latent_sample": {2: "h", 3: "w"}, "sample": {2: "H", 3: "W"}})
    print(out, f"decoder parameters {params / 1e6:.2f} M")


if __name__ == "__main__":
    main()
