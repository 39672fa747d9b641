"""The core's compile cache (``sdrt.cache``): atomic checksummed entries, cheap verification, corrupt
entries discarded, two processes writing at once, the size cap with least-recently-used eviction, and the
weights identity that keys it (a 10 GB safetensors keyed without reading it)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import sdrt
from sdrt.cache import CompileCache, cache_root, make_key, max_bytes, parse_size
from sdrt.cache.identity import graph_identity, weights_identity
from sdrt.errors import SdrtError

KEY = "ab" * 32


def put(cache, key, data: bytes, name="payload.bin"):
    return cache.store(key, lambda folder: (folder / name).write_bytes(data), {"model": "m"})


def test_miss_then_hit_gives_the_stored_file(tmp_path):
    cache = CompileCache("demo", tmp_path)
    assert cache.lookup(KEY) is None
    entry = put(cache, KEY, b"compiled bytes")
    assert entry is not None and entry.size == len(b"compiled bytes") and entry.meta == {"model": "m"}
    hit = cache.lookup(KEY)
    assert hit is not None and hit.file("payload.bin").read_bytes() == b"compiled bytes"
    assert hit.path == tmp_path / "compiled" / "demo" / KEY
    assert not [p for p in hit.path.parent.iterdir() if p.name.startswith(".")], "no temporary folder stays"


def test_a_hit_reads_no_payload_byte_when_the_file_is_untouched(tmp_path, monkeypatch):
    cache = CompileCache("demo", tmp_path)
    put(cache, KEY, b"x" * 100_000)
    from sdrt.cache import paths

    monkeypatch.setattr(paths, "file_digest", lambda p: pytest.fail(f"{p} was hashed on a clean hit"))
    assert cache.lookup(KEY) is not None


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "manifest"])
def test_a_damaged_entry_is_discarded(tmp_path, caplog, damage):
    cache = CompileCache("demo", tmp_path)
    entry = put(cache, KEY, b"good program bytes")
    f = entry.file("payload.bin")
    if damage == "flip":  # same size, one byte changed: the stamp differs, so the file is hashed again
        f.write_bytes(b"good progrAm bytes")
    elif damage == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(4)
    elif damage == "remove":
        f.unlink()
    else:
        (entry.path / "sdrt-entry.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, "sdrt.cache"):
        assert cache.lookup(KEY) is None
    assert "unusable" in caplog.text and not entry.path.exists()
    assert put(cache, KEY, b"good program bytes") is not None and cache.lookup(KEY) is not None  # rebuilt


def test_a_copied_but_intact_file_is_hashed_once_then_trusted_again(tmp_path, monkeypatch):
    cache = CompileCache("demo", tmp_path)
    entry = put(cache, KEY, b"abc" * 1000)
    f = entry.file("payload.bin")
    f.write_bytes(f.read_bytes())  # rewritten with the same bytes: new mtime and ctime
    assert cache.lookup(KEY) is not None
    from sdrt.cache import paths

    monkeypatch.setattr(paths, "file_digest", lambda p: pytest.fail("hashed twice"))
    assert cache.lookup(KEY) is not None


def test_a_failing_writer_leaves_nothing_and_false_caches_nothing(tmp_path, caplog):
    cache = CompileCache("demo", tmp_path)

    def broken(folder):
        (folder / "half").write_bytes(b"half")
        raise RuntimeError("disk full")

    with caplog.at_level(logging.WARNING, "sdrt.cache"):
        assert cache.store(KEY, broken) is None
    assert "disk full" in caplog.text
    assert cache.store(KEY, lambda folder: False) is None
    assert list((tmp_path / "compiled" / "demo").iterdir()) == []


def test_an_unwritable_cache_folder_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, "sdrt.cache"):
        assert put(CompileCache("demo", blocker), KEY, b"p") is None
    assert "going on without the cache" in caplog.text and "pass cache_dir= a folder" in caplog.text


def test_sdrt_cache_dir_naming_a_file_is_said_once_naming_the_variable(tmp_path, caplog, monkeypatch):
    """Not an '[Errno 20] Not a directory' warning for every part a pipeline stores."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SDRT_CACHE_DIR", str(blocker))
    with caplog.at_level(logging.WARNING, "sdrt"):
        for key in ("ab" * 32, "cd" * 32, "ef" * 32):
            assert put(CompileCache("demo"), key, b"p") is None
        from sdrt.cost.model import load_calibration

        assert load_calibration() == {"entries": {}}  # no calibration under a file: none, not a second warning
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "is a file, not a folder (SDRT_CACHE_DIR)" in warnings[0]
    assert "point SDRT_CACHE_DIR at a folder you can write in, or unset it" in warnings[0] and "Errno" not in warnings[0]


