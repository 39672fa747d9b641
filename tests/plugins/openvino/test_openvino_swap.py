"""Weight swaps through OpenVINO's weightless blobs (sdrt_openvino/swap.py), on real SD exports.

The tiny SD 1.x pipeline folder (tests/data/pipelines/tiny-sd15, diffusers exports) gets the LDM
checkpoint and the kohya LoRA of tests/data/ckpt/pipe-sd15. After each swap every compiled part
(text encoder, UNet, VAE decoder) must give exactly the outputs of a fresh compile of the same graph
with the same weights, and removing the LoRA must give back the checkpoint's outputs bit for bit.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import sdrt
from sdrt.weights import Weights

DATA = Path(__file__).resolve().parents[2] / "data"
FOLDER = DATA / "pipelines" / "tiny-sd15"
CKPT = DATA / "ckpt" / "pipe-sd15"
KW = dict(steps=1, cfg=7.0, sampler="Euler", seed=1, width=64, height=64)


def _feeds(sess: sdrt.Session, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in sess.inputs:
        shape = tuple(int(d) for d in info.shape)
        if info.dtype.startswith("int"):
            feeds[info.name] = rng.integers(0, 50, shape).astype(info.dtype)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(info.dtype)
    return feeds


def _outputs(pipe) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    return {(name, i): sess.run(_feeds(sess)) for name, part in pipe.parts.items()
            for i, sess in enumerate(part.sessions.values())}


def _fresh(pipe, **options) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """Each part's graph compiled anew (compile cache off) with the weights the pipeline binds now."""
    out = {}
    for name, part in pipe.parts.items():
        for i, sess in enumerate(part.sessions.values()):
            with sdrt.load(sess.graph, weights=part.weights, backend="openvino", cache=False, **options) as fresh:
                out[(name, i)] = fresh.run(_feeds(sess))
    return out


