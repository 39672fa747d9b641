"""Init images (and masks) of any size: fitted to the run's size as A1111's img2img resize modes fit them
(``sdrt.pipelines.images.fit_image``), or kept at their own size rounded down to the family's multiple as diffusers'
``VaeImageProcessor`` does, and said in one line."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend, refs, register

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines.images import (
    CROP_AND_RESIZE,
    JUST_RESIZE,
    LATENT_UPSCALE,
    RESIZE_AND_FILL,
    RESIZE_MODES,
    fit_array,
    resize_mode,
)

Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency (sdrt[images] extra)")
PROMPT = "a photo of a red cat"


def a1111_resize_image(mode: int, im, width: int, height: int):
    """A1111's ``modules/images.py`` ``resize_image`` with no img2img upscaler set (its default), restated from
    its behaviour: float ratios, floored sizes, an RGB canvas, the picture pasted centred (a negative offset
    crops it) and, for mode 2, each bar filled by resampling a zero-height (or zero-width) box at the picture's
    edge with Pillow's default filter."""
    lanczos = Image.Resampling.LANCZOS
    if mode == 0:
        return im.resize((width, height), resample=lanczos)
    ratio, src_ratio = width / height, im.width / im.height
    if mode == 1:
        src_w = width if ratio > src_ratio else im.width * height // im.height
        src_h = height if ratio <= src_ratio else im.height * width // im.width
    else:
        src_w = width if ratio < src_ratio else im.width * height // im.height
        src_h = height if ratio >= src_ratio else im.height * width // im.width
    resized = im.resize((src_w, src_h), resample=lanczos)
    res = Image.new("RGB", (width, height))
    res.paste(resized, box=(width // 2 - src_w // 2, height // 2 - src_h // 2))
    if mode == 2 and ratio < src_ratio:
        fill = height // 2 - src_h // 2
        res.paste(resized.resize((width, fill), box=(0, 0, width, 0)), box=(0, 0))
        res.paste(resized.resize((width, fill), box=(0, resized.height, width, resized.height)),
                  box=(0, fill + src_h))
    elif mode == 2 and ratio > src_ratio:
        fill = width // 2 - src_w // 2
        res.paste(resized.resize((fill, height), box=(0, 0, 0, height)), box=(0, 0))
        res.paste(resized.resize((fill, height), box=(resized.width, 0, resized.width, height)),
                  box=(fill + src_w, 0))
    return res


def _picture(w: int, h: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients with noise on top: every filter tap counts, and edges differ from the middle."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 127 // max(w + h - 2, 1)], -1)
    return np.clip(base + rng.integers(-40, 40, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize(("picture", "target"), [
    ((300, 200), (320, 192)), ((200, 300), (320, 192)), ((300, 200), (192, 320)), ((64, 64), (128, 64)),
    ((64, 64), (64, 128)), ((403, 302), (256, 256)), ((97, 61), (96, 64)), ((64, 32), (128, 64)),
    ((513, 512), (512, 512)), ((33, 700), (512, 64)),
])
def test_fit_equals_a1111_resize_image(mode: int, picture: tuple[int, int], target: tuple[int, int]) -> None:
    rgb = _picture(*picture)
    want = np.asarray(a1111_resize_image(mode, Image.fromarray(rgb), *target))
    got = fit_array(rgb, *target, RESIZE_MODES[mode])
    assert got.shape == (target[1], target[0], 3)
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]
    gray = rgb[..., 1].copy()  # a mask: Pillow's L, as A1111 fits its mask (then read back as grey)
    want_gray = np.asarray(a1111_resize_image(mode, Image.fromarray(gray), *target).convert("L"))
    assert np.array_equal(fit_array(gray, *target, RESIZE_MODES[mode], "mask", "mask"), want_gray)


def test_just_resize_is_pillows_lanczos_and_the_latent_mode_gives_the_same_pixels() -> None:
    rgb = _picture(300, 200)
    want = np.asarray(Image.fromarray(rgb).resize((320, 192), Image.Resampling.LANCZOS))
    assert np.array_equal(fit_array(rgb, 320, 192, JUST_RESIZE), want)
    assert np.array_equal(fit_array(rgb, 320, 192, LATENT_UPSCALE), want)
    assert fit_array(rgb, 300, 200, CROP_AND_RESIZE) is rgb  # its own size: untouched


@pytest.mark.parametrize(("value", "mode"), [
    (None, JUST_RESIZE), ("Just Resize", JUST_RESIZE), ("just resize", JUST_RESIZE), ("JUST_RESIZE", JUST_RESIZE),
    ("crop and resize", CROP_AND_RESIZE), ("crop-and-resize", CROP_AND_RESIZE), ("Resize and fill", RESIZE_AND_FILL),
    ("just resize (latent upscale)", LATENT_UPSCALE), ("Just resize ( latent upscale )", LATENT_UPSCALE),
    (0, JUST_RESIZE), (1, CROP_AND_RESIZE), (np.int64(2), RESIZE_AND_FILL), (3, LATENT_UPSCALE), ("3", LATENT_UPSCALE),
    ("Inner Fit (Scale to Fit)", CROP_AND_RESIZE), ("Envelope (Outer Fit)", RESIZE_AND_FILL),
])
def test_resize_mode_names(value, mode: str) -> None:
    """A1111's img2img labels, sd-webui-controlnet's spelling and aliases, A1111's numbers: one vocabulary."""
    assert resize_mode(value) == mode


@pytest.mark.parametrize("value", ["stretch", 4, -1, True, 1.0, "Just Resize (latent)", ""])
def test_an_unknown_resize_mode_lists_the_modes(value) -> None:
    with pytest.raises(InputError, match="unknown resize mode") as err:
        pipelines.validate(PROMPT, init_image=np.zeros((64, 64, 3), np.uint8), resize_mode=value)
    assert err.value.where == "resize_mode" and "'Crop and Resize'" in str(err.value)


def test_resize_mode_needs_an_init_image() -> None:
    with pytest.raises(InputError, match="resize_mode fits an init image") as err:
        pipelines.validate(PROMPT, resize_mode="Crop and Resize")
    assert err.value.where == "resize_mode"


def test_a_sliver_cropped_to_cover_is_refused_before_it_allocates() -> None:
    with pytest.raises(InputError, match=r"scaled to cover 2048x2048 it would be 2048x2048000") as err:
        fit_array(np.zeros((1000, 1, 3), np.uint8), 2048, 2048, CROP_AND_RESIZE)
    assert err.value.where == "init_image" and "resize_mode='Just Resize'" in str(err.value)


# -- the pipeline fits what it is given --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dyn():
    """SDXL's tiny export with dynamic sizes (its UNet runs at any multiple of 8 pixels)."""
    pipe = pipelines.load(DATA / "tiny-sdxl-dyn", backend=fast_backend())
    yield pipe
    pipe.close()


@pytest.fixture(scope="module")
def init() -> np.ndarray:
    return refs("tiny-sd15")["init_image"]


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("the init image is")]


@pytest.mark.parametrize("mode", [JUST_RESIZE, CROP_AND_RESIZE, RESIZE_AND_FILL])
def test_the_picture_and_its_mask_run_as_fitted(dyn, mode: str, caplog) -> None:
    """A 96x48 picture asked at 64x96: the run equals one given the picture (and mask) fitted beforehand."""
    picture = _picture(96, 48, 1)
    mask = np.zeros((48, 96), np.uint8)
    mask[10:40, 20:70] = 255
    kw = dict(steps=2, seed=3, sampler="Euler", width=64, height=96, strength=0.6)
    with caplog.at_level("WARNING", logger="sdrt.pipelines"):
        got = dyn.generate(PROMPT, init_image=picture, mask=mask, resize_mode=mode, **kw)
    assert _said(caplog) == [f"the init image is 96x48 and 64x96 was asked: {mode} fits it ("
                             + {JUST_RESIZE: "stretched to the size", CROP_AND_RESIZE: "scaled to cover the size, "
                                "the overflow cropped", RESIZE_AND_FILL: "scaled to fit inside the size, its edges "
                                "stretched into the bars"}[mode] + "), and the mask with it"]
    want = dyn(PROMPT, init_image=fit_array(picture, 64, 96, mode), mask=fit_array(mask, 64, 96, mode), **kw)[0]
    assert got.images[0].shape == (96, 64, 3) and np.array_equal(got.images[0], want)
    assert got.settings[0]["Size"] == "64x96" and "Resize mode" not in got.settings[0]  # A1111 records none


@pytest.mark.parametrize("mode", [JUST_RESIZE, RESIZE_AND_FILL, LATENT_UPSCALE])
@pytest.mark.parametrize("size", [(1, 1), (300, 3)])
def test_a_picture_under_8_pixels_a_side_fits_a_size_given(dyn, mode: str, size: tuple[int, int]) -> None:
    """A 1x1 or 300x3 picture with a size given is fitted as any other (A1111 and sdrt serve did; the pipeline
    refused it: "smaller than the smallest image (8x8)", which also stopped serve's resize_mode 3)."""
    kw = dict(steps=2, seed=3, sampler="Euler", strength=0.6, width=64, height=32)
    picture = _picture(*size)
    got = dyn(PROMPT, init_image=picture, resize_mode=mode, **kw)[0]
    assert got.shape == (32, 64, 3)
    if mode != LATENT_UPSCALE:
        assert np.array_equal(got, dyn(PROMPT, init_image=fit_array(picture, 64, 32, mode), **kw)[0])
    with pytest.raises(InputError, match=r"too small to take the run's size from") as err:  # no size: nothing to fit
        dyn.plan(PROMPT, steps=2, init_image=picture)
    assert err.value.where == "init_image"


def test_a_size_not_a_multiple_of_8_rounds_down_as_diffusers_does(dyn, caplog) -> None:
    """diffusers' VaeImageProcessor: no size given, each side down to a multiple of 8, the picture resized
    (Lanczos) to it. It was refused: "not a multiple of 8, crop or resize it to 96x64"."""
    picture = _picture(101, 71, 2)
    with caplog.at_level("WARNING", logger="sdrt.pipelines"):
        got = dyn.generate(PROMPT, steps=2, seed=4, sampler="Euler", init_image=picture, strength=0.5)
    assert _said(caplog) == ["the init image is 101x71 and this model makes sides that are multiples of 8: it runs "
                             "at 96x64; Just Resize fits it "
                             "(stretched to the size)"]  # once: the memory plan's dry run says nothing
    resized = np.asarray(Image.fromarray(picture).resize((96, 64), Image.Resampling.LANCZOS))
    want = dyn(PROMPT, steps=2, seed=4, sampler="Euler", init_image=resized, strength=0.5)[0]
    assert got.settings[0]["Size"] == "96x64" and np.array_equal(got.images[0], want)


def test_one_side_given_keeps_the_pictures_aspect_ratio(dyn, init) -> None:
    wide = np.concatenate([init, init], axis=1)  # 128x64
    plan = dyn.plan(PROMPT, steps=2, init_image=wide, width=64)
    assert (plan.width, plan.height) == (64, 32)
    plan = dyn.plan(PROMPT, steps=2, init_image=wide, height=96)
    assert (plan.width, plan.height) == (192, 96)


def _encoder_sample(plan) -> tuple[int, ...]:
    part = next(p for p in plan.parts if p.part == "vae_encoder")
    return next(shape for sig, _ in part.signatures for name, shape, _ in sig if name == "sample")


def test_latent_upscale_encodes_the_picture_at_its_own_size(dyn, init) -> None:
    """A1111's resize_mode 3: the picture VAE-encoded as it is, its latents resized (bilinear) to the size."""
    plan = dyn.plan(PROMPT, steps=2, init_image=init, width=128, height=96, resize_mode=LATENT_UPSCALE)
    assert _encoder_sample(plan) == (1, 3, 64, 64) and (plan.width, plan.height) == (128, 96)
    plan = dyn.plan(PROMPT, steps=2, init_image=init, width=128, height=96)
    assert _encoder_sample(plan) == (1, 3, 96, 128)
    kw = dict(steps=2, seed=5, sampler="Euler", init_image=init, strength=0.5)
    latent = dyn(PROMPT, width=128, height=96, resize_mode=3, **kw)[0]
    assert latent.shape == (96, 128, 3)
    assert not np.array_equal(latent, dyn(PROMPT, width=128, height=96, **kw)[0])
    # at the picture's own size there is nothing to resize: the plain run
    assert np.array_equal(dyn(PROMPT, resize_mode=3, **kw)[0], dyn(PROMPT, **kw)[0])


def test_a_flow_model_rounds_down_to_multiples_of_16() -> None:
    register("reference")
    sd3 = pipelines.load(DATA / "tiny-sd3", backend="reference")
    plan = sd3.plan(PROMPT, steps=2, init_image=_picture(72, 40))
    assert (plan.width, plan.height) == (64, 32)


def test_a_picture_far_above_the_models_size_needs_a_size(dyn) -> None:
    """No size given: the picture's own, as diffusers keeps it, up to 4 times the model's pixels; beyond, refused
    before anything runs (a 4032x3024 photo ran SD 1.5 at 4032x3008: 16 GB after 16 minutes, still running),
    naming a size near the model's own in the picture's aspect ratio. A size given runs, the picture fitted."""
    with pytest.raises(InputError, match=r"the init image is 192x128, and with no width or height given it would "
                                         r"run at 192x128, more than 4 times the pixels of this model's 64x64") as err:
        dyn.plan(PROMPT, steps=2, init_image=_picture(192, 128))
    assert err.value.where == "init_image" and "pass width=80 and height=56 (about the model's own size" in str(err.value)
    plan = dyn.plan(PROMPT, steps=2, init_image=_picture(192, 128), width=192, height=128)
    assert (plan.width, plan.height) == (192, 128)
    plan = dyn.plan(PROMPT, steps=2, init_image=_picture(128, 128))  # 4 times: runs at its own size
    assert (plan.width, plan.height) == (128, 128)


def test_a_large_picture_with_no_size_fails_before_running_out_of_memory(init) -> None:
    """A picture above the model's size, run at its own size (diffusers keeps it), that the memory plan says
    does not fit: refused before anything compiles, naming a size near the model's own in its aspect ratio."""
    pipe = pipelines.load(DATA / "tiny-sdxl-dyn", backend=fast_backend(), memory="4MB")
    try:
        with pytest.raises(InputError, match=r"the init image is 128x64, and with no width or height given it runs "
                                             r"at 128x64, for which the memory plan predicts a peak of") as err:
            pipe(PROMPT, steps=2, init_image=_picture(128, 64))
        assert err.value.where == "init_image"
        assert "pass width=88 and height=48 (about the model's own size" in str(err.value)
    finally:
        pipe.close()


def test_latent_upscale_on_a_fixed_size_vae_encoder_runs_as_just_resize_and_says_so(init, caplog) -> None:
    """tiny-sd15's VAE encoder is exported for 64x64 only: it cannot take a 48x32 picture at its own size."""
    pipe = pipelines.load(DATA / "tiny-sd15", backend=fast_backend())
    try:
        small = np.ascontiguousarray(init[:32, :48])
        kw = dict(steps=2, seed=7, sampler="Euler", init_image=small, strength=0.5)
        with caplog.at_level("WARNING", logger="sdrt.pipelines"):
            got = pipe(PROMPT, resize_mode=LATENT_UPSCALE, **kw)[0]
        assert _said(caplog) == ["the init image is 48x32 and this model makes 64x64 images only: Just Resize fits it "
                                 "(stretched to the size) (not the latent upscale: this model's VAE encoder is "
                                 "exported for 64x64 only)"]
        assert np.array_equal(got, pipe(PROMPT, **kw)[0])
    finally:
        pipe.close()


def test_one_side_given_on_a_fixed_size_model_names_the_side_given(init) -> None:
    """width alone on a model exported for 64x64: the height came from the picture's aspect ratio, which the
    message says (it said '64x192 was asked', naming height, which the caller never gave)."""
    pipe = pipelines.load(DATA / "tiny-sd15", backend=fast_backend())
    try:
        tall = np.ascontiguousarray(np.concatenate([init, init, init], axis=0))  # 64x192
        with pytest.raises(InputError, match=r"this model makes 64x64 images only \(its unet is exported for that "
                                             r"size\), and width 64 with the init image's aspect ratio \(64x192\) "
                                             r"asks for 64x192") as err:
            pipe.plan(PROMPT, steps=2, init_image=tall, width=64)
        assert err.value.where == "width"
        assert "pass width=64 and height=64, or leave both unset: the picture is fitted to 64x64 (resize_mode)" in str(err.value)
    finally:
        pipe.close()


def test_latent_upscale_of_a_picture_far_above_the_models_size_is_refused(dyn) -> None:
    """Resize mode 3 VAE-encodes the picture at its own size: 512x512 on a 64x64 model (64 times its pixels) for a
    64x64 run was encoded whole; refused, naming Just Resize. Up to 4 times the model's pixels, or the run's own
    size, it runs."""
    with pytest.raises(InputError, match=r"the init image is 512x512, and Just Resize \(latent upscale\) VAE-encodes "
                                         r"it at its own size: more than 4 times the pixels") as err:
        dyn.plan(PROMPT, steps=2, init_image=_picture(512, 512), width=64, height=64, resize_mode=LATENT_UPSCALE)
    assert err.value.where == "resize_mode"
    assert "use resize_mode='Just Resize'" in str(err.value)
    dyn.plan(PROMPT, steps=2, init_image=_picture(128, 128), width=64, height=64, resize_mode=LATENT_UPSCALE)
    dyn.plan(PROMPT, steps=2, init_image=_picture(256, 256), width=256, height=256, resize_mode=LATENT_UPSCALE)
