"""Single files as they circulate, in every key layout and dtype variant, read by diffusers and by sdrt.

Starting from the tiny SD 1.x and SDXL LDM files of tests/data/ckpt (``gen_checkpoint_data.py``), ``make`` (torch venv)
writes the variants people download, then reads each with diffusers' single-file loaders
(``UNet2DConditionModel.from_single_file`` / ``AutoencoderKL.from_single_file`` with the tiny configs,
``convert_ldm_clip_checkpoint`` / ``convert_open_clip_checkpoint`` for the text towers) and saves every parameter
(float32). ``compare`` (sdrt's venv) opens each variant with ``sdrt.checkpoint.open_single_file`` onto the tiny
graphs and compares every bound initializer with diffusers' parameter of the same name: max |diff| per part, into
``scripts/wild_variants_report.json``. A variant diffusers cannot read is reported with its error; one sdrt refuses
with its one-line error.

    PYTHONPATH=scripts/_tvblock:scripts /work/refvenv/bin/python scripts/check_wild_variants.py make
    python scripts/check_wild_variants.py compare          # source /work/wt-env.sh first
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "ckpt"
TMP = Path(tempfile.gettempdir()) / "sdrt-wild-variants"
REPORT = ROOT / "scripts" / "wild_variants_report.json"


def variants() -> dict[str, tuple[str, callable]]:
    import ml_dtypes

    def cast(dt):
        return lambda t: {k: (v.astype(dt) if v.dtype.kind == "f" else v) for k, v in t.items()}

    def scaled(t):
        out = {}
        for k, v in t.items():
            v32 = v.astype(np.float32)
            if k.endswith(".weight") and v.ndim >= 2 and k.startswith("model.diffusion_model."):
                s = np.float32(max(np.abs(v32).max(), 1e-8) / 448.0)
                out[k], out[k[:-6] + "scale_weight"] = (v32 / s).astype(ml_dtypes.float8_e4m3fn), np.array(s)
            else:
                out[k] = v
        out["model.diffusion_model.scaled_fp8"] = np.zeros(0, ml_dtypes.float8_e4m3fn)
        return out

    def ema(t):
        e = {"model_ema." + k[len("model."):].replace(".", ""): (v.astype(np.float32) * 0.5).astype(v.dtype)
             for k, v in t.items() if k.startswith("model.diffusion_model.")}
        return {**t, **e, "model_ema.decay": np.array(0.9999, np.float32),
                "model_ema.num_updates": np.array(1000, np.int32)}

    def pos_ids(prefix):
        return lambda t: {**t, prefix + "embeddings.position_ids": np.arange(77, dtype=np.int64)[None]}

    def old_prefix(t):
        return {k.replace("cond_stage_model.transformer.text_model.", "cond_stage_model.transformer."): v
                for k, v in t.items()}

    def junk(t):
        return {**t, "alphas_cumprod": np.linspace(1, 0, 1000).astype(np.float32),
                "betas": np.linspace(0, 1, 1000).astype(np.float32), "lvlb_weights": np.ones(1000, np.float32)}

    return {
        "sd1_fp16": ("sd1", lambda t: t), "sd1_fp32": ("sd1", cast(np.float32)),
        "sd1_bf16": ("sd1", cast(ml_dtypes.bfloat16)), "sd1_fp8_e4m3fn": ("sd1", cast(ml_dtypes.float8_e4m3fn)),
        "sd1_scaled_fp8": ("sd1", scaled), "sd1_with_ema_keys": ("sd1", ema),
        "sd1_position_ids": ("sd1", pos_ids("cond_stage_model.transformer.text_model.")),
        "sd1_old_clip_prefix": ("sd1", lambda t: pos_ids("cond_stage_model.transformer.")(old_prefix(t))),
        "sd1_schedule_buffers": ("sd1", junk),
        "sdxl_fp16": ("sdxl", lambda t: t),
        "sdxl_position_ids": ("sdxl", pos_ids("conditioner.embedders.0.transformer.text_model.")),
        "sdxl_bf16": ("sdxl", cast(ml_dtypes.bfloat16)),
    }


def make() -> None:
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint, convert_open_clip_checkpoint
    from gen_checkpoint_data import make_te, make_unet, make_vae
    from safetensors.numpy import load_file, save_file

    TMP.mkdir(parents=True, exist_ok=True)
    cfg = TMP / "configs"
    make_unet(0).save_pretrained(cfg / "sd1" / "unet")
    make_vae(0).save_pretrained(cfg / "sd1" / "vae")
    make_unet(0, sdxl=True).save_pretrained(cfg / "sdxl" / "unet")
    results = {}
    for name, (fam, fn) in variants().items():
        base = load_file(str(DATA / fam / "ldm.safetensors"))
        path = TMP / f"{name}.safetensors"
        save_file(fn(base), str(path))
        ref: dict[str, np.ndarray] = {}
        try:
            unet = UNet2DConditionModel.from_single_file(str(path), config=str(cfg / fam), subfolder="unet",
                                                         local_files_only=True)
            ref.update({"unet/" + k: v.float().numpy() for k, v in unet.state_dict().items()})
            ck = {k: v.float() for k, v in __import__("safetensors.torch", fromlist=["x"]).load_file(str(path)).items()
                  if v.dtype != torch.int64}
            if fam == "sd1":
                vae = AutoencoderKL.from_single_file(str(path), config=str(cfg / fam), subfolder="vae",
                                                     local_files_only=True)
                ref.update({"vae/" + k: v.float().numpy() for k, v in vae.state_dict().items()})
                te = convert_ldm_clip_checkpoint(ck)
                ref.update({"text_encoder/" + k: v.float().numpy() for k, v in te.items()})
            else:
                te = convert_ldm_clip_checkpoint(ck, "conditioner.embedders.0.transformer.")
                ref.update({"text_encoder/" + k: v.float().numpy() for k, v in te.items()})
                te2 = convert_open_clip_checkpoint(make_te("g", 0, projection=True), ck,
                                                   "conditioner.embedders.1.model.")
                ref.update({"text_encoder_2/" + k: v.float().numpy() for k, v in te2.items()})
            np.savez(TMP / f"{name}.ref.npz", **ref)
            results[name] = {"diffusers": f"read: {len(ref)} parameters"}
        except Exception as exc:  # noqa: BLE001  (the figure is what diffusers does with the file)
            results[name] = {"diffusers": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        print(name, results[name])
    (TMP / "make.json").write_text(json.dumps(results, indent=1))


def compare() -> None:
    from sdrt.checkpoint import open_single_file, param_map
    from sdrt.errors import SdrtError
    from sdrt.graph import Graph

    made = json.loads((TMP / "make.json").read_text())
    report = {}
    for name, (fam, _) in variants().items():
        parts = ["unet", "text_encoder", "vae_decoder", "vae_encoder"] if fam == "sd1" else \
            ["unet", "text_encoder", "text_encoder_2"]
        graphs = {p: DATA / fam / p / "model.onnx" for p in parts}
        row = dict(made.get(name, {}))
        try:
            m = open_single_file(TMP / f"{name}.safetensors", graph_paths=graphs, parts=parts)
        except SdrtError as exc:
            row["sdrt"] = f"refused: {exc}"[:300]
            report[name] = row
            print(name, row)
            continue
        refp = TMP / f"{name}.ref.npz"
        if not refp.exists():
            row["sdrt"] = "bound (no diffusers reference to compare)"
            report[name] = row
            print(name, row)
            continue
        ref = np.load(refp)
        worst: dict[str, float] = {}
        unmatched = 0
        for part, (gpath, w) in m.parts.items():
            pmap = param_map(Graph.load(gpath))
            key = "vae" if part.startswith("vae") else part
            for canon, slot in pmap.items():
                cands = [f"{key}/{canon}", f"{key}/text_model.{canon}", f"{key}/{canon.removeprefix('text_model.')}"]
                r = next((ref[c] for c in cands if c in ref.files), None)
                if r is None:
                    unmatched += 1
                    continue
                a = np.asarray(w[slot.init], np.float32)
                a = a.T if slot.layout == "T" else a
                d = float(np.abs(a.reshape(r.shape) - r).max()) if a.size == r.size else float("inf")
                worst[part] = max(worst.get(part, 0.0), d)
        row["sdrt_vs_diffusers_max_abs"] = {k: float(f"{v:.3g}") for k, v in worst.items()}
        row["initializers_without_a_diffusers_name"] = unmatched
        report[name] = row
        print(name, row)
    REPORT.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    {"make": make, "compare": compare}[sys.argv[1]]()
