"""The pipeline API beyond the diffusers references: settings checks, prompts, samplers, batches, callbacks."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend, refs, register

from sdrt import pipelines
from sdrt.errors import InputError, Interrupted, ModelError, SamplerError, WeightsError
from sdrt.pipelines.images import to_mask, to_rgb
from sdrt.pipelines.progress import ProgressBar

PROMPT = "a photo of a red cat"


@pytest.fixture(scope="module")
def sd15():
    pipe = pipelines.load(DATA / "tiny-sd15", backend=fast_backend())
    yield pipe
    pipe.close()


@pytest.fixture(scope="module")
def init() -> np.ndarray:
    return refs("tiny-sd15")["init_image"]


# -- settings are checked before any model loads -----------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"width": 65}, InputError, "width 65 is not a multiple of 8"),
    ({"height": 0}, InputError, "height must be an integer >= 8"),
    ({"sampler": "Euler b"}, SamplerError, "unknown sampler 'Euler b'"),
    ({"init_image": "/no/such/image.png"}, InputError, "the init image file does not exist"),
    ({"mask": np.ones((8, 8))}, InputError, "a mask needs an init image"),
    ({"strength": 0.5}, InputError, "strength applies only with an init image"),
    ({"init_image": np.zeros((8, 8, 3), np.uint8), "strength": 1.5}, InputError, r"strength must be in \(0, 1\]"),
    ({"init_image": np.zeros((8, 8, 3), np.uint8), "strength": True}, InputError, r"strength must be in \(0, 1\]"),
    ({"init_image": np.zeros((8, 8, 3), np.uint8), "strength": 0.1, "steps": 4}, InputError, "leaves no step"),
    ({"steps": 0}, InputError, "steps must be an integer >= 1"),
    ({"batch": 0}, InputError, "batch must be an integer >= 1"),
    ({"cfg": math.nan}, InputError, "cfg must be a finite number"),
    ({"seed": "7"}, InputError, "seed must be an integer"),
    ({"clip_skip": 0}, InputError, "clip_skip must be an integer >= 1"),
    # sane upper bounds, shared with the CLI and the server (sdrt.pipelines.bounds)
    ({"steps": 10**11}, InputError, "steps 100000000000 is above the limit of 10000"),
    ({"steps": 10**22}, InputError, "steps 10000000000000000000000 is above the limit of 10000"),
    ({"batch": 10**10}, InputError, "batch 10000000000 is above the limit of 256"),
    ({"batch_count": 10**10}, InputError, "batch_count 10000000000 is above the limit of 10000"),
    ({"width": 10**6}, InputError, "width 1000000 is above the limit of 16384"),
    ({"cfg": 1e308}, InputError, "cfg must be a finite number from 0 to 100, got 1e"),
    # T5's length: 10**6 reached OpenVINO's compile (bad_alloc) after planning 22 TiB of activations
    ({"max_sequence_length": 10**6}, InputError, "max_sequence_length 1000000 is above the limit of 512"),
    ({"seed": 2**64}, SamplerError, "seed 18446744073709551616 is out of range"),
])
def test_bad_settings_fail_before_loading(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        pipelines.validate(PROMPT, **kwargs)


def test_non_string_prompt() -> None:
    with pytest.raises(InputError, match="the prompt must be a string"):
        pipelines.validate(["a", "b"])  # type: ignore[arg-type]


@pytest.mark.parametrize(("prompt", "negative", "message"), [
    ("caf\udce9 red circle", "", r"the prompt is not UTF-8 text: byte 0xe9 at byte 3 \(read as U\+DCE9\)\. Where: prompt\."),
    ("x", "\udcff", r"the negative prompt is not UTF-8 text: byte 0xff at byte 0 \(read as U\+DCFF\)\. Where: negative_prompt\."),
    ("é \ud800", "", r"the prompt holds a lone surrogate U\+D800 at character 2"),
])
def test_a_prompt_that_is_not_text_fails_before_loading(prompt: str, negative: str, message: str) -> None:
    """Bytes that were not UTF-8 on a command line (Python decodes them to surrogates) or a lone surrogate from
    JSON would fail only when the PNG's infotext is written, after the whole generation."""
    with pytest.raises(InputError, match=message):
        pipelines.validate(prompt, negative)


def test_load_checks_the_backend_name_first(tmp_path) -> None:
    from sdrt.errors import UnknownBackendError

    with pytest.raises(UnknownBackendError):
        pipelines.load(tmp_path / "missing", backend="no-such-backend")


# -- generation ----------------------------------------------------------------------------------------------------
def test_callback_gets_every_step(sd15) -> None:
    seen = []
    gen = sd15.generate(PROMPT, steps=3, sampler="Euler", seed=1, callback=lambda i, n, x: seen.append((i, n, x.shape)))
    assert seen == [(1, 3, (1, 4, 8, 8)), (2, 3, (1, 4, 8, 8)), (3, 3, (1, 4, 8, 8))]
    assert gen.images[0].shape == (64, 64, 3) and gen.images[0].dtype == np.uint8
    assert gen.seeds == [1]


