"""The model-backed lineart preprocessors (lineart_realistic, lineart_coarse, lineart_anime) against the extension.

References: scripts/ref_lineart.py ran controlnet_aux 0.0.10's Generator / UnetGenerator (the extension's
annotator classes) with the extension's code around them (resize_image_with_pad, the anime detector's INTER_CUBIC
resizes to multiples of 256 and back, ``255 - line``, remove_pad) on the full-size seeded files that
lineart_helpers writes here (the same bytes); tests/data/lineart/refs.npz holds the image, the padded inputs the
extension fed the detectors and the maps at processor resolutions 72 (the image's own size) and 100.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lineart_helpers import COARSE_SEED, make_anime, make_generator, make_manga, write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import lineartnets  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "lineart"
SIZES = {72: (72, 100), 100: (100, 139)}


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "refs.npz")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """sd-webui-controlnet's layout: <models>/extensions/sd-webui-controlnet/annotator/downloads/<folder>."""
    root = tmp_path_factory.mktemp("lineart")
    ext = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads"
    (ext / "lineart").mkdir(parents=True)
    (ext / "lineart_anime").mkdir(parents=True)
    write_pth(ext / "lineart" / "sk_model.pth", make_generator())
    write_pth(ext / "lineart" / "sk_model2.pth", make_generator(COARSE_SEED))
    write_pth(ext / "lineart_anime" / "netG.pth", make_anime())
    (ext / "manga_line").mkdir(parents=True)
    write_pth(ext / "manga_line" / "erika.pth", make_manga())
    return root


def _detector(name, models, backend):
    cls = {"lineart_anime": lineartnets.LineartAnime,
           "lineart_anime_denoise": lineartnets.MangaLine}.get(name, lineartnets.Lineart)
    return cls(lineartnets.find_file(name, models), backend=backend)


def _close(made, ref, share):
    """At most 1 level apart, on at most ``share`` of the pixels (float32 sums in another order move a value
    across a truncation step now and then)."""
    assert made.shape == ref.shape and made.dtype == np.uint8
    d = np.abs(made.astype(int) - ref.astype(int))
    assert d.max() <= 1 and (d > 0).mean() <= share, (int(d.max()), float((d > 0).mean()))


#: the share of pixels a level apart: the anime map also goes through two bicubic resizes (the uint8 one puts
#: 1 level between sdrt and OpenCV's IPP on a few values, which moves the network's output a little)
SHARE = {"realistic": 0.005, "coarse": 0.005, "anime": 0.015, "manga": 0.005}
KINDS = [("lineart_realistic", "realistic"), ("lineart_coarse", "coarse"), ("lineart_anime", "anime"),
         ("lineart_anime_denoise", "manga")]


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
@pytest.mark.parametrize("name,key", KINDS)
def test_maps_equal_the_extension(refs, models, backend, name, key):
    """The detector on the input the extension fed it (OpenCV's resize, padded to 64), at both resolutions:
    the inverted map of the real network's structure (reflection pads, instance norms, transposed convs, the
    U-Net's skips; the manga network's batch norms, strided shortcuts, nearest upsampling) within a level on under half a percent of the pixels (1.5% for anime)."""
    register(backend)
    with _detector(name, models, backend) as det:
        for res, (h, w) in SIZES.items():
            _close(det(refs[f"input_{res}"])[:h, :w], refs[f"{key}_{res}"], SHARE[key])


def test_map_on_the_reference_backend(refs, models):
    """The generator on the reference backend (about 20 s; the anime U-Net, which runs at 256x256 at least, takes
    over a minute there and is left to OpenVINO and ggml)."""
    register("reference")
    with _detector("lineart_realistic", models, "reference") as det:
        _close(det(refs["input_72"])[:72, :100], refs["realistic_72"], SHARE["realistic"])


def test_cubic_resizes_equal_opencv(refs):
    """OpenCV's INTER_CUBIC as its wheels run it (IPP): uint8 up to the anime network's 256 and to an odd size,
    float32 down (the network's output back to the image) and to an odd size."""
    a = refs["cu8_in"]
    for key, (w, h) in (("cu8_out", (256, 256)), ("cu8_odd_out", (77, 45))):
        d = np.abs(lineartnets.cubic(a, w, h).astype(int) - refs[key])
        assert d.max() <= 1 and (d > 0).mean() < 1e-4
    f = refs["cf_in"]
    for key, (w, h) in (("cf_out", (48, 40)), ("cf_odd_out", (77, 131))):
        np.testing.assert_allclose(lineartnets.cubic(f, w, h), refs[key], rtol=0, atol=1e-4)


def test_grey_equals_opencv():
    """OpenCV 5's RGB2GRAY on every level of each channel and on mixed colours (values computed with cv2; the
    per-channel ramps match cv2 too)."""
    v = np.arange(256)
    for ch, want in ((0, (v * 19596 + 32768) >> 16), (1, (v * 38470 + 32768) >> 16), (2, (v * 7470 + 32768) >> 16)):
        a = np.zeros((1, 256, 3), np.uint8)
        a[0, :, ch] = v
        assert np.array_equal(lineartnets.gray(a)[0], want)
    # colours where 14-bit weights round the other way (cv2 5.0 gives 193, 212, 103; 14 bits 192, 211, 104)
    mixed = np.array([[[228, 205, 35], [232, 240, 11], [167, 46, 233]]], np.uint8)
    assert lineartnets.gray(mixed)[0].tolist() == [193, 212, 103]


