"""SD 3.5 Medium and Chroma single files end to end: ``sdrt.pipelines.load(FILE, text_encoders=[...], ...)``
against diffusers' ``StableDiffusion3Pipeline`` / ``ChromaPipeline`` on the same files, full width, reduced depth.

Files (random weights, fp16, written under /tmp/flowfiles33/ and deleted by ``clean``):

- ``sd35``: ``sd35m_reduced.safetensors`` in Stability's keys with ComfyUI's prefix: the MMDiT-X at full width
  (1536, 24 heads) with 2 joint blocks, block 0 a dual-attention (``attn2``) block, as check_single_files.py
  writes it, plus the full-size 16-channel VAE baked in as ``first_stage_model.*`` (LDM keys), as
  ``sd3.5_medium.safetensors`` holds it; ``clip_l.safetensors``, ``clip_g.safetensors`` (transformers'
  ``CLIPTextModelWithProjection`` names, as ComfyUI's ``text_encoders/`` ship them) and
  ``t5xxl_fp16.safetensors``, each 1 layer at full width.
- ``chroma``: ``chroma_bfl.safetensors`` in Black Forest Labs' keys (1 double + 1 single block, 1 approximator
  layer, full width), ``t5xxl_fp16.safetensors`` (1 layer) and ``ae.safetensors`` (full-size 16-channel AE in
  BFL's LDM keys).

Reference: diffusers reads the transformer with its own single-file converter
(``convert_sd3_transformer_checkpoint_to_diffusers`` / ``convert_chroma_transformer_checkpoint_to_diffusers``),
the VAE with ``AutoencoderKL.from_single_file`` (config: the published VAE config), transformers reads the encoder
files; float32; ``FlowMatchEulerDiscreteScheduler`` from the release config (sdrt/data/release/families.json);
``torch.Generator("cpu").manual_seed(seed)``; CLIP tokenizers from CLIP's published vocab (tests/data/clip-tokenizer;
SD 3.5's tokenizer_2 pads with "!"), T5's from its published spiece.model with FLUX.1's tokenizer_config.json
(tests/data/t5-tokenizer: ``add_prefix_space``, as the releases ship it). Chroma: ``ChromaPipeline`` gets the text
masks ``encode_prompt`` makes back as boolean tensors (its own float 0/1 mask is added to the attention scores and
masks nothing, diffusers issues #12116 and #13619; docs/flow-families.md), as the tiny-chroma references do.

sdrt: /work/venv's python (a fresh process) on this checkout's sources, ``SDRT_PRECISION=fp32``,
``pipelines.load(FILE, BACKEND, text_encoders=[...], vae=..., graph_paths={reduced-depth weight-free graphs
exported as the shipped ones are})``, sampler Euler; the family is read from the files (full widths).

    /work/refvenv/bin/python scripts/check_flow_single_files.py build sd35      # files + graphs
    /work/refvenv/bin/python scripts/check_flow_single_files.py ref sd35        # diffusers' image
    /work/refvenv/bin/python scripts/check_flow_single_files.py sdrt sd35 openvino    # or ggml
    /work/refvenv/bin/python scripts/check_flow_single_files.py cond sd35          # the conditioning alone
    /work/refvenv/bin/python scripts/check_flow_single_files.py clean

Figures go to scripts/flow_single_file_report.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts" / "_tvblock"), str(ROOT / "scripts"), str(ROOT / "core" / "src")]
TMP = Path(os.environ.get("SDRT_FLOW_FILES_DIR", "/tmp/flowfiles33"))
REPORT = ROOT / "scripts" / "flow_single_file_report.json"
CLIP_TOK = ROOT / "tests" / "data" / "clip-tokenizer"
T5_SPIECE = ROOT / "tests" / "data" / "t5-tokenizer" / "spiece.model"
PROMPT = "a red fox sitting in fresh snow, golden hour, detailed fur"
NEGATIVE = "blurry, low quality"
#: both compute in float32 from the same fp16 values: what differs is accumulation order, then 8-bit rounding
TOLERANCE = {"max_abs_levels": 3, "mean_abs_levels": 0.5}
CASES = {
    "sd35": dict(family="sd35-medium", file="sd35m_reduced.safetensors", width=256, height=256, seed=42, steps=3,
                 cfg=5.0, encoders=["clip_l.safetensors", "clip_g.safetensors", "t5xxl_fp16.safetensors"], vae=None,
                 graphs={"transformer": ("sd35_medium_transformer", {"num_layers": 2, "dual_attention_layers": [0]}),
                         "text_encoder": ("clip_l_proj", {"num_hidden_layers": 1}),
                         "text_encoder_2": ("clip_g", {"num_hidden_layers": 1}),
                         "text_encoder_3": ("t5xxl", {"num_layers": 1})}),
    "chroma": dict(family="chroma", file="chroma_bfl.safetensors", width=256, height=256, seed=42, steps=3, cfg=4.0,
                   encoders=["t5xxl_fp16.safetensors"], vae="ae.safetensors",
                   graphs={"transformer": ("chroma_transformer", {"num_layers": 1, "num_single_layers": 1,
                                                                  "approximator_layers": 1}),
                           "text_encoder": ("t5xxl", {"num_layers": 1})}),
}


def _report(case: str, key: str, value) -> None:
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data.setdefault(case, {})[key] = value
    REPORT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _release(family: str) -> dict:
    return json.loads((ROOT / "core" / "src" / "sdrt" / "data" / "release" / "families.json").read_text())[family]


def _hwm_mb() -> int:
    import re

    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text())[1]) // 1024


def _save(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    if not path.exists():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path.with_suffix(".partial")))
        path.with_suffix(".partial").rename(path)


def _vae_ldm(prefix: str) -> dict:
    """A full-size 16-channel VAE (random, fp16) in LDM keys (BFL's ae.safetensors; first_stage_model.* in SD 3.5)."""
    import gen_checkpoint_data as gcd
    import make_shipped_graphs as msg
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(**msg.VAE16)
    msg._randomize(vae, 4)
    vae.decoder.conv_out.weight.data.mul_(0.25)  # the image mostly inside [-1, 1], not saturated
    sd = {k.removeprefix("first_stage_model."): v for k, v in gcd.vae_to_ldm(vae.state_dict(), 4).items()}
    return {prefix + k: v.half() for k, v in sd.items()}


def build(case: str) -> None:
    import check_single_files as csf
    import make_shipped_graphs as msg
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    TMP.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    c = CASES[case]
    if case == "sd35":
        state = csf.random_state(csf.sd3_shapes(1536, 2, (0,), 384), 5)
        _save({**state, **_vae_ldm("first_stage_model.")}, TMP / c["file"])
        for name, cfg, seed in (("clip_l.safetensors", msg.CLIP_L, 2), ("clip_g.safetensors", msg.CLIP_G, 6)):
            if not (TMP / name).exists():
                m = CLIPTextModelWithProjection(CLIPTextConfig(**{**cfg, "num_hidden_layers": 1})).eval()
                msg._randomize(m, seed)
                _save({k: v.half() for k, v in m.state_dict().items() if "position_ids" not in k}, TMP / name)
    else:
        _save(csf.random_state(csf.bfl_flux_shapes(True, chroma=True), 1), TMP / c["file"])
        _save(_vae_ldm(""), TMP / "ae.safetensors")
    if not (TMP / "t5xxl_fp16.safetensors").exists():
        t5 = T5EncoderModel(T5Config(**{**msg.T5XXL, "num_layers": 1})).eval()
        msg._randomize(t5, 3)
        _save({k: v.half() for k, v in t5.state_dict().items() if k != "encoder.embed_tokens.weight"},
              TMP / "t5xxl_fp16.safetensors")
        del t5
    for part, (spec, over) in c["graphs"].items():
        g = TMP / f"{case}_{part}.onnx"
        if not g.exists():
            csf.export_reduced(spec, over, g)
    files = [c["file"], *c["encoders"], *([c["vae"]] if c["vae"] else [])]
    _report(case, "files", {n: round((TMP / n).stat().st_size / 2**20, 1) for n in files}
            | {"unit": "MiB", "build_s": round(time.time() - t0)})


def _tokenizer(folder: Path, pad_bang: bool) -> None:
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        (folder / name).write_bytes(gzip.decompress((CLIP_TOK / f"{name}.gz").read_bytes()))
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        cfg = json.loads((CLIP_TOK / name).read_text())
        if pad_bang:  # SD 3.5's tokenizer_2 (OpenCLIP bigG) pads with "!"
            cfg["pad_token"] = "!"
        (folder / name).write_text(json.dumps(cfg, indent=1))


def _t5_tokenizer(folder: Path) -> Path:
    """T5's tokenizer as FLUX.1 / SD 3.5 / Chroma ship it: the published spiece.model with FLUX.1's
    tokenizer_config.json (add_prefix_space, legacy; tests/data/t5-tokenizer, make_t5_refs.py), which
    transformers 4 converts into the fast tokenizer. (``T5TokenizerFast(vocab_file=...)`` alone has no
    add_prefix_space and gives other ids: no leading "▁".)"""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(T5_SPIECE, folder / "spiece.model")
    shutil.copyfile(T5_SPIECE.parent / "special_tokens_map.json", folder / "special_tokens_map.json")
    shutil.copyfile(T5_SPIECE.parent / "flux" / "tokenizer_config.json", folder / "tokenizer_config.json")
    return folder


def ref(case: str) -> None:
    import numpy as np
    import torch

    c = CASES[case]
    t0 = time.time()
    pipe, how = pipeline(case)
    load_s = time.time() - t0
    t1 = time.time()
    run = dict(num_inference_steps=c["steps"], guidance_scale=c["cfg"], width=c["width"], height=c["height"],
               generator=torch.Generator("cpu").manual_seed(c["seed"]), output_type="np")
    with torch.no_grad():
        if case == "chroma":
            # ChromaPipeline builds the text mask as a float 0/1 tensor, which scaled_dot_product_attention adds to
            # the scores instead of masking (diffusers issues #12116, #13619): it is given the same mask as a
            # boolean tensor, as the tiny-chroma references are (gen_flow_refs.py, docs/flow-families.md)
            pe, _, pm, ne, _, nm = pipe.encode_prompt(PROMPT, negative_prompt=NEGATIVE, do_classifier_free_guidance=True,
                                                      max_sequence_length=512)
            image = pipe(prompt_embeds=pe, prompt_attention_mask=pm.bool(), negative_prompt_embeds=ne,
                         negative_prompt_attention_mask=nm.bool(), **run).images[0]
        else:
            image = pipe(PROMPT, negative_prompt=NEGATIVE, **run).images[0]
    np.save(TMP / f"{case}-ref.npy", image.astype(np.float32))
    u8 = (image * 255).round().clip(0, 255).astype(np.uint8)
    entry = {"how": how + "; transformers " + ("CLIPTextModelWithProjection / " if case == "sd35" else "")
             + "T5EncoderModel from the encoder files; float32; FlowMatchEulerDiscreteScheduler.from_config(release); "
             "torch.Generator('cpu').manual_seed",
             "prompt": PROMPT, "negative_prompt": NEGATIVE, **{k: c[k] for k in ("width", "height", "seed", "steps",
                                                                                 "cfg")},
             "load_s": round(load_s, 1), "generate_s": round(time.time() - t1, 1), "peak_rss_mb": _hwm_mb(),
             "image_stats": {"mean": round(float(u8.mean()), 2), "std": round(float(u8.std()), 2),
                             "saturated_fraction": round(float(((u8 == 0) | (u8 == 255)).mean()), 4)}}
    _report(case, "diffusers", entry)
    print(json.dumps(entry, indent=1), flush=True)


def pipeline(case: str):
    """diffusers' pipeline of the case's files, float32, and how it was made (in words)."""
    import make_shipped_graphs as msg
    import torch
    import tvblock  # noqa: F401
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
    from safetensors.torch import load_file
    from transformers import (
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        CLIPTokenizer,
        T5Config,
        T5EncoderModel,
        T5TokenizerFast,
    )

    c = CASES[case]
    fam = _release(c["family"])
    torch.set_num_threads(os.cpu_count() or 2)
    cfgdir = TMP / f"{case}-config"
    (cfgdir / "vae").mkdir(parents=True, exist_ok=True)
    (cfgdir / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL", **msg.VAE16,
                                                            **fam["vae"]}))
    f = TMP / c["file"]
    vae = AutoencoderKL.from_single_file(str(TMP / (c["vae"] or c["file"])), config=str(cfgdir), subfolder="vae",
                                         local_files_only=True, torch_dtype=torch.float32)
    t5 = T5EncoderModel(T5Config(**{**msg.T5XXL, "num_layers": 1})).eval()
    missing, unexpected = t5.load_state_dict(
        {k: v.float() for k, v in load_file(str(TMP / "t5xxl_fp16.safetensors")).items()}, strict=False)
    assert missing == ["encoder.embed_tokens.weight"] and not unexpected, (missing, unexpected)  # tied to shared
    t5.tie_weights()
    t5_tok = T5TokenizerFast.from_pretrained(str(_t5_tokenizer(cfgdir / "tokenizer_t5")))
    sched = FlowMatchEulerDiscreteScheduler.from_config({k: v for k, v in fam["scheduler"].items()
                                                         if k != "_class_name"})
    state = {k: v.float() for k, v in load_file(str(f)).items() if not k.startswith("first_stage_model.")}
    if case == "sd35":
        from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
        from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

        transformer = SD3Transformer2DModel(**{**msg.SD35M, "num_layers": 2, "dual_attention_layers": [0]}).eval()
        transformer.load_state_dict(convert_sd3_transformer_checkpoint_to_diffusers(state), strict=True)
        encs = []
        for name, cfg in (("clip_l.safetensors", msg.CLIP_L), ("clip_g.safetensors", msg.CLIP_G)):
            m = CLIPTextModelWithProjection(CLIPTextConfig(**{**cfg, "num_hidden_layers": 1})).eval()
            m.load_state_dict({k: v.float() for k, v in load_file(str(TMP / name)).items()}, strict=True)
            encs.append(m)
        toks = []
        for name, bang in (("tokenizer", False), ("tokenizer_2", True)):
            _tokenizer(cfgdir / name, bang)
            toks.append(CLIPTokenizer.from_pretrained(str(cfgdir / name)))
        pipe = StableDiffusion3Pipeline(transformer=transformer, scheduler=sched, vae=vae, text_encoder=encs[0],
                                        tokenizer=toks[0], text_encoder_2=encs[1], tokenizer_2=toks[1],
                                        text_encoder_3=t5, tokenizer_3=t5_tok)
        how = ("StableDiffusion3Pipeline: SD3Transformer2DModel from convert_sd3_transformer_checkpoint_to_diffusers "
               "on the file's model.diffusion_model.* tensors; AutoencoderKL.from_single_file (the file's "
               "first_stage_model.*)")
    else:
        from diffusers import ChromaPipeline, ChromaTransformer2DModel
        from diffusers.loaders.single_file_utils import convert_chroma_transformer_checkpoint_to_diffusers

        transformer = ChromaTransformer2DModel(**{**msg.CHROMA, "num_layers": 1, "num_single_layers": 1,
                                                  "approximator_layers": 1}).eval()
        transformer.load_state_dict(convert_chroma_transformer_checkpoint_to_diffusers(state), strict=True)
        pipe = ChromaPipeline(scheduler=sched, vae=vae, text_encoder=t5, tokenizer=t5_tok, transformer=transformer)
        how = ("ChromaPipeline: ChromaTransformer2DModel from convert_chroma_transformer_checkpoint_to_diffusers; "
               "AutoencoderKL.from_single_file (ae.safetensors); the text masks from encode_prompt passed back as "
               "boolean tensors (diffusers' float mask is added to the scores, masking nothing)")
    del state
    return pipe, how


