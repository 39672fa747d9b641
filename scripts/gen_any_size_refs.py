"""diffusers' images at sizes whose latent does not halve evenly, for the UNet exports that sdrt re-points at their
skips' sizes (``sdrt.graph.upsample``).

Needs torch and diffusers (/work/refvenv); the tests read only what this writes:

    /work/refvenv/bin/python scripts/gen_any_size_refs.py
    # tests/data/pipelines/any_size_refs.{json,npz}

The models are tiny-sd15-dyn's and tiny-sdxl-dyn's (``gen_pipeline_refs.build``: the same weights; both UNets have two
down blocks, so their exports, traced at even latents, ran only at multiples of 16 pixels). At 72x88 (a 9x11 latent)
or 40x72, diffusers' UNet halves the latent to 5x6 and passes the skip's size to its upsampler
(``forward_upsample_size``); each case is ``StableDiffusionPipeline`` / ``StableDiffusionXLPipeline`` txt2img with
``torch.Generator("cpu").manual_seed(seed)``, as gen_pipeline_refs.py writes its cases.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pipeline_refs as g  # noqa: E402  (hides torchvision, as that script does)
import numpy as np  # noqa: E402
import torch  # noqa: E402

OUT = g.OUT / "any_size_refs"


def cases() -> list[dict]:
    base = dict(prompt=g.PROMPT, negative_prompt=g.NEGATIVE, steps=6, cfg=7.0, batch=1, clip_skip=None,
                mode="txt2img")
    return [
        dict(base, name="sd15/Euler/72x88", folder="tiny-sd15-dyn", kind="sd15", sampler="Euler", width=72,
             height=88, seed=5),
        dict(base, name="sd15/DPM++ 2M Karras/120x40", folder="tiny-sd15-dyn", kind="sd15",
             sampler="DPM++ 2M Karras", width=120, height=40, seed=6),
        dict(base, name="sdxl/Euler/40x72", folder="tiny-sdxl-dyn", kind="sdxl-dyn", sampler="Euler", width=40,
             height=72, seed=7),
    ]


def rebuilt(kind: str, folder: str):
    """The model of ``folder`` rebuilt, with the folder's scheduler config; checked against the folder's first
    reference (or, for tiny-sd15-dyn, which has none, tiny-sd15's: the same weights), pixel for pixel."""
    pipe = g.build(kind)
    if kind == "sdxl-dyn":  # the committed folder's first text encoder runs quick_gelu (its config.json), as SDXL's
        from transformers.activations import ACT2FN  # CLIP-L does; build() now gives it gelu

        pipe.text_encoder.config.hidden_act = "quick_gelu"
        for layer in pipe.text_encoder.encoder.layers:
            layer.mlp.activation_fn = ACT2FN["quick_gelu"]
    pipe.scheduler = type(pipe.scheduler).from_config(g.RELEASE_SCHEDULERS[kind])
    refs = g.OUT / (folder if kind != "sd15" else "tiny-sd15")
    check = json.loads((refs / "refs.json").read_text())[0]
    got = g.run_case(pipe, check, {"init_image": g.init_image(), "mask": g.mask_image()})
    want = np.load(refs / "refs.npz")[check["name"]]
    assert np.array_equal(got, want), f"the rebuilt {folder} differs: max diff {np.abs(got - want).max()}"
    return pipe


def main() -> None:
    torch.set_num_threads(1)
    pipes = {}
    out, all_cases = {}, cases()
    for case in all_cases:
        if case["kind"] not in pipes:
            pipes[case["kind"]] = rebuilt(case["kind"], case["folder"])
        out[case["name"]] = g.run_case(pipes[case["kind"]], case, {"init_image": np.zeros((8, 8, 3), np.uint8)})
        print(case["name"], out[case["name"]].shape, float(out[case["name"]].std()))
    OUT.with_suffix(".json").write_text(json.dumps(all_cases, indent=1) + "\n")
    np.savez_compressed(OUT.with_suffix(".npz"), **out)


if __name__ == "__main__":
    main()
