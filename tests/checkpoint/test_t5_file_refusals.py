"""A T5-XXL file that would be read and checked, then not used, is refused in one line naming the flag:
``--no-t5`` (``t5=False``) with a ``--text-encoder`` T5 file, and a T5 file given to an SD3 folder without
``text_encoder_3/`` (the pipeline ran on CLIP alone and said nothing of the file). Headers only (sparse files)."""

from __future__ import annotations

from pathlib import Path

import pytest
import single_file_helpers as h
from test_open_single_file import clip_shapes, t5_shapes

from sdrt import pipelines
from sdrt.cli import main
from sdrt.errors import InputError, ModelError

SD3 = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd3"


@pytest.fixture
def t5(tmp_path) -> Path:
    return h.sparse(tmp_path / "t5xxl_fp16.safetensors", t5_shapes())


@pytest.fixture
def bare_sd3(tmp_path) -> Path:
    """The tiny SD3 folder without text_encoder_3/ and tokenizer_3/ (the other parts linked)."""
    root = tmp_path / "sd3-no-t5"
    root.mkdir()
    for entry in SD3.iterdir():
        if entry.name not in ("text_encoder_3", "tokenizer_3") and not entry.name.startswith("refs"):
            (root / entry.name).symlink_to(entry)
    return root


def _cli_error(capsys, *argv) -> str:
    assert main(["generate", *[str(a) for a in argv], "--backend", "reference", "--steps", "1",
                 "--width", "64", "--height", "64", "--dry-run"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_no_t5_with_a_t5_file_is_refused(registry, t5, tmp_path, capsys):
    with pytest.raises(InputError, match="text_encoders t5xxl_fp16.safetensors is a T5-XXL text encoder, and t5=False leaves T5 out"):
        pipelines.load(SD3, backend="reference", t5=False, text_encoders=[t5])
    err = _cli_error(capsys, SD3, "a cat", "--no-t5", "--text-encoder", t5)
    assert "--no-t5" in err and "--text-encoder t5xxl_fp16.safetensors is a T5-XXL" in err, err
    clip = h.sparse(tmp_path / "clip_l.safetensors", clip_shapes(768))  # not T5: this check lets it through
    with pytest.raises(Exception) as exc:
        pipelines.load(SD3, backend="reference", t5=False, text_encoders=[clip])
    assert "t5=False" not in str(exc.value)


def test_a_t5_file_on_a_folder_without_t5_is_refused(registry, t5, bare_sd3, capsys):
    with pytest.raises(ModelError, match="text_encoders: t5xxl_fp16.safetensors is a T5-XXL text encoder, and this "
                                         "SD3 folder has no text_encoder_3"):
        pipelines.load(bare_sd3, backend="reference", text_encoders=[t5])
    err = _cli_error(capsys, bare_sd3, "a cat", "--text-encoder", t5)
    assert "--text-encoder: t5xxl_fp16.safetensors" in err and "text_encoder_3/ and tokenizer_3/" in err, err