def test_a_large_entry_stored_in_the_background_lands_whole_and_small_ones_at_once(tmp_path, monkeypatch):
    import threading

    from sdrt.cache import store, wait_for_stores

    cache = CompileCache("demo", tmp_path)
    monkeypatch.setattr(store, "BACKGROUND_BYTES", 1000)
    assert put(cache, KEY, b"s" * 2000).size == 2000  # no background asked: stored at once, whatever its size
    gate = threading.Event()
    real = store.paths.file_digest
    monkeypatch.setattr(store.paths, "file_digest", lambda p: gate.wait(10) and real(p))
    other = "cd" * 32
    assert cache.store(other, lambda f: (f / "big.bin").write_bytes(b"x" * 2000), {"model": "m"}, background=True) \
        is None  # the writer has returned; the entry is finished in a thread
    assert cache.lookup(other) is None, "a half-finished entry is never visible"
    gate.set()
    assert wait_for_stores(10)
    hit = cache.lookup(other)
    assert hit is not None and hit.file("big.bin").read_bytes() == b"x" * 2000 and hit.meta == {"model": "m"}
    small = "ef" * 32
    entry = cache.store(small, lambda f: (f / "s.bin").write_bytes(b"y" * 10), {}, background=True)
    assert entry is not None and entry.size == 10  # below BACKGROUND_BYTES: stored at once
    assert not [p for p in cache.dir.iterdir() if p.name.startswith(".")], "no temporary folder stays"


def test_store_keeps_the_first_entry_unless_asked_to_replace(tmp_path):
    cache = CompileCache("demo", tmp_path)
    put(cache, KEY, b"one")
    put(cache, KEY, b"two")
    assert cache.lookup(KEY).file("payload.bin").read_bytes() == b"one"
    cache.store(KEY, lambda d: (d / "payload.bin").write_bytes(b"two"), replace=True)
    assert cache.lookup(KEY).file("payload.bin").read_bytes() == b"two"


def test_two_processes_storing_one_key_at_once_leave_one_whole_entry(tmp_path):
    """Two writers race on one key with 8 MB payloads; both finish, one whole entry remains."""
    script = textwrap.dedent(f"""
        import sys, time
        from sdrt.cache import CompileCache
        cache = CompileCache("demo", {str(tmp_path)!r})
        start = float(sys.argv[1])
        def write(folder):
            while time.time() < start:
                time.sleep(0.001)
            for i in range(8):
                with open(folder / "payload.bin", "ab") as f:
                    f.write(bytes([int(sys.argv[2])]) * (1 << 20))
        entry = cache.store({KEY!r}, write)
        print(entry is not None and cache.lookup({KEY!r}) is not None)
    """)
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", script, str(start), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-800:] for r in results]
    assert [r[0].strip() for r in results] == ["True", "True"]
    folder = tmp_path / "compiled" / "demo"
    assert [p.name for p in folder.iterdir()] == [KEY]
    data = (folder / KEY / "payload.bin").read_bytes()
    assert len(data) == 8 << 20 and len(set(data)) == 1  # one writer's bytes, whole
    assert CompileCache("demo", tmp_path).lookup(KEY) is not None


