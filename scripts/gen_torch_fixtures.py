"""Write small real ``torch.save`` files for sdrt's PyTorch-checkpoint reader (``sdrt.weights.torchfile``).

Writes ``tests/data/torch/``: each ``NAME.pt``/``.ckpt``/``.bin`` as torch itself saves it, and ``NAME.npz``: the
arrays ``torch.load(weights_only=False)`` gives, flattened as A1111 flattens a checkpoint (``state_dict`` when
there is one, nested dicts joined with ``.``, a ``ParameterDict`` as its parameters, non-tensors dropped), in C
order; bfloat16 and float8 as their bits (uint16/uint8) with the dtype names in ``__dtypes__``. Also
``pipe-sd15/``: tests/data/ckpt/pipe-sd15's checkpoint (``custom.ckpt``, Lightning-style), kohya LoRA
(``tinylora.pt``) and embedding (``tinyemb.pt``, A1111's layout) as torch saves them.

Run (torch venv):  /work/refvenv/bin/python scripts/gen_torch_fixtures.py
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "torch"


def _lightning_class() -> type:
    """A class pickled as ``pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint`` (what old SD
    checkpoints hold under ``callbacks``), without installing Lightning."""
    name = "pytorch_lightning.callbacks.model_checkpoint"
    for part in ("pytorch_lightning", "pytorch_lightning.callbacks", name):
        sys.modules.setdefault(part, types.ModuleType(part))

    class ModelCheckpoint:
        def __init__(self) -> None:
            self.monitor = "val/loss"
            self.save_top_k = 1
            self.best_model_score = torch.tensor(0.25)

    ModelCheckpoint.__module__ = name
    ModelCheckpoint.__qualname__ = "ModelCheckpoint"
    sys.modules[name].ModelCheckpoint = ModelCheckpoint
    return ModelCheckpoint


def flatten(obj) -> dict[str, torch.Tensor]:
    """A1111's ``get_state_dict_from_checkpoint`` view, written recursively (the reader under test is iterative)."""
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, torch.nn.ParameterDict):
            node = dict(node.items())
        if not isinstance(node, dict):
            return
        for k, v in node.items():
            if isinstance(v, torch.Tensor):
                out.setdefault(f"{prefix}{k}", v)
            else:
                walk(f"{prefix}{k}.", v)

    walk("", obj)
    return out