def test_cfg_one_runs_the_unet_once_per_step_at_batch_one(sd15) -> None:
    sd15.unet.close()
    sd15(PROMPT, steps=2, cfg=1.0, seed=1)
    shapes = {dict(dims)["sample"] for dims, _ in sd15.unet.sessions}
    assert shapes == {(1, 4, 8, 8)}


def test_same_seed_same_image_other_seed_other_image(sd15) -> None:
    a = sd15(PROMPT, steps=2, seed=3)[0]
    b = sd15(PROMPT, steps=2, seed=3)[0]
    c = sd15(PROMPT, steps=2, seed=4)[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_batch_count_continues_with_the_next_seed(sd15) -> None:
    gen = sd15.generate(PROMPT, steps=2, seed=10, batch_count=2, sampler="Euler a")
    assert gen.seeds == [10, 11]
    assert np.array_equal(gen.images[1], sd15(PROMPT, steps=2, seed=11, sampler="Euler a")[0])
    assert [s["Seed"] for s in gen.settings] == [10, 11]


def test_a_batch_reports_its_seed_and_position(sd15) -> None:
    """rng="cpu" draws the batch from one stream: both images report the seed, the settings their position,
    and the same seed and batch give image 2 again (docs/pipelines.md)."""
    gen = sd15.generate(PROMPT, steps=2, seed=5, batch=2, sampler="Euler a")
    assert gen.seeds == [5, 5] and not np.array_equal(gen.images[0], gen.images[1])
    assert [(s["Seed"], s["Batch size"], s["Batch pos"]) for s in gen.settings] == [(5, 2, 0), (5, 2, 1)]
    assert np.array_equal(sd15(PROMPT, steps=2, seed=5, batch=2, sampler="Euler a")[1], gen.images[1])


def test_long_prompt_is_encoded_in_chunks(sd15) -> None:
    long = ", ".join(["a red cat on a wooden table"] * 14)  # well past 75 tokens
    cond, uncond = sd15._conditioning(pipelines.validate(long, "blurry"))
    assert cond.chunks >= 2 and cond.hidden.shape == (1, 77 * cond.chunks, 32)
    assert uncond is not None and uncond.hidden.shape == cond.hidden.shape  # the short negative is padded
    assert sd15(long, "blurry", steps=1, seed=1)[0].shape == (64, 64, 3)


def test_emphasis_changes_the_image_and_weight_one_does_not(sd15) -> None:
    plain = sd15("a red cat", steps=2, seed=2)[0]
    assert np.array_equal(sd15("a (red:1.0) cat", steps=2, seed=2)[0], plain)
    assert not np.array_equal(sd15("a (red:1.6) cat", steps=2, seed=2)[0], plain)


def test_emphasis_restores_the_mean(sd15) -> None:
    cond = sd15.prompts.encode("a (red:1.5) cat")
    plain = sd15.prompts.encode("a red cat")
    assert cond.hidden.mean() == pytest.approx(plain.hidden.mean(), rel=1e-5)


def test_clip_skip_deeper_than_the_encoder(sd15) -> None:
    with pytest.raises(ModelError, match="clip_skip=9 asks for layer 9 from the end.* has 4 hidden states: its "
                                         "largest clip skip is 4"):
        sd15(PROMPT, steps=1, clip_skip=9)


@pytest.mark.parametrize("sampler", ["Heun", "LMS", "DPM++ SDE Karras", "DPM++ 2M SDE", "UniPC", "Euler a Karras",
                                     "Euler Karras", "DPM++ 2M", "DDIM", "DPM2 a", "DPM fast", "DPM adaptive",
                                     "PLMS"])
def test_every_sampler_family_runs(sd15, sampler: str) -> None:
    a = sd15(PROMPT, steps=3, seed=5, sampler=sampler)[0]
    assert a.shape == (64, 64, 3)
    assert np.array_equal(a, sd15(PROMPT, steps=3, seed=5, sampler=sampler)[0])


def test_dpm_fast_and_adaptive_progress_and_interrupt(sd15) -> None:
    """Their steps are model calls (fast) or a share of the sigma range (adaptive): the callback still counts up
    to the steps asked for, and returning False stops the run."""
    seen = []
    gen = sd15.generate(PROMPT, steps=6, sampler="DPM fast", seed=1, callback=lambda i, n, x: seen.append((i, n)))
    assert seen == [(3, 6), (5, 6), (6, 6)]  # orders 3, 2, 1: six model calls
    assert gen.settings[0]["Sampler"] == "DPM fast" and gen.settings[0]["Steps"] == 6
    seen.clear()
    sd15.generate(PROMPT, steps=6, sampler="DPM adaptive", seed=1, callback=lambda i, n, x: seen.append((i, n)))
    steps = [i for i, _ in seen]
    assert steps == sorted(steps) and steps[-1] == 6 and {n for _, n in seen} == {6}
    assert sd15.preview() is None  # outside a step; a step's preview is the denoised estimate (below)
    previews = []
    with pytest.raises(Interrupted, match="after step 1 of 6"):
        sd15.generate(PROMPT, steps=6, sampler="DPM adaptive", seed=1,
                      callback=lambda i, n, x: previews.append(sd15.preview()) or False)
    assert len(previews) == 1 and previews[0].shape[-1] == 3


def test_dpm_fast_and_adaptive_run_on_the_model_range_in_txt2img(sd15, init) -> None:
    """A1111's txt2img passes the model's sigma range; img2img the cut schedule's ends (the samplers' default)."""
    for sampler in ("DPM fast", "DPM adaptive"):
        s = pipelines.validate(PROMPT, steps=6, sampler=sampler, width=64, height=64)
        ms = sd15.family.model_sampling(64, 64)
        loop = sd15._loop(s, ms, None, 1)
        assert (loop.options["sigma_min"], loop.options["sigma_max"]) == (ms.sigma_min, ms.sigma_max)
        assert loop.options["eta"] == 1.0  # A1111's "Eta for k-diffusion samplers"
        s = pipelines.validate(PROMPT, steps=6, sampler=sampler, init_image=init, strength=0.5, width=64, height=64)
        loop = sd15._loop(s, ms, None, 1)
        assert "sigma_min" not in loop.options and len(loop.sigmas) == 4


def test_comfyui_dpmpp_2m_sde_heun_takes_the_brownian_noise_of_its_a1111_label(sd15) -> None:
    """The built-in dpmpp_2m_sde_heun is a functools.partial: it got the per-step generator noise, not the
    Brownian tree that the A1111 label's dpmpp_2m_sde (solver_type heun) gets."""
    a = sd15(PROMPT, steps=3, seed=5, sampler="dpmpp_2m_sde_heun", schedule="exponential")[0]
    assert np.array_equal(a, sd15(PROMPT, steps=3, seed=5, sampler="DPM++ 2M SDE Heun")[0])


def test_comfyui_sampler_and_scheduler_names(sd15) -> None:
    a = sd15(PROMPT, steps=3, seed=5, sampler="dpmpp_2m", schedule="karras")[0]
    assert np.array_equal(a, sd15(PROMPT, steps=3, seed=5, sampler="DPM++ 2M Karras")[0])
    with pytest.raises(SamplerError, match="unknown schedule"):
        pipelines.validate(PROMPT, sampler="euler", schedule="wobbly")


def test_inpainting_with_a_k_diffusion_sampler_keeps_the_unmasked_part(sd15, init) -> None:
    mask = refs("tiny-sd15")["mask"]
    out = sd15(PROMPT, steps=3, seed=5, sampler="Heun", init_image=init, mask=mask)[0].astype(int)
    full = sd15(PROMPT, steps=3, seed=5, sampler="Heun")[0].astype(int)
    keep = mask == 0
    # the unmasked part comes back through the VAE (not pasted), so it follows the init image, not the noise
    assert np.abs(out[keep] - init[keep].astype(int)).mean() < np.abs(full[keep] - init[keep].astype(int)).mean()


def test_pillow_images_equal_arrays(sd15, init) -> None:
    pil = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency (sdrt[images] extra)")
    a = sd15(PROMPT, steps=2, seed=6, init_image=init, strength=0.5)[0]
    b = sd15(PROMPT, steps=2, seed=6, init_image=pil.fromarray(init), strength=0.5)[0]
    assert np.array_equal(a, b)


def test_an_init_image_of_another_size_meets_a_fixed_size_model(sd15, init, caplog) -> None:
    """A fixed 64x64 export: a 100x70 picture with no size runs at 64x64, fitted and said once (it was refused:
    "not a multiple of 8"); a size the model cannot make is the size's error, not the picture's."""
    pil = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency (sdrt[images] extra)")
    odd = np.asarray(pil.fromarray(init).resize((100, 70)))
    with caplog.at_level("WARNING", logger="sdrt.pipelines"):
        gen = sd15.generate(PROMPT, steps=2, seed=1, init_image=odd, strength=0.5)
    assert gen.images[0].shape == (64, 64, 3) and gen.settings[0]["Size"] == "64x64"
    said = [r.getMessage() for r in caplog.records if "init image" in r.getMessage()]
    assert said == ["the init image is 100x70 and this model makes 64x64 images only: Just Resize fits it "
                    "(stretched to the size)"], said
    with pytest.raises(InputError, match="this model makes 64x64 images only") as err:
        sd15(PROMPT, steps=2, init_image=init, width=128)
    assert err.value.where == "width"


def test_mask_size_must_match(sd15, init) -> None:
    with pytest.raises(InputError, match="the mask is 32x32, the init image 64x64") as err:
        sd15(PROMPT, steps=2, init_image=init, mask=np.ones((32, 32), np.uint8), width=64, height=64)
    assert err.value.where == "mask"


def test_nine_channel_unet_needs_a_mask() -> None:
    register("reference")
    pipe = pipelines.load(DATA / "tiny-sd15-inpaint", backend="reference")
    with pytest.raises(InputError, match="inpainting UNet"):
        pipe(PROMPT, steps=1, width=64, height=64)


def test_sdxl_empty_negative_is_zeros_when_the_folder_says_so() -> None:
    register("reference")
    pipe = pipelines.load(DATA / "tiny-sdxl", backend="reference")
    cond, uncond = pipe._conditioning(pipelines.validate(PROMPT))
    assert uncond is not None and not uncond.hidden.any() and not uncond.pooled.any()
    assert cond.hidden.shape == (1, 77, 64) and cond.pooled.shape == (1, 32)
    _, neg = pipe._conditioning(pipelines.validate(PROMPT, "blurry"))
    assert neg is not None and neg.hidden.any()


def test_parts_are_reachable_for_weight_updates(sd15) -> None:
    sd15(PROMPT, steps=1, seed=1)
    assert set(sd15.parts) == {"text_encoder", "unet", "vae_encoder", "vae_decoder"}
    assert sd15.unet.sessions and sd15.unet.graph.initializer_names


def test_infotext_settings(sd15, init) -> None:
    gen = sd15.generate(PROMPT, steps=4, cfg=5.5, seed=9, sampler="Euler a", init_image=init, strength=0.5,
                        clip_skip=2, batch=2)
    info = gen.settings[1]
    assert info["Sampler"] == "Euler a" and info["Schedule type"] == "Uniform"
    assert info["CFG scale"] == 5.5 and info["Seed"] == 9 and info["Size"] == "64x64"
    assert info["Denoising strength"] == 0.5 and info["Clip skip"] == 2
    assert info["Batch size"] == 2 and info["Batch pos"] == 1 and info["Model"] == "tiny-sd15"
    assert len(str(info["Model hash"])) == 10


# -- images --------------------------------------------------------------------------------------------------------
def test_image_conversions() -> None:
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8)
    assert to_rgb(gray).shape == (8, 8, 3)
    rgba = np.zeros((8, 8, 4), np.uint8)
    assert to_rgb(rgba).shape == (8, 8, 3)
    assert to_rgb(np.full((8, 8, 3), 0.5, np.float32))[0, 0, 0] == 128
    assert to_mask(np.eye(8, dtype=bool), 8, 8).sum() == 8
    assert to_mask(np.full((8, 8, 3), 200, np.uint8), 8, 8).all()


