"""The MIGraphX backend's part of the compile cache: what keys a program, and its options."""

from __future__ import annotations

import pytest

from sdrt import Device
from sdrt_migraphx.backend import MIGraphXBackend
from sdrt_migraphx.options import parse_options

GPU = Device(backend="migraphx", id="gpu:0", kind="gpu", properties={"target": "gpu", "gfx_target": "gfx1100"})
REF = Device(backend="migraphx", id="ref", kind="cpu", properties={"target": "ref"})


def key(device=GPU, version="2.15.0", **options):
    return tuple(MIGraphXBackend.cache_parts(device, version, parse_options(options, gpu=device.kind == "gpu")))


def test_cache_key_changes_with_each_part():
    base = key()
    other_gfx = Device(backend="migraphx", id="gpu:0", kind="gpu",
                       properties={"target": "gpu", "gfx_target": "gfx942"})
    variants = [key(device=other_gfx), key(device=REF), key(version="2.16.0"),
                key(precision="fp32"), key(exhaustive_tune=True), key(fast_math=False)]
    assert len({base, *variants}) == len(variants) + 1


@pytest.mark.parametrize("bad", [{"precision": "int3"}, {"precision": "int8"}, {"exhaustive_tune": "yes"},
                                 {"workspace": 1}])
def test_bad_options_are_refused_with_what_to_do(bad):
    from sdrt.errors import SdrtError

    with pytest.raises(SdrtError) as info:
        parse_options(bad, gpu=True)
    assert "What to do:" in str(info.value) and "sdrt.load(..., backend='migraphx')" in str(info.value)


def test_precision_defaults_to_fp16_on_gpus_and_fp32_on_ref():
    assert parse_options({}, gpu=True).precision == "fp16"
    assert parse_options({}, gpu=False).precision == "fp32"
    assert parse_options({"precision": "float16"}, gpu=False).precision == "fp16"
    assert parse_options({"exhaustive_tune": True}, gpu=True).exhaustive_tune is True
