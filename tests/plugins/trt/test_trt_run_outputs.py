"""``Session.run(outputs=)`` on a TensorRT-RTX session (the base class's default over ``_run``); needs its GPU."""

from __future__ import annotations

from outputs_helpers import check_run_outputs, two_outputs

import sdrt


def test_run_returns_the_outputs_asked_for(backend, gpu):
    with backend.compile(sdrt.Graph.load(two_outputs()), None, gpu) as sess:
        check_run_outputs(sess, atol=1e-3)