def test_files_and_errors(tmp_path, models):
    assert lineartnets.find_file("lineart_realistic", models).parent.name == "lineart"
    assert lineartnets.find_file("lineart_coarse", models).name == "sk_model2.pth"
    assert lineartnets.find_file("lineart_anime", models).parent.name == "lineart_anime"
    comfy = tmp_path / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    comfy.mkdir(parents=True)
    sk = write_pth(comfy / "sk_model.pth", make_generator())
    assert lineartnets.find_file("lineart_realistic", tmp_path) == sk
    with pytest.raises(InputError) as e:
        lineartnets.find_file("lineart_anime", tmp_path, what="--control-preprocessor-models")
    msg = str(e.value)
    assert "--control-preprocessor-models: no netG.pth in" in msg and "\n" not in msg
    # the generator's file given as the anime network, a truncated file, not a torch file: one line each
    with pytest.raises(ModelError, match="is not the anime lineart U-Net") as e:
        lineartnets.LineartAnime(sk)
    assert "netG.pth" in str(e.value) and "\n" not in str(e.value)
    bad = make_generator()
    bad["model4.1.weight"] = bad["model4.1.weight"][:, :32]
    with pytest.raises(ModelError, match=r"model4.1.weight is \(1, 32, 7, 7\)"):
        lineartnets.Lineart(write_pth(tmp_path / "bad.pth", bad))
    cut = tmp_path / "cut.pth"
    cut.write_bytes(sk.read_bytes()[:5000])
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a torch file")
    for f in (cut, junk):
        with pytest.raises((ModelError, InputError)) as e:
            lineartnets.Lineart(f)
        assert "\n" not in str(e.value) and str(f) in str(e.value)


def test_anime_file_with_or_without_module_prefix(tmp_path, refs):
    """The published netG.pth keeps DataParallel's ``module.``; a file saved without it is read the same."""
    register("openvino")
    bare = {k[len("module."):]: v for k, v in make_anime().items()}
    with lineartnets.LineartAnime(write_pth(tmp_path / "netG.pth", bare), backend="openvino") as det:
        _close(det(refs["input_72"])[:72, :100], refs["anime_72"], SHARE["anime"])


@pytest.mark.parametrize("name,key", KINDS)
def test_preprocess_at_a_resolution_equals_the_extension(refs, models, name, key):
    """``preprocess`` end to end (the file found in the extension's layout, resize_image_with_pad, the map, the
    crop): at 72 (the image's shorter side: no resize) as the detector test; at 100 sdrt's bicubic enlargement of
    the image puts 1 level between it and OpenCV's on a few values in a thousand, which moves a few percent of the
    map a level; without a resolution, the map at 72."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    image = refs["image"]
    at72 = preprocessors.preprocess(image, name, resolution=72, models=models, backend="openvino")
    assert at72.shape == (72, 100, 3) and np.array_equal(at72[..., 0], at72[..., 2])
    _close(at72[..., 0], refs[f"{key}_72"], SHARE[key])
    _close(preprocessors.preprocess(image, name, resolution=100, models=models, backend="openvino")[..., 0],
           refs[f"{key}_100"], 0.08)
    assert np.array_equal(preprocessors.preprocess(image, name, models=models, backend="openvino"), at72)


@pytest.mark.parametrize("shape", [(1, 1, 3), (5, 300, 3), (33, 47), (40, 30, 4)])
def test_odd_images_make_a_map(models, shape):
    """One pixel, a thin strip, 2-D and RGBA images: a map the image's size (padded to 64 inside)."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    img = np.random.default_rng(3).integers(0, 256, shape, dtype=np.uint8)
    for name, _ in KINDS:
        made = preprocessors.preprocess(img, name, models=models, backend="openvino")
        assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "lineart_anime", models=models, backend="openvino")


def test_lineart_in_a_controlnet_run_and_on_the_command_line(refs, models, tmp_path, capsys):
    """A unit with lineart_anime gives the image of a unit fed its map by hand, and writes the module in the
    infotext; the CLI's --control-preprocessor-models runs lineart_realistic; without the file, one line naming the
    flag and the file."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlnet import ControlNet

    image = refs["image"]
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="lineart_anime", processor_res=72,
                          preprocessor_models=models)
        gen = pipe.generate("a drawing", controlnets=[unit], **kw)
        by_hand = pipe("a drawing", controlnets=[("controlnet", preprocessors.preprocess(
            image, "lineart_anime", resolution=72, models=models, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: lineart_anime, Model: controlnet")
    png, out = tmp_path / "drawing.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a drawing", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "lineart_realistic"]
    assert main([*args, "--control-preprocessor-models", str(models), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: lineart_realistic, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "--control-preprocessor-models", str(tmp_path), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no sk_model.pth in {tmp_path}" in err and "--control-preprocessor-models" in err
