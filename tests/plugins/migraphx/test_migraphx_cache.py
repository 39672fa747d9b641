"""The .mxr program cache: keys, atomic checksummed entries, and recovery from bad entries."""

from __future__ import annotations

import hashlib
import logging
import os

import numpy as np
import pytest
from mx_helpers import conv_model, mlp_model

import sdrt
from sdrt import Device
from sdrt_migraphx.backend import MIGraphXBackend
from sdrt_migraphx.cache import ProgramCache, default_dir, make_key
from sdrt_migraphx.identity import graph_digest, weights_digest
from sdrt_migraphx.options import parse_options

KEY = "ab" * 32


def write_bytes(data: bytes):
    def save(program, path):
        path.write_bytes(data)
    return save


class Calls:
    """Counts compiles and loads of stand-in programs (plain strings: the cache never looks inside)."""

    def __init__(self):
        self.compiled = 0
        self.loaded: list = []

    def compile(self):
        self.compiled += 1
        return f"program-{self.compiled}"

    def load(self, path):
        self.loaded.append(path)
        return f"loaded:{path.read_bytes().decode()}"


def test_miss_then_hit(tmp_path):
    store, calls = ProgramCache(tmp_path), Calls()
    prog, hit = store.get_or_compile(KEY, calls.load, calls.compile, write_bytes(b"mxr-bytes"))
    assert (prog, hit, calls.compiled) == ("program-1", False, 1)
    (entry,) = tmp_path.iterdir()
    assert entry.name == f"{KEY}-{hashlib.sha256(b'mxr-bytes').hexdigest()}.mxr"
    prog, hit = store.get_or_compile(KEY, calls.load, calls.compile, write_bytes(b"other"))
    assert (prog, hit, calls.compiled) == ("loaded:mxr-bytes", True, 1)


def test_a_corrupted_entry_is_removed_and_compiled_again(tmp_path, caplog):
    store, calls = ProgramCache(tmp_path), Calls()
    store.get_or_compile(KEY, calls.load, calls.compile, write_bytes(b"good program"))
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(b"good progrAm")  # one flipped byte
    with caplog.at_level(logging.WARNING, "sdrt.migraphx.cache"):
        prog, hit = store.get_or_compile(KEY, calls.load, calls.compile, write_bytes(b"good program"))
    assert (prog, hit, calls.loaded) == ("program-2", False, [])
    assert "checksum mismatch" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # rewritten with the right bytes
    assert entry.read_bytes() == b"good program"


def test_a_truncated_entry_is_never_loaded(tmp_path):
    store, calls = ProgramCache(tmp_path), Calls()
    store.get_or_compile(KEY, calls.load, calls.compile, write_bytes(b"x" * 1000))
    (entry,) = tmp_path.iterdir()
    with open(entry, "r+b") as f:
        f.truncate(10)
    assert store.lookup(KEY) is None and not entry.exists()


def test_an_entry_migraphx_cannot_load_is_replaced(tmp_path, caplog):
    store, calls = ProgramCache(tmp_path), Calls()
    store.get_or_compile(KEY, calls.load, calls.compile, write_bytes(b"v1"))

    def refuse(path):
        raise RuntimeError("/src/file_buffer.cpp:40: read_buffer: wrong version\nmore")

    with caplog.at_level(logging.WARNING, "sdrt.migraphx.cache"):
        prog, hit = store.get_or_compile(KEY, refuse, calls.compile, write_bytes(b"v2"))
    assert (prog, hit) == ("program-2", False)
    assert "could not load it" in caplog.text
    assert [p.read_bytes() for p in tmp_path.iterdir()] == [b"v2"]


def test_a_failing_save_leaves_no_entry_and_no_temporary_file(tmp_path, caplog):
    store, calls = ProgramCache(tmp_path), Calls()

    def broken(program, path):
        path.write_bytes(b"half")
        raise RuntimeError("disk full")

    with caplog.at_level(logging.WARNING, "sdrt.migraphx.cache"):
        prog, hit = store.get_or_compile(KEY, calls.load, calls.compile, broken)
    assert (prog, hit) == ("program-1", False)
    assert list(tmp_path.iterdir()) == [] and "disk full" in caplog.text


def test_an_unwritable_cache_folder_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store, calls = ProgramCache(blocker / "cache"), Calls()
    with caplog.at_level(logging.WARNING, "sdrt.migraphx.cache"):
        assert store.get_or_compile(KEY, calls.load, calls.compile, write_bytes(b"p")) == ("program-1", False)
    assert "going on without it" in caplog.text


