"""Tiny TAESD-architecture decoders (diffusers' AutoencoderTiny, random weights) exported to ONNX, with references.

    /work/refvenv/bin/python scripts/gen_preview_refs.py     # tests/data/preview/tiny-taesd{,-16ch}/

Two decoders: a 4-channel one (TAESD / TAESDXL shape, scaling 1, shift 0) and a 16-channel one with
TAEF1's scaling and shift factors (0.3611, 0.1159), each in Optimum's vae_decoder layout
(``latent_sample`` -> ``sample`` in [-1, 1], exactly what ``AutoencoderTiny.decode`` returns) with
the model's config.json. ``refs.npz`` holds latents (as a sampler holds them) and diffusers' preview of
each: ``decode(latent / scaling_factor + shift_factor)``, mapped to uint8 as ComfyUI does.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]  # the venv's torchvision does not load

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from diffusers import AutoencoderTiny  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "preview"


class _Decode(torch.nn.Module):
    def __init__(self, vae: AutoencoderTiny) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample):
        return self.vae.decode(latent_sample, return_dict=False)[0]


def build(channels: int, scaling: float, shift: float, seed: int) -> AutoencoderTiny:
    torch.manual_seed(seed)
    vae = AutoencoderTiny(encoder_block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
                          num_encoder_blocks=(1, 1, 1, 1), num_decoder_blocks=(1, 1, 1, 1), latent_channels=channels,
                          scaling_factor=scaling, shift_factor=shift).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights that keep activations O(1), so the image has structure
        for _, p in vae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() ** 0.5 if p.ndim >= 2 else 20.0))
    return vae


def main() -> None:
    torch.set_num_threads(1)
    for name, channels, scaling, shift in (("tiny-taesd", 4, 1.0, 0.0), ("tiny-taesd-16ch", 16, 0.3611, 0.1159)):
        vae = build(channels, scaling, shift, 5 + channels)
        folder = OUT / name
        (folder / "vae_decoder").mkdir(parents=True, exist_ok=True)
        path = folder / "vae_decoder" / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(_Decode(vae), (torch.randn(1, channels, 8, 8),), str(path),
                              input_names=["latent_sample"], output_names=["sample"],
                              dynamic_axes={"latent_sample": {0: "batch", 2: "height", 3: "width"},
                                            "sample": {0: "batch", 2: "h", 3: "w"}},
                              opset_version=17, dynamo=False)
        onnx.checker.check_model(onnx.load(str(path)))
        vae.save_config(folder / "vae_decoder")
        refs = {}
        g = torch.Generator().manual_seed(11)
        for i, (h, w) in enumerate([(8, 8), (6, 10)]):
            latent = torch.randn(1, channels, h, w, generator=g) * 1.2
            with torch.no_grad():
                img = vae.decode(latent / vae.config.scaling_factor + vae.config.shift_factor).sample
            preview = ((img[0].permute(1, 2, 0) + 1) / 2).clamp(0, 1).mul(255).to(torch.uint8).numpy()
            refs[f"latent_{i}"] = latent.numpy()
            refs[f"float_{i}"] = img.numpy()
            refs[f"preview_{i}"] = preview
            print(name, i, preview.shape, float(preview.std()))
        np.savez_compressed(folder / "refs.npz", **refs)
        print(name, "size", sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()))


if __name__ == "__main__":
    main()
