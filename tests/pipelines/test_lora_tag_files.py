"""A prompt's ``<lora:name:w>`` tag whose file is no LoRA is refused as that tag's, not as a file the caller never
named (it read "pass the model or weights file this takes; a picture is an input: --init-image for img2img")."""

from __future__ import annotations

import pytest
from PIL import Image
from pipeline_helpers import register

from sdrt import pipelines
from sdrt.errors import SdrtError


@pytest.mark.parametrize("key", ["prompt", "negative_prompt"])
def test_a_tag_whose_file_is_a_picture_names_the_tag(tmp_path, key):
    register("reference")
    Image.new("RGB", (8, 8)).save(tmp_path / "pic.safetensors", format="PNG")
    with pipelines.load(pipelines.DEMO_MODEL, backend="reference") as pipe:
        pipe.weights.lora_dir = tmp_path
        texts = {"prompt": "a cat", "negative_prompt": "blurry"}
        texts[key] += " <lora:pic:0.7>"
        with pytest.raises(SdrtError) as err:
            pipe(texts["prompt"], texts["negative_prompt"], steps=1, seed=1)
    assert str(err.value).startswith(f"<lora:pic:0.7> in {key}: pic.safetensors cannot be read as a LoRA"), \
        str(err.value)
    assert err.value.where == key
    assert "PNG image" in err.value.what
    assert "--init-image" not in str(err.value) and "init_image" not in str(err.value)
    assert "replace pic.safetensors in the LoRA folder" in str(err.value)
