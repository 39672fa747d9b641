"""Single checkpoint files end to end: ``sdrt generate FILE "prompt"`` against diffusers' ``from_single_file``.

Steps (each its own process, run one at a time; the machine is shared):

``build sd15|sdxl``
    Writes a full-size checkpoint with random weights, fp16, A1111/LDM keys, under MODELS (default
    /work/models/single; never in git):

    - ``sd15_full_fp16.safetensors``: UNet 860M (``model.diffusion_model.*``), CLIP-L
      (``cond_stage_model.transformer.*``), VAE (``first_stage_model.*``); 2.1 GB.
    - ``sdxl_full_fp16.safetensors``: UNet 2.6B, CLIP-L (``conditioner.embedders.0.transformer.*``), CLIP-G in
      OpenCLIP's layout with its projection (``conditioner.embedders.1.model.*``: fused ``in_proj``,
      ``text_projection`` [in, out]), VAE; 6.9 GB.

    The architectures are the published configurations (make_shipped_graphs.py: SD1_UNET, SDXL_UNET, CLIP_L,
    CLIP_G, VAE4). Every tensor is drawn (make_shipped_graphs._randomize: matrices at 1/sqrt(fan-in), norm scales
    1 +- 0.1, biases 0.02) so no part is zero (diffusers zero-initialises conv_out and proj_out) and activations
    stay O(1). The file is streamed: the header comes from the modules built on the meta device, then each part
    is built in fp16, drawn, written and freed before the next, so the SDXL build holds one part (<= 5.2 GB).

``ref sd15|sdxl``
    diffusers' ``StableDiffusion(XL)Pipeline.from_single_file(FILE, config=DIR, local_files_only=True)``, DIR a
    diffusers-format config folder written here from the published configurations (no hub). The pipeline loads
    the file in fp16 (its peak RSS is recorded against the file size), then each stage runs in float32 (text
    encoders, then the UNet, then the VAE; a stage's module is upcast when it runs and the text encoders are freed
    before the UNet upcasts, so SDXL fits in ~11 GB). Scheduler: ``EulerDiscreteScheduler.from_config`` of the
    release's scheduler configuration (sdrt/data/release/families.json: SD 1.5's PNDM config, SDXL's Euler one).
    Noise: ``torch.Generator("cpu").manual_seed(SEED)``. Writes REFS/NAME.npy (float image in [0, 1]) and .png.

``sdrt sd15|sdxl BACKEND [TREE]``
    Runs ``python -m sdrt generate FILE PROMPT --negative ... --seed --steps --sampler Euler --cfg 7 --width
    --height -o OUT --backend BACKEND`` with /work/venv's python on TREE's sources (default this checkout),
    ``SDRT_PRECISION=fp32`` (diffusers computes in float32 too), under ``/usr/bin/time`` for the peak RSS (a
    watchdog stops it above LIMIT_GB). Compares the PNG with the reference: max and mean absolute difference in
    0-255 levels, PSNR; checks the PNG ``parameters`` chunk's ``Model:`` (the file's stem) and ``Model hash:``
    (the first 10 hex digits of the file's SHA-256).

    OpenVINO runs go through ``sdrt.pipelines.load(FILE, cache=False).generate`` and the CLI's PNG writer (its
    compile cache would write gigabytes to a small disk); ``--cli`` runs the CLI there too (point
    ``$SDRT_CACHE_DIR`` at a scratch folder). ggml runs the CLI. ``SDRT_SINGLE_PRECISION=default`` leaves the
    precision to the backend; ``SDRT_SINGLE_LIMIT_GB`` is the watchdog's limit.

``load sd15|sdxl|flux BACKEND [TREE]``
    Peak RSS of ``sdrt.pipelines.load(FILE)`` alone (parts compile on first use).

``parts sdxl``
    Where a whole float32 SDXL image does not fit the machine: each part of the file (CLIP-L, CLIP-G, VAE decoder,
    UNet) from ``from_single_file`` in float32 against ``open_single_file``'s binding onto the shipped graphs,
    run by onnxruntime (``SDRT_CACHE_DIR`` must be set in the torch venv, which has no platformdirs).

Cases: ``sd15`` (512x512), ``sd15-256`` (the same file at 256x256), ``sdxl`` (512x512: float32 SDXL at 1024 does not
fit beside the other jobs of a 24 GB machine), ``flux`` (256x256; the reduced graphs through ``graph_paths``).
A match is every channel within 3 levels of 255 and the mean within 0.5 (``TOLERANCE``), plus ``Model:`` and
``Model hash:`` right. Figures go to scripts/single_file_pipelines_report.json.

    /work/refvenv/bin/python scripts/check_single_file_pipelines.py build sd15
    /work/refvenv/bin/python scripts/check_single_file_pipelines.py ref sd15
    /work/refvenv/bin/python scripts/check_single_file_pipelines.py sdrt sd15 openvino [/work/wt-x] [--cli]
"""

from __future__ import annotations

