"""sdrt serve's sd-webui-controlnet slider table (``serve.controlnet.SLIDERS``, the extension's API view) and the
pipeline's preprocessor table (``pipelines.preprocessors.SPECS``, what a run takes) are written apart: the same
modules, and each threshold_a / threshold_b slider's default is the pipeline's default for that module's low / high,
so a served unit that leaves a slider at -1 runs as the Python API's unit without it."""

from __future__ import annotations

import pytest

from sdrt.pipelines.preprocessors import NAMES, SPECS
from sdrt.serve.controlnet import MODULES, SLIDERS


def test_the_server_offers_every_preprocessor_of_the_pipeline() -> None:
    # the extension's module names are sdrt's but for the soft edges (its "hed" is its label, sdrt's softedge_hed)
    assert set(MODULES.values()) == set(NAMES) and len(MODULES) == len(NAMES)
    assert set(SLIDERS) == set(MODULES)


@pytest.mark.parametrize("module", list(MODULES))
def test_each_sliders_default_is_the_pipelines(module: str) -> None:
    sliders = SLIDERS[module]
    name = MODULES[module]
    spec = SPECS[name]
    for k, pipe_slider in ((1, spec.low), (2, spec.high)):
        if name == "scribble":  # the extension's has a fixed level (127), the pipeline's default; no slider
            assert len(sliders) == 1 and (pipe_slider is None or pipe_slider.default == 127)
            continue
        served = sliders[k] if len(sliders) > k else None
        assert (served is None) == (pipe_slider is None), (name, k)
        if served is not None:
            assert float(served["value"]) == pipe_slider.default, (name, k)
    # a resolution slider exactly where the pipeline makes the map at a processor resolution
    has_res = bool(sliders) and sliders[0] is not None
    assert has_res == (spec.resolution is not None) or name in ("lineart_standard", "shuffle"), name