@pytest.mark.parametrize(("value", "message"), [
    (np.zeros((8, 8, 2), np.uint8), "has shape"),
    (np.zeros((8, 8, 3), np.int32) + 300, "outside 0..255"),
    (np.full((8, 8, 3), np.nan, np.float32), "NaN"),
    (np.full((8, 8, 3), 200.0, np.float32), "float values run from 200 to 200; a float image takes 0..1"),
    (np.full((8, 8, 3), -5.0, np.float64), "float values run from -5 to -5"),
    (np.zeros((8, 8, 3), np.complex64), "dtype complex64"),
    (np.zeros((8, 8, 3), bool), "is a bool array.*uint8 values 0..255 or float values 0..1"),
    # a torch tensor's layouts (tensor.numpy()): said how to turn them into HxWxC
    (np.zeros((3, 8, 8), np.uint8), r"has shape \(3, 8, 8\); it looks channels-first \(CxHxW\): pass "
                                    r"arr.transpose\(1, 2, 0\)"),
    (np.zeros((1, 8, 8, 3), np.uint8), r"has shape \(1, 8, 8, 3\); it has a batch axis: pass one image, arr\[0\]"),
])
def test_bad_images(value: np.ndarray, message: str) -> None:
    with pytest.raises(InputError, match=message):
        to_rgb(value)


