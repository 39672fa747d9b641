"""The toolbox through the pipeline: ControlNet (against diffusers), hires fix, live previews, A1111's seeds.

ControlNet images are compared with ``StableDiffusionControlNetPipeline`` / ``StableDiffusionXLControlNetPipeline``
(``scripts/gen_controlnet_refs.py``) on every installed backend: within 2 uint8 levels (measured: 1).
The latent upscalers are compared with ``torch.nn.functional.interpolate`` (``scripts/gen_hires_refs.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend, register

from sdrt import pipelines
from sdrt.errors import InputError, ModelError, SamplerError
from sdrt.pipelines import controlmaps
from sdrt.pipelines.controlnet import ControlNet
from sdrt.pipelines.hires import interpolate, parse
from sdrt.pipelines.preview import project
from sdrt.samplers.philox import randn_cuda, randn_nv

TOOLBOX = Path(__file__).resolve().parents[1] / "data" / "toolbox"
PREVIEW = Path(__file__).resolve().parents[1] / "data" / "preview"
CN_FOLDERS = ["tiny-sd15-controlnet", "tiny-sdxl-controlnet"]
BACKENDS = ["reference", "openvino", "ggml"]
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"


def _cases(folder: str) -> list[dict]:
    return json.loads((DATA / folder / "refs.json").read_text())


def _units(case: dict, z) -> list[tuple]:
    return [(n, z[img], sc, st, en) for n, img, sc, st, en in
            zip(case["controlnets"], case["control_images"], case["scale"], case["start"], case["end"])]


def _run_case(pipe, case: dict, z, **extra) -> np.ndarray:
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
              height=case["height"], controlnets=_units(case, z))
    kw.update(extra)
    return pipe.generate(case["prompt"], case["negative_prompt"], **kw).images[0]


# ------------------------------------------------------------------ ControlNet against diffusers
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("folder", CN_FOLDERS)
def test_controlnet_images_equal_diffusers(folder: str, backend: str) -> None:
    register(backend)
    z = np.load(DATA / folder / "refs.npz")
    worst = {}
    with pipelines.load(DATA / folder, backend=backend) as pipe:
        for case in _cases(folder):
            image = _run_case(pipe, case, z)
            d = np.abs(image.astype(int) - z[case["name"]][0].astype(int))
            worst[case["name"]] = (int(d.max()), float((d > 0).mean()))
    assert all(m <= 2 for m, _ in worst.values()), worst
    assert all(share < 0.005 for _, share in worst.values()), worst


def test_controlnet_window_and_scale_have_teeth() -> None:
    """The window ignored, or the scale ignored, is far from diffusers' image: the test above can fail."""
    backend = fast_backend()
    folder = "tiny-sd15-controlnet"
    z = np.load(DATA / folder / "refs.npz")
    cases = {c["name"]: c for c in _cases(folder)}
    with pipelines.load(DATA / folder, backend=backend) as pipe:
        window = dict(cases["controlnet/window 0.25-0.75"], start=[0.0], end=[1.0])
        off = np.abs(_run_case(pipe, window, z).astype(int) - z["controlnet/window 0.25-0.75"][0]).max()
        half = dict(cases["controlnet/scale 0.5"], scale=[1.0])
        off_scale = np.abs(_run_case(pipe, half, z).astype(int) - z["controlnet/scale 0.5"][0]).max()
    assert off > 20 and off_scale > 20, (off, off_scale)


# ------------------------------------------------------------------ control modes and guess mode
def _mode_cases(folder: str) -> list[dict]:
    return json.loads((DATA / folder / "modes.json").read_text())


def _mode_units(case: dict, z) -> list[ControlNet]:
    return [ControlNet(n, z[img], sc, st, en, control_mode=m) for n, img, sc, st, en, m in
            zip(case["controlnets"], case["control_images"], case["scale"], case["start"], case["end"],
                case["control_mode"])]


