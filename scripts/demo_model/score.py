"""Score the shipped demo model on the 40 held-out captions through sdrt's own pipeline (no torch).

    python scripts/demo_model/score.py [--folder DIR] [--backend openvino] [--samplers "DPM++ 2M Karras,Euler,Euler a,DDIM"]

Generates each held-out caption of tests/demo/heldout.json with seed = its index and the demo's defaults (20 steps,
cfg 7), measures it like tests/demo/test_demo_model.py, and prints per sampler how many have the right colours and
how many also have the shape in the named cell, then each failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sdrt import pipelines

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "demo"))
from demo_measure import check_image  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=pipelines.DEMO_MODEL, help="model folder (default: the shipped one)")
    ap.add_argument("--backend", default="openvino")
    ap.add_argument("--samplers", default="DPM++ 2M Karras,Euler,Euler a,DDIM")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cfg", type=float, default=7.0)
    args = ap.parse_args()
    heldout = json.loads((ROOT / "tests" / "demo" / "heldout.json").read_text())
    cases = heldout["cases"]
    with pipelines.load(args.folder, backend=args.backend) as pipe:
        for sampler in args.samplers.split(","):
            colour = both = 0
            fails = []
            for seed, case in enumerate(cases):
                image = pipe(case["prompt"], steps=args.steps, cfg=args.cfg, sampler=sampler, seed=seed)[0]
                colour += not check_image(image, case, heldout, position=False)
                why = check_image(image, case, heldout)
                both += not why
                if why:
                    fails.append(f"  {case['prompt']!r} seed {seed}: {why}")
            print(f"{sampler}: colours {colour}/{len(cases)}, colours and cell {both}/{len(cases)}")
            print("\n".join(fails))


if __name__ == "__main__":
    main()
