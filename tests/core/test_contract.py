"""The backend contract: feed checks, sessions as context managers, API versions."""

from __future__ import annotations

import numpy as np
import pytest

import sdrt
from sdrt.backend import TensorInfo, check_api_version, check_feeds
from sdrt.errors import InputError, SdrtError

INPUTS = [TensorInfo("x", "float32", ("batch", 4)), TensorInfo("mask", "int64", (2,))]


def good():
    return {"x": np.zeros((3, 4), np.float32), "mask": np.zeros(2, np.int64)}


def test_feeds_that_match_pass_through():
    out = check_feeds(INPUTS, good())
    assert set(out) == {"x", "mask"} and out["x"].shape == (3, 4)


def test_missing_input_names_it_and_lists_expected():
    feeds = good()
    del feeds["mask"]
    with pytest.raises(InputError) as e:
        check_feeds(INPUTS, feeds)
    msg = str(e.value)
    assert "missing 'mask'" in msg and "mask: int64[2]" in msg and "What to do" in msg


def test_wrong_input_name_is_reported_as_unexpected_and_missing():
    feeds = good()
    feeds["X"] = feeds.pop("x")
    with pytest.raises(InputError, match=r"missing 'x'; unexpected 'X'"):
        check_feeds(INPUTS, feeds)


def test_wrong_shape_names_input_expected_and_actual():
    feeds = good()
    feeds["x"] = np.zeros((3, 5), np.float32)
    with pytest.raises(InputError, match=r"input 'x' has shape \(3, 5\), expected \(batch, 4\)"):
        check_feeds(INPUTS, feeds)


def test_wrong_rank_is_a_shape_error():
    feeds = good()
    feeds["mask"] = np.zeros((2, 1), np.int64)
    with pytest.raises(InputError, match=r"'mask' has shape \(2, 1\), expected \(2\)"):
        check_feeds(INPUTS, feeds)


def test_wrong_dtype_names_input_expected_and_actual():
    feeds = good()
    feeds["x"] = np.zeros((3, 4), np.float64)
    with pytest.raises(InputError, match=r"input 'x' has dtype float64, expected float32.*astype\(np.float32\)"):
        check_feeds(INPUTS, feeds)


def test_feeds_must_be_a_mapping():
    with pytest.raises(InputError, match="mapping"):
        check_feeds(INPUTS, [np.zeros((3, 4), np.float32)])


@pytest.mark.parametrize(
    "plugin, core, ok",
    [((1, 0), (1, 0), True), ((1, 0), (1, 3), True), ((1, 4), (1, 3), False), ((2, 0), (1, 9), False),
     ((0, 9), (1, 0), False)],
)
def test_api_version_compatibility(plugin, core, ok):
    assert check_api_version(plugin, core) is ok


def test_error_message_has_what_where_and_fix():
    err = SdrtError("it broke", where="node 7", fix="do this")
    assert str(err) == "it broke. Where: node 7. What to do: do this."
    assert (err.what, err.where, err.fix) == ("it broke", "node 7", "do this")


def test_session_is_a_context_manager_and_refuses_runs_after_close(registry, affine_path):
    with sdrt.load(affine_path, backend="reference") as session:
        session.run({"x": np.ones((1, 4), np.float32)})
    with pytest.raises(SdrtError, match="closed"):
        session.run({"x": np.ones((1, 4), np.float32)})
