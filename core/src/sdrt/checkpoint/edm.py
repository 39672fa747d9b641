"""What a single file's EDM keys say of its sampling and latents (Playground v2.5, CosXL).

An SDXL checkpoint trained in Karras et al.'s EDM form carries keys that say so, as ComfyUI and diffusers' single-file
loader read them:

- ``edm_mean`` / ``edm_std`` (Playground v2.5): EDM with ``sigma_data`` 0.5 over sigma 0.002..80, the release's
  ``EDMDPMSolverMultistepScheduler`` config; its VAE latents are normalized per channel, ``(latent - edm_mean) * 0.5 /
  edm_std`` (diffusers writes the keys' values as the VAE config's ``latents_mean`` / ``latents_std``, with
  ``scaling_factor`` 0.5);
- ``edm_vpred.sigma_min`` / ``edm_vpred.sigma_max`` (CosXL): v-prediction EDM with ``sigma_data`` 1.0 over the keys'
  sigmas (ComfyUI's ``V_PREDICTION_EDM``; 0.002 and 120 where a key is missing).

The scheduler configs are release data (``sdrt/data/release/families.json``, the ``sdxl`` entry's ``edm``), keyed by
the file key that selects them; the values the keys hold (a few floats) are read from the file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError

#: the keys that mark an EDM-trained SDXL file, in the order they are tested (ComfyUI's)
EDM_KEYS = ("edm_mean", "edm_vpred.sigma_max")


def edm_key(shapes: Any) -> str | None:
    """Which EDM key a file's tensors (names, or ``{name: shape}``) have: ``edm_mean`` (with ``edm_std``: Playground
    v2.5), ``edm_vpred.sigma_max`` (CosXL), or None."""
    if "edm_mean" in shapes and "edm_std" in shapes:
        return "edm_mean"
    if "edm_vpred.sigma_max" in shapes:
        return "edm_vpred.sigma_max"
    return None


def edm_label(shapes: Any) -> str | None:
    """``"Playground v2.5 (EDM)"`` / ``"CosXL (EDM, v-prediction)"`` for a file with those keys, else None."""
    key = edm_key(shapes)
    if key is None:
        return None
    return "Playground v2.5 (SDXL trained with EDM)" if key == "edm_mean" else \
        "CosXL (SDXL trained with EDM, v-prediction)"


def _values(weights: Any, key: str, path: Path, n: int | None = None, positive: bool = False) -> list[float]:
    try:
        arr = np.asarray(weights[key], dtype=np.float64).reshape(-1)
    except Exception as exc:  # a truncated file: the one line names the key  # noqa: BLE001
        raise ModelError(f"cannot read its {key} tensor: {exc}", where=str(path),
                         fix="re-download the file (it may be truncated)") from exc
    ok = arr.size == (n if n is not None else 1) and bool(np.all(np.isfinite(arr))) and \
        (not positive or bool(np.all(arr > 0)))
    if not ok:
        want = f"{n} finite numbers" if n is not None else "one finite number"
        raise ModelError(f"its {key} tensor holds {arr.size} value(s) ({arr[:8].tolist()}), not {want}"
                         + (" above 0" if positive else ""), where=str(path),
                         fix="re-download the file; it is not a Playground v2.5 / CosXL checkpoint as published")
    return [float(v) for v in arr]


def edm_release(release: dict[str, Any], weights: Any, path: Path, latent_channels: int = 4) -> dict[str, Any] | None:
    """The release defaults of an SDXL file with EDM keys: ``release`` (the SDXL release's) with the EDM scheduler
    config and, for Playground v2.5, the VAE's ``scaling_factor`` 0.5 and the keys' ``latents_mean`` /
    ``latents_std``; None for a file without EDM keys."""
    key = edm_key(weights)
    if key is None:
        return None
    spec = release.get("edm", {}).get(key)
    if spec is None:
        raise ModelError(f"sdrt's release data has no EDM settings for the {key} key", where=str(path),
                         fix="reinstall sdrt")
    scheduler = dict(spec["scheduler"])
    vae = {**release.get("vae", {}), **spec.get("vae", {})}
    if key == "edm_mean":
        vae["latents_mean"] = _values(weights, "edm_mean", path, latent_channels)
        vae["latents_std"] = _values(weights, "edm_std", path, latent_channels, positive=True)
    else:
        for name in ("sigma_min", "sigma_max"):
            if f"edm_vpred.{name}" in weights:
                scheduler[name] = _values(weights, f"edm_vpred.{name}", path, positive=True)[0]
        if not scheduler["sigma_min"] < scheduler["sigma_max"] or not math.isfinite(scheduler["sigma_max"]):
            raise ModelError(f"its edm_vpred.sigma_min {scheduler['sigma_min']:g} is not below its edm_vpred.sigma_max "
                             f"{scheduler['sigma_max']:g}", where=str(path), fix="re-download the file")
    return {**release, "scheduler": scheduler, "vae": vae, "edm_key": key, "edm_label": spec.get("label", key)}
