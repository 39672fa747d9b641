"""Data for the checkpoint tests: tests/data/ckpt/, built by scripts/gen_checkpoint_data.py with diffusers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parent.parent / "data" / "ckpt"
PIPE_FOLDER = Path(__file__).resolve().parent.parent / "data" / "pipelines" / "tiny-sd15"


@pytest.fixture(scope="session")
def inputs() -> dict[str, np.ndarray]:
    return dict(np.load(DATA / "inputs.npz"))


def feeds_for(part: str, x: dict[str, np.ndarray], row: int = 0) -> dict[str, np.ndarray]:
    return {
        "text_encoder": {"input_ids": x["input_ids"][row:row + 1]},
        "unet": {"sample": x["sample"], "timestep": x["timestep"], "encoder_hidden_states": x["ehs"]},
        "vae_decoder": {"latent_sample": x["latent"]},
        "vae_encoder": {"sample": x["image"]},
    }[part]


@pytest.fixture(autouse=True)
def backends(registry, tmp_path_factory, monkeypatch):
    """The reference backend plus the installed plugins (OpenVINO, ggml) that the tests session installs."""
    import sdrt_ggml
    import sdrt_openvino

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    registry.register_plugin(sdrt_openvino, "openvino", distribution="sdrt-openvino", version="0.1.0")
    registry.register_plugin(sdrt_ggml, "ggml", distribution="sdrt-ggml", version="0.1.0")
    return registry