def test_unreadable_image_file(tmp_path) -> None:
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(InputError, match="cannot read the init image"):
        to_rgb(bad)



@pytest.mark.parametrize(("kwargs", "where", "message"), [
    # numpy numbers are numbers: steps=np.int64(2) passed and cfg=np.int64(7) was "not a finite number"
    ({"cfg": np.int64(7)}, None, None),
    ({"init_image": np.zeros((64, 64, 3), np.uint8), "strength": np.int64(1)}, None, None),
    ({"init_image": np.zeros((64, 64, 3), np.uint8), "strength": np.float32(0.5)}, None, None),
    ({"cfg": np.bool_(True)}, "cfg", "cfg must be a finite number"),
    # a schedule that is no name was an AttributeError from the samplers' name folding
    ({"sampler": "Euler", "schedule": 5}, "schedule", "schedule must be a schedule's name, got int 5"),
    # nested lists numpy cannot make one array of were a ValueError from np.asarray
    ({"init_image": [[1, 2], [3]]}, "init_image", "the init image is not an image array"),
    ({"init_image": np.zeros((64, 64, 3), np.uint8), "mask": [[1, 2], [3]]}, "mask", "the mask is not an image array"),
    # errors about the init image name the keyword, not the label
    ({"init_image": np.zeros((3, 64, 64), np.uint8)}, "init_image", r"the init image has shape \(3, 64, 64\)"),
    ({"init_image": np.full((64, 64, 3), 255.0)}, "init_image", "float values run from 255 to 255"),
    # a bytes path is a path (as open() takes it), not a 0-d array "of shape ()"
    # (and its errors name the keyword before the path: "Where: init_image /no/such/image.png", the flag on the CLI)
    ({"init_image": b"/no/such/image.png"}, "{@init_image} /no/such/image.png", "the init image file does not exist"),
    ({"init_image": np.zeros((64, 64, 3), np.uint8), "mask": b"/no/such/mask.png"}, "{@mask} /no/such/mask.png",
     "the mask file does not exist"),
])
def test_arguments_as_an_app_passes_them(sd15, kwargs: dict, where: str | None, message: str | None) -> None:
    if message is None:
        assert sd15.generate(PROMPT, steps=2, seed=1, **kwargs).images[0].shape == (64, 64, 3)
        return
    with pytest.raises(InputError, match=message) as info:
        sd15.generate(PROMPT, steps=2, seed=1, **kwargs)
    assert info.value.where == where


