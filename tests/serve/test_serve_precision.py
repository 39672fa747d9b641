"""``sdrt serve --precision`` and ``--quantize`` (``ServeConfig(precision=..., quantize=...)``): every model the
server compiles runs at that precision, with those weights.

The server runs with ``SDRT_PRECISION=bf16`` in its environment and ``--precision fp32``; its image is the Python
API's at ``precision="fp32"``, and each part of the pipeline it built compiled with that option.
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import register
from serve_helpers import live_server, needs_server, png_rgb

from sdrt import pipelines
from sdrt.errors import SdrtError

httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")


def test_the_flag_is_checked_against_the_backend_before_the_server_starts() -> None:
    from sdrt.cli import build_parser
    from sdrt.cli.serve import config_from_args

    register("openvino")
    config = config_from_args(build_parser().parse_args(["serve", "--backend", "openvino", "--precision", "float32"]))
    assert config.precision == "fp32"
    assert config_from_args(build_parser().parse_args(["serve"])).precision is None
    with pytest.raises(SdrtError, match="precision 'int8' is not one this backend accepts") as caught:
        config_from_args(build_parser().parse_args(["serve", "--backend", "openvino", "--precision", "int8"]))
    assert caught.value.where == "--precision"
    register("reference")
    with pytest.raises(SdrtError, match="the reference backend computes in fp32 only, not 'bf16'"):
        config_from_args(build_parser().parse_args(["serve", "--backend", "reference", "--precision", "bf16"]))
    config = config_from_args(build_parser().parse_args(["serve", "--backend", "reference", "--precision", "fp32"]))
    assert config.precision is None  # the reference backend takes no precision option: float32 is what it does


def test_the_config_refuses_a_word_that_names_no_precision() -> None:
    from sdrt.serve import ServeConfig

    assert ServeConfig(precision="Float32").precision == "fp32"
    with pytest.raises(SdrtError, match="precision 'fastest' is not one") as caught:
        ServeConfig(precision="fastest")
    assert caught.value.where == "ServeConfig(precision=...)"
    with pytest.raises(SdrtError, match="unknown weight quantization 'int3'") as caught:
        ServeConfig(quantize="int3")
    assert caught.value.where == "ServeConfig(quantize=...)"


def test_the_quantize_flag_is_checked_before_the_server_starts() -> None:
    from sdrt.cli import build_parser
    from sdrt.cli.serve import config_from_args

    assert config_from_args(build_parser().parse_args(["serve", "--quantize", "int4-64"])).quantize == "int4-64"
    assert config_from_args(build_parser().parse_args(["serve"])).quantize is None
    with pytest.raises(SdrtError, match="unknown weight quantization 'int3'") as caught:
        config_from_args(build_parser().parse_args(["serve", "--quantize", "int3"]))
    assert caught.value.where == "--quantize"


def _served_and_api(backend: str, steps: int, seed: int, **options) -> tuple[np.ndarray, np.ndarray]:
    """The image a server with ``ServeConfig(backend=..., **options)`` answers to one txt2img, and the one
    ``pipelines.load(..., **options)`` makes for the same job (its parts checked to have compiled with them)."""
    from sdrt.serve import ServeConfig

    job = {"prompt": "a red circle on a blue background", "steps": steps, "seed": seed, "width": 64, "height": 64,
           "sampler_name": "Euler"}
    with live_server(ServeConfig(backend=backend, **options)) as url, httpx.Client(base_url=url, timeout=300) as c:
        r = c.post("/sdapi/v1/txt2img", json=job)
        assert r.status_code == 200, r.text
        got = png_rgb(r.json()["images"][0])
    with pipelines.load(pipelines.DEMO_MODEL, backend=backend, **options) as pipe:
        if "precision" in options:
            assert {part.options.get("precision") for part in pipe._parts.values()} == {options["precision"]}
        want = pipe.generate(job["prompt"], steps=steps, seed=seed, width=64, height=64, sampler="Euler").images[0]
    return got, want


@needs_server
def test_a_served_image_has_the_servers_quantized_weights() -> None:
    register("reference")
    got, want = _served_and_api("reference", 2, 5, quantize="int8")
    assert np.array_equal(got, want)


@needs_server
def test_a_served_image_is_computed_at_the_servers_precision(monkeypatch) -> None:
    register("openvino")
    monkeypatch.setenv("SDRT_PRECISION", "bf16")
    got, want = _served_and_api("openvino", 3, 7, precision="fp32")
    assert np.array_equal(got, want)