def test_a_new_program_for_a_key_replaces_the_old_one(tmp_path):
    store = ProgramCache(tmp_path)
    first = store.store(KEY, lambda p: p.write_bytes(b"one"))
    second = store.store(KEY, lambda p: p.write_bytes(b"two"))
    assert first != second and not first.exists() and store.lookup(KEY) == second
    assert store.lookup("cd" * 32) is None


def test_default_dir_follows_sdrt_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    assert default_dir() == tmp_path / "migraphx"
    monkeypatch.delenv("SDRT_CACHE_DIR")
    assert default_dir().parts[-2:] == ("sdrt", "migraphx")


def test_make_key_separates_parts():
    assert make_key(["ab", "c"]) != make_key(["a", "bc"])
    assert make_key([b"x"]) == make_key(["x"])


GPU = Device(backend="migraphx", id="gpu:0", kind="gpu", properties={"target": "gpu", "gfx_target": "gfx1100"})
REF = Device(backend="migraphx", id="ref", kind="cpu", properties={"target": "ref"})


def key(device=GPU, version="2.15.0", graph="g", weights="w", **options):
    return MIGraphXBackend.cache_key(graph, weights, device, version,
                                     parse_options(options, gpu=device.kind == "gpu"))


def test_cache_key_changes_with_each_part():
    base = key()
    other_gfx = Device(backend="migraphx", id="gpu:0", kind="gpu",
                       properties={"target": "gpu", "gfx_target": "gfx942"})
    variants = [key(device=other_gfx), key(device=REF), key(version="2.16.0"), key(graph="g2"), key(weights="w2"),
                key(precision="fp32"), key(exhaustive_tune=True), key(fast_math=False)]
    assert len({base, *variants}) == len(variants) + 1
    assert key(cache_dir="/elsewhere") == base and key(cache=False) == base  # where, not what


def test_graph_digest_ignores_weight_values_but_not_structure():
    a = sdrt.Graph.load(conv_model(seed=0).SerializeToString())
    b = sdrt.Graph.load(conv_model(seed=1).SerializeToString())
    c = sdrt.Graph.load(conv_model(seed=0, batch=2).SerializeToString())
    assert graph_digest(a) == graph_digest(b) != graph_digest(c)


def test_weights_digest_of_arrays_in_memory_hashes_every_byte():
    arrays = sdrt.Graph.load(mlp_model().SerializeToString()).initializer_arrays()
    changed = dict(arrays, **{"fc1.weight": arrays["fc1.weight"].copy()})
    changed["fc1.weight"][31, 100] += 1e-3
    assert weights_digest(arrays) == weights_digest(dict(arrays)) != weights_digest(changed)
    renamed = {("x" if k == "shape" else k): v for k, v in arrays.items()}
    assert weights_digest(renamed) != weights_digest(arrays)


def test_weights_digest_of_mapped_files_uses_the_file_identity(tmp_path):
    data = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    path = tmp_path / "w.bin"
    data.tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r")
    first = weights_digest({"w": np.asarray(mapped).reshape(64, 64)})
    assert weights_digest({"w": np.asarray(np.memmap(path, dtype=np.float32, mode="r")).reshape(64, 64)}) == first
    assert weights_digest({"w": data.reshape(64, 64)}) != first  # in memory: keyed by bytes, not by file
    os.utime(path, ns=(1, 1))  # same bytes, touched file: a new identity
    assert weights_digest({"w": np.asarray(np.memmap(path, dtype=np.float32, mode="r")).reshape(64, 64)}) != first
    half = np.memmap(path, dtype=np.float32, mode="r")
    assert weights_digest({"w": half[:2048]}) != weights_digest({"w": half[2048:]})


@pytest.mark.parametrize("bad", [{"precision": "int3"}, {"exhaustive_tune": "yes"}, {"cache": 1},
                                 {"cache_dir": 5}, {"workspace": 1}])
def test_bad_options_are_refused_with_what_to_do(bad):
    from sdrt_migraphx.errors import OptionError

    with pytest.raises(OptionError) as info:
        parse_options(bad, gpu=True)
    assert "What to do:" in str(info.value) and "sdrt.load(..., backend='migraphx')" in str(info.value)


def test_precision_defaults_to_fp16_on_gpus_and_fp32_on_ref():
    assert parse_options({}, gpu=True).precision == "fp16"
    assert parse_options({}, gpu=False).precision == "fp32"
    assert parse_options({"precision": "float16"}, gpu=False).precision == "fp16"
    assert parse_options({"exhaustive_tune": True}, gpu=True).exhaustive_tune is True
