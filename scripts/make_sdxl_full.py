"""A full-size Stable Diffusion XL base architecture with random weights, in Optimum's ONNX layout, for the plan
check (issue 37: an SDXL pipeline at two sizes) and memory work at SDXL's size.

Needs torch, diffusers, transformers and onnx (/work/refvenv). Writes OUT (default /work/models/sdxl-full; keep it
out of git, it is 13 GB): ``text_encoder/``, ``text_encoder_2/``, ``unet/`` (``model.onnx`` +
``model.onnx_data``), ``vae_encoder/``, ``vae_decoder/``, ``tokenizer/``, ``tokenizer_2/``, ``scheduler/``,
``model_index.json`` and a ``config.json`` per part, each graph with Optimum's dynamic axes (batch, height, width,
sequence) and names. Parts over protobuf's 2 GB keep their weights in one ``model.onnx_data`` beside the graph,
as Optimum writes them.

The configuration is stabilityai/stable-diffusion-xl-base-1.0's: ``UNet2DConditionModel`` 320/640/1280 with 1, 2
and 10 transformer layers, heads of 64 channels, cross-attention 2048, linear projections, text-time embedding (256 per
time id, 2816 in); CLIP ViT-L/14 (quick_gelu) and OpenCLIP ViT-bigG/14 (32 layers, 1280 wide, gelu, projection 1280)
text models; ``AutoencoderKL`` 128/256/512/512, scaling 0.13025. Weights are drawn at 1/sqrt(fan-in)
(``gen_pipeline_refs.scale_weights``). Each part is built, exported and dropped in turn, and torch's one file per
weight is gathered into ``model.onnx_data`` by streaming (``make_sd15_full.gather_external``) (never the whole UNet in memory twice): at most 13 GB of
memory, at the UNet's export, and 3.5 minutes on 2 cores of a Sapphire Rapids (beside a CI run).

    /work/refvenv/bin/python scripts/make_sdxl_full.py [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import time
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]  # not needed; see gen_pipeline_refs.py

import torch  # noqa: E402
from diffusers import AutoencoderKL, UNet2DConditionModel  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_pipeline_refs import (  # noqa: E402
    RELEASE_SCHEDULERS,
    _Text,
    _Unet,
    _VaeDecoder,
    _VaeEncoder,
    scale_weights,
)
from make_sd15_full import _export, tokenizer  # noqa: E402


def text_config(width: int, layers: int, heads: int, act: str) -> CLIPTextConfig:
    return CLIPTextConfig(vocab_size=49408, hidden_size=width, intermediate_size=4 * width, num_attention_heads=heads,
                          num_hidden_layers=layers, max_position_embeddings=77, hidden_act=act, projection_dim=width,
                          bos_token_id=49406, eos_token_id=49407, pad_token_id=49407)


def unet_model() -> UNet2DConditionModel:
    return UNet2DConditionModel(
        sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816, norm_num_groups=32).eval()


def vae_model() -> AutoencoderKL:
    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=32,
        sample_size=1024, scaling_factor=0.13025, force_upcast=True).eval()


def export(module, args, path: Path, inputs, outputs, dynamic, external: bool = False) -> None:
    t0 = time.time()
    _export(module, args, path, inputs, outputs, dynamic, external=external)
    print(f"{path.parent.name} exported in {time.time() - t0:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/work/models/sdxl-full"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.time()
    torch.manual_seed(0)
    tokenizer(out / "tokenizer")
    tokenizer(out / "tokenizer_2")
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # OpenCLIP's tokenizer pads with "!"
        f = out / "tokenizer_2" / name
        f.write_text(json.dumps(dict(json.loads(f.read_text()), pad_token="!"), indent=2) + "\n")
    (out / "scheduler").mkdir()
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(RELEASE_SCHEDULERS["sdxl"], indent=2) + "\n")
    seq = {0: "batch_size", 1: "sequence_length"}
    ids = torch.zeros((1, 77), dtype=torch.int64)  # Optimum's SDXL text encoders take int64 ids
    for part, cls, cfg, projection, seed in (
            ("text_encoder", CLIPTextModel, text_config(768, 12, 12, "quick_gelu"), False, 1),
            ("text_encoder_2", CLIPTextModelWithProjection, text_config(1280, 32, 20, "gelu"), True, 2)):
        model = cls(cfg).eval()
        scale_weights(model, seed)
        hidden = [f"hidden_states.{i}" for i in range(cfg.num_hidden_layers + 1)]
        outs = ["text_embeds", "last_hidden_state", *hidden] if projection else \
            ["last_hidden_state", "pooler_output", *hidden]
        export(_Text(model, projection), (ids,), out / part / "model.onnx", ["input_ids"], outs,
               {n: {0: "batch_size"} for n in ["input_ids", *outs]}, external=projection)
        model.config.to_json_file(out / part / "config.json")
        del model
        gc.collect()
    unet = unet_model()
    scale_weights(unet, 3)
    image_axes = {0: "batch_size", 2: "height", 3: "width"}
    lat, lat_w = 64, 68  # traced at a non-square size, so no height is taken for a width
    export(_Unet(unet, True), (torch.randn(2, 4, lat, lat_w), torch.tensor(999.0), torch.randn(2, 77, 2048),
                               torch.randn(2, 1280), torch.randn(2, 6)),
           out / "unet" / "model.onnx", ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"],
           ["out_sample"], {"sample": image_axes, "encoder_hidden_states": seq, "text_embeds": {0: "batch_size"},
                            "time_ids": {0: "batch_size"}, "out_sample": image_axes}, external=True)
    unet.save_config(out / "unet")
    del unet
    gc.collect()
    vae = vae_model()
    scale_weights(vae, 4)
    latent_axes = {0: "batch_size", 2: "height_latent", 3: "width_latent"}
    export(_VaeEncoder(vae), (torch.randn(1, 3, lat * 8, lat_w * 8),), out / "vae_encoder" / "model.onnx",
           ["sample"], ["latent_parameters"], {"sample": image_axes, "latent_parameters": latent_axes})
    export(_VaeDecoder(vae), (torch.randn(1, 4, lat, lat_w),), out / "vae_decoder" / "model.onnx",
           ["latent_sample"], ["sample"], {"latent_sample": latent_axes, "sample": image_axes})
    for part in ("vae_encoder", "vae_decoder"):
        vae.save_config(out / part)
    index = {"_class_name": "ORTStableDiffusionXLPipeline", "_diffusers_version": "0.39.0",
             "force_zeros_for_empty_prompt": True, "scheduler": ["diffusers", "EulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModel"],
             "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
             "unet": ["diffusers", "UNet2DConditionModel"], "vae_encoder": ["optimum", "ORTModel"],
             "vae_decoder": ["optimum", "ORTModel"]}
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"done in {time.time() - t0:.0f} s: {out}", flush=True)


if __name__ == "__main__":
    main()
