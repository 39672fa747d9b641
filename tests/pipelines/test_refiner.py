"""The SDXL refiner against diffusers (tests/data/pipelines/tiny-sdxl-refiner, scripts/gen_refiner_refs.py).

Alone it is diffusers' ``StableDiffusionXLImg2ImgPipeline`` with ``requires_aesthetics_score``: CLIP-G's
penultimate layer as the only context, its pooled output, and 5 time ids ending in the aesthetic score (6.0 for
the prompt, 2.5 for the negative prompt). After tiny-sdxl (``refiner=``) it is diffusers' ensemble of experts
(``denoising_end`` / ``denoising_start``). Tolerance: test_pipelines_diffusers.py's (max 1 of 255, at most
0.5 % of values off).
"""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, call_kwargs, cases, refs, register

from sdrt import pipelines
from sdrt.errors import InputError

FOLDER = "tiny-sdxl-refiner"
#: the reference backend and ggml run a few cases; OpenVINO runs them all
SHORT = {"img2img/Euler a/empty negative"}
_PIPES: dict[tuple[str, str], pipelines.Pipeline] = {}


def _pipe(folder: str, backend: str) -> pipelines.Pipeline:
    if (folder, backend) not in _PIPES:
        _PIPES[folder, backend] = pipelines.load(DATA / folder, backend=backend)
    return _PIPES[folder, backend]


@pytest.fixture(scope="module", autouse=True)
def _close_pipes():
    yield
    for p in _PIPES.values():
        p.close()
    _PIPES.clear()


def _close_enough(images: list[np.ndarray], want: np.ndarray) -> None:
    assert_matches_diffusers(images, want)


def _params(mode: str, short: set[str]):
    for case in cases(FOLDER):
        if not case["mode"].startswith(mode):
            continue
        for backend in ("reference", "openvino", "ggml"):
            if backend != "openvino" and case["name"] not in short:
                continue
            yield pytest.param(case["name"], backend, id=f"{case['name']}:{backend}")


def test_folder_is_the_refiner() -> None:
    register("reference")
    pipe = _pipe(FOLDER, "reference")
    assert pipe.family.name == "sdxl-refiner"
    assert [e.part for e in pipe.family.encoders] == ["text_encoder_2"]
    assert not pipe.folder.force_zeros_for_empty_prompt  # the release's model_index.json: encode an empty negative


@pytest.mark.parametrize(("name", "backend"), list(_params("img2img", SHORT)))
def test_refiner_img2img_matches_diffusers(name: str, backend: str) -> None:
    register(backend)
    case = next(c for c in cases(FOLDER) if c["name"] == name)
    ref = refs(FOLDER)
    images = _pipe(FOLDER, backend)(case["prompt"], case["negative_prompt"], **call_kwargs(case, ref))
    _close_enough(images, ref[name])


def test_refiner_time_ids_hold_the_aesthetic_scores() -> None:
    """What the UNet is fed: (height, width, 0, 0, 6.0) for the prompt's rows, 2.5 for the negative's."""
    register("reference")
    pipe = _pipe(FOLDER, "reference")
    fed: list[np.ndarray] = []
    unet = pipe.denoiser
    run = unet.run

    def spy(feeds, *args, **kwargs):
        fed.append(np.array(feeds["time_ids"]))
        return run(feeds, *args, **kwargs)

    unet.run = spy
    try:
        pipe("a cat", "blurry", init_image=refs(FOLDER)["init_image"], strength=0.2, steps=5, cfg=5, seed=1,
             sampler="Euler")
    finally:
        del unet.run
    assert fed and all(t.shape == (2, 5) for t in fed)
    np.testing.assert_array_equal(fed[0], [[64, 64, 0, 0, 2.5], [64, 64, 0, 0, 6.0]])


def test_refiner_alone_does_not_make_images_from_noise() -> None:
    register("reference")
    with pytest.raises(InputError, match="SDXL refiner continues an image's latents") as err:
        _pipe(FOLDER, "reference")("a cat", steps=2)
    assert err.value.where == "init_image"


# ---------------------------------------------------------------- base + refiner (refiner=, refiner_switch_at=)
REFINER = DATA / FOLDER


