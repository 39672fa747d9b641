"""Random small ONNX graphs for the ggml backend, run in child processes.

``graph_plans()`` is a hypothesis strategy for one random graph of the ops the ggml
backend lowers: elementwise ops with numpy broadcasting and constant scalars on either
side, unary ops, transposes, reshapes, slices, concats, splits, reductions, softmax,
matmuls, expands, tiles, pads, convs, pools, normalizations, gathers and resizes, fed by
graph inputs, initializers and Constant nodes.

``run_batch(plans)`` builds each plan into a model, computes the reference outputs with
onnxruntime in this process, and lowers and runs the models on ggml in a **child process**
(``python fuzz_graphs.py --child``), several per child. The child reports after each
graph, so when ggml aborts (a failed GGML_ASSERT kills the process), the graph it was on
is known: it is reported as a crash with its graph, and the rest of the batch runs in a
fresh child. Every outcome is one of ``ok``, ``refused`` (``UnsupportedGraph``: the
backend said no, cleanly), ``mismatch``, ``error`` (any other exception) or ``crash``.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

F32 = 1  # onnx.TensorProto.FLOAT
RTOL, ATOL = 2e-3, 2e-4


@dataclass
class Plan:
    """A random graph: nodes as (op, inputs, outputs, attrs), inputs, initializers, outputs."""

    nodes: list[tuple[str, list[str], list[str], dict[str, Any]]] = field(default_factory=list)
    inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    seed: int = 0

    def describe(self) -> str:
        lines = [f"inputs {self.inputs}", f"initializers { {k: v.shape for k, v in self.inits.items()} }"]
        lines += [f"{o} = {op}({', '.join(i)}) {a or ''}" for op, i, o, a in self.nodes]
        lines.append(f"outputs {self.outputs}")
        return "\n".join(lines)


def build_model(plan: Plan) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node(op, ins, outs, name=f"n{i}_{op}", **attrs)
             for i, (op, ins, outs, attrs) in enumerate(plan.nodes)]
    graph = helper.make_graph(
        nodes, "fuzz",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in plan.inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in plan.outputs],
        [numpy_helper.from_array(v, k) for k, v in plan.inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def feeds_of(plan: Plan) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(plan.seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in plan.inputs.items()}


# -- the strategy ------------------------------------------------------------------------------

UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Sin", "Cos", "Floor", "Ceil", "Erf", "Softplus", "HardSwish",
         "Identity", "Exp", "Elu"]
BINARY = ["Add", "Sub", "Mul", "Div"]


def graph_plans(max_nodes: int = 6) -> Any:
    from hypothesis import strategies as st

    @st.composite
    def plans(draw: Any) -> Plan:
        plan = Plan(seed=draw(st.integers(0, 2**31 - 1)))
        rng = np.random.default_rng(plan.seed)
        dims = st.integers(1, 6)
        shapes: dict[str, tuple[int, ...]] = {}
        counter = [0]

        def new(prefix: str = "v") -> str:
            counter[0] += 1
            return f"{prefix}{counter[0]}"

        def add_input(shape: tuple[int, ...]) -> str:
            name = new("x")
            plan.inputs[name] = shape
            shapes[name] = shape
            return name

        def add_init(arr: np.ndarray, prefix: str = "w") -> str:
            name = new(prefix)
            plan.inits[name] = arr
            shapes[name] = tuple(arr.shape)
            return name

        def emit(op: str, ins: list[str], shape: tuple[int, ...], **attrs: Any) -> str:
            out = new()
            plan.nodes.append((op, ins, [out], attrs))
            shapes[out] = shape
            return out

        def rand(shape: tuple[int, ...]) -> np.ndarray:
            return rng.standard_normal(shape).astype(np.float32)

        rank = draw(st.integers(1, 4))
        add_input(tuple(draw(dims) for _ in range(rank)))
        if draw(st.booleans()):
            add_input(tuple(draw(dims) for _ in range(draw(st.integers(1, 4)))))
        runtime = list(plan.inputs)

        for _ in range(draw(st.integers(1, max_nodes))):
            x = draw(st.sampled_from(runtime))
            s = shapes[x]
            r = len(s)
            kind = draw(st.sampled_from([
                "unary", "binary", "scalar", "transpose", "reshape", "slice", "concat", "reduce", "softmax",
                "matmul", "expand", "tile", "squeeze", "pad", "conv", "pool", "norm", "gather", "split", "clip",
                "pow", "where", "resize", "leaky", "flatten", "attention", "gemm", "convt", "batchnorm"]))
            out: str | None = None
            if kind == "unary":
                op = draw(st.sampled_from(UNARY))
                if op == "Exp":
                    x = emit("Tanh", [x], s)
                out = emit(op, [x], s)
            elif kind == "leaky":
                out = emit(draw(st.sampled_from(["LeakyRelu", "HardSigmoid"])), [x], s)
            elif kind == "binary":
                op = draw(st.sampled_from(BINARY))
                # the other operand: a broadcastable shape, runtime or initializer, on either side
                other_shape = tuple(d if draw(st.booleans()) else 1 for d in s[draw(st.integers(0, r)):])
                src = draw(st.sampled_from(["init", "runtime", "same"]))
                if src == "same" and op != "Div":
                    y = x
                elif src == "runtime" and op != "Div":
                    cands = [v for v in runtime if _fits(shapes[v], s)]
                    y = draw(st.sampled_from(cands)) if cands else add_init(rand(other_shape))
                else:
                    arr = rand(other_shape)
                    if op == "Div":
                        arr = np.sign(arr + 1e-3) * (np.abs(arr) + 0.5)
                    y = add_init(arr.astype(np.float32))
                a, b = (x, y) if op == "Div" or draw(st.booleans()) else (y, x)
                try:
                    shape = tuple(np.broadcast_shapes(shapes[a], shapes[b]))
                except ValueError:
                    continue
                out = emit(op, [a, b], shape)
            elif kind == "scalar":
                op = draw(st.sampled_from(BINARY))
                value = draw(st.sampled_from([0.5, 2.0, -1.5, 3.0, 1.0, 0.0]))
                if op == "Div" and value == 0.0:
                    value = 4.0
                shape_c = draw(st.sampled_from([(), (1,), (1,) * r]))
                if draw(st.booleans()):
                    c = new("c")
                    plan.nodes.append(("Constant", [], [c], {"value_float": value} if shape_c == () else {
                        "value_floats": [value]} if shape_c == (1,) else {}))
                    if shape_c not in ((), (1,)):
                        plan.nodes.pop()
                        c = add_init(np.full(shape_c, value, np.float32), "c")
                    else:
                        shapes[c] = shape_c
                else:
                    c = add_init(np.full(shape_c, value, np.float32), "c")
                first = op == "Div" or draw(st.booleans())
                out = emit(op, [x, c] if first else [c, x], tuple(np.broadcast_shapes(s, shapes[c])))
            elif kind == "transpose" and r > 1:
                perm = draw(st.permutations(list(range(r))))
                out = emit("Transpose", [x], tuple(s[p] for p in perm), perm=list(perm))
            elif kind == "reshape":
                n = math.prod(s)
                facs = [d for d in range(1, n + 1) if n % d == 0]
                a = draw(st.sampled_from(facs))
                target = draw(st.sampled_from([(n,), (a, n // a), (1, a, n // a), (a, 1, n // a, 1)]))
                spec = list(target)
                if draw(st.booleans()) and len(spec) > 1:
                    spec[draw(st.integers(0, len(spec) - 1))] = -1
                out = emit("Reshape", [x, add_init(np.array(spec, np.int64), "shape")], target)
            elif kind == "slice":
                ax = draw(st.integers(0, r - 1))
                d = s[ax]
                step = draw(st.sampled_from([1, 1, 2, -1]))
                start = draw(st.integers(-d, d - 1))
                end = draw(st.integers(-d - 1, d + 2))
                n_out = len(range(d)[start:end:step])  # ONNX Slice clamps as Python slicing does
                if n_out <= 0:
                    continue
                ins = [x] + [add_init(np.array(v, np.int64), "i") for v in ([start], [end], [ax], [step])]
                shape = list(s)
                shape[ax] = n_out
                out = emit("Slice", ins, tuple(shape))
            elif kind == "concat":
                ax = draw(st.integers(0, r - 1))
                other = list(s)
                other[ax] = draw(dims)
                y = x if draw(st.booleans()) else add_init(rand(tuple(other)))
                shape = list(s)
                shape[ax] += shapes[y][ax]
                out = emit("Concat", [x, y] if draw(st.booleans()) else [y, x], tuple(shape), axis=ax)
            elif kind == "split":
                ax = draw(st.integers(0, r - 1))
                if s[ax] < 2:
                    continue
                k = draw(st.integers(1, s[ax] - 1))
                a_out, b_out = new(), new()
                plan.nodes.append(("Split", [x, add_init(np.array([k, s[ax] - k], np.int64), "i")], [a_out, b_out],
                                   {"axis": ax}))
                shapes[a_out] = tuple(k if i == ax else d for i, d in enumerate(s))
                shapes[b_out] = tuple(s[ax] - k if i == ax else d for i, d in enumerate(s))
                out = draw(st.sampled_from([a_out, b_out]))
            elif kind == "reduce":
                op = draw(st.sampled_from(["ReduceMean", "ReduceSum"]))
                axes = sorted(draw(st.sets(st.integers(0, r - 1), min_size=1, max_size=r)))
                keep = draw(st.sampled_from([0, 1]))
                shape = tuple(1 if i in axes else d for i, d in enumerate(s)) if keep else tuple(
                    d for i, d in enumerate(s) if i not in axes)
                if op == "ReduceSum":
                    out = emit(op, [x, add_init(np.array(axes, np.int64), "i")], shape, keepdims=keep)
                else:
                    out = emit(op, [x], shape, axes=axes, keepdims=keep)
            elif kind == "softmax":
                out = emit(draw(st.sampled_from(["Softmax", "LogSoftmax"])), [x], s, axis=draw(st.integers(-r, r - 1)))
            elif kind == "matmul":
                k = s[-1]
                n = draw(dims)
                if draw(st.booleans()):
                    w = add_init(rand((k, n)))
                else:
                    w = add_init(rand(tuple(d if draw(st.booleans()) else 1 for d in s[:-2]) + (k, n)))
                try:
                    shape = tuple(np.broadcast_shapes(s[:-1][:-1], shapes[w][:-2])) + ((s[-2],) if r > 1 else ()) + (n,)
                except ValueError:
                    continue
                out = emit("MatMul", [x, w], shape)
            elif kind == "expand":
                target = tuple(draw(dims) if d == 1 else d for d in s)
                if draw(st.booleans()):
                    target = (draw(dims),) + target
                if len(target) > 4:
                    continue
                out = emit("Expand", [x, add_init(np.array(target, np.int64), "shape")], target)
            elif kind == "tile":
                reps = tuple(draw(st.integers(1, 3)) for _ in s)
                out = emit("Tile", [x, add_init(np.array(reps, np.int64), "i")], tuple(d * k for d, k in zip(s, reps)))
            elif kind == "squeeze":
                if r < 4 and draw(st.booleans()):
                    ax = draw(st.integers(0, r))
                    out = emit("Unsqueeze", [x, add_init(np.array([ax], np.int64), "i")], s[:ax] + (1,) + s[ax:])
                else:
                    ones = [i for i, d in enumerate(s) if d == 1]
                    if not ones or r == 1:
                        continue
                    out = emit("Squeeze", [x, add_init(np.array(ones[:1], np.int64), "i")],
                               tuple(d for i, d in enumerate(s) if i != ones[0]))
            elif kind == "flatten":
                ax = draw(st.integers(0, r))
                out = emit("Flatten", [x], (math.prod(s[:ax]), math.prod(s[ax:])), axis=ax)
            elif kind == "pad":
                pads = [draw(st.integers(0, 2)) for _ in range(2 * r)]
                mode = draw(st.sampled_from(["constant", "constant", "reflect", "edge"]))
                out = emit("Pad", [x, add_init(np.array(pads, np.int64), "i")],
                           tuple(d + pads[i] + pads[i + r] for i, d in enumerate(s)), mode=mode)
            elif kind == "conv" and r == 4:
                n, c, h, w = s
                oc = draw(dims)
                kh, kw = draw(st.integers(1, min(3, h + 2))), draw(st.integers(1, min(3, w + 2)))
                group = c if draw(st.booleans()) and c > 1 else 1
                if group == c and c > 1:
                    oc = c
                stride = draw(st.integers(1, 2))
                p = [draw(st.integers(0, 1)) for _ in range(4)]
                oh = (h + p[0] + p[2] - kh) // stride + 1
                ow = (w + p[1] + p[3] - kw) // stride + 1
                if oh <= 0 or ow <= 0:
                    continue
                wt = add_init(rand((oc, c // group, kh, kw)) * 0.5)
                ins = [x, wt] + ([add_init(rand((oc,)), "b")] if draw(st.booleans()) else [])
                out = emit("Conv", ins, (n, oc, oh, ow), kernel_shape=[kh, kw], pads=p, strides=[stride, stride],
                           group=group)
            elif kind == "pool" and r == 4:
                op = draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool"]))
                if op == "GlobalAveragePool":
                    out = emit(op, [x], s[:2] + (1, 1))
                else:
                    k = draw(st.integers(1, min(3, s[2], s[3])))
                    stride = draw(st.integers(1, 2))
                    out = emit(op, [x], s[:2] + ((s[2] - k) // stride + 1, (s[3] - k) // stride + 1),
                               kernel_shape=[k, k], strides=[stride, stride])
            elif kind == "norm":
                if r >= 3 and draw(st.booleans()):
                    c = s[1]
                    out = emit("InstanceNormalization", [x, add_init(rand((c,))), add_init(rand((c,)))], s,
                               epsilon=1e-5)
                else:
                    out = emit("LayerNormalization", [x, add_init(rand((s[-1],))), add_init(rand((s[-1],)))], s,
                               axis=-1, epsilon=1e-5)
            elif kind == "gather":
                ax = draw(st.integers(0, r - 1))
                idx = np.array(draw(st.lists(st.integers(-s[ax], s[ax] - 1), min_size=1, max_size=4)), np.int64)
                if draw(st.booleans()):
                    idx = idx[:1].reshape(())
                out = emit("Gather", [x, add_init(idx, "i")], s[:ax] + idx.shape + s[ax + 1:], axis=ax)
            elif kind == "clip":
                out = emit("Clip", [x, add_init(np.array(-0.5, np.float32), "c"), add_init(np.array(0.7, np.float32), "c")], s)
            elif kind == "pow":
                e = draw(st.sampled_from([2.0, 3.0, 1.0]))
                out = emit("Pow", [x, add_init(np.array(e, np.float32), "c")], s)
            elif kind == "where":
                cond = rng.random(tuple(d if draw(st.booleans()) else 1 for d in s)) > 0.5
                y = add_init(rand(s))
                out = emit("Where", [add_init(cond, "m"), x, y], s)
            elif kind == "resize" and r == 4:
                mode = draw(st.sampled_from(["nearest", "linear"]))
                attrs: dict[str, Any] = {"mode": mode}
                if mode == "nearest":
                    attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
                scales = np.array([1, 1, draw(st.sampled_from([1.0, 2.0])), draw(st.sampled_from([1.0, 2.0]))],
                                  np.float32)
                out = emit("Resize", [x, "", add_init(scales, "c")], s[:2] + (int(s[2] * scales[2]), int(s[3] * scales[3])),
                           **attrs)
            elif kind == "attention" and r >= 2:
                # softmax(x x^T * scale) x: the pattern the attention rewrite fuses
                perm = list(range(r))
                perm[-1], perm[-2] = perm[-2], perm[-1]
                xt = emit("Transpose", [x], tuple(s[p] for p in perm), perm=perm)
                qk = emit("MatMul", [x, xt], s[:-1] + (s[-2],))
                scaled = emit("Mul", [qk, add_init(np.array(1 / math.sqrt(s[-1]), np.float32), "c")], shapes[qk])
                sm = emit("Softmax", [scaled], shapes[qk], axis=-1)
                out = emit("MatMul", [sm, x], s)
            elif kind == "gemm" and r == 2:
                n = draw(dims)
                tb = draw(st.sampled_from([0, 1]))
                w = add_init(rand((n, s[1]) if tb else (s[1], n)))
                ins = [x, w] + ([add_init(rand((n,)), "b")] if draw(st.booleans()) else [])
                out = emit("Gemm", ins, (s[0], n), transB=tb, alpha=draw(st.sampled_from([1.0, 0.5])))
            elif kind == "convt" and r == 4:
                oc = draw(dims)
                k = draw(st.integers(1, 3))
                stride = draw(st.integers(1, 2))
                wt = add_init(rand((s[1], oc, k, k)) * 0.5)
                out = emit("ConvTranspose", [x, wt], (s[0], oc, (s[2] - 1) * stride + k, (s[3] - 1) * stride + k),
                           kernel_shape=[k, k], strides=[stride, stride])
            elif kind == "batchnorm" and r >= 2:
                c = s[1]
                ins = [x, add_init(rand((c,))), add_init(rand((c,))), add_init(rand((c,))),
                       add_init(np.abs(rand((c,))) + 0.5)]
                out = emit("BatchNormalization", ins, s, epsilon=1e-5)
            if out is not None:
                if len(shapes[out]) > 4 or math.prod(shapes[out]) > 4096 or 0 in shapes[out]:
                    plan.nodes.pop()
                    continue
                if shapes[out]:  # rank-0 values can be outputs, but feed nothing further
                    runtime.append(out)
        produced = [o for _, _, outs, _ in plan.nodes for o in outs]
        if not produced:
            x = runtime[0]
            produced = [emit("Relu", [x], shapes[x])]
        plan.outputs = [produced[-1]]
        if len(produced) > 2 and draw(st.booleans()):
            plan.outputs.append(draw(st.sampled_from(produced[:-1])))
        return plan

    return plans()


def _fits(a: tuple[int, ...], out: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(a, out)) == out
    except ValueError:
        return False


# -- running -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    status: str  # ok | refused | mismatch | error | crash
    detail: str
    plan: Plan


def _reference(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | str:
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # invalid random graphs are expected: no error spam
        sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds)))
    except Exception as exc:  # noqa: BLE001 - an invalid random graph: skipped, not a ggml bug
        return f"onnxruntime: {exc}"


def _compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str | None:
    for k, w in want.items():
        g = got.get(k)
        if g is None or g.shape != w.shape:
            return f"{k}: shape {None if g is None else g.shape} != {w.shape}"
        if not np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
            bad = np.abs(g.astype(np.float64) - w)
            return f"{k}: max abs error {np.nanmax(bad):.3g} (at {np.unravel_index(np.nanargmax(bad), bad.shape)})"
    return None


def run_batch(plans: list[Plan], timeout: float = 300.0) -> list[Outcome]:
    """Every plan's outcome; ggml runs in child processes (a fresh one after each crash)."""
    outcomes: dict[int, Outcome] = {}
    jobs = []
    for i, plan in enumerate(plans):
        model = build_model(plan)
        feeds = feeds_of(plan)
        ref = _reference(model, feeds)
        if isinstance(ref, str):
            outcomes[i] = Outcome("invalid", ref, plan)
            continue
        jobs.append((i, model.SerializeToString(), feeds, ref))
    while jobs:
        payload = pickle.dumps([(i, m, f) for i, m, f, _ in jobs])
        env = dict(os.environ, OMP_NUM_THREADS="1", GGML_NO_BACKTRACE="1")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], input=payload,
                              capture_output=True, timeout=timeout, env=env)
        results = _read_results(proc.stdout)
        done = {i for i, _, _ in results}
        for i, status, value in results:
            plan = plans[i]
            if status == "ok":
                mismatch = _compare(value, next(r for j, _, _, r in jobs if j == i))
                outcomes[i] = Outcome("mismatch" if mismatch else "ok", mismatch or "", plan)
            else:
                outcomes[i] = Outcome(status, value, plan)
        remaining = [j for j in jobs if j[0] not in done]
        if remaining and proc.returncode != 0:
            first = remaining[0]
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
            outcomes[first[0]] = Outcome("crash", f"exit {proc.returncode}: {' | '.join(tail)}", plans[first[0]])
            remaining = remaining[1:]
        elif remaining:
            for j in remaining:
                outcomes[j[0]] = Outcome("error", "the child stopped without a result", plans[j[0]])
            remaining = []
        jobs = remaining
    return [outcomes[i] for i in range(len(plans))]


