"""The conformance kit on the OpenVINO backend: the node tests that found plugin bugs now pass,
OpenVINO's own limits are expected failures with reasons, unconvertible graphs are skipped."""

from __future__ import annotations

import pytest

SELECTED = {
    "test_concat_2d_axis_0_cpu": "passed",  # several read-only inputs, each kept alive through infer
    "test_dropout_default_cpu": "passed",  # input renamed after the output it passes through
    "test_dropout_default_mask_ratio_cpu": "passed",  # ... plus a dropped input
    "test_reduce_l1_default_axes_keepdims_example_cpu": "passed",  # empty `axes` input dropped
    "test_cast_FLOAT_to_BFLOAT16_cpu": "passed",  # bf16 output
    "test_cast_FLOAT8E5M2_to_FLOAT16_cpu": "passed",  # float8 input
    "test_rotary_embedding_cpu": "passed",  # RoPE: never served from the compiled-model cache
    "test_top_k_same_values_cpu": "xfail",  # OpenVINO's tie order
    "test_split_to_sequence_1_cpu": "unsupported",  # sequences: UnsupportedGraph
}


def test_selected_node_tests(registry, tmp_path):
    pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
    import sdrt_openvino
    from sdrt.testing import BackendTest

    registry.register_plugin(sdrt_openvino, "openvino")
    pattern = "^(" + "|".join(SELECTED) + ")$"
    for _ in range(2):  # the second round is served from the compiled-model cache
        summary = BackendTest("openvino", "CPU", suites=("node",), cache_dir=str(tmp_path)).include(pattern).run()
        assert summary.outcome == SELECTED, summary.render()
