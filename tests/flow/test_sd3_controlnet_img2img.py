"""SD3 ControlNets in img2img, inpainting and the hires fix on tiny-sd3.

img2img and inpainting (a plain SD3 model) against ``tiny-sd3-controlnet/img2img.json`` and ``img2img.npz``
(``scripts/gen_sd3_controlnet_refs.py img2img``): diffusers 0.42.1 has no SD3 ControlNet img2img or plain-net
inpaint pipeline, so the reference is its ``StableDiffusion3Img2ImgPipeline`` / ``StableDiffusion3InpaintPipeline``
with ``StableDiffusion3ControlNetPipeline``'s ControlNet step on every transformer call (the script says how), with
the tiny nets of tiny-sd3-controlnet (text-stream nets with zero and with the prompt's pooled projections, two nets
summed, Stability's image-only design). Tolerance: 1 of 255. Strengths below 1 cut the schedule and the windows
are not 0..1, so a window judged over the whole schedule instead of the steps run, control latents drawn after the
init image's, or a control picture or init image not read shows as tens of levels.

The hires fix has no diffusers reference (diffusers has no hires fix): the test checks that it runs and that the
second pass encodes the control picture again at the target size, before the upscaled image. The command line
(``--init-image``, ``--mask``, ``--hires-scale`` with ``--controlnet``) gives the Python API's pictures.
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
NETS = DATA / "tiny-sd3-controlnet"
#: the tiny weight-free graphs the nets are cut from: SD3.5 Medium's design, and Large's for the image-only net
BASES = {"blur": NETS / "sd35_large_transformer.onnx"}
BASE = NETS / "sd35_medium_transformer.onnx"
CASES = json.loads((NETS / "img2img.json").read_text())
REFS = np.load(NETS / "img2img.npz")

_PIPES: dict = {}


def _pipe(backend: str):
    register(backend)
    if backend not in _PIPES:
        _PIPES[backend] = pipelines.load(DATA / "tiny-sd3", backend=backend)
    return _PIPES[backend]


def _net(name: str):
    return open_controlnet(NETS / name / "diffusion_pytorch_model.safetensors", graph=BASES.get(name, BASE))


def _case(name: str) -> dict:
    return next(c for c in CASES if c["name"] == name)


def _kwargs(case: dict, control: np.ndarray | None = None, init: np.ndarray | None = None) -> dict:
    name = case["name"]
    units = [ControlNet(_net(n), REFS[f"{name}/control_image_{k}"] if control is None or k else control,
                        case["scale"][k], case["start"][k], case["end"][k]) for k, n in enumerate(case["nets"])]
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              sampler="Euler", cfg=case["cfg"], max_sequence_length=case["max_sequence_length"], controlnets=units,
              init_image=REFS[f"{name}/init_image"] if init is None else init, strength=case["strength"])
    if case["negative_prompt"]:
        kw["negative_prompt"] = case["negative_prompt"]
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


@pytest.mark.parametrize("name", [CASES[0]["name"], CASES[6]["name"]])
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
    """txt2img at 64x64 with CFG, then img2img at 96x96: the control picture is made again at 96x96 and VAE-encoded
    for both CFG halves before the upscaled image is, so the net reads 96x96's control latents in the second pass;
    a job of two images starts each first pass at 64x64 again; the plan lists the same calls."""
    pipe = _pipe("reference")
    edges = REFS[f"{CASES[0]['name']}/control_image_0"]  # 96x64: resized to each pass's size
    unit = ControlNet(_net("canny"), edges, 0.8, 0.0, 0.8)
    kw = dict(steps=3, seed=4, width=64, height=64, sampler="Euler", cfg=4.0, max_sequence_length=32,
              controlnets=[unit], hires_scale=1.5, hires_steps=2, hires_denoise=0.6, hires_upscaler="Lanczos")
    encoded: list[tuple[int, ...]] = []
    pictures: list[np.ndarray] = []
    fed: list[tuple[int, ...]] = []
    own = pipe._encode_image

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
    # first pass: the control picture for both CFG rows; second pass: the control picture at 96x96, then the
    # upscaled image; the job's second image (batch_count 2) starts again at 64x64
    assert encoded[:6] == [(2, 3, 64, 64), (2, 3, 96, 96), (1, 3, 96, 96)] * 2, encoded
    from sdrt.pipelines.fluxtools import control_image
    from sdrt.pipelines.images import to_nchw

    at_96 = to_nchw(control_image(unit, 96, 96))
    assert np.array_equal(pictures[1][:1], at_96) and np.array_equal(pictures[4][:1], at_96)
    assert not np.array_equal(pictures[2], at_96)  # then the upscaled image
    # the window 0-0.8 over each pass's steps run: steps 0 and 1 of 3, then step 0 of the 2 the second pass runs
    assert fed == [(2, 16, 8, 8)] * 2 + [(2, 16, 12, 12)], fed
    assert int(np.abs(blank[0].astype(int) - gen.images[0].astype(int)).max()) > 10
    plan = pipe.plan("a cat", **kw)
    conds = [dict((n, tuple(s)) for n, s, _ in sig)["controlnet_cond"]
             for sig, _ in plan.part("controlnet:canny").signatures]
    assert set(conds) == {(2, 16, 8, 8), (2, 16, 12, 12)}, conds


@pytest.fixture
def tiny_lookup(monkeypatch):
    """sdrt's lookup of the shipped graph a net binds onto, given the tiny weight-free one (the tiny nets are 32
    wide; the shipped graphs are full size): sdrt's own function, not a vendor library."""
    from sdrt.checkpoint import graphs
    from sdrt.checkpoint import sd3controlnet as scn

    shipped = graphs.shipped_graph
    monkeypatch.setattr(scn, "base_of", lambda lay, shapes: "sd35_medium_transformer")
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: BASE if name == "sd35_medium_transformer"
                        else shipped(name))


