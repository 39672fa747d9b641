"""Binding weights to a graph: the full report, key mapping rules, dtype conversion."""

from __future__ import annotations

import gw_models as M
import numpy as np
import pytest

import sdrt
from sdrt.errors import WeightsError
from sdrt.graph import Graph
from sdrt.keymap import KeyMap
from sdrt.weights import Weights

X = np.random.default_rng(7).standard_normal((2, 8)).astype(np.float32)


@pytest.fixture
def graph() -> Graph:
    return Graph.load(M.linear_model().SerializeToString())


@pytest.fixture
def own(graph) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in graph.initializer_arrays().items()}


def test_bind_exact(graph, own):
    bound = Weights.from_arrays(own).bind(graph)
    assert sorted(bound) == sorted(graph.initializer_names)
    assert sorted(Weights.from_arrays({**own, "extra": np.zeros(1)}).bind(None)) == sorted([*own, "extra"])


def test_bind_reports_every_problem_at_once(graph, own):
    w = dict(own)
    del w["fc1.bias"]
    del w["fc2.bias"]
    w["fc1.weight"] = w["fc1.weight"].T.copy()
    w["onnx::MatMul_7"] = w["onnx::MatMul_7"].astype(np.float16)
    w["stray.a"] = np.zeros(1, np.float32)
    w["stray.b"] = np.zeros(1, np.float32)
    with pytest.raises(WeightsError) as e:
        Weights.from_arrays(w).bind(graph)
    rep = e.value.report
    assert rep.missing == ["fc1.bias", "fc2.bias"]
    assert rep.unexpected == ["stray.a", "stray.b"]
    assert rep.mismatched == ["fc1.weight: weights float32[8, 16] vs graph float32[16, 8]",
                              "onnx::MatMul_7: weights float16[16, 4] vs graph float32[16, 4]"]
    msg = str(e.value)
    for name in ("fc1.bias", "fc2.bias", "stray.a", "stray.b", "fc1.weight", "onnx::MatMul_7"):
        assert name in msg
    assert "2 missing" in msg and "2 unexpected" in msg and "2 mismatched" in msg and "KeyMap" in msg


def test_check_does_not_raise(graph, own):
    rep = Weights.from_arrays({"x": np.zeros(1)}).check(graph)
    assert not rep.ok and rep.problems() == 5 and "missing" in str(rep)
    assert Weights.from_arrays(own).check(graph).ok


def test_convert_dtypes_on_request(graph, own, registry):
    half = {k: v.astype(np.float16) for k, v in own.items()}
    with pytest.raises(WeightsError, match="mismatched"):
        Weights.from_arrays(half).bind(graph)
    bound = Weights.from_arrays(half).bind(graph, convert=True)
    assert all(v.dtype == np.float32 for v in bound.values())
    with sdrt.load(graph, weights=Weights.from_arrays(half).astype("float32"), backend="reference") as s:
        y = s.run({"x": X})["y"]
    assert y.dtype == np.float32


def test_non_strict_tolerates_extra_and_missing_with_data(graph, own):
    w = {"fc1.weight": own["fc1.weight"] * 0, "unrelated": np.zeros(3)}
    bound = Weights.from_arrays(w).bind(graph, strict=False)
    assert list(bound) == ["fc1.weight"]
    with pytest.raises(WeightsError, match="mismatched"):
        Weights.from_arrays({"fc1.weight": np.zeros(3, np.float32)}).bind(graph, strict=False)


def test_keymap_rules(graph, own):
    ckpt = {
        "model.diffusion_model.fc1.weight": own["fc1.weight"],
        "model.diffusion_model.fc1.bias": own["fc1.bias"],
        "first_stage.fc2.b": own["fc2.bias"],
        "linear_2_t": own["onnx::MatMul_7"],
        "model_ema.decay": np.zeros(()),
    }
    km = KeyMap(
        explicit={"linear_2_t": "onnx::MatMul_7"},
        strip_prefix=("model.diffusion_model.", "first_stage."),
        renames=((r"\.b$", ".bias"),),
        drop=(r"^model_ema\.",),
    )
    w = Weights.from_arrays(ckpt, mapping=km)
    assert sorted(w) == sorted(graph.initializer_names)
    w.bind(graph)
    assert sorted(Weights.from_arrays(own, mapping=KeyMap(add_prefix="unet."))) == sorted(
        "unet." + n for n in own)


def test_mapping_as_dict_and_callable(own):
    w = Weights.from_arrays(own, mapping={"fc1.weight": "W1"})
    assert "W1" in w and "fc1.bias" in w
    w2 = Weights.from_arrays(own, mapping=lambda k: None if k.endswith("bias") else k.upper())
    assert sorted(w2) == ["FC1.WEIGHT", "ONNX::MATMUL_7"]


def test_mapping_errors(own):
    with pytest.raises(WeightsError, match="several keys to one name"):
        Weights.from_arrays(own, mapping=lambda k: "same")
    with pytest.raises(WeightsError, match="bad key-mapping regex"):
        KeyMap(renames=(("(", "x"),))
    with pytest.raises(WeightsError, match="replacement"):
        Weights.from_arrays(own, mapping=KeyMap(renames=((r"fc", r"\9"),)))
    with pytest.raises(WeightsError, match="expected a string"):
        Weights.from_arrays(own, mapping=lambda k: 3)
    with pytest.raises(WeightsError, match="KeyMap, a dict or a callable"):
        Weights.from_arrays(own, mapping=42)


def test_open_with_mapping_and_bind_to_file_graph(tmp_path, graph, own, registry):
    from sdrt.weights import stfile

    p = tmp_path / "ckpt.safetensors"
    stfile.write(p, {"prefix." + k: v for k, v in own.items()})
    w = Weights.open(p, mapping=KeyMap(strip_prefix="prefix."))
    with sdrt.load(graph, weights=w, backend="reference") as s:
        y = s.run({"x": X})["y"]
    np.testing.assert_array_equal(y, M.run_reference(graph, {"x": X})["y"])


def test_from_graph_gives_own_initializers(graph, own):
    w = Weights.from_graph(graph)
    assert sorted(w) == sorted(own)
    for k in own:
        np.testing.assert_array_equal(w[k], own[k])


def test_partial_checkpoint_over_the_graphs_own_weights(graph, own, tmp_path):
    from sdrt.weights import stfile

    p = tmp_path / "partial.safetensors"
    stfile.write(p, {"fc1.bias": np.zeros(16, np.float32)})
    with pytest.raises(WeightsError, match="3 missing"):
        Weights.open(p).bind(graph)
    bound = Weights.from_graph(graph).replaced(Weights.open(p)).bind(graph)
    assert bound["fc1.bias"].sum() == 0 and M.is_mapped(bound["fc1.bias"])
    np.testing.assert_array_equal(bound["fc1.weight"], own["fc1.weight"])
