"""Fuzz the ONNX loader: mutated bytes and hostile field values. Only SdrtError may escape."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import gw_models as M
import numpy as np
import onnx
from gw_fuzz import SETTINGS, big_or_odd_ints, mutated
from hypothesis import event, given
from hypothesis import strategies as st

from sdrt.errors import SdrtError
from sdrt.graph import Graph

SEEDS = [M.linear_model().SerializeToString(), M.conv_model().SerializeToString(),
         M.exporter_chain_model().SerializeToString()]
FOLDER = Path(tempfile.mkdtemp(prefix="sdrt-fuzz-onnx-"))
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)
(FOLDER / "weights.bin").write_bytes(np.arange(1024, dtype=np.float32).tobytes())
(FOLDER / "sub").mkdir(exist_ok=True)
LOCATIONS = ["weights.bin", "sub/../weights.bin", "../weights.bin", "/etc/passwd", "C:\\x.bin", "", "a\x00b",
             "missing.bin", "sub", ".", "weights.bin/..", "\\\\host\\share", "sub//weights.bin", "a" * 5000,
             "a/" * 3000, "weights.bin/x"]


def exercise(g: Graph) -> None:
    """What a backend does with a freshly loaded graph."""
    _ = g.inputs, g.outputs, g.op_counts(), g.value_infos(), g.initializer_info(), repr(g)
    g.initializer_arrays()
    g.with_shapes().fold_constants()


def _load_and_use(data: bytes, base_dir: Path | None = None) -> None:
    stage = "load"
    try:
        g = Graph.load(data, base_dir=base_dir)
        stage = "use"
        exercise(g)
        event("loaded and used")
    except SdrtError as exc:
        event(f"refused at {stage}: {type(exc).__name__}")


@SETTINGS
@given(data=st.data())
def test_fuzz_mutated_model_bytes(data):
    seed = data.draw(st.sampled_from(SEEDS))
    _load_and_use(data.draw(mutated(seed)))


@SETTINGS
@given(data=st.data())
def test_fuzz_hostile_fields(data):
    """Structure-aware: valid protobuf, hostile values (dims, dtypes, external data, wiring, opsets)."""
    m = onnx.ModelProto()
    m.ParseFromString(data.draw(st.sampled_from(SEEDS)))
    for _ in range(data.draw(st.integers(1, 4))):
        what = data.draw(st.sampled_from(["dims", "dtype", "external", "input", "opset", "raw", "attr", "vi"]))
        t = m.graph.initializer[data.draw(st.integers(0, len(m.graph.initializer) - 1))]
        if what == "dims":
            del t.dims[:]
            t.dims.extend(data.draw(st.lists(big_or_odd_ints(), max_size=4)))
        elif what == "dtype":
            t.data_type = data.draw(st.integers(0, 40))
        elif what == "external":
            t.data_location = onnx.TensorProto.EXTERNAL
            t.ClearField("raw_data")
            del t.external_data[:]
            for key, val in (("location", data.draw(st.sampled_from(LOCATIONS))),
                             ("offset", str(data.draw(big_or_odd_ints()))),
                             ("length", data.draw(st.sampled_from(["", "x", "16", str(2**40), "-5", "64"])))):
                e = t.external_data.add()
                e.key, e.value = key, val
        elif what == "input":
            node = m.graph.node[data.draw(st.integers(0, len(m.graph.node) - 1))]
            node.input.append(data.draw(st.sampled_from(["", "x", "nope", node.output[0]])))
        elif what == "opset":
            m.opset_import[0].version = data.draw(st.integers(-2, 40))
        elif what == "raw":
            t.raw_data = data.draw(st.binary(max_size=80))
        elif what == "attr":
            node = m.graph.node[data.draw(st.integers(0, len(m.graph.node) - 1))]
            node.attribute.add().CopyFrom(onnx.helper.make_attribute(
                data.draw(st.sampled_from(["axis", "perm", "to", "pads", "shape", "value_int"])),
                data.draw(st.one_of(big_or_odd_ints(), st.lists(big_or_odd_ints(), min_size=1, max_size=4)))))
        else:
            vi = m.graph.input[0].type.tensor_type
            vi.elem_type = data.draw(st.integers(0, 40))
    _load_and_use(m.SerializeToString(), base_dir=FOLDER)


def test_seeds_themselves_load():
    for s in SEEDS:
        exercise(Graph.load(s))
