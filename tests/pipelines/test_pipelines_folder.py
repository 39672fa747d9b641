"""Model folders: family detection and every way a folder can be incomplete or malformed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pipeline_helpers import DATA

from sdrt.errors import ModelError, ModelNotFoundError
from sdrt.pipelines import DEMO_MODEL, ModelFolder


@pytest.mark.parametrize(("folder", "family", "prediction"), [
    ("tiny-sd15", "sd1", "eps"), ("tiny-sd15-inpaint", "sd1", "eps"), ("tiny-sd2v", "sd2", "v"),
    ("tiny-sdxl", "sdxl", "eps"), ("tiny-sd2-inpaint", "sd2", "eps"), ("tiny-sdxl-inpaint", "sdxl", "eps"),
])
def test_family_and_prediction(folder: str, family: str, prediction: str) -> None:
    f = ModelFolder.open(DATA / folder)
    assert (f.family, f.prediction) == (family, prediction)
    assert f.vae_scaling_factor == (0.13025 if family == "sdxl" else 0.18215)
    assert f.force_zeros_for_empty_prompt == (family == "sdxl")


def test_demo_model_is_a_complete_folder() -> None:
    f = ModelFolder.open(DEMO_MODEL)
    assert set(f.parts) >= {"text_encoder", "unet", "vae_decoder"}


def _copy(tmp_path: Path, name: str = "tiny-sd15") -> Path:
    dst = tmp_path / name
    shutil.copytree(DATA / name, dst)
    return dst


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        ModelFolder.open(tmp_path / "nope")


def test_a_folder_of_model_folders_names_them(tmp_path: Path) -> None:
    """A download that keeps the ONNX export beside the diffusers one (MODEL/onnx/, MODEL/diffusers/): the error
    listed text_encoder/, unet/ and vae_decoder/ as missing under MODEL, three paths that never existed."""
    shutil.copytree(DEMO_MODEL, tmp_path / "onnx")
    (tmp_path / "notes").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"holds model folders, not a model: onnx/.*pass one of them: "):
        ModelFolder.open(tmp_path)


def test_a_single_onnx_file_is_not_a_folder() -> None:
    with pytest.raises(ModelError, match="needs a model folder or a .safetensors checkpoint, not one .onnx graph"):
        ModelFolder.open(DATA / "tiny-sd15" / "unet" / "model.onnx")


@pytest.mark.parametrize("part", ["unet", "text_encoder", "vae_decoder"])
def test_missing_required_part_names_it(tmp_path: Path, part: str) -> None:
    folder = _copy(tmp_path)
    shutil.rmtree(folder / part)
    with pytest.raises(ModelNotFoundError, match=f"lacks {part}") as info:
        ModelFolder.open(folder)
    assert str(folder / part / "model.onnx") in str(info.value)


def test_part_folder_without_model_onnx(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    (folder / "unet" / "model.onnx").unlink()
    with pytest.raises(ModelNotFoundError, match="the unet folder has no model.onnx"):
        ModelFolder.open(folder)


def test_sdxl_without_second_encoder(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "tiny-sdxl")
    shutil.rmtree(folder / "text_encoder_2")
    with pytest.raises(ModelNotFoundError, match="lacks text_encoder_2"):
        ModelFolder.open(folder)


def test_missing_tokenizer(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    (folder / "tokenizer" / "merges.txt").unlink()
    with pytest.raises(ModelNotFoundError, match=r"tokenizer/ lacks merges.txt\. Where"):  # the one it lacks
        ModelFolder.open(folder)
    shutil.rmtree(folder / "tokenizer")  # no folder at all: said so, not "has no vocab.json and merges.txt"
    with pytest.raises(ModelNotFoundError, match="has no tokenizer/ folder"):
        ModelFolder.open(folder)


@pytest.mark.parametrize("file", ["model_index.json", "scheduler/scheduler_config.json", "unet/config.json"])
def test_malformed_json(tmp_path: Path, file: str) -> None:
    folder = _copy(tmp_path)
    (folder / file).write_text("{not json")
    with pytest.raises(ModelError, match="not valid JSON") as info:
        ModelFolder.open(folder)
    assert file.split("/")[-1] in str(info.value)


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    (folder / "model_index.json").write_text("[1, 2]")
    with pytest.raises(ModelError, match="not a JSON object"):
        ModelFolder.open(folder)


def test_unsupported_prediction_type(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    cfg = folder / "scheduler" / "scheduler_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "prediction_type": "x_start"}))
    with pytest.raises(ModelError, match="prediction_type 'x_start' is not supported"):
        ModelFolder.open(folder)
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "prediction_type": "sample"}))
    assert ModelFolder.open(folder).prediction == "x0"  # diffusers' x0 (tests/checkpoint/test_x0_prediction.py)


def test_missing_scheduler_uses_sd_release_schedule(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = _copy(tmp_path)
    shutil.rmtree(folder / "scheduler")
    f = ModelFolder.open(folder)
    assert f.scheduler["beta_schedule"] == "scaled_linear"
    assert "no scheduler" in caplog.text


def test_img2img_without_vae_encoder_names_the_part(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    shutil.rmtree(folder / "vae_encoder")
    f = ModelFolder.open(folder)
    with pytest.raises(ModelNotFoundError, match="no vae_encoder part"):
        f.part_file("vae_encoder")
