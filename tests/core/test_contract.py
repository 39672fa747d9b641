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
    assert str(SdrtError("it broke.", fix="do this..")) == "it broke. What to do: do this."


def test_an_ellipsis_ending_a_message_is_kept():
    """A list cut short ("Abs, And, ...": sdrt run of an If graph on ggml) or code ("def f(): ...") kept its commas
    and lost the dots: "Abs, And, ."."""
    err = SdrtError("ops Abs, And, ...", fix="define it as def callback(step, total, latents): ...")
    assert str(err) == "ops Abs, And, ... What to do: define it as def callback(step, total, latents): ..."


def test_session_is_a_context_manager_and_refuses_runs_after_close(registry, affine_path):
    with sdrt.load(affine_path, backend="reference") as session:
        session.run({"x": np.ones((1, 4), np.float32)})
    with pytest.raises(SdrtError, match="closed"):
        session.run({"x": np.ones((1, 4), np.float32)})


def test_unknown_options_name_what_was_passed_and_what_the_backend_takes():
    """``check_known_options``: the one check every backend's ``parse_options`` makes, with the names attached
    (``pipelines.load`` reads them rather than the message)."""
    from sdrt.errors import OptionError, UnknownOptions, check_known_options

    check_known_options("mine", {"precision": "fp32"}, ("precision", "threads"))  # all known: nothing
    with pytest.raises(UnknownOptions) as info:
        check_known_options("mine", {"turbo": 1, "precision": "fp32", "abc": 2}, ("precision", "threads"))
    exc = info.value
    assert isinstance(exc, OptionError) and exc.unknown == ("abc", "turbo") and exc.known == ("precision", "threads")
    assert str(exc) == ("unknown options for the mine backend: abc, turbo. Where: sdrt.load(..., backend='mine'). "
                        "What to do: use only precision, threads.")
    with pytest.raises(UnknownOptions, match="the bare backend takes no options; remove them") as info:
        check_known_options("bare", {"x": 1}, (), where="-o")
    assert info.value.where == "-o" and info.value.known == ()


def test_every_backend_here_refuses_an_unknown_option_with_the_names_attached():
    """The plugins installed here (and the core's default ``parse_options``) raise ``UnknownOptions``."""
    from sdrt.errors import UnknownOptions
    from sdrt.plugins import get_registry

    reg = get_registry()
    for name, be in reg.backends.items():
        devices = be.devices()
        if not devices:
            continue
        with pytest.raises(UnknownOptions) as info:
            be.check_options({"no_such_option": 1}, devices[0])
        assert info.value.unknown == ("no_such_option",), name
