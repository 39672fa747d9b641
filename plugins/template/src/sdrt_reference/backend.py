"""The reference backend: onnx.reference.ReferenceEvaluator behind sdrt's contract."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdrt import Backend, Device, Session
from sdrt.errors import ModelError, SdrtError
from sdrt.graph import Graph

DEVICE = Device(backend="reference", id="CPU", name="onnx ReferenceEvaluator (numpy)", kind="cpu")


class ReferenceSession(Session):
    def __init__(self, graph: Graph, arrays: dict[str, np.ndarray]) -> None:
        from onnx.reference import ReferenceEvaluator

        super().__init__(graph.inputs, graph.outputs, graph=graph)
        try:  # built without initializers: their arrays are bound below, and swapped by _update_weights
            from sdrt.refops import REFERENCE_FIXES

            self._evaluator = ReferenceEvaluator(graph.model_without(arrays), new_ops=REFERENCE_FIXES)
        except Exception as exc:  # the evaluator rejects graphs it cannot build
            raise ModelError(f"the reference evaluator cannot build this graph: {exc}", where=graph.name,
                             fix="check the model with onnx.checker.check_model") from exc
        self._evaluator.rt_inits_.update(arrays)
        self._output_names = [o.name for o in self.outputs]
        self._where = graph.name

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._run_outputs(feeds, self._output_names)

    def _run_outputs(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """The outputs ``names`` only (``Session.run(outputs=)``): the evaluator hands back just those."""
        try:
            results = self._evaluator.run(names, feeds)
        except SdrtError:
            raise
        except Exception as exc:
            raise SdrtError(f"the reference evaluator failed: {exc!r}", where=self._where,
                            fix="check the inputs; run onnx.checker.check_model on the graph") from exc
        # tensors come back as arrays; sequence and optional outputs stay as the evaluator made them
        return {name: value if value is None or isinstance(value, list) else np.asarray(value)
                for name, value in zip(names, results)}

    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """Swap initializer values in the built evaluator; the graph is not parsed again."""
        self._evaluator.rt_inits_.update(arrays)

    def close(self) -> None:
        self._evaluator = None
        super().close()


class ReferenceBackend(Backend):
    name = "reference"
    api_version = (1, 1)
    priority = 0  # lowest: any real backend wins an automatic choice
    #: stored weight types run as they are (onnx.reference evaluates DequantizeLinear exactly)
    quantized_weights = frozenset({"int8", "int4", "float8_e4m3fn"})
    #: a rebind evaluates the graph with the new initializers, as a fresh compile does
    rebinds_as_compiled = True
    # What `sdrt conformance reference` should expect: limits of onnx.reference itself.
    conformance = {
        "xfail": {
            r"^test_bernoulli": "random output: the expected data came from another random generator",
            r"^test_image_decoder_": "onnx.reference decodes images with Pillow, which sdrt does not install",
            r"^test_scatter_with(out)?_axis_": "Scatter was removed in opset 11; onnx.reference has no kernel for it",
            r"^test_scan_sum_": "onnx.reference fails on Scan-8 (old batch-axis form)",
            r"^test_range_.*_expanded_": "onnx.reference's Loop returns the wrong shape for Range's function body",
            r"^test_loop16_seq_none_": "onnx.reference's Loop cannot build ragged sequence outputs",
            r"^test_if_opt_": "onnx.reference's If wraps an optional sequence output in an extra list",
            r"^test_(squeezenet|densenet121)_": "onnx.reference differs from onnxruntime and the shipped expected "
                                                  "output on this light model (checked: onnxruntime matches exactly)",
        },
    }

    def devices(self) -> list[Device]:
        return [DEVICE]

    # ``compile`` is the core's template: it checks the device, refuses options (this backend takes
    # none: ``Backend.parse_options``), resolves the weights and calls ``_compile``.
    def _compile(self, graph: Graph, arrays: dict[str, np.ndarray], device: Device, opts: Any) -> Session:
        return ReferenceSession(graph, arrays)
