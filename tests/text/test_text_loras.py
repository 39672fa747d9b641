"""A1111 <lora:name:weight> tags."""

from __future__ import annotations

import pytest

from sdrt.errors import InputError
from sdrt.text import extract_loras


def test_loras_are_taken_out_in_order():
    text, loras = extract_loras("a cat <lora:ink style:0.7>, snow <lora:add_detail> <lyco:old:1.5>")
    assert text == "a cat , snow  "
    assert loras == [("ink style", 0.7), ("add_detail", 1.0), ("old", 1.5)]


def test_named_and_extra_arguments():
    assert extract_loras("<lora:a:0.5:0.2>")[1] == [("a", 0.5)]
    assert extract_loras("<lora:a:te=0.3:unet=1>")[1] == [("a", 0.3)]
    assert extract_loras("<lora:a:-1>")[1] == [("a", -1.0)]


def test_lookalikes_stay_and_other_tags_go_as_in_a1111():
    for text in ("<lora>", "<lora:>", "a < b > c"):
        assert extract_loras(text) == (text, [])
    for text in ("a <hypernet:h:1>", "a <embedding:x>"):  # A1111 removes every extra-network tag from the text
        assert extract_loras(text) == ("a ", [])


def test_a_bad_weight_or_no_name_is_an_error_naming_the_tag():
    """It was skipped with a warning, and the image made without the LoRA asked for (as <lora:a:nan> never was)."""
    with pytest.raises(InputError) as info:
        extract_loras("x <lora:a:strong> y")
    assert str(info.value) == ("the weight 'strong' of <lora:a:strong> is not a number. Where: prompt. "
                               "What to do: write a number, e.g. <lora:a:0.8>.")
    with pytest.raises(InputError, match="Where: negative_prompt"):
        extract_loras("<lora:a:abc>", "negative_prompt")
    with pytest.raises(InputError, match="names no LoRA"):
        extract_loras("<lora::1>")
