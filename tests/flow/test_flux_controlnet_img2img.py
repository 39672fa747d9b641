"""Flux.1 ControlNets in img2img, inpainting and the hires fix on tiny-flux-dev.

img2img and inpainting against diffusers 0.42.1's ``FluxControlNetImg2ImgPipeline`` and
``FluxControlNetInpaintPipeline`` (a plain Flux.1 dev model): ``tiny-flux-controlnet/img2img.json`` and
``img2img.npz`` (``scripts/gen_flux_controlnet_refs.py img2img``), with the tiny nets of tiny-flux-controlnet
(diffusers' design, a union net) and tiny-flux-xlabs-controlnet (XLabs' design, from its XLabs-named file).
Tolerance: 1 of 255. Strengths below 1 cut the schedule, and the windows are not 0..1, so a window judged over the
whole schedule instead of the steps run, control latents drawn after the init image's, or a control picture or init
image not read shows as tens of levels.

The hires fix has no diffusers reference (diffusers has no hires fix): the test checks that it runs and that the
second pass encodes the control picture again at the target size, before the upscaled image.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flow_helpers import register

from sdrt import pipelines
from sdrt.checkpoint.controlnet import open_controlnet
from sdrt.pipelines.controlnet import ControlNet

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
NETS = DATA / "tiny-flux-controlnet"
BASE = NETS / "flux_dev_transformer.onnx"
FILES = {"canny": NETS / "canny" / "diffusion_pytorch_model.safetensors",
         "union": NETS / "union" / "diffusion_pytorch_model.safetensors",
         "xlabs-canny": DATA / "tiny-flux-xlabs-controlnet" / "xlabs-canny.safetensors"}  # XLabs' own key names
CASES = json.loads((NETS / "img2img.json").read_text())
REFS = np.load(NETS / "img2img.npz")

_PIPES: dict = {}


def _pipe(backend: str):
    register(backend)
    if backend not in _PIPES:
        _PIPES[backend] = pipelines.load(DATA / "tiny-flux-dev", backend=backend)
    return _PIPES[backend]


def _case(name: str) -> dict:
    return next(c for c in CASES if c["name"] == name)


def _kwargs(case: dict, control: np.ndarray | None = None, init: np.ndarray | None = None) -> dict:
    name = case["name"]
    unit = ControlNet(open_controlnet(FILES[case["nets"][0]], graph=BASE),
                      REFS[f"{name}/control_image_0"] if control is None else control, case["scale"][0],
                      case["start"][0], case["end"][0], union_mode=case["union"])
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              sampler="Euler", guidance=case["guidance"], max_sequence_length=case["max_sequence_length"],
              controlnets=[unit], init_image=REFS[f"{name}/init_image"] if init is None else init,
              strength=case["strength"])
    if case["mode"] == "inpaint":
        kw["mask"] = REFS[f"{name}/mask"]
    return kw


def _diff(case: dict, images: list[np.ndarray]) -> int:
    got = np.stack(images).astype(int)
    want = REFS[f"{case['name']}/image"].astype(int)
    assert got.shape == want.shape
    return int(np.abs(got - want).max())


PARAMS = [(c["name"], b) for c in CASES for b in ("reference", "openvino", "ggml")]


@pytest.mark.parametrize(("name", "backend"), PARAMS, ids=[f"{n}-{b}" for n, b in PARAMS])
def test_image_matches_diffusers(name: str, backend: str) -> None:
    case = _case(name)
    gen = _pipe(backend).generate(case["prompt"], **_kwargs(case))
    info = gen.settings[0]
    assert info["Denoising strength"] == case["strength"] and "ControlNet 0" in info
    diff = _diff(case, gen.images)
    assert diff <= 1, f"{name} on {backend}: max difference {diff}"


@pytest.mark.parametrize("name", [CASES[0]["name"], CASES[2]["name"], CASES[3]["name"], CASES[5]["name"]])
def test_control_picture_and_init_image_each_matter(name: str) -> None:
    """A blank control picture, or another init image, moves sdrt's image far past the tolerance: the net reads its
    picture and the run starts from the init image (its known part kept, when inpainting)."""
    case = _case(name)
    pipe = _pipe("reference")
    plain = np.stack(pipe(case["prompt"], **_kwargs(case))).astype(int)
    blank = np.zeros_like(REFS[f"{name}/control_image_0"])
    other = np.ascontiguousarray(REFS[f"{name}/init_image"][::-1, ::-1])
    moved = {what: int(np.abs(np.stack(pipe(case["prompt"], **_kwargs(case, **kw))).astype(int) - plain).max())
             for what, kw in (("control", dict(control=blank)), ("init", dict(init=other)))}
    assert min(moved.values()) > 10, moved

def test_hires_fix_encodes_the_control_again_at_the_second_pass_size() -> None:
    """txt2img at 64x64, then img2img at 96x96: the control picture is made again at 96x96 and VAE-encoded before
    the upscaled image (FluxControlNetImg2ImgPipeline's order), so the net reads 36 control tokens in the second
    pass; the plan lists the same calls."""
    pipe = _pipe("reference")
    edges = REFS[f"{CASES[0]['name']}/control_image_0"]  # 96x64: resized to each pass's size
    unit = ControlNet(open_controlnet(FILES["canny"], graph=BASE), edges, 0.8, 0.0, 0.8)
    kw = dict(steps=3, seed=4, width=64, height=64, sampler="Euler", guidance=3.5, max_sequence_length=32,
              controlnets=[unit], hires_scale=1.5, hires_steps=2, hires_denoise=0.6, hires_upscaler="Lanczos")
    encoded: list[tuple[int, ...]] = []
    fed: list[tuple[int, ...]] = []
    own = pipe._encode_image

    pictures: list[np.ndarray] = []

    def record(image, generator):
        encoded.append(tuple(image.shape))
        pictures.append(np.array(image))
        return own(image, generator)

    pipe._encode_image = record
    try:
        gen = pipe.generate("a cat", batch_count=2, **kw)
        part = pipe.control_parts["controlnet:canny"]
        run = part.run
        part.run = lambda feeds, *a, **k: fed.append(tuple(feeds["controlnet_cond"].shape)) or run(feeds, *a, **k)
        try:
            blank = pipe("a cat", **{**kw, "controlnets": [ControlNet(unit.net, np.zeros_like(edges), 0.8, 0.0, 0.8)]})
        finally:
            del part.run
    finally:
        del pipe._encode_image
    assert [im.shape for im in gen.images] == [(96, 96, 3)] * 2 and "Hires upscale" in gen.settings[0]
    # first pass: the control picture; second pass: the control picture at 96x96, then the upscaled image; the
    # job's second image (batch_count 2) starts again at 64x64
    assert encoded[:6] == [(1, 3, 64, 64), (1, 3, 96, 96), (1, 3, 96, 96)] * 2, encoded
    # which 96x96 picture is which (the shapes alone do not tell the order): the control map made at 96x96 first
    from sdrt.pipelines.fluxtools import control_image
    from sdrt.pipelines.images import to_nchw

    at_96 = to_nchw(control_image(unit, 96, 96))
    assert np.array_equal(pictures[1], at_96) and np.array_equal(pictures[4], at_96)
    assert not np.array_equal(pictures[2], at_96)  # then the upscaled image
    # the window 0-0.8 over each pass's steps run: steps 0 and 1 of 3, then step 0 of the 2 the second pass runs
    assert fed == [(1, 16, 64)] * 2 + [(1, 36, 64)], fed
    assert int(np.abs(blank[0].astype(int) - gen.images[0].astype(int)).max()) > 10
    plan = pipe.plan("a cat", **kw)
    conds = [dict((n, tuple(s)) for n, s, _ in sig)["controlnet_cond"] for sig, _ in plan.part("controlnet:canny").signatures]
    assert set(conds) == {(1, 16, 64), (1, 36, 64)}, conds



def test_flux_hires_second_pass_continues_the_first() -> None:
    """The hires fix's second pass on Flux (Euler, the diffusers-form flow loop) runs the last ``hires_steps`` of its
    schedule from the upscaled first pass, as A1111's steps rule says: 3 + 2 steps, and a different first pass gives
    a different image (the loop once ran the whole schedule from pure noise, the first pass unread)."""
    pipe = _pipe("reference")
    kw = dict(seed=4, width=64, height=64, sampler="Euler", guidance=3.5, max_sequence_length=32, hires_scale=1.5,
              hires_steps=2, hires_denoise=0.6)
    calls: list[tuple[int, int]] = []
    a = pipe.generate("a cat", steps=3, callback=lambda i, n, x: calls.append((i, n)), **kw).images[0]
    assert calls == [(i, 5) for i in range(1, 6)], calls
    b = pipe("a cat", steps=2, **kw)[0]
    assert int(np.abs(a.astype(int) - b.astype(int)).max()) > 10


def test_flux_hires_second_pass_runs_the_tail_of_the_target_size_schedule() -> None:
    """The second pass's timesteps: the last 2 of a 3-step schedule (A1111's steps rule: int(2 / 0.6) = 3) made at
    the target size, 96x96 (Flux's resolution-dependent shift, mu from 36 image tokens, not the first pass's 16).
    Reference: diffusers 0.42.1's ``FlowMatchEulerDiscreteScheduler`` on tiny-flux-dev's scheduler config,
    ``set_timesteps(sigmas=linspace(1, 1/3, 3), mu=calculate_shift(...))`` as ``FluxPipeline`` calls it, / 1000."""
    pipe = _pipe("reference")
    first_64 = [1.0, 0.7599713134765625, 0.4418216552734375]  # diffusers at 64x64 (16 tokens)
    at_96 = [1.0, 0.7605883178710937, 0.4426567077636719]  # diffusers at 96x96 (36 tokens)
    seen: list[float] = []
    part = pipe.parts["transformer"]
    run = part.run
    part.run = lambda feeds, *a, **k: seen.append(float(np.asarray(feeds["timestep"]).reshape(-1)[0])) or \
        run(feeds, *a, **k)
    try:
        pipe("a cat", seed=4, width=64, height=64, steps=3, sampler="Euler", guidance=3.5, max_sequence_length=32,
             hires_scale=1.5, hires_steps=2, hires_denoise=0.6, hires_upscaler="Latent")
    finally:
        del part.run
    np.testing.assert_allclose(seen, first_64 + at_96[1:], rtol=0, atol=2e-6)


# ------------------------------------------------------------------ sd-webui-controlnet's map: only masked, hires
FIDELITY = np.load(Path(__file__).resolve().parents[1] / "data" / "control" / "cn_fidelity_refs.npz")


def _picture(encoded: np.ndarray) -> np.ndarray:
    """The HxWx3 uint8 picture a VAE input (1x3xHxW in [-1, 1], ``to_nchw``) was made from."""
    return np.round((encoded[0].transpose(1, 2, 0) + 1) * np.float32(127.5)).astype(np.uint8)


def test_only_masked_cuts_a_flux_units_image_as_the_extension() -> None:
    """A Flux ControlNet unit in an only-masked run: its image is cut to the area repainted before its preprocessor,
    as SD units' are (sd-webui-controlnet's crop; scripts/gen_cn_fidelity_refs.py), and the net reads it: the run
    equals the one fed the extension's map of the cut-out as it is, and differs from the uncut one's."""
    pipe = _pipe("reference")
    net = open_controlnet(FILES["canny"], graph=BASE)
    mode = "Crop and Resize"

    def unit(image, pre="canny", **kw):
        low, high = (50, 150) if pre == "canny" else (None, None)
        return ControlNet(net, image, 0.8, 0.0, 1.0, pre, mode, low, high, pixel_perfect=True, **kw)

    kw = dict(steps=2, seed=4, sampler="Euler", guidance=3.5, max_sequence_length=32, init_image=FIDELITY["picture"],
              mask=FIDELITY["mask"], inpaint_area="only masked", inpaint_padding=8, width=64, height=64)
    s, _, _ = pipe._prepare("a cat", "", dict(controlnets=[unit(FIDELITY["control"])], **kw))
    assert np.array_equal(s.toolbox.controlnets[0].control, FIDELITY[f"crop/{mode}/map"])
    got = pipe("a cat", controlnets=[unit(FIDELITY["control"])], **kw)[0]
    want = pipe("a cat", controlnets=[unit(FIDELITY[f"crop/{mode}/map"], "none", inpaint_crop=False)], **kw)[0]
    whole = pipe("a cat", controlnets=[unit(FIDELITY["control"], inpaint_crop=False)], **kw)[0]
    assert got.shape == (80, 96, 3) and np.array_equal(got, want)
    assert int(np.abs(whole.astype(int) - got).max()) > 10


def test_hires_fix_resizes_the_first_pass_map() -> None:
    """A pixel-perfect blur_gaussian unit through a hires run (64x64, then 96x96): the first pass encodes the map
    made at 64; the second pass encodes that map resized to 96x96 (the extension's detectmap_proc at the hires size,
    OpenCV's cubic: one level off on a few pixels), not a map made again at 96."""
    pipe = _pipe("reference")
    mode = "Crop and Resize"
    unit = ControlNet(open_controlnet(FILES["canny"], graph=BASE), FIDELITY["hires_image"], 0.8, 0.0, 1.0,
                      "blur_gaussian", mode, 3.0, pixel_perfect=True)
    pictures: list[np.ndarray] = []
    own = pipe._encode_image
    pipe._encode_image = lambda image, generator: pictures.append(np.array(image)) or own(image, generator)
    try:
        gen = pipe.generate("a cat", steps=2, seed=4, width=64, height=64, sampler="Euler", guidance=3.5,
                            max_sequence_length=32, controlnets=[unit], hires_scale=1.5, hires_steps=1,
                            hires_denoise=0.6, hires_upscaler="Lanczos")
    finally:
        del pipe._encode_image
    pictures = pictures[-3:]  # the run's (the memory plan's dry run encodes first)
    assert [p.shape for p in pictures] == [(1, 3, 64, 64), (1, 3, 96, 96), (1, 3, 96, 96)]  # control, control, image
    assert np.array_equal(_picture(pictures[0]), FIDELITY[f"hires/{mode}/64x64"])
    d = np.abs(_picture(pictures[1]).astype(int) - FIDELITY[f"hires/{mode}/96x96"])
    assert d.max() <= 1 and (d > 0).mean() <= 0.005, (int(d.max()), float((d > 0).mean()))
    assert "Processor Res: 64" in gen.settings[0]["ControlNet 0"]


@pytest.mark.parametrize("option", ["Low res only", "High res only"])
def test_hr_option_leaves_a_flux_unit_out_of_the_other_pass(option: str) -> None:
    """A Flux canny unit (pixel perfect) in a hires run, 64x64 then 96x96, with hr_option: the run equals the two
    passes composed from the API, the unit only on its pass (sd-webui-controlnet's disabled_by_hr_option): a txt2img
    run with or without it, then img2img of its image resized with Lanczos (the last 2 of int(2 / 0.6) = 3 steps),
    with the extension's map for the second pass (the first pass's canny map through detectmap_proc at 96x96,
    scripts/gen_cn_fidelity_refs.py) fed as it is, or without the unit. A unit left out of a pass is not encoded
    there either (its latents would draw from the pass's generator)."""
    pil = pytest.importorskip("PIL.Image")
    pipe = _pipe("reference")
    net = open_controlnet(FILES["canny"], graph=BASE)
    mode = "Crop and Resize"
    kw = dict(seed=4, sampler="Euler", guidance=3.5, max_sequence_length=32)
    unit = ControlNet(net, FIDELITY["hires_image"], 0.8, 0.0, 1.0, "canny", mode, 50, 150, pixel_perfect=True,
                      hr_option=option)
    got = pipe("a cat", controlnets=[unit], steps=2, width=64, height=64, hires_scale=1.5, hires_steps=2,
               hires_denoise=0.6, hires_upscaler="Lanczos", **kw)[0]
    first_units = [ControlNet(net, FIDELITY["hires_image"], 0.8, 0.0, 1.0, "canny", mode, 50, 150,
                              pixel_perfect=True)] if option == "Low res only" else []
    first = pipe("a cat", controlnets=first_units, steps=2, width=64, height=64, **kw)[0]
    big = np.asarray(pil.fromarray(first).resize((96, 96), pil.Resampling.LANCZOS))
    second_units = [ControlNet(net, FIDELITY[f"hires_canny/{mode}/96x96"], 0.8, 0.0, 1.0, resize=mode)] \
        if option == "High res only" else []
    want = pipe("a cat", init_image=big, controlnets=second_units, steps=3, strength=2 / 3, width=96, height=96,
                **kw)[0]
    assert got.shape == (96, 96, 3) and np.array_equal(got, want)
