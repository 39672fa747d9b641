"""masked_content (A1111's img2img "Masked content", inpainting_fill 2 and 3): the latent an inpainting run starts
from, checked against A1111's rule written here in numpy and Pillow (modules/processing.py, the img2img init): the
mask resized to the latent grid as A1111 resizes it (``Image.resize``'s default filter on the mask as RGB), divided
by 255 and rounded; then ``init_latent * (1 - latmask) + noise * latmask`` for latent noise (the noise being the
run's own, the seed's first draw) and ``init_latent * (1 - latmask)`` for latent nothing. The init latent and the
noise are those the "fill" run of the same seed starts from: A1111 fills the picture (masking.fill) for both."""

from __future__ import annotations

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="A1111's latent mask is a Pillow resize")


def _picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    picture = (rng.random((64, 64, 3)) * 255).astype(np.uint8)
    mask = np.zeros((64, 64), np.uint8)
    mask[19:45, 11:41] = 255  # edges off the 8-pixel grid: A1111's rounded bicubic mask is not the nearest one
    return picture, mask


def a1111_latmask(mask: np.ndarray, h: int, w: int) -> np.ndarray:
    """processing.py: latent_mask.convert('RGB').resize((w, h)), channel 0 / 255, np.around."""
    small = np.asarray(Image.fromarray(mask).convert("RGB").resize((w, h)), np.float32)[..., 0] / 255
    return np.around(small)


def starts(demo_pipe, monkeypatch, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    from loop_helpers import recorded_start

    noise, latent = recorded_start(demo_pipe, monkeypatch, kwargs.pop("prompt", "a red circle"), kwargs.pop("seed", 7),
                                   **kwargs)
    assert latent is not None
    return noise, latent


@pytest.mark.parametrize("rule, rng", [("diffusers", "cpu"), ("a1111", "gpu")])
def test_start_latents_are_a1111s(demo_pipe, monkeypatch, rule, rng) -> None:
    """rng="gpu": A1111's per-image noise, each image's seed's first draw, as A1111's create_random_tensors."""
    picture, mask = _picture_and_mask()
    common = dict(init_image=picture, mask=mask, strength=0.6, strength_rule=rule, batch=2, rng=rng)
    noise, latent = starts(demo_pipe, monkeypatch, masked_content="fill", **common)
    _, original = starts(demo_pipe, monkeypatch, **common)
    assert np.abs(original - latent).max() > 0.1  # the filled picture encodes to another latent
    h, w = latent.shape[2:]
    lat = a1111_latmask(mask, h, w)[None, None]
    # the mask is one A1111 and the nearest sampling see differently
    nearest = mask[::8, ::8] >= 128
    assert (nearest != (lat[0, 0] == 1)).any()
    noise2, nothing = starts(demo_pipe, monkeypatch, masked_content="latent nothing", **common)
    np.testing.assert_array_equal(noise2, noise)
    np.testing.assert_allclose(nothing, latent * (1 - lat), rtol=0, atol=1e-6)
    noise3, noisy = starts(demo_pipe, monkeypatch, masked_content="Latent_Noise", **common)
    np.testing.assert_array_equal(noise3, noise)
    np.testing.assert_allclose(noisy, latent * (1 - lat) + noise * lat, rtol=0, atol=1e-6)
    assert np.abs(noisy - latent).max() > 0.5 and np.abs(nothing - latent).max() > 0.5


def test_infotext_and_images(demo_pipe) -> None:
    picture, mask = _picture_and_mask()
    common = dict(init_image=picture, mask=mask, strength=0.6, steps=2, cfg=1, seed=7)
    base = demo_pipe.generate("a red circle", **common)
    nothing = demo_pipe.generate("a red circle", masked_content="latent nothing", **common)
    assert nothing.settings[0]["Masked content"] == "latent nothing"
    assert "Masked content" not in base.settings[0]
    assert np.abs(nothing.images[0].astype(int) - base.images[0].astype(int)).max() > 10


def test_refusals(demo_pipe) -> None:
    from sdrt.errors import InputError
    from sdrt.pipelines import validate

    picture, mask = _picture_and_mask()
    with pytest.raises(InputError, match="masked_content.*no mask"):
        validate("x", init_image=picture, masked_content="latent noise")
    with pytest.raises(InputError, match="unknown masked_content 'blur'"):
        validate("x", init_image=picture, mask=mask, masked_content="blur")
    with pytest.raises(InputError, match="unknown argument .inpainting_fill.*pass masked_content instead"):
        demo_pipe.generate("x", init_image=picture, mask=mask, inpainting_fill=2)


def test_refused_on_flow_models(demo_pipe, monkeypatch) -> None:
    """SD3, Flux and Chroma: A1111's fill is for SD 1.x/2.x/XL; refused before any part runs."""
    from sdrt.errors import InputError

    picture, mask = _picture_and_mask()
    monkeypatch.setattr(demo_pipe.family, "flow", True)
    with pytest.raises(InputError, match="masked_content 'latent nothing' is A1111's, for SD 1.x/2.x/XL"):
        demo_pipe.generate("x", init_image=picture, mask=mask, masked_content="latent nothing", steps=2, width=64,
                      height=64)


def test_the_cli_flag(demo_pipe, tmp_path, capsys) -> None:
    from sdrt import pipelines
    from sdrt.cli import main

    picture, mask = _picture_and_mask()
    init, m, out = tmp_path / "init.png", tmp_path / "mask.png", tmp_path / "out.png"
    Image.fromarray(picture).save(init)
    Image.fromarray(mask).save(m)
    assert main(["generate", str(pipelines.DEMO_MODEL), "a cat", "--init-image", str(init), "--mask", str(m),
                 "--masked-content", "latent nothing", "--strength", "0.6", "--steps", "2", "--seed", "1",
                 "--cfg", "1", "--backend", "openvino", "-o", str(out)]) == 0
    capsys.readouterr()
    with Image.open(out) as img:
        assert "Masked content: latent nothing" in img.text["parameters"]
    assert main(["generate", str(pipelines.DEMO_MODEL), "a cat", "--init-image", str(init), "--masked-content",
                 "latent noise", "--backend", "openvino"]) == 1
    err = capsys.readouterr().err
    assert "--masked-content says what the area a mask repaints starts from" in err and err.count("\n") == 1, err
