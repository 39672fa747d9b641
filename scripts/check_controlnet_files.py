"""ControlNet files as people download them, read by diffusers and by sdrt, compared (issue 36/33).

    PYTHONPATH=scripts/_tvblock:core/src /work/refvenv/bin/python scripts/check_controlnet_files.py [sd1|sdxl ...]

For SD 1.x and SDXL, at reduced size (the configs of lllyasviel/control_v11p_sd15_canny and
diffusers/controlnet-canny-sdxl-1.0 with one layer per block; SD 1.x at its release widths, SDXL with one
transformer layer per block and a quarter of the width, its heads, text width and added embedding kept:
the full SDXL ControlNet is 1.25B parameters, and a file of it in fp32 5 GB):

1. diffusers builds a ``ControlNetModel`` with random weights (the zero convolutions too, so no residual is
   zero), saved in diffusers' layout (``save_pretrained``: ``diffusion_pytorch_model.safetensors``);
2. the same weights are written in lllyasviel's LDM layout (prefix-less ``input_blocks``,
   ``input_hint_block``, ``zero_convs``, ``middle_block_out``, as control_v11p_sd15_canny.safetensors holds
   them), in fp32 and fp16, and with the ``control_model.`` prefix of ControlNet 1.0 files; diffusers reads
   that file back with ``ControlNetModel.from_single_file`` (offline, config from the saved folder; for SDXL,
   where ``from_single_file`` fails on ``label_emb``, with ``convert_controlnet_checkpoint`` plus diffusers'
   own ``label_emb`` key rule, see ``diffusers_sdxl_ldm``), so the writer is checked by diffusers' converter;
3. a weight-free graph of the reduced architecture is exported by ``make_shipped_graphs.py``'s ControlNet
   spec (the code that made the shipped ``sd1_controlnet``/``sdxl_controlnet``), and sdrt binds each file onto
   it with ``sdrt.checkpoint.open_controlnet(file, graph=...)``;
4. onnxruntime runs the bound graph (weights fed from sdrt's lazy ``Weights``) on two input sizes, against
   the residuals of diffusers' model loaded from the same file (``max |diff| / max |ref|`` over all outputs).

Writes ``scripts/controlnet_files_report.json``.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_shipped_graphs as M  # noqa: E402  (imports tvblock first)
import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "scripts" / "controlnet_files_report.json"
REDUCE = {"sd1": ("sd1_controlnet", {"layers_per_block": 1}),
          # SDXL at reduced width too (a quarter, 16 channels per head as the release): its text width (2048),
          # added-embedding sizes and heads stay the release's; at full width one fp32 file is over 1 GB
          "sdxl": ("sdxl_controlnet", {"layers_per_block": 1, "transformer_layers_per_block": [1, 1, 1],
                                       "block_out_channels": [80, 160, 320], "norm_num_groups": 16})}


# -- diffusers names -> lllyasviel's LDM names (written here from the LDM module layout, not from sdrt) ------
_RES = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1", "norm2": "out_layers.0",
        "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}
_TOP = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
        "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2",
        "conv_in": "input_blocks.0.0", "controlnet_mid_block": "middle_block_out.0"}


def ldm_name(name: str, lpb: int, hint_convs: int) -> str:
    module, _, param = name.rpartition(".")
    if module in _TOP:
        return f"{_TOP[module]}.{param}"
    if m := re.fullmatch(r"controlnet_down_blocks\.(\d+)", module):
        return f"zero_convs.{m[1]}.0.{param}"
    if m := re.fullmatch(r"controlnet_cond_embedding\.(conv_in|conv_out|blocks\.(\d+))", module):
        idx = 0 if m[1] == "conv_in" else 2 * (hint_convs - 1) if m[1] == "conv_out" else 2 * (int(m[2]) + 1)
        return f"input_hint_block.{idx}.{param}"
    if m := re.match(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", name):
        i = 1 + int(m[1]) * (lpb + 1) + int(m[3])
        if m[2] == "attentions":
            return f"input_blocks.{i}.1.{m[4]}"
        head, _, tail = m[4].partition(".")
        return f"input_blocks.{i}.0.{_RES[head]}.{tail}"
    if m := re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", name):
        return f"input_blocks.{1 + int(m[1]) * (lpb + 1) + lpb}.0.op.{m[2]}"
    if m := re.match(r"mid_block\.(resnets|attentions)\.(\d)\.(.*)", name):
        if m[1] == "attentions":
            return f"middle_block.1.{m[3]}"
        head, _, tail = m[3].partition(".")
        return f"middle_block.{2 * int(m[2])}.{_RES[head]}.{tail}"
    raise KeyError(name)


def write_ldm(state: dict[str, torch.Tensor], path: Path, lpb: int, prefix: str = "",
              dtype: torch.dtype = torch.float32) -> None:
    from safetensors.torch import save_file

    convs = sum(1 for k in state if k.startswith("controlnet_cond_embedding.") and k.endswith(".weight"))
    save_file({prefix + ldm_name(k, lpb, convs): v.to(dtype).contiguous() for k, v in state.items()}, str(path))


# -- runs -------------------------------------------------------------------------------------------
def ort_session(graph_path: Path):
    """The weight-free graph with its weights as graph inputs (fed from sdrt's Weights), for onnxruntime."""
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(graph_path), load_external_data=False)
    weights = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    keep = [t for t in proto.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    for t in weights:
        proto.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del proto.metadata_props[:]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def diffusers_sdxl_ldm(path: Path, config):
    """diffusers' read of an SDXL ControlNet in the LDM layout. ``from_single_file`` fails on one (diffusers
    0.39's ``convert_controlnet_checkpoint`` has no rule for ``label_emb``, so ``add_embedding`` stays on the
    meta device): its converter for everything else, plus the ``add_embedding`` <- ``label_emb`` entries of
    diffusers' own ControlNet key table (``DIFFUSERS_TO_LDM_MAPPING["controlnet"]["addition_embed_type"]``,
    which the converter does not apply), loaded strictly."""
    from diffusers import ControlNetModel
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING, convert_controlnet_checkpoint
    from safetensors.torch import load_file

    raw = load_file(str(path))
    inner = {k.removeprefix("control_model."): v for k, v in raw.items()}
    conv = convert_controlnet_checkpoint(raw, dict(config))
    for new, old in DIFFUSERS_TO_LDM_MAPPING["controlnet"]["addition_embed_type"].items():
        conv[new] = inner[old]
    model = ControlNetModel.from_config(config).eval()
    model.load_state_dict({k: v.float() for k, v in conv.items()}, strict=True)
    return model


def torch_residuals(model, x: dict) -> list[np.ndarray]:
    xl = "text_embeds" in x
    with torch.no_grad():
        down, mid = model(x["sample"], x["timestep"], x["encoder_hidden_states"], x["controlnet_cond"],
                          float(x["conditioning_scale"]), guess_mode=False, return_dict=False,
                          added_cond_kwargs={"text_embeds": x["text_embeds"], "time_ids": x["time_ids"]} if xl else None)
    return [t.float().numpy() for t in (*down, mid)]


def rel_err(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    worst = 0.0
    for r, o in zip(ref, got):
        assert r.shape == o.shape, (r.shape, o.shape)
        worst = max(worst, float(np.abs(r - o).max() / max(1e-6, float(np.abs(r).max()))))
    return worst


def check(base: str, work: Path) -> dict:
    from diffusers import ControlNetModel

    from sdrt.checkpoint import open_controlnet

    name, reduce = REDUCE[base]
    spec = M.SPECS[name]
    cfg = {**spec.config, **reduce}
    t0 = time.time()
    torch.manual_seed(0)
    model, prog = M.export_program(spec, cfg, fake=False)
    M._randomize(model, 3)  # every weight random: the zero convolutions too
    proto, _ = M.weight_free(prog, name, spec.source)
    graph = work / f"{name}_reduced.onnx"
    graph.write_bytes(proto.SerializeToString())
    del prog, proto
    # diffusers' own module (not the export wrapper) with the same weights, saved in diffusers' layout
    ref = ControlNetModel(**cfg).eval()
    ref.load_state_dict(model.state_dict())
    folder = work / f"{base}_diffusers"
    ref.save_pretrained(folder, safe_serialization=True)
    state = ref.state_dict()
    lpb = cfg["layers_per_block"]
    files = {"diffusers": (None, None), "ldm": ("", torch.float32), "ldm control_model.": ("control_model.", torch.float32),
             "ldm fp16": ("", torch.float16)}
    sess = ort_session(graph)
    out_names = [o.name for o in sess.get_outputs()]
    result: dict = {"graph": f"{name} spec, overrides {reduce}", "params": sum(p.numel() for p in ref.parameters()),
                    "files": {}}
    for label, (prefix, dtype) in files.items():
        f = folder / "diffusion_pytorch_model.safetensors"
        if label != "diffusers":  # written one at a time: a file of the SD 1.x check is 1 GB
            f = work / f"{base}_{label.replace(' ', '_').replace('.', '')}.safetensors"
            write_ldm(state, f, lpb, prefix, dtype)
        # diffusers reads the file: from_pretrained for its own layout, from_single_file for the LDM ones
        if label == "diffusers":
            theirs, how = ControlNetModel.from_pretrained(folder).eval(), "from_pretrained"
        elif base == "sd1":
            theirs = ControlNetModel.from_single_file(str(f), config=str(folder), local_files_only=True,
                                                      torch_dtype=torch.float32).eval()
            how = "from_single_file"
        else:
            theirs, how = diffusers_sdxl_ldm(f, ref.config), "convert_controlnet_checkpoint + label_emb"
        net = open_controlnet(f, graph=graph)
        wfeeds = {k: np.asarray(net.weights[k]) for k in net.weights}
        runs = []
        for s in (1, 2):
            x = spec.inputs(cfg, s)
            want = torch_residuals(theirs, x)
            feeds = {i.name: x[i.name].numpy() for i in sess.get_inputs() if i.name in x}
            got = sess.run(out_names, {**feeds, **wfeeds})
            runs.append({"sample": list(x["sample"].shape), "max_rel_err": rel_err(want, got)})
        same = rel_err(torch_residuals(theirs, spec.inputs(cfg, 1)), torch_residuals(ref, spec.inputs(cfg, 1)))
        result["files"][label] = {"diffusers_read": how, "identified": net.ident.label, "tensors": len(net.weights),
                                  "runs": runs, "diffusers_file_vs_original_module": same}
        del net, wfeeds, theirs
        if label != "diffusers":
            f.unlink()  # one file at a time on disk
        print(f"{base} {label}: {result['files'][label]['identified']}; sdrt vs diffusers "
              f"{[r['max_rel_err'] for r in runs]}; diffusers' read of the file vs the original module {same:.1e}", flush=True)
    worst = {k: max(r["max_rel_err"] for r in v["runs"]) for k, v in result["files"].items()}
    result["ok"] = all(v <= (2e-3 if "fp16" in k else 1e-4) for k, v in worst.items()) and all(
        v["diffusers_file_vs_original_module"] <= (2e-2 if "fp16" in k else 1e-6) for k, v in result["files"].items())
    result["seconds"] = round(time.time() - t0, 1)
    result["how"] = ("onnxruntime CPU (graph optimizations off) on sdrt's binding of the file onto a weight-free "
                     "export of the reduced architecture, vs diffusers' ControlNetModel read from the same file "
                     "(from_single_file for LDM files, from_pretrained for diffusers'); max |diff| / max |ref| "
                     "over the down and mid residuals; fp16 file: both read the same fp16 values")
    return result


def main(argv: list[str]) -> None:
    bases = argv or ["sd1", "sdxl"]
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for base in bases:
            report[base] = check(base, Path(tmp))
            REPORT.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    bad = [b for b in bases if not report[b]["ok"]]
    if bad:
        raise SystemExit(f"FAILED: {bad}")


if __name__ == "__main__":
    main(sys.argv[1:])
