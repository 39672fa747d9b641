"""Export tiny, randomly initialized diffusers/transformers models to ONNX as torch writes them
(TorchScript exporter, opset 17, the way diffusers' and Optimum's export scripts call it; with
``--dynamo``, torch's dynamo exporter at opset 18), to check the Core ML lowering on real exports.
Run with the torch venv (nothing is downloaded):

    /work/venv-torch/bin/python plugin-coreml/scripts/export_tiny_diffusers.py /tmp/tiny-sd [--dynamo]
"""

from __future__ import annotations

import sys
from pathlib import Path

import diffusers.utils
import diffusers.utils.import_utils
import torch
import transformers.utils
import transformers.utils.import_utils

# this venv's torchvision does not match its torch (its C ops fail to register), and diffusers and
# transformers import it when they see it installed; none of these models needs it
for _mod in (transformers.utils, transformers.utils.import_utils, diffusers.utils, diffusers.utils.import_utils):
    _mod.is_torchvision_available = lambda: False  # type: ignore[attr-defined]

from diffusers import AutoencoderKL, UNet2DConditionModel  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel  # noqa: E402


class Decoder(torch.nn.Module):
    def __init__(self, vae: AutoencoderKL) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latent_sample).sample


class TextEncoder(torch.nn.Module):
    def __init__(self, model: CLIPTextModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids)
        return out.last_hidden_state, out.pooler_output


def main(out: Path, dynamo: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8).eval()
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32),
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        layers_per_block=1, norm_num_groups=8).eval()
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=77)).eval()
    with torch.no_grad():
        for model in (unet, vae, clip):  # trained weights: norms are not all ones and zeros, biases not all zero
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        torch.onnx.export(unet, (torch.randn(1, 4, 8, 8), torch.tensor([10.0]), torch.randn(1, 77, 16)),
                          out / "unet.onnx", input_names=["sample", "timestep", "encoder_hidden_states"],
                          output_names=["out_sample"], opset_version=18 if dynamo else 17, dynamo=dynamo)
        torch.onnx.export(Decoder(vae), (torch.randn(1, 4, 8, 8),), out / "vae_decoder.onnx",
                          input_names=["latent_sample"], output_names=["sample"], opset_version=18 if dynamo else 17, dynamo=dynamo)
        torch.onnx.export(TextEncoder(clip), (torch.randint(0, 1000, (1, 77)),), out / "text_encoder.onnx",
                          input_names=["input_ids"], output_names=["last_hidden_state", "pooler_output"],
                          opset_version=18 if dynamo else 17, dynamo=dynamo)
    print(f"wrote {', '.join(p.name for p in sorted(out.glob('*.onnx')))} to {out}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--dynamo"]
    main(Path(args[0] if args else "tiny-sd"), dynamo="--dynamo" in sys.argv[1:])