_RUN = """
import json, os, sys, time, re
import numpy as np
import sdrt.pipelines as P
a = json.loads(sys.argv[1])
t = time.time()
pipe = P.load(a["file"], a["backend"], **a["load"])
fam = (pipe.folder.single_file.family, pipe.folder.family)
gen = pipe.generate(a["prompt"], a["negative"], **a["generate"])
np.save(a["out"], np.asarray(gen.images[0]))
hwm = int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read())[1]) // 1024
print(json.dumps({"family": fam, "seconds": round(time.time() - t, 1), "peak_rss_mb": hwm}))
"""


def run_sdrt(case: str, backend: str) -> None:
    import numpy as np

    c = CASES[case]
    out = TMP / f"{case}-sdrt-{backend}.npy"
    out.unlink(missing_ok=True)
    load = {"text_encoders": [str(TMP / n) for n in c["encoders"]],
            "graph_paths": {p: str(TMP / f"{case}_{p}.onnx") for p in c["graphs"]}}
    if c["vae"]:
        load["vae"] = str(TMP / c["vae"])
    if backend == "openvino":
        load["cache"] = False
    args = {"file": str(TMP / c["file"]), "backend": backend, "out": str(out), "prompt": PROMPT,
            "negative": NEGATIVE, "load": load,
            "generate": {"seed": c["seed"], "steps": c["steps"], "sampler": "Euler", "cfg": c["cfg"],
                         "width": c["width"], "height": c["height"]}}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "core" / "src"), "SDRT_PRECISION": "fp32",
           "SDRT_CACHE_DIR": str(TMP / "cache")}
    t0 = time.time()
    p = subprocess.run(["/work/venv/bin/python", "-c", _RUN, json.dumps(args)], env=env, capture_output=True,
                       text=True, cwd=str(ROOT))
    if p.returncode:
        _report(case, f"sdrt_{backend}", {"error": p.stderr[-2000:]})
        raise SystemExit(p.stderr[-3000:])
    info = json.loads(p.stdout.strip().splitlines()[-1])
    got = np.load(out).astype(np.float64)
    want_f = np.load(TMP / f"{case}-ref.npy").astype(np.float64) * 255
    want = want_f.round().clip(0, 255)
    d = np.abs(got - want)
    mse = float(((got - want_f) ** 2).mean())
    entry = {"backend": backend, "env": "SDRT_PRECISION=fp32", "wall_s": round(time.time() - t0, 1), **info,
             "call": "sdrt.pipelines.load(FILE, BACKEND, text_encoders=[...], " + ("vae=..., " if c["vae"] else "")
                     + "graph_paths={reduced-depth graphs}).generate(prompt, negative, sampler='Euler', ...)",
             "max_abs_levels": int(d.max()), "mean_abs_levels": round(float(d.mean()), 4),
             "fraction_within_1_level": round(float((d <= 1).mean()), 5),
             "psnr_db_vs_float_ref": round(10 * np.log10(255**2 / mse), 2) if mse > 0 else None,
             "tolerance": TOLERANCE}
    entry["ok"] = bool(entry["max_abs_levels"] <= TOLERANCE["max_abs_levels"]
                       and entry["mean_abs_levels"] <= TOLERANCE["mean_abs_levels"]
                       and info["family"][0] == c["family"])
    _report(case, f"sdrt_{backend}", entry)
    print(json.dumps(entry, indent=1), flush=True)


