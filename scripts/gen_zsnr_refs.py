"""diffusers' zero-terminal-SNR schedules (``rescale_betas_zero_snr``), for tests/pipelines/test_pipelines_schedule.py.

    /work/refvenv/bin/python scripts/gen_zsnr_refs.py      # writes tests/data/pipelines/zsnr_schedules.json

For Euler, Euler a, DPM++ 2M Karras and DDIM (each ``from_config`` of the row's config, as users make them) at
1, 4 and 20 steps, on v-prediction configs with ``rescale_betas_zero_snr`` and trailing, leading and linspace
spacing: the timesteps, sigmas, ``init_noise_sigma`` and a sample of ``alphas_cumprod``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pipeline_refs as sd  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "pipelines" / "zsnr_schedules.json"
BASE = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012, "num_train_timesteps": 1000,
        "prediction_type": "v_prediction", "rescale_betas_zero_snr": True, "set_alpha_to_one": False,
        "steps_offset": 1, "clip_sample": False}
PICK = [0, 1, 500, 998, 999]


def main() -> None:
    rows = []
    for spacing in ("trailing", "leading", "linspace"):
        cfg = dict(BASE, timestep_spacing=spacing)
        for label in sd.SCHEDULERS:
            for steps in (1, 4, 20):
                row, s = sd.schedule_row(cfg, label, steps)
                rows.append(dict(row, alphas_cumprod={str(i): float(s.alphas_cumprod[i]) for i in PICK}))
    OUT.write_text(json.dumps(rows) + "\n")
    print(f"{len(rows)} rows -> {OUT}")


if __name__ == "__main__":
    main()
