"""bitsandbytes NF4 Flux checkpoints as people download them, end to end on tiny-flux-dev.

tests/data/bnb4/ (scripts/gen_bnb4_fixtures.py, written by bitsandbytes 0.50.2 itself):

- ``flux1-dev-bnb-nf4-tiny.safetensors``: tiny-flux-dev's transformer in Forge's layout (BFL keys under ComfyUI's
  ``model.diffusion_model.``, bf16, every Linear weight NF4 in blocks of 64 with double-quantized absmax: Forge's
  ``flux1-dev-bnb-nf4.safetensors``), and its T5 under ``text_encoders.t5xxl.transformer.`` with every Linear NF4
  and float32 absmax (Forge's v2). Forge's file bakes in CLIP-L and the VAE too: the test adds them from the
  folder (float32), so the file read is the all-in-one file Forge ships;
- ``diffusers-transformer-nf4/``: the same transformer as diffusers saves a bnb 4-bit model (diffusers' names,
  each ``nn.Linear`` a ``bitsandbytes.nn.Linear4bit``, ``config.json`` with ``quantization_config``);
- ``refs.npz``: diffusers' ``FluxPipeline`` image of tiny-flux-dev's first case with the weights bitsandbytes
  dequantizes from each file (float32 otherwise). The NF4 images are 7.8 and 7.5 levels (mean; 55 max)
  from the float model's.

Before this, sdrt refused Forge's file with a shape mismatch ("time_in.in_layer.weight [4096, 1] vs ... [32,
256]": the packed codes read as the weight) after warning about 105 unused keys.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h
import test_flow_single_files as flow
from flow_file_helpers import clip_file

from sdrt import pipelines
from sdrt.weights import Weights, stfile

BNB = Path(__file__).resolve().parent.parent / "data" / "bnb4"
FORGE = BNB / "flux1-dev-bnb-nf4-tiny.safetensors"


def _raw(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors exactly as stored (sdrt's header reader, no folding)."""
    entries, _ = stfile.read_header(path)
    return {k: np.array(stfile.map_entry(path, e)) for k, e in entries.items()}


def _all_in_one(tmp: Path) -> tuple[Path, dict]:
    """Forge's all-in-one file: the fixture's NF4 transformer and T5 as bnb wrote them, plus CLIP-L and the VAE."""
    f = flow._files("flux-dev", tmp)
    tensors = _raw(FORGE)
    tensors.update({"text_encoders.clip_l.transformer." + k: v
                    for k, v in clip_file(flow._params(flow.PIPES / "tiny-flux-dev", "text_encoder")).items()})
    tensors.update({"vae." + k: v for k, v in flow._vae(flow.PIPES / "tiny-flux-dev").items()})
    path = tmp / "flux1-dev-bnb-nf4.safetensors"
    stfile.write(path, tensors)
    return path, f


def _image(pipe) -> np.ndarray:
    case, kw = flow._case("flux-dev")
    return np.stack(pipe(case["prompt"], case["negative_prompt"] or "", **kw)).astype(int)


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_forge_nf4_all_in_one_gives_diffusers_image(backend, tmp_path):
    path, f = _all_in_one(tmp_path)
    w = Weights.open(path)
    qkv = w.info("model.diffusion_model.double_blocks.0.img_attn.qkv.weight")
    assert (qkv.dtype, tuple(qkv.shape)) == ("bfloat16", (96, 32))  # the codes' [1536, 1] uint8 read as the weight
    assert not any(".weight." in k for k in w)  # absmax, quant_map, quant_state... folded into their weights
    with pipelines.load(path, backend=backend, graph_paths=f["graphs"], tokenizers=f["tokenizers"],
                        family="flux-dev", **({} if backend == "reference" else {"precision": "fp32"})) as pipe:
        opened = pipe.folder.single_file
        assert set(opened.files.values()) == {path}  # transformer, T5, CLIP-L and VAE from it
        assert opened.dtypes["transformer"] == {"nf4", "bfloat16"} and opened.dtypes["text_encoder"] == {"float32"}
        if backend == "reference":  # the run plan (sdrt generate --dry-run) says which parts run from NF4 weights
            case, kw = flow._case("flux-dev")
            text = pipe.plan(case["prompt"], **kw).format()
            assert "transformer weights: nf4 (bitsandbytes 4-bit) in flux1-dev-bnb-nf4.safetensors, dequantized " \
                   "when bound; the rest bfloat16" in text, text
            assert "text_encoder_2 weights: nf4" in text and "vae_decoder weights" not in text
        got = _image(pipe)
    want = np.load(BNB / "refs.npz")["forge/image"].astype(int)
    diff = np.abs(got - want)
    assert diff.max() <= 1, f"{backend}: max {diff.max()} levels from diffusers' image of the dequantized weights"


def test_diffusers_folder_with_a_bnb4_transformer(tmp_path):
    """A diffusers folder whose ``transformer/`` was saved by a bnb 4-bit model (``quantization_config``)."""
    f = flow._files("flux-dev", tmp_path)
    root = tmp_path / "FLUX.1-dev-bnb-nf4"
    shutil.copytree(BNB / "diffusers-transformer-nf4", root / "transformer")
    flow.flux_dev_folder_parts(root)
    with pipelines.load(root, backend="reference", graph_paths=f["graphs"]) as pipe:
        got = _image(pipe)
    want = np.load(BNB / "refs.npz")["diffusers/image"].astype(int)
    diff = np.abs(got - want)
    assert diff.max() <= 1, f"max {diff.max()} levels from diffusers' image of the dequantized weights"