def _run_mode_case(pipe, case: dict, z, **extra) -> np.ndarray:
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
              height=case["height"], controlnets=_mode_units(case, z), guess_mode=case["guess_mode"])
    kw.update(extra)
    return pipe.generate(case["prompt"], case["negative_prompt"], **kw).images[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("folder", CN_FOLDERS)
def test_controlnet_modes_equal_their_references(folder: str, backend: str) -> None:
    """diffusers' guess_mode=True (its pipeline) and sd-webui-controlnet's control modes (its formulas around
    diffusers' UNet and ControlNetModel, scripts/gen_controlnet_mode_refs.py), one and two units."""
    register(backend)
    z = np.load(DATA / folder / "modes.npz")
    images = np.load(DATA / folder / "refs.npz")
    worst = {}
    with pipelines.load(DATA / folder, backend=backend) as pipe:
        for case in _mode_cases(folder):
            d = np.abs(_run_mode_case(pipe, case, images).astype(int) - z[case["name"]][0].astype(int))
            worst[case["name"]] = (int(d.max()), float((d > 0).mean()))
    assert all(m <= 2 for m, _ in worst.values()), worst
    assert all(share < 0.005 for _, share in worst.values()), worst


def test_controlnet_modes_have_teeth() -> None:
    """Another mode, or no cfg injection, is far from each reference: the test above can fail."""
    folder = "tiny-sd15-controlnet"
    z = np.load(DATA / folder / "modes.npz")
    images = np.load(DATA / folder / "refs.npz")
    cases = {c["name"]: c for c in _mode_cases(folder)}
    with pipelines.load(DATA / folder, backend=fast_backend()) as pipe:
        control = cases["ControlNet is more important"]
        prompt = _run_mode_case(pipe, dict(control, control_mode=["My prompt is more important"]), images)
        guess = _run_mode_case(pipe, dict(control, control_mode=["Balanced"], guess_mode=True), images)
        two = cases["two units/Balanced + ControlNet is more important"]
        both_balanced = _run_mode_case(pipe, dict(two, control_mode=["Balanced", "Balanced"]), images)
    off = {"no cfg injection": np.abs(prompt.astype(int) - z[control["name"]][0]).max(),
           "guess mode's scales": np.abs(guess.astype(int) - z[control["name"]][0]).max(),
           "second unit Balanced": np.abs(both_balanced.astype(int) - z[two["name"]][0]).max()}
    assert all(v > 10 for v in off.values()), off


def test_step_windows_are_diffusers_and_the_extensions() -> None:
    """diffusers' controlnet_keep (off when i/n < start or (i+1)/n > end) and sd-webui-controlnet's
    guidance_schedule_handler (off when i/n < start or i/n > end), both written out on 20 steps."""
    from sdrt.errors import InputError
    from sdrt.pipelines.controlnet import active, parse_units

    for start, end in ((0.0, 1.0), (0.1, 0.8), (0.25, 0.5), (0.0, 0.33), (0.5, 0.5)):
        unit = ControlNet("controlnet", np.zeros((8, 8, 3), np.uint8), 1.0, start, end)
        got = [i for i in range(20) if active(unit, i, 20)]
        assert got == [i for i in range(20) if not (i / 20 < start or (i + 1) / 20 > end)]
        unit.window = "a1111"
        got = [i for i in range(20) if active(unit, i, 20)]
        assert got == [i for i in range(20) if start <= i / 20 <= end]
    unit = ControlNet("controlnet", np.zeros((8, 8, 3), np.uint8), 1.0, 0.0, 0.5, window="A1111")
    with pytest.raises(InputError, match=r"controlnets\[0\] window 'A1111' is not a step window rule"):
        parse_units([unit])


def test_residual_scales_are_the_extensions_and_diffusers() -> None:
    from sdrt.pipelines.controlnet import residual_scales

    unit = ControlNet("controlnet", np.zeros((8, 8, 3), np.uint8), 0.8)
    assert residual_scales(unit, 13) is None  # Balanced: the plain scale, through conditioning_scale
    assert residual_scales(unit, 13, hires=True) is None
    unit.preprocessor = "canny"  # the extension soft-injects canny (and mlsd) in the hires pass
    assert residual_scales(unit, 13) is None
    assert np.allclose(residual_scales(unit, 13, hires=True), [0.8 * 0.825 ** (12 - i) for i in range(13)])
    unit.preprocessor, unit.control_mode = "none", "My prompt is more important"
    sd1 = residual_scales(unit, 13)
    assert np.isclose(sd1[-1], 0.8) and np.isclose(sd1[0], 0.8 * 0.825 ** 12)
    sdxl = residual_scales(unit, 10)  # the extension's list cut to 10: the mid block at 0.825 ** 3
    assert np.allclose(sdxl, sd1[:10]) and np.isclose(sdxl[-1], 0.8 * 0.825 ** 3)
    unit.control_mode, unit.guess_mode = "Balanced", True
    assert np.allclose(residual_scales(unit, 13), 0.8 * np.logspace(-1, 0, 13))
    assert np.allclose(residual_scales(unit, 10), 0.8 * np.logspace(-1, 0, 10))


def test_cond_only_units_run_their_net_on_the_cond_half() -> None:
    """Cfg injection and guess mode: the net's calls take the cond rows only (one image: 1 row, not 2)."""
    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        plan = pipe.plan(PROMPT, "blurry", steps=4, sampler="Euler", seed=1, controlnets=[
            ("controlnet", z["edges"], 1.0, 0.0, 1.0, "ControlNet is more important"),
            ("controlnet_2", z["scribble"], 0.5, 0.0, 1.0, 1)])
        guess = pipe.plan(PROMPT, "blurry", steps=4, sampler="Euler", seed=1, guess_mode=True,
                          controlnets=[("controlnet", z["edges"])])
        no_cfg = pipe.plan(PROMPT, steps=4, sampler="Euler", seed=1, cfg=1,
                           controlnets=[("controlnet", z["edges"], 1.0, 0.0, 1.0, 2)])
    rows = lambda p, name: {dict((k, s) for k, s, _ in sig)["sample"][0]  # noqa: E731
                            for sig, _ in p.part(name).signatures}
    assert rows(plan, "controlnet") == {1} and rows(plan, "controlnet_2") == {2} and rows(plan, "unet") == {2}
    assert rows(guess, "controlnet") == {1} and rows(no_cfg, "controlnet") == {1}
    text = plan.format()
    assert "controlnet 0: controlnet, scale 1, steps 0-1, preprocessor none, mode ControlNet is more important" in text
    assert "mode My prompt is more important" in text and "guess mode" in guess.format()


def test_cond_only_units_in_a_batch_of_two() -> None:
    """Rows [uncond x2, cond x2]: the cond half is each image's own (diffusers' one noise stream for the batch: the
    first image is the one-image reference)."""
    folder = "tiny-sd15-controlnet"
    z = np.load(DATA / folder / "modes.npz")
    case = next(c for c in _mode_cases(folder) if c["name"] == "two units/Balanced + ControlNet is more important")
    with pipelines.load(DATA / folder, backend=fast_backend()) as pipe:
        images = pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                               sampler=case["sampler"], seed=case["seed"], width=64, height=64, batch=2,
                               controlnets=_mode_units(case, np.load(DATA / folder / "refs.npz"))).images
    assert np.abs(images[0].astype(int) - z[case["name"]][0]).max() <= 2
    assert np.abs(images[1].astype(int) - images[0]).max() > 20


