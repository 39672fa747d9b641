"""FLUX.1 Kontext references: diffusers' ``FluxKontextPipeline`` on the tiny Flux dev of ``tests/data/pipelines``.

Run with the reference venv (torch, diffusers 0.42): ``/work/refvenv/bin/python scripts/gen_kontext_refs.py``.
It rebuilds the torch pipeline of ``tiny-flux-dev`` exactly as ``gen_flow_refs.py`` built it (same seeds), checks
that it still gives that folder's first reference image bit for bit, then runs Kontext on its components and
writes ``tests/data/pipelines/tiny-flux-dev/kontext.json`` (the cases) and ``kontext.npz`` (the reference
pictures as given, the images, and each case's first transformer call's ``img_ids``).

Cases:

- one reference (80x48, a multiple of 16) with ``_auto_resize=False``, the output at the reference's size;
- one reference of 70x45 with ``_auto_resize=True``: diffusers sizes it to 1456x720 (the preferred resolution
  nearest the aspect of its sides cut to multiples of 16, 64x32), Lanczos; the output 64x64;
- two references (80x48 and 32x48), batch 2, true CFG 4 with a negative prompt. diffusers' Kontext pipeline
  takes one reference image per prompt (a list is a batch), so several references follow ComfyUI's
  ``ReferenceLatent`` chain (its default ``offset`` method, as ``comfy/ldm/flux/model.py`` places them): each
  reference's tokens are appended in order, index 1, the second placed below or beside the first. The script
  does that inside diffusers' own pipeline by extending ``prepare_latents``' reference tokens and ids; every
  other step (encoding, noise, schedule, CFG, decoding) is diffusers'.

diffusers always rescales ``width x height`` to ``max_area`` (1024**2 by default), keeping the aspect ratio;
each case passes ``max_area = width * height`` so that the size asked is the size made (sdrt has no ``max_area``).

Inpainting (``kontext-inpaint.json``, ``kontext-inpaint.npz``): diffusers' ``FluxKontextInpaintPipeline`` with
``_auto_resize=False`` (sdrt keeps the init image's size; diffusers would stretch it to a Kontext resolution):

- ``image_reference=None``: the init image is the reference (its latent mean, index 1), strength 1, a mask whose
  edges are off the 16-pixel grid; sdrt's call is ``reference_images=[init]``, ``init_image=init``, ``mask``;
- ``image_reference`` another picture (32x48), strength 0.7 (3 of 4 steps), batch 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import FluxKontextInpaintPipeline, FluxKontextPipeline, FluxPipeline  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_flow_refs  # noqa: E402
from gen_flow_refs import OUT, PROMPT, build  # noqa: E402
from transformers import CLIPTokenizer, T5TokenizerFast  # noqa: E402

FOLDER = OUT / "tiny-flux-dev"
NEGATIVE = "blurry, low quality"


def picture(width: int, height: int, seed: int) -> np.ndarray:
    """A smooth synthetic photo: gradients, a rectangle and a disc, placed by ``seed``."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    y, x = y / max(height - 1, 1), x / max(width - 1, 1)
    c = rng.uniform(0.1, 0.9, (3, 3)).astype(np.float32)
    img = np.stack([c[0, 0] * x + c[0, 1] * y + 0.1, c[1, 0] * (1 - x) + c[1, 1] * y, c[2, 2] * (1 - y) + 0.05], -1)
    r0, c0 = rng.integers(0, height // 2), rng.integers(0, width // 2)
    img[r0:r0 + height // 3, c0:c0 + width // 3] = rng.uniform(0, 1, 3)
    yy, xx = np.mgrid[0:height, 0:width]
    cy, cx, rad = rng.integers(0, height), rng.integers(0, width), min(width, height) // 4
    img[(yy - cy) ** 2 + (xx - cx) ** 2 < rad * rad] = rng.uniform(0, 1, 3)
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def comfy_offset_ids(sizes: list[tuple[int, int]]) -> torch.Tensor:
    """ComfyUI's ``offset`` placement of reference latents ``(h, w)`` (latent pixels): index 1, each below or
    beside the area the earlier ones cover (comfy/ldm/flux/model.py, ``_forward`` with ``ref_latents``)."""
    out, h, w = [], 0, 0
    for rh, rw in sizes:
        h_off = w_off = 0
        if rh + h > rw + w:
            w_off = w
        else:
            h_off = h
        h, w = max(h, rh + h_off), max(w, rw + w_off)
        hl, wl = (rh + 1) // 2, (rw + 1) // 2
        ids = torch.zeros(hl, wl, 3)
        ids[..., 0] = 1
        ids[..., 1] = ids[..., 1] + torch.linspace((h_off + 1) // 2, hl - 1 + (h_off + 1) // 2, hl)[:, None]
        ids[..., 2] = ids[..., 2] + torch.linspace((w_off + 1) // 2, wl - 1 + (w_off + 1) // 2, wl)[None, :]
        out.append(ids.reshape(hl * wl, 3))
    return torch.cat(out, 0)


class MultiReference(FluxKontextPipeline):
    """diffusers' Kontext pipeline with more references after the first: their tokens and ComfyUI's ids."""

    more: list[Image.Image] = []

    def prepare_latents(self, image, batch_size, num_channels_latents, height, width, dtype, device, generator,
                        latents=None):
        latents, image_latents, latent_ids, image_ids = super().prepare_latents(
            image, batch_size, num_channels_latents, height, width, dtype, device, generator, latents)
        sizes = [tuple(int(d) // self.vae_scale_factor for d in image.shape[2:])]
        tokens = [image_latents]
        for pic in self.more:
            t = self.image_processor.preprocess(pic, pic.height, pic.width).to(device=device, dtype=dtype)
            z = self._encode_vae_image(image=t, generator=generator)  # argmax: draws nothing from the generator
            z = torch.cat([z] * batch_size, dim=0)
            sizes.append(tuple(z.shape[2:]))
            tokens.append(self._pack_latents(z, batch_size, num_channels_latents, z.shape[2], z.shape[3]))
        return latents, torch.cat(tokens, 1), latent_ids, comfy_offset_ids(sizes).to(device=device, dtype=dtype)


def mask_picture(width: int, height: int, box: tuple[int, int, int, int]) -> np.ndarray:
    """White (repaint) inside ``box`` = (top, left, bottom, right), black elsewhere, with a gray 127/128 edge."""
    m = np.zeros((height, width), np.uint8)
    t, lft, b, r = box
    m[t:b, lft:r] = 255
    m[t, lft:r] = 128  # binarized to 1 (>= 0.5)
    m[b - 1, lft:r] = 127  # binarized to 0
    return m


def inpaint(flux: FluxPipeline) -> None:
    """FluxKontextInpaintPipeline cases: fixtures kontext-inpaint.json / .npz."""
    pics = {"init": picture(64, 48, 4), "init2": picture(48, 64, 5), "ref": picture(32, 48, 2)}
    masks = {"m1": mask_picture(64, 48, (13, 5, 38, 43)), "m2": mask_picture(48, 64, (20, 9, 57, 40))}
    cases = [
        dict(name="inpaint/init as reference/64x48/strength 1", init="init", mask="m1", reference=None,
             strength=1.0, steps=3, seed=31, guidance=2.5, batch=1),
        dict(name="inpaint/reference 32x48/48x64/strength 0.7/batch 2", init="init2", mask="m2", reference="ref",
             strength=0.7, steps=4, seed=32, guidance=3.5, batch=2),
    ]
    data: dict[str, np.ndarray] = {f"picture/{k}": v for k, v in {**pics, **masks}.items()}
    pipe = FluxKontextInpaintPipeline(**flux.components)
    pipe.set_progress_bar_config(disable=True)
    for case in cases:
        case.update(prompt=PROMPT, max_sequence_length=32)
        init = Image.fromarray(pics[case["init"]])
        ref = None if case["reference"] is None else Image.fromarray(pics[case["reference"]])
        with torch.no_grad():
            out = pipe(prompt=case["prompt"], image=init, mask_image=Image.fromarray(masks[case["mask"]]),
                       image_reference=ref, strength=case["strength"], guidance_scale=case["guidance"],
                       num_inference_steps=case["steps"], num_images_per_prompt=case["batch"], _auto_resize=False,
                       max_sequence_length=case["max_sequence_length"],
                       generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np").images
        image = (out * 255).round().astype(np.uint8)
        assert image.shape[1:3] == (init.height, init.width), image.shape
        data[f"{case['name']}/image"] = image
        print(f"  {case['name']}: {image.shape}, std {float(image.std()):.1f}")
    (FOLDER / "kontext-inpaint.json").write_text(json.dumps(cases, indent=1) + "\n")
    np.savez_compressed(FOLDER / "kontext-inpaint.npz", **data)
    print(f"wrote kontext-inpaint.json and .npz ({(FOLDER / 'kontext-inpaint.npz').stat().st_size} bytes)")


def main() -> None:
    # the folder's own tokenizers (gen_flow_refs builds CLIP's vocabulary from open_clip's BPE file, which this
    # venv need not have); the models are drawn as before, and the check below proves they are the same
    gen_flow_refs.write_tokenizer = lambda folder, pad: CLIPTokenizer.from_pretrained(FOLDER / "tokenizer")
    gen_flow_refs.write_t5_tokenizer = lambda folder: T5TokenizerFast.from_pretrained(FOLDER / "tokenizer_2")
    flux = build("flux-dev")
    # the rebuilt torch pipeline is the one the folder was exported from: its first case, bit for bit
    cases = json.loads((FOLDER / "refs.json").read_text())
    old = np.load(FOLDER / "refs.npz")
    c0 = cases[0]
    with torch.no_grad():
        img = flux(c0["prompt"], height=c0["height"], width=c0["width"], num_inference_steps=c0["steps"],
                   guidance_scale=c0["guidance"], generator=torch.Generator("cpu").manual_seed(c0["seed"]),
                   max_sequence_length=c0["max_sequence_length"], output_type="np").images
    got = (img * 255).round().astype(np.uint8)
    assert np.array_equal(got, old[f"{c0['name']}/image"]), "the rebuilt tiny Flux dev is not the exported one"
    assert isinstance(flux, FluxPipeline)
    inpaint(flux)
    if sys.argv[1:] == ["inpaint"]:  # the inpainting fixtures only
        return

    pics = {"a": picture(80, 48, 1), "b": picture(32, 48, 2), "c": picture(70, 45, 3)}
    base = dict(prompt=PROMPT, negative_prompt=None, cfg=1.0, guidance=3.5, batch=1, max_sequence_length=32)
    kontext = [
        dict(base, name="one/80x48/no resize/size from the reference", refs=["a"], resize=False, width=None,
             height=None, steps=3, seed=21, guidance=2.5),
        dict(base, name="one/70x45/auto resize 1456x720/64x64", refs=["c"], resize=True, width=64, height=64,
             steps=2, seed=22),
        dict(base, name="two/80x48+32x48/batch 2/true cfg 4", refs=["a", "b"], resize=False, width=64, height=48,
             steps=2, seed=23, batch=2, cfg=4.0, negative_prompt=NEGATIVE),
    ]
    data: dict[str, np.ndarray] = {f"picture/{k}": v for k, v in pics.items()}
    for case in kontext:
        first = Image.fromarray(pics[case["refs"][0]])
        w, h = case["width"], case["height"]
        if w is None:  # sdrt's default: the (prepared) first reference's size
            w, h = first.width - first.width % 16, first.height - first.height % 16
        pipe = MultiReference(**flux.components)
        pipe.set_progress_bar_config(disable=True)
        pipe.more = [Image.fromarray(pics[k]) for k in case["refs"][1:]]
        ids: list[np.ndarray] = []
        hook = pipe.transformer.register_forward_hook(
            lambda m, a, k, o, ids=ids: ids.append(k["img_ids"].numpy().copy()), with_kwargs=True)
        try:
            with torch.no_grad():
                out = pipe(image=first, prompt=case["prompt"], negative_prompt=case["negative_prompt"],
                           true_cfg_scale=case["cfg"], guidance_scale=case["guidance"], height=h, width=w,
                           max_area=w * h, _auto_resize=case["resize"], num_inference_steps=case["steps"],
                           num_images_per_prompt=case["batch"], max_sequence_length=case["max_sequence_length"],
                           generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np").images
        finally:
            hook.remove()
        image = (out * 255).round().astype(np.uint8)
        assert image.shape[1:3] == (h, w), (image.shape, w, h)
        data[f"{case['name']}/image"] = image
        data[f"{case['name']}/img_ids"] = ids[0]
        case["size"] = [w, h]
        print(f"  {case['name']}: {image.shape}, {ids[0].shape[0]} tokens, std {float(image.std()):.1f}")
    (FOLDER / "kontext.json").write_text(json.dumps(kontext, indent=1) + "\n")
    np.savez_compressed(FOLDER / "kontext.npz", **data)
    print(f"wrote {FOLDER / 'kontext.json'} and kontext.npz ({(FOLDER / 'kontext.npz').stat().st_size} bytes)")


if __name__ == "__main__":
    main()