def test_the_size_cap_evicts_the_least_recently_used_entries(tmp_path):
    cache = CompileCache("demo", tmp_path, max_bytes=3000)
    keys = [f"{i:02d}" * 32 for i in range(3)]
    for i, k in enumerate(keys):
        put(cache, k, bytes(1000))
        t = time.time() - 100 + i
        os.utime(cache.path(k) / "sdrt-entry.json", (t, t))
    assert cache.lookup(keys[0]) is not None  # used now: the most recent
    other = CompileCache("other", tmp_path, max_bytes=3000)  # one cap over every backend's entries
    put(other, "ff" * 32, bytes(1500))
    left = {e.key for e in cache.entries()}
    assert left == {keys[0], "ff" * 32}, "the two least recently used entries go, the new one stays"
    assert [e.key for e in cache.prune(max_bytes=0, keep={cache.path(keys[0])})] == ["ff" * 32]


def test_sweep_removes_old_leftovers_of_killed_writers_only(tmp_path):
    cache = CompileCache("demo", tmp_path)
    cache.dir.mkdir(parents=True)
    old, fresh, broken = cache.dir / ".aa.x1y2z3_4.tmp", cache.dir / ".bb.y1.tmp", cache.dir / ("cd" * 32)
    foreign = [cache.dir / "notes", cache.dir / ".x.tmp"]  # old, without a manifest, but not named as sdrt names
    for d in (old, fresh, broken, *foreign):
        d.mkdir()
    week_ago = time.time() - 7 * 24 * 3600
    for d in (old, broken, *foreign):
        os.utime(d, (week_ago, week_ago))
    cache.sweep()
    assert not old.exists() and fresh.exists() and not broken.exists() and all(d.exists() for d in foreign)


def test_clear_and_entries(tmp_path):
    a, b = CompileCache("a", tmp_path), CompileCache("b", tmp_path)
    put(a, KEY, b"1")
    put(b, KEY, b"22")
    (tmp_path / "openvino").mkdir()  # the cache folder of sdrt 0.1's OpenVINO plugin
    (tmp_path / "openvino" / f"{KEY}.ovblob").write_bytes(b"blob")
    assert {(e.backend, e.size) for e in a.entries()} == {("a", 1), ("b", 2)}
    assert len(a.clear("a").entries) == 1 and [e.backend for e in a.entries()] == ["b"]
    done = a.clear()
    assert len(done.entries) == 1 and len(done.legacy) == 1 and not done.foreign
    assert a.entries() == [] and not (tmp_path / "openvino").exists() and not a.compiled.exists()


def test_clear_removes_only_what_sdrt_wrote(tmp_path):
    """A cache root may be any folder (--cache-dir ~): clear removes sdrt's entries and the leftovers of its
    writers, never a file it did not write, wherever that file sits."""
    cache = CompileCache("openvino", tmp_path)
    put(cache, KEY, b"1")
    (cache.dir / ".abababababababab.k2j4_9zz.tmp").mkdir()  # a killed writer's temporary folder
    foreign = [tmp_path / "compiled" / "notes.txt", cache.dir / "README", cache.dir / "mine",
               tmp_path / "openvino" / "my-notes.txt", tmp_path / "coreml" / "model.mlpackage",
               tmp_path / "compiled" / "photos" / "a.jpg", tmp_path / "trt" / "old.engine"]
    for p in foreign:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.mkdir() if p.suffix in ("", ".mlpackage") else p.write_text("mine")  # photos: a folder like a backend's
    legacy = [tmp_path / "openvino" / f"{KEY}.ovblob", tmp_path / "trt" / f"{KEY}.engine",
              tmp_path / "migraphx" / f"{KEY}-{KEY}.mxr", tmp_path / "coreml" / KEY]
    for p in legacy:
        p.parent.mkdir(exist_ok=True)
        p.mkdir() if p.parent.name == "coreml" else p.write_bytes(b"old")
    (tmp_path / "my-file").write_text("mine")
    done = cache.clear()
    assert [e.key for e in done.entries] == [KEY] and len(done.leftovers) == 1 and sorted(done.legacy) == sorted(legacy)
    assert sorted(done.foreign) == sorted(foreign) and all(p.exists() for p in foreign)
    assert (tmp_path / "my-file").exists()
    assert not any(p.exists() for p in legacy) and not (tmp_path / "migraphx").exists()