@pytest.mark.parametrize(("name", "backend"), list(_params("refiner", {"refiner/Euler a/0.7", "refiner/img2img/Euler/0.8"})))
def test_base_then_refiner_matches_diffusers_ensemble(name: str, backend: str) -> None:
    register(backend)
    case = next(c for c in cases(FOLDER) if c["name"] == name)
    ref = refs(FOLDER)
    init = dict(init_image=ref["init_image"], strength=case["strength"]) if case["mode"] == "refiner-img2img" else {}
    gen = _pipe("tiny-sdxl", backend).generate(
        case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"],
        seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"], refiner=REFINER,
        refiner_switch_at=case["switch_at"], **init)
    _close_enough(gen.images, ref[name])
    info = gen.settings[0]
    assert info["Refiner"] == f"{FOLDER} [{_pipe(FOLDER, backend).model_hash}]"
    assert info["Refiner switch at"] == case["switch_at"]


def _counting(pipe: pipelines.Pipeline) -> list[float]:
    seen: list[float] = []
    run = pipe.denoiser.run

    def spy(feeds, *args, **kwargs):
        seen.append(float(np.asarray(feeds["timestep"]).reshape(-1)[0]))
        return run(feeds, *args, **kwargs)

    pipe.denoiser.run = spy
    return seen


@pytest.mark.parametrize("sampler", ["Euler", "DPM++ 2M", "Heun"])
def test_switch_is_a1111s_timestep_rule(sampler: str) -> None:
    """Calls at timesteps t with (999 - t) / 1000 >= switch go to the refiner, and every call after; a k-diffusion
    sampler (DPM++ 2M, Heun: sdrt.samplers) and a diffusers-form one (Euler) alike."""
    register("reference")
    base, ref = _pipe("tiny-sdxl", "reference"), _pipe(FOLDER, "reference")
    on_base, on_ref = _counting(base), _counting(ref)
    try:
        base("a cat", "blurry", steps=6, cfg=3, seed=2, sampler=sampler, refiner=ref, refiner_switch_at=0.6)
    finally:
        del base.denoiser.run, ref.denoiser.run
    assert on_base and on_ref
    assert all((999 - round(t)) / 1000 < 0.6 for t in on_base)
    assert (999 - round(on_ref[0])) / 1000 >= 0.6


@pytest.mark.parametrize(("kwargs", "where", "match"), [
    ({"refiner_switch_at": 0.0}, "refiner_switch_at", "above 0 and at most 1"),
    ({"refiner_switch_at": 1.01}, "refiner_switch_at", "above 0 and at most 1"),
    ({"refiner_switch_at": float("nan")}, "refiner_switch_at", "above 0 and at most 1"),
    ({"refiner_switch_at": "0.8"}, "refiner_switch_at", "above 0 and at most 1"),
    ({"refiner": None, "refiner_switch_at": 0.8}, "refiner_switch_at", "without"),
    ({"refiner": None, "hires_refiner_pass": "both passes"}, "hires_refiner_pass", "without"),
    ({"hires_refiner_pass": "both passes"}, "hires_refiner_pass", "needs hires_scale"),
    ({"hires_refiner_pass": "third pass", "hires_scale": 1.5, "base": "tiny-sdxl-dyn"}, "hires_refiner_pass",
     "unknown hires_refiner_pass 'third pass'"),
    ({"refiner": "no/such/refiner.safetensors"}, "refiner", "does not exist"),
    ({"refiner": 3}, "refiner", "a model path or a pipeline"),
])
def test_refiner_arguments_are_checked(kwargs: dict, where: str, match: str) -> None:
    register("reference")
    args = {"refiner": REFINER, **kwargs}
    base = args.pop("base", "tiny-sdxl")
    with pytest.raises(InputError, match=match) as err:
        _pipe(base, "reference")("a cat", steps=2, seed=1, **args)
    assert err.value.where == where


def test_refiner_after_an_sd15_base_is_refused() -> None:
    register("reference")
    with pytest.raises(InputError, match="SDXL refiner model and this model is SD 1.x") as err:
        _pipe("tiny-sd15", "reference")("a cat", steps=2, seed=1, refiner=REFINER)
    assert err.value.where == "refiner"