def _assert_same(a, b, what: str, tol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for key in a:
        for out in a[key]:
            diff = np.abs(a[key][out].astype(np.float64) - b[key][out]).max()
            assert diff <= tol, f"{what}: {key} {out} differs by {diff}"


def _assert_matches_fresh(pipe, got, what: str) -> None:
    """Bit for bit against a fresh compile in the swappable form; within float rounding of the default
    form (biases fed as inputs are added outside the fused kernel: the text encoder differs by ~1e-6)."""
    _assert_same(got, _fresh(pipe, swappable=True), what)
    _assert_same(got, _fresh(pipe), what + " (default compile)", tol=1e-5)


@pytest.fixture
def pipe(ov_registry):
    from sdrt import pipelines

    with pipelines.load(FOLDER, backend="openvino") as p:
        p("a photo", **KW)  # compiles every part the generation uses
        yield p


def test_swaps_import_the_weightless_blob_and_match_a_fresh_compile(pipe, caplog):
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    own = _outputs(pipe)
    pipe.load_weights(CKPT / "custom.safetensors")  # first swap: compiled once more, weightless
    ckpt = _outputs(pipe)
    _assert_matches_fresh(pipe, ckpt, "checkpoint")
    pipe.set_loras([(CKPT / "tinylora.safetensors", 0.8)])  # later swaps: imports
    lora = _outputs(pipe)
    _assert_matches_fresh(pipe, lora, "LoRA")
    pipe.set_loras([])
    _assert_same(_outputs(pipe), ckpt, "LoRA removed")  # unmerged bit for bit
    messages = [r.getMessage() for r in caplog.records]
    assert sum("(weightless import)" in m for m in messages) >= 4  # text encoder and UNet, on and off
    assert not any("compiling again from now on" in m for m in messages)
    for key in own:  # every part changed with the checkpoint, the LoRA touched the UNet and text encoder
        assert not np.array_equal(next(iter(own[key].values())), next(iter(ckpt[key].values())))
    assert any(not np.array_equal(next(iter(ckpt[k].values())), next(iter(lora[k].values()))) for k in ckpt)


def test_a_checkpoint_swapped_twice_gives_the_same_outputs(pipe, caplog):
    pipe.load_weights(CKPT / "custom.safetensors")
    first = _outputs(pipe)
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    pipe.load_weights(CKPT / "custom.safetensors")  # the same values: nothing is imported
    _assert_same(_outputs(pipe), first, "second swap")
    messages = [r.getMessage() for r in caplog.records]
    assert sum("nothing to do" in m for m in messages) == 3 and not any("updated" in m for m in messages)


def test_the_weightless_blob_holds_no_copy_of_a_weight(pipe):
    """The check that guards the fast path: every weight bound as a constant is read from the weights file."""
    from sdrt_openvino import swap

    pipe.load_weights(CKPT / "custom.safetensors")
    for part in pipe.parts.values():
        for sess in part.sessions.values():
            rebinder = sess._rebinder
            assert rebinder is not None
            arrays = sdrt.resolve_weights(sess.graph, part.weights)
            swap._check_weightless(rebinder.blob, {k: arrays[k] for k in rebinder.layout})
            assert rebinder.layout  # the big weights are constants read from the file


def test_a_blob_with_a_copy_of_a_weight_is_refused():
    from sdrt_openvino import swap

    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    with pytest.raises(swap.NotSwappable, match="its own copy of 1 weights"):
        swap._check_weightless(b"header" + w.tobytes() + b"tail", {"w": w})
    swap._check_weightless(b"header" + (w + 1).tobytes(), {"w": w})


def test_inputs_kept_for_vectors_and_folded_weights(ov_registry):
    """Vectors and weights whose consumer reads only constants stay Parameters; MatMul weights become constants."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from sdrt_openvino import convert, swap

    rng = np.random.default_rng(1)
    w, b, table = (rng.standard_normal(s).astype(np.float32) for s in ((6, 5), (5,), (10, 5)))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node("Gather", ["table", "ids"], ["rows"]), helper.make_node("Add", ["a", "rows"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (table, "table"))]
                              + [numpy_helper.from_array(np.array([1, 3], np.int64), "ids")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    g = sdrt.Graph.load(model.SerializeToString())
    core = ov_registry.backends["openvino"].core
    proto, promoted = convert.promote(g, sdrt.resolve_weights(g))
    assert swap._inputs_to_keep(core.read_model(proto.SerializeToString()), promoted) == ({"b", "table"}, set())
    session = sdrt.load(g, backend="openvino")
    x = rng.standard_normal((2, 6)).astype(np.float32)
    for scale in (2.0, 3.0):  # build, then import
        new = {"w": w * scale, "b": b * scale, "table": table * scale, "ids": np.array([1, 3], np.int64)}
        session.update_weights(Weights.from_arrays(new))
        expect = x @ new["w"] + new["b"] + new["table"][[1, 3]]
        np.testing.assert_allclose(session.run({"x": x})["y"], expect, rtol=1e-5, atol=1e-5)
    assert session._rebinder is not None and set(session._rebinder.layout) == {"w"}


def test_equal_weights_stored_once_by_the_ir_become_inputs(ov_registry):
    """ov.serialize keeps one copy of equal constants: such weights cannot be rewritten apart, so they are fed."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(30, dtype=np.float32).reshape(6, 5)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              [numpy_helper.from_array(w, "w1"), numpy_helper.from_array(w.copy(), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = sdrt.load(model.SerializeToString(), backend="openvino")
    x = np.ones((2, 6), np.float32)
    for w1, w2 in ((w * 1.5, w * 1.5), (w * 2, w * 3), (w * 4, w * 4)):
        session.update_weights(Weights.from_arrays({"w1": w1, "w2": w2}))
        np.testing.assert_allclose(session.run({"x": x})["y"], x @ w1 + x @ w2, rtol=1e-6)
    assert session._rebinder is not None and set(session._rebinder.inputs) == {"w1", "w2"}


def test_a_float_weight_that_sets_a_shape_stays_baked_and_a_new_value_compiles_again(ov_registry, caplog):
    """Resize scales as a float initializer: fed as an input it would make the shapes dynamic."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(2).standard_normal((3, 3, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="nearest")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = sdrt.load(model.SerializeToString(), backend="openvino")
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    x = np.ones((1, 3, 4, 4), np.float32)
    for scale, size in ((2.0, 8), (3.0, 8), (3.0, 12)):
        scales = np.array([1, 1, size // 4, size // 4], np.float32)
        session.update_weights(Weights.from_arrays({"w": w * scale, "scales": scales}))
        out = session.run({"x": x})["y"]
        assert out.shape == (1, 3, size, size)
        np.testing.assert_allclose(out[..., ::size // 4, ::size // 4], np.einsum("oi,i->o", (w * scale)[:, :, 0, 0],
                                   np.ones(3))[None, :, None, None] * np.ones((1, 3, 4, 4)), rtol=1e-5)
    assert session._rebinder is not None and "scales" in session._rebinder.fixed
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split("(")[-1] for m in messages if "updated" in m] == [
        "compiled once more to a weightless blob)", "weightless import)", "compiled once more to a weightless blob)"]


def test_a_bfloat16_weight_that_would_be_an_input_falls_back_to_compiling(ov_registry, caplog):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes provides numpy's bfloat16")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(ml_dtypes.bfloat16)  # a vector: fed as an input in the swappable form
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Cast", ["b"], ["bf"], to=1),
             helper.make_node("Add", ["m", "bf"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = sdrt.load(model.SerializeToString(), backend="openvino")
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    x = np.ones((2, 6), np.float32)
    b2 = (b.astype(np.float32) * 2).astype(ml_dtypes.bfloat16)
    session.update_weights(Weights.from_arrays({"w": w * 2, "b": b2}))
    np.testing.assert_allclose(session.run({"x": x})["y"], x @ (w * 2) + b2.astype(np.float32), rtol=1e-5)
    assert any("would be fed as inputs" in r.getMessage() for r in caplog.records)


def test_a_failing_weights_file_falls_back_to_compiling(ov_registry, monkeypatch, caplog):
    """/dev/shm full, or OpenVINO refusing the blob: the session compiles instead, it does not fail."""
    from ov_helpers import conv_model

    from sdrt_openvino import swap

    session = sdrt.load(conv_model().SerializeToString(), backend="openvino")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    new = {"conv.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
           "conv.bias": rng.standard_normal(4).astype(np.float32)}
    session.update_weights(Weights.from_arrays(new))  # builds the swappable form
    assert session._rebinder is not None

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(swap.tempfile, "mkstemp", full)
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    newer = {k: v * 2 for k, v in new.items()}
    session.update_weights(Weights.from_arrays(newer))
    assert any("the weightless swap failed" in r.getMessage() for r in caplog.records)
    with sdrt.load(conv_model().SerializeToString(), weights=Weights.from_arrays(newer), backend="openvino",
                   cache=False) as fresh:
        np.testing.assert_allclose(session.run({"x": x})["y"], fresh.run({"x": x})["y"], rtol=1e-6, atol=1e-6)


def test_swappable_false_compiles_on_every_swap_and_a_bad_value_is_refused(ov_registry, caplog):
    from ov_helpers import conv_model

    from sdrt_openvino.options import OptionError

    with pytest.raises(OptionError, match="swappable must be None, True or False"):
        sdrt.load(conv_model().SerializeToString(), backend="openvino", swappable="yes")
    session = sdrt.load(conv_model().SerializeToString(), backend="openvino", swappable=False)
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    rng = np.random.default_rng(6)
    for _ in range(2):
        session.update_weights(Weights.from_arrays({"conv.weight": rng.standard_normal((4, 3, 3, 3), np.float32),
                                                    "conv.bias": rng.standard_normal(4, np.float32)}))
    assert session._rebinder is None
    assert sum(r.getMessage().endswith("(compiled)") for r in caplog.records) == 2
