"""Run as a script (its own process, so its RSS is the job's): one depth_midas ControlNet job on the tiny SD 1.5
model with a MiDaS file, under a roomy budget or one just below the plan's all-resident peak (``tight``).
Prints a JSON line: the plan's placement of the detector, the detectors kept after the job, and the process's
RSS while the UNet runs (the highest at its steps) and its peak (VmHWM).

    python kept_rss_probe.py MIDAS_FILE roomy|tight
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["SDRT_LOAD_ENTRY_POINTS"] = "0"
os.environ["SDRT_PRECISION"] = "fp32"
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]


def main(path: str, mode: str) -> dict:
    import numpy as np
    from pipeline_helpers import DATA, register

    from sdrt import pipelines
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.budget import current_rss, peak_rss
    from sdrt.pipelines.controlnet import ControlNet

    register("openvino")
    image = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    steps: list[int] = []
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend="openvino") as pipe:
        unit = ControlNet("controlnet", image, preprocessor="depth_midas", processor_res=64, preprocessor_models=path)
        kw = dict(controlnets=[unit], steps=3, seed=1, width=64, height=64, sampler="Euler")
        plan = pipe.plan("a room", **kw).memory
        if mode == "tight":  # just below every part resident: the plan releases what it can after use
            pipe.memory = int(plan.peak_bytes - 2**20)
        gen = pipe.generate("a room", callback=lambda *a: steps.append(current_rss()), **kw)
        placed = pipe.memory_plan().placement("preprocessor:midas")
        return {"mode": mode, "planned": plan.placement("preprocessor:midas").placement, "placed": placed.placement,
                "detector_bytes": placed.weight_bytes, "kept": [k for k, *_ in preprocessors.kept_detectors()],
                "unet_rss": max(steps), "peak_rss": peak_rss()[0], "images": len(gen.images)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
