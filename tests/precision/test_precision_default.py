"""The default precision per device (sdrt.precision_default): the rule, SDRT_PRECISION, and the image bar.

The bar test runs a tiny pipeline folder at OpenVINO's default precision on this CPU and at float32, and
holds the PSNR of each image against float32's at ``PSNR_BAR_DB`` (docs/precision.md has the full table).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from sdrt.precision_default import PSNR_BAR_DB, choose, cpu_bf16_fast, override, psnr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))


@pytest.mark.parametrize(("kind", "offered", "bf16", "want"), [
    ("cpu", ["fp32", "fp16", "bf16"], False, "fp32"),  # AVX2-only: bf16 would be emulated
    ("cpu", ["fp32", "bf16"], True, "bf16"),           # AVX-512-BF16 or AMX
    ("cpu", ["fp32"], True, "fp32"),                   # a backend without bf16
    ("gpu", ["fp32", "fp16", "bf16"], False, "fp16"),
    ("gpu", ["fp32"], False, "fp32"),
    ("npu", ["f32", "f16"], False, "fp16"),            # aliases count
])
def test_choose_is_the_fastest_within_the_bar(kind, offered, bf16, want):
    assert choose(kind, offered, bf16_fast=bf16) == want


def test_bf16_units_are_avx512_bf16_or_amx():
    assert cpu_bf16_fast(["avx2", "avx512f", "avx512_bf16"])
    assert cpu_bf16_fast(["amx_tile", "amx_bf16"])
    assert not cpu_bf16_fast(["avx2", "fma", "f16c", "avx512f"])


def test_sdrt_precision_replaces_the_default_only_when_offered(monkeypatch):
    monkeypatch.setenv("SDRT_PRECISION", "BFloat16")
    assert override(["fp32", "bf16"]) == "bf16"
    assert override(["fp32"]) is None
    monkeypatch.delenv("SDRT_PRECISION")
    assert override(["fp32", "bf16"]) is None


def test_sdrt_precision_that_names_no_precision_is_an_error_and_info_says_so(monkeypatch):
    """Not silently ignored: an error naming the variable and the accepted names where it is read, and in
    sdrt info."""
    from sdrt.cli.info import collect, render
    from sdrt.precision import PrecisionError

    monkeypatch.setenv("SDRT_PRECISION", "bogus")
    with pytest.raises(PrecisionError, match=r"SDRT_PRECISION='bogus' names no precision\. Where: the environment "
                       r"variable SDRT_PRECISION\. What to do: set it to one of fp32, fp16, bf16"):
        override(["fp32", "bf16"])
    text = render(collect())
    assert "SDRT_PRECISION=bogus: error: SDRT_PRECISION='bogus' names no precision" in text
    monkeypatch.setenv("SDRT_PRECISION", "half")
    assert "SDRT_PRECISION=half: fp16 wherever a backend offers it" in render(collect())


def test_psnr():
    a = np.zeros((4, 4, 3), np.uint8)
    assert psnr(a, a) == float("inf")
    b = a.copy()
    b[0, 0, 0] = 255  # one value off by 255 of 48: MSE 255^2/48
    assert psnr(b, a) == pytest.approx(10 * np.log10(48))
    with pytest.raises(ValueError):
        psnr(a, a[:2])


@pytest.fixture
def openvino_cpu(registry, tmp_path, monkeypatch):
    pytest.importorskip("openvino", reason="the openvino package is not installed")
    import sdrt_openvino

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SDRT_PRECISION", raising=False)
    registry.register_plugin(sdrt_openvino, "openvino", distribution="sdrt-openvino", version="0.1.0")
    be = registry.backends["openvino"]
    return be, next(d for d in be.devices() if d.id == "CPU")


def test_openvino_default_follows_the_cpu(openvino_cpu, monkeypatch):
    import sdrt
    from sdrt.testing.models import build

    be, cpu = openvino_cpu
    want = "bf16" if "BF16" in cpu.properties["capabilities"] else "fp32"
    assert be.precision_for(cpu) == want == cpu.properties["precision"]
    model = build("mobilenet_v2", "tiny")[0].SerializeToString()
    hint = {"bf16": "bfloat16", "fp32": "float32"}
    with sdrt.load(model, backend="openvino", device="CPU", cache=False) as s:
        assert hint[want] in str(s.property("INFERENCE_PRECISION_HINT"))
    with sdrt.load(model, backend="openvino", device="CPU", cache=False, precision="fp32") as s:
        assert "float32" in str(s.property("INFERENCE_PRECISION_HINT"))  # precision= overrides the default
    monkeypatch.setenv("SDRT_PRECISION", "fp32")
    assert be.precision_for(cpu) == "fp32"


def test_info_shows_the_default_per_device(openvino_cpu):
    from sdrt.cli.info import collect, render

    be, cpu = openvino_cpu
    info = collect()
    ov = next(b for p in info["plugins"] for b in p["backends"] if b["name"] == "openvino")
    assert ov["default_precision"][str(cpu)] == be.precision_for(cpu)
    assert f"device {cpu}  default precision {be.precision_for(cpu)}" in render(info)


@pytest.mark.parametrize("folder", ["tiny-sd15", "tiny-sd2v"])
def test_openvino_default_image_within_the_bar(openvino_cpu, folder):
    from pipeline_helpers import DATA

    from sdrt import pipelines

    be, cpu = openvino_cpu
    default = be.precision_for(cpu)
    if default == "fp32":
        pytest.skip("OpenVINO's default on this CPU is float32 (no AVX-512-BF16 or AMX): nothing to bound")
    images = {}
    for precision in (default, "fp32"):
        pipe = pipelines.load(DATA / folder, backend="openvino", precision=precision)
        images[precision] = pipe.generate("an astronaut riding a horse on the moon", "blurry, lowres", steps=20,
                                          cfg=7.0, sampler="Euler", seed=1).images[0]
    assert psnr(images[default], images["fp32"]) >= PSNR_BAR_DB
