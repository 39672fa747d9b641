"""The conformance kit: prove any sdrt backend with onnx's own backend tests.

``sdrt.testing`` turns an sdrt ``Backend`` and one of its devices into an
``onnx.backend.base.Backend`` and runs onnx's ``BackendTest`` against it: the
ONNX node test suite (its data generated once into a cache) and the "light"
model tests that the onnx wheel ships. Test names carry the device
(``test_abs_cpu``, ``test_abs_gpu_0``), and patterns chain::

    from sdrt.testing import BackendTest

    suite = (BackendTest("openvino", device="CPU")
             .include(r"test_(conv|relu)_")
             .xfail(r"test_conv_with_autopad_same", "OpenVINO rounds SAME pads differently")
             .tolerance(r"test_gelu", rtol=1e-3, atol=1e-5))
    summary = suite.run()
    print(summary.render())

A backend can declare its own expectations on its class (``Backend.conformance``);
they apply unless the caller passes ``use_backend_expectations=False``.
"""

from __future__ import annotations

from .adapter import make_onnx_backend
from .report import OpResult, Summary
from .suite import BackendTest

__all__ = ["BackendTest", "OpResult", "Summary", "make_onnx_backend"]