def test_the_refiner_is_no_base() -> None:
    register("reference")
    with pytest.raises(InputError, match="it is the refiner, not a base"):
        _pipe(FOLDER, "reference")("a cat", init_image=refs(FOLDER)["init_image"], strength=0.5, steps=4,
                                   refiner=DATA / "tiny-sdxl")


def test_refiner_infotext_is_a1111s() -> None:
    from sdrt.pipelines.png import format_parameters

    register("reference")
    gen = _pipe("tiny-sdxl", "reference").generate("a cat", steps=3, seed=4, sampler="Euler", refiner=REFINER,
                                                   refiner_switch_at=0.5)
    text = format_parameters(gen.prompt, gen.negative_prompt, gen.settings[0])
    assert f"Refiner: {FOLDER} [{_pipe(FOLDER, 'reference').model_hash}], Refiner switch at: 0.5" in text


def test_cli_refiner_flags_give_the_api_image(tmp_path, capsys) -> None:
    from sdrt.cli import main
    from sdrt.pipelines.png import read_parameters

    register("openvino")
    out = tmp_path / "out.png"
    rc = main(["generate", str(DATA / "tiny-sdxl"), "a red cat", "--steps", "10", "--sampler", "Euler", "--seed", "3",
               "--backend", "openvino", "--refiner", str(REFINER), "--refiner-switch-at", "0.8", "-o", str(out)])
    assert rc == 0
    text = read_parameters(out)
    assert f"Refiner: {FOLDER} [" in text and "Refiner switch at: 0.8" in text
    want = _pipe("tiny-sdxl", "openvino")("a red cat", steps=10, sampler="Euler", seed=3, refiner=REFINER,
                                          refiner_switch_at=0.8)[0]
    from sdrt.pipelines.images import to_rgb

    np.testing.assert_array_equal(to_rgb(out), want)
    assert main(["generate", str(DATA / "tiny-sdxl"), "a red cat", "--refiner-switch-at", "0", "--refiner",
                 str(REFINER), "--dry-run"]) == 1
    assert "--refiner-switch-at must be above 0 and at most 1" in capsys.readouterr().err


def test_low_memory_base_and_refiner_give_the_same_image() -> None:
    """In low-memory mode the base's UNet is dropped at the switch (it runs no more) and the refiner's parts after
    use; the image does not change."""
    register("openvino")
    kw = dict(steps=6, sampler="Euler", seed=8, width=64, height=64, refiner=REFINER, refiner_switch_at=0.6)
    want = _pipe("tiny-sdxl", "openvino")("a cat", "blurry", **kw)[0]
    with pipelines.load(DATA / "tiny-sdxl", backend="openvino", low_memory=True) as pipe:
        got = pipe("a cat", "blurry", **kw)[0]
        assert pipe.is_low_memory and next(iter(pipe._refiners.values())).is_low_memory
    np.testing.assert_array_equal(got, want)


def test_the_refiners_unet_hands_back_its_working_memory_before_the_decode(monkeypatch) -> None:
    """After the loop both UNets release their sessions' buffers (OpenVINO's ``release_memory``) before the VAE
    decodes; the next run allocates them again and gives the same image."""
    from sdrt.pipelines.parts import Part

    register("openvino")
    kw = dict(steps=4, sampler="Euler", seed=3, width=64, height=64, refiner=REFINER, refiner_switch_at=0.5)
    base = _pipe("tiny-sdxl", "openvino")
    want = base("a cat", "blurry", **kw)[0]
    released: list[Part] = []
    release = Part.release_scratch

    def spy(self: Part) -> None:
        released.append(self)
        release(self)

    monkeypatch.setattr(Part, "release_scratch", spy)
    got = base("a cat", "blurry", **kw)[0]
    refiner = next(iter(base._refiners.values()))
    assert any(p is refiner.denoiser for p in released) and any(p is base.denoiser for p in released)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(base("a cat", "blurry", **kw)[0], want)


@pytest.mark.parametrize(("key", "hint"), [("refiner_checkpoint", "pass refiner (a model path"),
                                           ("denoising_end", "pass refiner and refiner_switch_at")])
