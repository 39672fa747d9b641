"""The ``seg_anime_face`` preprocessor (the anime face segmentation UNet, UNet.pth) against the extension's code.

References: scripts/ref_anime_face.py ran the extension's own ``annotator/anime_face_segment`` (``UNet``,
``AnimeFaceSegment.__call__``) inside its processor's ``resize_image_with_pad`` / ``remove_pad``, on the seeded
UNet.pth animeface_helpers writes here (the published architecture: MobileNetV2's features and the decoder, 1.6 M
values); tests/data/animeface/animeface_refs.npz holds what it made. Measured on the reference backend, OpenVINO and
ggml: the scores within 3e-5 of torch's (values up to 5.1); every pixel equal at resolutions 44, 64 and 150 (read
at 512 x 512, 704 x 512 and 682 x 512, the map's top-left corner kept, as the extension crops it); 9 to 10 of 357 376 pixels
differing at 512 (OpenCV's bicubic and sdrt's differ by a level on a few input values, moving a near tie).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from animeface_helpers import make_weights, write_file  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import animeface, preprocessors  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "animeface"
#: the share of pixels whose class may differ from the extension's (a tie broken the other way); measured 3e-5
TIES = 0.002


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "animeface_refs.npz")


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    """sd-webui-controlnet's layout, names with DataParallel's ``module.`` (the extension strips it)."""
    root = tmp_path_factory.mktemp("animeface")
    return write_file(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "anime_face_segment",
                      prefix="module.")


def _differing(made: np.ndarray, want: np.ndarray) -> float:
    assert made.shape == want.shape and made.dtype == np.uint8
    return float((made != want).any(axis=-1).mean())


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_face_map_equals_the_extension(refs, pth, backend):
    register(backend)
    image = refs["image"]
    for res in (44, 64, 150):  # 150: read at 682 x 512, so the decoder's align-corners resizes are not identities
        made = preprocessors.preprocess(image, "seg_anime_face", resolution=res, models=pth, backend=backend)
        assert len(np.unique(refs[f"map_{res}"].reshape(-1, 3), axis=0)) >= 4  # not one class
        assert _differing(made, refs[f"map_{res}"]) <= TIES
    det = preprocessors.seg_anime_face(pth, backend)
    from sdrt.pipelines.controlmaps import processor_input

    padded, _ = processor_input(image, 44)  # the image's own size: padded only
    img = animeface._resized(padded)
    x = np.ascontiguousarray((img.astype(np.float32) / 255).transpose(2, 0, 1)[None])
    scores = det.session(*img.shape[:2]).run({"image": x})["scores"][0]
    np.testing.assert_allclose(scores[:, ::8, ::8], refs["scores_44"], atol=1e-4)
    img = animeface._resized(np.pad(image, ((0, 196), (0, 148), (0, 0)), mode="edge"))
    assert img.shape == (682, 512, 3)  # the decoder's skips are not twice the size below them
    x = np.ascontiguousarray((img.astype(np.float32) / 255).transpose(2, 0, 1)[None])
    scores = det.session(*img.shape[:2]).run({"image": x})["scores"][0]
    np.testing.assert_allclose(scores[:, ::8, ::8], refs["scores_682"], atol=1e-4)


def test_at_512_and_own_size(refs, pth):
    """At 512 the map is at the processor size (no resize: 698 x 512, padded 704 x 512); without a resolution the
    image is padded at its own size and read at 512 on its shorter side, the corner kept (as at 44, its own side)."""
    register("openvino")
    made = preprocessors.preprocess(refs["image"], "seg_anime_face", resolution=512, models=pth, backend="openvino")
    assert made.shape == (698, 512, 3) and _differing(made, refs["map_512"]) <= TIES
    made = preprocessors.preprocess(refs["image"], "seg_anime_face", resolution=None, models=pth, backend="openvino")
    assert _differing(made, refs["map_44"]) <= TIES
    assert {tuple(c) for c in made.reshape(-1, 3)} <= {tuple(c) for c in animeface.PALETTE}


def test_resize_is_torchvisions():
    assert animeface.net_size(64, 64) == (512, 512)
    assert animeface.net_size(704, 512) == (704, 512)
    assert animeface.net_size(128, 64) == (1024, 512)
    assert animeface.net_size(64, 192) == (512, 1536)
    assert animeface.net_size(192, 128) == (768, 512)


def test_files_and_errors(tmp_path, pth):
    arrays = make_weights()
    arrays.pop("de_block2.1.bias")
    with pytest.raises(ModelError, match="is not the anime face segmentation UNet") as e:
        animeface.AnimeFaceSeg(write_pth(tmp_path / "cut.pth", arrays))
    assert "\n" not in str(e.value) and "de_block2.1.bias" in str(e.value)
    from normalbae_helpers import write_file as write_normalbae

    with pytest.raises(ModelError, match="UNet.pth") as e:
        animeface.AnimeFaceSeg(write_normalbae(tmp_path / "nb"))
    assert "\n" not in str(e.value)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        animeface.AnimeFaceSeg(tmp_path / "junk.pth")
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="no UNet.pth in"):
        preprocessors.model_files("seg_anime_face", tmp_path, "models")
    comfy = tmp_path / "c" / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "bdsqlsz" / "qinglong_controlnet-lllite"
    write_file(comfy / "Annotators")
    assert preprocessors.model_files("seg_anime_face", tmp_path / "c", "m") == (comfy / "Annotators" / "UNet.pth",)
    assert preprocessors.model_files("seg_anime_face", pth.parents[5], "m") == (pth,)


def test_kept_and_counted(pth):
    register("openvino")
    preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "seg_anime_face", models=pth, backend="openvino")
    assert preprocessors.kept_detectors()[0][0] == "seg_anime_face"
    det = preprocessors.detector("seg_anime_face", pth)
    assert det.kind == "seg_anime_face" and det.weight_bytes() == 4 * sum(a.size for a in make_weights().values())


def test_in_a_controlnet_run(refs, pth):
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    image = refs["image"]
    with pytest.raises(InputError, match="seg_anime_face preprocessor needs UNet.pth"):
        parse_units([ControlNet("controlnet", image, preprocessor="seg_anime_face")])
    kw = dict(steps=1, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="seg_anime_face", processor_res=64, preprocessor_models=pth)
        gen = pipe.generate("a face", controlnets=[unit], **kw)
        by_hand = pipe("a face", controlnets=[("controlnet", preprocessors.preprocess(
            image, "seg_anime_face", resolution=64, models=pth, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: seg_anime_face, Model: controlnet")


def test_the_networks_image_is_bounded(tmp_path):
    """The UNet reads the image at 512 on its shorter side whatever the resolution: a long thin image is read far
    larger than it is given (64 x 8192 at 512 x 65536, 33.5 M pixels: tens of GB of activations). Refused in one
    line above MAX_NET_PIXELS, as the other networks' images are, by the run plan's map_size too, before any file is
    read; 64 x 4096 (512 x 32768) is within it."""
    from sdrt.pipelines.controlmaps import ControlImageError

    for call in (lambda: preprocessors.preprocess(np.zeros((64, 8192, 3), np.uint8), "seg_anime_face",
                                                  models=tmp_path),
                 lambda: preprocessors.preprocess(np.zeros((8, 1024, 3), np.uint8), "seg_anime_face", resolution=64,
                                                  models=tmp_path),
                 lambda: preprocessors.map_size("seg_anime_face", 8, 1024, 64)):
        with pytest.raises(ControlImageError, match="at 65536x512, 512 on its shorter side") as e:
            call()
        assert "\n" not in str(e.value)
    assert preprocessors.map_size("seg_anime_face", 64, 4096, None) == (64, 4096)
    assert animeface.MAX_NET_PIXELS == preprocessors.MAX_NET_PIXELS


def test_without_pillow_one_line(monkeypatch):
    """Pillow is an extra (sdrt[images]), not a core dependency: without it the resize to 512 is one line naming
    Pillow and how to install it (an image already 512 on its shorter side needs none)."""
    monkeypatch.setitem(sys.modules, "PIL", None)  # as when Pillow is not installed
    with pytest.raises(InputError, match="Pillow is not installed") as e:
        animeface._resized(np.zeros((64, 64, 3), np.uint8))
    assert "\n" not in str(e.value) and "pip install pillow" in str(e.value)
    assert animeface._resized(np.zeros((512, 576, 3), np.uint8)).shape == (512, 576, 3)
