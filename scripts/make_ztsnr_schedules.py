"""diffusers' schedules with ``rescale_betas_zero_snr`` (zero terminal SNR, e.g. NoobAI-XL v-pred), for sdrt's tests.

SDXL's release scheduler config (``sdrt/data/release/families.json``) with ``prediction_type: v_prediction`` and
``rescale_betas_zero_snr: true``, under ``leading`` (the release's) and ``trailing`` spacing: the timesteps, sigmas and
``init_noise_sigma`` of ``EulerDiscreteScheduler``, ``EulerAncestralDiscreteScheduler``,
``DPMSolverMultistepScheduler(use_karras_sigmas=True)`` and ``DDIMScheduler`` (as in schedules.json), for 7 and 20
steps, and the Euler scheduler's ``alphas_cumprod``, into ``tests/data/pipelines/ztsnr_schedules.json``.

    /work/refvenv/bin/python scripts/make_ztsnr_schedules.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pipeline_refs as sd  # noqa: E402
from diffusers import EulerDiscreteScheduler  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "pipelines" / "ztsnr_schedules.json"


def main() -> None:
    release = json.loads((ROOT / "core" / "src" / "sdrt" / "data" / "release" / "families.json").read_text())
    base = {**release["sdxl"]["scheduler"], "prediction_type": "v_prediction", "rescale_betas_zero_snr": True}
    rows = []
    for spacing in ("leading", "trailing"):
        config = {**base, "timestep_spacing": spacing}
        for label in sd.SCHEDULERS:
            for steps in (7, 20):
                rows.append(sd.schedule_row(config, label, steps)[0])
    ac = EulerDiscreteScheduler.from_config(base).alphas_cumprod
    OUT.write_text(json.dumps({"rows": rows, "alphas_cumprod": [float(a) for a in ac]}) + "\n")
    print(len(rows), "rows; last alphas_cumprod", float(ac[-1]), "first", float(ac[0]))


if __name__ == "__main__":
    main()