def test_other_libraries_names_point_at_refiner(key: str, hint: str) -> None:
    register("reference")
    with pytest.raises(InputError, match=f"unknown argument '{key}'") as err:
        _pipe("tiny-sdxl", "reference")("a cat", steps=2, **{key: 0.8})
    assert err.value.fix.startswith(hint)


def test_the_bases_chosen_vae_decodes_after_the_refiner(tmp_path) -> None:
    """A1111's sd_vae applies to the refiner it loads too: a base loaded with ``vae=`` (or ``set_vae``) decodes the
    refined latents with that file, as a refiner loaded with the same file would; the refiner's own VAE decoded
    them before, and the chosen VAE was dropped without a word (the image of the base's own VAE, bit for bit)."""
    register("openvino")
    xl = DATA / "tiny-sdxl"
    dim = _dim_vae(tmp_path)
    kw = dict(steps=4, cfg=5.0, sampler="Euler", seed=3, width=64, height=64)
    with pipelines.load(xl, backend="openvino") as own, pipelines.load(xl, backend="openvino", vae=dim) as base, \
            pipelines.load(DATA / FOLDER, backend="openvino", vae=dim) as dim_refiner:
        plain = own("a cat", refiner=DATA / FOLDER, **kw)[0]
        got = base("a cat", refiner=DATA / FOLDER, **kw)[0]
        assert np.abs(got.astype(int) - plain.astype(int)).mean() > 1  # the chosen VAE decoded
        assert got.tobytes() == own("a cat", refiner=dim_refiner, **kw)[0].tobytes()
        base.set_vae(None)  # back to the model's own: the refiner's own VAE decodes again
        assert base("a cat", refiner=DATA / FOLDER, **kw)[0].tobytes() == plain.tobytes()
        # a switch past the last step ((999 - t) / 1000 is at most 0.999, for t = 0): the refiner never ran, so the
        # base decodes, as A1111 never loads it then; the refiner's own VAE file decoded before
        late = own("a cat", refiner=dim_refiner, refiner_switch_at=0.9995, **kw)[0]
        assert late.tobytes() == own("a cat", **kw)[0].tobytes()


def test_the_base_models_own_path_as_its_refiner_is_refused() -> None:
    """A path to the base's own folder was loaded a second time (twice the memory) to run the same weights."""
    register("reference")
    pipe = _pipe("tiny-sdxl", "reference")
    with pytest.raises(InputError, match="the refiner is the base model itself"):
        pipe("a cat", steps=2, width=64, height=64, refiner=DATA / "tiny-sdxl")
    import os

    assert os.path.realpath(DATA / "tiny-sdxl") not in pipe._refiners  # nothing loaded


# ---------------------------------------------------------------- with the hires fix (A1111 1.7+'s hires_fix_refiner_pass)
def _hires_cases() -> list[dict]:
    import json

    return json.loads((DATA / FOLDER / "hires_refs.json").read_text())


def _hires_params():
    short = {"hires/Lanczos/Euler/0.8", "hires/first pass/Lanczos/Euler/0.8"}
    for case in _hires_cases():
        for backend in ("reference", "openvino", "ggml"):
            if backend == "openvino" or case["name"] in short:
                yield pytest.param(case["name"], backend, id=f"{case['name']}:{backend}")


def _hires_kwargs(case: dict) -> dict:
    return dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
                height=case["height"], batch=case["batch"], hires_scale=case["hires_scale"],
                hires_steps=case["hires_steps"], hires_denoise=case["hires_denoise"], hires_upscaler=case["upscaler"],
                refiner=REFINER, refiner_switch_at=case["switch_at"], hires_refiner_pass=case["hires_refiner_pass"])


