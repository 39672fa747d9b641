"""Every file format sdrt maps weights from refuses a file changed on disk since its header was read, replaced by a
rename or written again in place: an ONNX model's external data (``model.onnx_data``, ``weights.pb``), the large
inline weights of an ``.onnx`` (mapped from the file itself), ``.gguf`` tensors. The old offsets on the new bytes
would be wrong weights, or a read past the end of a shorter file; ``FileChanged`` says so, in one line, and opening
the file again reads the new version. A session holding mapped weights checks their files before it runs or
rebinds: a mapping of a file that shrank raises SIGBUS on access, which no Python code can catch, so the check
comes first (those tests run in a child process, so a regression fails the test rather than killing the run)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import FileChanged
from sdrt.graph import Graph
from sdrt.weights import Weights

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

N = 512  # a 512x512 float32 weight is 1 MiB: an inline one is mapped from the .onnx (MAP_INLINE_MIN_BYTES)


def _model(value: float, n: int = N) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((n, n), value, np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _save(path: Path, value: float, location: str | None, n: int = N) -> Path:
    """An .onnx at ``path``: its weight in the external file ``location``, or inline (None)."""
    m = _model(value, n)
    if location is None:
        onnx.save(m, str(path))
    else:
        onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                  size_threshold=0)
    return path


def _replace(target: Path, build, how: str) -> None:
    """``target`` made another version: written over in place (same inode), or renamed over by a new file."""
    tmp = target.parent / "new"
    tmp.mkdir(exist_ok=True)
    build(tmp)
    new = tmp / target.name
    if how == "in place":
        with open(target, "r+b") as f:
            f.truncate(0)
            f.write(new.read_bytes())
    else:
        os.replace(new, target)


def _mapped_w(g: Graph) -> np.ndarray:
    return Weights.from_graph(g)["W"]


@pytest.mark.parametrize("how", ["in place", "renamed"])
@pytest.mark.parametrize("location", ["model.onnx_data", "weights.pb"])
def test_an_onnx_models_external_data_changed_is_refused(tmp_path, location, how) -> None:
    model = _save(tmp_path / "model.onnx", 1.0, location)
    g = Graph.load(model, load_external=False)  # mapped, read on use
    assert float(_mapped_w(g)[0, 0]) == 1.0
    # a re-export beside it: another size of weight, so the old offsets run past the new file's end
    _replace(tmp_path / location, lambda d: _save(d / "model.onnx", 2.0, location, n=N // 2), how)
    with pytest.raises(FileChanged, match=rf"{location} changed on disk since the model was read \(is \d+ bytes "
                                          r"now, \d+ when opened\)"):
        _mapped_w(g)
    with pytest.raises(FileChanged):
        g.initializer_arrays()


def test_an_external_data_file_written_again_at_the_same_size_is_refused(tmp_path) -> None:
    model = _save(tmp_path / "model.onnx", 1.0, "model.onnx_data")
    g = Graph.load(model, load_external=False)
    data = tmp_path / "model.onnx_data"
    before = data.stat().st_mtime_ns
    _replace(data, lambda d: _save(d / "model.onnx", 3.0, "model.onnx_data"), "in place")
    os.utime(data, ns=(before + 10**9, before + 10**9))  # a coarse clock would not tell
    with pytest.raises(FileChanged, match="was replaced or written again"):
        _mapped_w(g)
    assert float(_mapped_w(Graph.load(model, load_external=False))[0, 0]) == 3.0  # loaded again: the new version


@pytest.mark.parametrize("how", ["in place", "renamed"])
def test_an_onnx_with_inline_weights_changed_is_refused(tmp_path, how) -> None:
    model = _save(tmp_path / "model.onnx", 1.0, None)
    g = Graph.load(model)
    assert g.mapped_initializers == ["W"]  # 1 MiB inline: left in the file, mapped from it
    _replace(model, lambda d: _save(d / "model.onnx", 4.0, None, n=N // 4), how)
    with pytest.raises(FileChanged, match=r"model.onnx changed on disk since the model was read"):
        _mapped_w(g)
    assert float(Weights.from_graph(Graph.load(model))["W"][0, 0]) == 4.0


# -- GGUF ------------------------------------------------------------------------------------------------------

def _gguf(path: Path, value: float, rows: int = 64) -> Path:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "test")
    w.add_tensor("plain.weight", np.full((rows, 32), value, np.float32))
    q = gguf.quants.quantize(np.full((rows, 32), value, np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("how", ["in place", "renamed"])
def test_a_gguf_file_changed_is_refused(tmp_path, how) -> None:
    from sdrt.weights.gguf import open_gguf

    p = _gguf(tmp_path / "m.gguf", 1.0)
    w = open_gguf(p)
    assert float(w["plain.weight"][0, 0]) == 1.0 and abs(float(w["q.weight"][0, 0]) - 1.0) < 0.01
    _replace(p, lambda d: _gguf(d / "m.gguf", 2.0, rows=8), how)  # shorter: the old offsets run past its end
    for read in (lambda: w["plain.weight"], lambda: w["q.weight"], lambda: w.raw("plain.weight"),
                 lambda: w.blocks("q.weight")):
        with pytest.raises(FileChanged, match=r"m.gguf changed on disk since it was opened \(is \d+ bytes now"):
            read()
    again = Weights.open(p)
    assert float(again["plain.weight"][0, 0]) == 2.0 and again["plain.weight"].shape == (8, 32)


# -- sessions holding mapped weights: never read a mapping of a file that shrank (SIGBUS) ------------------------

_CHILD = """
import os, sys
import numpy as np
sys.path[:0] = {paths!r}
from sdrt.errors import FileChanged
from sdrt.graph import Graph
from sdrt.weights import Weights
from sdrt_reference.backend import DEVICE, ReferenceBackend

