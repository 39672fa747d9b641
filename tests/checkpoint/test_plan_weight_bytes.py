"""What the memory plan counts for weights a file stores narrower or packed, against what the backend is given.

tiny-flux-dev's transformer in four storages (bitsandbytes NF4 as bitsandbytes wrote it, ComfyUI's scaled fp8,
plain fp8 e4m3fn, GGUF Q8_0 by gguf's quantizer), loaded as a pipeline with a budget. For each, on each backend:

- the plan's weight bytes of the transformer are the bytes of the arrays the backend is handed
  (``resolve_weights`` with ``Backend.weight_blocks``): the dequantized float32 arrays, never the packed size,
  except the GGUF blocks ggml runs as stored (their stored bytes);
- the predicted weight footprint (``weight_bytes x footprint``) is those bytes plus the file's mapped pages of
  the part's tensors at their stored size (NF4, fp8: the packed codes; ggml's kept blocks: nothing more, they are
  the mapped pages), and twice the float32 bytes for a GGUF file read dequantized (the plan does not count its
  mapped blocks narrower).
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import test_bnb4_flux as bnb
import test_flow_single_files as flow
from flow_file_helpers import bfl_transformer

from sdrt import pipelines
from sdrt.pipelines.lowmem import FOOTPRINT
from sdrt.runtime import select
from sdrt.weights import stfile
from sdrt.weights.resolve import resolve_weights

F8 = ml_dtypes.float8_e4m3fn
PREFIX = "model.diffusion_model."


def _fp8_file(tmp: Path, scaled: bool) -> tuple[Path, dict]:
    """The all-in-one file with the transformer's 2-D weights in fp8 (ComfyUI's scaled fp8: with a per-tensor
    ``scale_weight``, the ``scale_input`` and the ``scaled_fp8`` marker), the rest float32."""
    path, f = bnb._all_in_one(tmp)
    tensors = {k: v for k, v in bnb._raw(path).items() if not k.startswith(PREFIX)}
    for k, v in bfl_transformer(flow._params(flow.PIPES / "tiny-flux-dev", "transformer")).items():
        v = np.asarray(v, np.float32)
        if v.ndim == 2 and k.endswith(".weight"):
            s = np.float32(max(float(np.abs(v).max()), 1e-8) / 448.0) if scaled else np.float32(1)
            tensors[PREFIX + k] = (v / s).astype(F8)
            if scaled:
                stem = PREFIX + k[: -len("weight")]
                tensors[stem + "scale_weight"], tensors[stem + "scale_input"] = np.array(s), np.ones((), np.float32)
        else:
            tensors[PREFIX + k] = v
    if scaled:
        tensors[PREFIX + "scaled_fp8"] = np.zeros(0, F8)
    out = tmp / f"flux1-dev-{'fp8-scaled' if scaled else 'fp8'}.safetensors"
    stfile.write(out, tensors)
    return out, f


def _gguf_file(tmp: Path) -> tuple[Path, dict]:
    pytest.importorskip("gguf", reason="the optional gguf package is not installed (pip install gguf)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gguf"))
    import test_gguf_flux as g

    f = flow._files("flux-dev", tmp)
    path = tmp / "flux1-dev-Q8_0.gguf"
    g._write(path, bfl_transformer(flow._params(flow.PIPES / "tiny-flux-dev", "transformer")), "Q8_0")
    return path, f


def _stored(weights, names) -> int:
    """Bytes the file stores for these bound tensors (``TensorRef.origin``'s length; a GGUF tensor's blocks)."""
    seen: dict = {}
    for n in names:
        ref = weights.ref(n) if n in weights else None
        if ref is None:
            continue
        if ref.blocks is not None:
            seen[n] = ref.blocks().nbytes
        elif ref.origin is not None:  # a fused file tensor bound as several weights is mapped once
            seen[(ref.origin[0], ref.origin[1])] = int(ref.origin[2])
    return sum(seen.values())


@pytest.mark.parametrize("storage", ["nf4", "fp8-scaled", "fp8", "gguf-q8_0"])
@pytest.mark.parametrize("backend", ["reference", "ggml"])
def test_plan_counts_the_bytes_the_backend_is_given(storage, backend, tmp_path):
    if backend != "reference":
        pytest.importorskip(f"sdrt_{backend}")
    if storage == "nf4":
        path, f = bnb._all_in_one(tmp_path)
        extra = {}
    elif storage == "gguf-q8_0":
        path, f = _gguf_file(tmp_path)
        extra = {"text_encoders": f["text_encoders"], "vae": f["vae"]}
    else:
        path, f = _fp8_file(tmp_path, scaled=storage == "fp8-scaled")
        extra = {}
    kw = {} if backend == "reference" else {"precision": "fp32"}
    with pipelines.load(path, backend=backend, graph_paths=f["graphs"], tokenizers=f["tokenizers"],
                        family="flux-dev", memory="64GB", **extra, **kw) as pipe:
        plan = pipe.memory_plan()
        be, _ = select(backend, None)
        part = pipe.parts["transformer"]
        given = resolve_weights(part.graph, part.weights, blocks=be.weight_blocks())
        floats = {n: a for n, a in given.items() if isinstance(a, np.ndarray)}
        blocks = {n: a for n, a in given.items() if not isinstance(a, np.ndarray)}
        stored = _stored(part.weights, floats)
        float32 = sum(a.size * 4 for a in given.values())
    p = plan.placement("transformer")
    bound = sum(a.nbytes for a in floats.values()) + sum(b.nbytes for b in blocks.values())
    assert {a.dtype for a in floats.values()} == {np.dtype(np.float32)}
    assert p.weight_bytes == bound, (storage, backend, p.weight_bytes, bound)
    predicted = p.weight_bytes * plan.footprints.get("transformer", plan.footprint)
    if storage == "gguf-q8_0" and backend != "ggml":  # read dequantized: float32, its mapped blocks not counted
        assert not blocks and stored < 0.3 * bound
        assert predicted == pytest.approx(FOOTPRINT * bound, rel=1e-9)
        return
    if storage == "gguf-q8_0":  # ggml runs the matmul weights from the file's blocks: counted as stored
        assert blocks and p.weight_bytes < 0.3 * float32
    else:
        assert stored < 0.6 * bound  # the file is narrower than what is bound
        mapped_floats = [n for n in floats if part.weights is not None and n in part.weights
                         and part.weights.ref(n).origin is not None]
        unmapped = sum(floats[n].nbytes for n in floats if n not in mapped_floats)  # the graph's own (none here)
        assert predicted == pytest.approx(bound + stored + unmapped, rel=1e-9), (predicted, bound, stored)


@pytest.mark.parametrize("stored", ["F16", "F8_E4M3"])
def test_full_size_sdxl_refiner_file_counts_each_file_tensor_once(stored, tmp_path):
    """The full-size SDXL refiner single file (headers only, sparse), in fp16 or with its matrices and convs in fp8:
    every part's predicted weight footprint is its float32 bound bytes plus its tensors' bytes in the file, each
    file tensor once: CLIP-G's fused ``in_proj_weight`` binds as three weights (each slice counting the whole
    tensor's pages over-predicted the fp16 file's CLIP-G by 300 MiB)."""
    from single_file_helpers import sparse
    from test_refiner_file import refiner_shapes

    from sdrt.pipelines.budget import _lean_graph
    from sdrt.pipelines.streaming import _nbytes

    shapes = {k: (v, stored if len(v) >= 2 and "embedding" not in k else "F16") for k, v in refiner_shapes().items()}
    f = sparse(tmp_path / "sd_xl_refiner_1.0.safetensors", shapes)
    with pipelines.load(f, backend="reference", memory="64GB") as pipe:
        plan = pipe.memory_plan()
        for name, part in pipe.parts.items():
            info = _lean_graph(part).initializer_info()
            bound = sum(_nbytes(i) for i in info.values())
            mapped = _stored(part.weights, info)
            w = part.weights
            own = sum(_nbytes(i) for n, i in info.items()  # the graph's own constants: no file pages of theirs
                      if w is None or n not in w or w.ref(n).origin is None)
            p = plan.placement(name)
            assert p.weight_bytes == bound, name
            assert mapped < 0.6 * bound, name
            predicted = p.weight_bytes * plan.footprints.get(name, plan.footprint)
            assert predicted == pytest.approx(bound + mapped + own, rel=1e-9), (name, predicted, bound, mapped)
