"""Property-based test: random small graphs on ggml (in child processes) against onnxruntime.

The CI run is small; ``nox -s ggml_fuzz`` (``scripts/ggml_fuzz.py``) runs tens of thousands.
"""

from __future__ import annotations

import pytest
from fuzz_graphs import graph_plans, run_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("onnxruntime", reason="onnxruntime is the reference for the random graphs")


@settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(graph_plans(), min_size=20, max_size=20))
def test_random_graphs_never_abort_and_match_onnxruntime(plans):
    bad = [o for o in run_batch(plans) if o.status in ("mismatch", "error", "crash")]
    assert not bad, "\n\n".join(f"{o.status}: {o.detail}\n{o.plan.describe()}" for o in bad)
