"""Cost and memory planning: what a model costs per node, devices as data, a roofline model whose
efficiency factors measurements fit, and the planner that picks backend, precision and offload.

- ``nodes``: FLOPs, bytes and weight bytes per node of an ONNX graph at given shapes, and its op class;
- ``devices``: the device library (``sdrt/data/devices.json``) and this machine's CPU;
- ``model``: the roofline per op class, the efficiency factors and their stored calibration;
- ``calibrate``: timing the op classes on a backend here (``sdrt selftest --calibrate``);
- ``shapes``: input shapes for a lone graph with dynamic dims;
- ``planner``: parts from a run plan, candidates, the choice (``sdrt plan``);
- ``choose``: ``backend="auto"`` by predicted time (``sdrt.runtime``).

Imports point down this list, except that ``planner`` and ``calibrate`` both use ``model``.
"""

from __future__ import annotations