@pytest.mark.parametrize(("name", "backend"), list(_hires_params()))
def test_refiner_with_the_hires_fix_matches_diffusers(name: str, backend: str) -> None:
    """tiny-sdxl-dyn + the refiner with the hires fix against diffusers' pipelines composed as A1111 runs them
    (scripts/gen_refiner_hires_refs.py): the refiner takes over in the hires pass at the switch's timestep (at
    denoise 0.125 from its first step), or in the first pass and then runs all of the hires pass. An image
    upscaler's cases decode, round to uint8 and encode between the passes, so a value a backend rounds the other
    way there moves a few more of the final values: at most 1 level off still, for at most 1 % of them."""
    register(backend)
    case = next(c for c in _hires_cases() if c["name"] == name)
    want = np.load(DATA / FOLDER / "hires_refs.npz")[name]
    gen = _pipe("tiny-sdxl-dyn", backend).generate(case["prompt"], case["negative_prompt"], **_hires_kwargs(case))
    if case["upscaler"] == "Latent":
        _close_enough(gen.images, want)
    else:
        diff = np.abs(np.stack(gen.images).astype(np.int16) - want.astype(np.int16))
        assert diff.max() <= 1 and (diff > 0).mean() <= 0.01, (diff.max(), (diff > 0).mean())
    info = gen.settings[0]
    assert info["Refiner"] == f"{FOLDER} [{_pipe(FOLDER, backend).model_hash}]"
    assert info["Refiner switch at"] == case["switch_at"] and info["Hires upscale"] == 2
    # A1111 writes "Hires refiner" when the option is not its default (the second pass)
    assert info.get("Hires refiner") == (None if case["hires_refiner_pass"] == "second pass"
                                         else case["hires_refiner_pass"])


def _plan_parts(**kw) -> tuple[dict[str, list[list[int]]], object]:
    """``{part: [[width of its image input, calls], ...]}`` of a plan (latents 8 or 16 wide, images 128), and the plan."""
    rp = _pipe("tiny-sdxl-dyn", "reference").plan("a cat", "blurry", steps=10, sampler="Euler", width=64, height=64,
                                                  hires_scale=2, hires_steps=5, hires_denoise=0.5, refiner=REFINER, **kw)
    return {p.part: sorted([next((s[-1] for _, s, _ in sig if len(s) == 4), 0), n] for sig, n in p.signatures)
            for p in rp.parts}, rp


def test_plan_lists_the_refiner_and_the_vae_between_the_passes() -> None:
    """The run plan lists the refiner's parts as refiner.*, with only the calls that run: with an image upscaler and
    the refiner taking over in the hires pass (A1111's default), the model's VAE decodes and encodes between the
    passes and the refiner's decodes the end; once the refiner took over in the first pass (A1111's "first pass"
    option) it runs all of the hires pass and its VAE does all three. A switch at 1 never comes: no refiner part
    runs. The refiner's memory is planned beside the model's resident parts."""
    register("reference")
    parts, rp = _plan_parts(hires_upscaler="Lanczos")  # {part: [[last dim, calls], ...]} (last dim: 8 or 16)
    assert parts["unet"] == [[8, 10], [16, 3]] and parts["refiner.unet"] == [[16, 2]]
    assert parts["vae_decoder"] == [[8, 1]] and parts["vae_encoder"] == [[128, 1]]
    assert parts["refiner.vae_decoder"] == [[16, 1]] and "refiner.vae_encoder" not in parts
    assert [p.part for p in rp.refiner_memory.parts] == ["text_encoder_2", "unet", "vae_decoder", "vae_encoder"]
    assert rp.refiner_memory.base_bytes > rp.memory.base_bytes  # the model's resident parts stay beside it
    text = rp.format()
    assert "takes over at 0.8 (timesteps under 200, in the hires pass only)" in text and "refiner memory:" in text
    parts, _ = _plan_parts(hires_upscaler="Lanczos", hires_refiner_pass="first pass")
    assert parts["unet"] == [[8, 8]] and parts["refiner.unet"] == [[8, 2], [16, 5]]
    assert "vae_decoder" not in parts and "vae_encoder" not in parts
    assert parts["refiner.vae_decoder"] == [[8, 1], [16, 1]] and parts["refiner.vae_encoder"] == [[128, 1]]
    parts, _ = _plan_parts(hires_refiner_pass="both passes")  # it took over in the first pass: as "first pass"
    assert parts["unet"] == [[8, 8]] and parts["refiner.unet"] == [[8, 2], [16, 5]]
    parts, rp = _plan_parts(refiner_switch_at=1.0)
    assert not any(p.startswith("refiner.") for p in parts) and rp.refiner_memory is None


