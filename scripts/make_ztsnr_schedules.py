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
from pathlib import Path

from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "pipelines" / "ztsnr_schedules.json"


def main() -> None:
    release = json.loads((ROOT / "core" / "src" / "sdrt" / "data" / "release" / "families.json").read_text())
    base = {**release["sdxl"]["scheduler"], "prediction_type": "v_prediction", "rescale_betas_zero_snr": True}
    rows = []
    for spacing in ("leading", "trailing"):
        config = {**base, "timestep_spacing": spacing}
        for sampler, cls, extra in (("Euler", EulerDiscreteScheduler, {}), ("Euler a", EulerAncestralDiscreteScheduler, {}),
                                    ("DPM++ 2M Karras", DPMSolverMultistepScheduler, {"use_karras_sigmas": True}),
                                    ("DDIM", DDIMScheduler, {})):
            for steps in (7, 20):
                sch = cls.from_config({**config, **extra})
                sch.set_timesteps(steps)
                sig = getattr(sch, "sigmas", None)
                rows.append({"config": config, "sampler": sampler, "steps": steps,
                             "timesteps": [float(t) for t in sch.timesteps],
                             "sigmas": [float(s) for s in sig] if sig is not None and sampler != "DDIM" else [],
                             "init_noise_sigma": float(sch.init_noise_sigma)})
    ac = EulerDiscreteScheduler.from_config(base).alphas_cumprod
    OUT.write_text(json.dumps({"rows": rows, "alphas_cumprod": [float(a) for a in ac]}) + "\n")
    print(len(rows), "rows; last alphas_cumprod", float(ac[-1]), "first", float(ac[0]))


if __name__ == "__main__":
    main()
