"""Every GGUF type read from a file written by gguf's writer, checked against gguf's dequantizer
(``gguf.quants.dequantize``), against ggml's own C ``to_float``, and against the values written."""

from __future__ import annotations

import numpy as np
import pytest
from gguf_files import GGML_QUANTIZED, NUMPY_QUANTIZED, PLAIN, SHAPE, encode, ggml_dequantize, values, write

from sdrt.errors import WeightsError
from sdrt.weights import Weights
from sdrt.weights.gguf import GGUFWeights, open_gguf

#: relative RMS error of each type against the float32 values written (measured, with headroom)
RMS = {"F32": 0, "F16": 1e-3, "BF16": 5e-3, "F64": 0, "Q8_0": 0.01, "Q6_K": 0.02, "Q5_0": 0.05, "Q5_1": 0.05,
       "Q5_K": 0.05, "Q4_0": 0.1, "Q4_1": 0.1, "Q4_K": 0.1, "IQ4_NL": 0.1, "IQ4_XS": 0.1, "Q3_K": 0.2,
       "IQ3_S": 0.2, "IQ3_XXS": 0.25, "Q2_K": 0.4, "IQ2_S": 0.4, "IQ2_XS": 0.45, "IQ2_XXS": 0.5, "IQ1_S": 0.7,
       "IQ1_M": 0.7, "MXFP4": 0.2, "NVFP4": 0.2, "TQ1_0": 1.0, "TQ2_0": 1.0}


def _needs_ggml(type_name):
    if type_name in GGML_QUANTIZED:
        pytest.importorskip("ggml", reason="ggml-python quantizes this type for the test file")


@pytest.mark.parametrize("type_name", PLAIN + NUMPY_QUANTIZED + GGML_QUANTIZED)
def test_type_reads_like_gguf_and_ggml_dequantize(tmp_path, type_name):
    import gguf
    from gguf import quants

    _needs_ggml(type_name)
    x = values()
    data = encode(type_name, x)
    path = write(tmp_path / f"{type_name}.gguf", {"blk.0.w": (type_name, data, SHAPE)})
    w = Weights.open(path)
    assert isinstance(w, GGUFWeights) and w.ggml_type("blk.0.w") == type_name
    got = np.asarray(w["blk.0.w"])
    assert got.shape == SHAPE
    if type_name in PLAIN:
        want = data.view(np.dtype("uint16")) if type_name == "BF16" else data
        assert np.array_equal(got.view(want.dtype) if type_name == "BF16" else got, want)
        if type_name.startswith("I"):
            return
    else:
        t = gguf.GGMLQuantizationType[type_name]
        kind, raw, shape = w.raw("blk.0.w")
        assert kind == type_name and shape == SHAPE and np.array_equal(np.asarray(raw).reshape(-1), data.reshape(-1))
        np.testing.assert_array_equal(got, quants.dequantize(data, t).reshape(SHAPE))
        try:
            import ggml  # noqa: F401
        except ImportError:
            pass
        else:  # ggml's C dequantizer agrees with gguf-py's numpy one on the same bytes
            np.testing.assert_allclose(got.reshape(-1), ggml_dequantize(data, type_name, x.size), rtol=1e-6,
                                       atol=1e-6)
    rms = float(np.sqrt(np.mean((got.astype(np.float64) - x) ** 2) / np.mean(x.astype(np.float64) ** 2)))
    assert rms <= RMS[type_name] + 1e-7, (type_name, rms)


def test_names_shapes_and_key_maps(tmp_path):
    x = values((4, 64))
    path = write(tmp_path / "m.gguf", {"model.diffusion_model.input_blocks.0.0.weight": ("F16", x.astype(np.float16),
                                                                                          x.shape),
                                       "model.diffusion_model.out.2.weight": ("Q8_0", encode("Q8_0", x), x.shape)})
    w = open_gguf(path, mapping={"model.diffusion_model.out.2.weight": "conv_out.weight"})
    assert set(w) == {"conv_out.weight", "model.diffusion_model.input_blocks.0.0.weight"}
    assert w.ggml_type("conv_out.weight") == "Q8_0" and w.ggml_type("model.diffusion_model.input_blocks.0.0.weight") == "F16"
    assert w["conv_out.weight"].shape == (4, 64) and w.metadata["general.architecture"] == "sdrt-test"


def test_a_type_nothing_can_read_is_a_clear_error(tmp_path):
    import gguf

    raw = np.zeros((2, 4 * gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1][1]), np.uint8)
    path = write(tmp_path / "q81.gguf", {"t": ("Q8_1", raw, (2, 128))})
    with pytest.raises(WeightsError, match=r"types that no installed reader or backend can take: Q8_1 \(1 tensors"):
        Weights.open(path)


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF" + b"\0" * 10)
    with pytest.raises(WeightsError, match="not a readable GGUF file"):
        Weights.open(p)


def test_a_broken_gguf_says_what_is_wrong_not_numpys_words(tmp_path):
    """gguf's reader fails with numpy's errors ("When changing to a larger dtype...", "index 0 is out of
    bounds"); the message said those."""
    good = write(tmp_path / "a.gguf", {"w": ("F32", np.ones((4, 8), np.float32), (4, 8))}).read_bytes()
    cases = {"short": (good[:10], "the file is 10 bytes, shorter than a GGUF header (24 bytes): it is truncated"),
             "cut": (good[:-10], f"the file ends at byte {len(good) - 10}, before the end of the"),
             "count": (good[:8] + (10**12).to_bytes(8, "little") + good[16:],
                       "its header lists 1000000000000 tensors, more than a file of")}
    for name, (data, said) in cases.items():
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(data)
        with pytest.raises(WeightsError) as e:
            Weights.open(p)
        msg = str(e.value)
        assert said in msg and "re-download the .gguf file" in msg, msg
        assert "ValueError" not in msg and "IndexError" not in msg and "dtype" not in msg, msg