def test_controlnet_mode_infotext_and_bad_input() -> None:
    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        gen = pipe.generate(PROMPT, steps=1, sampler="Euler", seed=1, controlnets=[
            ("controlnet", z["edges"], 1.0, 0.0, 1.0, "my prompt is more important"),
            ControlNet("controlnet_2", z["scribble"], guess_mode=True)])
        for kw, words in (
                (dict(controlnets=[("controlnet", z["edges"], 1.0, 0.0, 1.0, "Loud")]),
                 "controlnets\\[0\\] control_mode 'Loud' is not a ControlNet control mode"),
                (dict(controlnets=[("controlnet", z["edges"], 1.0, 0.0, 1.0, 3)]), "control_mode 3 is not"),
                (dict(controlnets=[ControlNet("controlnet", z["edges"], control_mode=2, guess_mode=True)]),
                 "guess mode and the control mode 'ControlNet is more important'"),
                (dict(controlnets=[("controlnet", z["edges"], 1.0, 0.0, 1.0, 1)], guess_mode=True),
                 "guess_mode and controlnets\\[0\\]'s control mode"),
                (dict(guess_mode=True), "guess_mode without a ControlNet"),
                (dict(controlnets=[("controlnet", z["edges"])], guess_mode="yes"), "guess_mode must be True or False"),
                # a union Flux net's mode on an SD ControlNet: it ran and the mode was dropped without a word
                (dict(controlnets=[ControlNet("controlnet", z["edges"], union_mode=2)]),
                 "controlnets\\[0\\] has a union_mode: an SD ControlNet has no union modes")):
            with pytest.raises(InputError, match=words) as err:
                pipe.generate(PROMPT, steps=1, sampler="Euler", seed=1, **kw)
            assert "\n" not in str(err.value)
    info = gen.settings[0]
    assert info["ControlNet 0"].endswith("Pixel Perfect: False, Control Mode: My prompt is more important")
    assert info["ControlNet 1"].endswith("Control Mode: ControlNet is more important, Guess Mode: True")


def test_controlnet_plan_lists_the_nets_and_their_calls() -> None:
    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        one = pipe.plan(PROMPT, "blurry", steps=8, sampler="Euler", seed=1,
                        controlnets=[("controlnet", z["edges"], 1.0, 0.25, 0.75)])
        two = pipe.plan(PROMPT, "blurry", steps=8, sampler="Euler", seed=1,
                        controlnets=[("controlnet", z["edges"], 1.0, 0.25, 0.75), ("controlnet_2", z["scribble"], 0.5)])
    net = one.part("controlnet")
    assert net is not None and net.role == "controlnet" and net.calls == 8  # off steps run at scale 0, as diffusers
    assert one.per_image("controlnet") == 16
    sig = dict((k, (s, d)) for k, s, d in net.signatures[0][0])
    assert sig["controlnet_cond"] == ((2, 3, 64, 64), "float32") and sig["conditioning_scale"] == ((), "float32")
    unet = dict((k, s) for k, s, _ in one.part("unet").signatures[0][0])
    assert unet["mid_block_additional_residual"] == (2, 16, 4, 4)
    # with a second net always on, the first runs only inside its window: steps 2..5 of 8
    assert two.part("controlnet").calls == 4 and two.part("controlnet_2").calls == 8
    text = two.format()
    assert "controlnet 0: controlnet, scale 1, steps 0.25-0.75" in text and "controlnet_2 (controlnet): 8 call(s)" in text


def test_controlnet_infotext_as_the_extension_writes_it() -> None:
    from sdrt.pipelines.png import format_parameters

    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        gen = pipe.generate(PROMPT, steps=2, sampler="Euler", seed=1, controlnets=[
            ControlNet("controlnet", z["edges"], 0.8, 0.1, 0.9, preprocessor="canny", low=50, high=150)])
    info = gen.settings[0]
    assert info["ControlNet 0"] == ("Module: canny, Model: controlnet, Weight: 0.8, Resize Mode: Crop and Resize, "
                                    "Processor Res: 64, Threshold A: 50, Threshold B: 150, Guidance Start: 0.1, "
                                    "Guidance End: 0.9, Pixel Perfect: False, Control Mode: Balanced")
    assert 'ControlNet 0: "Module: canny, Model: controlnet, Weight: 0.8,' in format_parameters(PROMPT, "", info)


def test_preprocessor_and_resize_run_before_the_net() -> None:
    """canny in the pipeline equals canny done by hand; a larger image is resized to the output first."""
    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    photo = np.kron(z["scribble"], np.ones((2, 2, 1), np.uint8))  # 128x128
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        auto = pipe(PROMPT, steps=8, sampler="Euler", seed=4,
                    controlnets=[ControlNet("controlnet", photo, preprocessor="canny")])[0]
        edges = controlmaps.resize_control(controlmaps.to_rgb(controlmaps.canny(photo)), 64, 64, "Crop and Resize")
        by_hand = pipe(PROMPT, steps=8, sampler="Euler", seed=4, controlnets=[("controlnet", edges)])[0]
        plain = pipe(PROMPT, steps=8, sampler="Euler", seed=4, controlnets=[("controlnet", photo)])[0]
    assert np.array_equal(auto, by_hand)
    assert np.abs(auto.astype(int) - plain).max() > 5


