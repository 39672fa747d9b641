"""The small networks sdrt rebuilds from their weight files: an ONNX graph builder and the base of an annotator.

The ControlNet preprocessors that run a model (OpenPose's body, hand and face networks, HED, PiDiNet, the lineart
generators, M-LSD, MiDaS, Depth Anything) ship as PyTorch state dicts, not graphs. sdrt reads the file with its safe
torch-file reader (``sdrt.weights.Weights``), checks the tensors it needs by name and shape, writes the network as
an ONNX graph in memory (:class:`Net`) and compiles it on any backend (``sdrt.runtime.load``), one session per
input size (:class:`AnnotatorNet`).

``Net`` keeps the graph's nodes and initializers; its helpers return the name of the tensor they produce::

    net = Net(arrays)                       # arrays: the file's tensors by the names the builder uses
    x = net.conv("image", "conv1", pad=1)   # weight "conv1.weight", bias "conv1.bias" when present
    x = net.relu(x)
    model = net.model("sdrt_example", {"image": (1, 3, h, w)}, {x: "out"})
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelError, SdrtError

__all__ = ["AnnotatorNet", "Net", "check_shapes", "fp32_options"]


class Net:
    """An ONNX graph being written: nodes, initializers, and the weights they read (``arrays``, by name)."""

    def __init__(self, arrays: Mapping[str, np.ndarray] | None = None) -> None:
        self.arrays = arrays or {}
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._have: set[str] = set()
        self._count = 0

    # ---------------------------------------------------------------------------------------- plumbing
    def node(self, op: str, inputs: Sequence[str], out: str | None = None, **attrs: Any) -> str:
        """One node; its (only) output's name (``out``, or a fresh one)."""
        from onnx import helper

        self._count += 1
        name = f"{op.lower()}_{self._count}"
        out = out or name
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        return out

    def nodes_out(self, op: str, inputs: Sequence[str], n: int, **attrs: Any) -> list[str]:
        """One node with ``n`` outputs (Split, ...); their names."""
        from onnx import helper

        self._count += 1
        name = f"{op.lower()}_{self._count}"
        outs = [f"{name}_{i}" for i in range(n)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs

    def weight(self, name: str, dtype: Any = np.float32) -> str:
        """The file's tensor ``name`` as an initializer (added once)."""
        if name not in self._have:
            self.const(name, np.asarray(self.arrays[name], dtype))
        return name

    def const(self, name: str, value: Any, dtype: Any = None) -> str:
        """An initializer holding ``value`` (a numpy array; int64 for shapes and axes)."""
        from onnx import numpy_helper

        a = np.ascontiguousarray(np.asarray(value, dtype))
        if name in self._have:
            raise ValueError(f"initializer {name} written twice")
        self._have.add(name)
        self.inits.append(numpy_helper.from_array(a, name))
        return name

    def ints(self, *values: int) -> str:
        """An int64 constant (shapes, axes, pads), named by its values."""
        name = "i64_" + "_".join(str(v).replace("-", "m") for v in values)
        return name if name in self._have else self.const(name, np.array(values, np.int64))

    def scalar(self, value: float) -> str:
        """A float32 scalar constant (one per value)."""
        name = f"f32_{float(np.float32(value))!r}"
        return name if name in self._have else self.const(name, np.array(value, np.float32))

    # ---------------------------------------------------------------------------------------- layers
    def conv(self, x: str, name: str, *, stride: int = 1, pad: int | Sequence[int] | None = None, dilation: int = 1,
             groups: int = 1, bias: bool | None = None, out: str | None = None) -> str:
        """``Conv`` with ``name.weight`` (and ``name.bias`` when the file has it, or ``bias=True``); ``pad``:
        one number for all sides, four (top, left, bottom, right), or None for "same" at stride 1."""
        w = self.arrays[f"{name}.weight"]
        k = tuple(int(s) for s in np.shape(w)[2:])
        if pad is None:
            pad = [dilation * (k[0] - 1) // 2, dilation * (k[1] - 1) // 2] * 2
        pads = [int(pad)] * 4 if isinstance(pad, (int, np.integer)) else list(pad)
        inputs = [x, self.weight(f"{name}.weight")]
        if bias if bias is not None else f"{name}.bias" in self.arrays:
            inputs.append(self.weight(f"{name}.bias"))
        return self.node("Conv", inputs, out, kernel_shape=list(k), strides=[stride, stride], pads=pads,
                         dilations=[dilation, dilation], group=groups)

    def conv_transpose(self, x: str, name: str, *, stride: int = 2, pad: int = 0, output_padding: int = 0,
                       out: str | None = None) -> str:
        w = self.arrays[f"{name}.weight"]
        k = [int(s) for s in np.shape(w)[2:]]
        inputs = [x, self.weight(f"{name}.weight")]
        if f"{name}.bias" in self.arrays:
            inputs.append(self.weight(f"{name}.bias"))
        return self.node("ConvTranspose", inputs, out, kernel_shape=k, strides=[stride, stride], pads=[pad] * 4,
                         output_padding=[output_padding] * 2)

    def linear(self, x: str, name: str, out: str | None = None) -> str:
        """``x @ name.weight.T (+ name.bias)`` over the last axis (PyTorch's Linear)."""
        wt = f"{name}.weight.T"
        if wt not in self._have:
            self.const(wt, np.asarray(self.arrays[f"{name}.weight"], np.float32).T)
        y = self.node("MatMul", [x, wt], None if f"{name}.bias" in self.arrays else out)
        return self.node("Add", [y, self.weight(f"{name}.bias")], out) if f"{name}.bias" in self.arrays else y

    def batch_norm(self, x: str, name: str, eps: float = 1e-5, out: str | None = None) -> str:
        """Inference BatchNorm with ``name.{weight,bias,running_mean,running_var}``."""
        ins = [x] + [self.weight(f"{name}.{p}") for p in ("weight", "bias", "running_mean", "running_var")]
        return self.node("BatchNormalization", ins, out, epsilon=eps)

    def group_norm(self, x: str, name: str | None, groups: int, channels: int, eps: float = 1e-5,
                   out: str | None = None) -> str:
        """GroupNorm over NCHW (InstanceNorm when ``groups == channels``), with ``name.weight``/``name.bias`` (None:
        no affine). Written as reshape + InstanceNormalization so every backend takes it."""
        ones = self.const(f"gn_ones_{self._count}_{len(self.inits)}", np.ones(groups, np.float32))
        zeros = self.const(f"gn_zeros_{self._count}_{len(self.inits)}", np.zeros(groups, np.float32))
        shape = self.node("Shape", [x])
        g = self.node("Reshape", [x, self.ints(0, groups, -1)])
        g = self.node("InstanceNormalization", [g, ones, zeros], epsilon=eps)
        y = self.node("Reshape", [g, shape])
        if name is None:
            return y if out is None else self.node("Identity", [y], out)
        w = self.const(f"{name}.weight.c11", np.asarray(self.arrays[f"{name}.weight"], np.float32).reshape(-1, 1, 1))
        b = self.const(f"{name}.bias.c11", np.asarray(self.arrays[f"{name}.bias"], np.float32).reshape(-1, 1, 1))
        return self.node("Add", [self.node("Mul", [y, w]), b], out)

    def layer_norm(self, x: str, name: str, eps: float = 1e-6, out: str | None = None) -> str:
        """LayerNorm over the last axis with ``name.weight``/``name.bias``."""
        return self.node("LayerNormalization", [x, self.weight(f"{name}.weight"), self.weight(f"{name}.bias")], out,
                         axis=-1, epsilon=eps)

    def relu(self, x: str, out: str | None = None) -> str:
        return self.node("Relu", [x], out)

    def sigmoid(self, x: str, out: str | None = None) -> str:
        return self.node("Sigmoid", [x], out)

    def add(self, a: str, b: str, out: str | None = None) -> str:
        return self.node("Add", [a, b], out)

    def mul(self, a: str, b: str, out: str | None = None) -> str:
        return self.node("Mul", [a, b], out)

    def concat(self, xs: Sequence[str], axis: int = 1, out: str | None = None) -> str:
        return self.node("Concat", list(xs), out, axis=axis)

    def max_pool(self, x: str, k: int = 2, stride: int | None = None, pad: int = 0, ceil: bool = False,
                 out: str | None = None) -> str:
        return self.node("MaxPool", [x], out, kernel_shape=[k, k], strides=[stride or k] * 2, pads=[pad] * 4,
                         ceil_mode=int(ceil))

    def avg_pool(self, x: str, k: int = 2, stride: int | None = None, pad: int = 0, out: str | None = None) -> str:
        return self.node("AveragePool", [x], out, kernel_shape=[k, k], strides=[stride or k] * 2, pads=[pad] * 4)

    def resize(self, x: str, *, scale: float | None = None, size: tuple[int, int] | None = None,
               mode: str = "linear", align_corners: bool = False, out: str | None = None) -> str:
        """Resize NCHW by ``scale`` or to ``size`` (h, w) as PyTorch's ``interpolate`` does (``mode``: "nearest",
        "linear" (bilinear) or "cubic" (bicubic, A = -0.75); ``align_corners`` as its flag)."""
        coord = "align_corners" if align_corners else ("asymmetric" if mode == "nearest" else "half_pixel")
        attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": coord}
        if mode == "nearest":
            attrs["nearest_mode"] = "floor"
        if mode == "cubic":
            attrs["cubic_coeff_a"] = -0.75
        if size is not None:
            shape = self.node("Shape", [x])
            nc = self.node("Slice", [shape, self.ints(0), self.ints(2)])
            sizes = self.node("Concat", [nc, self.ints(*size)], axis=0)
            return self.node("Resize", [x, "", "", sizes], out, **attrs)
        name = f"scales_{scale}".replace(".", "p")
        scales = name if name in self._have else self.const(name, np.array([1, 1, scale, scale], np.float32))
        return self.node("Resize", [x, "", scales], out, **attrs)

    # ---------------------------------------------------------------------------------------- the model
    def model(self, name: str, inputs: Mapping[str, Sequence[int]], outputs: Mapping[str, str],
              opset: int = 17) -> Any:
        """The checked ``onnx.ModelProto``: float32 ``inputs`` (name -> shape) and ``outputs`` (the tensor a helper
        returned -> the output's name; shapes left to the backend)."""
        import onnx
        from onnx import TensorProto, helper

        for t, o in outputs.items():
            if t != o:
                self.node("Identity", [t], o)
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()]
        # checked and shape-inferred without the weights' bytes (they are graph inputs of the probe), so a large
        # network is never serialised whole
        held = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in self.inits]
        probe = helper.make_model(helper.make_graph(self.nodes, name, ins + held, []),
                                  opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
        probe = onnx.shape_inference.infer_shapes(probe, check_type=True, data_prop=True)
        known = {v.name: v for v in probe.graph.value_info}
        outs = [known[o] if o in known else helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                for o in outputs.values()]
        probe.graph.output.extend(o for o in outs if o.type.tensor_type.HasField("shape"))
        onnx.checker.check_model(probe)  # an output whose shape only the backend can tell (Resize to computed
        # sizes) goes out with its type alone
        return helper.make_model(helper.make_graph(self.nodes, name, ins, outs, self.inits),
                                 opset_imports=[helper.make_opsetid("", opset)], producer_name="sdrt", ir_version=8)


def check_shapes(shapes: Mapping[str, Sequence[int]], want: Mapping[str, tuple[int, ...]], where: str,
                 what: str, fix: str, strip: Callable[[str], str] | None = None) -> dict[str, str]:
    """The file's name for each expected tensor (``strip`` maps a file name to the bare name; default: drop a
    ``module.`` prefix); a ``ModelError`` naming the file, what it is not, and ``fix`` when a tensor is missing or
    has another shape."""
    strip = strip or (lambda n: n[len("module."):] if n.startswith("module.") else n)
    bare = {strip(n): n for n in shapes}
    missing = [n for n in want if n not in bare]
    if missing:
        raise ModelError(f"{where} is not {what} ({len(missing)} of its {len(want)} tensors missing, e.g. "
                         f"{missing[0]})", where=where, fix=fix)
    for n, shape in want.items():
        if tuple(shapes[bare[n]]) != tuple(shape):
            raise ModelError(f"{where}: {n} is {tuple(shapes[bare[n]])}, not {what}'s {tuple(shape)}", where=where,
                             fix=fix)
    return {n: bare[n] for n in want}


def fp32_options(backend: str, device: Any) -> dict[str, Any]:
    """The compile options that ask ``backend`` for float32. A preprocessor's map thresholds and picks peaks, so a
    narrower default (bf16 on CPUs that have it) would move its lines and keypoints away from the extension's, which
    runs these networks in float32; they are small, so float32 costs little."""
    from ..runtime import select

    be, _ = select(backend, device)
    return dict((be.precisions or {}).get("fp32", {}))


class AnnotatorNet:
    """A preprocessor's network file compiled on one backend (in float32: :func:`fp32_options`), one session per
    input size (the :attr:`KEEP` used last are kept).

    Subclasses set ``WHAT`` (how errors name the model, e.g. "OpenPose's body model") and ``FIX`` (what to pass
    instead), and implement :meth:`expected` (the bare tensor names and shapes, from the file's shapes when the
    size varies) and :meth:`build` (the ``onnx.ModelProto`` for one input size, from ``self.arrays()``), or set
    :attr:`ARCH` where the architecture module does both from a config read off the file's shapes."""

    WHAT = "the preprocessor's model"
    FIX = "pass the model file the preprocessor names"
    #: ``(config_of(shapes), expected_shapes(config), build_graph(arrays, config, *size))`` of an architecture whose
    #: size is read off the file's bare names and shapes (LeReS, NormalBae, ZoeDepth, UniFormer): :meth:`expected`
    #: and :meth:`build` by them, the config kept as ``self.config``
    ARCH: tuple[Any, Any, Any] | None = None
    #: the input sizes whose compiled graphs are kept, the most recently used: each holds the weights (MiDaS's
    #: 490 MB), and a server's requests come in many sizes
    KEEP = 4

    def __init__(self, path: str | Path, *, backend: str = "auto", device: Any = None) -> None:
        from ..weights import Weights

        self.path = Path(path)
        self.files = (self.path,)
        where = str(self.path)
        try:
            self.weights = Weights.open(self.path)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one line naming it
            # sdrt's own error by its what alone: its "Where: ... What to do: ..." inside this one's said it twice
            said = (exc.what + (f"; {exc.fix}" if exc.fix else "") if isinstance(exc, SdrtError) else
                    f"{type(exc).__name__}: {exc}")
            raise ModelError(f"{where} could not be read as a PyTorch or safetensors file ({said})", where=where,
                             fix=self.FIX) from None
        shapes = self.weights.shapes()
        self.names = check_shapes(shapes, self.expected(shapes), where, self.WHAT, self.FIX, self.strip)
        self.backend, self.device = backend, device
        self._sessions: dict[tuple[int, ...], Any] = {}
        # its own name: a subclass's lock around a whole run (Depth Anything's) calls session() while holding it
        self._session_lock = threading.RLock()
        self._arrays: dict[str, np.ndarray] | None = None

    def strip(self, name: str) -> str:
        """The bare name of a file's tensor (default: without a ``module.`` prefix)."""
        return name[len("module."):] if name.startswith("module.") else name

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        if self.ARCH is None:
            raise NotImplementedError
        config_of, expected_shapes, _ = self.ARCH
        self.config = config_of({self.strip(n): s for n, s in shapes.items()})
        return expected_shapes(self.config)

    def build(self, *size: int) -> Any:
        if self.ARCH is None:
            raise NotImplementedError
        return self.ARCH[2](self.arrays(), self.config, *size)

    def arrays(self) -> dict[str, np.ndarray]:
        """The expected tensors as float32 arrays, by bare name (read once)."""
        if self._arrays is None:
            self._arrays = {n: np.asarray(self.weights[f], np.float32) for n, f in self.names.items()}
        return self._arrays

    def session(self, *size: int) -> Any:
        """The compiled graph for one input size (built and compiled the first time)."""
        with self._session_lock:  # a job and serve's detect may share this detector
            sess = self._sessions.pop(size, None)
            if sess is None:
                from ..runtime import load

                sess = load(self.build(*size), backend=self.backend, device=self.device,
                            **fp32_options(self.backend, self.device))
                self._arrays = None  # the session holds its own copy; another size reads the (mapped) file again
            self._sessions[size] = sess  # the most recent last
            while len(self._sessions) > self.KEEP:
                # the least recently used let go, not closed: another thread may be running it; it is freed when
                # the last one holding it lets go
                self._sessions.pop(next(iter(self._sessions)))
            return sess

    def close(self) -> None:
        with self._session_lock:
            for s in self._sessions.values():
                s.close()
            self._sessions.clear()
            self._arrays = None  # the float32 copy of the file's weights goes too (read again if it runs again)

    def __enter__(self) -> AnnotatorNet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
