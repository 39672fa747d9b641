"""A full-size Stable Diffusion 1.5 architecture with random weights, for the end-to-end bench and memory work.

Needs torch, diffusers, transformers and onnx (/work/refvenv). Writes, under OUT (default /work/models/sd15-full;
keep it out of git, it is 5.2 GB):

- ``onnx/``: Optimum's ONNX layout (``text_encoder/model.onnx``, ``unet/model.onnx`` + ``model.onnx_data``,
  ``vae_encoder``, ``vae_decoder``, ``tokenizer/``, ``scheduler/``, ``model_index.json``, a ``config.json`` per
  part), the UNet and VAE with dynamic batch, height and width axes (Optimum's axis names);
- ``diffusers/``: the same weights as diffusers' folder (``save_pretrained``, safetensors), for the torch row;
- ``sd15-full.safetensors`` (``--ldm``): the same weights as an LDM single file (``model.diffusion_model.*``,
  ``first_stage_model.*``, ``cond_stage_model.transformer.text_model.*``), written by ``scripts/make_ldm_single_file.py``.

The configuration is SD 1.5's (``UNet2DConditionModel`` 320/640/1280/1280, 8 heads, cross-attention 768;
``AutoencoderKL`` 128/256/512/512, scaling 0.18215; CLIP ViT-L/14 text model, 12 layers, 768 wide, 49408 tokens;
CLIP's real tokenizer from tests/data/clip-tokenizer). Weights are drawn at 1/sqrt(fan-in) (as
gen_pipeline_refs.scale_weights), so activations stay O(1) and images show structure, not flat colour.

    /work/refvenv/bin/python scripts/make_sd15_full.py [--out DIR] [--ldm]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]  # not needed; see gen_pipeline_refs.py

import torch  # noqa: E402
from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_pipeline_refs import (  # noqa: E402
    OPSET,
    RELEASE_SCHEDULERS,
    _Text,
    _Unet,
    _VaeDecoder,
    _VaeEncoder,
    optimum_model_index,
    scale_weights,
)

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "clip-tokenizer"


def tokenizer(folder: Path) -> CLIPTokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        (folder / name).write_bytes(gzip.decompress((TOKENIZER / f"{name}.gz").read_bytes()))
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, folder / name)
    return CLIPTokenizer.from_pretrained(str(folder))


def build(work: Path) -> StableDiffusionPipeline:
    torch.manual_seed(0)
    tok = tokenizer(work / "tokenizer")
    text = CLIPTextModel(CLIPTextConfig(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
        max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768, bos_token_id=49406,
        eos_token_id=49407, pad_token_id=49407)).eval()
    unet = UNet2DConditionModel(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280, 1280),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, cross_attention_dim=768,
        attention_head_dim=8, norm_num_groups=32).eval()
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=32,
        sample_size=512, scaling_factor=0.18215).eval()
    for seed, module in enumerate((text, unet, vae), start=1):
        scale_weights(module, seed)
    cfg = {k: v for k, v in RELEASE_SCHEDULERS["sd15"].items() if not k.startswith("_")}
    sched = PNDMScheduler.from_config(cfg)
    return StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tok, unet=unet, scheduler=sched,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def gather_external(path: Path) -> None:
    """torch's one file per weight (a graph over 2 GB) into one ``model.onnx_data`` beside ``path``, streamed."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    folder = path.parent
    loose: set[Path] = set()
    with open(folder / "model.onnx_data", "wb") as out:
        for t in model.graph.initializer:
            if not uses_external_data(t):
                if len(t.raw_data) < 1024:
                    continue
                data = t.raw_data
                t.ClearField("raw_data")
            else:
                info = {e.key: e.value for e in t.external_data}
                src = folder / info["location"]
                with open(src, "rb") as f:
                    f.seek(int(info.get("offset", 0)))
                    data = f.read(int(info["length"])) if "length" in info else f.read()
                loose.add(src)
                del t.external_data[:]
            offset = out.tell()
            out.write(data)
            for k, v in (("location", "model.onnx_data"), ("offset", str(offset)), ("length", str(len(data)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            t.data_location = onnx.TensorProto.EXTERNAL
    onnx.save_model(model, str(path))
    for f in loose:
        f.unlink()


def _export(module, args, path: Path, inputs, outputs, dynamic, external: bool = False) -> None:
    """torch.onnx.export, then (``external``) every weight into one ``model.onnx_data`` beside it
    (``gather_external``): the UNet is over protobuf's 2 GB, so torch writes one file per weight."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=dynamic,
                          opset_version=OPSET, dynamo=False, do_constant_folding=True)
    if external:
        gather_external(path)
    onnx.checker.check_model(str(path))


def export_onnx(pipe: StableDiffusionPipeline, tok_dir: Path, torch_dir: Path, out: Path) -> None:
    out.mkdir(parents=True)
    shutil.copytree(tok_dir, out / "tokenizer")
    (out / "scheduler").mkdir()
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(RELEASE_SCHEDULERS["sd15"], indent=2) + "\n")
    batch = {0: "batch"}
    hidden = [f"hidden_states.{i}" for i in range(13)]
    t0 = time.time()
    _export(_Text(pipe.text_encoder, False), (torch.zeros((1, 77), dtype=torch.int32),),
            out / "text_encoder" / "model.onnx", ["input_ids"], ["last_hidden_state", "pooler_output", *hidden],
            {n: batch for n in ["input_ids", "last_hidden_state", "pooler_output", *hidden]})
    print(f"text_encoder exported in {time.time() - t0:.0f} s", flush=True)
    image_axes = {0: "batch_size", 2: "height", 3: "width"}
    latent_axes = {0: "batch_size", 2: "height_latent", 3: "width_latent"}
    lat, lat_w = 64, 64
    t0 = time.time()
    _export(_Unet(pipe.unet, False),
            (torch.randn(2, 4, lat, lat_w), torch.tensor([999.0, 999.0]), torch.randn(2, 77, 768)),
            out / "unet" / "model.onnx", ["sample", "timestep", "encoder_hidden_states"], ["out_sample"],
            {"sample": image_axes, "timestep": batch, "encoder_hidden_states": {0: "batch_size", 1: "sequence"},
             "out_sample": image_axes}, external=True)
    print(f"unet exported in {time.time() - t0:.0f} s", flush=True)
    t0 = time.time()
    _export(_VaeEncoder(pipe.vae), (torch.randn(1, 3, lat * 8, lat_w * 8),), out / "vae_encoder" / "model.onnx",
            ["sample"], ["latent_parameters"], {"sample": image_axes, "latent_parameters": latent_axes})
    _export(_VaeDecoder(pipe.vae), (torch.randn(1, 4, lat, lat_w),), out / "vae_decoder" / "model.onnx",
            ["latent_sample"], ["sample"], {"latent_sample": latent_axes, "sample": image_axes})
    print(f"vae exported in {time.time() - t0:.0f} s", flush=True)
    for part, src in (("text_encoder", "text_encoder"), ("unet", "unet"), ("vae_encoder", "vae"),
                      ("vae_decoder", "vae")):
        shutil.copy(torch_dir / src / "config.json", out / part / "config.json")
    index = optimum_model_index(json.loads((torch_dir / "model_index.json").read_text()))
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/work/models/sd15-full"))
    ap.add_argument("--ldm", action="store_true", help="also write the LDM single file (make_ldm_single_file.py)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.time()
    pipe = build(out / "_work")
    print(f"built in {time.time() - t0:.0f} s", flush=True)
    pipe.save_pretrained(out / "diffusers", safe_serialization=True)
    export_onnx(pipe, out / "_work" / "tokenizer", out / "diffusers", out / "onnx")
    shutil.rmtree(out / "_work", ignore_errors=True)
    if args.ldm:
        from make_ldm_single_file import convert

        convert(out / "diffusers", out / "sd15-full.safetensors")
    print(f"done in {time.time() - t0:.0f} s: {out}", flush=True)


if __name__ == "__main__":
    main()