def test_a_lora_merges_onto_the_dequantized_weights(tmp_path):
    """A kohya Flux LoRA on Forge's NF4 file: each bound transformer weight is the NF4 weight bitsandbytes' values
    give plus diffusers' own ``fuse_lora`` change (tests/data/lora/flux_lora_refs.npz); removing it gives them back."""
    from sdrt.checkpoint import param_map

    data = Path(__file__).resolve().parent.parent / "data" / "lora"
    path, f = _all_in_one(tmp_path)
    with pipelines.load(path, backend="reference", graph_paths=f["graphs"], tokenizers=f["tokenizers"],
                        family="flux-dev") as pipe:
        part = pipe.parts["transformer"]
        pmap = param_map(part.graph)
        refs = np.load(data / "flux_lora_refs.npz")
        keys = [k for k in refs.files if k.startswith("flux_kohya/")]
        slots = {k: pmap[k.split("/", 1)[1]] for k in keys}
        base = {k: np.asarray(part.weights_factory()[s.init], np.float32) for k, s in slots.items()}
        pipe.set_loras([(data / "flux_kohya.safetensors", 0.8)])
        bound = part.weights_factory()
        changed = 0
        for k, s in slots.items():
            delta = refs[k].T if s.layout == "T" else refs[k]
            np.testing.assert_allclose(np.asarray(bound[s.init], np.float32), base[k] + delta,
                                       atol=2e-5 * max(1.0, float(np.abs(delta).max())), err_msg=k)
            changed += bool(np.abs(delta).max() > 0)
        assert changed >= 10
        pipe.set_loras([])
        again = part.weights_factory()
        assert all(np.array_equal(np.asarray(again[s.init], np.float32), base[k]) for k, s in slots.items())


def test_fused_weights_are_decoded_once(tmp_path, monkeypatch):
    """Flux's fused ``qkv`` (3 graph weights) and ``linear1`` (4) are decoded a third / a part at a time from their
    own blocks: binding the transformer decodes each NF4 value once, not once per graph weight it feeds."""
    from sdrt.checkpoint import open_single_file
    from sdrt.weights import bnb

    path, f = _all_in_one(tmp_path)
    decoded = []
    real = bnb.dequantize

    def counting(packed, absmax, state, lo=0, hi=None):
        out = real(packed, absmax, state, lo, hi)
        decoded.append(out.size)
        return out

    monkeypatch.setattr(bnb, "dequantize", counting)
    m = open_single_file(path, graph_paths=f["graphs"], family="flux-dev")
    _, w = m.parts["transformer"]
    for name in w:
        np.asarray(w[name])
    nf4 = Weights.open(FORGE)
    total = sum(int(np.prod(nf4.ref(k).shape)) for k in nf4
                if k.startswith("model.") and nf4.ref(k).stored == "nf4")
    assert sum(decoded) == total, (sum(decoded), total)


def test_forge_v2_layout_nf4_transformer_with_an_fp8_t5(tmp_path):
    """Forge's v2 bakes the T5 in as plain fp8 e4m3fn beside the NF4 transformer: every part binds, the T5 to the
    fp8 values and the transformer to the same NF4 values as in the all-in-one file with an NF4 T5."""
    import ml_dtypes
    from flow_file_helpers import t5_file

    from sdrt.checkpoint import open_single_file

    path, f = _all_in_one(tmp_path)
    tensors = {k: v for k, v in _raw(path).items() if not k.startswith("text_encoders.t5xxl.")}
    t5 = t5_file(flow._params(flow.PIPES / "tiny-flux-dev", "text_encoder_2"))
    tensors.update({"text_encoders.t5xxl.transformer." + k: v.astype(ml_dtypes.float8_e4m3fn) for k, v in t5.items()})
    v2 = tmp_path / "flux1-dev-bnb-nf4-v2.safetensors"
    stfile.write(v2, tensors)
    got = open_single_file(v2, graph_paths=f["graphs"], family="flux-dev")
    ref = open_single_file(path, graph_paths=f["graphs"], family="flux-dev")
    assert sorted(got.parts) == sorted(ref.parts) and got.dtypes["text_encoder_2"] == {"float8_e4m3fn"}
    assert got.dtypes["transformer"] == {"nf4", "bfloat16"}
    (_, a), (_, b) = got.parts["transformer"], ref.parts["transformer"]
    assert all(np.array_equal(np.asarray(a[n]), np.asarray(b[n])) for n in b)
    t5_values = h.write(tmp_path / "t5_fp8_values.safetensors",
                        {k: v.astype(ml_dtypes.float8_e4m3fn).astype(np.float32) for k, v in t5.items()})
    fp8 = open_single_file(path, [t5_values], graph_paths=f["graphs"], family="flux-dev")  # the T5 file replaces
    (_, c), (_, d) = got.parts["text_encoder_2"], fp8.parts["text_encoder_2"]
    assert all(np.array_equal(np.asarray(c[n], np.float32), np.asarray(d[n], np.float32)) for n in d)