def _read_results(data: bytes) -> list[tuple[int, str, Any]]:
    out = []
    buf = io.BytesIO(data)
    while True:
        head = buf.read(8)
        if len(head) < 8:
            return out
        (n,) = struct.unpack("<Q", head)
        blob = buf.read(n)
        if len(blob) < n:
            return out
        out.append(pickle.loads(blob))


def _child() -> None:
    """Lower and run each (index, model bytes, feeds) from stdin; one framed result per graph."""
    import onnx

    from sdrt import Graph
    from sdrt.errors import UnsupportedGraph
    from sdrt_ggml import GgmlBackend

    backend = GgmlBackend()
    cpu = next(d for d in backend.devices() if d.kind == "cpu")
    jobs = pickle.loads(sys.stdin.buffer.read())
    out = sys.stdout.buffer
    for i, blob, feeds in jobs:
        try:
            with backend.compile(Graph(onnx.load_from_string(blob)), None, cpu, threads=1) as session:
                result: tuple[int, str, Any] = (i, "ok", session.run(feeds))
        except UnsupportedGraph as exc:
            result = (i, "refused", str(exc))
        except Exception as exc:  # noqa: BLE001 - every other failure is a finding
            result = (i, "error", f"{type(exc).__name__}: {exc}")
        blob_out = pickle.dumps(result)
        out.write(struct.pack("<Q", len(blob_out)) + blob_out)
        out.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    _child()