def test_a_bytes_path_reads_the_image(sd15, init, tmp_path) -> None:
    pytest.importorskip("PIL")
    from sdrt.pipelines.png import write_png

    path = tmp_path / "init.png"
    write_png(path, init, "")
    want = sd15(PROMPT, steps=2, seed=1, init_image=init, strength=0.5)[0]
    assert sd15(PROMPT, steps=2, seed=1, init_image=bytes(path), strength=0.5)[0].tobytes() == want.tobytes()


@pytest.mark.parametrize(("call", "error", "message"), [
    # load_weights(None) was a TypeError from pathlib
    (lambda p: p.load_weights(None), InputError, "the checkpoint must be a file path .* got NoneType None"),
    (lambda p: p.load_weights(b"/x.safetensors"), InputError, "the checkpoint must be a file path .* got bytes"),
    # the text '1' was read as the scale 1.0
    (lambda p: p.set_loras([(DATA.parent / "ckpt" / "pipe-sd15" / "tinylora.safetensors", "1")]), WeightsError,
     "the scale of LoRA 'tinylora' is str '1', not a number"),
])
def test_weight_calls_refuse_what_is_no_path_or_number(sd15, call, error, message) -> None:
    with pytest.raises(error, match=message):
        call(sd15)
    assert not sd15.weights.loras


@pytest.mark.parametrize(("kwargs", "setting"), [
    ({"memory": np.int64(2**33)}, ("memory", 2**33)),  # was "cannot read the memory size np.int64(8589934592)"
    ({"low_memory": np.bool_(False)}, ("low_memory", False)),  # was "must be True or False, got bool np.False_"
])
def test_load_takes_numpy_scalars(kwargs: dict, setting: tuple) -> None:
    with pipelines.load(DATA / "tiny-sdxl-dyn", backend=fast_backend(), **kwargs) as pipe:
        assert getattr(pipe, setting[0]) == setting[1] and type(getattr(pipe, setting[0])) is type(setting[1])


def test_load_takes_a_numpy_vae_tile() -> None:
    with pipelines.load(DATA / "tiny-sdxl-dyn", backend=fast_backend(), vae_tile=np.int64(8)) as pipe:
        assert pipe.vae_tile == 8 and type(pipe.vae_tile) is int  # was "vae_tile must be an int ..., got int64"


@pytest.mark.parametrize("upscale", [0, -1, 2.5, "x", None, 10**6])
def test_preview_upscale_is_checked(sd15, upscale) -> None:
    """preview(upscale=2.5) ran as 2, 'x' and None were TypeErrors from numpy, 10**6 a MemoryError."""
    said = []

    def callback(i: int, n: int, x: np.ndarray) -> None:
        with pytest.raises(InputError, match="upscale must be a whole number from 1 to 64") as info:
            sd15.preview(upscale=upscale)
        said.append(info.value.where)

    sd15.generate(PROMPT, steps=1, seed=1, callback=callback)
    assert said == ["upscale"]


def test_a_callback_that_cannot_take_the_step_arguments_fails_before_the_job(sd15) -> None:
    """It was a TypeError from inside the sampling loop, after the first step had run."""
    with pytest.raises(InputError, match=r"callback must take three arguments \(step, total, latents\), and its "
                       r"signature is \(step\)") as info:
        sd15.generate(PROMPT, steps=1, callback=lambda step: None)
    assert info.value.where == "callback"
    assert sd15.generate(PROMPT, steps=1, seed=1, callback=lambda *args: None).images  # any that binds runs
    assert sd15.generate(PROMPT, steps=1, seed=1, callback=print).images  # a builtin has no signature to check


