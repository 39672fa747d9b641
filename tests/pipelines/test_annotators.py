"""sdrt.pipelines.annotators.find: what the API's preprocessor_models takes, and one line for what it does not."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError  # noqa: E402
from sdrt.pipelines.annotators import find  # noqa: E402


@pytest.mark.parametrize("models", [5, 3.5, b"/tmp", {"a": 1}, [5], [""], ""])
@pytest.mark.parametrize("name", ["mlsd", "dw_openpose_full", "depth_midas"])
def test_models_that_are_no_paths_are_one_line(models, name):
    """A number, bytes, a mapping, a list holding a non-path or an empty path: one line naming the argument (a
    number or bytes went into Path() or were iterated: a TypeError's traceback; "" searched the current folder)."""
    with pytest.raises(InputError) as e:
        find(name, models, "controlnets[0] preprocessor_models")
    assert "\n" not in str(e.value) and str(e.value).startswith("controlnets[0] preprocessor_models")


def test_a_pathlike_is_a_path(tmp_path):
    (tmp_path / "mlsd_large_512_fp32.pth").write_bytes(b"x")

    class Folder:
        def __fspath__(self) -> str:
            return str(tmp_path)

    assert find("mlsd", Folder(), "m") == (tmp_path / "mlsd_large_512_fp32.pth",)


def test_a_unit_with_a_number_for_its_files_is_refused_in_its_words():
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(InputError, match=r"^controlnets\[0\] preprocessor_models must be a folder"):
        parse_units([ControlNet("controlnet", img, preprocessor="mlsd", preprocessor_models=5)])
    with pytest.raises(InputError, match=r"^controlnets\[0\] pose_models must be a folder"):
        parse_units([ControlNet("controlnet", img, preprocessor="openpose", pose_models=b"/x")])


def test_a_unit_whose_file_is_not_the_model_names_its_argument(tmp_path):
    """The file's refusal (here a cut-short download) names the file in its message and the unit's argument as
    where (the CLI's --control-preprocessor-models, serve's unit field), once: the reader's own "Where: ... What to
    do: ..." is not repeated inside it."""
    from sdrt.errors import ModelError
    from sdrt.pipelines.controlnet import ControlNet, detect, parse_units

    register("reference")
    bad = tmp_path / "mlsd_large_512_fp32.pth"
    bad.write_bytes(b"PK\x03\x04 cut short")
    img = np.zeros((8, 8, 3), np.uint8)
    (unit,) = parse_units([ControlNet("controlnet", img, preprocessor="mlsd", preprocessor_models=tmp_path)])
    unit.pose_backend = "reference"
    with pytest.raises(ModelError) as e:
        detect(unit, 64, 64, "controlnets[0]")
    assert e.value.where == "controlnets[0] preprocessor_models" and str(bad) in e.value.what, str(e.value)
    assert str(e.value).count("Where:") == 1 and str(e.value).count("What to do:") == 1, str(e.value)
    assert "--control-preprocessor-models" in e.value.render({"controlnets[0] preprocessor_models":
                                                              "--control-preprocessor-models"})


@pytest.mark.parametrize("name,file,sub", [
    # the extension reads mlsd's and midas' files from their code folder first (old_modeldir), where older
    # installs downloaded them
    ("mlsd", "mlsd_large_512_fp32.pth", "extensions/sd-webui-controlnet/annotator/mlsd"),
    ("depth_midas", "dpt_hybrid-midas-501f0c75.pt", "extensions/sd-webui-controlnet/annotator/midas"),
    # lllyasviel/ControlNet's annotator/ckpts (the extension's download URL; controlnet_aux's ckpts/<repo>/subfolder)
    ("normal_midas", "dpt_hybrid-midas-501f0c75.pt", "custom_nodes/comfyui_controlnet_aux/ckpts/lllyasviel/ControlNet/"
                                                     "annotator/ckpts"),
    ("mlsd", "mlsd_large_512_fp32.pth", "annotator/ckpts"),
])
def test_the_extensions_older_folder_and_lllyasviels_controlnet_layout(tmp_path, name, file, sub):
    (tmp_path / sub).mkdir(parents=True)
    (tmp_path / sub / file).write_bytes(b"x")
    assert find(name, tmp_path, "m") == (tmp_path / sub / file,)


def test_the_older_folder_first_as_the_extension_reads_it(tmp_path):
    for sub in ("annotator/mlsd", "annotator/downloads/mlsd"):
        (tmp_path / "extensions/sd-webui-controlnet" / sub).mkdir(parents=True)
        (tmp_path / "extensions/sd-webui-controlnet" / sub / "mlsd_large_512_fp32.pth").write_bytes(b"x")
    assert find("mlsd", tmp_path, "m")[0].parent.name == "mlsd" and "downloads" not in str(find("mlsd", tmp_path, "m"))


def test_mlsd_thresholds_beyond_float32_draw_nothing_without_a_warning():
    """The sliders take any number >= 0: one beyond float32 (1e308) is infinite in the float32 comparison, as NumPy 2
    makes it, so no line passes; numpy's "overflow encountered in cast" warning reached the server's log and the
    terminal."""
    import warnings

    from sdrt.pipelines.mlsdmaps import decode

    out = np.zeros((16, 16, 16), np.float32)
    out[7] = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    out[8:12] = 3.0 * np.random.default_rng(1).standard_normal((4, 16, 16)).astype(np.float32)
    assert len(decode(out, 0.0, 0.0)) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(decode(out, 1e308, 0.1)) == 0 and len(decode(out, 0.1, 1e308)) == 0


def test_a_midas_file_whose_position_grid_is_empty_is_one_line(tmp_path):
    """A DPT-Hybrid whose pos_embed holds the class token's row alone (no grid) is checked against the published
    sizes, a one-line ModelError; its empty grid passed the check and broke the graph's build with numpy's
    ValueError (a traceback, a 500 in serve)."""
    from midas_helpers import SMALL, make_weights
    from openpose_helpers import write_pth

    from sdrt.errors import ModelError
    from sdrt.pipelines.midasdepth import MidasDepth

    register("reference")
    arrays = make_weights(SMALL)
    arrays["pretrained.model.pos_embed"] = arrays["pretrained.model.pos_embed"][:, :1]
    path = write_pth(tmp_path / "dpt_hybrid-midas-501f0c75.pt", arrays)
    with pytest.raises(ModelError, match="DPT-Hybrid") as e:
        with MidasDepth(path, backend="reference") as det:
            det.maps(np.zeros((64, 64, 3), np.uint8))
    assert "\n" not in str(e.value)


def test_a_cut_short_dwpose_graph_is_one_line(tmp_path):
    """A yolox_l.onnx that is not an ONNX graph (a cut-short download, another file under its name) was
    protobuf's DecodeError traceback (a crash on the CLI, a 500 in serve)."""
    from sdrt.errors import ModelError
    from sdrt.pipelines.posedetect import DWPose

    register("reference")
    for name in ("yolox_l.onnx", "dw-ll_ucoco_384.onnx"):
        (tmp_path / name).write_bytes(b"\x0a\xff\xff\xff junk")
    with pytest.raises(ModelError, match="yolox_l.onnx could not be read as an ONNX graph") as e:
        DWPose(tmp_path / "yolox_l.onnx", tmp_path / "dw-ll_ucoco_384.onnx", backend="reference")
    assert "\n" not in str(e.value) and e.value.where == str(tmp_path / "yolox_l.onnx")
