"""A tiny InstantID IP-Adapter in InstantX/InstantID's key layout, built with numpy from a seed.

InstantID's ``ip-adapter.bin`` holds ``image_proj`` (a Resampler: ``latents`` [1, 16, 1280], ``proj_in`` [1280,
512] reading the 512-wide ArcFace embedding, 4 blocks of perceiver attention and feed-forward, ``proj_out`` [2048,
1280], ``norm_out``) and ``ip_adapter`` (``N.to_k_ip`` / ``N.to_v_ip`` per cross-attention layer). Here the same
layout at tiny widths (64 wide, one head, 16 queries) for tiny-sdxl's layers (those of ``tests/data/ipadapter``'s
tiny SDXL adapter); the tests and ``scripts/gen_instantid_refs.py`` build the same bytes (sha256 checked), and the
antelopev2 folder is the buffalo_l stand-ins under antelopev2's file names (InstantID reads its raw embedding).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FACES = HERE.parent / "data" / "faces"
FACE_DIM, DEPTH, HIDDEN, QUERIES, CROSS = 512, 4, 64, 16, 64
NAME, SEED = "ip-adapter_instant_id_tiny_sdxl.safetensors", 61


def _layers() -> dict[int, int]:
    from sdrt.weights import Weights

    shapes = Weights.open(HERE.parent / "data" / "ipadapter" / "ip-adapter_tiny_sdxl.safetensors").shapes()
    return {int(k.split(".")[1]): int(v[0]) for k, v in shapes.items() if k.endswith("to_k_ip.weight")}


def instantid_state(seed: int = SEED) -> dict[str, np.ndarray]:
    """InstantX's ``ip-adapter.bin`` layout (flattened: ``image_proj.*``, ``ip_adapter.*``) at tiny widths, float16."""
    rng = np.random.default_rng(seed)

    def lin(o: int, i: int, gain: float = 1.0) -> np.ndarray:
        return rng.standard_normal((o, i)) / i ** 0.5 * gain

    def vec(n: int, s: float = 0.1) -> np.ndarray:
        return rng.standard_normal(n) * s

    def norm(name: str, n: int) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1 + vec(n), f"{name}.bias": vec(n)}

    p = "image_proj"
    sd = {f"{p}.latents": rng.standard_normal((1, QUERIES, HIDDEN)) / HIDDEN ** 0.5,
          f"{p}.proj_in.weight": lin(HIDDEN, FACE_DIM, 3.0), f"{p}.proj_in.bias": vec(HIDDEN),
          f"{p}.proj_out.weight": lin(CROSS, HIDDEN), f"{p}.proj_out.bias": vec(CROSS), **norm(f"{p}.norm_out", CROSS)}
    for n in range(DEPTH):
        a, f = f"{p}.layers.{n}.0", f"{p}.layers.{n}.1"
        sd.update({**norm(f"{a}.norm1", HIDDEN), **norm(f"{a}.norm2", HIDDEN), f"{a}.to_q.weight": lin(64, HIDDEN),
                   f"{a}.to_kv.weight": lin(128, HIDDEN), f"{a}.to_out.weight": lin(HIDDEN, 64) * 2,
                   **norm(f"{f}.0", HIDDEN), f"{f}.1.weight": lin(4 * HIDDEN, HIDDEN),
                   f"{f}.3.weight": lin(HIDDEN, 4 * HIDDEN)})
    for k, width in sorted(_layers().items()):
        for name in ("to_k_ip", "to_v_ip"):
            sd[f"ip_adapter.{k}.{name}.weight"] = rng.standard_normal((width, CROSS)) * 2 / CROSS ** 0.5
    return {k: np.ascontiguousarray(v.astype(np.float16)) for k, v in sd.items()}


def write(folder: Path) -> tuple[Path, str]:
    """The tiny adapter written into ``folder``, and its sha256."""
    from safetensors.numpy import save_file

    path = Path(folder) / NAME
    save_file(instantid_state(), str(path))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def antelopev2(folder: Path) -> Path:
    """``folder/antelopev2`` holding the buffalo_l stand-ins as ``scrfd_10g_bnkps.onnx`` and ``glintr100.onnx``."""
    out = Path(folder) / "antelopev2"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FACES / "buffalo_l" / "det_10g.onnx", out / "scrfd_10g_bnkps.onnx")
    shutil.copyfile(FACES / "buffalo_l" / "w600k_r50.onnx", out / "glintr100.onnx")
    return out