def test_numpy_sizes_give_plain_data() -> None:
    """validate kept width=np.int64(64) as it came, and the run plan's to_dict() could not be written as JSON."""
    import json

    s = pipelines.validate(PROMPT, width=np.int64(64), height=np.int32(64), steps=np.int64(2))
    assert (type(s.width), type(s.height), type(s.steps)) == (int, int, int)
    with pipelines.load(DATA / "tiny-sdxl-dyn", backend=fast_backend()) as pipe:
        json.dumps(pipe.plan(PROMPT, steps=np.int64(2), width=np.int64(64), height=np.int64(64)).to_dict())


@pytest.mark.parametrize(("key", "hint"), [
    ("guidance_scale", "pass cfg (classifier-free guidance; for Flux dev's distilled guidance, guidance) instead"),
    ("num_inference_steps", "pass steps instead"),  # was "did you mean hires_steps?"
    ("cfg_scale", "pass cfg instead"),  # was "did you mean hires_scale?"
    ("negative", "pass negative_prompt instead"),  # negative_prompt was not among the arguments listed
    ("n_iter", "pass batch_count instead"),
    ("stpes", "did you mean steps?"),
])
def test_other_libraries_argument_names_are_pointed_to_ours(key: str, hint: str) -> None:
    with pytest.raises(InputError) as info:
        pipelines.validate(PROMPT, **{key: 1})
    assert info.value.where == key and info.value.fix.startswith(hint)
    assert "the arguments are prompt, negative_prompt, steps, cfg" in info.value.fix


@pytest.mark.parametrize("weights", ["lora", "embedding"])
def test_a_pipeline_with_weights_is_freed_when_dropped(weights: str) -> None:
    """Its WeightState referred back to the pipeline: a cycle, so a pipeline an app dropped without close() kept its
    compiled sessions until the cyclic garbage collector happened to run."""
    import gc
    import weakref

    files = DATA.parent / "ckpt" / "pipe-sd15"
    enabled = gc.isenabled()
    gc.disable()
    try:
        pipe = pipelines.load(DATA / "tiny-sd15", backend=fast_backend())
        if weights == "lora":
            pipe.set_loras([(files / "tinylora.safetensors", 0.5)])
        else:
            pipe.add_embedding(files / "tinyemb.safetensors")
        pipe("a tinyemb cat", steps=1, seed=1)
        ref, unet = weakref.ref(pipe), weakref.ref(pipe.unet)
        del pipe
        assert ref() is None and unet() is None
    finally:
        if enabled:
            gc.enable()

# -- progress ------------------------------------------------------------------------------------------------------
class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_tty_only() -> None:
    tty, pipe = _Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = ProgressBar(stream)
        for i in range(1, 4):
            bar(i, 3)
        bar.close()
    assert "3/3" in tty.getvalue() and tty.getvalue().endswith("\n")
    assert pipe.getvalue() == ""


def test_a_tokenizer_that_does_not_fit_the_text_encoder(tmp_path) -> None:
    import shutil

    register("reference")
    folder = tmp_path / "mixed"
    shutil.copytree(DATA / "tiny-sd15", folder)
    shutil.rmtree(folder / "tokenizer")
    clip = DATA.parent / "clip-tokenizer"
    (folder / "tokenizer").mkdir()
    for f in clip.iterdir():
        if f.is_file():
            shutil.copy(f, folder / "tokenizer" / f.name)
    pipe = pipelines.load(folder, backend="reference")
    with pytest.raises(ModelError, match="token embedding has 1514 rows"):
        pipe("a photograph of a cathedral", steps=1)


def test_update_weights_reaches_compiled_and_later_sessions() -> None:
    from sdrt import Weights

    register("reference")
    pipe = pipelines.load(DATA / "tiny-sd15", backend="reference")
    pipe(PROMPT, steps=1, seed=1)
    graph = pipe.vae_decoder.graph
    arrays = graph.initializer_arrays(["vae.decoder.conv_out.weight", "vae.decoder.conv_out.bias"])
    pipe.vae_decoder.update_weights(Weights.from_arrays({k: np.zeros_like(v) for k, v in arrays.items()}))
    # the decoder now outputs 0 everywhere, i.e. mid gray, in the compiled (batch 1) session ...
    assert (pipe(PROMPT, steps=1, seed=1)[0] == 128).all()
    # ... and in one compiled after the update (batch 2)
    assert all((img == 128).all() for img in pipe(PROMPT, steps=1, seed=1, batch=2))


