"""Corrections to ``onnx.reference``'s ops, passed as ``ReferenceEvaluator(..., new_ops=REFERENCE_FIXES)`` wherever sdrt
evaluates with it (the reference backend, constant folding).

- ``BatchNormalization`` below opset 14: onnx's ``BatchNormalization_9`` takes the attribute ``momentum``'s default
  (0.9) as a request for training mode and normalizes with the batch's own statistics, so an inference graph of the
  ONNX model zoo's era (a ResNet at opset 9) came out wrong (0.76 of the output's scale off onnxruntime), and
  ``BatchNormalization_6`` returned a tuple the evaluator refuses. Inference (one output, no ``training_mode``)
  normalizes with the running mean and variance, as onnxruntime does at every opset.
"""

from __future__ import annotations

from typing import Any

from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_batch_normalization import BatchNormalization_14, _batchnorm_test_mode


class BatchNormalization(OpRun):
    op_domain = ""

    def _run(self, x: Any, scale: Any, bias: Any, mean: Any, var: Any, epsilon: Any = None, momentum: Any = None,
             training_mode: Any = None, **legacy: Any) -> tuple[Any, ...]:  # legacy: opset 6's is_test, spatial
        if training_mode or len([o for o in self.onnx_node.output if o]) > 1:
            return BatchNormalization_14._run(self, x, scale, bias, mean, var, epsilon=epsilon,  # type: ignore[arg-type]
                                              momentum=momentum, training_mode=1)
        return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=1e-5 if epsilon is None else epsilon),)


REFERENCE_FIXES: list[type[OpRun]] = [BatchNormalization]