def test_controlnet_given_as_its_own_folder() -> None:
    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    case = _cases("tiny-sd15-controlnet")[0]
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        by_name = _run_case(pipe, case, z)
        by_dir = _run_case(pipe, case, z, controlnets=[(str(DATA / "tiny-sd15-controlnet" / "controlnet"), z["edges"])])
        # a real run keeps the nets out of the model's parts (checkpoints and LoRAs never meet them)
        assert "controlnet" not in pipe.parts and "controlnet" in pipe.control_parts
        assert "controlnet:controlnet" not in pipe.control_parts  # the folder's own net, found by path too
    assert np.array_equal(by_name, by_dir)


def test_controlnet_image_follows_each_pass_size() -> None:
    """A hires pass prepares the control image at its size, and the next image's first pass (``batch_count`` > 1)
    at the first size again: it kept the hires size, which the net's latents no longer match. (The tiny folders
    are fixed at 64x64, so the passes are called directly rather than through a hires run.)"""
    from sdrt.pipelines.families.base import ModelCall

    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    case = _cases("tiny-sd15-controlnet")[0]
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        s, _, _ = pipe._prepare(case["prompt"], case["negative_prompt"],
                                dict(steps=2, width=64, height=64, controlnets=_units(case, z)))
        unit = s.toolbox.controlnets[0]
        sizes = []
        for w, h in ((64, 64), (128, 96), (64, 64)):  # first pass, hires pass, the next image's first pass
            pipe._control(s, ModelCall(w, h, 1, 7.0, None, None), w, h)
            sizes.append(tuple(unit.control.shape[-2:]))
    assert sizes == [(64, 64), (96, 128), (64, 64)]


@pytest.mark.parametrize("controlnets, error, words", [
    ([("controlnet", "EDGES", 1.0, 0.8, 0.5)], InputError, "after its end"),
    ([("nope", "EDGES")], ModelError, "no ControlNet named 'nope': the model has no nope/ part"),
    ([("controlnet", "EDGES", float("nan"))], InputError, "scale must be a number"),
    ([ControlNet("controlnet", "EDGES", preprocessor="depth")], InputError, "unknown ControlNet preprocessor"),
    ([ControlNet("controlnet", "EDGES", preprocessor="canny", processor_res=0)], InputError,
     "processor_res must be a number from 1"),
    ([ControlNet("controlnet", "EDGES", preprocessor="canny", processor_res=512.7)], InputError,
     r"controlnets\[0\] processor_res must be a whole number of pixels, got 512.7"),
    ([("controlnet",)], InputError, r"is not \(net, image"),
    ("controlnet", InputError, "controlnets must be a list"),
    # thresholds, checked with the rest (a TypeError from numpy, a ValueError from int(), 2.7 run as 2 at step 1)
    ([ControlNet("controlnet", "EDGES", preprocessor="canny", low="x")], InputError,
     r"controlnets\[0\] low, a canny threshold, must be a finite number, got 'x'"),
    ([ControlNet("controlnet", "EDGES", preprocessor="canny", high=float("inf"))], InputError,
     r"controlnets\[0\] high, a canny threshold"),
    ([ControlNet("controlnet", "EDGES", preprocessor="scribble", low="a")], InputError,
     r"controlnets\[0\] low, the scribble level, must be a finite number, got 'a'"),
    ([ControlNet("controlnet", "EDGES", preprocessor="scribble", low=2.7)], InputError,
     "the scribble level, must be a whole number from 0 to 255, got 2.7"),
    # a level past the threshold's 255 made an all-black map; a threshold none / invert read not, silently dropped
    ([ControlNet("controlnet", "EDGES", preprocessor="threshold", low=300)], InputError,
     r"controlnets\[0\] low, the threshold level, must be a number from 0 to 255, got 300"),
    ([ControlNet("controlnet", "EDGES", preprocessor="invert", low=10)], InputError,
     r"controlnets\[0\] low: the invert preprocessor reads no low threshold"),
])
def test_controlnet_bad_input(controlnets, error, words) -> None:
    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")

    def fill(v):
        if isinstance(v, tuple):
            return tuple(z["edges"] if x == "EDGES" else x for x in v)
        if isinstance(v, ControlNet):
            v.image = z["edges"]
        return v

    arg = [fill(u) for u in controlnets] if isinstance(controlnets, list) else controlnets
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe, pytest.raises(error, match=words):
        pipe.plan(PROMPT, steps=2, controlnets=arg)


def test_controlnet_on_a_unet_without_residual_inputs() -> None:
    with pipelines.load(DATA / "tiny-sd15", backend=fast_backend()) as pipe, pytest.raises(InputError, match="no ControlNet"):
        pipe.plan(PROMPT, steps=2, controlnets=[(str(DATA / "tiny-sd15-controlnet" / "controlnet"),
                                                 np.zeros((64, 64, 3), np.uint8))])


# ------------------------------------------------------------------ hires fix
def test_latent_upscalers_equal_torch_interpolate() -> None:
    z = np.load(TOOLBOX / "interpolate.npz")
    assert len(z.files) == 25
    for key in z.files[1:]:
        mode, aa, size = key.split("/")
        h, w = (int(v) for v in size.split("x"))
        np.testing.assert_allclose(interpolate(z["latent"], h, w, mode, aa == "1"), z[key], atol=5e-6, err_msg=key)


