"""``Session.run(outputs=)`` on a Core ML session (the base class's default over ``_run``); runs on macOS."""

from __future__ import annotations

import platform

import pytest
from outputs_helpers import check_run_outputs, two_outputs

import sdrt


@pytest.mark.skipif(platform.system() != "Darwin", reason="Core ML runs models only on macOS; this machine is "
                    f"{platform.system()}")
def test_run_returns_the_outputs_asked_for(backend):
    with sdrt.load(two_outputs(), backend="coreml", device="CPU") as sess:
        check_run_outputs(sess, atol=1e-3)
