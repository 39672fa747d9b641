"""GGUF checkpoints bound onto the ONNX exports by name, as city96's conversions are laid out: the
original checkpoint's tensor names, large weights block-quantized, small ones and norms in F32/F16.
The file is written here from the LDM test checkpoint with gguf's own writer and quantizer."""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_data import DATA, feeds_for

import sdrt
from sdrt.checkpoint import Checkpoint
from sdrt.graph import Graph
from sdrt.weights import Weights

gguf = pytest.importorskip("gguf", reason="the optional gguf package is not installed (pip install gguf)")


def _write_gguf(path, arrays: dict[str, np.ndarray], qtype: str, strip_prefix: str = ""):
    from gguf import quants

    t = gguf.GGMLQuantizationType[qtype]
    w = gguf.GGUFWriter(str(path), "sd1")
    kinds = {}
    for name, a in arrays.items():
        a = np.ascontiguousarray(np.asarray(a, np.float32))
        key = name.removeprefix(strip_prefix)
        if a.ndim >= 2 and a.shape[-1] % 32 == 0 and a.size >= 1024:  # city96: big matrices quantized
            w.add_tensor(key, quants.quantize(a, t), raw_dtype=t)
            kinds[key] = qtype
        elif a.ndim >= 2:
            w.add_tensor(key, a.astype(np.float16))
            kinds[key] = "F16"
        else:
            w.add_tensor(key, a)
            kinds[key] = "F32"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kinds


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_unet_only_gguf_binds_by_name_and_runs(tmp_path, inputs, qtype):
    src = Weights.open(DATA / "sd1" / "ldm.safetensors")
    unet = {k: src[k] for k in src if k.startswith("model.diffusion_model.")}
    path = tmp_path / f"unet-{qtype}.gguf"
    kinds = _write_gguf(path, unet, qtype, strip_prefix="model.diffusion_model.")  # UNet-only, as city96 ships
    assert qtype in kinds.values() and "F32" in kinds.values()
    ckpt = Checkpoint.open(path)
    assert ckpt.family and "unet" in ckpt.components
    graph = Graph.load(DATA / "sd1" / "unet" / "model.onnx")
    arrays = ckpt.arrays({"unet": graph})["unet"]
    assert set(arrays) == set(graph.initializer_names)
    exact = Checkpoint.open(DATA / "sd1" / "ldm.safetensors").arrays({"unet": graph})["unet"]
    with sdrt.load(graph, backend="reference") as s:
        s.update_weights(Weights.from_graph(graph).replaced(arrays))
        out = next(iter(s.run(feeds_for("unet", inputs)).values()))
    ref = np.load(DATA / "sd1" / "refs_ldm.npz")["unet"]  # diffusers, float32 checkpoint
    err = np.abs(out - ref).max() / np.abs(ref).max()
    # each quantized weight read as gguf dequantizes it, and within the type's error of the float32 one
    worst = max(float(np.abs(arrays[k] - exact[k]).max() / max(np.abs(exact[k]).max(), 1e-9)) for k in arrays)
    assert worst <= {"Q8_0": 0.01, "Q4_0": 0.15}[qtype]
    assert 0 < err <= {"Q8_0": 0.01, "Q4_0": 0.1}[qtype], err


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_pipeline_load_weights_takes_a_gguf_checkpoint(tmp_path, backend, caplog):
    from ckpt_data import PIPE_FOLDER

    from sdrt import pipelines

    src = Weights.open(DATA / "pipe-sd15" / "custom.safetensors")  # a full LDM checkpoint: all three models
    path = tmp_path / "custom-Q8_0.gguf"
    kinds = _write_gguf(path, {k: src[k] for k in src}, "Q8_0")
    assert list(kinds.values()).count("Q8_0") >= 20
    pipe = pipelines.load(PIPE_FOLDER, backend=backend, **({"precision": "fp32"} if backend == "ggml" else {}))
    try:
        pipe.load_weights(DATA / "pipe-sd15" / "custom.safetensors")
        a = pipe("a cat", steps=2, seed=3)[0]
        with caplog.at_level("INFO", logger="sdrt"):
            pipe.load_weights(path)
            b = pipe("a cat", steps=2, seed=3)[0]
    finally:
        pipe.close()
    # ggml keeps the file's Q8_0 matmul weights as blocks (update_weights lowers again); OpenVINO gets float32
    kept = "Q8_0 kept for ggml's quantized mul_mat" in caplog.text
    assert kept == (backend == "ggml"), caplog.text[-2000:]
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    assert 0 < mse and 10 * np.log10(255.0 ** 2 / mse) > 35  # Q8_0 of the same checkpoint: close, not equal


@pytest.mark.needs_backend("ggml")
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_unet_gguf_on_ggml_keeps_the_blocks(tmp_path, inputs, qtype):
    """The same city96-style file on ggml: its Q8_0/Q4_0 matmul weights stay in their blocks (ggml's quantized
    mul_mat, which also rounds the activations to 8-bit blocks), everything else is float32; the output is
    diffusers' within the same bound as the float32 reading above."""
    src = Weights.open(DATA / "sd1" / "ldm.safetensors")
    unet = {k: src[k] for k in src if k.startswith("model.diffusion_model.")}
    path = tmp_path / f"unet-{qtype}.gguf"
    _write_gguf(path, unet, qtype, strip_prefix="model.diffusion_model.")
    graph = Graph.load(DATA / "sd1" / "unet" / "model.onnx")
    refs = Checkpoint.open(path).lazy({"unet": graph})["unet"]
    weights = Weights(refs, sources=[path])
    n_blocks = sum(1 for r in refs.values() if r.blocks is not None)
    assert n_blocks >= 10
    with sdrt.load(graph, backend="ggml", weights=weights, precision="fp32") as s:
        out = next(iter(s.run(feeds_for("unet", inputs)).values()))
        kept = s._lo.blocks_kept
        assert s.impl_hits.get(f"mul_mat_{qtype}", 0) == kept.get(qtype) and kept.get(qtype, 0) >= 10, kept
        quantized = s.weight_bytes()
    floats = Weights.from_arrays({n: np.asarray(weights[n]) for n in weights})
    with sdrt.load(graph, backend="ggml", weights=floats, precision="fp32") as s:
        dense = next(iter(s.run(feeds_for("unet", inputs)).values()))
        assert quantized < s.weight_bytes()
    ref = np.load(DATA / "sd1" / "refs_ldm.npz")["unet"]  # diffusers, float32 checkpoint
    err = np.abs(out - ref).max() / np.abs(ref).max()
    assert 0 < err <= {"Q8_0": 0.01, "Q4_0": 0.1}[qtype], err
    # against ggml on the file's values dequantized: only the activations' 8-bit rounding differs
    assert np.abs(out - dense).max() / np.abs(dense).max() <= 3e-2
