"""The one precision vocabulary (``sdrt.precision.PRECISIONS``): aliases, and one clear error."""

from __future__ import annotations

import pytest

from sdrt.errors import SdrtError
from sdrt.precision import HALF_TYPES, PRECISIONS, PrecisionError, precision_name


@pytest.mark.parametrize(("value", "name"), [
    ("fp32", "fp32"), ("F32", "fp32"), ("float32", "fp32"), ("float", "fp32"),
    ("fp16", "fp16"), ("f16", "fp16"), ("float16", "fp16"), ("half", "fp16"), (" Half ", "fp16"),
    ("bf16", "bf16"), ("bfloat16", "bf16"), ("int8", "int8"), ("i8", "int8"), ("int4", "int4"),
    ("fp8", "fp8"), ("float8_e4m3fn", "fp8"),
])
def test_aliases_give_the_canonical_name(value, name):
    assert precision_name(value) == name


def test_every_alias_is_in_one_table_once():
    aliases = [a for name, more in PRECISIONS.items() for a in (name, *more)]
    assert len(aliases) == len(set(aliases))
    assert set(PRECISIONS) == {"fp32", "fp16", "bf16", "int8", "int4", "fp8"}
    assert HALF_TYPES["half"] == "float16" and HALF_TYPES["bf16"] == "bfloat16" and "fp32" not in HALF_TYPES


@pytest.mark.parametrize("value", ["int3", "fp64", "", None, 16, "int8"])
def test_a_wrong_value_is_one_error_listing_what_is_accepted(value):
    with pytest.raises(PrecisionError) as info:
        precision_name(value, ("fp16", "fp32"), where="sdrt.load(..., backend='x') precision=")
    text = str(info.value)
    assert isinstance(info.value, SdrtError) and "\n" not in text
    assert f"precision {value!r} is not one this backend accepts" in text
    assert "fp16 (f16, float16, half); fp32 (f32, float32, float)" in text and "backend='x'" in text
    if value == "int8":
        assert "int8 is a precision this backend does not offer" in text


@pytest.mark.parametrize("backend", ["openvino", "trt", "coreml", "migraphx"])
def test_every_plugin_takes_its_precision_through_the_vocabulary(backend):
    """Each plugin's options parser accepts an alias and refuses a value with the core's error."""
    import importlib

    mod = importlib.import_module(f"sdrt_{backend}.options")
    kwargs = {"gpu": True} if backend == "migraphx" else {}
    assert mod.parse_options({"precision": "float32"}, **kwargs).precision in ("fp32", "f32")
    with pytest.raises(PrecisionError, match="fp32 \\(f32, float32"):
        mod.parse_options({"precision": "double"}, **kwargs)
