"""Tiny IP-Adapter FaceID files in h94/IP-Adapter-FaceID's key layout, built with numpy from a seed.

A FaceID projection reads ArcFace's 512-wide embedding, so even a tiny adapter holds a 512-wide first layer (FaceID
Plus: 1024, diffusers' loader fixes its ratio at 2): rather than commit them, the tests and
``scripts/gen_faceid_refs.py`` build the same bytes here (checked by sha256 against the one the references were
made with). The UNet layers (places and widths) are those of ``tests/data/ipadapter``'s tiny adapters, for
tiny-sd15 and tiny-sdxl. Each file also holds h94's LoRA keys in ``ip_adapter.N`` (``to_q_lora.down`` ...), which
diffusers' loader and sdrt leave out.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

IPA = Path(__file__).resolve().parents[1] / "data" / "ipadapter"
FACE_DIM, DEPTH, HEADS = 512, 4, 1


def _layers(base: str) -> dict[int, int]:
    from sdrt.weights import Weights

    name = "ip-adapter_tiny.safetensors" if base == "sd15" else "ip-adapter_tiny_sdxl.safetensors"
    shapes = Weights.open(IPA / name).shapes()
    return {int(k.split(".")[1]): int(v[0]) for k, v in shapes.items() if k.endswith("to_k_ip.weight")}


def faceid_state(base: str, plus: bool, seed: int, clip_dim: int = 32) -> dict[str, np.ndarray]:
    """h94's ``ip-adapter-faceid[-plusv2]_{sd15,sdxl}.bin`` layout at tiny widths, float16."""
    rng = np.random.default_rng(seed)
    cross = 32 if base == "sd15" else 64
    inner = HEADS * 64

    def lin(o: int, i: int) -> np.ndarray:
        return rng.standard_normal((o, i)) / i ** 0.5

    def vec(n: int, s: float = 0.1) -> np.ndarray:
        return rng.standard_normal(n) * s

    def norm(name: str, n: int) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1 + vec(n), f"{name}.bias": vec(n)}

    mid = 2 * FACE_DIM if plus else FACE_DIM
    sd = {"image_proj.proj.0.weight": lin(mid, FACE_DIM) * 4, "image_proj.proj.0.bias": vec(mid),
          "image_proj.proj.2.weight": lin(4 * cross, mid), "image_proj.proj.2.bias": vec(4 * cross),
          **norm("image_proj.norm", cross)}
    if plus:
        p = "image_proj.perceiver_resampler"
        sd.update({f"{p}.proj_in.weight": lin(cross, clip_dim), f"{p}.proj_in.bias": vec(cross),
                   f"{p}.proj_out.weight": lin(cross, cross), f"{p}.proj_out.bias": vec(cross),
                   **norm(f"{p}.norm_out", cross)})
        for n in range(DEPTH):
            a, f = f"{p}.layers.{n}.0", f"{p}.layers.{n}.1"
            sd.update({**norm(f"{a}.norm1", cross), **norm(f"{a}.norm2", cross), f"{a}.to_q.weight": lin(inner, cross),
                       f"{a}.to_kv.weight": lin(2 * inner, cross), f"{a}.to_out.weight": lin(cross, inner) * 2,
                       **norm(f"{f}.0", cross), f"{f}.1.weight": lin(4 * cross, cross),
                       f"{f}.3.weight": lin(cross, 4 * cross)})
    for k, width in sorted(_layers(base).items()):
        for name in ("to_k_ip", "to_v_ip"):
            sd[f"ip_adapter.{k}.{name}.weight"] = rng.standard_normal((width, cross)) * 2 / cross ** 0.5
        sd[f"ip_adapter.{k}.to_q_lora.down.weight"] = rng.standard_normal((4, width)) * 0.1  # h94's LoRA, left out
        sd[f"ip_adapter.{k}.to_q_lora.up.weight"] = rng.standard_normal((width, 4)) * 0.1
    return {k: np.ascontiguousarray(v.astype(np.float16)) for k, v in sd.items()}


NAMES = {("sd15", False): ("ip-adapter-faceid_tiny_sd15.safetensors", 21),
         ("sd15", True): ("ip-adapter-faceid-plusv2_tiny_sd15.safetensors", 22),
         ("sdxl", False): ("ip-adapter-faceid_tiny_sdxl.safetensors", 23),
         ("sdxl", True): ("ip-adapter-faceid-plusv2_tiny_sdxl.safetensors", 24)}


def write(folder: Path, base: str, plus: bool) -> tuple[Path, str]:
    """The tiny adapter written into ``folder``, and its sha256."""
    from safetensors.numpy import save_file

    name, seed = NAMES[(base, plus)]
    path = Path(folder) / name
    save_file(faceid_state(base, plus, seed), str(path))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def face_picture(width: int = 320, height: int = 256) -> np.ndarray:
    """An RGB picture the stand-in detector (``scripts/make_face_standins.py``) sees two faces in: a bright textured
    blob (the best) and a dimmer one, on dark noise."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    img = 25 + rng.uniform(0, 20, (height, width, 3))
    for cx, cy, sigma, peak in ((130, 105, 26, 235), (250, 190, 16, 200)):
        blob = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * sigma ** 2))
        tex = np.stack([np.sin(x / 5 + y / 9), np.cos(y / 4 - x / 11), np.sin((x + y) / 7)], -1) * 25
        img = img + blob[..., None] * (peak - 25 + tex)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def no_face_picture() -> np.ndarray:
    rng = np.random.default_rng(8)
    return rng.integers(10, 60, (160, 200, 3)).astype(np.uint8)