import gc
import gzip
import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts" / "_tvblock"), str(ROOT / "scripts"), str(ROOT / "core" / "src")]
MODELS = Path(os.environ.get("SDRT_SINGLE_DIR", "/work/models/single"))
REFS = Path(os.environ.get("SDRT_SINGLE_REFS", "/work/models/refs"))
REPORT = ROOT / "scripts" / "single_file_pipelines_report.json"
TOKENIZER = ROOT / "tests" / "data" / "clip-tokenizer"  # CLIP's published vocab/merges (make_clip_tokenizer.py)
LIMIT_GB = float(os.environ.get("SDRT_SINGLE_LIMIT_GB", "15"))
#: an sdrt image matches diffusers' when every channel value is within MAX levels (0-255) and the mean within MEAN:
#: both compute in float32 from the same fp16 values, so what differs is accumulation order (oneDNN / ggml GEMMs
#: against torch's), carried through the denoising steps of a random-weight network and the VAE, then 8-bit rounding
TOLERANCE = {"max_abs_levels": 3, "mean_abs_levels": 0.5}
#: the compute precision of the sdrt runs: fp32 as diffusers computes; "default": the backend's own choice
PRECISION = os.environ.get("SDRT_SINGLE_PRECISION", "fp32")
#: ``SDRT_SINGLE_MEMORY=8GB``: the CLI run gets ``--memory 8GB`` (sdrt's memory budget: parts released, the UNet
#: streamed in block groups), for a float32 SDXL image on a machine where the whole model does not fit
MEMORY = os.environ.get("SDRT_SINGLE_MEMORY")

PROMPT = "a red fox sitting in fresh snow, golden hour, detailed fur"
NEGATIVE = "blurry, low quality"
CASES = {
    "sd15": dict(file="sd15_full_fp16.safetensors", family="sd1", width=512, height=512, seed=42, steps=4, cfg=7.0),
    # the same file at 256x256: ggml's float32 UNet at 512x512 with CFG needs more memory than this machine has
    "sd15-256": dict(file="sd15_full_fp16.safetensors", family="sd1", width=256, height=256, seed=42, steps=4,
                     cfg=7.0),
    "sdxl": dict(file="sdxl_full_fp16.safetensors", family="sdxl", width=512, height=512, seed=42, steps=4, cfg=7.0),
    # Flux.1 dev at reduced depth (1 double + 1 single block, full width; CLIP-L and T5-XXL 1 layer each) with a
    # full-size 16-channel AE: transformer-only file plus separate clip_l / t5xxl / ae files, as BFL and ComfyUI
    # ship them. cfg 1 is diffusers' true_cfg_scale 1 (no negative pass); guidance is the distilled scale.
    "flux": dict(file="flux_dev_bfl_reduced.safetensors", family="flux-dev", width=256, height=256, seed=42, steps=4,
                 cfg=1.0, negative="", generate={"guidance": 3.5, "max_sequence_length": 512}),
}
# the release files as published (scheduler/scheduler_config.json; vae/config.json's scaling), written out here so
# the reference does not read sdrt's own copy (families.json); the sdrt step records whether they agree
PUBLISHED = {
    "sd1": {"scheduler": {"_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
                          "beta_start": 0.00085, "num_train_timesteps": 1000, "set_alpha_to_one": False,
                          "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None, "clip_sample": False},
            "vae": {"scaling_factor": 0.18215}, "source": "runwayml/stable-diffusion-v1-5"},
    "sdxl": {"scheduler": {"_class_name": "EulerDiscreteScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
                           "beta_start": 0.00085, "clip_sample": False, "interpolation_type": "linear",
                           "num_train_timesteps": 1000, "prediction_type": "epsilon", "sample_max_value": 1.0,
                           "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
                           "timestep_spacing": "leading", "trained_betas": None, "use_karras_sigmas": False},
             "vae": {"scaling_factor": 0.13025}, "source": "stabilityai/stable-diffusion-xl-base-1.0"},
    "flux-dev": {"scheduler": {"_class_name": "FlowMatchEulerDiscreteScheduler", "base_image_seq_len": 256,
                               "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
                               "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True},
                 "vae": {"scaling_factor": 0.3611, "shift_factor": 0.1159}, "source": "black-forest-labs/FLUX.1-dev"},
}
FLUX_FILES = {"text_encoder": "clip_l_1layer.safetensors", "text_encoder_2": "t5xxl_1layer_fp16.safetensors",
              "vae": "ae.safetensors"}
FLUX_GRAPHS = {"transformer": "flux_dev_1x1.onnx", "text_encoder": "clip_l_1layer.onnx",
               "text_encoder_2": "t5xxl_1layer.onnx"}


def flux_load_args() -> dict:
    """``sdrt.pipelines.load`` keywords of the flux case: the separate files and the reduced-depth graphs."""
    return {"text_encoders": [str(MODELS / FLUX_FILES["text_encoder"]), str(MODELS / FLUX_FILES["text_encoder_2"])],
            "vae": str(MODELS / FLUX_FILES["vae"]),
            "graph_paths": {k: str(MODELS / v) for k, v in FLUX_GRAPHS.items()}}


def _report(key: str, sub: str, value) -> None:
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data.setdefault(key, {})[sub] = value
    REPORT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _hwm_mb() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text())[1]) // 1024


# -- build ------------------------------------------------------------------------------------------------------
_ST_DTYPE = {"torch.float16": "F16", "torch.float32": "F32", "torch.bfloat16": "BF16"}


def _module(make, seed: int | None):
    """``make()`` built in fp16: on the meta device (seed None: shapes only) or drawn on the CPU."""
    import torch

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with torch.device("meta"):
            m = make()
    finally:
        torch.set_default_dtype(prev)
    if seed is not None:
        import make_shipped_graphs as msg

        m = m.to_empty(device="cpu")
        msg._randomize(m, seed)
        if hasattr(m, "decoder"):  # the VAE: output conv at 1/4 scale, so the image is mostly inside [-1, 1]
            with torch.no_grad():
                m.decoder.conv_out.weight.mul_(0.25)
    return m


