"""Real exports: tiny random-init diffusers UNet and VAE decoder and a transformers CLIP text encoder,
exported by torch.onnx.export (TorchScript exporter, opset 17) with
plugin-coreml/scripts/export_tiny_diffusers.py (diffusers 0.42.1, transformers 5.23.0, torch 2.13)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from coreml_helpers import ort_intermediates, run_ort

import sdrt
from sdrt_coreml import package
from sdrt_coreml.backend import CoreMLBackend
from sdrt_coreml.evaluate import evaluate

DATA = Path(__file__).parent / "data"
rng = np.random.default_rng(0)
FEEDS = {
    "unet": {"sample": rng.standard_normal((1, 4, 8, 8)).astype(np.float32), "timestep": np.array([10.0], np.float32),
             "encoder_hidden_states": rng.standard_normal((1, 77, 16)).astype(np.float32)},
    "vae_decoder": {"latent_sample": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)},
    "text_encoder": {"input_ids": rng.integers(0, 1000, (1, 77)).astype(np.int64)},
}
#: attention blocks torch wrote (q and k each pre-scaled by Sqrt/Div, CLIP's causal mask added): the UNet
#: has 4 transformer blocks (down, mid, 2 up) of self- and cross-attention
ATTENTION = {"unet": 8, "vae_decoder": 1, "text_encoder": 2}


@pytest.mark.parametrize("name", sorted(FEEDS))
@pytest.mark.parametrize("target", ["macOS14", "macOS15"])
def test_real_export_lowers_like_onnxruntime(name, target):
    path = DATA / f"{name}.onnx"
    model, feeds = onnx.load(path), FEEDS[name]
    want = run_ort(model, feeds)
    ref = None if name == "text_encoder" else ort_intermediates(model, feeds)
    ev = evaluate(sdrt.Graph.load(path), feeds, target=target, reference=ref)
    assert set(ev.stand_ins) <= {"conv", "upsample_nearest_neighbor"}
    assert ev.fused_attention == (ATTENTION[name] if target == "macOS15" else 0)
    for k, w in want.items():  # the text encoder's pooled output goes through ArgMax and a runtime Gather
        np.testing.assert_allclose(ev.outputs[k], w, rtol=1e-4, atol=1e-5, err_msg=k)


def test_real_unet_builds_for_macos15(tmp_path):
    out = CoreMLBackend().build(sdrt.Graph.load(DATA / "unet.onnx"), None, "macOS15", tmp_path / "unet.mlpackage")
    built = package.load(out)
    assert built.op_counts["scaled_dot_product_attention"] == ATTENTION["unet"]
    assert [i[0] for i in built.io["inputs"]] == ["sample", "timestep", "encoder_hidden_states"]
    assert not [k for k in built.folded if k.endswith((".weight", ".bias"))]