def test_hires_settings_and_infotext() -> None:
    hr = parse(2, 10, 0.45, "latent (bicubic)")
    assert hr.upscaler == "Latent (bicubic)" and hr.target(512, 768) == (1024, 1536)
    assert hr.infotext() == {"Denoising strength": 0.45, "Hires upscale": 2, "Hires steps": 10,
                             "Hires upscaler": "Latent (bicubic)"}
    assert "Hires steps" not in parse(1.5, None, None, None).infotext()  # A1111 leaves 0 (= first pass) out
    for kw, words in (({"hires_steps": 4}, "needs hires_scale"), ({"hires_scale": 0.5}, "from 1 to 8"),
                      ({"hires_scale": 2, "hires_denoise": 0}, r"in \(0, 1\]"),
                      ({"hires_scale": 2, "hires_upscaler": "ESRGAN"}, "unknown hires upscaler"),
                      ({"hires_scale": 2, "hires_steps": 10**11}, "hires_steps must be an integer from 0 to 10000")):
        with pytest.raises(InputError, match=words):
            parse(kw.get("hires_scale"), kw.get("hires_steps"), kw.get("hires_denoise"), kw.get("hires_upscaler"))


@pytest.fixture(scope="module")
def xl_dyn():
    pipe = pipelines.load(DATA / "tiny-sdxl-dyn", backend=fast_backend())
    yield pipe
    pipe.close()


def test_hires_fix_two_passes(xl_dyn) -> None:
    kw = dict(steps=6, sampler="Euler", seed=3, width=64, height=64, hires_scale=2, hires_steps=4, hires_denoise=0.5)
    plan = xl_dyn.plan("a cat", "blurry", **kw)
    shapes = {tuple(dict((k, s) for k, s, _ in sig)["sample"]): n for sig, n in plan.part("unet").signatures}
    assert shapes == {(2, 4, 8, 8): 6, (2, 4, 16, 16): 4}
    assert plan.part("vae_decoder").signatures[0][0][0][1] == (1, 4, 16, 16)
    assert "pass 2 at 128x128: the last 4 of 8 step(s)" in plan.format()
    steps = []
    gen = xl_dyn.generate("a cat", "blurry", callback=lambda i, n, x: steps.append((i, n, x.shape[-1])), **kw)
    assert gen.images[0].shape == (128, 128, 3)
    assert steps == [(i, 10, 8) for i in range(1, 7)] + [(i, 10, 16) for i in range(7, 11)]
    info = gen.settings[0]
    assert info["Size"] == "64x64" and info["Hires upscale"] == 2 and info["Hires steps"] == 4
    assert info["Denoising strength"] == 0.5 and info["Hires upscaler"] == "Latent"
    other = xl_dyn("a cat", "blurry", **{**kw, "hires_upscaler": "Latent (nearest)"})[0]
    assert np.abs(other.astype(int) - gen.images[0]).max() > 0


def test_hires_with_an_image_upscaler_is_img2img_of_the_upscaled_first_pass(xl_dyn) -> None:
    """Lanczos: decode, resize with Pillow, then img2img on A1111's steps (the last 4 of int(4 / 0.5) = 8)."""
    pil = pytest.importorskip("PIL.Image")
    kw = dict(steps=6, sampler="Euler", seed=3, width=64, height=64)
    hires = xl_dyn("a cat", "blurry", hires_scale=2, hires_steps=4, hires_denoise=0.5, hires_upscaler="Lanczos", **kw)[0]
    base = xl_dyn("a cat", "blurry", **kw)[0]
    big = np.asarray(pil.fromarray(base).resize((128, 128), pil.Resampling.LANCZOS))
    i2i = xl_dyn("a cat", "blurry", steps=8, sampler="Euler", seed=3, init_image=big, strength=4.5 / 8)[0]
    assert np.array_equal(hires, i2i)


def test_hires_with_a_model_upscaler(xl_dyn, monkeypatch) -> None:
    """An ESRGAN-family model (a small random-weight RRDBNet x4): decode, x4 in tiles, Lanczos down to the
    target, then img2img as with Lanczos; the infotext names the model. (The tiny SD 1.5 model's UNet is
    static, 64x64 only, so the dynamic tiny SDXL runs the fix.)"""
    pil = pytest.importorskip("PIL.Image")
    from sdrt.pipelines.upscaler import ModelUpscaler

    model = Path(__file__).resolve().parents[1] / "data" / "upscalers" / "rrdb_x4_new.safetensors"
    kw = dict(steps=6, sampler="Euler", seed=3, width=64, height=64)
    plan = xl_dyn.plan("a cat", "blurry", hires_scale=2, hires_upscaler=str(model), **kw)
    assert "rrdb_x4_new upscale x2" in plan.format()
    gen = xl_dyn.generate("a cat", "blurry", hires_scale=2, hires_steps=4, hires_denoise=0.5,
                          hires_upscaler=str(model), **kw)
    assert gen.images[0].shape == (128, 128, 3)
    assert gen.settings[0]["Hires upscaler"] == "rrdb_x4_new"
    base = xl_dyn("a cat", "blurry", **kw)[0]
    up = ModelUpscaler(model, backend=xl_dyn.backend).upscale(base)
    big = np.asarray(pil.fromarray(up).resize((128, 128), pil.Resampling.LANCZOS))
    i2i = xl_dyn("a cat", "blurry", steps=8, sampler="Euler", seed=3, init_image=big, strength=4.5 / 8)[0]
    assert np.array_equal(gen.images[0], i2i)
    # by name, from a folder in $SDRT_UPSCALERS
    monkeypatch.setenv("SDRT_UPSCALERS", str(model.parent))
    assert parse(2, None, None, "RRDB_x4_NEW").model == model
    with pytest.raises(InputError, match="model upscalers in .SDRT_UPSCALERS: compact_x2"):
        parse(2, None, None, "4x-UltraSharp")
    lora = DATA.parent / "lora"
    some = next(p for p in sorted(lora.rglob("*.safetensors")))
    with pytest.raises(ModelError, match="no upscaler sdrt runs"):
        parse(2, None, None, str(some))


