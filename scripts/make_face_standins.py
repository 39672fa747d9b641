"""Small stand-ins for InsightFace's buffalo_l ONNX files, with the real files' signatures (no hub here).

- ``det_10g.onnx``: input ``input.1`` ``[1, 3, ?, ?]``; nine outputs as SCRFD's (scores ``[N*2, 1]``, box
  distances ``[N*2, 4]``, 5-point distances ``[N*2, 10]`` for strides 8, 16, 32, two anchors a place). Its score is
  the sigmoid of the brightness of the patch an anchor sees (average pools, a 3x3 conv), so a bright square in a
  dark picture is a face (stride 8 also reads stride 16's features through a nearest 2x Resize and an Add, as
  SCRFD's neck does); box and point distances are an affine function of the same features around a face-like
  point layout, so they move with the picture.
- ``w600k_r50.onnx``: ``[1, 3, 112, 112]`` -> ``[1, 512]`` (average pool, conv, BatchNormalization, PRelu per
  channel as iResNet's, two matrix products with tanh): it sees where things are in the aligned crop.

Weights are seeded and small (kept under tests/data/faces/buffalo_l/). Run with any python that has onnx:
``python scripts/make_face_standins.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "faces" / "buffalo_l"
POINTS = np.array([-1.2, -1.0, 1.2, -1.0, 0.0, 0.2, -0.9, 1.3, 0.9, 1.3], np.float32)  # eyes, nose, mouth


def detector(rng: np.random.Generator) -> onnx.ModelProto:
    nodes, inits = [], []

    def init(name: str, a: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name

    prev = "input.1"
    outs: dict[str, list[str]] = {"score": [], "bbox": [], "kps": []}
    feats: dict[int, str] = {}
    for i, stride in enumerate((8, 16, 32)):
        pool = f"pool{stride}"
        k = 8 if i == 0 else 2
        nodes.append(helper.make_node("AveragePool", [prev], [pool], kernel_shape=[k, k], strides=[k, k],
                                      name=f"AveragePool_{stride}"))
        prev = pool
        feat = f"feat{stride}"  # 3x3 neighbourhood mean of the brightness, 3 channels
        nodes.append(helper.make_node("Conv", [pool, init(f"w_feat{stride}", np.full((3, 3, 3, 3), 1 / 27) +
                                                           rng.normal(0, 0.02, (3, 3, 3, 3)))],
                                      [feat], pads=[1, 1, 1, 1], name=f"Conv_feat{stride}"))
        feats[stride] = feat
    nodes += [helper.make_node("Resize", ["feat16", "", init("up_scales", np.array([1, 1, 2, 2]))], ["feat16_up"],
                               mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor",
                               name="Resize_up16"),  # a top-down step as SCRFD's neck has (det_10g's Resize)
              helper.make_node("Mul", ["feat16_up", init("up_w", np.full((1, 3, 1, 1), 0.1))], ["up_s"],
                               name="Mul_up16"),
              helper.make_node("Add", ["feat8", "up_s"], ["feat8_fpn"], name="Add_fpn8")]
    feats[8] = "feat8_fpn"
    for i, stride in enumerate((8, 16, 32)):
        feat = feats[stride]
        for kind, c, bias in (("score", 1, -4.0 - i), ("bbox", 4, 6.0 / (2 ** i)), ("kps", 10, None)):
            w = rng.normal(0, 0.05, (2 * c, 3, 1, 1))
            if kind == "score":
                w[:, :, 0, 0] = 3.0 + rng.normal(0, 0.3, (2, 3))
                b = np.full(2 * c, bias) + rng.normal(0, 0.1, 2 * c)
            elif kind == "bbox":
                b = np.full(2 * c, bias) + rng.normal(0, 0.1, 2 * c)
            else:
                b = np.tile(POINTS * 2.5 / (2 ** i), 2) + rng.normal(0, 0.05, 2 * c)
            conv = f"{kind}_conv{stride}"
            nodes.append(helper.make_node("Conv", [feat, init(f"w_{kind}{stride}", w), init(f"b_{kind}{stride}", b)],
                                          [conv], name=f"Conv_{kind}{stride}"))
            src = conv
            if kind == "score":
                nodes.append(helper.make_node("Sigmoid", [conv], [f"{conv}_sig"], name=f"Sigmoid_{stride}"))
                src = f"{conv}_sig"
            nodes.append(helper.make_node("Transpose", [src], [f"{conv}_t"], perm=[0, 2, 3, 1],
                                          name=f"Transpose_{kind}{stride}"))
            out = f"{kind}_{stride}"
            shape = init(f"shape_{kind}{stride}", np.array([-1, c]))
            inits[-1] = numpy_helper.from_array(np.array([-1, c], np.int64), shape)
            nodes.append(helper.make_node("Reshape", [f"{conv}_t", shape], [out], name=f"Reshape_{kind}{stride}"))
            outs[kind].append(out)
    order = outs["score"] + outs["bbox"] + outs["kps"]
    widths = {"score": 1, "bbox": 4, "kps": 10}
    graph = helper.make_graph(
        nodes, "scrfd_standin",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, "?", "?"])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None, widths[o.split("_")[0]]]) for o in order],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def recognizer(rng: np.random.Generator) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (2, 3, 3, 3)).astype(np.float32), "w_conv"),
             numpy_helper.from_array(rng.normal(0, 0.1, (2,)).astype(np.float32), "b_conv"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "flat"),
             numpy_helper.from_array((1 + rng.normal(0, 0.1, 2)).astype(np.float32), "bn_scale"),
             numpy_helper.from_array(rng.normal(0, 0.1, 2).astype(np.float32), "bn_bias"),
             numpy_helper.from_array(rng.normal(0, 0.1, 2).astype(np.float32), "bn_mean"),
             numpy_helper.from_array((1 + rng.uniform(0, 0.2, 2)).astype(np.float32), "bn_var"),
             numpy_helper.from_array(np.array([[[0.25]], [[-0.1]]], np.float32), "prelu_slope"),
             numpy_helper.from_array(rng.normal(0, 0.08, (392, 64)).astype(np.float32), "w_fc1"),
             numpy_helper.from_array(rng.normal(0, 0.2, (64, 512)).astype(np.float32), "w_fc2")]
    nodes = [helper.make_node("AveragePool", ["input.1"], ["p"], kernel_shape=[4, 4], strides=[4, 4], name="pool0"),
             helper.make_node("Conv", ["p", "w_conv", "b_conv"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2],
                              name="conv0"),
             helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"],
                              name="bn0"),
             helper.make_node("PRelu", ["bn", "prelu_slope"], ["r"], name="prelu0"),  # iResNet's, per channel
             helper.make_node("Reshape", ["r", "flat"], ["f"], name="flatten0"),
             helper.make_node("MatMul", ["f", "w_fc1"], ["h"], name="fc1"),
             helper.make_node("Tanh", ["h"], ["t"], name="tanh0"),
             helper.make_node("MatMul", ["t", "w_fc2"], ["683"], name="fc2")]
    graph = helper.make_graph(nodes, "arcface_standin",
                              [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, 112, 112])],
                              [helper.make_tensor_value_info("683", TensorProto.FLOAT, [1, 512])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    for name, model in (("det_10g.onnx", detector(rng)), ("w600k_r50.onnx", recognizer(rng))):
        onnx.checker.check_model(model)
        onnx.save(model, OUT / name)
        print(name, (OUT / name).stat().st_size)


if __name__ == "__main__":
    main()
