"""diffusers' SDXL textual-inversion output and what diffusers makes of it, for tests/pipelines/test_sdxl_ti.py.

``examples/textual_inversion/textual_inversion_sdxl.py`` adds its placeholder tokens (``<cat-toy>``, ``<cat-toy>_1``
for ``--num_vectors 2``) to both tokenizers, trains their rows of both text encoders' token tables, and saves each
encoder's rows as ``{placeholder_token: rows}`` (``save_progress``, ``metadata={"format": "pt"}``):
``learned_embeds.safetensors`` (text_encoder, CLIP-L) and ``learned_embeds_2.safetensors`` (text_encoder_2, CLIP-G).
This does the same on tiny-sdxl's encoders (rebuilt, seeded, as ``gen_pipeline_refs.build`` made them), random rows
standing in for training, into ``tests/data/pipelines/sdxl_ti/``.

Reference: a fresh tiny-sdxl pipeline that loads the two files as diffusers documents, one ``load_textual_inversion``
per text encoder (``token="<cat-toy>"``, ``text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2`` for the
second): ``encode_prompt`` of ``PROMPT`` (``prompt_embeds`` [1, 77, 32 + 32], ``pooled``) and the image (Euler, 4 steps,
CFG 5, seed 7, 64x64) -> ``sdxl_ti/refs.npz``.

    PYTHONPATH=scripts /work/refvenv/bin/python scripts/make_sdxl_ti_refs.py
"""

from __future__ import annotations

from pathlib import Path

import gen_pipeline_refs as g
import numpy as np
import torch
from gen_pipeline_refs import build, init_image, mask_image, run_case
from safetensors.torch import save_file
from transformers import CLIPTokenizer

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "pipelines"
OUT = DATA / "sdxl_ti"
TOKEN = "<cat-toy>"
VECTORS = 2
PROMPT = "a photo of a <cat-toy> on a wooden table"
CASE = dict(prompt=PROMPT, negative_prompt="blurry", steps=4, cfg=5.0, seed=7, width=64, height=64, batch=1,
            clip_skip=None, mode="txt2img", sampler="Euler")


def _pipe():
    folder = DATA / "tiny-sdxl"
    g.write_tokenizer = lambda path, pad: CLIPTokenizer.from_pretrained(
        str(folder / ("tokenizer_2" if pad == "!" else "tokenizer")))
    return build("sdxl")


def train_stand_in() -> None:
    """The files as textual_inversion_sdxl.py's ``save_progress`` writes them, the trained rows random."""
    pipe = _pipe()
    tokens = [TOKEN] + [f"{TOKEN}_{i}" for i in range(1, VECTORS)]
    gen = torch.Generator().manual_seed(5)
    OUT.mkdir(parents=True, exist_ok=True)
    for tok, enc, name in ((pipe.tokenizer, pipe.text_encoder, "learned_embeds.safetensors"),
                           (pipe.tokenizer_2, pipe.text_encoder_2, "learned_embeds_2.safetensors")):
        assert tok.add_tokens(tokens) == VECTORS
        ids = tok.convert_tokens_to_ids(tokens)
        enc.resize_token_embeddings(len(tok))
        table = enc.get_input_embeddings().weight
        with torch.no_grad():
            table[min(ids):max(ids) + 1] = torch.randn((VECTORS, table.shape[1]), generator=gen) * 0.5
        rows = table[min(ids):max(ids) + 1]
        save_file({TOKEN: rows.detach().cpu().contiguous()}, str(OUT / name), metadata={"format": "pt"})
        print(name, tuple(rows.shape))


def reference() -> None:
    pipe = _pipe()
    pipe.load_textual_inversion(str(OUT / "learned_embeds.safetensors"), token=TOKEN, text_encoder=pipe.text_encoder,
                                tokenizer=pipe.tokenizer)
    pipe.load_textual_inversion(str(OUT / "learned_embeds_2.safetensors"), token=TOKEN,
                                text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2)
    with torch.no_grad():
        embeds, _, pooled, _ = pipe.encode_prompt(PROMPT, device="cpu", num_images_per_prompt=1,
                                                  do_classifier_free_guidance=False)
        plain, _, plain_pooled, _ = pipe.encode_prompt(PROMPT.replace(TOKEN, "toy"), device="cpu",
                                                       num_images_per_prompt=1, do_classifier_free_guidance=False)
    image = run_case(pipe, CASE, {"init_image": init_image(), "mask": mask_image()})
    np.savez_compressed(OUT / "refs.npz", prompt_embeds=embeds.numpy(), pooled=pooled.numpy(), image=image)
    print("prompt_embeds", tuple(embeds.shape), "pooled", tuple(pooled.shape), "image", image.shape,
          "moved from 'toy':", float((embeds - plain).abs().max()), float((pooled - plain_pooled).abs().max()))


if __name__ == "__main__":
    train_stand_in()
    reference()