def test_a_refiner_that_never_takes_over_is_not_named() -> None:
    """A1111 names the refiner in the infotext only when apply_refiner swaps it in: at refiner_switch_at 1 (no
    timestep passes it) the image is the model's alone and no Refiner field is written, with the hires fix or
    without; so too when the refiner may take over in the first pass only and the switch comes later."""
    register("reference")
    pipe = _pipe("tiny-sdxl-dyn", "reference")
    kw = dict(steps=4, cfg=5.0, sampler="Euler", seed=9, width=64, height=64)
    hr = dict(hires_scale=1.5, hires_steps=2, hires_denoise=0.5)
    for extra in ({}, hr):
        alone = pipe.generate("a cat", **kw, **extra)
        never = pipe.generate("a cat", refiner=REFINER, refiner_switch_at=1.0, **kw, **extra)
        assert never.images[0].tobytes() == alone.images[0].tobytes()
        assert never.settings[0] == alone.settings[0]
    # a schedule whose last timestep is not past the switch: SGM Uniform's 2 steps run t = 999 and 500, and
    # (999 - 500) / 1000 < 0.9
    kw2 = dict(kw, steps=2, schedule="sgm_uniform")
    late = pipe.generate("a cat", refiner=REFINER, refiner_switch_at=0.9, **kw2)
    assert "Refiner" not in late.settings[0]
    assert late.images[0].tobytes() == pipe.generate("a cat", **kw2).images[0].tobytes()
    # in the first pass only, with the switch at the first pass's last step (t = 1 of 751, 501, 251, 1)
    first = pipe.generate("a cat", refiner=REFINER, refiner_switch_at=0.9, hires_refiner_pass="first pass", **kw, **hr)
    assert first.settings[0]["Refiner switch at"] == 0.9 and first.settings[0]["Hires refiner"] == "first pass"


def test_both_passes_is_the_first_pass_when_the_refiner_took_over_there() -> None:
    register("openvino")
    pipe = _pipe("tiny-sdxl-dyn", "openvino")
    kw = dict(steps=6, cfg=5.0, sampler="Euler a", seed=4, width=64, height=64, hires_scale=2, hires_steps=3,
              hires_denoise=0.6, hires_upscaler="Lanczos", refiner=REFINER, refiner_switch_at=0.7)
    first = pipe.generate("a cat", "blurry", hires_refiner_pass="first pass", **kw)
    both = pipe.generate("a cat", "blurry", hires_refiner_pass="both passes", **kw)
    second = pipe.generate("a cat", "blurry", **kw)
    assert first.images[0].tobytes() == both.images[0].tobytes() != second.images[0].tobytes()
    assert both.settings[0]["Hires refiner"] == "both passes" and "Hires refiner" not in second.settings[0]


def test_cli_hires_refiner_pass_gives_the_api_image(tmp_path) -> None:
    from sdrt.cli import main
    from sdrt.pipelines.images import to_rgb
    from sdrt.pipelines.png import read_parameters

    register("openvino")
    out = tmp_path / "out.png"
    assert main(["generate", str(DATA / "tiny-sdxl-dyn"), "a red cat", "--steps", "6", "--sampler", "Euler", "--seed",
                 "3", "--width", "64", "--height", "64", "--backend", "openvino", "--hires-scale", "1.5",
                 "--hires-steps", "3", "--refiner", str(REFINER), "--hires-refiner-pass", "first pass",
                 "-o", str(out)]) == 0
    text = read_parameters(out)
    # A1111's order: the hires fields (set before sampling), then apply_refiner's at the swap
    assert ("Hires upscale: 1.5, Hires steps: 3, Hires upscaler: Latent, Hires refiner: first pass, Refiner: "
            f"{FOLDER} [") in text and text.endswith("Refiner switch at: 0.8")
    want = _pipe("tiny-sdxl-dyn", "openvino")("a red cat", steps=6, sampler="Euler", seed=3, width=64, height=64,
                                              hires_scale=1.5, hires_steps=3, refiner=REFINER,
                                              hires_refiner_pass="first pass")[0]
    np.testing.assert_array_equal(to_rgb(out), want)


