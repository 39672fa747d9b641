"""sdrt serve's sd-webui-controlnet slider table (``serve.controlnet.SLIDERS``, the extension's API view) and the
pipeline's preprocessor table (``pipelines.preprocessors.SPECS``, what a run takes) are written apart: the same
modules, and each threshold_a / threshold_b slider's default is the pipeline's default for that module's low / high,
so a served unit that leaves a slider at -1 runs as the Python API's unit without it."""

from __future__ import annotations

import pytest

from sdrt.pipelines.preprocessors import NAMES, SPECS
from sdrt.serve.controlnet import _UI_RES, ALIASES, MODULES, SLIDERS

#: the extension's module name of each pipeline preprocessor (the same but where its UI renamed one, and the
#: pipeline took the UI's name: "lineart" is lineart_realistic, "depth" depth_midas)
MODULE_OF = {pre: module for module, pre in MODULES.items()}


def test_the_server_offers_every_preprocessor_of_the_pipeline() -> None:
    assert set(MODULES.values()) == set(NAMES) and len(MODULE_OF) == len(MODULES)
    assert all(m == p or ALIASES.get(m) == p for m, p in MODULES.items())
    assert set(SLIDERS) == set(MODULES)


@pytest.mark.parametrize("name", NAMES)
def test_each_sliders_default_is_the_pipelines(name: str) -> None:
    sliders = SLIDERS[MODULE_OF[name]]
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
    # (or, for a module outside the extension's slider config, the resolution its UI shows: lineart_standard, ...)
    assert has_res == (spec.resolution is not None) or MODULE_OF[name] in _UI_RES, name
