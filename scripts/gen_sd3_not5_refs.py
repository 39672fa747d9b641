"""References for SD 3 without T5: diffusers' ``StableDiffusion3Pipeline`` with ``text_encoder_3=None``.

Run with the reference venv:

    /work/refvenv/bin/python scripts/gen_sd3_not5_refs.py

The tiny SD3 folder's torch pipeline is rebuilt by ``gen_flow_refs.build("sd3")`` (seeded, so the same weights
as ``tests/data/pipelines/tiny-sd3``); the script first checks the rebuilt pipeline gives the folder's own
with-T5 reference image again, then runs it with ``text_encoder_3=None, tokenizer_3=None``: diffusers'
``_get_t5_prompt_embeds`` then gives zeros ``[batch, max_sequence_length, joint_attention_dim]`` for the prompt and
the negative prompt alike. Writes ``tests/data/pipelines/tiny-sd3/refs_not5.json`` and ``refs_not5.npz``
(per case: the image, ``prompt_embeds``, ``negative_prompt_embeds``).

The same for the tiny SD 3 Medium (``gen_sd3_medium_refs.make_transformer``, checked against
``tests/data/pipelines/tiny-sd3-medium``'s first image), written to that folder's ``refs_not5.*``: the single
files and the diffusers folder without T5 are checked against it.

    PYTHONPATH=scripts:scripts/_tvblock:core/src /work/refvenv/bin/python scripts/gen_sd3_not5_refs.py
"""

from __future__ import annotations

import json

import gen_flow_refs as g
import numpy as np
import torch
from diffusers import StableDiffusion3Pipeline
from transformers import CLIPTokenizer, T5TokenizerFast

FOLDER = g.OUT / "tiny-sd3"


def _run(pipe, case: dict) -> dict[str, np.ndarray]:
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    kw = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], guidance_scale=case["cfg"],
              num_inference_steps=case["steps"], generator=gen, output_type="np", height=case["height"],
              width=case["width"], max_sequence_length=case["max_sequence_length"])
    with torch.no_grad():
        pe, ne, pp, npool = pipe.encode_prompt(prompt=case["prompt"], prompt_2=None, prompt_3=None,
                                               negative_prompt=case["negative_prompt"],
                                               max_sequence_length=case["max_sequence_length"])
        image = pipe(**kw).images
    return {"image": (np.clip(image, 0, 1) * 255).round().astype(np.uint8), "prompt_embeds": pe.numpy(),
            "negative_prompt_embeds": ne.numpy()}


def main() -> None:
    torch.set_num_threads(2)
    # the fixture's own tokenizers (the BPE cut needs open_clip, the unigram training sentencepiece): same vocabularies
    g.write_tokenizer = lambda folder, pad: CLIPTokenizer.from_pretrained(FOLDER / folder.name)
    g.write_t5_tokenizer = lambda folder: T5TokenizerFast.from_pretrained(FOLDER / folder.name)
    pipe = g.build("sd3")
    cases = json.loads((FOLDER / "refs.json").read_text())
    refs = np.load(FOLDER / "refs.npz")
    first = cases[0]
    again = _run(pipe, first)["image"]
    want = refs[f"{first['name']}/image"]
    diff = int(np.abs(again.astype(int) - want.astype(int)).max())
    assert diff <= 1, f"the rebuilt pipeline is not the fixture's (image differs by {diff})"
    comps = dict(pipe.components, text_encoder_3=None, tokenizer_3=None)
    bare = StableDiffusion3Pipeline(**comps)
    bare.set_progress_bar_config(disable=True)
    out_cases = [dict(first, name="no t5/64x96/cfg 5/negative"),
                 dict(cases[3], name="no t5/64x64/cfg 7/default max_sequence_length")]
    out: dict[str, np.ndarray] = {}
    for case in out_cases:
        for key, value in _run(bare, case).items():
            out[f"{case['name']}/{key}"] = value
        print(case["name"], out[f"{case['name']}/prompt_embeds"].shape)
    (FOLDER / "refs_not5.json").write_text(json.dumps(out_cases, indent=1) + "\n")
    np.savez_compressed(FOLDER / "refs_not5.npz", **out)
    medium(pipe)


def medium(pipe) -> None:
    import gen_sd3_medium_refs as m

    folder = g.OUT / "tiny-sd3-medium"
    pipe.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(FOLDER / "scheduler")
    tr = m.make_transformer()
    pipe.transformer = tr
    pipe.register_modules(transformer=tr)
    cases = json.loads((folder / "refs.json").read_text())
    first = next(c for c in cases if c["mode"] == "txt2img" and c["batch"] == 1)
    again = _run(pipe, first)["image"]
    diff = int(np.abs(again.astype(int) - np.load(folder / "refs.npz")[f"{first['name']}/image"].astype(int)).max())
    assert diff <= 1, f"the rebuilt SD 3 Medium pipeline is not the fixture's (image differs by {diff})"
    bare = StableDiffusion3Pipeline(**dict(pipe.components, text_encoder_3=None, tokenizer_3=None))
    bare.set_progress_bar_config(disable=True)
    case = dict(first, name="no t5/" + first["name"].split("/", 1)[1])
    out = {f"{case['name']}/{k}": v for k, v in _run(bare, case).items()}
    print(case["name"], out[f"{case['name']}/prompt_embeds"].shape)
    (folder / "refs_not5.json").write_text(json.dumps([case], indent=1) + "\n")
    np.savez_compressed(folder / "refs_not5.npz", **out)


if __name__ == "__main__":
    main()
