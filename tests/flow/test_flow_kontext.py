"""FLUX.1 Kontext (``reference_images``) on the tiny Flux dev against diffusers' ``FluxKontextPipeline``.

References: ``scripts/gen_kontext_refs.py`` (one reference at its own size, one resized to Kontext's preferred
1456x720, two references with batch 2 and true CFG; several references in ComfyUI's offset layout), and
``FluxKontextInpaintPipeline`` for ``init_image`` + ``mask`` + ``reference_images`` (two cases). Tolerance:
2 of 255 in any value, as the other Flux images (tests/flow/test_flow_pipelines.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flow_helpers import register

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines import reference
from sdrt.pipelines.png import format_parameters, read_parameters, write_png

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
FLUX = DATA / "tiny-flux-dev"
CASES = json.loads((FLUX / "kontext.json").read_text())
REFS = np.load(FLUX / "kontext.npz")

_PIPES: dict = {}


def _pipe(backend: str, kind: str = "flux-dev"):
    register(backend)
    key = (kind, backend)
    if key not in _PIPES:
        _PIPES[key] = pipelines.load(DATA / f"tiny-{kind}", backend=backend)
    return _PIPES[key]


def _kwargs(case: dict) -> dict:
    kw = dict(steps=case["steps"], seed=case["seed"], batch=case["batch"], cfg=case["cfg"], guidance=case["guidance"],
              sampler="Euler", max_sequence_length=case["max_sequence_length"],
              reference_images=[REFS[f"picture/{k}"] for k in case["refs"]], reference_resize=case["resize"])
    if case["width"] is not None:
        kw.update(width=case["width"], height=case["height"])
    return kw


#: the 1456x720 reference runs its VAE encoder on 1 MP, which onnx's reference evaluator takes minutes for
PARAMS = [(c["name"], b) for c in CASES for b in ("openvino", "ggml", "reference")
          if not (b == "reference" and c["resize"])]


@pytest.mark.parametrize(("name", "backend"), PARAMS, ids=[f"{n}-{b}" for n, b in PARAMS])
def test_kontext_matches_diffusers(name: str, backend: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    gen = _pipe(backend).generate(case["prompt"], case["negative_prompt"] or "", **_kwargs(case))
    got = np.stack(gen.images).astype(int)
    want = REFS[f"{name}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got - want).max())
    assert diff <= 2, f"{name} on {backend}: max difference {diff}"
    assert gen.settings[0]["Size"] == f"{case['size'][0]}x{case['size'][1]}"


def test_reference_ids_are_diffusers_and_comfyui_layout() -> None:
    """The references' img_ids: index 1, (row, column), the second reference below the first (ComfyUI's offset)."""
    for case in CASES:
        pics = [REFS[f"picture/{k}"] for k in case["refs"]]
        prepared = reference.prepare(pics, case["resize"])
        ids = reference.reference_ids([(p.shape[0] // 8, p.shape[1] // 8) for p in prepared])
        w, h = case["size"]
        want = REFS[f"{case['name']}/img_ids"]
        assert np.array_equal(want[:(w // 16) * (h // 16), 0], np.zeros((w // 16) * (h // 16)))
        np.testing.assert_array_equal(ids, want[(w // 16) * (h // 16):])


def test_preferred_size_is_diffusers_auto_resize() -> None:
    assert reference.preferred_size(70, 45) == (1456, 720)  # aspect of 64x32, as diffusers rounds first
    assert reference.preferred_size(512, 512) == (1024, 1024)
    assert reference.preferred_size(600, 1400) == (672, 1568)
    assert reference.preferred_size(1248, 832) == (1248, 832)
    for w, h in reference.PREFERRED:
        assert reference.preferred_size(w, h) == (w, h)


def test_plan_counts_the_reference_tokens() -> None:
    case = CASES[2]
    rp = _pipe("reference").plan(case["prompt"], case["negative_prompt"], **_kwargs(case))
    tr = next(p for p in rp.parts if p.part == "transformer")
    shapes = {dict((k, s) for k, s, _ in sig)["hidden_states"] for sig, _ in tr.signatures}
    assert shapes == {(2, 12 + 15 + 6, 64)}  # 64x48 noise, 80x48 and 32x48 references
    vae = next(p for p in rp.parts if p.part == "vae_encoder")
    assert vae.calls == 2
    assert "reference images: 2 (80x48, 32x48), 21 tokens beside the image's 12" in rp.format()


def test_infotext_names_the_references(tmp_path: Path) -> None:
    case = CASES[0]
    gen = _pipe("openvino").generate(case["prompt"], **_kwargs(case))
    info = gen.settings[0]
    assert info["Reference images"] == "1 (80x48)" and info["Reference resize"] == "off"
    write_png(tmp_path / "a.png", gen.images[0], format_parameters(gen.prompt, "", info))
    text = read_parameters(tmp_path / "a.png")
    assert "Reference images: 1 (80x48)" in text


def test_img2img_inpaint_and_hires_run_with_references() -> None:
    """init_image (img2img), a mask and the hires fix compose with reference images: the transformer reads the
    references in every pass and the image keeps the init image's (or the hires) size."""
    pipe = _pipe("openvino")
    pic = REFS["picture/a"]
    init = np.ascontiguousarray(np.roll(pic, 8, axis=1))
    mask = np.zeros(pic.shape[:2], np.uint8)
    mask[8:40, 16:64] = 255
    kw = dict(steps=2, seed=3, reference_images=[pic], reference_resize=False, sampler="Euler")
    assert pipe("make it purple", init_image=init, strength=0.6, **kw)[0].shape == (48, 80, 3)
    assert pipe("make it purple", init_image=init, mask=mask, **kw)[0].shape == (48, 80, 3)
    big = pipe("make it purple", hires_scale=2, hires_steps=1, hires_denoise=0.5, **kw)
    assert big[0].shape == (96, 160, 3)
    plain = pipe("make it purple", steps=2, seed=3, width=80, height=48, sampler="Euler")
    assert not np.array_equal(plain[0], pipe("make it purple", **kw)[0])  # the references are read


