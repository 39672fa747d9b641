"""A newcomer's sweep of generate's arguments (sdrt.pipelines.settings): each bad one is a one-line InputError that
names it in the caller's words, before any model loads."""

from __future__ import annotations

import numpy as np
import pytest

from sdrt.errors import InputError
from sdrt.pipelines.settings import validate


@pytest.mark.parametrize(("typo", "meant"), [
    ("negative_promt", "negative_prompt"),  # was "did you mean hires_negative_prompt?"
    ("negativeprompt", "negative_prompt"),
    ("promt", "prompt"),  # was no hint at all
    ("callbak", "callback"),
    ("stpes", "steps"),
])
def test_a_typo_is_refused_with_the_argument_it_is_near(typo: str, meant: str) -> None:
    with pytest.raises(InputError) as info:
        validate("a cat", **{typo: "x"})
    assert info.value.where == typo
    assert info.value.fix.startswith(f"did you mean {meant}? ")
    assert "\n" not in str(info.value)


def test_callback_given_to_validate_says_it_is_generates() -> None:
    """It said "unknown argument 'callback'" and then listed callback among the arguments."""
    with pytest.raises(InputError) as info:
        validate("a cat", callback=lambda step, total, latents: None)
    assert info.value.where == "callback"
    assert "unknown argument" not in str(info.value)
    assert "pipe.generate(...)" in info.value.fix


@pytest.mark.parametrize(("name", "value"), [
    ("guidance", 1e300),  # ran the whole model into NaN latents, "try another backend"
    ("guidance", 101.0),
    ("guidance", -0.5),
    ("shift", 1e300),
    ("shift", 1e-30),  # 0 in float32: NaN latents too
    ("shift", 0.0),
    ("shift", 101),
    ("shift", float("inf")),
    ("guidance", "3.5"),
])
def test_guidance_and_shift_out_of_range_are_refused(name: str, value: object) -> None:
    with pytest.raises(InputError, match=rf"^{name} must be a finite number from [0-9.]+ to 100, got ") as info:
        validate("a cat", **{name: value})
    assert info.value.where == name


@pytest.mark.parametrize(("name", "value"), [("guidance", 0), ("guidance", 100), ("guidance", np.float32(3.5)),
                                             ("shift", 0.01), ("shift", 100), ("shift", np.float64(3.0))])
def test_guidance_and_shift_in_range_pass(name: str, value: object) -> None:
    s = validate("a cat", **{name: value})
    assert getattr(s, name) == float(value) and type(getattr(s, name)) is float


IMAGE = np.zeros((64, 64, 3), np.uint8)


@pytest.mark.parametrize(("name", "kwargs"), [
    ("init_image", {"init_image": ""}),  # was "the init image . is a folder, not an image file"
    ("init_image", {"init_image": b""}),
    ("mask", {"init_image": IMAGE, "mask": ""}),
    ("control_image", {"control_image": ""}),
])
def test_an_empty_image_path_is_said_empty(name: str, kwargs: dict) -> None:
    with pytest.raises(InputError, match=rf"^{name} is an empty path\. Where: {name}\. ") as info:
        validate("a cat", **kwargs)
    assert "folder" not in str(info.value)


def test_a_numpy_rgba_mask_with_transparency_is_read_by_its_alpha_as_a_pillow_one() -> None:
    """Painted opaque over transparent black: a Pillow RGBA mask repainted the painted rows, the same array nothing."""
    from PIL import Image

    from sdrt.pipelines.images import mask_gray

    a = np.zeros((8, 8, 4), np.uint8)
    a[:4, :, 3] = 255
    want = np.asarray(mask_gray(Image.fromarray(a, "RGBA")))
    assert want[:4].min() == 255 and want[4:].max() == 0
    assert np.array_equal(mask_gray(a), want)
    assert np.array_equal(mask_gray(a.astype(np.float32) / 255), want)
    opaque = np.full((8, 8, 4), 255, np.uint8)
    opaque[:4, :, :3] = 0  # no transparency: its luma, as Pillow's convert("L")
    assert np.array_equal(mask_gray(opaque), np.asarray(mask_gray(Image.fromarray(opaque, "RGBA"))))


@pytest.mark.parametrize(("number", "mode"), [(0, "fill"), (1, "original"), (2, "latent noise"),
                                              (3, "latent nothing")])
def test_masked_content_takes_a1111s_inpainting_fill_numbers(number: int, mode: str) -> None:
    """masked_content=1 read "unknown masked_content '1'", while resize_mode takes A1111's numbers."""
    from sdrt.pipelines.maskedcontent import check

    assert check(number) == mode == check(np.int64(number))
    with pytest.raises(InputError, match="masked_content"):
        check(True)
    with pytest.raises(InputError, match="masked_content"):
        check(4)


def test_a_negative_prompt_beside_settings_is_refused_not_dropped() -> None:
    """generate(validate(...), "blue background") ran without the negative prompt, and said nothing."""
    from pipeline_helpers import register

    from sdrt import pipelines

    register("reference")
    s = validate("a red circle", steps=1, seed=1)
    with pipelines.load(pipelines.DEMO_MODEL, backend="reference") as pipe:
        with pytest.raises(InputError) as info:
            pipe.generate(s, "blue background")
        assert info.value.where == "negative_prompt" and "validate(...)" in info.value.fix
        assert pipe.generate(s, "").negative_prompt == ""  # the default and the Settings' own still run


def test_an_unknown_preprocessor_is_offered_the_near_name() -> None:
    from sdrt.pipelines import ControlNet

    with pytest.raises(InputError) as info:
        validate("a cat", controlnets=[ControlNet("net", np.zeros((8, 8, 3), np.uint8), preprocessor="cany")])
    assert info.value.fix.startswith("did you mean canny? ")
