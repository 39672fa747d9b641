"""Weights.open: lazy mmap, several files, dtypes, pickles that are no checkpoint, and malformed files."""

from __future__ import annotations

import json

import gw_models as M
import ml_dtypes
import numpy as np
import pytest

from sdrt.errors import WeightsError
from sdrt.weights import Weights, stfile

R = np.random.default_rng(0)


def _arrays():
    return {
        "a.f32": R.standard_normal((3, 5)).astype(np.float32),
        "b.f16": R.standard_normal((7,)).astype(np.float16),
        "c.bf16": R.standard_normal((2, 2)).astype(ml_dtypes.bfloat16),
        "d.i64": np.arange(4, dtype=np.int64),
        "e.bool": np.array([True, False]),
        "f.empty": np.zeros((0, 3), np.float32),
        "g.scalar": np.array(1.5, np.float64),
    }


def test_round_trip_our_writer_is_read_by_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    p = tmp_path / "w.safetensors"
    arrays = {k: v for k, v in _arrays().items() if k != "c.bf16"}  # safetensors.numpy has no bf16
    stfile.write(p, arrays, {"note": "x"})
    theirs = st.load_file(str(p))
    for k, v in arrays.items():
        assert theirs[k].dtype == v.dtype and theirs[k].tobytes() == v.tobytes()


def test_reads_files_written_by_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    arrays = {k: v for k, v in _arrays().items() if k != "c.bf16"}
    p = tmp_path / "w.safetensors"
    st.save_file(arrays, str(p))
    w = Weights.open(p)
    assert sorted(w) == sorted(arrays)
    for k, v in arrays.items():
        assert w[k].dtype == v.dtype and w[k].shape == v.shape and w[k].tobytes() == v.tobytes()


def test_open_is_lazy_and_mapped(tmp_path):
    p = tmp_path / "w.safetensors"
    stfile.write(p, _arrays())
    w = Weights.open(p)
    assert len(w) == 7 and "a.f32" in w and w.sources == [p]
    a = w["a.f32"]
    assert M.is_mapped(a) and not a.flags.writeable
    assert w.info("c.bf16").dtype == "bfloat16"
    assert w["c.bf16"].dtype == ml_dtypes.bfloat16 and M.is_mapped(w["c.bf16"])
    assert w["f.empty"].shape == (0, 3) and w["g.scalar"].shape == ()


def test_dtype_conversion_on_request(tmp_path):
    p = tmp_path / "w.safetensors"
    arrays = _arrays()
    stfile.write(p, arrays)
    w = Weights.open(p)
    up = w.get_array("c.bf16", "float32")
    assert up.dtype == np.float32
    np.testing.assert_array_equal(up, arrays["c.bf16"].astype(np.float32))
    w16 = Weights.open(p, dtype="float16")
    assert w16["a.f32"].dtype == np.float16 and w16["c.bf16"].dtype == np.float16
    assert w16["d.i64"].dtype == np.int64  # integers are never converted
    assert w16.info("a.f32").dtype == "float16"
    assert w.astype("bfloat16")["a.f32"].dtype == ml_dtypes.bfloat16
    with pytest.raises(WeightsError, match="unknown dtype"):
        w.astype("float13")


def test_several_files_and_folder(tmp_path):
    stfile.write(tmp_path / "1.safetensors", {"x": np.zeros(2, np.float32)})
    stfile.write(tmp_path / "2.safetensors", {"y": np.ones(3, np.float16)})
    w = Weights.open([tmp_path / "1.safetensors", tmp_path / "2.safetensors"])
    assert sorted(w) == ["x", "y"]
    assert sorted(Weights.open(tmp_path)) == ["x", "y"]
    stfile.write(tmp_path / "3.safetensors", {"x": np.zeros(2, np.float32)})
    with pytest.raises(WeightsError, match="several files"):
        Weights.open(tmp_path)


@pytest.mark.parametrize("suffix", [".ckpt", ".pt", ".pth", ".bin", ".pkl"])
def test_a_pickle_that_is_no_torch_checkpoint_is_refused(tmp_path, suffix):
    """PyTorch checkpoints are read (tests/weights/test_torchfile.py); another pickle is not one."""
    p = tmp_path / f"model{suffix}"
    p.write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(WeightsError, match="not a PyTorch checkpoint") as e:
        Weights.open(p)
    assert "safetensors" in e.value.fix and str(p) in str(e.value)


@pytest.mark.parametrize("head", [b"PK\x03\x04" + b"\0" * 30, b"\x80\x02}q\x00(X" + b"\0" * 20])
def test_a_broken_pickle_in_disguise_is_read_as_one_and_refused(tmp_path, head):
    p = tmp_path / "model.safetensors"
    p.write_bytes(head)
    with pytest.raises(WeightsError, match="PyTorch checkpoint"):
        Weights.open(p)


