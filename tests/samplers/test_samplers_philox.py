"""CUDA Philox noise (A1111's RNG: GPU) and A1111's NV source, against published vectors and recorded GPU values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import SamplerError
from sdrt.samplers import (
    CudaGenerator,
    NvGenerator,
    cuda_thread_capacity,
    philox4x32_10,
    randn_cuda,
    randn_nv,
)

DATA = Path(__file__).parent / "data" / "cuda_randn_recorded.json"

# Random123's published known-answer vectors for Philox4x32-10 (its tests/kat_vectors):
# counter words, key words, output words.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox4x32_10_matches_random123_known_answers(counter, key, expected):
    out = philox4x32_10(np.array(counter, np.uint32).reshape(4, 1), np.array(key, np.uint32))
    assert [int(v) for v in out[:, 0]] == list(expected)


def test_philox_columns_are_independent_of_each_other():
    counters = np.array([c for c, _, _ in KAT], np.uint32).T
    keys = np.array([k for _, k, _ in KAT], np.uint32).T
    out = philox4x32_10(counters, keys)
    assert out.T.tolist() == [list(e) for _, _, e in KAT]


def _recorded():
    return json.loads(DATA.read_text())["cases"]


def test_gpu_randn_matches_recorded_cuda_values_over_successive_draws():
    checked = 0
    for case in _recorded():
        gen = CudaGenerator(case["seed"])
        for draw in case["draws"]:
            ours = gen.randn(tuple(draw["shape"])).reshape(-1).astype(np.float64)
            if "index" in draw:
                ours = ours[draw["index"]]
            ref = np.array(draw["values"])
            tol = 0.5 * 10.0 ** -draw["decimals"] + 1e-6  # printed rounding + a few float32 ulps
            assert np.abs(ours - ref).max() <= tol, case["source"]
            checked += ref.size
    assert checked == 80 + 10 + 80 + 12 + 24 + 36


def _rand_sums():
    return json.loads(DATA.read_text())["rand_sums"]


def test_gpu_rand_reproduces_three_gpus_prints_of_one_large_draw():
    """Triton's vector-add tutorial printed on three GPUs: the same head, three tails; one thread count gives each."""
    d = _rand_sums()
    for p in d["prints"]:
        g = CudaGenerator(d["seed"], cuda_threads=p["cuda_threads"])
        total = g.rand(d["size"]).astype(np.float64) + g.rand(d["size"])
        assert np.abs(total[:3] - d["head"]).max() <= 0.5e-4 + 1e-6, p["source"]
        assert np.abs(total[-3:] - p["tail"]).max() <= 0.5e-4 + 1e-6, p["source"]


def test_the_tails_tell_gpus_apart():
    # other common thread counts reproduce none of the GPU-specific tails, so the match above is no accident
    d = _rand_sums()
    special = [p["tail"] for p in d["prints"] if p["cuda_threads"] is not None]
    for sms, per_sm in [(40, 1024), (46, 1536), (38, 1536), (58, 1536), (46, 1024), (28, 2048), (34, 1536)]:
        g = CudaGenerator(d["seed"], cuda_threads=cuda_thread_capacity(sms, per_sm))
        tail = (g.rand(d["size"]).astype(np.float64) + g.rand(d["size"]))[-3:]
        assert not any(np.abs(tail - t).max() <= 1e-4 for t in special), (sms, per_sm)


def test_rand_is_in_the_half_open_unit_interval():
    x = CudaGenerator(3).rand((4, 64, 64))
    assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() < 1.0
    assert abs(float(x.mean()) - 0.5) < 0.01


def test_nv_first_draw_matches_recorded_cuda_values():
    case = _recorded()[0]
    draw = case["draws"][0]
    ours = randn_nv(case["seed"], tuple(draw["shape"])).reshape(-1)
    assert np.abs(ours - np.array(draw["values"])).max() <= 0.5e-4 + 1e-6


def test_gpu_and_nv_agree_to_float32_rounding_within_the_gpu_thread_count():
    a = randn_cuda(1234, (4, 64, 64))
    b = randn_nv(1234, (4, 64, 64))
    assert a.dtype == b.dtype == np.float32
    assert np.abs(a - b).max() < 2e-5  # float32 uniforms on the GPU path, doubles in NV
    assert np.mean(a == b) > 0.3