@pytest.mark.parametrize(("kind", "words"), [("chroma", "Chroma models take none"), ("sd3", "SD3")])
def test_other_families_refuse_references(kind: str, words: str) -> None:
    with pytest.raises(InputError, match=words) as info:
        _pipe("reference", kind)("a cat", reference_images=[REFS["picture/a"]], steps=1)
    assert info.value.where == "reference_images"


def test_reference_errors_name_the_argument(tmp_path: Path) -> None:
    pipe = _pipe("reference")
    with pytest.raises(InputError, match="reference image 1 file does not exist"):
        pipe("a", reference_images=[tmp_path / "missing.png"], steps=1)
    with pytest.raises(InputError, match="must be a list of images") as info:
        pipe("a", reference_images={"a": 1}, steps=1)
    assert info.value.where == "reference_images"
    with pytest.raises(InputError, match="at least 16x16"):
        pipe("a", reference_images=[np.zeros((8, 40, 3), np.uint8)], steps=1)
    with pytest.raises(InputError, match="9 reference images"):
        pipe("a", reference_images=[REFS["picture/a"]] * 9, steps=1)
    with pytest.raises(InputError, match="reference_resize"):
        pipe("a", reference_images=[REFS["picture/a"]], reference_resize="no", steps=1)
    with pytest.raises(InputError, match="reference_images") as info:
        pipe("a", image=REFS["picture/a"], steps=1)  # diffusers' Kontext name: the hint says ours
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    pytest.importorskip("PIL")
    with pytest.raises(InputError, match="cannot read the reference image 1"):
        pipe("a", reference_images=[bad], steps=1)


