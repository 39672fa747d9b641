"""The graph builder behind the preprocessors' networks: each layer against its textbook formula in numpy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
sys.path.insert(0, str(Path(__file__).parent))
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import ModelError  # noqa: E402
from sdrt.pipelines.netgraph import Net, check_shapes  # noqa: E402
from sdrt.runtime import load  # noqa: E402


def _run(net: Net, x: np.ndarray, out: str) -> np.ndarray:
    register("reference")
    sess = load(net.model("t", {"x": x.shape}, {out: "y"}), backend="reference")
    try:
        return sess.run({"x": x})["y"]
    finally:
        sess.close()


def test_group_norm_linear_layer_norm_and_nearest_resize_match_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    arrays = {"gn.weight": rng.standard_normal(6).astype(np.float32), "gn.bias": rng.standard_normal(6).astype(np.float32)}
    net = Net(arrays)
    y = _run(net, x, net.group_norm("x", "gn", groups=3, channels=6, eps=1e-5))
    g = x.reshape(2, 3, -1).astype(np.float64)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    want = want * arrays["gn.weight"][:, None, None] + arrays["gn.bias"][:, None, None]
    np.testing.assert_allclose(y, want, atol=1e-5)

    t = rng.standard_normal((1, 7, 8)).astype(np.float32)
    arrays = {"fc.weight": rng.standard_normal((3, 8)).astype(np.float32), "fc.bias": rng.standard_normal(3).astype(np.float32),
              "ln.weight": rng.standard_normal(3).astype(np.float32), "ln.bias": rng.standard_normal(3).astype(np.float32)}
    net = Net(arrays)
    y = _run(net, t, net.layer_norm(net.linear("x", "fc"), "ln", eps=1e-6))
    h = t.astype(np.float64) @ arrays["fc.weight"].T + arrays["fc.bias"]
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-6) * arrays["ln.weight"] + arrays["ln.bias"]
    np.testing.assert_allclose(y, want, atol=1e-4)

    net = Net()
    y = _run(net, x, net.resize("x", scale=2.0, mode="nearest"))
    np.testing.assert_array_equal(y, x.repeat(2, axis=2).repeat(2, axis=3))
    net = Net()
    y = _run(net, x, net.resize("x", size=(10, 8), mode="nearest"))
    np.testing.assert_array_equal(y, x.repeat(2, axis=2).repeat(2, axis=3))


def test_conv_pads_same_and_reads_its_bias_only_when_the_file_has_it() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    net = Net({"c.weight": w})
    y = _run(net, x, net.conv("x", "c"))
    p = np.pad(x[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    want = np.zeros((3, 6, 6))
    for o in range(3):
        for i in range(6):
            for j in range(6):
                want[o, i, j] = (p[:, i:i + 3, j:j + 3] * w[o]).sum()
    np.testing.assert_allclose(y[0], want, atol=1e-4)
    assert len(net.inits) == 1


def test_check_shapes_names_the_missing_or_misshapen_tensor() -> None:
    with pytest.raises(ModelError, match="not HED .1 of its 2 tensors missing, e.g. b"):
        check_shapes({"module.a": (1, 2)}, {"a": (1, 2), "b": (3,)}, "f.pth", "HED", "pass ControlNetHED.pth")
    with pytest.raises(ModelError, match=r"f.pth: a is \(1, 3\), not HED's \(1, 2\)"):
        check_shapes({"a": (1, 3)}, {"a": (1, 2)}, "f.pth", "HED", "pass ControlNetHED.pth")
    assert check_shapes({"module.a": (1, 2)}, {"a": (1, 2)}, "f", "HED", "x") == {"a": "module.a"}