def _torch_kernel_by_the_book(seed: int, n: int, threads: int, offset: int = 0) -> np.ndarray:
    """A per-thread loop written from torch's distribution_nullary_kernel description (slow, independent shape)."""
    from sdrt.samplers.philox import _box_muller_cuda

    blocks = min(-(-n // 256), threads // 256)
    stride = blocks * 256
    out = np.full(n, np.nan, np.float32)
    rounded = ((n - 1) // (stride * 4) + 1) * stride * 4
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint32)
    for t in range(stride):
        ctr = offset // 4
        li = t
        while li < rounded:
            c = np.array([[ctr & 0xFFFFFFFF], [ctr >> 32], [t], [0]], np.uint32)
            x, y, z, w = philox4x32_10(c, key)[:, 0]
            s1, c1 = _box_muller_cuda(np.array([x]), np.array([y]))
            s2, c2 = _box_muller_cuda(np.array([z]), np.array([w]))
            for ii, v in enumerate((s1[0], c1[0], s2[0], c2[0])):
                j = li + stride * ii
                if j < n:
                    out[j] = v
            ctr += 1
            li += stride * 4
    return out


@pytest.mark.parametrize("n,threads", [(700, 256), (2048, 256), (3000, 512), (1025, 1024)])
def test_large_tensors_use_cosines_and_later_rounds_as_torch_lays_them_out(n, threads):
    gen = CudaGenerator(77, cuda_threads=threads)
    ours = gen.randn(n)
    ref = _torch_kernel_by_the_book(77, n, threads)
    assert not np.isnan(ref).any()
    assert np.array_equal(ours, ref)
    # the offset moves on by 4 per round, so the next draw starts after every block used
    rounds = (n - 1) // (min(-(-n // 256), threads // 256) * 256 * 4) + 1
    assert gen.offset == 4 * rounds
    assert np.array_equal(gen.randn(300), _torch_kernel_by_the_book(77, 300, threads, offset=4 * rounds))


def test_a_tensor_within_the_thread_count_does_not_depend_on_the_gpu():
    assert np.array_equal(randn_cuda(5, (4, 32, 32)), randn_cuda(5, (4, 32, 32), cuda_threads=4096))
    # larger than the GPU: different noise (the cosine halves appear)
    assert not np.array_equal(randn_cuda(5, (4, 32, 32)), randn_cuda(5, (4, 32, 32), cuda_threads=1024))


def test_thread_capacity_of_real_gpus():
    assert cuda_thread_capacity(128, 1536) == 196608   # RTX 4090
    assert cuda_thread_capacity(28, 1536) == 43008     # RTX 3060: an SDXL latent (65536) needs the cosines
    with pytest.raises(SamplerError):
        cuda_thread_capacity(0, 1536)


def test_seed_keeps_all_64_bits_unlike_the_cpu_generator():
    assert not np.array_equal(randn_cuda(5, 64), randn_cuda(5 + 2**32, 64))
    assert np.array_equal(randn_cuda(-1, 64), randn_cuda(2**64 - 1, 64))
    with pytest.raises(SamplerError):
        randn_cuda(2**64, 4)


def test_nv_moves_one_block_per_draw():
    g = NvGenerator(9)
    g.randn(4)
    second = g.randn(4)
    from sdrt.samplers.philox import _blocks

    b = _blocks(9, 1, np.arange(4, dtype=np.uint64))
    inv = 2.3283064e-10
    u = b[0] * float(np.float32(inv)) + float(np.float32(inv)) / 2
    v = b[1] * float(np.float32(inv * 6.2831855)) + float(np.float32(inv * 6.2831855)) / 2
    assert np.array_equal(second, (np.sqrt(-2 * np.log(u)) * np.sin(v)).astype(np.float32))


def test_statistics_of_a_flux_size_draw():
    x = randn_cuda(31337, (16, 128, 128))
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01
    assert math.isfinite(float(np.abs(x).max()))


@pytest.mark.parametrize("bad", [(2, -1), (2.5,), "x"])
def test_bad_shapes_raise(bad):
    with pytest.raises(SamplerError):
        randn_cuda(0, bad)