_COND = """
import json, sys
import numpy as np
import sdrt.pipelines as P
a = json.loads(sys.argv[1])
pipe = P.load(a["file"], a["backend"], **a["load"])
cond = pipe.prompts.encode(a["prompt"], 1, max_length=a["max_length"])
np.save(a["out"] + "-hidden.npy", np.asarray(cond.hidden))
if getattr(cond, "pooled", None) is not None:
    np.save(a["out"] + "-pooled.npy", np.asarray(cond.pooled))
"""


def cond(case: str, backend: str) -> None:
    """The prompt's conditioning (SD 3.5: T5 and both CLIPs joined, pooled) from diffusers' ``encode_prompt``
    and from sdrt's pipeline on the same files: where an image difference starts."""
    import numpy as np
    import torch

    c = CASES[case]
    pipe, _ = pipeline(case)
    with torch.no_grad():
        if case == "sd35":
            emb, _, pooled, _ = pipe.encode_prompt(PROMPT, PROMPT, PROMPT, do_classifier_free_guidance=False,
                                                   max_sequence_length=256)
        else:
            emb, _, _, _ = pipe.encode_prompt(PROMPT, do_classifier_free_guidance=False, max_sequence_length=512)[:4]
            pooled = None
    del pipe
    out = TMP / f"{case}-cond-sdrt"
    load = {"text_encoders": [str(TMP / n) for n in c["encoders"]],
            "graph_paths": {p: str(TMP / f"{case}_{p}.onnx") for p in c["graphs"]}, "cache": False}
    if c["vae"]:
        load["vae"] = str(TMP / c["vae"])
    args = {"file": str(TMP / c["file"]), "backend": backend, "load": load, "prompt": PROMPT, "out": str(out),
            "max_length": 256 if case == "sd35" else 512}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "core" / "src"), "SDRT_PRECISION": "fp32"}
    p = subprocess.run(["/work/venv/bin/python", "-c", _COND, json.dumps(args)], env=env, capture_output=True,
                       text=True, cwd=str(ROOT))
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    got = np.load(f"{out}-hidden.npy")
    want = emb.numpy()
    entry = {"hidden_shape": list(got.shape), "hidden_max_rel_err": float(np.abs(got - want).max() / np.abs(want).max())}
    if pooled is not None:
        gp = np.load(f"{out}-pooled.npy")
        entry["pooled_max_rel_err"] = float(np.abs(gp - pooled.numpy()).max() / np.abs(pooled.numpy()).max())
        entry["clip_rows_max_abs"] = float(np.abs(got[:, :77] - want[:, :77]).max())
        entry["t5_rows_max_abs"] = float(np.abs(got[:, 77:] - want[:, 77:]).max())
    _report(case, f"conditioning_{backend}", entry)
    print(json.dumps(entry, indent=1), flush=True)


def clean() -> None:
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    step = sys.argv[1]
    if step == "build":
        build(sys.argv[2])
    elif step == "ref":
        ref(sys.argv[2])
    elif step == "sdrt":
        run_sdrt(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "openvino")
    elif step == "cond":
        cond(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "openvino")
    elif step == "clean":
        clean()
    else:
        raise SystemExit(__doc__)
