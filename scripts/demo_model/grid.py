"""Render docs/demo-grid.png: 16 prompts through sdrt's own pipeline on the shipped demo model, captioned.

    python scripts/demo_model/grid.py [--backend auto] [--out docs/demo-grid.png]

Runs in an environment with sdrt, a backend and Pillow (no torch). Each tile is the 64x64 image the
default settings give (20 steps, cfg 7, DPM++ 2M Karras, seed = tile number), scaled 3x with nearest
neighbour, with its prompt written under it.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from sdrt import pipelines

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [
    "a red circle on blue",
    "a yellow star on a purple background, top left",
    "a white square on a black background, bottom right",
    "a green triangle on a yellow background, center",
    "an orange ring on a blue background, top",
    "blue stripes on a white background, left",
    "a black star on a green background, right",
    "a purple circle on a green background, bottom left",
    "a large red square on a white background, top right",
    "a small yellow circle on a black background, bottom",
    "a blue triangle on a white background, top left",
    "a white ring on a red background, center",
    "green stripes on a black background, bottom right",
    "a purple star on a yellow background, center",
    "an orange triangle on a green background, bottom left",
    "a black circle on a white background, top right",
]
SCALE = 3
COLS = 4
TEXT_H = 40


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "demo-grid.png")
    args = ap.parse_args()
    pipe = pipelines.load(pipelines.DEMO_MODEL, backend=args.backend)
    images = [pipe(p, seed=i)[0] for i, p in enumerate(PROMPTS)]
    pipe.close()
    size = images[0].shape[0] * SCALE
    tile_w, tile_h = size + 16, size + TEXT_H + 12
    rows = (len(images) + COLS - 1) // COLS
    sheet = Image.new("RGB", (COLS * tile_w + 8, rows * tile_h + 8), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for i, (prompt, img) in enumerate(zip(PROMPTS, images)):
        x, y = 8 + (i % COLS) * tile_w, 8 + (i // COLS) * tile_h
        sheet.paste(Image.fromarray(img).resize((size, size), Image.NEAREST), (x, y))
        for k, line in enumerate(textwrap.wrap(prompt, 30)[:3]):
            draw.text((x, y + size + 2 + 12 * k), line, fill=(0, 0, 0), font=font)
    sheet.save(args.out, optimize=True)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