@pytest.mark.parametrize("name", ["../../precious", "/tmp", "..", "a/b", "a\\b"])
def test_a_backend_name_that_is_a_path_is_refused(tmp_path, name):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "x").write_text("mine")
    cache = CompileCache("openvino", tmp_path / "root")
    put(cache, KEY, b"1")
    with pytest.raises(SdrtError, match="not a backend name"):
        cache.clear(name)
    with pytest.raises(SdrtError, match="not a backend name"):
        CompileCache(name, tmp_path / "root")
    assert (precious / "x").exists() and cache.lookup(KEY) is not None
    with pytest.raises(SdrtError, match="not a backend name"):
        CompileCache("", tmp_path / "root")


def test_cache_root_size_cap_and_keys(monkeypatch, tmp_path):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path and CompileCache("x").dir == tmp_path / "compiled" / "x"
    monkeypatch.setenv("SDRT_CACHE_MAX_SIZE", "1.5G")
    assert max_bytes() == int(1.5 * 2**30)
    assert parse_size("500M") == 500 << 20 and parse_size("20GiB") == 20 << 30 and parse_size("4096B") == 4096
    assert parse_size("2000000") == 2000000 and parse_size("0") == 0 and parse_size(4096) == 4096
    for bare in ("0.5", "20", "4096"):  # a bare number of bytes below 1 MiB is a forgotten unit, not a cap
        with pytest.raises(SdrtError, match=f"did you mean {bare}G"):
            parse_size(bare)
    monkeypatch.setenv("SDRT_CACHE_MAX_SIZE", "0.5")
    with pytest.raises(SdrtError, match="Where: SDRT_CACHE_MAX_SIZE"):
        max_bytes()
    with pytest.raises(SdrtError, match="not a size"):
        parse_size("lots")
    assert make_key(["ab", "c"]) != make_key(["a", "bc"]) and make_key([b"x"]) == make_key(["x"])


# -- the weights identity --------------------------------------------------------


def _matmul_graph(data=None):
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.zeros(16) if data is None else data)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    return sdrt.Graph.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


def test_identity_of_files_comes_from_where_the_tensors_are(tmp_path):
    from sdrt.weights import Weights

    graph = _matmul_graph()
    eye = np.eye(4, dtype=np.float32)
    Weights.from_arrays({"w": eye, "v": 2 * eye}).save(tmp_path / "a.safetensors")
    first = weights_identity(graph, Weights.open(tmp_path / "a.safetensors"))
    assert weights_identity(graph, Weights.open(tmp_path / "a.safetensors")) == first
    swapped = Weights.open(tmp_path / "a.safetensors", mapping={"v": "w", "w": "v"})
    assert weights_identity(graph, swapped) != first  # another tensor of the same file
    assert weights_identity(graph, Weights.open(tmp_path / "a.safetensors", dtype="float16")) != first
    assert weights_identity(graph, Weights.from_arrays({"w": eye})) != first  # in memory: keyed by content
    assert weights_identity(graph, Weights.from_arrays({"w": eye})) == weights_identity(
        graph, Weights.from_arrays({"w": eye.copy()}))
    os.utime(tmp_path / "a.safetensors", ns=(1, 1))  # same bytes, touched file: a new identity
    assert weights_identity(graph, Weights.open(tmp_path / "a.safetensors")) != first


def test_identity_of_the_graphs_own_data(tmp_path):
    a, b = _matmul_graph(), _matmul_graph(np.ones(16))
    assert graph_identity(a) == graph_identity(b)  # structure only
    assert weights_identity(a) != weights_identity(b)  # inline data: its bytes
    path = tmp_path / "mm.onnx"
    path.write_bytes(b.model.SerializeToString())
    b.strip(tmp_path / "s.onnx")
    stripped = sdrt.Graph.load(tmp_path / "s.onnx")
    ident = weights_identity(stripped)
    assert ident == weights_identity(sdrt.Graph.load(tmp_path / "s.onnx"))
    os.utime(tmp_path / "s.safetensors", ns=(1, 1))
    assert weights_identity(sdrt.Graph.load(tmp_path / "s.onnx")) != ident