def test_hires_refuses_a_static_unet_and_img2img() -> None:
    with pipelines.load(DATA / "tiny-sd15", backend=fast_backend()) as pipe:
        with pytest.raises(InputError, match="makes 64x64 images only"):
            pipe.plan(PROMPT, steps=2, hires_scale=2)
        with pytest.raises(InputError, match="txt2img pass"):
            pipe.plan(PROMPT, steps=2, hires_scale=1, init_image=np.zeros((64, 64, 3), np.uint8))
    # before any model loads (sdrt generate refused it after loading the model)
    with pytest.raises(InputError, match="the hires fix is a txt2img pass followed by img2img") as err:
        pipelines.validate(PROMPT, hires_scale=1.5, init_image=np.zeros((64, 64, 3), np.uint8))
    assert err.value.where == "hires_scale"


# ------------------------------------------------------------------ previews
def test_preview_is_the_denoised_estimate(xl_dyn) -> None:
    seen = []

    def cb(step, total, latents):
        seen.append((xl_dyn.preview(upscale=8), project(latents[0], "sdxl", upscale=8)))

    xl_dyn.generate("a cat", steps=5, sampler="Euler", seed=2, width=64, height=64, callback=cb)
    assert all(p.shape == (64, 64, 3) for p, _ in seen)
    assert np.abs(seen[0][0].astype(int) - seen[0][1]).max() > 10  # step 1: the estimate, not the noisy latent
    assert np.array_equal(seen[-1][0], seen[-1][1])  # Euler's last step lands on its estimate
    assert xl_dyn.preview() is None  # outside a step


def test_preview_with_a_taesd_decoder(xl_dyn) -> None:
    decoder = PREVIEW / "tiny-taesd" / "vae_decoder" / "model.onnx"
    shapes = []
    xl_dyn.generate("a cat", steps=2, sampler="Euler", seed=2, width=64, height=64, preview=decoder,
                    callback=lambda i, n, x: shapes.append(xl_dyn.preview().shape))
    assert shapes and all(s[2] == 3 and s[0] >= 8 for s in shapes)
    with pytest.raises(InputError, match="no preview decoder"):
        xl_dyn.plan("a cat", steps=2, preview=PREVIEW / "missing.onnx")


# ------------------------------------------------------------------ seeds
def test_gpu_and_nv_noise_is_a1111s_per_image() -> None:
    from sdrt.pipelines.toolbox import Toolbox, noise_source

    for rng, draw in (("gpu", randn_cuda), ("nv", randn_nv)):
        gen = noise_source(Toolbox(rng=rng), (3, 4, 8, 8), 41)
        want = np.stack([draw(41 + i, (4, 8, 8)) for i in range(3)])
        assert np.array_equal(gen.randn((3, 4, 8, 8)), want), rng
    cpu = noise_source(Toolbox(), (2, 4, 8, 8), 41)  # diffusers' one stream for the batch
    from sdrt.samplers import TorchGenerator

    assert np.array_equal(cpu.randn((2, 4, 8, 8)), TorchGenerator(41).randn((2, 4, 8, 8)))


def test_rng_seeds_and_infotext(xl_dyn) -> None:
    kw = dict(steps=3, sampler="Euler", width=64, height=64)
    gpu = xl_dyn.generate("a cat", seed=5, batch=2, rng="gpu", **kw)
    assert gpu.seeds == [5, 6] and [s["Seed"] for s in gpu.settings] == [5, 6]
    assert "RNG" not in gpu.settings[0]  # A1111 leaves its default (GPU) out
    single = xl_dyn.generate("a cat", seed=6, rng="gpu", **kw).images[0]
    assert np.abs(single.astype(int) - gpu.images[1]).max() <= 1  # image i of a batch is seed + i on its own
    nv = xl_dyn.generate("a cat", seed=5, rng="nv", **kw)
    cpu = xl_dyn.generate("a cat", seed=5, **kw)
    assert nv.settings[0]["RNG"] == "NV" and cpu.settings[0]["RNG"] == "CPU"
    assert np.abs(nv.images[0].astype(int) - cpu.images[0]).max() > 10
    assert np.abs(nv.images[0].astype(int) - gpu.images[0]).max() <= 2  # NV imitates the GPU's first draw


def test_variation_seeds(xl_dyn) -> None:
    kw = dict(steps=3, sampler="Euler", width=64, height=64, rng="gpu")
    none = xl_dyn("a cat", seed=5, **kw)[0]
    zero = xl_dyn.generate("a cat", seed=5, subseed=9, subseed_strength=0, **kw)
    assert np.array_equal(zero.images[0], none) and "Variation seed" not in zero.settings[0]
    full = xl_dyn.generate("a cat", seed=5, subseed=9, subseed_strength=1.0, batch=2, **kw)
    other = xl_dyn("a cat", seed=9, **kw)[0]
    assert np.abs(full.images[0].astype(int) - other).max() <= 1  # strength 1: the variation seed's noise
    assert full.seeds == [5, 5]  # A1111: a variation keeps the seed, the variation seeds count up
    assert [s["Variation seed"] for s in full.settings] == [9, 10]
    assert full.settings[0]["Variation seed strength"] == 1
    half = xl_dyn("a cat", seed=5, subseed=9, subseed_strength=0.5, **kw)[0]
    assert np.abs(half.astype(int) - none).max() > 5 and np.abs(half.astype(int) - other).max() > 5