@pytest.mark.parametrize("mode", ["img2img", "inpaint", "hires"])
def test_cli_runs_an_sd3_controlnet_with_init_image_mask_and_hires(tmp_path, capsys, tiny_lookup, mode) -> None:
    """``sdrt generate --init-image [--mask] --controlnet --control-image`` and ``--hires-scale`` with an SD3
    ControlNet: the picture the Python API makes with the same unit (checked against diffusers above)."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")
    case = CASES[0] if mode != "inpaint" else CASES[4]
    name = case["name"]
    files = {}
    for what in ("init_image", "control_image_0", "mask"):
        if f"{name}/{what}" in REFS.files:
            files[what] = tmp_path / f"{what}.png"
            Image.fromarray(REFS[f"{name}/{what}"]).save(files[what])
    out = tmp_path / "out.png"
    args = ["generate", str(DATA / "tiny-sd3"), case["prompt"], "--controlnet", str(NETS / "canny"),
            "--control-image", str(files["control_image_0"]), "--control-scale", str(case["scale"][0]),
            "--control-start", str(case["start"][0]), "--control-end", str(case["end"][0]),
            "--steps", str(case["steps"]), "--seed", str(case["seed"]), "--cfg", str(case["cfg"]),
            "--sampler", "Euler", "--max-sequence-length", str(case["max_sequence_length"]),
            "--negative", case["negative_prompt"] or "", "--backend", "reference", "-o", str(out)]
    kw = dict(steps=case["steps"], seed=case["seed"], cfg=case["cfg"], sampler="Euler",
              max_sequence_length=case["max_sequence_length"], negative_prompt=case["negative_prompt"] or "")
    unit = ControlNet(_net("canny"), REFS[f"{name}/control_image_0"], case["scale"][0], case["start"][0],
                      case["end"][0])
    if mode == "hires":
        args += ["--width", "64", "--height", "64", "--hires-scale", "1.5", "--hires-steps", "2"]
        kw.update(width=64, height=64, hires_scale=1.5, hires_steps=2)
    else:
        args += ["--init-image", str(files["init_image"]), "--strength", str(case["strength"])]
        kw.update(init_image=REFS[f"{name}/init_image"], strength=case["strength"], width=case["width"],
                  height=case["height"])
        if mode == "inpaint":
            args += ["--mask", str(files["mask"])]
            kw["mask"] = np.asarray(Image.open(files["mask"]))
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 0, err
    got = np.asarray(Image.open(out).convert("RGB")).astype(int)
    want = _pipe("reference")(case["prompt"], controlnets=[unit], **kw)[0].astype(int)
    assert int(np.abs(got - want).max()) == 0
    if mode != "hires":  # the same picture as diffusers' (the PNG's control picture and init image are the case's)
        assert _diff(case, [got.astype(np.uint8)]) <= 1


def test_only_masked_cuts_an_sd3_units_image_and_refuses_an_inpainting_net() -> None:
    """An SD3 ControlNet unit in an only-masked run: its image is cut to the area repainted before its preprocessor,
    as sd-webui-controlnet cuts SD units' (the map equals scripts/gen_cn_fidelity_refs.py's), and the run pastes
    back; alimama's inpainting net, which reads its own picture and mask, is refused with an init image, naming it."""
    from sdrt.errors import InputError

    fidelity = np.load(Path(__file__).resolve().parents[1] / "data" / "control" / "cn_fidelity_refs.npz")
    pipe = _pipe("reference")
    mode = "Crop and Resize"
    kw = dict(steps=2, seed=4, sampler="Euler", max_sequence_length=32, init_image=fidelity["picture"],
              mask=fidelity["mask"], inpaint_area="only masked", inpaint_padding=8, width=64, height=64)
    unit = ControlNet(_net("canny"), fidelity["control"], 0.8, 0.0, 1.0, "canny", mode, 50, 150, pixel_perfect=True)
    s, _, _ = pipe._prepare("a cat", "", dict(controlnets=[unit], **kw))
    assert np.array_equal(s.toolbox.controlnets[0].control, fidelity[f"crop/{mode}/map"])
    gen = pipe.generate("a cat", controlnets=[unit], **kw)
    assert gen.images[0].shape == (80, 96, 3) and gen.settings[0]["Inpaint area"] == "Only masked"
    inpainting = ControlNet(_net("inpaint"), fidelity["control"], control_mask=fidelity["mask"])
    with pytest.raises(InputError, match="an init image with one is not supported") as err:
        pipe.generate("a cat", controlnets=[inpainting], **kw)
    assert err.value.where == "init_image"
