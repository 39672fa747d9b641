"""``sdrt.serve.create_app(ServeConfig(...))`` as a Python user writes it (docs/serve.md): folders as strings,
one device or one token as a string, a folder that is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdrt.errors import InputError
from sdrt.serve.config import ServeConfig

pytest.importorskip("starlette", reason="the serve extra: pip install 'sdrt[serve]'")


def test_folders_given_as_strings_are_paths(tmp_path):
    """``ServeConfig(models="models")`` failed in create_app with AttributeError: 'str' object has no attribute
    'iterdir'."""
    config = ServeConfig(models=str(tmp_path), lora_dir=str(tmp_path), embedding_dir=str(tmp_path),
                         vae_dir=str(tmp_path), text_encoder_dir=str(tmp_path))
    assert config.models == config.lora_dir == config.embedding_dir == config.vae_dir == Path(tmp_path)
    assert config.text_encoder_dir == Path(tmp_path)


def test_one_device_or_token_as_a_string_is_one_not_its_letters():
    """``devices="CPU"`` was three workers on devices 'C', 'P' and 'U'; ``tokens="s3cret"`` let in the bearer
    tokens 's', '3', 'c', ...: single letters."""
    config = ServeConfig(devices="CPU", tokens="s3cret")
    assert config.devices == ("CPU",) and config.tokens == ("s3cret",)
    with pytest.raises(InputError, match="auth"):
        ServeConfig(auth="alice:s3cret")
    assert ServeConfig(auth=[("alice", "s3cret")]).auth == (("alice", "s3cret"),)


def test_a_missing_models_folder_is_one_error_naming_it(tmp_path):
    from sdrt.serve import create_app

    with pytest.raises(InputError, match="models .*does not exist"):
        create_app(ServeConfig(models=tmp_path / "nope"))