def test_seed_minus_one_is_random_and_written(xl_dyn) -> None:
    a = xl_dyn.generate("a cat", seed=-1, steps=1, sampler="Euler", width=64, height=64)
    b = xl_dyn.generate("a cat", seed=-1, steps=1, sampler="Euler", width=64, height=64)
    assert 0 <= a.seeds[0] < 4294967294 and a.settings[0]["Seed"] == a.seeds[0] and a.seeds != b.seeds
    again = xl_dyn.generate("a cat", seed=a.seeds[0], steps=1, sampler="Euler", width=64, height=64)
    assert np.array_equal(again.images[0], a.images[0])


@pytest.mark.parametrize("kw, words", [({"rng": "tpu"}, "unknown random source"),
                                       ({"subseed_strength": 2}, "from 0 to 1"),
                                       ({"subseed": "x"}, "the subseed must be an integer"),
                                       ({"subseed": 2**64, "subseed_strength": 0.5},
                                        "subseed 18446744073709551616 is out of range"),
                                       ({"width": 4096, "height": 4096, "hires_scale": 8},
                                        "second pass is 32768x32768, above the limit of 16384"),
                                       ({"preview": 3}, "preview must be")])
def test_seed_bad_input(xl_dyn, kw, words) -> None:
    with pytest.raises((InputError, SamplerError), match=words):  # a seed out of range: as --seed's
        xl_dyn.plan("a cat", steps=1, **kw)


# ------------------------------------------------------------------ the command line
def test_cli_controlnet_flags_give_diffusers_image(tmp_path: Path, capsys) -> None:
    from sdrt.cli import main
    from sdrt.pipelines.png import read_parameters, write_png

    backend = fast_backend()
    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    case = next(c for c in _cases("tiny-sd15-controlnet") if c["name"] == "controlnet/two nets")
    paths = []
    for name in case["control_images"]:
        paths += ["--control-image", str(tmp_path / f"{name}.png")]
        write_png(tmp_path / f"{name}.png", z[name])
    out = tmp_path / "cn.png"
    args = ["generate", str(DATA / "tiny-sd15-controlnet"), case["prompt"], "--negative", case["negative_prompt"],
            "--steps", "8", "--sampler", "Euler", "--seed", str(case["seed"]), "--backend", backend, "-o", str(out),
            *paths, "--controlnet", str(DATA / "tiny-sd15-controlnet" / "controlnet"), "--controlnet", "controlnet_2"]
    for flag, key in (("--control-scale", "scale"), ("--control-start", "start"), ("--control-end", "end")):
        for v in case[key]:
            args += [flag, str(v)]
    assert main(args) == 0, capsys.readouterr().err
    pil = pytest.importorskip("PIL.Image")
    with pil.open(out) as img:
        pixels = np.asarray(img.convert("RGB"))
    assert np.abs(pixels.astype(int) - z[case["name"]][0]).max() <= 2
    text = read_parameters(out)
    assert 'ControlNet 0: "Module: none, Model: controlnet, Weight: 0.9,' in text
    assert 'ControlNet 1: "Module: none, Model: controlnet_2, Weight: 0.6,' in text and "Guidance Start: 0.1" in text


