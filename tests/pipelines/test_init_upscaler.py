"""``init_upscaler`` (A1111's ``upscaler_for_img2img``): what enlarges an init image that grows to the size.

tests/pipelines/data/a1111_resize.npz holds A1111's own ``images.resize_image`` with the option set to ``None``,
``Lanczos`` and ``Nearest`` (its ``Upscaler.upscale`` and the upscalers' steps, run on Pillow by
scripts/gen_a1111_steps_refs.py --resize-out), resize modes 0 to 2, a 16x20 picture grown and shrunk.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend, refs

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines.images import RESIZE_MODES, fit_array, plain_upscale, upscaler_enlarge

pytest.importorskip("PIL.Image", reason="resizing needs Pillow")
REFS = Path(__file__).parent / "data" / "a1111_resize.npz"
UPSCALERS = Path(__file__).resolve().parents[1] / "data" / "upscalers"


def test_resize_image_is_a1111s_with_each_upscaler() -> None:
    data = np.load(REFS)
    picture = data["picture"]
    keys = [k for k in data.files if k != "picture"]
    assert len(keys) == 27
    for key in keys:
        name, mode, size = key.split("/")
        w, h = (int(v) for v in size.split("x"))
        enlarge = None if name == "None" else upscaler_enlarge(plain_upscale(name))
        got = fit_array(picture, w, h, RESIZE_MODES[int(mode)], enlarge=enlarge)
        np.testing.assert_array_equal(got, data[key], err_msg=key)
    # the table tells the upscalers apart where the picture grows, and not where it shrinks
    assert not np.array_equal(data["Lanczos/0/40x48"], data["None/0/40x48"])
    assert not np.array_equal(data["Nearest/1/48x32"], data["Lanczos/1/48x32"])
    assert np.array_equal(data["Nearest/0/8x8"], data["None/0/8x8"])


@pytest.fixture(scope="module")
def sd15():
    pipe = pipelines.load(DATA / "tiny-sd15", backend=fast_backend())
    yield pipe
    pipe.close()


def test_a_model_upscaler_enlarges_the_init_image(sd15) -> None:
    """A1111's ``resize``: the model by its own factor until the picture reaches ``int(side * scale) // 8 * 8``,
    then Lanczos to that, then to the size; the run's infotext names it."""
    from PIL import Image

    from sdrt.pipelines.upscaler import ModelUpscaler

    model = UPSCALERS / "compact_x2.safetensors"
    small = np.asarray(Image.fromarray(refs("tiny-sd15")["init_image"]).resize((20, 24)))
    s = pipelines.validate("a cat", steps=2, init_image=small, width=64, height=64, init_upscaler=str(model))
    assert s.init_upscaler == ("compact_x2", model)
    init, _ = sd15._fit_init(s)
    up = ModelUpscaler(model, backend=fast_backend())
    # scale max(64 / 20, 64 / 24) = 3.2: the target is 64x72 (76.8 // 8 * 8); x2 gives 40x48, then 80x96
    x4 = up.upscale(up.upscale(small))
    dest = Image.fromarray(x4).resize((64, 72), Image.Resampling.LANCZOS) if x4.shape[:2] != (72, 64) else x4
    want = np.asarray(Image.fromarray(np.asarray(dest)).resize((64, 64), Image.Resampling.LANCZOS))
    np.testing.assert_array_equal(init, want)
    assert not np.array_equal(init, fit_array(small, 64, 64, RESIZE_MODES[0]))
    gen = sd15.generate("a cat", init_image=small, width=64, height=64, steps=1, strength=1.0, seed=1, cfg=1,
                        init_upscaler="lanczos")
    assert gen.settings[0]["Init upscaler"] == "Lanczos"


@pytest.mark.parametrize(("kwargs", "where", "message"), [
    ({"init_upscaler": "R-ESRGAN 4x+"}, "init_upscaler", "unknown init upscaler 'R-ESRGAN 4x+'"),
    ({"init_upscaler": "Lanczos", "init_image": None}, "init_upscaler", "enlarges an init image, and none was given"),
    ({"init_upscaler": str(REFS)}, "init_upscaler", "unknown init upscaler"),
])
def test_bad_init_upscalers_are_one_line(kwargs, where, message) -> None:
    args = {"init_image": np.zeros((8, 8, 3), np.uint8), **kwargs}
    with pytest.raises(InputError) as exc:
        pipelines.validate("a cat", steps=2, **args)
    assert exc.value.where == where and message in str(exc.value) and "\n" not in str(exc.value)


def test_none_is_a_lanczos_resize() -> None:
    s = pipelines.validate("a cat", init_image=np.zeros((8, 8, 3), np.uint8), init_upscaler="None")
    assert s.init_upscaler is None


def test_the_cli_takes_an_init_upscaler(tmp_path, capsys) -> None:
    from PIL import Image
    from pipeline_helpers import register

    from sdrt.cli import main

    register("reference")
    init, out = tmp_path / "init.png", tmp_path / "out.png"
    Image.fromarray(refs("tiny-sd15")["init_image"]).resize((20, 24)).save(init)
    assert main(["generate", str(DATA / "tiny-sd15"), "a cat", "--init-image", str(init), "--width", "64", "--height",
                 "64", "--steps", "1", "--strength", "1", "--seed", "1", "--cfg", "1", "--init-upscaler", "Nearest",
                 "--backend", "reference", "-o", str(out)]) == 0
    capsys.readouterr()
    with Image.open(out) as img:
        assert "Init upscaler: Nearest" in img.text["parameters"]
    assert main(["generate", "/no/such/folder", "a cat", "--init-image", str(init), "--init-upscaler", "SwinIR 4x",
                 "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert "unknown init upscaler 'SwinIR 4x'. Where: --init-upscaler." in err and err.count("\n") == 1, err


def test_a_thin_picture_filled_is_no_crash() -> None:
    """Resize and Fill scales a 100x1 picture to 512x5: A1111's upscaler target (int(side * scale) // 8 * 8) is 0
    pixels high, and Pillow's resize to it raised a bare ValueError; the Lanczos resize makes it, as without one."""
    thin = np.full((1, 100, 3), 128, np.uint8)
    plain = fit_array(thin, 512, 64, RESIZE_MODES[2])
    for name in ("Lanczos", "Nearest"):
        got = fit_array(thin, 512, 64, RESIZE_MODES[2], enlarge=upscaler_enlarge(plain_upscale(name)))
        np.testing.assert_array_equal(got, plain)


def test_a_file_that_is_no_upscaler_is_named_before_any_model_loads() -> None:
    """docs/pipelines.md: a LoRA given as the init upscaler is a one-line ModelError naming the file and what it looks
    like (as for hires_upscaler), raised by validate."""
    from sdrt.errors import ModelError

    lora = DATA.parent / "ckpt" / "pipe-sd15" / "tinylora.safetensors"
    with pytest.raises(ModelError) as exc:
        pipelines.validate("a cat", init_image=np.zeros((8, 8, 3), np.uint8), init_upscaler=str(lora))
    assert "no upscaler sdrt runs: it looks like a LoRA" in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.where == str(lora)