def expected(path: Path) -> None:
    obj = torch.load(path, weights_only=False, map_location="cpu")
    arrays, dtypes = {}, {}
    for k, t in flatten(obj).items():
        t = t.detach().contiguous()
        dtypes[k] = str(t.dtype).removeprefix("torch.")
        if t.dtype == torch.bfloat16:
            t = t.view(torch.uint16)
        elif t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            t = t.view(torch.uint8)
        arrays[k] = t.numpy()
    np.savez(path.with_suffix(".npz"), __dtypes__=np.array(json.dumps(dtypes)), **arrays)
    print(f"{path.name}: {path.stat().st_size} bytes, {len(arrays)} tensors")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)

    # every dtype torch saves, in the zip format (float8 goes through _rebuild_tensor_v3 and UntypedStorage)
    torch.save({
        "f32": base, "f16": base.half(), "bf16": base.bfloat16(), "f64": base[:2].double(),
        "f8_e4m3": (base * 4).to(torch.float8_e4m3fn), "f8_e5m2": (base * 4).to(torch.float8_e5m2),
        "i64": torch.arange(5), "i32": torch.arange(-3, 3, dtype=torch.int32),
        "i8": torch.arange(-4, 4, dtype=torch.int8),
        "u8": torch.arange(200, 206, dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3),
    }, OUT / "dtypes.pt")

    # views of one storage: a transpose, slices, a strided slice, an expand (stride 0), and a second storage
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    torch.save({"a": a, "t": a.t(), "rows": a[1:3], "block": a[1:, 2:5], "every2": a[:, ::2],
                "col": a[:, 4], "expand": a[0:1].expand(3, 6), "h": a.half().t()}, OUT / "views.pt")
    torch.save({"a": a, "t": a.t(), "block": a[1:, 2:5], "h": base.half(), "i": torch.arange(3)},
               OUT / "legacy.pt", _use_new_zipfile_serialization=False)

    # Parameter, ParameterDict, OrderedDict, nested dicts
    torch.save(collections.OrderedDict([
        ("weight", torch.nn.Parameter(base.clone())),
        ("pd", torch.nn.ParameterDict({"x": torch.nn.Parameter(base[0].clone()), "y": torch.nn.Parameter(base[1])})),
        ("nested", {"deep": {"er": base[2:]}, "note": "text"}),
    ]), OUT / "params.pt")

    # tensors with Python attributes: torch writes _rebuild_from_type_v2 and _rebuild_parameter_with_state
    t = base[:2].clone()
    t.note = "kept by torch, dropped by sdrt"
    p = torch.nn.Parameter(base[2].clone())
    p.extra = 1
    torch.save({"t": t, "p": p}, OUT / "attrs.pt")

    # a Lightning-style checkpoint: state_dict beside global_step (a numpy scalar), epoch, hparams, callbacks
    mc = _lightning_class()
    torch.save({"state_dict": collections.OrderedDict([("model.diffusion_model.w", base), ("cond.b", base[0])]),
                "global_step": np.int64(470000), "epoch": 6, "pytorch-lightning_version": "1.4.2",
                "hparams": argparse.Namespace(lr=1e-4, name="tiny"), "callbacks": {mc: mc()},
                "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(2)}}}], "lr_schedulers": []},
               OUT / "lightning.ckpt")

    # textual-inversion embeddings: A1111's .pt, rinongal's (a ParameterDict), diffusers' learned_embeds.bin
    vec = torch.randn(2, 32, generator=g)
    torch.save({"string_to_token": {"*": 265}, "string_to_param": {"*": vec}, "name": "tinyemb", "step": 1200,
                "sd_checkpoint": "a9263745", "sd_checkpoint_name": "v1-5"}, OUT / "a1111_emb.pt")
    torch.save({"string_to_token": {"*": torch.tensor(265)},
                "string_to_param": torch.nn.ParameterDict({"*": torch.nn.Parameter(vec.clone())})},
               OUT / "rinongal_emb.pt")
    torch.save({"<tiny>": vec[0].clone()}, OUT / "learned_embeds.bin")

    # the same tensors with every storage deflated (torch never writes this; the reader reads it, not maps it)
    src = OUT / "dtypes.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(OUT / "deflated.pt", "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename.replace("dtypes/", "deflated/"), zin.read(info))

    for f in sorted(OUT.glob("*")):
        if f.suffix in (".pt", ".ckpt", ".bin"):
            expected(f)

    # tests/data/ckpt/pipe-sd15's checkpoint, LoRA and embedding as torch files: the checkpoint Lightning-style
    # (.ckpt), the kohya LoRA as a plain state dict (.pt), the embedding in A1111's .pt layout
    d = ROOT / "tests" / "data" / "ckpt" / "pipe-sd15"
    out = OUT / "pipe-sd15"
    out.mkdir(exist_ok=True)
    sd = load_file(d / "custom.safetensors")
    torch.save({"state_dict": sd, "global_step": np.int64(1), "epoch": 0}, out / "custom.ckpt")
    torch.save(load_file(d / "tinylora.safetensors"), out / "tinylora.pt")
    emb = load_file(d / "tinyemb.safetensors")["emb_params"]
    torch.save({"string_to_token": {"*": 265}, "string_to_param": {"*": emb}, "name": "tinyemb", "step": 0},
               out / "tinyemb.pt")
    # the checkpoint's VAE alone, as A1111's models/VAE files (orangemix.vae.pt, ...) hold it: LDM names, no prefix
    vae = {k.removeprefix("first_stage_model."): v for k, v in sd.items() if k.startswith("first_stage_model.")}
    torch.save({"state_dict": vae}, out / "custom.vae.pt")
    back = flatten(torch.load(out / "custom.ckpt", weights_only=False))
    assert all(torch.equal(back[k], v) for k, v in sd.items()) and len(back) == len(sd)
    for f in sorted(out.iterdir()):
        print(f"pipe-sd15/{f.name}: {f.stat().st_size} bytes")

if __name__ == "__main__":
    main()