def test_cli_union_mode_errors_speak_flags(tmp_path: Path, capsys) -> None:
    """``--control-union-mode -1`` was refused in the API's words ("controlnets[0] union_mode ... pass e.g.
    union_mode=0") after the model had loaded; it is refused first, naming the flag, and the net-dependent refusals
    (a mode a net does not have) name the flag too."""
    from sdrt.cli import main
    from sdrt.errors import InputError
    from sdrt.pipelines.png import write_png

    png = tmp_path / "edges.png"
    write_png(png, np.zeros((64, 64, 3), np.uint8))
    rc = main(["generate", str(DATA / "tiny-flux-dev"), "a cat", "--controlnet", str(tmp_path / "any"),
               "--control-image", str(png), "--control-union-mode", "-1", "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("error: --control-union-mode must be a mode number (0, 1, ...), got -1. "
                                      "Where: --control-union-mode. What to do: pass e.g. --control-union-mode 0"), err
    assert "backend" not in err and err.count("\n") == 1
    from sdrt.checkpoint.controlnet import open_controlnet
    from sdrt.cli import build_parser

    names = build_parser().parse_args(["generate", "a cat"])._names
    nets = DATA / "tiny-flux-controlnet"
    register("reference")
    pipe = pipelines.load(DATA / "tiny-flux-dev", backend="reference")
    for net, mode, said in (("union", 4, "4 is not one of the net's 4 modes"), ("canny", 1, "is no union ControlNet")):
        cn = open_controlnet(nets / net / "diffusion_pytorch_model.safetensors", graph=nets / "flux_dev_transformer.onnx")
        with pytest.raises(InputError, match=said) as exc:
            pipe("a cat", steps=1, width=64, height=64, max_sequence_length=32,
                 controlnets=[ControlNet(cn, np.zeros((64, 64, 3), np.uint8), union_mode=mode)])
        line = exc.value.render(names)  # as sdrt generate prints it
        assert "--control-union-mode" in line.split(" Where:")[0] and "--control-union-mode" in line.split("do:")[1]
        assert "union_mode" not in line.replace("controlnets[0] union_mode", ""), line  # Where keeps the API's
    pipe.close()
    with pytest.raises(InputError, match=r"union_mode must be a mode number .* pass e\.g\. union_mode=0"):
        pipelines.validate("a cat", controlnets=[ControlNet("controlnet", png, union_mode=-1)])


@pytest.mark.parametrize("name", ["two units/My prompt is more important + Balanced", "guess mode"])
def test_cli_control_mode_and_guess_mode_flags(name: str, tmp_path: Path, capsys) -> None:
    from sdrt.cli import main
    from sdrt.pipelines.png import read_parameters, write_png

    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    case = next(c for c in _mode_cases("tiny-sd15-controlnet") if c["name"] == name)
    out = tmp_path / "cn.png"
    args = ["generate", str(DATA / "tiny-sd15-controlnet"), case["prompt"], "--negative", case["negative_prompt"],
            "--steps", "8", "--sampler", "Euler", "--seed", str(case["seed"]), "--backend", fast_backend(),
            "-o", str(out)]
    for k, (net, image, scale, mode) in enumerate(zip(case["controlnets"], case["control_images"], case["scale"],
                                                      case["control_mode"])):
        write_png(tmp_path / f"{image}.png", z[image])
        args += ["--control-image", str(tmp_path / f"{image}.png"), "--controlnet", net, "--control-scale", str(scale),
                 "--control-mode", str(["Balanced", "My prompt is more important"].index(mode)) if k else mode]
    if case["guess_mode"]:
        args += ["--guess-mode"]
    assert main(args) == 0, capsys.readouterr().err
    pil = pytest.importorskip("PIL.Image")
    with pil.open(out) as img:
        pixels = np.asarray(img.convert("RGB"))
    assert np.abs(pixels.astype(int) - np.load(DATA / "tiny-sd15-controlnet" / "modes.npz")[name][0]).max() <= 2
    assert f"Control Mode: {'ControlNet is more important' if case['guess_mode'] else case['control_mode'][0]}" \
        in read_parameters(out)


def test_cli_dry_run_shows_both_hires_passes_and_bad_flags(tmp_path: Path, capsys) -> None:
    from sdrt.cli import main

    assert main(["generate", str(DATA / "tiny-sdxl-dyn"), "a cat", "--steps", "6", "--width", "64", "--height", "64",
                 "--hires-scale", "1.5", "--hires-steps", "3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pass 2 at 96x96: the last 3 of 4 step(s)" in out and "sample [2, 4, 12, 12]" in out
    for args, words in ((["--controlnet", "x"], "--controlnet needs a --control-image"),
                        (["--hires-steps", "3"], "--hires-steps needs --hires-scale. Where: --hires-steps. What to do: "
                                                 "pass --hires-scale 2 (for example) too"),
                        (["--subseed-strength", "3"], "--subseed-strength must be from 0 to 1"),
                        (["--control-image", str(tmp_path / "none.png")], "the control image file does not exist. Where: --control-image"),
                        (["--guess-mode"], "--guess-mode needs a --control-image"),
                        (["--control-image", str(DATA / "tiny-sd15-controlnet" / "model_index.json"), "--control-mode",
                          "loud"], "--control-mode 'loud' is not a ControlNet control mode. Where: --control-mode. "
                                   "What to do: use Balanced, My prompt is more important or ControlNet is more "
                                   "important (or 0, 1, 2)"),
                        (["--control-image", str(DATA / "tiny-sd15-controlnet" / "model_index.json"), "--control-mode",
                          "2", "--guess-mode"], "--guess-mode and --control-mode other than Balanced")):
        rc = main(["generate", str(DATA / "tiny-sd15-controlnet"), "a cat", "--dry-run", *args])
        err = capsys.readouterr().err
        assert rc != 0 and words in err and "Traceback" not in err, (args, err)


def test_a_controlnet_unet_without_a_controlnet_is_the_plain_unet() -> None:
    """No ControlNet asked for: the folder's net at scale 0 feeds zero residuals, which is the plain UNet
    (tiny-sd15-controlnet's UNet has tiny-sd15's weights: gen_controlnet_refs.py builds both the same way)."""
    backend = fast_backend()
    kw = dict(steps=4, sampler="Euler", seed=5)
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=backend) as cn_pipe, \
            pipelines.load(DATA / "tiny-sd15", backend=backend) as plain:
        gen = cn_pipe.generate("a cat", "blurry", **kw)
        assert np.array_equal(gen.images[0], plain("a cat", "blurry", **kw)[0])
        assert not any(k.startswith("ControlNet") for k in gen.settings[0])
        assert cn_pipe.plan("a cat", **kw).part("controlnet").calls == 4


def test_control_image_without_a_controlnet_on_a_model_that_has_none(tmp_path, capsys) -> None:
    """``--control-image`` alone uses the model's own ``controlnet/`` part. On a model without one (a Flux dev folder
    or single file, an SD single file) the error read "no ControlNet model.onnx or .safetensors at
    'controlnet'. Where: --controlnet", a flag the user never gave; it names the folder looked in and --controlnet."""
    from PIL import Image

    from sdrt.cli import main

    png = tmp_path / "edges.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(png)
    rc = main(["generate", str(DATA / "tiny-flux-dev"), "a cat", "--control-image", str(png), "--steps", "1",
               "--backend", fast_backend(), "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("error:") == 1 and "Traceback" not in err, err
    assert "no ControlNet named 'controlnet': the model has no controlnet/ part" in err, err
    assert f"Where: {DATA / 'tiny-flux-dev' / 'controlnet'}." in err and "--controlnet FILE" in err, err
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe, \
            pytest.raises(ModelError, match=r"no ControlNet at '/no/such/net.safetensors': no such file or folder"):
        pipe.plan(PROMPT, steps=2, controlnets=[("/no/such/net.safetensors", np.zeros((64, 64, 3), np.uint8))])