def test_onnx_passed_as_weights(tmp_path):
    p = M.save(M.linear_model(), tmp_path / "m.onnx")
    with pytest.raises(WeightsError, match="ONNX graph"):
        Weights.open(p)


def test_missing_and_empty(tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        Weights.open(tmp_path / "nope.safetensors")
    with pytest.raises(WeightsError, match="no .safetensors"):
        Weights.open(tmp_path)
    with pytest.raises(WeightsError, match="no weights files"):
        Weights.open([])


def _raw(tmp_path, header: dict | bytes, data: bytes = b"", declared: int | None = None):
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes((declared if declared is not None else len(blob)).to_bytes(8, "little") + blob + data)
    return p


@pytest.mark.parametrize(("header", "data", "match"), [
    (b"not json", b"", "not valid JSON"),
    (b"[1, 2]", b"", "not a JSON object"),
    ({"a": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "non-negative"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "outside the data"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs 8"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 8, "overlap"),
    ({"__metadata__": {"k": 1}}, b"", "__metadata__"),
    ({"a": [1]}, b"", "not an object"),
])
def test_malformed_headers(tmp_path, header, data, match):
    with pytest.raises(WeightsError, match=match):
        Weights.open(_raw(tmp_path, header, data))


def test_truncated_and_short_files(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\x01\x00")
    with pytest.raises(WeightsError, match="too short"):
        Weights.open(p)
    with pytest.raises(WeightsError, match="does not fit the file"):
        Weights.open(_raw(tmp_path, {"a": {}}, declared=10_000))
    good = tmp_path / "good.safetensors"
    stfile.write(good, {"a": np.zeros(100, np.float32)})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(WeightsError, match="truncated"):
        Weights.open(cut)


@pytest.mark.parametrize(("head", "kind"), [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a PNG image"), (b"\xff\xd8\xff\xe0\x00\x10JFIF", "a JPEG image"),
    (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "a WebP image"), (b"GIF89a\x01\x00\x01\x00", "a GIF image"),
])
def test_a_picture_given_as_weights_is_named_a_picture(tmp_path, capsys, head: bytes, kind: str) -> None:
    """``sdrt generate in.png "..."`` (the picture where the model goes) said "header length 727905341920923785 does
    not fit the file: truncated or not safetensors ... re-download the file"."""
    from backend_helpers import register

    from sdrt.cli import main

    register("reference")
    p = tmp_path / "in.png"
    p.write_bytes(head + bytes(300))
    with pytest.raises(WeightsError, match=f"in.png is {kind}, not a model or weights file") as err:
        Weights.open(p)
    assert "{@init_image} for img2img" in err.value.fix
    assert main(["generate", str(p), "a cat", "-o", str(tmp_path / "o.png")]) == 1
    err = capsys.readouterr().err
    assert f"is {kind}, not a model" in err and "--init-image for img2img" in err and err.count("\n") == 1, err


def test_writer_into_missing_folder(tmp_path):
    with pytest.raises(WeightsError, match="cannot write weights") as e:
        stfile.write(tmp_path / "no" / "w.safetensors", {"a": np.zeros(1, np.float32)})
    assert e.value.fix == "create the folder first"


def test_writer_refuses_object_arrays(tmp_path):
    with pytest.raises(WeightsError, match="cannot be stored"):
        stfile.write(tmp_path / "o.safetensors", {"s": np.array(["a"], dtype=object)})


def test_save_round_trip_and_replaced(tmp_path):
    w = Weights.from_arrays(_arrays())
    p = w.save(tmp_path / "s.safetensors")
    back = Weights.open(p)
    for k in w:
        assert back[k].tobytes() == w[k].tobytes() and back[k].dtype == w[k].dtype
    r = back.replaced({"a.f32": np.ones((3, 5), np.float32)})
    assert r["a.f32"].sum() == 15 and back["a.f32"].sum() != 15
    assert "Weights(7 tensors" in repr(back)


@pytest.mark.parametrize("header_len", [640, 896, 1152, 1408])
def test_a_header_length_that_starts_like_a_pickle_is_still_safetensors(tmp_path, header_len):
    """A header of 640 bytes is b'\\x80\\x02\\0...' little-endian: the bytes a pickle starts with."""
    import struct

    from sdrt.formats import sniff

    body = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    header = body.encode().ljust(header_len)
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", header_len) + header + np.arange(2, dtype=np.float32).tobytes())
    assert sniff(path.read_bytes()[:16]) == "a safetensors weights file"
    np.testing.assert_array_equal(Weights.open(path)["w"], [0, 1])
