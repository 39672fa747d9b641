"""Test cases for the conformance kit.

The onnx wheel ships the node test *generators* (``onnx/backend/test/case/node``),
not their data. ``node_cases()`` runs the generators once per onnx version and
writes each case as a directory (``model.onnx``, ``test_data_set_N/*.pb``,
``data.json``) into the user cache, atomically, so later runs only read files.
``light_cases()`` are the light model tests that the wheel does ship.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import onnx
from onnx import numpy_helper
from onnx.backend.test.case.test_case import TestCase
from onnx.backend.test.loader import DATA_DIR, load_model_tests

from ..cache import cache_dir

log = logging.getLogger("sdrt.testing")



def node_data_dir() -> Path:
    return cache_dir("onnx-node-tests") / onnx.__version__


def _serialize(value: Any, value_info: onnx.ValueInfoProto) -> bytes:
    t = value_info.type
    if t.HasField("sequence_type"):
        return numpy_helper.from_list(value, value_info.name).SerializeToString()
    if t.HasField("optional_type"):
        return numpy_helper.from_optional(value, value_info.name).SerializeToString()
    if t.HasField("map_type"):
        return numpy_helper.from_dict(value, value_info.name).SerializeToString()
    if isinstance(value, onnx.TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(value, value_info.name).SerializeToString()


def generate_node_data(target: Path) -> int:
    """Run onnx's node-case generators and write every case under ``target``. Returns the count."""
    from onnx.backend.test.loader import load_node_model_tests

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".node-", dir=target.parent))
    count = 0
    try:
        for case in load_node_model_tests():
            assert case.model is not None and case.data_sets is not None
            case_dir = tmp / case.name
            case_dir.mkdir()
            (case_dir / "model.onnx").write_bytes(case.model.SerializeToString())
            (case_dir / "data.json").write_text(json.dumps({"rtol": case.rtol, "atol": case.atol}))
            graph = case.model.graph
            for i, (inputs, outputs) in enumerate(case.data_sets):
                ds = case_dir / f"test_data_set_{i}"
                ds.mkdir()
                for j, value in enumerate(inputs):
                    (ds / f"input_{j}.pb").write_bytes(_serialize(value, graph.input[j]))
                for j, value in enumerate(outputs):
                    (ds / f"output_{j}.pb").write_bytes(_serialize(value, graph.output[j]))
            count += 1
        (tmp / "COMPLETE").write_text(str(count))
        try:
            os.replace(tmp, target)  # atomic publish; another process may have won the race
        except OSError:
            if not (target / "COMPLETE").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return count


def node_cases() -> list[TestCase]:
    """The node test suite, generating its data into the cache on first use."""
    root = node_data_dir()
    if not (root / "COMPLETE").exists():
        if root.exists():
            shutil.rmtree(root, ignore_errors=True)
        log.info("generating ONNX node test data into %s (once per onnx version)", root)
        generate_node_data(root)
    cases = []
    for case_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        meta = json.loads((case_dir / "data.json").read_text())
        cases.append(TestCase(
            name=case_dir.name, model_name=case_dir.name, url=None, model_dir=str(case_dir),
            model=None, data_sets=None, kind="node", rtol=meta["rtol"], atol=meta["atol"],
        ))
    return cases


def light_cases() -> list[TestCase]:
    """The light model tests shipped in the onnx wheel (kind ``real`` pointing at ``data/light``)."""
    if not (Path(DATA_DIR) / "real").is_dir():
        return []
    return [c for c in load_model_tests(kind="real") if (c.url or "").startswith("onnx/backend/test/data/light/")]


def op_of_case(case: TestCase, single_ops: dict[str, str]) -> str:
    """The op a test is about, for the per-op summary.

    A node test with one node is about that node's op. An ``_expanded`` test
    (the op's function body, inlined) is about the op of its unexpanded
    sibling. A model test is reported as ``model:<name>``.
    """
    if case.kind != "node":
        return f"model:{case.model_name}"
    if case.name in single_ops:
        return single_ops[case.name]
    base = case.name.split("_expanded")[0]
    return single_ops.get(base, "(multi-node)")


def single_node_ops(cases: list[TestCase]) -> dict[str, str]:
    """test name -> op type, for node tests whose model has exactly one node."""
    ops = {}
    for case in cases:
        if case.kind == "node" and case.model_dir:
            model = onnx.load(os.path.join(case.model_dir, "model.onnx"), load_external_data=False)
            if len(model.graph.node) == 1:
                ops[case.name] = model.graph.node[0].op_type
    return ops
