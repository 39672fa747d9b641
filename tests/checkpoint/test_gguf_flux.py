"""A Flux.1 dev transformer as city96's GGUF conversions ship it (Black Forest Labs' keys, no prefix; the large
matrices block-quantized, norms, biases and small tensors in F32), written with gguf's own writer and
quantizer from tests/data/pipelines/tiny-flux-dev (flow_file_helpers: the renaming inverts diffusers' converter),
loaded with ``pipelines.load`` on ggml with the release-style text-encoder and VAE files: its matmul weights
stay in the file's blocks (Flux's fused ``qkv`` and ``linear1`` split by rows of blocks, the MatMul weights as
their transpose). The image is checked against the same file run on the reference backend (which reads every
tensor dequantized to float32: only ggml's 8-bit rounding of the activations differs) and, for Q8_0, against
diffusers' image of the float32 model, both within the GGUF pipeline test's bound (35 dB PSNR). A Q4_K file
holds Q4_K only where a row is whole super-blocks of 256 (the time embedder's input layer here) and Q5_0
elsewhere, as llama.cpp's converters fall back."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import test_flow_single_files as flow
from flow_file_helpers import bfl_transformer

from sdrt import pipelines

gguf = pytest.importorskip("gguf", reason="the optional gguf package is not installed (pip install gguf)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gguf"))  # gguf_files: ggml's C quantizer


def _write(path, arrays, qtype):
    from gguf import quants
    from gguf_files import ggml_quantize  # the K-quants: ggml's C quantizer, as llama.cpp's converters call

    w = gguf.GGUFWriter(str(path), "flux")
    kinds = {}
    for key, a in arrays.items():
        a = np.ascontiguousarray(np.asarray(a, np.float32))
        if a.ndim == 2 and a.shape[-1] % 32 == 0 and a.size >= 1024:  # city96: the big matrices quantized
            kind = qtype if qtype != "Q4_K" or a.shape[-1] % 256 == 0 else "Q5_0"
            t = gguf.GGMLQuantizationType[kind]
            blocks = quants.quantize(a, t) if kind != "Q4_K" else ggml_quantize(a, kind)
            w.add_tensor(key, blocks, raw_dtype=t)
            kinds[key] = kind
        else:
            w.add_tensor(key, a)
            kinds[key] = "F32"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kinds


def _psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * np.log10(255.0 ** 2 / max(mse, 1e-12))


def _image(path, f, backend, **opts):
    case, kw = flow._case("flux-dev")
    with pipelines.load(path, backend=backend, text_encoders=f["text_encoders"], vae=f["vae"], graph_paths=f["graphs"],
                        tokenizers=f["tokenizers"], family="flux-dev", **opts) as pipe:
        assert pipe.folder.single_file.family == "flux-dev"
        return np.stack(pipe(case["prompt"], case["negative_prompt"] or "", **kw))


@pytest.mark.needs_backend("ggml")
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_flux_gguf_on_ggml_keeps_the_blocks(tmp_path, qtype, caplog):
    f = flow._files("flux-dev", tmp_path)
    tr = bfl_transformer(flow._params(flow.PIPES / "tiny-flux-dev", "transformer"))
    path = tmp_path / f"flux1-dev-{qtype}.gguf"
    kinds = _write(path, tr, qtype)
    assert list(kinds.values()).count(qtype) >= (20 if qtype == "Q8_0" else 1)
    assert "double_blocks.0.img_attn.qkv.weight" in kinds and "single_blocks.0.linear1.weight" in kinds
    with caplog.at_level("INFO", logger="sdrt"):
        got = _image(path, f, "ggml", precision="fp32")
    kept = [r.getMessage() for r in caplog.records if "kept for ggml's quantized mul_mat" in r.getMessage()]
    assert kept, "no GGUF block weight reached ggml's quantized mul_mat"
    counts = {kind: int(n) for n, kind in (p.split(" ")[:2] for p in kept[0].split("block weights: ")[1]
                                             .split("; ") if "kept" in p)}
    # every quantized Linear of the file (Flux's fused qkv thirds and linear1 rows included) ran on its blocks
    assert sum(counts.values()) >= 30 and set(counts) == set(kinds.values()) - {"F32"}, counts
    assert "dequantized" not in kept[0], kept  # the transformer reads no block tensor but through a matmul
    exact = _image(path, f, "reference")  # the file's values dequantized to float32
    assert _psnr(got, exact) > 35, (qtype, _psnr(got, exact))
    if qtype == "Q8_0":
        case, _ = flow._case("flux-dev")
        want = np.load(flow.PIPES / "tiny-flux-dev" / "refs.npz")[f"{case['name']}/image"]
        assert _psnr(got, want) > 35, (qtype, _psnr(got, want))


@pytest.mark.needs_backend("ggml")
def test_the_memory_plan_counts_kept_blocks_as_stored(tmp_path):
    """Under a budget, a transformer whose matmul weights ggml runs from the file's Q8_0 blocks counts their stored
    bytes (about 34/128 of float32) with a footprint near 1 (no second copy); on the reference backend, which
    reads them as float32, the same file counts float32 bytes at the usual footprint."""
    f = flow._files("flux-dev", tmp_path)
    tr = bfl_transformer(flow._params(flow.PIPES / "tiny-flux-dev", "transformer"))
    path = tmp_path / "flux1-dev-Q8_0.gguf"
    _write(path, tr, "Q8_0")
    plans = {}
    for backend in ("ggml", "reference"):
        with pipelines.load(path, backend=backend, text_encoders=f["text_encoders"], vae=f["vae"],
                            graph_paths=f["graphs"], tokenizers=f["tokenizers"], family="flux-dev",
                            memory="64GB") as pipe:
            plans[backend] = pipe.memory_plan()
    g, r = (plans[b].placement("transformer") for b in ("ggml", "reference"))
    assert g.weight_bytes < 0.6 * r.weight_bytes, (g.weight_bytes, r.weight_bytes)
    assert plans["ggml"].footprints["transformer"] < plans["ggml"].footprint
    assert "transformer" not in plans["reference"].footprints
    assert plans["ggml"].placement("vae_decoder").weight_bytes == plans["reference"].placement("vae_decoder").weight_bytes
    assert "x transformer's" in plans["ggml"].format()