def _parts(case: str):
    """[(name, make, seed, to_ldm)] of a checkpoint: ``to_ldm(state_dict) -> {ldm key: tensor}``."""
    import gen_checkpoint_data as gcd
    import make_shipped_graphs as msg
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    def clip(sd: dict, prefix: str) -> dict:
        return {prefix + k: v for k, v in sd.items() if "position_ids" not in k}

    def vae(sd: dict) -> dict:
        return gcd.vae_to_ldm(sd, 4)

    if case == "sd15":
        up = [t.startswith("CrossAttn") for t in msg.SD1_UNET["up_block_types"]]
        return [("unet", lambda: UNet2DConditionModel(**msg.SD1_UNET), 11, lambda sd: gcd.unet_to_ldm(sd, up, 2)),
                ("vae", lambda: AutoencoderKL(**msg.VAE4), 12, vae),
                ("text_encoder", lambda: CLIPTextModel(CLIPTextConfig(**msg.CLIP_L)), 13,
                 lambda sd: clip(sd, "cond_stage_model.transformer."))]
    up = [t.startswith("CrossAttn") for t in msg.SDXL_UNET["up_block_types"]]
    return [("unet", lambda: UNet2DConditionModel(**msg.SDXL_UNET), 21, lambda sd: gcd.unet_to_ldm(sd, up, 2)),
            ("text_encoder", lambda: CLIPTextModel(CLIPTextConfig(**msg.CLIP_L)), 22,
             lambda sd: clip(sd, "conditioner.embedders.0.transformer.")),
            ("text_encoder_2", lambda: CLIPTextModelWithProjection(CLIPTextConfig(**msg.CLIP_G)), 23,
             lambda sd: {"conditioner.embedders.1.model." + k: v
                         for k, v in gcd.openclip_from_hf(clip(sd, ""), False, 0).items()}),
            ("vae", lambda: AutoencoderKL(**msg.VAE4), 24, vae)]


