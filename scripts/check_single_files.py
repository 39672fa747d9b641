"""Check ``sdrt.checkpoint.open_single_file`` against diffusers on files as their publishers ship them.

``flux``: a Flux.1 dev transformer in Black Forest Labs' keys (``double_blocks.N.img_attn.qkv``,
fused ``single_blocks.N.linear1``; fp16, random weights) at reduced depth and full width (1 double
and 1 single block: 3072 wide, 24 heads, the published MLP and modulation sizes), plus separate
ComfyUI-style ``clip_l.safetensors`` and ``t5xxl_fp16.safetensors`` (transformers' names, 1 layer,
full width). diffusers reads the transformer with its own converter
(``convert_flux_transformer_checkpoint_to_diffusers``) and transformers reads the encoders;
sdrt opens the three files with ``open_single_file`` onto weight-free graphs of the same reduced
depth (exported as the shipped ones are, ``make_shipped_graphs.py``), and onnxruntime runs each
part with sdrt's bound weights. Outputs must agree to float32 tolerance.

``chroma``: the same for a Chroma transformer (``distilled_guidance_layer``; 1 approximator layer), with
padding masked as ``ChromaPipeline`` masks it: the transformer's boolean ``attention_mask`` drops text
positions (diffusers given the same boolean mask: torch's SDPA), and T5 gets the tokenizer's int64 mask.
For ``flux``, T5's ``attention_mask`` input is all ones (``FluxPipeline`` passes none).

``rss``: peak memory of binding a full-size SD 1.5 fp16 LDM single file (random weights, written
here; 1.7 GB) with ``open_single_file``: every initializer read and converted once, one at a
time, as a backend reads them, measured in a child process (ru_maxrss).

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/check_single_files.py flux
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import tvblock  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "scripts" / "single_files_report.json"
TMP = Path(tempfile.gettempdir()) / "sdrt-single-files"


def _report(key: str, value) -> None:
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data[key] = value
    REPORT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def bfl_flux_shapes(guidance: bool, chroma: bool = False, blocks: int = 1, approx: int = 1) -> dict:
    d, m = 3072, 12288
    s = {"img_in.weight": (d, 64), "img_in.bias": (d,), "txt_in.weight": (d, 4096), "txt_in.bias": (d,),
         "final_layer.linear.weight": (64, d), "final_layer.linear.bias": (64,)}
    if chroma:
        s.update({"distilled_guidance_layer.in_proj.weight": (5120, 64),
                  "distilled_guidance_layer.in_proj.bias": (5120,),
                  "distilled_guidance_layer.out_proj.weight": (d, 5120),
                  "distilled_guidance_layer.out_proj.bias": (d,)})
        for i in range(approx):
            p = f"distilled_guidance_layer.layers.{i}."
            s.update({p + "in_layer.weight": (5120, 5120), p + "in_layer.bias": (5120,),
                      p + "out_layer.weight": (5120, 5120), p + "out_layer.bias": (5120,),
                      f"distilled_guidance_layer.norms.{i}.scale": (5120,)})
    else:
        s.update({"time_in.in_layer.weight": (d, 256), "time_in.in_layer.bias": (d,),
                  "time_in.out_layer.weight": (d, d), "time_in.out_layer.bias": (d,),
                  "vector_in.in_layer.weight": (d, 768), "vector_in.in_layer.bias": (d,),
                  "vector_in.out_layer.weight": (d, d), "vector_in.out_layer.bias": (d,),
                  "final_layer.adaLN_modulation.1.weight": (2 * d, d),
                  "final_layer.adaLN_modulation.1.bias": (2 * d,)})
        if guidance:
            s.update({"guidance_in.in_layer.weight": (d, 256), "guidance_in.in_layer.bias": (d,),
                      "guidance_in.out_layer.weight": (d, d), "guidance_in.out_layer.bias": (d,)})
    for i in range(blocks):
        for side in ("img", "txt"):
            p = f"double_blocks.{i}.{side}_"
            if not chroma:
                s.update({p + "mod.lin.weight": (6 * d, d), p + "mod.lin.bias": (6 * d,)})
            s.update({p + "attn.qkv.weight": (3 * d, d), p + "attn.qkv.bias": (3 * d,),
                      p + "attn.norm.query_norm.scale": (128,), p + "attn.norm.key_norm.scale": (128,),
                      p + "attn.proj.weight": (d, d), p + "attn.proj.bias": (d,),
                      p + "mlp.0.weight": (m, d), p + "mlp.0.bias": (m,), p + "mlp.2.weight": (d, m),
                      p + "mlp.2.bias": (d,)})
        p = f"single_blocks.{i}."
        s.update({p + "linear1.weight": (3 * d + m, d), p + "linear1.bias": (3 * d + m,),
                  p + "linear2.weight": (d, d + m), p + "linear2.bias": (d,), p + "norm.query_norm.scale": (128,),
                  p + "norm.key_norm.scale": (128,)})
        if not chroma:
            s.update({p + "modulation.lin.weight": (3 * d, d), p + "modulation.lin.bias": (3 * d,)})
    return s


def random_state(shapes: dict, seed: int, dtype=torch.float16) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, s in shapes.items():
        if len(s) == 1 and (k.endswith("scale") or "norm" in k):
            t = 1 + 0.1 * torch.randn(s, generator=g)
        elif len(s) == 1:
            t = 0.02 * torch.randn(s, generator=g)
        else:
            t = torch.randn(s, generator=g) / float(np.prod(s[1:])) ** 0.5
        out[k] = t.to(dtype)
    return out


def ort_run(graph_path: Path, weights, feeds: dict) -> list[np.ndarray]:
    """Run a weight-free graph in onnxruntime with sdrt's bound weights given as extra inputs."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(graph_path), load_external_data=False)
    ext = [t for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    keep = [t for t in m.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    for t in ext:
        m.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del m.metadata_props[:]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    w = {t.name: np.ascontiguousarray(weights[t.name]) for t in ext}
    return sess.run(None, {**feeds, **w})


def export_reduced(spec_name: str, overrides: dict, out: Path) -> Path:
    import make_shipped_graphs as msg

    spec = msg.SPECS[spec_name]
    cfg = {**spec.config, **overrides}
    _, prog = msg.export_program(spec, cfg, fake=True)
    proto, _ = msg.weight_free(prog, spec_name, spec.source,
                               msg.BUFFERS[spec_name](cfg) if spec_name in msg.BUFFERS else None)
    out.write_bytes(proto.SerializeToString())
    return out


def _save_once(save_file, tensors: dict, path: Path) -> None:
    """Write a publisher's file unless a previous run left it (the seeds are fixed, so it holds the same
    values; a stale one cannot pass: the references are computed from the tensors in memory, not the file).
    Never rewritten in place: other checks may hold hard links to it."""
    if not path.exists():
        tmp = path.with_suffix(".partial")
        save_file(tensors, str(tmp))
        tmp.rename(path)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(1e-6, float(np.abs(b).max())))


def check_flux(chroma: bool = False) -> None:
    import make_shipped_graphs as msg
    from diffusers import ChromaTransformer2DModel, FluxTransformer2DModel
    from diffusers.loaders.single_file_utils import (
        convert_chroma_transformer_checkpoint_to_diffusers,
        convert_flux_transformer_checkpoint_to_diffusers,
    )
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from sdrt.checkpoint import open_single_file

    TMP.mkdir(parents=True, exist_ok=True)
    name = "chroma" if chroma else "flux_dev"
    t0 = time.time()
    # the publishers' files
    state = random_state(bfl_flux_shapes(True, chroma), 1)
    tfile = TMP / f"{name}_bfl.safetensors"
    _save_once(save_file, state, tfile)
    clip = CLIPTextModel(CLIPTextConfig(**{**msg.CLIP_L, "num_hidden_layers": 1})).eval()
    t5 = T5EncoderModel(T5Config(**{**msg.T5XXL, "num_layers": 1})).eval()
    msg._randomize(clip, 2)
    msg._randomize(t5, 3)
    clip_file, t5_file = TMP / "clip_l.safetensors", TMP / "t5xxl_fp16.safetensors"
    _save_once(save_file, {k: v.half().contiguous() for k, v in clip.state_dict().items() if "position_ids" not in k},
               clip_file)
    _save_once(save_file, {k: v.half().contiguous() for k, v in t5.state_dict().items()
                           if k != "encoder.embed_tokens.weight"}, t5_file)
    # diffusers / transformers read them
    cfg = ({**msg.CHROMA, "num_layers": 1, "num_single_layers": 1, "approximator_layers": 1} if chroma
           else {**msg.FLUX_DEV, "num_layers": 1, "num_single_layers": 1})
    conv = (convert_chroma_transformer_checkpoint_to_diffusers if chroma
            else convert_flux_transformer_checkpoint_to_diffusers)({k: v.float() for k, v in state.items()})
    model = (ChromaTransformer2DModel if chroma else FluxTransformer2DModel)(**cfg).eval()
    model.load_state_dict(conv, strict=True)
    del conv
    clip.load_state_dict({k: v.float() for k, v in clip.state_dict().items()})
    clip = clip.half().float()  # the values the fp16 files hold
    t5 = t5.half().float()
    x = msg.chroma_inputs({}, 1) if chroma else msg.flux_inputs({"guidance_embeds": True}, 1)
    with torch.no_grad():
        ref = model(**x, return_dict=False)[0].numpy()
    del model
    # sdrt: weight-free graphs of the same reduced depth, the three files opened together
    spec = "chroma_transformer" if chroma else "flux_dev_transformer"
    graphs = {"transformer": export_reduced(spec, {k: cfg[k] for k in cfg if k in ("num_layers", "num_single_layers",
                                                                                      "approximator_layers")},
                                            TMP / f"{name}.onnx")}
    graphs["t5"] = export_reduced("t5xxl", {"num_layers": 1}, TMP / "t5.onnx")
    if not chroma:
        graphs["clip"] = export_reduced("clip_l", {"num_hidden_layers": 1}, TMP / "clip.onnx")
    parts = (["transformer", "text_encoder"] if chroma else ["transformer", "text_encoder", "text_encoder_2"])
    paths = ({"transformer": graphs["transformer"], "text_encoder": graphs["t5"]} if chroma else
             {"transformer": graphs["transformer"], "text_encoder": graphs["clip"], "text_encoder_2": graphs["t5"]})
    extras = [t5_file] if chroma else [clip_file, t5_file]
    opened = open_single_file(tfile, extras, parts=parts, graph_paths=paths)
    assert opened.family == ("chroma" if chroma else "flux-dev"), opened.family
    results = {}
    # transformer (the reference was computed before any export touched diffusers' classes)
    got = ort_run(opened.parts["transformer"][0], opened.parts["transformer"][1], {k: v.numpy() for k, v in x.items()})
    results["transformer"] = rel(got[0], ref)
    del got
    # text encoders: T5 with the mask each pipeline gives it (ChromaPipeline: the tokenizer's, padding masked;
    # FluxPipeline passes none, which the graph's attention_mask input takes as all ones)
    t5x = msg.t5_inputs(msg.T5XXL, 1)
    ids, mask = t5x["input_ids"], t5x["attention_mask"] if chroma else torch.ones_like(t5x["input_ids"])
    with torch.no_grad():
        ref = t5(input_ids=ids, attention_mask=mask if chroma else None).last_hidden_state.numpy()
    t5_part = "text_encoder" if chroma else "text_encoder_2"
    got = ort_run(opened.parts[t5_part][0], opened.parts[t5_part][1],
                  {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    results["t5xxl"] = rel(got[0], ref)
    if chroma:  # the padded row alone (row 1 has no padding and dominates the maximum)
        results["t5xxl row 0 (padded)"] = rel(got[0][0], ref[0])
    if not chroma:
        ids = msg.clip_inputs(msg.CLIP_L, 1)["input_ids"]
        with torch.no_grad():
            o = clip(input_ids=ids, output_hidden_states=True)
        got = ort_run(opened.parts["text_encoder"][0], opened.parts["text_encoder"][1], {"input_ids": ids.numpy()})
        results["clip_l last_hidden_state"] = rel(got[0], o.last_hidden_state.numpy())
        results["clip_l pooler_output"] = rel(got[1], o.pooler_output.numpy())
    ok = all(v < 2e-4 for v in results.values())
    entry = {"files": {"transformer": f"{tfile.name} (BFL keys, fp16, 1 double + 1 single block, full width)",
                       "extras": [p.name for p in extras]},
             "max_rel_err": results, "ok": ok, "seconds": round(time.time() - t0)}
    if chroma:
        entry["masks"] = {"transformer attention_mask": f"{int((~x['attention_mask']).sum())} of "
                                                        f"{x['attention_mask'].numel()} text+image positions dropped "
                                                        "(row 0 keeps 3 tokens and the first pad)",
                          "t5 attention_mask": f"{int((mask == 0).sum())} of {mask.numel()} positions padding "
                                               "(row 0: 5 tokens, </s>, padding)",
                          "reference": "diffusers ChromaTransformer2DModel with the boolean mask (torch SDPA); "
                                       "transformers T5EncoderModel with the int64 mask"}
    _report(name, entry)
    print(name, "OK" if ok else "FAILED", results, flush=True)


def sd3_shapes(width: int, layers: int, dual: tuple[int, ...], pos: int) -> dict:
    """SD 3.x MMDiT keys as Stability publishes them (``sd3.5_medium.safetensors``), ComfyUI's prefix."""
    d = width
    s = {"pos_embed": (1, pos * pos, d), "x_embedder.proj.weight": (d, 16, 2, 2), "x_embedder.proj.bias": (d,),
         "t_embedder.mlp.0.weight": (d, 256), "t_embedder.mlp.0.bias": (d,), "t_embedder.mlp.2.weight": (d, d),
         "t_embedder.mlp.2.bias": (d,), "y_embedder.mlp.0.weight": (d, 2048), "y_embedder.mlp.0.bias": (d,),
         "y_embedder.mlp.2.weight": (d, d), "y_embedder.mlp.2.bias": (d,),
         "context_embedder.weight": (d, 4096), "context_embedder.bias": (d,),
         "final_layer.linear.weight": (64, d), "final_layer.linear.bias": (64,),
         "final_layer.adaLN_modulation.1.weight": (2 * d, d), "final_layer.adaLN_modulation.1.bias": (2 * d,)}
    for i in range(layers):
        last = i == layers - 1
        for side in ("x_block", "context_block"):
            p = f"joint_blocks.{i}.{side}."
            ctx = side == "context_block"
            s.update({p + "attn.qkv.weight": (3 * d, d), p + "attn.qkv.bias": (3 * d,),
                      p + "attn.ln_q.weight": (64,), p + "attn.ln_k.weight": (64,)})
            n = 2 if ctx and last else (9 if not ctx and i in dual else 6)
            s.update({p + "adaLN_modulation.1.weight": (n * d, d), p + "adaLN_modulation.1.bias": (n * d,)})
            if not (ctx and last):
                s.update({p + "attn.proj.weight": (d, d), p + "attn.proj.bias": (d,),
                          p + "mlp.fc1.weight": (4 * d, d), p + "mlp.fc1.bias": (4 * d,),
                          p + "mlp.fc2.weight": (d, 4 * d), p + "mlp.fc2.bias": (d,)})
            if not ctx and i in dual:
                s.update({p + "attn2.qkv.weight": (3 * d, d), p + "attn2.qkv.bias": (3 * d,),
                          p + "attn2.ln_q.weight": (64,), p + "attn2.ln_k.weight": (64,),
                          p + "attn2.proj.weight": (d, d), p + "attn2.proj.bias": (d,)})
    return {"model.diffusion_model." + k: v for k, v in s.items()}


def check_sd3() -> None:
    """SD 3.5 Medium's MMDiT-X in Stability's keys (2 blocks, the first with attn2), against diffusers."""
    import make_shipped_graphs as msg
    from diffusers import SD3Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers
    from safetensors.torch import save_file

    from sdrt.checkpoint import open_single_file

    TMP.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    state = random_state(sd3_shapes(1536, 2, (0,), 384), 5)
    f = TMP / "sd35m_reduced.safetensors"
    save_file(state, str(f))
    cfg = {**msg.SD35M, "num_layers": 2, "dual_attention_layers": [0]}
    model = SD3Transformer2DModel(**cfg).eval()
    model.load_state_dict(convert_sd3_transformer_checkpoint_to_diffusers({k: v.float() for k, v in state.items()}),
                          strict=True)
    del state
    g = export_reduced("sd35_medium_transformer", {"num_layers": 2, "dual_attention_layers": [0]},
                       TMP / "sd35m.onnx")
    opened = open_single_file(f, parts=["transformer"], graph_paths={"transformer": g})
    assert opened.family == "sd35-medium", opened.family
    x = msg.sd3_inputs(cfg, 1)
    with torch.no_grad():
        ref = model(**x, return_dict=False)[0].numpy()
    got = ort_run(opened.parts["transformer"][0], opened.parts["transformer"][1], {k: v.numpy() for k, v in x.items()})
    err = rel(got[0], ref)
    _report("sd35_medium", {"files": {"transformer": f"{f.name} (Stability keys with ComfyUI's prefix, fp16, "
                                                     "2 joint blocks (block 0 with attn2), full width)"},
                            "max_rel_err": {"transformer": err}, "ok": err < 2e-4, "seconds": round(time.time() - t0)})
    print("sd35_medium", "OK" if err < 2e-4 else "FAILED", err, flush=True)


def sd15_file() -> Path:
    """A full-size SD 1.5 checkpoint (UNet, CLIP-L, VAE): random weights (every tensor, conv_out included),
    fp16, A1111/LDM keys (the converters of gen_checkpoint_data.py, which diffusers' loader reads back)."""
    import gen_checkpoint_data as gcd
    import make_shipped_graphs as msg
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel

    TMP.mkdir(parents=True, exist_ok=True)
    f = TMP / "sd15_random_fp16.safetensors"
    if f.exists():
        return f
    sd = {}
    unet = UNet2DConditionModel(**msg.SD1_UNET)
    msg._randomize(unet, 11)
    unet = unet.half()
    has_attn_up = [t.startswith("CrossAttn") for t in msg.SD1_UNET["up_block_types"]]
    sd.update(gcd.unet_to_ldm(unet.state_dict(), has_attn_up, lpb=2))
    del unet
    vae = AutoencoderKL(**msg.VAE4)
    msg._randomize(vae, 12)
    sd.update(gcd.vae_to_ldm(vae.half().state_dict(), 4))
    del vae
    te = CLIPTextModel(CLIPTextConfig(**msg.CLIP_L))
    msg._randomize(te, 13)
    sd.update({"cond_stage_model.transformer." + k: v for k, v in te.half().state_dict().items()
               if "position_ids" not in k})
    save_file({k: v.contiguous() for k, v in sd.items()}, str(f))
    return f


def check_sd15() -> None:
    """The parts of a full-size SD 1.5 fp16 LDM file: diffusers' from_single_file against sdrt's binding onto
    the shipped graphs (onnxruntime), one part at a time."""
    import make_shipped_graphs as msg
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from sdrt.checkpoint import open_single_file

    f = sd15_file()
    t0 = time.time()
    opened = open_single_file(f)
    assert opened.family == "sd1", opened.family
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        UNet2DConditionModel.from_config(msg.SD1_UNET).save_config(f"{tmp}/unet")
        AutoencoderKL.from_config(msg.VAE4).save_config(f"{tmp}/vae")
        # text encoder: diffusers' converter onto transformers' model
        from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint
        from safetensors.torch import load_file

        te = CLIPTextModel(CLIPTextConfig(**msg.CLIP_L)).eval()
        ck = {k: v.float() for k, v in load_file(str(f)).items() if k.startswith("cond_stage_model.")}
        conv = {k: v for k, v in convert_ldm_clip_checkpoint(ck).items() if "position_ids" not in k}
        te.load_state_dict(conv, strict=False)
        del ck, conv
        ids = msg.clip_inputs(msg.CLIP_L, 1)["input_ids"]
        with torch.no_grad():
            o = te(input_ids=ids, output_hidden_states=True)
        got = ort_run(*opened.parts["text_encoder"], {"input_ids": ids.numpy()})
        results["text_encoder last_hidden_state"] = rel(got[0], o.last_hidden_state.numpy())
        results["text_encoder hidden_states.11"] = rel(got[2 + 11], o.hidden_states[11].numpy())
        del te, o, got
        vae = AutoencoderKL.from_single_file(str(f), config=tmp, subfolder="vae", local_files_only=True).float()
        lat = msg.vae_inputs(msg.VAE4, 1, "decoder")["latent_sample"]
        with torch.no_grad():
            ref = vae.decode(lat, return_dict=False)[0].numpy()
        del vae
        got = ort_run(*opened.parts["vae_decoder"], {"latent_sample": lat.numpy()})
        results["vae_decoder"] = rel(got[0], ref)
        del got
        unet = UNet2DConditionModel.from_single_file(str(f), config=tmp, subfolder="unet",
                                                     local_files_only=True).float().eval()
        x = msg.unet_inputs(msg.SD1_UNET, 1)
        with torch.no_grad():
            ref = unet(**x, return_dict=False)[0].numpy()
        del unet
        got = ort_run(*opened.parts["unet"], {k: v.numpy() for k, v in x.items()})
        results["unet"] = rel(got[0], ref)
    ok = all(v < 1e-3 for v in results.values())
    _report("sd15_full_parts", {"file": f"{f.name} (full-size SD 1.5, fp16, LDM keys, random weights)",
                                "reference": "diffusers from_single_file (UNet, VAE) and convert_ldm_clip_checkpoint "
                                             "(CLIP-L), float32 of the fp16 values",
                                "sdrt": "open_single_file -> shipped graphs, weights bound per tensor, onnxruntime CPU",
                                "max_rel_err": results, "ok": ok, "seconds": round(time.time() - t0)})
    print("sd15", "OK" if ok else "FAILED", results, flush=True)


def check_rss() -> None:
    """Peak RSS of binding a full-size SD 1.5 fp16 single file (child process, sdrt only)."""
    f = sd15_file()
    code = (
        "import re, sys, time\n"
        "def hwm():\n"
        "    return int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])\n"
        "from sdrt.checkpoint import open_single_file\n"
        "t = time.time(); m = open_single_file(sys.argv[1]); opened = time.time() - t\n"
        "base = hwm()\n"
        "n = 0\n"
        "for part, (g, w) in m.parts.items():\n"
        "    for name in w:\n"
        "        a = w[name]; n += a.nbytes; del a\n"
        "peak = hwm()\n"
        "print(m.family, opened, base, peak, n)\n")
    out = subprocess.run(["/work/venv/bin/python",
                          "-c", code, str(f)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "core" / "src")})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    fam, opened, base, peak, n = out.stdout.split()[-5:]
    size = f.stat().st_size
    entry = {"file": f"{f.name}: full-size SD 1.5 (UNet, CLIP-L, VAE), fp16, LDM keys, random weights",
             "file_mb": round(size / 2**20), "family": fam, "open_s": round(float(opened), 2),
             "rss_after_open_mb": round(int(base) / 1024), "peak_rss_binding_all_mb": round(int(peak) / 1024),
             "float32_bytes_produced_mb": round(int(n) / 2**20),
             "how": "open_single_file, then every initializer of every part read and converted to the graph's "
                    "float32 once, one at a time, as a backend reads them; VmHWM of a fresh child process (ru_maxrss "
                    "would include the parent's at fork)"}
    _report("rss_sd15_fp16", entry)
    print(entry, flush=True)


if __name__ == "__main__":
    for step in sys.argv[1:]:
        {"flux": check_flux, "chroma": lambda: check_flux(True), "sd3": check_sd3, "rss": check_rss,
         "sd15": check_sd15}[step]()
    print("max rss of this process (MB):", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
