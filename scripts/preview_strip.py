"""A strip of live previews from one run of the embedded demo model, for docs/toolbox.md.

    python scripts/preview_strip.py [-o docs/preview-strip.png] [--backend openvino]

Needs only sdrt (no torch). The demo model's VAE is its own, so ComfyUI's SD 1.x factors do not fit
it: the script first fits factors to it with ``fit_latent_rgb`` (eight other prompts, their final
latents and decoded images), then generates one image with those factors as its ``preview=`` function and
a step callback that asks the pipeline for its preview (``pipe.preview()``: the step's denoised
estimate, as A1111 and ComfyUI show it). The strip is: the preview after each step (nearest-upscaled to
the image size), then the decoded image, all shown at twice their size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from sdrt import pipelines
from sdrt.pipelines.png import write_png
from sdrt.pipelines.preview import fit_latent_rgb, project

FIT_PROMPTS = ["a red circle on a blue background", "a yellow square on a purple background",
               "a green star on a white background", "a white ring on a black background",
               "an orange triangle on a green background", "blue stripes on a yellow background",
               "a black square on a red background", "a purple circle on an orange background"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", type=Path, default=Path("docs/preview-strip.png"))
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    with pipelines.load(pipelines.DEMO_MODEL, backend=args.backend) as pipe:
        latents, images = [], []
        for i, prompt in enumerate(FIT_PROMPTS):
            final: list[np.ndarray] = []
            gen = pipe.generate(prompt, steps=args.steps, sampler="Euler", seed=100 + i,
                                callback=lambda step, total, x, final=final: final.append(x.copy()))
            latents.append(final[-1][0])
            images.append(gen.images[0])
        factors, bias = fit_latent_rgb(np.stack(latents), np.stack(images))
        frames: list[np.ndarray] = []
        gen = pipe.generate("a red star on a blue background, top left", steps=args.steps, sampler="Euler", seed=7,
                            preview=lambda x: project(x, factors=factors, bias=bias, upscale=8),
                            callback=lambda step, total, x: frames.append(pipe.preview()))
    strip = np.concatenate([*frames, gen.images[0]], axis=1).repeat(2, axis=0).repeat(2, axis=1)  # 2x to see it
    write_png(args.output, strip)
    print(args.output, strip.shape, "factors", np.round(factors, 3).tolist(), "bias", np.round(bias, 3).tolist())


if __name__ == "__main__":
    main()
