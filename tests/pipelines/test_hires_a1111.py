"""The hires fix's A1111 size and second-pass settings: ``hires_width`` / ``hires_height`` (A1111's ``hr_resize_x`` /
``hr_resize_y``), ``hires_sampler`` / ``hires_schedule`` / ``hires_prompt`` / ``hires_negative_prompt``.

Each end-to-end expectation is composed from separate calls: a txt2img run, the picture resized with Pillow as A1111
resizes it, then an img2img run with the second pass's settings (A1111's steps: the last 4 of int(4 / 0.5) = 8). The
tiny SDXL folder with dynamic axes runs them (its UNet runs at any multiple of 8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines.hires import crop_latent, parse

KW = dict(steps=6, sampler="Euler", seed=3)


@pytest.fixture(scope="module")
def xl_dyn():
    pipe = pipelines.load(DATA / "tiny-sdxl-dyn", backend=fast_backend())
    yield pipe
    pipe.close()


def test_resize_sizes_as_a1111() -> None:
    """A1111's calculate_target_resolution: one side given, the other follows the aspect ratio (integer division);
    both, the picture covers them and its latent is cropped by (excess // 8) rows or columns."""
    assert parse(None, None, None, None, width=1000).target(512, 768) == (1000, 1496)  # 1000*768//512 = 1500 -> 1496
    assert parse(None, None, None, None, height=1024).target(512, 768) == (680, 1024)  # 1024*512//768 = 682 -> 680
    both = parse(None, None, None, None, width=1024, height=1024)
    assert both.upscaled(512, 768) == (1024, 1536) and both.crop(512, 768) == (0, 64)
    assert both.target(512, 768) == (1024, 1024)
    wide = parse(None, None, None, None, width=1280, height=640)  # wider than 1:1: the height covers, x cropped
    assert wide.upscaled(512, 512) == (1280, 1280) and wide.crop(512, 512) == (0, 80)
    assert wide.target(512, 512) == (1280, 640)
    # A1111's slicing: truncate // 2 before, (truncate + 1) // 2 after
    lat = np.arange(2 * 4 * 11 * 6, dtype=np.float32).reshape(2, 4, 11, 6)
    assert np.array_equal(crop_latent(lat, 3, 5), lat[:, :, 2:11 - 3, 1:6 - 2])
    assert both.infotext()["Hires resize"] == "1024x1024" and "Hires upscale" not in both.infotext()
    assert parse(None, None, None, None, width=1000).infotext()["Hires resize"] == "1000x0"  # as A1111 writes it
    assert parse(1, None, None, None).off(512, 512) and not parse(None, None, None, None, width=520).off(512, 512)
    for kw, words in (({"hires_scale": 2, "hires_width": 1024}, "hires_scale and hires_width both size"),
                      ({"hires_width": -4}, "hires_width must be an integer from 8"),
                      ({"hires_height": 2.5}, "hires_height must be an integer"),
                      ({"hires_sampler": "DPM++ 2M"}, "hires_sampler needs hires_scale"),
                      ({"hires_scale": 2, "hires_sampler": "nope"}, "hires_sampler.*unknown sampler 'nope'"),
                      ({"hires_scale": 2, "hires_schedule": "Wobbly"}, "hires_schedule"),
                      ({"hires_scale": 2, "hires_prompt": 3}, "hires_prompt must be a string")):
        with pytest.raises(InputError, match=words):
            pipelines.validate("a cat", **kw)


def test_hires_width_alone_follows_the_aspect_ratio(xl_dyn) -> None:
    """64x96 with hires_width 128: the second pass at 128x192 (A1111's 128 * 96 // 64); with an image upscaler it is
    the first pass resized by Pillow to that size, then img2img."""
    pil = pytest.importorskip("PIL.Image")
    gen = xl_dyn.generate("a cat", "blurry", width=64, height=96, hires_width=128, hires_steps=4, hires_denoise=0.5,
                          hires_upscaler="Lanczos", **KW)
    assert gen.images[0].shape == (192, 128, 3)
    info = gen.settings[0]
    assert info["Hires resize"] == "128x0" and "Hires upscale" not in info and info["Size"] == "64x96"
    base = xl_dyn("a cat", "blurry", width=64, height=96, **KW)[0]
    big = np.asarray(pil.fromarray(base).resize((128, 192), pil.Resampling.LANCZOS))
    i2i = xl_dyn("a cat", "blurry", steps=8, sampler="Euler", seed=3, width=128, height=192, init_image=big,
                 strength=4.5 / 8)[0]
    assert np.array_equal(gen.images[0], i2i)


def test_hires_width_and_height_crop_the_covering_latent(xl_dyn) -> None:
    """64x96 to 128x128: upscaled to cover (128x192), the latent cropped by 8 rows (4 above, 4 below) to 16x16; the
    UNet runs at 128x128 and the picture is 128x128."""
    kw = dict(width=64, height=96, hires_width=128, hires_height=128, hires_steps=4, hires_denoise=0.5, **KW)
    plan = xl_dyn.plan("a cat", "blurry", **kw)
    shapes = {tuple(dict((k, s) for k, s, _ in sig)["sample"]): n for sig, n in plan.part("unet").signatures}
    assert shapes == {(2, 4, 12, 8): 6, (2, 4, 16, 16): 4}
    assert "Latent upscale to 128x192, cropped, pass 2 at 128x128" in plan.format()
    gen = xl_dyn.generate("a cat", "blurry", **kw)
    assert gen.images[0].shape == (128, 128, 3) and gen.settings[0]["Hires resize"] == "128x128"
    # the first pass's latent, upscaled to 16x24 and cropped to its middle 16 rows, is what the pass starts from:
    # a pass over the top 16 rows instead is another picture
    stretched = xl_dyn.generate("a cat", "blurry", **{**kw, "hires_width": 128, "hires_height": 192})
    assert stretched.images[0].shape == (192, 128, 3)
    assert np.abs(stretched.images[0][32:160].astype(int) - gen.images[0]).max() > 0  # not the same pass cropped


def test_second_pass_sampler_schedule_and_prompts(xl_dyn) -> None:
    """hires_sampler / hires_schedule / hires_prompt / hires_negative_prompt: the second pass is img2img of the
    upscaled first pass with them (A1111's hr_sampler_name, hr_scheduler, hr_prompt, hr_negative_prompt); the
    infotext names each as A1111 does."""
    pil = pytest.importorskip("PIL.Image")
    hr = dict(hires_scale=2, hires_steps=4, hires_denoise=0.5, hires_upscaler="Lanczos", hires_sampler="DPM++ 2M",
              hires_schedule="Karras", hires_prompt="a dog", hires_negative_prompt="ugly")
    gen = xl_dyn.generate("a cat", "blurry", width=64, height=64, **hr, **KW)
    info = gen.settings[0]
    assert (info["Hires sampler"], info["Hires schedule type"]) == ("DPM++ 2M", "Karras")
    assert (info["Hires prompt"], info["Hires negative prompt"]) == ("a dog", "ugly")
    assert info["Sampler"] == "Euler"
    base = xl_dyn("a cat", "blurry", width=64, height=64, **KW)[0]
    big = np.asarray(pil.fromarray(base).resize((128, 128), pil.Resampling.LANCZOS))
    i2i = xl_dyn("a dog", "ugly", steps=8, sampler="DPM++ 2M", schedule="Karras", seed=3, init_image=big,
                 strength=4.5 / 8)[0]
    assert np.array_equal(gen.images[0], i2i)
    # the same names as the first pass's are no fields (A1111 writes them only when they differ)
    same = xl_dyn.generate("a cat", "blurry", width=64, height=64, **{**hr, "hires_sampler": "Euler",
                                                                       "hires_schedule": None, "hires_prompt": "a cat"},
                           **KW).settings[0]
    assert not {"Hires sampler", "Hires schedule type", "Hires prompt"} & set(same)


def test_cli_hires_flags(tmp_path: Path, capsys) -> None:
    from sdrt.cli import main
    from sdrt.pipelines.png import read_parameters
    from sdrt.serve.responses import parse_infotext

    out = tmp_path / "x.png"
    assert main(["generate", str(DATA / "tiny-sdxl-dyn"), "a cat", "--steps", "2", "--width", "64", "--height", "96",
                 "--hires-width", "128", "--hires-height", "128", "--hires-steps", "1", "--hires-sampler", "Euler a",
                 "--hires-prompt", "a dog, at night", "-o", str(out)]) == 0
    text = read_parameters(out)
    assert 'Hires prompt: "a dog, at night"' in text and "Hires resize: 128x128" in text, text
    back = parse_infotext(text)  # read back as A1111's /png-info reads it
    assert back["Hires resize-1"] == "128" and back["Hires resize-2"] == "128"
    assert back["Hires prompt"] == "a dog, at night" and back["Hires sampler"] == "Euler a"
    rc = main(["generate", str(DATA / "tiny-sdxl-dyn"), "a cat", "--dry-run", "--hires-scale", "2",
               "--hires-width", "128"])
    err = capsys.readouterr().err
    assert rc != 0 and "--hires-scale and --hires-width both size the second pass" in err and "Traceback" not in err


def test_hires_prompt_with_a_refiner_that_took_over(xl_dyn) -> None:
    """A refiner that took over in the first pass (A1111's "first pass" option) runs all of the hires pass with the
    hires prompts, as A1111's refiner encodes hr_c / hr_uc there: the first pass with the refiner, Pillow's
    resize, then the refiner's own img2img with the hires prompts."""
    pil = pytest.importorskip("PIL.Image")
    refiner = DATA / "tiny-sdxl-refiner"
    kw = dict(steps=6, cfg=5.0, sampler="Euler", seed=4, width=64, height=64)
    ref = dict(refiner=refiner, refiner_switch_at=0.7)
    gen = xl_dyn.generate("a cat", "blurry", hires_scale=2, hires_steps=3, hires_denoise=0.6, hires_upscaler="Lanczos",
                          hires_refiner_pass="first pass", hires_prompt="a dog", hires_negative_prompt="ugly",
                          **ref, **kw)
    assert gen.settings[0]["Hires prompt"] == "a dog" and "Refiner" in gen.settings[0]
    base = xl_dyn("a cat", "blurry", **ref, **kw)[0]
    big = np.asarray(pil.fromarray(base).resize((128, 128), pil.Resampling.LANCZOS))
    with pipelines.load(refiner, backend=fast_backend()) as rp:
        i2i = rp("a dog", "ugly", steps=5, cfg=5.0, sampler="Euler", seed=4, width=128, height=128, init_image=big,
                 strength=3.5 / 5)[0]
    assert np.array_equal(gen.images[0], i2i)


def test_hires_sampler_alone_runs_the_first_pass_schedule_argument(xl_dyn) -> None:
    """A1111's hr_scheduler unset is the first pass's scheduler as given: an explicit one carries over to the hires
    sampler, "Automatic" (sdrt: no schedule argument) is the hires sampler's own default."""
    from sdrt.samplers import resolve

    first = ("Euler", resolve("Euler", "karras"))
    assert parse(2, None, None, None, sampler="DPM++ 2M", first_schedule="karras").choice(first) == \
        resolve("DPM++ 2M", "karras")
    assert parse(2, None, None, None, sampler="DPM++ 2M").choice(("Euler", resolve("Euler"))) == resolve("DPM++ 2M")
    assert parse(2, None, None, None, schedule="exponential").choice(first) == resolve("Euler", "exponential")
    s = pipelines.validate("a cat", sampler="Euler", schedule="karras", hires_scale=2, hires_sampler="DPM++ 2M")
    assert s.toolbox.hires.choice((s.sampler, s.choice)) == resolve("DPM++ 2M", "karras")
    # the run plan runs the hires prompts' encoding too
    plan = xl_dyn.plan("a cat", "blurry", width=64, height=64, hires_scale=2, hires_steps=2, hires_prompt="a dog", **KW)
    assert "pass 2 at 128x128" in plan.format()
