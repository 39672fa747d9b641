"""Real torch/diffusers/transformers/torchvision ONNX exports against onnxruntime (<= 1e-4).

The graphs in tests/data/ggml_exports were written by ``scripts/make_ggml_exports.py --strip``
(torch.onnx.export, opset 17, do_constant_folding=True): the SD 1.5 VAE decoder/encoder at
32x32 and 64x64 latents, the SD 1.5 and SDXL UNet architectures and the CLIP ViT-L/14 and
OpenCLIP bigG text encoders at small widths, and torchvision's MobileNetV2/V3 and ResNet-50.
Their large float weights were left out; they are filled here with seeded random values.
``clip_vit_l14_sdpa_nan_guard`` is the same CLIP export made with transformers 5.17, whose attention
carries torch's SDPA NaN guard ``Where(IsNaN(softmax), 0, softmax)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from ggml_helpers import compile_ggml

DATA = Path(__file__).resolve().parents[2] / "data" / "ggml_exports"
STRIP_MARK = "sdrt-test: random"
MODELS = sorted(p.stem for p in DATA.glob("*.onnx"))


def filled(name: str) -> onnx.ModelProto:
    """The export with its stripped weights drawn from N(0, 1/fan_in) (biases and norms N(0, 0.1^2) + 1)."""
    model = onnx.load(str(DATA / f"{name}.onnx"))
    rng = np.random.default_rng(0)
    for init in model.graph.initializer:
        if init.doc_string != STRIP_MARK:
            continue
        dims = tuple(int(d) for d in init.dims)
        fan_in = int(np.prod(dims[1:])) if len(dims) >= 3 else (min(dims) if len(dims) == 2 else 0)
        if fan_in:
            arr = rng.standard_normal(dims) / np.sqrt(fan_in)
        else:
            arr = 1.0 + 0.1 * rng.standard_normal(dims)
        dtype = np.float16 if init.data_type == onnx.TensorProto.FLOAT16 else np.float32
        init.raw_data = arr.astype(dtype).tobytes()
        init.doc_string = ""
    return model


def test_the_exports_are_all_there():
    assert {"vae_decoder_32", "vae_decoder_64", "vae_encoder_32", "vae_encoder_64", "unet_sd15", "unet_sdxl",
            "clip_vit_l14", "openclip_bigg", "mobilenet_v2", "mobilenet_v3_small", "resnet50"} <= set(MODELS)
    assert all((DATA / f"{m}.onnx").stat().st_size < 3_000_000 for m in MODELS)


def reference(name: str, tmp: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Export ``name`` with its weights filled, written under ``tmp``; its example feeds; onnxruntime's outputs."""
    import onnxruntime as ort  # a test dependency of the tests session

    path = tmp / f"{name}.onnx"
    onnx.save(filled(name), str(path))
    feeds = dict(np.load(DATA / f"{name}.npz"))
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return path, feeds, dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))


def range_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| as a fraction of the output's range (max |want|)."""
    return float(np.max(np.abs(got.astype(np.float64) - want))) / max(float(np.max(np.abs(want))), 1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_export_matches_onnxruntime(name, tmp_path):
    path, feeds, want = reference(name, tmp_path)
    with compile_ggml(onnx.load(str(path))) as session:
        got = session.run(feeds)
    for key, w in want.items():
        err = range_error(got[key], w)
        assert err <= 1e-4, f"{name}:{key}: max error {err:.2e} of the output's range"