def test_cli_reference_flags(tmp_path: Path, capsys) -> None:
    """``--reference`` (repeatable) and ``--no-reference-resize``; errors speak in flags."""
    from sdrt.cli import main

    pytest.importorskip("PIL")
    from PIL import Image

    register("reference")
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    Image.fromarray(REFS["picture/a"]).save(a)
    Image.fromarray(REFS["picture/b"]).save(b)
    out = tmp_path / "out.png"
    rc = main(["generate", str(FLUX), "make the sky purple", "--reference", str(a), "--reference", str(b),
               "--no-reference-resize", "--steps", "1", "--seed", "2", "--backend", "reference", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    text = read_parameters(out)
    assert "Size: 80x48" in text and 'Reference images: "2 (80x48, 32x48)"' in text
    assert main(["generate", str(FLUX), "x", "--reference", str(tmp_path / "nope.png"), "-o", str(out)]) == 1
    assert "the reference image 1 file does not exist" in capsys.readouterr().err
    assert main(["generate", str(DATA / "tiny-chroma"), "x", "--reference", str(a), "--backend", "reference",
                 "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Where: --reference." in err and "leave --reference unset (--init-image is img2img" in err


def test_low_memory_gives_the_same_image() -> None:
    """Low-memory mode (each part loaded only while it runs) encodes the references with the VAE encoder before
    the loop and gives the resident pipeline's image."""
    case = CASES[0]
    register("openvino")
    want = _pipe("openvino")(case["prompt"], **_kwargs(case))[0]
    with pipelines.load(FLUX, backend="openvino", low_memory=True) as pipe:
        got = pipe(case["prompt"], **_kwargs(case))[0]
    assert np.array_equal(got, want)


INPAINT = json.loads((FLUX / "kontext-inpaint.json").read_text())
INPAINT_REFS = np.load(FLUX / "kontext-inpaint.npz")
INPAINT_PARAMS = [(c["name"], b) for c in INPAINT for b in ("openvino", "ggml", "reference")]


def _inpaint_kwargs(case: dict) -> dict:
    init = INPAINT_REFS[f"picture/{case['init']}"]
    ref = init if case["reference"] is None else INPAINT_REFS[f"picture/{case['reference']}"]
    return dict(steps=case["steps"], seed=case["seed"], batch=case["batch"], guidance=case["guidance"],
                sampler="Euler", max_sequence_length=case["max_sequence_length"], init_image=init,
                mask=INPAINT_REFS[f"picture/{case['mask']}"], strength=case["strength"],
                reference_images=[ref], reference_resize=False)


@pytest.mark.parametrize(("name", "backend"), INPAINT_PARAMS, ids=[f"{n}-{b}" for n, b in INPAINT_PARAMS])
def test_kontext_inpaint_matches_diffusers(name: str, backend: str) -> None:
    """diffusers' ``FluxKontextInpaintPipeline`` (``_auto_resize=False``): ``image_reference=None`` is sdrt's
    ``reference_images=[init_image]``; the init image is encoded by its latent mean there, drawing no noise."""
    case = next(c for c in INPAINT if c["name"] == name)
    got = np.stack(_pipe(backend)(case["prompt"], **_inpaint_kwargs(case))).astype(int)
    want = INPAINT_REFS[f"{name}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got - want).max())
    assert diff <= 2, f"{name} on {backend}: max difference {diff}"


def test_img2img_with_references_is_consistent() -> None:
    """img2img with references has no diffusers pipeline; it is Kontext inpainting with nothing kept: the same
    image as an all-white mask, and at strength 1 the txt2img image of the same seed (the init image is encoded
    by its mean, so it draws nothing from the seed's stream)."""
    pipe = _pipe("openvino")
    init, ref = INPAINT_REFS["picture/init"], INPAINT_REFS["picture/ref"]
    kw = dict(steps=3, seed=5, guidance=2.5, sampler="Euler", reference_images=[ref], reference_resize=False,
              max_sequence_length=32)
    img2img = pipe("make it purple", init_image=init, strength=0.6, **kw)[0]
    white = np.full(init.shape[:2], 255, np.uint8)
    assert np.array_equal(img2img, pipe("make it purple", init_image=init, mask=white, strength=0.6, **kw)[0])
    full = pipe("make it purple", init_image=init, strength=1.0, **kw)[0]
    assert np.array_equal(full, pipe("make it purple", width=64, height=48, **kw)[0])
    assert not np.array_equal(img2img, full)
