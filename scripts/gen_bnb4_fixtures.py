"""bitsandbytes 4-bit (NF4 / FP4) fixtures, written by bitsandbytes itself: ``tests/data/bnb4/``.

Run with the reference venv (torch, bitsandbytes >= 0.45 with its CPU backend, diffusers 0.42, transformers):

    PYTHONPATH=scripts:core/src:tests/checkpoint /work/refvenv/bin/python scripts/gen_bnb4_fixtures.py

Writes:

- ``cases.safetensors`` + ``cases.json``: small tensors quantized by ``bitsandbytes.functional.quantize_4bit``
  (nf4 and fp4, with and without double quantization of absmax, every block size bnb takes from 32 to 4096,
  odd and 1-D shapes, bf16 / fp16 / fp32 recorded dtypes, a non-uint8 ``quant_storage``), each saved as
  ``Linear4bit._save_to_state_dict`` saves one (``CASE.weight`` packed codes, ``CASE.weight.`` +
  ``QuantState.as_dict(packed=True)``), beside ``CASE.want``: bitsandbytes' dequantization of it (``dequantize``
  below: bnb's portable kernel, which ``dequantize_4bit`` itself runs where its AVX-512 kernel is right).
- ``flux1-dev-bnb-nf4-tiny.safetensors``: ``tests/data/pipelines/tiny-flux-dev``'s transformer in Black Forest
  Labs' keys with ComfyUI's ``model.diffusion_model.`` prefix, as Forge's ``flux1-dev-bnb-nf4.safetensors``
  holds it: weights in bf16, every 2-D Linear weight quantized to NF4 (blocks of 64, absmax double-quantized,
  Forge's v1), plus its T5 under ``text_encoders.t5xxl.transformer.`` with every Linear NF4 without double
  quantization (absmax in float32, as Forge's v2 stores it). CLIP-L and the VAE are added by the tests from the
  folder (float32), as Forge's file bakes them in.
- ``diffusers-transformer-nf4/``: the same transformer as a diffusers folder part saved with a bnb 4-bit
  ``quantization_config`` (``diffusion_pytorch_model.safetensors`` in diffusers' names, every ``nn.Linear``
  replaced by ``bitsandbytes.nn.Linear4bit``, ``state_dict()`` as ``save_pretrained`` writes it;
  ``config.json`` with ``quantization_config``). diffusers 0.42 refuses to quantize without a GPU, so the
  modules are replaced here the way its quantizer replaces them, and bnb's own ``Linear4bit`` serializes them.
- ``refs.npz``: diffusers' ``FluxPipeline`` image for tiny-flux-dev's first case (refs.json) with the weights
  bitsandbytes dequantizes from each file (``dequantize``, then float32), the rest of the pipeline as
  ``gen_flow_refs.build`` makes it (checked bit for bit against that folder's reference first).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "checkpoint"))

import bitsandbytes as bnb  # noqa: E402
import bitsandbytes.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

OUT = ROOT / "tests" / "data" / "bnb4"
FOLDER = ROOT / "tests" / "data" / "pipelines" / "tiny-flux-dev"


def packed_state(w: torch.Tensor, quant_type: str, blocksize: int, nested: bool,
                 storage: torch.dtype = torch.uint8) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``{suffix: tensor}`` as ``Linear4bit._save_to_state_dict`` writes a weight (``"weight"`` and
    ``"weight." + QuantState.as_dict(packed=True)``), and bnb's dequantization of it."""
    q, state = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=nested, quant_type=quant_type,
                               quant_storage=storage)
    out = {"weight": q.contiguous()}
    out.update({"weight." + k: v.contiguous() for k, v in state.as_dict(packed=True).items()})
    back = dequantize(q, state)
    assert back.dtype == w.dtype and tuple(back.shape) == tuple(w.shape), (back.dtype, back.shape, w.shape)
    return out, back