def build(case: str) -> None:
    import torch
    import tvblock  # noqa: F401

    if case == "flux":
        return build_flux()
    out = MODELS / CASES[case]["file"]
    if out.exists():
        print(out, "exists", flush=True)
        return
    MODELS.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    parts = _parts(case)
    header, order, offset = {}, [], 0
    for _name, make, _, to_ldm in parts:  # pass 1: names, dtypes and shapes from meta modules
        keys = []
        for k, v in to_ldm(_module(make, None).state_dict()).items():
            n = v.numel() * v.element_size()
            header[k] = {"dtype": _ST_DTYPE[str(v.dtype)], "shape": list(v.shape), "data_offsets": [offset, offset + n]}
            offset += n
            keys.append(k)
        order.append(keys)
    header["__metadata__"] = {"format": "pt", "sdrt_check": f"{case}: random weights, seeds {[p[2] for p in parts]}"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = out.with_suffix(".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for (name, make, seed, to_ldm), keys in zip(parts, order):
            t1 = time.time()
            sd = to_ldm(_module(make, seed).state_dict())
            assert list(sd) == keys, f"{name}: key order differs between passes"
            for k in keys:
                v = sd[k].contiguous()
                assert list(v.shape) == header[k]["shape"] and _ST_DTYPE[str(v.dtype)] == header[k]["dtype"], k
                f.write(v.view(torch.uint8).numpy().data)
            del sd
            gc.collect()
            print(f"{name}: {len(keys)} tensors in {time.time() - t1:.0f} s, peak {_hwm_mb()} MB", flush=True)
    tmp.rename(out)
    size = out.stat().st_size
    _report(case, "file", {"name": out.name, "bytes": size, "mb": round(size / 2**20),
                           "build_s": round(time.time() - t0), "build_peak_rss_mb": _hwm_mb(),
                           "sha256_10": _sha10(out)})
    print(out, size, flush=True)


def build_flux() -> None:
    """The Flux files (check_single_files.py's transformer, clip_l and t5xxl recipes, same seeds) and a
    full-size 16-channel AE in BFL's ``ae.safetensors`` keys; the reduced-depth weight-free graphs."""
    import check_single_files as csf
    import gen_checkpoint_data as gcd
    import make_shipped_graphs as msg
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    MODELS.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    f = MODELS / CASES["flux"]["file"]
    # check_single_files.py flux writes the same three files (same recipe and seeds): link them, the disk is small
    for mine, theirs in ((f, "flux_dev_bfl.safetensors"), (MODELS / FLUX_FILES["text_encoder"], "clip_l.safetensors"),
                         (MODELS / FLUX_FILES["text_encoder_2"], "t5xxl_fp16.safetensors")):
        if not mine.exists() and (csf.TMP / theirs).exists():
            os.link(csf.TMP / theirs, mine)
    if not f.exists():
        save_file(csf.random_state(csf.bfl_flux_shapes(True), 1), str(f))
    clip_f, t5_f, ae_f = (MODELS / FLUX_FILES[k] for k in ("text_encoder", "text_encoder_2", "vae"))
    if not clip_f.exists():
        clip = CLIPTextModel(CLIPTextConfig(**{**msg.CLIP_L, "num_hidden_layers": 1})).eval()
        msg._randomize(clip, 2)
        save_file({k: v.half().contiguous() for k, v in clip.state_dict().items() if "position_ids" not in k},
                  str(clip_f))
    if not t5_f.exists():
        t5 = T5EncoderModel(T5Config(**{**msg.T5XXL, "num_layers": 1})).eval()
        msg._randomize(t5, 3)
        save_file({k: v.half().contiguous() for k, v in t5.state_dict().items()
                   if k != "encoder.embed_tokens.weight"}, str(t5_f))
        del t5
    if not ae_f.exists():
        vae = AutoencoderKL(**msg.VAE16)
        msg._randomize(vae, 4)
        vae.decoder.conv_out.weight.data.mul_(0.25)  # as _module: the image mostly inside [-1, 1]
        sd = {k.removeprefix("first_stage_model."): v.contiguous()
              for k, v in gcd.vae_to_ldm(vae.state_dict(), 4).items()}
        save_file({k: v.half() for k, v in sd.items()}, str(ae_f))  # fp16 (BFL's is float32; the disk is small)
    for part, (spec, over) in {"transformer": ("flux_dev_transformer", {"num_layers": 1, "num_single_layers": 1}),
                               "text_encoder": ("clip_l", {"num_hidden_layers": 1}),
                               "text_encoder_2": ("t5xxl", {"num_layers": 1})}.items():
        g = MODELS / FLUX_GRAPHS[part]
        if not g.exists():
            csf.export_reduced(spec, over, g)
    _report("flux", "file", {n.name: {"bytes": n.stat().st_size} for n in (f, clip_f, t5_f, ae_f)}
            | {"build_s": round(time.time() - t0), "what": "transformer: BFL keys, fp16, 1 double + 1 single block "
               "at full width (3072, 24 heads); clip_l and t5xxl: transformers' names, fp16, 1 layer at full width; "
               "ae: full-size 16-channel AE, BFL keys, fp16"})


def ref_flux() -> None:
    import make_shipped_graphs as msg
    import numpy as np
    import torch
    import tvblock  # noqa: F401
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

    c = CASES["flux"]
    fam = _release(c["family"])
    d = MODELS / "flux-config"
    _config(d / "transformer", "FluxTransformer2DModel", {**msg.FLUX_DEV, "num_layers": 1, "num_single_layers": 1})
    _config(d / "vae", "AutoencoderKL", {**msg.VAE16, **fam["vae"]})
    _tokenizer(d / "tokenizer", False)
    torch.set_num_threads(os.cpu_count() or 2)
    t0 = time.time()
    kw = {"config": str(d), "local_files_only": True, "torch_dtype": torch.float32}
    transformer = FluxTransformer2DModel.from_single_file(str(MODELS / c["file"]), subfolder="transformer", **kw)
    vae = AutoencoderKL.from_single_file(str(MODELS / FLUX_FILES["vae"]), subfolder="vae", **kw)
    clip = CLIPTextModel(CLIPTextConfig(**{**msg.CLIP_L, "num_hidden_layers": 1})).eval()
    clip.load_state_dict({k: v.float() for k, v in load_file(str(MODELS / FLUX_FILES["text_encoder"])).items()})
    t5 = T5EncoderModel(T5Config(**{**msg.T5XXL, "num_layers": 1})).eval()
    missing, unexpected = t5.load_state_dict(
        {k: v.float() for k, v in load_file(str(MODELS / FLUX_FILES["text_encoder_2"])).items()}, strict=False)
    assert missing == ["encoder.embed_tokens.weight"] and not unexpected, (missing, unexpected)  # tied to shared
    t5.tie_weights()
    # the releases' T5 tokenizer: spiece.model with FLUX.1's tokenizer_config.json (add_prefix_space, legacy);
    # T5TokenizerFast(vocab_file=...) alone gives other ids (no leading "▁")
    from check_flow_single_files import _t5_tokenizer

    t5_tok = T5TokenizerFast.from_pretrained(str(_t5_tokenizer(d / "tokenizer_t5")))
    sched = FlowMatchEulerDiscreteScheduler.from_config(
        {k: v for k, v in fam["scheduler"].items() if k != "_class_name"})
    pipe = FluxPipeline(scheduler=sched, vae=vae, text_encoder=clip, tokenizer=CLIPTokenizer.from_pretrained(
        str(d / "tokenizer")), text_encoder_2=t5, tokenizer_2=t5_tok, transformer=transformer)
    load_s, load_peak = time.time() - t0, _hwm_mb()
    t1 = time.time()
    with torch.no_grad():
        image = pipe(PROMPT, guidance_scale=c["generate"]["guidance"], num_inference_steps=c["steps"],
                     width=c["width"], height=c["height"], max_sequence_length=c["generate"]["max_sequence_length"],
                     generator=torch.Generator("cpu").manual_seed(c["seed"]), output_type="np").images[0]
    run_s = time.time() - t1
    REFS.mkdir(parents=True, exist_ok=True)
    np.save(REFS / "flux.npy", image.astype(np.float32))
    pil = pipe.numpy_to_pil(image[None])[0]
    pil.save(REFS / "flux.png")
    u8 = np.asarray(pil)
    entry = {"how": "FluxPipeline: FluxTransformer2DModel.from_single_file and AutoencoderKL.from_single_file "
                    "(config= the published configs at reduced depth), CLIPTextModel / T5EncoderModel from the "
                    "clip_l / t5xxl files, float32; FlowMatchEulerDiscreteScheduler from the release config; "
                    "torch.Generator('cpu').manual_seed(seed)",
             "prompt": PROMPT, **{k: c[k] for k in ("width", "height", "seed", "steps")}, **c["generate"],
             "load_s": round(load_s, 1), "load_peak_rss_mb": load_peak, "generate_s": round(run_s, 1),
             "peak_rss_mb": _hwm_mb(),
             "image_stats": {"mean": round(float(u8.mean()), 2), "std": round(float(u8.std()), 2),
                             "saturated_fraction": round(float(((u8 == 0) | (u8 == 255)).mean()), 4)}}
    _report("flux", "diffusers", entry)
    print(json.dumps(entry, indent=1), flush=True)


def parts(case: str) -> None:
    """Part by part (where a whole sdrt image does not fit this machine): ``from_single_file``'s modules in float32
    against sdrt's ``open_single_file`` binding onto the shipped graphs, run by onnxruntime with those weights
    (check_single_files.ort_run). One part in memory at a time; the UNet's reference is computed and freed before
    onnxruntime runs it."""
    import check_single_files as csf
    import make_shipped_graphs as msg
    import torch
    import tvblock  # noqa: F401
    from diffusers import StableDiffusionXLPipeline

    from sdrt.checkpoint import open_single_file

    assert case == "sdxl", "parts: sdxl only (check_single_files.py sd15 does SD 1.5)"
    f = MODELS / CASES[case]["file"]
    t0 = time.time()
    opened = open_single_file(f)
    assert opened.family == "sdxl", opened.family
    pipe = StableDiffusionXLPipeline.from_single_file(str(f), config=str(config_folder(case)), local_files_only=True,
                                                      torch_dtype=torch.float16)
    res: dict = {}

    def cmp(part: str, feeds: dict, refs: dict) -> None:
        import onnx

        names = [o.name for o in onnx.load(str(opened.parts[part][0]), load_external_data=False).graph.output]
        got = dict(zip(names, csf.ort_run(opened.parts[part][0], opened.parts[part][1],
                                          {k: v.numpy() for k, v in feeds.items()})))
        for k, v in refs.items():
            res[f"{part} {k}"] = csf.rel(got[k], v)
        print(part, {k: res[f"{part} {k}"] for k in refs}, f"peak {_hwm_mb()} MB", flush=True)

    with torch.no_grad():
        ids = msg.clip_inputs(msg.CLIP_L, 1)["input_ids"]
        te = pipe.text_encoder.float()
        o = te(input_ids=ids, output_hidden_states=True)
        cmp("text_encoder", {"input_ids": ids}, {"last_hidden_state": o.last_hidden_state.numpy(),
                                                 "pooler_output": o.pooler_output.numpy(),
                                                 "hidden_states.11": o.hidden_states[11].numpy()})
        pipe.text_encoder = None
        te = pipe.text_encoder_2.float()
        o = te(input_ids=ids, output_hidden_states=True)
        cmp("text_encoder_2", {"input_ids": ids}, {"text_embeds": o.text_embeds.numpy(),
                                                   "last_hidden_state": o.last_hidden_state.numpy(),
                                                   "hidden_states.31": o.hidden_states[31].numpy()})
        pipe.text_encoder_2 = None
        del te, o
        lat = msg.vae_inputs(msg.VAE4, 1, "decoder")["latent_sample"]
        ref = pipe.vae.float().decode(lat, return_dict=False)[0].numpy()
        cmp("vae_decoder", {"latent_sample": lat}, {"sample": ref})
        x = msg.unet_inputs(msg.SDXL_UNET, 1)
        unet = pipe.unet.float()
        ref = unet(x["sample"], x["timestep"], x["encoder_hidden_states"],
                   added_cond_kwargs={"text_embeds": x["text_embeds"], "time_ids": x["time_ids"]},
                   return_dict=False)[0].numpy()
        del unet, pipe
        gc.collect()
        print(f"unet reference done, peak {_hwm_mb()} MB", flush=True)
        cmp("unet", x, {"out_sample": ref})
    ok = all(v < 1e-3 for v in res.values())
    _report(case, "parts_onnxruntime", {
        "how": "diffusers StableDiffusionXLPipeline.from_single_file (fp16 file, each module upcast to float32) vs "
               "sdrt.checkpoint.open_single_file -> shipped graphs, weights bound per tensor, onnxruntime CPU; inputs "
               "of make_shipped_graphs (CLIP ids, UNet batch 2 at 32x40 latents with text_embeds/time_ids, VAE "
               "latents); max |a-b| / max |b| per output, must be < 1e-3",
        "max_rel_err": res, "ok": ok, "seconds": round(time.time() - t0), "peak_rss_mb": _hwm_mb()})
    print(case, "parts", "OK" if ok else "FAILED", flush=True)


def _sha10(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()[:10]


# -- diffusers reference ----------------------------------------------------------------------------------------
def _release(family: str) -> dict:
    return PUBLISHED[family]


def _sdrt_release_agrees(tree: Path, family: str) -> dict:
    """Whether the tree's shipped release data (families.json) holds the published scheduler and VAE scaling."""
    fam = json.loads((tree / "core" / "src" / "sdrt" / "data" / "release" / "families.json").read_text())[family]
    pub = PUBLISHED[family]
    out = {}
    for part in ("scheduler", "vae"):
        a, b = fam[part], pub[part]
        out[part] = {k: [a.get(k, "(absent)"), b.get(k, "(absent)")] for k in sorted(set(a) | set(b))
                     if a.get(k, "(absent)") != b.get(k, "(absent)")} or "same"
    return out


def _tokenizer(folder: Path, pad_bang: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        (folder / name).write_bytes(gzip.decompress((TOKENIZER / f"{name}.gz").read_bytes()))
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        cfg = json.loads((TOKENIZER / name).read_text())
        if pad_bang:  # stabilityai/stable-diffusion-xl-base-1.0 tokenizer_2: OpenCLIP pads with "!"
            cfg["pad_token"] = "!"
        (folder / name).write_text(json.dumps(cfg, indent=1))


def _config(folder: Path, cls: str, cfg: dict) -> None:
    """A diffusers ``config.json`` (written out: building the module to save it would cost gigabytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"_class_name": cls, "_diffusers_version": "0.39.0", **cfg},
                                                   indent=1))


def config_folder(case: str) -> Path:
    """A diffusers-format folder of the published configurations (no weights): ``from_single_file(config=)``."""
    import make_shipped_graphs as msg
    from transformers import CLIPTextConfig

    d = MODELS / f"{case}-config"
    if (d / "model_index.json").exists():
        return d
    fam = _release(CASES[case]["family"])
    sched = {k: v for k, v in fam["scheduler"].items() if k != "_class_name"}
    xl = case == "sdxl"
    _config(d / "unet", "UNet2DConditionModel", msg.SDXL_UNET if xl else msg.SD1_UNET)
    _config(d / "vae", "AutoencoderKL", {**msg.VAE4, **fam["vae"], **({"force_upcast": True} if xl else {})})
    (d / "scheduler").mkdir(parents=True, exist_ok=True)
    (d / "scheduler" / "scheduler_config.json").write_text(json.dumps(
        {"_class_name": fam["scheduler"]["_class_name"], **sched}, indent=1))
    CLIPTextConfig(**msg.CLIP_L, architectures=["CLIPTextModel"]).save_pretrained(str(d / "text_encoder"))
    _tokenizer(d / "tokenizer", False)
    index = {"_class_name": "StableDiffusionXLPipeline" if xl else "StableDiffusionPipeline",
             "_diffusers_version": "0.39.0", "scheduler": ["diffusers", fam["scheduler"]["_class_name"]],
             "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
             "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"]}
    if xl:
        CLIPTextConfig(**msg.CLIP_G, architectures=["CLIPTextModelWithProjection"]).save_pretrained(
            str(d / "text_encoder_2"))
        _tokenizer(d / "tokenizer_2", True)
        index.update({"text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
                      "tokenizer_2": ["transformers", "CLIPTokenizer"], "force_zeros_for_empty_prompt": True})
    else:
        index.update({"safety_checker": [None, None], "feature_extractor": [None, None],
                      "requires_safety_checker": False})
    (d / "model_index.json").write_text(json.dumps(index, indent=1))
    return d


def ref(case: str) -> None:
    if case == "flux":
        return ref_flux()
    import numpy as np
    import torch
    import tvblock  # noqa: F401  (before diffusers' pipelines import transformers' image processors)
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    c = CASES[case]
    f = MODELS / c["file"]
    base = _hwm_mb()
    cfg_dir = config_folder(case)
    torch.set_num_threads(os.cpu_count() or 2)
    fam = _release(c["family"])
    sched = EulerDiscreteScheduler.from_config({k: v for k, v in fam["scheduler"].items() if k != "_class_name"})
    t0 = time.time()
    extra = {} if case == "sdxl" else {"safety_checker": None, "feature_extractor": None,
                                       "requires_safety_checker": False}
    cls = StableDiffusionXLPipeline if case == "sdxl" else StableDiffusionPipeline
    pipe = cls.from_single_file(str(f), config=str(cfg_dir), local_files_only=True, torch_dtype=torch.float16,
                                scheduler=sched, **extra)
    gc.collect()
    load_s, load_peak = time.time() - t0, _hwm_mb()
    print(f"loaded in {load_s:.0f} s, peak {load_peak} MB", flush=True)
    t1 = time.time()
    with torch.no_grad():
        kw: dict = {}
        if case == "sdxl":
            pipe.text_encoder.float()
            pipe.text_encoder_2.float()
            pe, npe, ppe, nppe = pipe.encode_prompt(PROMPT, device="cpu", num_images_per_prompt=1,
                                                    do_classifier_free_guidance=True, negative_prompt=NEGATIVE)
            kw = {"pooled_prompt_embeds": ppe, "negative_pooled_prompt_embeds": nppe}
            pipe.text_encoder_2 = None
        else:
            pipe.text_encoder.float()
            pe, npe = pipe.encode_prompt(PROMPT, "cpu", 1, True, NEGATIVE)
        pipe.text_encoder = None
        gc.collect()
        pipe.unet.float()
        pipe.vae.float()
        gc.collect()
        image = pipe(prompt_embeds=pe, negative_prompt_embeds=npe, **kw, num_inference_steps=c["steps"],
                     guidance_scale=c["cfg"], width=c["width"], height=c["height"],
                     generator=torch.Generator("cpu").manual_seed(c["seed"]), output_type="np").images[0]
    run_s = time.time() - t1
    REFS.mkdir(parents=True, exist_ok=True)
    np.save(REFS / f"{case}.npy", image.astype(np.float32))
    pil = pipe.numpy_to_pil(image[None])[0]
    pil.save(REFS / f"{case}.png")
    u8 = np.asarray(pil)
    entry = {"file": f.name, "file_mb": round(f.stat().st_size / 2**20),
             "how": f"{cls.__name__}.from_single_file(config=<published configs>, local_files_only=True, "
                    "torch_dtype=float16), each stage upcast to float32 as it runs; EulerDiscreteScheduler "
                    "from the release scheduler config; torch.Generator('cpu').manual_seed(seed)",
             "prompt": PROMPT, "negative": NEGATIVE, **{k: c[k] for k in ("width", "height", "seed", "steps", "cfg")},
             "load_s": round(load_s, 1), "rss_before_load_mb": base, "load_peak_rss_mb": load_peak,
             "generate_s": round(run_s, 1), "peak_rss_mb": _hwm_mb(), "torch_threads": torch.get_num_threads(),
             "image_stats": {"mean": round(float(u8.mean()), 2), "std": round(float(u8.std()), 2),
                             "saturated_fraction": round(float(((u8 == 0) | (u8 == 255)).mean()), 4)}}
    _report(case, "diffusers", entry)
    print(json.dumps(entry, indent=1), flush=True)


# -- sdrt -------------------------------------------------------------------------------------------------------
def _tree_env(tree: Path) -> dict:
    srcs = ["core/src", "plugins/template/src", "plugin-openvino/src", "plugin-ggml/src", "plugin-trt/src",
            "plugin-coreml/src", "plugin-migraphx/src"]
    env = {**os.environ, "PYTHONPATH": ":".join(str(tree / s) for s in srcs), "SDRT_PRECISION": PRECISION}
    if PRECISION == "default":  # the backend's own choice
        del env["SDRT_PRECISION"]
    env["PATH"] = "/work/venv/bin:" + env.get("PATH", "")
    return env


def _tree_source(tree: Path) -> str:
    """What the sdrt sources are: the git commit of a checkout, or a snapshot's SNAPSHOT.txt line."""
    if (tree / "SNAPSHOT.txt").is_file():
        return (tree / "SNAPSHOT.txt").read_text().strip()
    out = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _group_rss_mb(pgid: int) -> int:
    total = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            st = (p / "stat").read_text()
            if int(st.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            total += int(re.search(r"VmRSS:\s+(\d+)", (p / "status").read_text())[1])
        except (OSError, TypeError, IndexError, ValueError):
            continue
    return total // 1024


_API = """
import json, logging, os, sys
logging.basicConfig(level=os.environ.get("SDRT_SINGLE_LOGLEVEL", "WARNING"), format="%(asctime)s %(name)s: %(message)s")
import sdrt.pipelines as P
from sdrt.pipelines.png import format_parameters
from sdrt.pipelines.save import save_image
a = json.loads(sys.argv[1])
pipe = P.load(a["file"], a["backend"], **a["load"])
gen = pipe.generate(a["prompt"], a["negative"], **a["generate"])
save_image(a["out"], gen.images[0], format_parameters(gen.prompt, gen.negative_prompt, gen.settings[0]))
"""


_LOAD = """
import json, re, sys, time
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read())[1]) // 1024
a = json.loads(sys.argv[1])
base = hwm()
import sdrt.pipelines as P
t = time.time()
pipe = P.load(a["file"], a["backend"], **a["load"])
print(json.dumps({"import_rss_mb": base, "load_s": round(time.time() - t, 2), "load_peak_rss_mb": hwm()}))
"""


def run_load(case: str, backend: str, tree: Path) -> None:
    """Peak RSS of ``sdrt.pipelines.load(FILE)`` alone (a fresh process; parts compile on first use, so this is
    opening the file, detecting the family and binding the weights by reference)."""
    c = CASES[case]
    args = {"file": str(MODELS / c["file"]), "backend": backend,
            "load": {**(flux_load_args() if case == "flux" else {}),
                     **({"cache": False} if backend == "openvino" else {})}}
    out = subprocess.run(["/work/venv/bin/python", "-c", _LOAD, json.dumps(args)], env=_tree_env(tree),
                         capture_output=True, text=True, cwd=str(tree))
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    entry = json.loads(out.stdout.strip().splitlines()[-1])
    entry.update({"backend": backend, "tree": str(tree), "tree_source": _tree_source(tree), "file_mb": round(_files_bytes(case) / 2**20)})
    _report(case, f"sdrt_load_{backend}", entry)
    print(entry, flush=True)


def _files_bytes(case: str) -> int:
    """Bytes of every file the case loads (Flux: the transformer, clip_l, t5xxl and ae files)."""
    files = [MODELS / CASES[case]["file"]] + ([MODELS / v for v in FLUX_FILES.values()] if case == "flux" else [])
    return sum(p.stat().st_size for p in files)


def run_sdrt(case: str, backend: str, tree: Path, api: bool = False) -> None:
    """``sdrt generate`` (or, ``api``, ``sdrt.pipelines.load(...).generate`` with the CLI's PNG writer)."""
    import numpy as np
    from PIL import Image

    c = CASES[case]
    f = MODELS / c["file"]
    tag = (backend if PRECISION == "fp32" else f"{backend}-{PRECISION}") + ("-cli" if "--cli" in sys.argv else "") \
        + (f"-memory{MEMORY}" if MEMORY else "")
    out = REFS / f"{case}-sdrt-{tag}.png"
    out.unlink(missing_ok=True)
    timef = REFS / f"{case}-sdrt-{tag}.time"
    head = ["/usr/bin/time", "-f", "%M %e", "-o", str(timef), "/work/venv/bin/python"]
    negative = c.get("negative", NEGATIVE)
    # OpenVINO's compile cache would write the compiled float32 models to disk (gigabytes): the API run turns
    # it off (cache=False; the CLI has no flag for it). ggml keeps no compile cache, so it runs the CLI.
    # (--cli: the CLI on OpenVINO too, for a run with $SDRT_CACHE_DIR on a scratch folder)
    api = api or case == "flux" or (backend == "openvino" and "--cli" not in sys.argv)
    if api:
        args = {"file": str(f), "backend": backend, "out": str(out), "prompt": PROMPT, "negative": negative,
                "load": {**(flux_load_args() if case == "flux" else {}),
                         **({"cache": False} if backend == "openvino" else {})},
                "generate": {"seed": c["seed"], "steps": c["steps"], "sampler": c.get("sampler", "Euler"),
                             "cfg": c["cfg"], "width": c["width"], "height": c["height"], **c.get("generate", {})}}
        cmd = head + ["-c", _API, json.dumps(args)]
    else:
        cmd = head + ["-m", "sdrt", "generate", str(f), PROMPT, "--negative", negative, "--seed", str(c["seed"]),
                      "--steps", str(c["steps"]), "--sampler", "Euler", "--cfg", str(c["cfg"]), "--width",
                      str(c["width"]), "--height", str(c["height"]), "-o", str(out), "--backend", backend] \
            + (["--memory", MEMORY] if MEMORY else [])
    print(" ".join(cmd), flush=True)
    log = REFS / f"{case}-sdrt-{tag}.log"
    t0 = time.time()
    with open(log, "w") as lf:
        p = subprocess.Popen(cmd, env=_tree_env(tree), stdout=lf, stderr=subprocess.STDOUT, start_new_session=True,
                             cwd=str(tree))
        watched, killed, timeline = 0, False, []
        while p.poll() is None:
            time.sleep(0.5)
            rss = _group_rss_mb(p.pid)
            watched = max(watched, rss)
            if not timeline or time.time() - t0 - timeline[-1][0] >= 10:
                timeline.append((round(time.time() - t0), rss))
            if rss > LIMIT_GB * 1024:
                os.killpg(p.pid, signal.SIGKILL)
                killed = True
    wall = time.time() - t0
    tail = log.read_text()[-3000:]
    entry: dict = {"backend": backend, "tree": str(tree), "tree_source": _tree_source(tree), "command": " ".join(cmd[6:]) if cmd[6] != "-c" else "sdrt.pipelines.load(...).generate: " + cmd[-1],
                   "env": f"SDRT_PRECISION={PRECISION}" if PRECISION != "default" else "SDRT_PRECISION unset", "rc": p.returncode, "wall_s": round(wall, 1),
                   "watched_peak_rss_mb": watched, "rss_timeline_s_mb": timeline, "file_mb": round(_files_bytes(case) / 2**20),
                   "release_data_vs_published [sdrt, published]": _sdrt_release_agrees(tree, c["family"])}
    if MEMORY:  # sdrt restarts VmHWM per stage under --memory, and with it ru_maxrss: /usr/bin/time reads the last stage
        entry["peak_rss_mb"] = watched
    elif timef.exists() and (words := timef.read_text().split()) and words[-2].isdigit():
        entry["peak_rss_mb"] = int(words[-2]) // 1024
        entry["peak_rss_over_file_size"] = round(entry["peak_rss_mb"] / entry["file_mb"], 2)
    if killed:
        entry["error"] = f"stopped: the process group passed {LIMIT_GB} GB"
    elif p.returncode in (-9, 137):
        entry["error"] = "SIGKILL from outside this script (the kernel's OOM killer when the machine ran out)"
    if p.returncode or not out.exists():
        entry["error"] = entry.get("error") or tail[-1500:]
        _report(case, f"sdrt_{tag}", entry)
        print(json.dumps(entry, indent=1), flush=True)
        raise SystemExit(1)
    img = Image.open(out)
    params = img.text.get("parameters", "")
    got = np.asarray(img.convert("RGB")).astype(np.float64)
    want_u8 = np.asarray(Image.open(REFS / f"{case}.png").convert("RGB")).astype(np.float64)
    want_f = np.load(REFS / f"{case}.npy").astype(np.float64) * 255
    d = np.abs(got - want_u8)
    mse = float(((got - want_f) ** 2).mean())
    model = re.search(r"Model: ([^,\n]*)", params)
    mhash = re.search(r"Model hash: ([0-9a-fA-F]+)", params)
    sha = _sha10(f)
    entry.update({
        "max_abs_levels": int(d.max()), "mean_abs_levels": round(float(d.mean()), 4),
        "p99_abs_levels": float(np.percentile(d, 99)), "fraction_within_1_level": round(float((d <= 1).mean()), 5),
        "psnr_db_vs_float_ref": round(10 * np.log10(255**2 / mse), 2) if mse > 0 else None,
        "png_model": model[1] if model else None, "png_model_hash": mhash[1] if mhash else None,
        "model_ok": bool(model and model[1] == f.stem), "hash_ok": bool(mhash and mhash[1].lower() == sha),
        "sha256_10": sha, "parameters": params})
    entry["ok"] = bool(entry["max_abs_levels"] <= TOLERANCE["max_abs_levels"]
                       and entry["mean_abs_levels"] <= TOLERANCE["mean_abs_levels"]
                       and entry["model_ok"] and entry["hash_ok"])
    entry["tolerance"] = TOLERANCE
    _report(case, f"sdrt_{tag}", entry)
    print(json.dumps(entry, indent=1), flush=True)


if __name__ == "__main__":
    step, case = sys.argv[1], sys.argv[2]
    if step == "build":
        build(case)
    elif step == "ref":
        ref(case)
    elif step == "parts":
        parts(case)
    elif step == "load":
        run_load(case, sys.argv[3], Path(sys.argv[4]) if len(sys.argv) > 4 else ROOT)
    elif step == "sdrt":
        rest = [a for a in sys.argv[4:] if a not in ("--api", "--cli")]
        run_sdrt(case, sys.argv[3], Path(rest[0]) if rest else ROOT, api="--api" in sys.argv)
    else:
        raise SystemExit(__doc__)