def test_an_interrupted_run_is_decoded_by_the_refiner_once_it_took_over(tmp_path) -> None:
    """``Interrupted.partial()`` decodes the stopped run's last estimate with the model loaded last, as the finished
    run does: stopped after its last step, the partial image is the refined image (a refiner with a dimmed VAE file
    tells the two VAEs apart); the base's VAE decoded it before."""
    from sdrt.errors import Interrupted

    register("openvino")
    dim = _dim_vae(tmp_path)
    kw = dict(steps=4, cfg=5.0, sampler="Euler", seed=3, width=64, height=64)
    with pipelines.load(DATA / FOLDER, backend="openvino", vae=dim) as refiner:
        pipe = _pipe("tiny-sdxl", "openvino")
        full = pipe("a cat", refiner=refiner, **kw)[0]
        with pytest.raises(Interrupted) as stop:
            pipe("a cat", refiner=refiner, callback=lambda i, n, x: i < n, **kw)
        part = stop.value.partial().images[0]
        # Euler's last step lands on its denoised estimate: the same latents, to float rounding
        assert np.abs(part.astype(int) - full.astype(int)).max() <= 1


def _dim_vae(tmp_path):
    """tiny-sdxl's VAE as a single file with its last conv halved: a second VAE that tells the decoders apart."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
    from single_file_helpers import vae_tensors, write

    from sdrt.graph import Graph

    xl = DATA / "tiny-sdxl"
    t = vae_tensors(Graph.load(xl / "vae_decoder" / "model.onnx"), Graph.load(xl / "vae_encoder" / "model.onnx"))
    t["decoder.conv_out.weight"] = t["decoder.conv_out.weight"] * np.float32(0.5)
    return write(tmp_path / "dim_vae.safetensors", t)


def _by_steps_rows():
    import json
    from pathlib import Path

    table = json.loads((Path(__file__).parent / "data" / "a1111_steps.json").read_text())["refiner_by_steps"]
    return [r for r in table if r["label"] in ("Euler", "DPM++ 2M", "Heun", "DPM2 a") and r["steps"] in (4, 10)
            and r["switch_at"] in (0.25, 0.5, 0.8, 1.0)]


@pytest.mark.parametrize("row", _by_steps_rows(), ids=lambda r: f"{r['label']}-{r['steps']}-{r['switch_at']}")
def test_switch_by_sampling_steps_is_a1111s(row) -> None:
    """``refiner_switch_by_steps`` (A1111's refiner_switch_by_sample_steps): the refiner takes the denoiser calls from
    the one A1111's own apply_refiner and SamplerData.total_steps pick (tests/pipelines/data/a1111_steps.json,
    scripts/gen_a1111_steps_refs.py); a diffusers-form sampler (Euler), k-diffusion ones and second-order ones."""
    from pipeline_helpers import fast_backend

    backend = fast_backend()
    base, ref = _pipe("tiny-sdxl", backend), _pipe(FOLDER, backend)
    on_base, on_ref = _counting(base), _counting(ref)
    try:
        gen = base.generate("a cat", "blurry", steps=row["steps"], cfg=3, seed=2, sampler=row["label"], refiner=ref,
                            refiner_switch_at=row["switch_at"], refiner_switch_by_steps=True)
    finally:
        del base.denoiser.run, ref.denoiser.run
    made = len(on_base) + len(on_ref)
    at = row["switch_call"] if row["switch_call"] is not None else made
    assert len(on_base) == min(at, made), (len(on_base), len(on_ref))
    info = gen.settings[0]
    assert info["Refiner switch by sampling steps"] is True
    assert ("Refiner" in info) == bool(on_ref)


def test_switch_by_steps_needs_a_refiner_and_a_boolean() -> None:
    register("reference")
    with pytest.raises(InputError, match="refiner_switch_by_steps without refiner") as err:
        _pipe("tiny-sdxl", "reference")("a cat", steps=2, seed=1, refiner_switch_by_steps=True)
    assert err.value.where == "refiner_switch_by_steps"
    with pytest.raises(InputError, match="must be True or False"):
        _pipe("tiny-sdxl", "reference")("a cat", steps=2, seed=1, refiner=REFINER, refiner_switch_by_steps="yes")


def test_cli_refiner_switch_by_steps(tmp_path, capsys) -> None:
    from pipeline_helpers import fast_backend

    from sdrt.cli import main
    from sdrt.pipelines.png import read_parameters

    backend = fast_backend()
    out = tmp_path / "out.png"
    assert main(["generate", str(DATA / "tiny-sdxl"), "a red cat", "--steps", "4", "--sampler", "Heun", "--seed", "3",
                 "--backend", backend, "--refiner", str(REFINER), "--refiner-switch-at", "0.5",
                 "--refiner-switch-by-steps", "-o", str(out)]) == 0
    text = read_parameters(out)
    assert "Refiner switch by sampling steps: True, Refiner: tiny-sdxl-refiner [" in text, text


def test_the_run_places_the_refiners_parts_as_its_plan_does() -> None:
    """The plan's refiner section (RunPlan.refiner_memory) is what the run does, as the hires checkpoint's: under a
    tight ``memory=`` a refiner loaded from a path plans under the base's budget (it planned under 90% of the OS)
    and its parts the plan releases are released once used (the run applied no plan to the refiner: every part of
    it stayed loaded whatever the plan printed); a loaded refiner pipeline plans and runs under its own."""
    register("reference")
    kw = dict(steps=4, cfg=3, seed=2, sampler="Euler", width=64, height=64, refiner_switch_at=0.5)
    with pipelines.load(DATA / "tiny-sdxl", backend="reference", memory="4MB") as pipe:
        rp = pipe.plan("a cat", "blurry", refiner=REFINER, **kw)
        assert "budget 3.8 MiB (memory=)" in rp.format().split("refiner memory")[1].splitlines()[0]
        placed = {p.part: p.placement for p in rp.refiner_memory.parts}
        assert placed["unet"] == "released" and placed["text_encoder_2"] == "released"
        pipe.generate("a cat", "blurry", refiner=REFINER, **kw)
        ref = next(iter(pipe._refiners.values()))
        assert ref.memory == pipe.memory
        assert not ref._parts["unet"].sessions and not ref._parts["text_encoder_2"].sessions
    with pipelines.load(DATA / "tiny-sdxl", backend="reference") as pipe, \
            pipelines.load(DATA / FOLDER, backend="reference", memory="4MB") as ref:
        rp = pipe.plan("a cat", "blurry", refiner=ref, **kw)
        placed = {p.part: p.placement for p in rp.refiner_memory.parts}
        assert placed["unet"] == "released"
        pipe.generate("a cat", "blurry", refiner=ref, **kw)
        assert not ref._parts["unet"].sessions and not ref._parts["text_encoder_2"].sessions


def test_a_pipeline_run_as_the_refiner_is_held_for_the_job() -> None:
    """A loaded pipeline passed as refiner is locked for the job, as a loaded hires checkpoint is: another thread's
    job on it waits until the job ends (the job tells it the refiner section's memory plan and runs its parts); it
    was not held at all."""
    import threading

    register("reference")
    kw = dict(steps=4, cfg=3, seed=2, sampler="Euler", width=64, height=64, refiner_switch_at=0.5)
    with pipelines.load(DATA / "tiny-sdxl", backend="reference") as pipe, \
            pipelines.load(DATA / FOLDER, backend="reference") as ref:
        done = threading.Event()
        seen: list[bool] = []
        picture = np.full((64, 64, 3), 128, np.uint8)
        other = threading.Thread(target=lambda: (ref.generate("a dog", init_image=picture, strength=0.5, steps=2),
                                                 done.set()))

        def callback(step: int, total: int, latents: np.ndarray) -> None:
            if step == 1:
                other.start()
                seen.append(done.wait(3.0))  # the other thread's job on the refiner: waiting

        pipe.generate("a cat", "blurry", refiner=ref, callback=callback, **kw)
        other.join(60)
        assert seen == [False] and done.is_set()
        assert ref._owner is None and not ref._lock.locked()
