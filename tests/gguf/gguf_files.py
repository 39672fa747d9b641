"""Small GGUF files written with the gguf package's own writer, one tensor per stored type.

Values: float32 rows with a spread of magnitudes. Block-quantized with gguf's numpy quantizer where
it has one (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0, MXFP4), else with ggml's C quantizer
(``ggml_quantize_chunk``: the K-quants, the IQ types, NVFP4), which is what llama.cpp's and
stable-diffusion.cpp's converters call.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

#: every GGUF type a model file can hold (Q8_1 and Q8_K are ggml's activation types, never stored)
PLAIN = ["F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"]
NUMPY_QUANTIZED = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4"]
GGML_QUANTIZED = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S",
                  "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M", "NVFP4"]
SHAPE = (6, 512)  # rows of 512: whole blocks of 32 and of 256 (the K-quants' super-blocks)


def values(shape=SHAPE, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.linspace(0.02, 2.0, shape[0])[:, None]).astype(np.float32)


def ggml_quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """Rows of ``x`` quantized by ggml's C code, as bytes (rows, bytes per row)."""
    import ggml

    t = getattr(ggml, f"GGML_TYPE_{type_name}")
    rows, n = x.shape
    row_bytes = ggml.ggml_row_size(t, n)
    out = np.zeros((rows, row_bytes), np.uint8)
    src = np.ascontiguousarray(x, np.float32)
    imatrix = None
    if ggml.ggml_quantize_requires_imatrix(t):
        imatrix = (ctypes.c_float * n)(*([1.0] * n))
    ggml.ggml_quantize_init(t)
    written = ggml.ggml_quantize_chunk(t, src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                       out.ctypes.data_as(ctypes.c_void_p), 0, rows, n, imatrix)
    assert written == out.nbytes, (type_name, written, out.nbytes)
    return out


def ggml_dequantize(raw: np.ndarray, type_name: str, n: int) -> np.ndarray:
    """float32 values of ggml blocks by ggml's own C ``to_float`` (an implementation apart from gguf-py's)."""
    import ggml

    t = getattr(ggml, f"GGML_TYPE_{type_name}")
    traits = ggml.ggml_get_type_traits(t).contents
    src = np.ascontiguousarray(raw)
    out = np.zeros(n, np.float32)
    traits.to_float(src.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
    return out


def write(path: Path, tensors: dict[str, tuple[str, np.ndarray, tuple[int, ...]]], arch: str = "sdrt-test") -> Path:
    """Write ``{name: (type name, data, numpy shape)}``; data are the values (plain types) or the blocks."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for name, (type_name, data, shape) in tensors.items():
        t = gguf.GGMLQuantizationType[type_name]
        data = np.ascontiguousarray(data)
        if type_name in PLAIN and type_name != "BF16":
            w.add_tensor(name, data)
        else:  # blocks as uint8 rows (the writer derives the element shape from the byte shape)
            if data.dtype == np.uint8:
                data = data.reshape(shape[:-1] + (-1,))
            w.add_tensor(name, data, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def encode(type_name: str, x: np.ndarray) -> np.ndarray:
    """``x`` stored as ``type_name``: values for the plain types, blocks for the others."""
    import gguf
    import ml_dtypes
    from gguf import quants

    if type_name in PLAIN:
        if type_name == "BF16":
            return x.astype(ml_dtypes.bfloat16).view(np.uint16)
        dt = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
              "I32": np.int32, "I64": np.int64}[type_name]
        return (np.rint(x * 50) if type_name.startswith("I") else x).astype(dt)
    if type_name in NUMPY_QUANTIZED:
        return quants.quantize(x, gguf.GGMLQuantizationType[type_name])
    return ggml_quantize(x, type_name)