folder = {folder!r}
kind = {kind!r}
model = os.path.join(folder, "model.onnx")
if kind == "safetensors":
    be = ReferenceBackend()
    g = Graph.load(model)
    Weights.from_arrays({{"W": np.full(({n}, {n}), 5.0, np.float32)}}).save(os.path.join(folder, "w.safetensors"))
    weights, data = Weights.open(os.path.join(folder, "w.safetensors")), os.path.join(folder, "w.safetensors")
else:
    g = Graph.load(model, load_external=False)
    weights, data = None, os.path.join(folder, kind)
sess = ReferenceBackend().compile(g, weights, DEVICE)
x = np.ones((1, {n}), np.float32)
first = float(sess.run({{"x": x}})["y"][0, 0])
with open(data, "r+b") as f:  # cut in place under the live mapping: reading its pages now is SIGBUS
    f.truncate(100)
for step in ("run", "update_weights"):
    try:
        if step == "run":
            sess.run({{"x": x}})
        else:
            sess.update_weights(Weights.from_arrays({{"W": np.zeros(({n}, {n}), np.float32)}}))
        print(step, "READ")
    except FileChanged as exc:
        print(step, "refused:", exc)
print("first", first)
"""


@pytest.mark.parametrize("kind", ["model.onnx_data", "model.onnx", "safetensors"])
def test_a_session_never_reads_the_mapping_of_a_file_that_shrank(tmp_path, kind) -> None:
    pytest.importorskip("sdrt_reference")
    _save(tmp_path / "model.onnx", 1.0, None if kind != "model.onnx_data" else kind)
    paths = [p for p in sys.path if p]
    code = textwrap.dedent(_CHILD.format(paths=paths, folder=str(tmp_path), kind=kind, n=N))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"the child died ({r.returncode}: -7 is SIGBUS): {r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    name = "w.safetensors" if kind == "safetensors" else kind
    assert lines[0].startswith(f"run refused: {name} changed on disk since this session's weights were bound "
                               "(is 100 bytes now"), r.stdout
    assert lines[1].startswith("update_weights refused:"), r.stdout
    assert lines[2] == f"first {N * (5.0 if kind == 'safetensors' else 1.0)}"
