"""The automatic low-memory choice (a pure function of the device's reported memory and the parts' size)."""

from __future__ import annotations

import pytest
from ckpt_data import PIPE_FOLDER

from sdrt import pipelines
from sdrt.pipelines.lowmem import auto_low_memory, model_bytes

GIB = 2**30


def test_no_reported_memory_means_normal_mode():
    assert auto_low_memory(None, 10 * GIB) is False
    assert auto_low_memory(0, 10 * GIB) is False


def test_parts_needing_more_than_half_the_device_turn_it_on():
    assert auto_low_memory(8 * GIB, 3 * GIB) is True      # SDXL-sized parts on an 8 GB card
    assert auto_low_memory(24 * GIB, 3 * GIB) is False
    assert auto_low_memory(8 * GIB, 1 * GIB) is False     # SD 1.5 fp16 fits


def test_model_bytes_counts_external_data():
    parts = [PIPE_FOLDER / p / "model.onnx" for p in ("unet", "text_encoder")]
    total = model_bytes(parts)
    files = {f for p in parts for f in p.parent.iterdir() if f.name == "model.onnx" or f.suffix in (".onnx_data", ".bin")}
    assert (PIPE_FOLDER / "unet" / "model.onnx_data") in files
    assert total == sum(f.stat().st_size for f in files)  # each file once


@pytest.mark.needs_backend("openvino")
def test_pipeline_decides_from_the_device(registry):
    with pipelines.load(PIPE_FOLDER, backend="openvino", low_memory=None) as p:
        assert p.is_low_memory is False  # OpenVINO's CPU device reports no memory size: normal mode
        assert p.low_memory is False
