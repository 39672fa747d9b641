"""Paths and feeds shared by the checkpoint tests (tests/data/ckpt/, built by scripts/gen_checkpoint_data.py).

A uniquely named module, not ``conftest``: pytest imports every folder's conftest as the module
``conftest``, so ``from conftest import ...`` picks whichever folder's was imported first when
``pytest tests/checkpoint tests/pipelines`` runs both folders in one session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "data" / "ckpt"
PIPE_FOLDER = Path(__file__).resolve().parent.parent / "data" / "pipelines" / "tiny-sd15"


def feeds_for(part: str, x: dict[str, np.ndarray], row: int = 0) -> dict[str, np.ndarray]:
    return {
        "text_encoder": {"input_ids": x["input_ids"][row:row + 1]},
        "unet": {"sample": x["sample"], "timestep": x["timestep"], "encoder_hidden_states": x["ehs"]},
        "vae_decoder": {"latent_sample": x["latent"]},
        "vae_encoder": {"sample": x["image"]},
    }[part]
