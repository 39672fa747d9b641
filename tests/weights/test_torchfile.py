"""PyTorch checkpoints read without torch (``sdrt.weights.torchfile``), against what torch itself loads.

Data: tests/data/torch/, written by ``scripts/gen_torch_fixtures.py`` with torch: each file as ``torch.save``
wrote it and an ``.npz`` of the arrays ``torch.load(weights_only=False)`` gives, flattened as A1111 flattens a
checkpoint. The malicious pickles are written here, by hand, opcode by opcode.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import WeightsError
from sdrt.weights import Weights, torchfile

DATA = Path(__file__).resolve().parent.parent / "data" / "torch"
FILES = sorted(p for p in DATA.iterdir() if p.suffix in (".pt", ".ckpt", ".bin"))


def _expected(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with np.load(path.with_suffix(".npz")) as z:
        dtypes = json.loads(str(z["__dtypes__"]))
        return {k: z[k] for k in z.files if k != "__dtypes__"}, dtypes


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_tensors_equal_torch_load(path):
    want, dtypes = _expected(path)
    w = Weights.open(path)
    assert list(w) == list(want)
    for name, ref in want.items():
        got = w[name]
        assert got.dtype.name == {"bool": "bool"}.get(dtypes[name], dtypes[name]), name
        assert got.shape == ref.shape and got.flags.c_contiguous, name
        bits = got.view(ref.dtype) if got.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else got
        assert bits.tobytes() == np.ascontiguousarray(ref).tobytes(), name


def test_contiguous_tensors_are_mapped_from_the_file_not_copied():
    w = Weights.open(DATA / "views.pt")
    a = w["a"]
    assert not a.flags.writeable and not a.flags.owndata
    raw = (DATA / "views.pt").read_bytes()
    path, offset, length = w.ref("a").origin
    assert path == str(DATA / "views.pt") and raw[offset:offset + length] == a.tobytes()
    assert len(w.ref("rows").origin) == 3  # a[1:3] is contiguous: its own bytes in the shared storage
    t = w.ref("t").origin  # a transpose: the storage's bytes and how the view is made from them
    assert t[:3] == (str(DATA / "views.pt"), offset, length) and "as_strided" in t[3]


def test_deflated_storages_are_read():
    w = Weights.open(DATA / "deflated.pt")
    assert all("zip entry" in w.ref(n).origin[3] for n in w if w.ref(n).shape and 0 not in w.ref(n).shape)


def test_lightning_checkpoint_gives_its_state_dict():
    assert list(Weights.open(DATA / "lightning.ckpt")) == ["model.diffusion_model.w", "cond.b"]


def test_a_torch_file_under_another_name_is_read(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes((DATA / "params.pt").read_bytes())
    assert list(Weights.open(p)) == list(_expected(DATA / "params.pt")[0])


def test_a_folder_of_bin_files(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes((DATA / "views.pt").read_bytes())
    assert "t" in Weights.open(tmp_path)


# -- refused, and nothing runs -------------------------------------------------------------------------------
def _zip(tmp_path: Path, pkl: bytes, name: str = "model.ckpt", storages: dict[str, bytes] | None = None) -> Path:
    p = tmp_path / name
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for k, v in (storages or {}).items():
            z.writestr(f"archive/data/{k}", v)
        z.writestr("archive/version", "3\n")
    return p


def _system(marker: Path) -> bytes:
    """A pickle that, loaded by pickle.load, runs ``os.system("touch MARKER")``."""
    return b"cposix\nsystem\n(" + pickle.dumps(f"touch {marker}", protocol=0)[:-1] + b"tR."


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["zip", "legacy", "protocol4", "inside a state dict"])
def test_a_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path, kind):
    marker = tmp_path / "MARKER"
    if kind == "zip":
        p = _zip(tmp_path, _system(marker))
    elif kind == "legacy":
        p = tmp_path / "model.pt"
        p.write_bytes(b"".join(pickle.dumps(x, protocol=2) for x in (torchfile.LEGACY_MAGIC, 1001,
                                                                       {"little_endian": True})) + _system(marker))
    elif kind == "protocol4":  # STACK_GLOBAL: the name is on the stack, not in the opcode (find_class refuses it)
        p = _zip(tmp_path, pickle.dumps(_Evil(marker), protocol=4))
    else:
        p = _zip(tmp_path, pickle.dumps({"state_dict": {"w": 1}, "hook": _Evil(marker)}, protocol=2))
    assert b"system" in p.read_bytes() or kind == "protocol4"
    with pytest.raises(WeightsError) as e:
        Weights.open(p)
    assert "refusing to load" in e.value.what and ("posix.system" in e.value.what or "os.system" in e.value.what)
    assert "can run code" in e.value.what and "\n" not in str(e.value)
    assert not marker.exists()


@pytest.mark.parametrize(("module", "name"), [("builtins", "eval"), ("builtins", "getattr"), ("subprocess", "Popen"),
                                              ("torch", "load"), ("torch.storage", "_load_from_bytes"),
                                              ("numpy", "load"), ("collections", "defaultdict")])
def test_every_other_global_is_refused_by_name(tmp_path, module, name):
    p = _zip(tmp_path, f"c{module}\n{name}\n)R.".encode())
    with pytest.raises(WeightsError, match=rf"its pickle calls {module}\.{name}, which is not a tensor"):
        Weights.open(p)


def test_extension_opcodes_are_refused(tmp_path):
    p = _zip(tmp_path, b"\x80\x02\x82\x01.")  # EXT1 1: a global from copyreg's registry, past find_class
    with pytest.raises(WeightsError, match="copyreg extension"):
        Weights.open(p)


def _s(text: str) -> bytes:  # BINUNICODE
    return b"X" + struct.pack("<I", len(text.encode())) + text.encode()


def _i(v: int) -> bytes:  # BININT (signed)
    return b"J" + struct.pack("<i", v)


def _t(items: tuple) -> bytes:  # MARK ... TUPLE
    return b"(" + b"".join(_i(v) for v in items) + b"t"


def _tensor(key: str, numel: int, offset: int, shape: tuple, stride: tuple, storage: str = "FloatStorage") -> bytes:
    """The opcodes torch writes for one tensor (``_rebuild_tensor_v2`` on a persistent storage), view as given."""
    pid = b"(" + _s("storage") + f"ctorch\n{storage}\n".encode() + _s(key) + _s("cpu") + _i(numel) + b"tQ"
    hooks = b"ccollections\nOrderedDict\n)R"
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + _i(offset) + _t(shape) + _t(stride) + b"\x89"
            + hooks + b"tR")


def _tensor_pkl(key: str, numel: int, offset: int, shape: tuple, stride: tuple, after: bytes = b"") -> bytes:
    """``{"w": tensor}`` as torch pickles it (protocol 2); ``after`` runs on the tensor before it is stored."""
    return b"\x80\x02}" + _s("w") + _tensor(key, numel, offset, shape, stride) + after + b"s."


@pytest.mark.parametrize(("numel", "offset", "shape", "stride", "what"), [
    (6, 0, (2, 3), (3, 1), None),
    (6, 1, (2, 3), (3, 1), "reaches past its storage"),
    (6, 0, (3, 3), (3, 1), "reaches past its storage"),
    (6, 0, (2, 3), (4, 1), "reaches past its storage"),
    (6, -1, (2, 3), (3, 1), "storage offset -1"),
    (6, 0, (2, -3), (3, 1), "not a tuple of non-negative ints"),
    (6, 0, (2, 3), (3,), "differ in length"),
    (7, 0, (2, 3), (3, 1), "holds 24 bytes"),
    (6, 0, (0, 2**31 - 1, 2**31 - 1, 2**31 - 1), (1, 1, 1, 1), "larger than any array"),  # empty, yet numpy refuses
    (6, 0, (2**31 - 1,), (0,), "repeats its storage '0' \\(24 bytes\\) into 8589934588 bytes"),  # 8 GB from 24
    (6, 0, (1000, 6), (0, 1), None),  # expand() of a row: read
])
def test_views_are_checked_against_their_storage(tmp_path, numel, offset, shape, stride, what):
    p = _zip(tmp_path, _tensor_pkl("0", numel, offset, shape, stride),
             storages={"0": np.arange(6, dtype="<f4").tobytes()})
    if what is None:
        want = np.arange(6, dtype="<f4").reshape(2, 3) if stride[0] else np.broadcast_to(np.arange(6), shape)
        assert np.array_equal(Weights.open(p)["w"], want)
        return
    with pytest.raises(WeightsError, match=what):
        Weights.open(p)


def test_a_missing_storage_is_named(tmp_path):
    p = _zip(tmp_path, _tensor_pkl("7", 6, 0, (6,), (1,)), storages={"0": bytes(24)})
    with pytest.raises(WeightsError, match="storage '7' is not in the file"):
        Weights.open(p)


def test_a_cycle_and_deep_nesting(tmp_path):
    d: dict = {}
    d["self"] = d
    assert len(Weights.open(_zip(tmp_path, pickle.dumps(d, protocol=2), "cycle.pt"))) == 0
    deep: dict = {}
    for _ in range(200):
        deep = {"x": deep}
    with pytest.raises(WeightsError, match="nested deeper than 64"):
        Weights.open(_zip(tmp_path, pickle.dumps(deep, protocol=2), "deep.pt"))


def test_a_pickle_bomb_is_refused_before_it_is_inflated(tmp_path, monkeypatch):
    monkeypatch.setattr(torchfile, "MAX_PICKLE", 1000)
    p = tmp_path / "bomb.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02]" + b"N" * 5000 + b".")
    assert p.stat().st_size < 1000
    with pytest.raises(WeightsError, match="more than 1000"):
        Weights.open(p)


def test_a_byteorder_bomb_is_not_inflated(tmp_path):
    """The byteorder entry is read 16 bytes at most: 64 MB of spaces deflated to 64 KB are not inflated whole."""
    import tracemalloc

    p = tmp_path / "bomb.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({}, protocol=2))
        z.writestr("archive/byteorder", b"little" + b" " * (64 << 20))
    assert p.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        assert dict(Weights.open(p).items()) == {}
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_build_cannot_change_a_checked_tensor(tmp_path):
    """``BUILD`` on a rebuilt tensor (to widen it past its storage after the check) is refused."""
    widen = b"}" + _s("shape") + _t((1000,)) + b"sb"
    p = _zip(tmp_path, _tensor_pkl("0", 6, 0, (2, 3), (3, 1), after=widen), storages={"0": bytes(24)})
    with pytest.raises(WeightsError, match="the pickle tries to change a Tensor"):
        Weights.open(p)


def test_build_cannot_change_a_stand_in(tmp_path):
    """``BUILD`` on a stand-in class or function (to change it for later files) is refused."""
    for target in (b"ctorch._utils\n_rebuild_tensor_v2\n", b"ctorch\nFloatStorage\n",
                   b"cargparse\nNamespace\n", b"ctorch.nn.parameter\nParameter\n"):
        pkl = b"\x80\x02" + target + b"N}" + _s("dtype") + _s("float64") + b"s\x86b."  # BUILD (None, slots)
        with pytest.raises(WeightsError, match="not a readable PyTorch checkpoint"):
            Weights.open(_zip(tmp_path, pkl))
    assert Weights.open(DATA / "dtypes.pt")["f32"].dtype == np.float32


@pytest.mark.parametrize("cut", [10, 200, 600])
def test_truncated_files_say_so_in_one_line(tmp_path, cut):
    for src in (DATA / "views.pt", DATA / "legacy.pt"):
        p = tmp_path / src.name
        p.write_bytes(src.read_bytes()[:cut])
        with pytest.raises(WeightsError) as e:
            Weights.open(p)
        assert "\n" not in str(e.value) and src.name in str(e.value)


@pytest.mark.parametrize("content", [b"\x80\x04K\x01.", pickle.dumps({"a": np.zeros(2)}, protocol=2)[:8],
                                     b"PK\x03\x04" + bytes(60), b"not a checkpoint at all"])
def test_not_a_checkpoint(tmp_path, content):
    p = tmp_path / "model.pt"
    p.write_bytes(content)
    with pytest.raises(WeightsError, match="PyTorch checkpoint|refusing") as e:
        Weights.open(p)
    assert "\n" not in str(e.value)


def test_legacy_storage_sizes_are_checked(tmp_path):
    raw = bytearray((DATA / "legacy.pt").read_bytes())
    want = _expected(DATA / "legacy.pt")[0]
    i = raw.rindex(struct.pack("<q", 24))  # the element count before the float32 storage of 24 items
    raw[i:i + 8] = struct.pack("<q", 25)
    p = tmp_path / "legacy.pt"
    p.write_bytes(bytes(raw))
    with pytest.raises(WeightsError, match="holds 25 items"):
        Weights.open(p)
    assert len(want) == 5


@pytest.mark.parametrize("src", ["views.pt", "legacy.pt", "deflated.pt", "lightning.ckpt", "rinongal_emb.pt"])
def test_damaged_files_raise_only_weights_errors(tmp_path, src):
    """Bytes changed at random and files cut short (seeded): each opens and reads, or is one WeightsError;
    never another exception (zipfile's, zlib's, numpy's) and never a read outside the file."""
    import random

    rng = random.Random(src)
    raw = (DATA / src).read_bytes()
    p = tmp_path / src
    for _ in range(150):
        b = bytearray(raw)
        for _ in range(rng.choice([1, 2, 4, 8])):
            b[rng.randrange(len(b))] = rng.randrange(256)
        p.write_bytes(bytes(b[: rng.randrange(len(b))] if rng.random() < 0.2 else b))
        try:
            w = Weights.open(p)
            for name in w:
                np.asarray(w[name]).tobytes()
        except WeightsError as exc:
            assert "\n" not in str(exc)


@pytest.mark.parametrize("via", ["stack", "memo"])
def test_deeply_nested_tuples_are_refused_before_they_crash_the_process(tmp_path, via):
    """A dict key nested a million tuples deep (a 1-3 MB pickle): hashing it recursed in C until the process
    died with a segmentation fault. Refused from the opcodes; run in a child so a regression fails, not kills."""
    import subprocess
    import sys

    step = b"\x85" if via == "stack" else b"\x85q\x000h\x00"  # TUPLE1, or TUPLE1 BINPUT 0 POP BINGET 0
    p = _zip(tmp_path, b"\x80\x02}N" + step * 1_000_000 + b"Ns.")
    code = ("import sys; from sdrt.weights import Weights\n"
            "try:\n    Weights.open(sys.argv[1])\nexcept Exception as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert "tuples nested deeper than 100 levels" in out.stdout
