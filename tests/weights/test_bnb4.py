"""bitsandbytes 4-bit weights (``sdrt.weights.bnb``) against bitsandbytes' own dequantization.

tests/data/bnb4/cases.safetensors (scripts/gen_bnb4_fixtures.py, bitsandbytes 0.50.2): 74 tensors quantized by
``bitsandbytes.functional.quantize_4bit``, nf4 and fp4, with and without double quantization, blocks of 32 to
4096, odd, 1-D and 3-D shapes, bf16 / fp16 / fp32, a bf16 ``quant_storage``, all-zero blocks; each saved as
``Linear4bit`` saves a weight, beside bitsandbytes' dequantization of it (``CASE.want``). sdrt's reading must be
bit for bit the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import WeightsError
from sdrt.weights import Weights, bnb, stfile

BNB = Path(__file__).resolve().parent.parent / "data" / "bnb4"
CASES = json.loads((BNB / "cases.json").read_text())


def _raw(path: Path) -> dict[str, np.ndarray]:
    entries, _ = stfile.read_header(path)
    return {k: np.array(stfile.map_entry(path, e)) for k, e in entries.items()}


@pytest.fixture(scope="module")
def raw() -> dict[str, np.ndarray]:
    return _raw(BNB / "cases.safetensors")


def test_every_case_equals_bitsandbytes_bit_for_bit(raw):
    w = Weights.open(BNB / "cases.safetensors")
    assert sorted(w) == sorted([f"{c['name']}.weight" for c in CASES] + [f"{c['name']}.want" for c in CASES])
    kinds = set()
    for c in CASES:
        name = c["name"]
        info = w.info(f"{name}.weight")
        assert (info.dtype, list(info.shape)) == (c["dtype"], c["shape"]), c
        got, want = w[f"{name}.weight"], raw[f"{name}.want"]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), c  # bit for bit, signed zeros too
        kinds.add((c["quant_type"], c["nested"], c["blocksize"]))
    assert len(kinds) == 2 * 2 * 8  # every type, with and without double quantization, every block size


@pytest.mark.parametrize("chunk", [64, 192, 4096])
def test_chunks_split_between_blocks_give_the_same_values(raw, monkeypatch, chunk):
    """Dequantized a few blocks at a time (a 12B model never holds a float32 copy of a whole tensor)."""
    monkeypatch.setattr(bnb, "CHUNK", chunk)
    w = Weights.open(BNB / "cases.safetensors")
    for c in CASES:
        got, want = w[f"{c['name']}.weight"], raw[f"{c['name']}.want"]
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (chunk, c)


def _one(raw: dict, name: str = "c01") -> dict[str, np.ndarray]:
    return {k: v for k, v in raw.items() if k.startswith(name + ".weight")}


def _open(tmp_path: Path, tensors: dict, fname: str = "model.safetensors") -> Weights:
    stfile.write(tmp_path / fname, tensors)
    return Weights.open(tmp_path / fname)


def _state(raw: dict, name: str) -> tuple[str, dict]:
    key = next(k for k in raw if k.startswith(name + ".weight.quant_state."))
    return key, json.loads(raw[key].tobytes())


def _packed(d: dict) -> np.ndarray:
    return np.frombuffer(json.dumps(d).encode(), np.uint8).copy()


def test_prefixes_and_several_files_fold(raw, tmp_path):
    """ComfyUI's prefix, a sharded folder whose scales sit in another shard than the codes."""
    one = {f"model.diffusion_model.{k}": v for k, v in _one(raw, "c20").items()}
    codes = {k: v for k, v in one.items() if k.endswith(".weight")}
    stfile.write(tmp_path / "a.safetensors", codes)
    stfile.write(tmp_path / "b.safetensors", {k: v for k, v in one.items() if k not in codes})
    w = Weights.open([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    assert list(w) == ["model.diffusion_model.c20.weight"]
    assert np.array_equal(w["model.diffusion_model.c20.weight"].view(np.uint8), raw["c20.want"].view(np.uint8))


def _error(tmp_path: Path, tensors: dict) -> str:
    with pytest.raises(WeightsError) as e:
        _open(tmp_path, tensors, "broken.safetensors")
    msg = str(e.value)
    assert "\n" not in msg and "broken.safetensors" in msg
    return msg


def test_bnb_8bit_weights_are_refused_by_name(tmp_path):
    """LLM.int8 (``Linear8bitLt``'s state dict: int8 weight, ``SCB``, ``weight_format``)."""
    msg = _error(tmp_path, {"blk.q.weight": np.ones((4, 4), np.int8), "blk.q.SCB": np.ones(4, np.float32),
                            "blk.q.weight_format": np.zeros((), np.uint8)})
    assert "blk.q.SCB: bitsandbytes 8-bit (LLM.int8) weights, which sdrt does not read" in msg
    assert "fp16/bf16, fp8 or GGUF version" in msg


def test_an_unknown_4bit_type_is_refused_by_name(raw, tmp_path):
    one = _one(raw)
    key, d = _state(raw, "c01")
    one.pop(key)
    one["c01.weight.quant_state.bitsandbytes__af4"] = _packed({**d, "quant_type": "af4"})
    msg = _error(tmp_path, one)
    assert "c01.weight is stored in bitsandbytes' 'af4' format, which sdrt does not read" in msg


@pytest.mark.parametrize("change, says", [
    (lambda t, k, d: t.update({k: _packed({**d, "shape": [3, 3]})}), "c01.weight holds 350 bytes, and 9 4-bit values of shape [3, 3] take 5"),
    (lambda t, k, d: t.pop("c01.weight.absmax"), "c01.weight: absmax is missing"),
    (lambda t, k, d: t.update({"c01.weight.absmax": np.ones(3, np.float32)}), "absmax has 3 values for 11 blocks"),
    (lambda t, k, d: t.update({k: _packed({**d, "dtype": "int8"})}), "dtype 'int8' is not one bitsandbytes"),
    (lambda t, k, d: t.update({k: _packed({**d, "blocksize": 0})}), "blocksize 0 is not a positive integer"),
    (lambda t, k, d: t.update({k: np.frombuffer(b"{not json", np.uint8).copy()}), "its bytes are not JSON"),
    (lambda t, k, d: t.update({k: _packed({**d, "quant_type": "fp4"})}), "says quant_type 'fp4', its name says"),
    (lambda t, k, d: t.pop("c01.weight"), "has no c01.weight beside it"),
    (lambda t, k, d: t.pop(k), "c01.weight.absmax is a bitsandbytes 4-bit scale without its quant_state"),
    (lambda t, k, d: t.update({"c02.weight.absmax": np.ones(2, np.float32)}), "c02.weight.absmax belongs to no"),
])
def test_a_broken_group_is_one_line_naming_the_tensor(raw, tmp_path, change, says):
    one = _one(raw)
    key, d = _state(raw, "c01")
    change(one, key, d)
    assert says in _error(tmp_path, one)


@pytest.mark.parametrize("offset", ["NaN", "Infinity"])
def test_a_nested_offset_that_is_not_finite_is_refused(raw, tmp_path, offset):
    """Python's json reads ``NaN`` / ``Infinity`` as floats: every scale would be NaN or infinite, silently."""
    one = _one(raw, "c20")
    key, d = _state(raw, "c20")
    one[key] = np.frombuffer(json.dumps({**d, "nested_offset": 0.0}).replace("0.0", offset).encode(), np.uint8).copy()
    assert f"nested_offset {float(offset)!r}" in _error(tmp_path, one)


def test_nested_scales_that_do_not_fit_are_refused(raw, tmp_path):
    one = _one(raw, "c20")
    one["c20.weight.nested_absmax"] = np.ones(5, np.float32)
    assert "nested_absmax / nested_quant_map do not fit" in _error(tmp_path, one)


def test_the_origin_says_how_the_bytes_are_read(tmp_path, raw):
    """The compile cache keys a file's tensor by where its bytes are and how they are read: the codes' bytes, and
    the bnb type, so a file quantized otherwise is another key."""
    w = _open(tmp_path, _one(raw, "c20"))
    ref = w.ref("c20.weight")
    assert ref.origin[0] == str(tmp_path / "model.safetensors") and ref.origin[3] == "bnb nf4 128 nested bfloat16"
    assert ref.origin[2] == (16 * 64 + 1) // 2


def test_rows_read_alone_equal_the_whole_tensors_rows(raw):
    """``Weights.rows``: a fused qkv's third, Flux's linear1 split, decoded from their own blocks only."""
    w = Weights.open(BNB / "cases.safetensors")
    for c in CASES:
        want = raw[f"{c['name']}.want"]
        n = want.shape[0]
        for lo, hi in {(0, n), (0, 1), (n // 3, 2 * n // 3), (n - 1, n), (1, n + 5)}:
            got = w.rows(f"{c['name']}.weight", lo, hi)
            assert np.array_equal(got.view(np.uint8), want[lo:hi].view(np.uint8)), (c, lo, hi)
    assert w.rows("c01.want", 0, 1) is None  # a plain tensor: no reader of its own
    assert w.astype("float32").rows("c01.weight", 0, 2).dtype == np.float32


def test_rows_of_blocks_that_start_inside_a_byte(raw, tmp_path):
    """A group whose block size is odd (bnb writes powers of two, but the packing does not need one): a block can
    start in a byte's low nibble, and the rows read alone must still be the whole tensor's rows (they took the
    byte's high nibble: every value one code off)."""
    c = next(c for c in CASES if c["shape"] == [33, 31] and c["quant_type"] == "nf4" and not c["nested"])
    one = _one(raw, c["name"])
    key, d = _state(raw, c["name"])
    n = 33 * 31
    one[key] = _packed({**d, "blocksize": 31})
    one[f"{c['name']}.weight.absmax"] = np.linspace(0.5, 2.0, -(-n // 31), dtype=np.float32)
    w = _open(tmp_path, one)
    whole = w[f"{c['name']}.weight"]
    for lo, hi in ((1, 2), (3, 9), (10, 33), (0, 33)):
        got = w.rows(f"{c['name']}.weight", lo, hi)
        assert np.array_equal(got.view(np.uint8), whole[lo:hi].view(np.uint8)), (lo, hi)


def test_rows_past_the_end_read_as_empty(raw):
    """As numpy slices them (``Source`` ``rows:A:B`` past a smaller tensor's end): empty, not a crash."""
    w = Weights.open(BNB / "cases.safetensors")
    want = raw["c01.want"]
    for lo, hi in ((len(want) + 2, len(want) + 5), (len(want), len(want) + 1), (5, 2)):
        got = w.rows("c01.weight", lo, hi)
        assert got.shape == want[lo:hi].shape, (lo, hi, got.shape)