def dequantize(q: torch.Tensor, state) -> torch.Tensor:
    """bitsandbytes' dequantization of one weight, flat blocks: ``dequantize_4bit``'s double-quantization step
    (``dequantize_blockwise`` + offset), then bnb's portable kernel (``backends/default/ops.py``, the one its
    CPU backend falls back to for odd rows). bnb 0.50's AVX-512 CPU kernel (csrc/cpu_ops.cpp,
    ``dequantizeBlockwise4bitCpu``) indexes absmax as ``row * (cols // blocksize) + col // blocksize``, which is
    wrong when a row is not a whole number of blocks (rows of 32 values in blocks of 64: every row takes block 0's
    scale); its quantizer, its CUDA kernel and the portable kernel all use flat blocks of the row-major values, as
    the file's absmax is laid out. Where the AVX-512 kernel is right, the two must agree (checked here)."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    absmax = state.absmax
    if state.nested:
        absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    code = _get_4bit_code(state.quant_type, q.device)
    flat = _dequantize_4bit_compute(q.reshape(-1).view(torch.uint8), absmax.float(), code, state.blocksize,
                                    state.shape, state.dtype).reshape(state.shape)
    if state.shape[-1] % state.blocksize == 0:
        public = F.dequantize_4bit(q, state)
        assert torch.equal(public.view(torch.uint8), flat.view(torch.uint8)), "bnb's two kernels disagree"
    return flat


def unit_cases() -> None:
    g = torch.Generator().manual_seed(0)
    cases, tensors = [], {}
    shapes = [(16, 64), (10, 70), (33, 31), (7,), (3, 5, 9)]
    plan = []
    for qt in ("nf4", "fp4"):
        for nested in (False, True):
            for bs in (32, 64, 128, 256, 512, 1024, 2048, 4096):
                shape = {32: (33, 31), 64: (10, 70), 128: (16, 64), 256: (7,), 512: (3, 5, 9)}.get(bs, (50, 90))
                plan.append((qt, nested, bs, shape, torch.bfloat16, torch.uint8))
            for shape in shapes:
                for dt in (torch.float16, torch.float32):
                    plan.append((qt, nested, 64, shape, dt, torch.uint8))
    plan.append(("nf4", True, 64, (40, 64), torch.bfloat16, torch.bfloat16))  # FSDP's quant_storage=bf16
    plan.append(("nf4", True, 32, (80, 256), torch.bfloat16, torch.uint8))  # 640 absmax: 3 nested blocks of 256
    for i, (qt, nested, bs, shape, dt, storage) in enumerate(plan):
        name = f"c{i:02d}"
        w = (torch.randn(*shape, generator=g) * torch.rand(1, generator=g) * 3).to(dt)
        if i % 7 == 3:  # an all-zero block: absmax 0
            w.view(-1)[: min(bs, w.numel())] = 0
        state, back = packed_state(w, qt, bs, nested, storage)
        for k, v in state.items():
            tensors[f"{name}.{k}"] = v
        tensors[f"{name}.want"] = back
        cases.append({"name": name, "quant_type": qt, "nested": nested, "blocksize": bs, "shape": list(shape),
                      "dtype": str(dt).removeprefix("torch."), "storage": str(storage).removeprefix("torch.")})
    save_file(tensors, str(OUT / "cases.safetensors"))
    (OUT / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")
    print(f"{len(cases)} cases, {(OUT / 'cases.safetensors').stat().st_size} bytes")


def quantize_dict(sd: dict[str, torch.Tensor], prefix: str, nested: bool, want: set[str]) -> tuple[dict, dict]:
    """A state dict in bf16 with the weights named in ``want`` NF4 (Linear4bit's keys); and the float32 values
    bitsandbytes dequantizes every tensor to (the others: their bf16 values)."""
    out, deq = {}, {}
    for k, v in sd.items():
        v = v.detach().to(torch.bfloat16).contiguous()
        if k in want:
            base = k[: -len("weight")]
            state, back = packed_state(v, "nf4", 64, nested)
            for s, t in state.items():
                out[prefix + base + s] = t
            deq[k] = back.float()
        else:
            out[prefix + k] = v
            deq[k] = v.float()
    return out, deq


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    unit_cases()

    import gen_flow_refs
    from flow_file_helpers import bfl_transformer
    from gen_flow_refs import build
    from transformers import CLIPTokenizer, T5TokenizerFast

    gen_flow_refs.write_tokenizer = lambda folder, pad: CLIPTokenizer.from_pretrained(FOLDER / "tokenizer")
    gen_flow_refs.write_t5_tokenizer = lambda folder: T5TokenizerFast.from_pretrained(FOLDER / "tokenizer_2")
    pipe = build("flux-dev")
    c0 = json.loads((FOLDER / "refs.json").read_text())[0]

    def image() -> np.ndarray:
        with torch.no_grad():
            img = pipe(c0["prompt"], height=c0["height"], width=c0["width"], num_inference_steps=c0["steps"],
                       guidance_scale=c0["guidance"], generator=torch.Generator("cpu").manual_seed(c0["seed"]),
                       max_sequence_length=c0["max_sequence_length"], output_type="np").images
        return (img * 255).round().astype(np.uint8)

    assert np.array_equal(image(), np.load(FOLDER / "refs.npz")[f"{c0['name']}/image"]), "not the exported model"
    tr_sd = {k: v.detach().clone() for k, v in pipe.transformer.state_dict().items()}
    t5_sd = {k: v.detach().clone() for k, v in pipe.text_encoder_2.state_dict().items()}

    # Forge's layout: BFL keys. diffusers' converter (convert_flux_transformer_checkpoint_to_diffusers) is written
    # for Flux.1's widths only (3072), so the way back is the renaming's own inverse: the renaming applied to
    # element numbers says where each BFL element comes from
    bfl = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in
           bfl_transformer({k: v.numpy() for k, v in tr_sd.items()}).items()}
    start, ids = 0, {}
    for k, v in tr_sd.items():
        ids[k] = np.arange(start, start + v.numel(), dtype=np.int64).reshape(tuple(v.shape))
        start += v.numel()
    where = bfl_transformer(ids)

    def to_diffusers(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        flat = torch.full((start,), float("nan"))
        for k, v in d.items():
            flat[torch.from_numpy(where[k].reshape(-1))] = v.float().reshape(-1)
        assert not torch.isnan(flat).any()
        return {k: flat[torch.from_numpy(i.reshape(-1))].reshape(i.shape) for k, i in ids.items()}

    back = to_diffusers(bfl)
    assert all(torch.equal(back[k], tr_sd[k]) for k in tr_sd)
    linear = {k for k, v in bfl.items() if k.endswith(".weight") and v.ndim == 2}
    main_sd, deq_bfl = quantize_dict(bfl, "model.diffusion_model.", True, linear)
    t5_keys = {k: v for k, v in t5_sd.items() if k != "encoder.embed_tokens.weight"}  # tied to shared.weight
    t5_linear = {k for k, v in t5_keys.items() if k.startswith("encoder.block.") and v.ndim == 2
                 and "relative_attention_bias" not in k}
    t5_file, deq_t5 = quantize_dict(t5_keys, "text_encoders.t5xxl.transformer.", False, t5_linear)
    save_file({**main_sd, **t5_file}, str(OUT / "flux1-dev-bnb-nf4-tiny.safetensors"),
              metadata={"format": "pt"})
    print(f"forge file: {len(linear)} + {len(t5_linear)} NF4 weights, "
          f"{(OUT / 'flux1-dev-bnb-nf4-tiny.safetensors').stat().st_size} bytes")

    refs = {}
    pipe.transformer.load_state_dict(to_diffusers(deq_bfl))
    t5_deq = dict(deq_t5)
    t5_deq["encoder.embed_tokens.weight"] = t5_deq["shared.weight"]
    pipe.text_encoder_2.load_state_dict(t5_deq, strict=False)
    refs["forge/image"] = image()

    # a diffusers folder part: every nn.Linear of the transformer a bnb Linear4bit (NF4, double quantization)
    pipe.transformer.load_state_dict(tr_sd)
    pipe.text_encoder_2.load_state_dict(t5_sd)
    qtr = pipe.transformer
    names = [n for n, m in qtr.named_modules() if isinstance(m, torch.nn.Linear)]
    deq_diff = {}
    for n in names:
        parent, _, leaf = n.rpartition(".")
        lin = qtr.get_submodule(n)
        new = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4")
        new.load_state_dict({"weight": lin.weight.detach().to(torch.bfloat16),
                             **({"bias": lin.bias.detach().to(torch.bfloat16)} if lin.bias is not None else {})})
        new = new.to("cpu")  # quantizes (Params4bit._quantize)
        (qtr.get_submodule(parent) if parent else qtr).__setattr__(leaf, new)
    sd = {k: v.contiguous() for k, v in qtr.state_dict().items()}
    part = OUT / "diffusers-transformer-nf4"
    part.mkdir(exist_ok=True)
    for k, v in list(sd.items()):
        if v.dtype == torch.float32 and not k.split(".weight.")[-1].startswith(("absmax", "quant_map", "nested")):
            sd[k] = v.to(torch.bfloat16)  # bf16 like the quantized weights' recorded dtype
    save_file(sd, str(part / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((FOLDER / "transformer" / "config.json").read_text())
    cfg["quantization_config"] = {"_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "bfloat16",
                                  "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_use_double_quant": True, "llm_int8_enable_fp32_cpu_offload": False,
                                  "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None,
                                  "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
                                  "quant_method": "bitsandbytes"}
    (part / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for n in names:
        m = qtr.get_submodule(n)
        deq_diff[n + ".weight"] = dequantize(m.weight.data, m.weight.quant_state).float()
    plain = {k: v.float() for k, v in sd.items() if k not in deq_diff and ".weight." not in k}
    pipe2 = build("flux-dev")
    pipe2.transformer.load_state_dict({**plain, **deq_diff})
    pipe, keep = pipe2, pipe
    refs["diffusers/image"] = image()
    pipe = keep
    np.savez_compressed(OUT / "refs.npz", **refs)
    print(f"diffusers part: {len(names)} Linear4bit, {(part / 'diffusion_pytorch_model.safetensors').stat().st_size} "
          f"bytes; refs.npz {(OUT / 'refs.npz').stat().st_size} bytes")


if __name__ == "__main__":
    main()