def _io_counters() -> tuple[int, int] | None:
    """(bytes this process asked read() for, bytes of file pages mapped into it): Linux's counters, else None."""
    from sdrt.pipelines.budget import _status  # /proc/self/status, as the memory budget reads it

    try:
        with open("/proc/self/io") as f:
            rchar = next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration):
        return None
    rss_file = _status("RssFile")
    return None if rss_file is None else (rchar, rss_file)


def test_keying_a_10_gb_safetensors_reads_no_tensor(tmp_path):
    """A sparse 10 GB file (header, then a hole) with SD-XL-like tensor count: keyed from the header alone. Checked by
    what the process read (read() calls and mapped pages), not by a time limit: it took 30-50 ms on 2 cores, and a
    50 ms limit failed a CI run at 50.5 ms with other suites beside it."""
    from onnx import TensorProto, helper

    count, each = 1000, 10 * 2**30 // 1000 // 4 * 4
    names = [f"t{i}" for i in range(count)]
    header = {n: {"dtype": "F32", "shape": [each // 4], "data_offsets": [i * each, (i + 1) * each]}
              for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + count * each)
    assert path.stat().st_size > 10 * 10**9
    inits = []
    for n in names:  # declared only: the weights come from the file
        t = TensorProto(name=n, data_type=TensorProto.FLOAT)
        t.dims.append(each // 4)
        inits.append(t)
    nodes = [helper.make_node("Identity", [names[0]], ["y"])]
    g = helper.make_graph(nodes, "big", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [each // 4])],
                          inits)
    graph = sdrt.Graph(helper.make_model(g))
    from sdrt.weights import Weights

    weights = Weights.open(path)
    before = _io_counters()
    t0 = time.perf_counter()
    ident = make_key([graph_identity(graph), weights_identity(graph, weights)])
    took = time.perf_counter() - t0
    after = _io_counters()
    print(f"keyed a {path.stat().st_size / 1e9:.1f} GB safetensors ({count} tensors) in {took * 1e3:.1f} ms")
    assert len(ident) == 64
    if before is None or after is None:  # no counters on this OS: reading the 10 GB would take seconds
        assert took < 2.0
    else:  # the header (about 100 kB) at most: nothing of the 10 GB of tensors read or mapped in
        assert after[0] - before[0] < 4 << 20, after[0] - before[0]
        assert after[1] - before[1] < 16 << 20, after[1] - before[1]


def test_the_cache_command_lists_prunes_and_clears(tmp_path, capsys):
    from sdrt.cli import main

    cache = CompileCache("openvino", tmp_path)
    for i in range(3):
        put(cache, f"{i:02d}" * 32, bytes(1 << 20))
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("openvino ") == 3 and "3 entries, 3.0 MiB" in out and "model=m" in out
    (tmp_path / "trt").mkdir()
    (tmp_path / "trt" / f"{KEY}.engine").write_bytes(bytes(2048))
    (tmp_path / "trt" / "notes.txt").write_bytes(bytes(4096))  # not sdrt's: neither counted nor removed
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 0
    assert "also 2.0 KiB in the cache folders of sdrt 0.1 (trt)" in capsys.readouterr().out
    assert main(["cache", "prune", "--max-size", "2.5M", "--cache-dir", str(tmp_path)]) == 0
    assert "evicted 1 entries" in capsys.readouterr().out and len(cache.entries()) == 2
    assert main(["cache", "prune", "--max-size", "lots", "--cache-dir", str(tmp_path)]) == 1
    assert "not a size" in capsys.readouterr().err
    for bad in ("OpenVINO", "../..", str(tmp_path)):
        assert main(["cache", "clear", "--backend", bad, "--cache-dir", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert f"holds no backend {bad!r}" in err and "pass one it holds: openvino" in err
        assert len(err.strip().splitlines()) == 1 and len(cache.entries()) == 2
    assert main(["cache", "prune", "--max-size", "0.5", "--cache-dir", str(tmp_path)]) == 1  # not 0.5 bytes
    assert "did you mean 0.5G?" in capsys.readouterr().err and len(cache.entries()) == 2
    assert main(["cache", "list", "--max-size", "1G", "--cache-dir", str(tmp_path)]) == 1  # ignored before
    assert "--max-size applies to prune, not to list" in capsys.readouterr().err
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "removed 2 entries (2.0 MiB)" in out and "and 1 entry of sdrt 0.1's caches" in out
    assert f"left 1 file sdrt did not write: {tmp_path / 'trt' / 'notes.txt'}" in out and cache.entries() == []
    assert main(["cache", "clear", "--backend", "openvino", "--cache-dir", str(tmp_path)]) == 1
    assert "the compile cache is empty" in capsys.readouterr().err


# -- Backend.compile, the template ---------------------------------------------------


class _Counting:
    """A backend that caches: it 'compiles' by summing the weights, stores the sum, loads it back."""

    def __init__(self):
        from sdrt import Backend, Device, Session

        outer = self

        class S(Session):
            def __init__(self, graph, value):
                super().__init__(graph.inputs, graph.outputs, graph=graph)
                self.value = value

            def _run(self, feeds):
                return {}

        class B(Backend):
            name = "counting"
            caches = True

            def devices(self):
                return [Device("counting", "CPU")]

            def _cache_parts(self, graph, device, opts):
                return ["v1"]

            def _compile(self, graph, arrays, device, opts):
                outer.compiles += 1
                return S(graph, float(sum(a.sum() for a in arrays.values())))

            def _save(self, session, folder):
                (folder / "value.txt").write_text(repr(session.value))
                return True

            def _load(self, entry, graph, weights, device, opts):
                outer.loads += 1
                if outer.fail_load is not None:
                    raise outer.fail_load
                return S(graph, float(entry.file("value.txt").read_text()))

        self.backend, self.device, self.compiles, self.loads, self.fail_load = B(), Device("counting", "CPU"), 0, 0, None


def test_the_compile_template_keys_looks_up_compiles_stores_and_loads(tmp_path, monkeypatch):
    import sdrt.weights.resolve as resolve_mod
    from sdrt.errors import UnusableEntry

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    c = _Counting()
    graph = _matmul_graph(np.ones(16))
    assert c.backend.compile(graph, None, c.device).value == 16 and (c.compiles, c.loads) == (1, 0)
    real = resolve_mod.resolve_weights
    monkeypatch.setattr(resolve_mod, "resolve_weights", lambda *a: pytest.fail("resolved on a hit"))
    assert c.backend.compile(graph, None, c.device).value == 16 and (c.compiles, c.loads) == (1, 1)
    monkeypatch.setattr(resolve_mod, "resolve_weights", real)
    c.fail_load = RuntimeError("vendor: bad blob")  # the vendor cannot load it: discarded, compiled again
    assert c.backend.compile(graph, None, c.device).value == 16 and c.compiles == 2
    c.fail_load = UnusableEntry("built by another driver")
    assert c.backend.compile(graph, None, c.device).value == 16 and c.compiles == 3
    c.fail_load = SdrtError("no driver here", fix="install it")  # not the entry's fault: to the caller
    with pytest.raises(SdrtError, match="no driver here"):
        c.backend.compile(graph, None, c.device)
    c.fail_load = None
    assert c.backend.compile(graph, None, c.device, cache=False).value == 16 and c.compiles == 4
    c.backend.compile(graph, None, c.device, cache_dir=str(tmp_path / "other"))
    assert c.compiles == 5 and len(CompileCache("counting", tmp_path / "other").entries()) == 1
    with pytest.raises(SdrtError, match="cache must be True or False"):
        c.backend.compile(graph, None, c.device, cache="yes")
    with pytest.raises(SdrtError, match="takes no options"):
        c.backend.compile(graph, None, c.device, turbo=True)
    (entry,) = CompileCache("counting", tmp_path).entries()
    assert entry.meta == {"model": graph.label, "device": "CPU"}


def test_a_graph_is_listed_by_its_folder_and_file_unless_a_pipeline_names_it(tmp_path):
    """Optimum and diffusers name every part's file model.onnx: the cache listing and the logs show the folder too,
    or what a pipeline calls the part, and the graphs made from it (pinned, cut) keep that."""
    import onnx

    (tmp_path / "unet").mkdir()
    onnx.save(_matmul_graph().model, tmp_path / "unet" / "model.onnx")
    graph = sdrt.Graph.load(tmp_path / "unet" / "model.onnx")
    assert (graph.name, graph.label) == ("model.onnx", "unet/model.onnx")
    graph.label = "dreamshaper_8/unet"
    assert graph.with_shapes({"x": (1, 4)}).label == "dreamshaper_8/unet"
    assert graph.name == "model.onnx"  # errors still name the file
    assert _matmul_graph().label == "mm"  # built in memory: the graph's own name


def test_the_same_values_in_memory_have_one_identity_wherever_they_come_from():
    """The graph's own inline data and the same arrays given as weights key alike (switching back to a
    graph's own weights after an update finds the entry compiled first)."""
    from sdrt.weights import Weights

    graph = _matmul_graph(np.arange(16))
    own = weights_identity(graph)
    assert weights_identity(graph, Weights.from_arrays(graph.initializer_arrays())) == own
    assert weights_identity(graph, Weights.from_graph(graph)) == own
    assert weights_identity(graph, Weights.from_arrays({"w": np.zeros((4, 4), np.float32)})) != own


def test_the_cache_command_counts_and_clears_the_stores_kept_beside_the_compile_cache(tmp_path, capsys, monkeypatch):
    """Quantized graphs (as large as their weights) and pinned shapes are made by sdrt's own writers under the cache
    root: ``sdrt cache list`` counts them, ``clear --backend`` leaves them, ``clear`` removes them (and only them:
    the calibration and a file sdrt did not write stay)."""
    from onnx import TensorProto, helper

    from sdrt import quantization
    from sdrt.cli import main
    from sdrt.graph import Graph

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], np.ones((64, 64), np.float32))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])], [w])
    graph = Graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    quantization.cached(graph, "int8")
    graph.with_shapes(n=2)
    put(CompileCache("openvino", tmp_path), KEY, bytes(1024))
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "calibration.json").write_text("{}")
    (tmp_path / "pinned" / "notes.txt").write_text("mine")
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "also 1 quantized graph (" in out and "and 1 pinned-shape entry (" in out
    assert main(["cache", "clear", "--backend", "openvino", "--cache-dir", str(tmp_path)]) == 0
    assert "quantized" not in capsys.readouterr().out and list((tmp_path / "quantized").iterdir())
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "and 1 quantized graph (" in out and f"left 1 file sdrt did not write: {tmp_path / 'pinned' / 'notes.txt'}" in out
    assert not (tmp_path / "quantized").exists() and [p.name for p in (tmp_path / "pinned").iterdir()] == ["notes.txt"]
    assert (tmp_path / "calibration" / "calibration.json").read_text() == "{}"
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 0
    assert "also" not in capsys.readouterr().out


def test_clearing_a_cache_folder_that_does_not_exist_says_so(tmp_path, capsys):
    from sdrt.cli import main

    missing = tmp_path / "no-such-cache"
    assert main(["cache", "clear", "--cache-dir", str(missing)]) == 0
    assert f"removed 0 entries (0 B) from {missing / 'compiled'}; {missing} does not exist" in capsys.readouterr().out
    assert not missing.exists()


def test_an_entry_that_cannot_be_removed_is_not_called_foreign(tmp_path, capsys, monkeypatch):
    """(Run as root, a read-only folder cannot stop a removal: the refusal is made by hand.)"""
    from pathlib import Path

    from sdrt.cli import main

    (tmp_path / "pinned").mkdir()
    stuck = tmp_path / "pinned" / ("a" * 64 + ".fact")
    stuck.write_text("5")
    real = Path.unlink

    def refuse(self, *args, **kwargs):
        if self == stuck:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", refuse)
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"could not remove 1 of sdrt's entries (this user cannot delete them): {stuck}" in out
    assert "did not write" not in out and stuck.exists()