def test_update_weights_on_a_text_encoder_cut_to_one_output() -> None:
    from sdrt import Weights

    register("reference")
    pipe = pipelines.load(DATA / "tiny-sd15", backend="reference")
    before = pipe.prompts.encode("a cat").hidden
    names = [n for n in pipe.text_encoder.graph.initializer_names if n.endswith("final_layer_norm.bias")]
    pipe.text_encoder.update_weights(Weights.from_arrays({names[0]: np.full(32, 3.0, np.float32)}))
    pipe.prompts._cache.clear()
    after = pipe.prompts.encode("a cat").hidden
    assert after.mean() == pytest.approx(3.0, abs=0.5)  # the final norm now adds 3 to every feature
    assert not np.allclose(after, before)


def test_every_sampler_and_schedule_by_its_comfyui_name() -> None:
    from sdrt.samplers import available_samplers, available_schedules

    pipe = pipelines.load(DATA / "tiny-sd15", backend=fast_backend())
    try:
        for sampler in available_samplers():
            img = pipe(PROMPT, steps=3, cfg=1.0, seed=1, sampler=sampler)[0]
            assert img.shape == (64, 64, 3), sampler
        for schedule in available_schedules():
            img = pipe(PROMPT, steps=3, cfg=1.0, seed=1, sampler="euler", schedule=schedule)[0]
            assert img.shape == (64, 64, 3), schedule
    finally:
        pipe.close()


def test_compile_cache_entries_are_written_after_the_job(tmp_path, monkeypatch, caplog) -> None:
    """A job's bf16 compiles store their cache entries after it (sdrt.cache.deferred): none is written while its
    steps run, each part's is there once the stores are waited for, and a new pipeline loads every part from them.
    A float32 job stores as it compiles (its blobs are the model's full size)."""
    import logging

    from sdrt.cache import wait_for_stores

    register("openvino")
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))

    def entries() -> list:
        found = (tmp_path / "compiled" / "openvino").glob("*/model.blob")
        return sorted(p for p in found if not p.parent.name.startswith("."))

    seen: list[int] = []
    pipe = pipelines.load(DATA / "tiny-sd15", backend="openvino", precision="bf16")
    first = pipe.generate(PROMPT, steps=2, sampler="Euler", seed=1, callback=lambda i, n, x: seen.append(len(entries())))
    assert seen == [0, 0]
    assert wait_for_stores(timeout=120)
    assert len(entries()) >= 3  # text encoder, UNet, VAE decoder
    from sdrt.cache import CompileCache

    # each entry says what it holds in the model's words (``sdrt cache list``), not the file name every part shares
    named = {e.meta.get("model") for e in CompileCache("openvino", tmp_path).entries()}
    assert {"tiny-sd15/text_encoder", "tiny-sd15/unet", "tiny-sd15/vae_decoder"} <= named, named
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    again = pipelines.load(DATA / "tiny-sd15", backend="openvino", precision="bf16")
    second = again.generate(PROMPT, steps=2, sampler="Euler", seed=1)
    assert sum("from the compile cache" in r.getMessage() for r in caplog.records) == len(entries())
    np.testing.assert_array_equal(np.asarray(first.images[0]), np.asarray(second.images[0]))
    held = len(entries())
    f32, seen = pipelines.load(DATA / "tiny-sd15", backend="openvino", precision="fp32"), []
    f32.generate(PROMPT, steps=2, sampler="Euler", seed=1, callback=lambda i, n, x: seen.append(len(entries())))
    assert seen[0] >= held + 2  # the text encoder's and the UNet's, before the first step ended
    for p in (pipe, again, f32):
        p.close()


def test_stores_wait_for_the_job_only_with_room_beside_the_plans_peak() -> None:
    """A store written after the job holds its entry in memory (about the part's weights) while it writes: the job
    holds its stores only when every part stays resident and the budget has room for the largest part's weights
    beside the plan's peak; otherwise each compile stores as it compiles."""
    import contextlib

    from sdrt.pipelines.budget import MemoryPlan, Placement

    pipe = pipelines.load(DATA / "tiny-sd15", backend=fast_backend())

    def plan(budget, placement="resident"):
        return MemoryPlan(budget_bytes=budget, budget_source="memory=", base_bytes=100, footprint=1.0,
                          parts=[Placement("text_encoder", "resident", 200, 300),
                                 Placement("unet", placement, 600, 900)])

    held = []
    for budget, placement in ((None, "resident"), (1500, "resident"), (1499, "resident"), (10**9, "released")):
        pipe._memory_plan = plan(budget, placement)
        held.append(not isinstance(pipe._stores_after_job(), contextlib.nullcontext))
    assert held == [True, True, False, False]
    pipe.close()


