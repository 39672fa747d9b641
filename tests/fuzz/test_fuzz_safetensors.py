"""Fuzz the safetensors path: mutated files and hostile headers. Only SdrtError may escape."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import gw_models as M
import ml_dtypes
import numpy as np
from gw_fuzz import SETTINGS, big_or_odd_ints, mutated
from hypothesis import event, given
from hypothesis import strategies as st

from sdrt.errors import SdrtError
from sdrt.graph import Graph
from sdrt.lora import Lora, merge
from sdrt.weights import Weights, stfile

FOLDER = Path(tempfile.mkdtemp(prefix="sdrt-fuzz-st-"))
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)
GRAPH = Graph.load(M.linear_model().SerializeToString())


def _seed(name: str, arrays: dict) -> bytes:
    p = FOLDER / name
    stfile.write(p, arrays, {"k": "v"})
    return p.read_bytes()


SEEDS = [
    _seed("own.safetensors", {k: np.asarray(v) for k, v in GRAPH.initializer_arrays().items()}),
    _seed("mixed.safetensors", {"a": np.ones((2, 3), np.float16), "b": np.zeros(4, ml_dtypes.bfloat16),
                                "c": np.arange(3, dtype=np.int64), "d": np.array([True])}),
    _seed("lora.safetensors", {"lora_unet_fc1.lora_down.weight": np.ones((2, 8), np.float32),
                               "lora_unet_fc1.lora_up.weight": np.ones((16, 2), np.float32),
                               "lora_unet_fc1.alpha": np.array(1.0, np.float32)}),
]
DTYPES = ["F32", "F16", "BF16", "I64", "BOOL", "F8_E4M3", "U8", "F99", "", 3, None]


def use(path: Path) -> None:
    """Open, read every tensor, convert, bind, merge as a LoRA."""
    try:
        try:
            w = Weights.open(path)
        except SdrtError as exc:
            event(f"refused at open: {type(exc).__name__}")
            return
        event("opened")
        for k in w:
            arr = w[k]
            with np.errstate(all="ignore"):
                float(np.asarray(arr, dtype=np.float64).sum()) if arr.dtype.kind in "fiub" else None
            w.get_array(k, "float32")
        w.check(GRAPH)
        try:
            w.bind(GRAPH, convert=True)
        except SdrtError:
            pass
        merge(GRAPH, Lora.open(path), strict=False)
    except SdrtError:
        pass


@SETTINGS
@given(data=st.data())
def test_fuzz_mutated_safetensors_bytes(data):
    p = FOLDER / "fuzz.safetensors"
    seed = data.draw(st.sampled_from(SEEDS))
    if data.draw(st.booleans()):  # anywhere in the file
        p.write_bytes(data.draw(mutated(seed)))
    else:  # only tensor bytes: the file stays valid, values turn odd (NaN, Inf, huge)
        start = 8 + int.from_bytes(seed[:8], "little")
        body = bytearray(seed[start:])
        for _ in range(data.draw(st.integers(1, 16))):
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0x7C]))
        p.write_bytes(seed[:start] + bytes(body))
    use(p)


@SETTINGS
@given(data=st.data())
def test_fuzz_hostile_headers(data):
    seed = data.draw(st.sampled_from(SEEDS))
    n = int.from_bytes(seed[:8], "little")
    header = json.loads(seed[8:8 + n])
    body = seed[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    for _ in range(data.draw(st.integers(1, 4))):
        name = data.draw(st.sampled_from(names))
        what = data.draw(st.sampled_from(["dtype", "shape", "offsets", "entry", "meta", "body"]))
        if what in ("dtype", "shape", "offsets") and not isinstance(header[name], dict):
            continue  # an earlier edit replaced the entry itself
        if what == "dtype":
            header[name]["dtype"] = data.draw(st.sampled_from(DTYPES))
        elif what == "shape":
            header[name]["shape"] = data.draw(st.one_of(
                st.lists(big_or_odd_ints(), max_size=4), st.just("x"), st.just([1.5]), st.just([True])))
        elif what == "offsets":
            header[name]["data_offsets"] = data.draw(st.one_of(
                st.lists(big_or_odd_ints(), max_size=3), st.just(None), st.just(["0", "4"])))
        elif what == "entry":
            header[name] = data.draw(st.sampled_from([None, 1, [], "x", {}]))
        elif what == "meta":
            header["__metadata__"] = data.draw(st.sampled_from([None, [], {"a": 1}, {"a": "b"}, "s"]))
        else:
            body = body[: data.draw(st.integers(0, len(body)))]
    blob = json.dumps(header).encode()
    p = FOLDER / "hostile.safetensors"
    p.write_bytes(len(blob).to_bytes(8, "little") + blob + body)
    use(p)


def test_seeds_themselves_open():
    for name in ("own", "mixed", "lora"):
        assert len(Weights.open(FOLDER / f"{name}.safetensors")) > 0
