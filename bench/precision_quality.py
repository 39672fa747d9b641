"""The image-quality table behind each default precision: PSNR of each precision's image against float32's.

    python -m bench.precision_quality                                # tiny folders + bench-size pipeline
    python -m bench.precision_quality --folders /work/models/sd15-full/onnx --size 256 --steps 4
    python -m bench.precision_quality --backends openvino --json precision-quality.json

For every pipeline folder (the tiny folders in tests/data/pipelines, the bench pipeline of
``bench.pipeline.build_folder``, and any ``--folders``), every installed backend (but reference) and every
precision the backend offers on its first device, one image per prompt and seed (Euler, CFG 7 with a
negative prompt, as the end-to-end bench), and its PSNR against the same backend's float32 image of the same
prompt and seed. ``sdrt.precision_default.PSNR_BAR_DB`` is the bar a default precision must clear on every
row (docs/precision.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY = ("tiny-sd15", "tiny-sd2v", "tiny-sdxl")
PROMPTS = (("a photograph of an astronaut riding a horse on the moon, detailed", "blurry, lowres, watermark", 1),
           ("a watercolor painting of a lighthouse at dusk", "text, frame", 2))


def images(folder: Path, backend: str, precision: str, *, steps: int, size: int | None,
           options: dict[str, Any]) -> tuple[list[Any], float]:
    from sdrt import pipelines

    kw: dict[str, Any] = {"width": size, "height": size} if size else {}
    pipe = pipelines.load(folder, backend=backend, precision=precision, **options)
    out = []
    t0 = time.perf_counter()
    for prompt, negative, seed in PROMPTS:
        gen = pipe.generate(prompt, negative, steps=steps, cfg=7.0, sampler="Euler", seed=seed, **kw)
        out.append(gen.images[0])
    seconds = time.perf_counter() - t0
    pipe.close() if hasattr(pipe, "close") else None
    return out, seconds


def _jpeg(image: Any, quality: int) -> Any:
    """``image`` saved as a JPEG at ``quality`` and read back (Pillow; 4:4:4, no chroma subsampling)."""
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=quality, subsampling=0)
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def offered(backend: str) -> list[str]:
    from sdrt.plugins import get_registry

    be = get_registry().backends[backend]
    dev = be.devices()[0]
    have = list(be.precisions) or ["fp32"]
    caps = {c.upper() for c in dev.properties.get("capabilities", [])}
    if dev.kind == "cpu" and caps:  # OpenVINO's list of what the CPU runs natively
        have = [p for p in have if p == "fp32" or p.upper() in caps]
    return have


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folders", nargs="*", type=Path, default=[])
    ap.add_argument("--no-tiny", action="store_true")
    ap.add_argument("--no-bench", action="store_true", help="leave out the bench-size pipeline")
    ap.add_argument("--backends", default="")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--size", type=int, default=None, help="image size for --folders (default: the model's)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    import os

    os.environ.pop("SDRT_PRECISION", None)
    from sdrt.plugins import get_registry
    from sdrt.precision_default import PSNR_BAR_DB, psnr

    reg = get_registry()
    backends = [b for b in (args.backends.split(",") if args.backends else sorted(reg.backends)) if b != "reference"]
    folders: list[tuple[Path, int | None, int]] = []
    if not args.no_tiny:
        folders += [(ROOT / "tests" / "data" / "pipelines" / t, None, args.steps) for t in TINY]
    if not args.no_bench:
        from bench.pipeline import build_folder

        work = Path(tempfile.gettempdir()) / "sdrt-bench-pipeline"
        work.mkdir(exist_ok=True)
        folders.append((build_folder(work, "bench"), None, args.steps))
    folders += [(f, args.size, args.steps) for f in args.folders]
    rows = []
    for be in backends:
        try:
            precisions = offered(be)
            default = reg.backends[be].precision_for(reg.backends[be].devices()[0])
        except Exception as exc:  # noqa: BLE001 - a backend with no device here
            print(f"{be}: skipped ({exc})", file=sys.stderr)
            continue
        for folder, size, steps in folders:
            opts: dict[str, Any] = {}
            ref, ref_s = images(folder, be, "fp32", steps=steps, size=size, options=opts)
            for p in precisions:
                if p == "fp32":
                    continue
                got, secs = images(folder, be, p, steps=steps, size=size, options=opts)
                values = [psnr(g, r) for g, r in zip(got, ref)]
                jpeg = [psnr(_jpeg(r, 90), r) for r in ref]
                row = {"backend": be, "folder": folder.name if folder.name != "onnx" else folder.parent.name,
                       "precision": p, "default": p == default, "size": size, "steps": steps,
                       "psnr_min_db": min(values), "psnr_db": values, "jpeg90_db": jpeg, "seconds": secs, "fp32_seconds": ref_s}
                rows.append(row)
                print(f"{be:9s} {row['folder']:28s} {p:5s} {'default' if p == default else '':7s} "
                      f"PSNR min {min(values):6.1f} dB  ({', '.join(f'{v:.1f}' for v in values)})  "
                      f"JPEG q90 {min(jpeg):5.1f} dB  {secs:.1f} s vs fp32 {ref_s:.1f} s", flush=True)
    bad = [r for r in rows if r["default"] and r["psnr_min_db"] < PSNR_BAR_DB]
    print(f"bar {PSNR_BAR_DB} dB: {'every default clears it' if not bad else f'{len(bad)} default rows below it'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