# -- load's own arguments are checked at load, in its words --------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"foo": 1}, r"load\(\) takes no keyword foo\. Where: foo\. .*load's own keywords are backend, .*quantize; "
                 r"the \w+ backend"),
    ({"lora": "/nonexist"}, r"no keyword lora\..*pipe\.set_loras\(\[\(path, scale\)\]\)"),
    ({"embeddings": ["a.pt"]}, r"no keyword embeddings\..*pipe\.add_embedding\(path\)"),
    ({"lowmemory": True}, "did you mean low_memory= for lowmemory="),
    ({"quantize": "int3"}, r"unknown weight quantization 'int3'\. Where: quantize\."),
    ({"quantize": 8}, "quantize must be a name, got int 8"),
    ({"low_memory": "yes"}, r"low_memory must be True or False or None, got str 'yes'\. Where: low_memory\."),
    ({"share_blocks": "maybe"}, r"share_blocks must be True or False, got str 'maybe'\. Where: share_blocks\."),
    ({"vae_tile": "abc"}, r"vae_tile must be an int of 8 or more .*got str 'abc'\. Where: vae_tile\."),
    ({"vae_tile": -3}, "vae_tile must be an int of 8 or more"),
    ({"vae_tile": True}, "got bool True"),
    ({"vae_tile": 0}, "got int 0"),
    ({"vae_tile": 8}, r"vae_tile=8 needs a VAE with dynamic height and width, and this model's vae_decoder is "
                      r"exported for 8x8 only\. Where: vae_tile\."),
    ({"text_encoders": 5}, r"text_encoders must be a list of file paths, got int 5\. Where: text_encoders\."),
    ({"text_encoders": [None]}, r"text_encoders\[0\] must be a file path, got NoneType"),
    ({"vae": 5}, r"vae must be a file path, got int 5\. Where: vae\."),
])
def test_load_refuses_bad_arguments_at_load(kwargs, message) -> None:
    with pytest.raises(InputError, match=message) as exc:
        pipelines.load(pipelines.DEMO_MODEL, backend=fast_backend(), **kwargs)
    assert "\n" not in str(exc.value)


def test_load_takes_its_own_and_the_backends_options() -> None:
    pipe = pipelines.load(pipelines.DEMO_MODEL, backend=fast_backend(), low_memory=None, share_blocks=True, quantize="int8", vae_tile=None)
    assert pipe.low_memory is None and pipe.share_blocks and pipe.quantize == "int8"
    pipe.close()


def test_vae_tile_on_a_vae_with_dynamic_axes() -> None:
    with pipelines.load(DATA / "tiny-sdxl-dyn", backend=fast_backend(), vae_tile=8) as pipe:
        assert pipe.generate(PROMPT, steps=1, width=128, height=128, seed=1).images[0].shape == (128, 128, 3)


@pytest.mark.parametrize(("call", "message"), [
    (lambda p: p.set_loras("foo"), r"loras must be a list of \(path, scale\) pairs, got str 'foo'\. Where: loras\."),
    (lambda p: p.set_loras([("x",)]), r"loras\[0\] must be a \(path, scale\) pair, got tuple"),
    (lambda p: p.set_loras(None), "loras must be a list of .* got NoneType"),
    (lambda p: p.add_embedding(5), r"an embedding must be a file path or an sdrt\.checkpoint\.Embedding, got int 5"),
])
def test_weight_calls_refuse_bad_arguments(call, message) -> None:
    pipe = pipelines.load(pipelines.DEMO_MODEL, backend=fast_backend())
    with pytest.raises(InputError, match=message):
        call(pipe)
    pipe.set_loras([])  # the empty list stays the way to remove them
    pipe.close()


def test_a_negative_prompt_cfg_1_does_not_use_is_said(sd15, caplog) -> None:
    """CFG 1 runs the prompt alone (diffusers and A1111 skip the negative pass): a negative prompt then did nothing,
    in silence (Flux's default CFG is 1, so `--negative` on Flux dev was always dropped so)."""
    with caplog.at_level("WARNING", logger="sdrt.pipelines"):
        plain = sd15(PROMPT, "blurry", steps=2, seed=1, cfg=1)[0]
        quiet = [r.getMessage() for r in caplog.records if "negative prompt" in r.getMessage()]
        assert quiet == ["the negative prompt is not used: CFG 1 runs one pass, with the prompt only (a CFG above 1 "
                         "runs the negative pass)"]
        caplog.clear()
        assert np.array_equal(plain, sd15(PROMPT, "", steps=2, seed=1, cfg=1)[0])  # the same image: unused
        sd15(PROMPT, "blurry", steps=2, seed=1, cfg=7)
    assert not [r for r in caplog.records if "negative prompt" in r.getMessage()]


def test_a_flow_side_under_16_is_told_16_not_0() -> None:
    """width 8 on Flux: "use 0 or 16" offered a width of 0."""
    register("reference")
    with pipelines.load(DATA / "tiny-flux-dev", backend="reference") as pipe:
        with pytest.raises(InputError, match=r"width 8 is not a multiple of 16") as err:
            pipe.plan(PROMPT, steps=1, width=8, height=16)
        assert err.value.fix == "use 16"
        with pytest.raises(InputError, match=r"width 40 is not a multiple of 16") as err:
            pipe.plan(PROMPT, steps=1, width=40, height=16)
        assert err.value.fix == "use 32 or 48"
