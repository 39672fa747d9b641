"""ggml-python's CUDA build declares a function its bundled ggml lacks; the import must survive that.

ggml-python 0.0.45 built with ``GGML_CUDA=ON`` fails at ``import ggml`` with an AttributeError for
``ggml_backend_cuda_allreduce_tensor`` (seen on an H100, see docs/ggml.md). ``import_tolerant`` retries
with each named symbol bound to a function that raises when called. Checked here with real ctypes on the
C library and a module that declares symbols the library does not export.
"""

from __future__ import annotations

import ctypes
import sys
import textwrap

import pytest

from sdrt_ggml.ops._common import import_tolerant

BINDINGS = textwrap.dedent('''
    import ctypes
    lib = ctypes.CDLL(None)
    HAS_ABSENT = hasattr(lib, "sdrt_test_absent_feature")  # a feature check must still see the truth
    strlen = getattr(lib, "strlen")
    strlen.restype = ctypes.c_size_t
    gone = getattr(lib, "sdrt_test_no_such_symbol_a")
    gone.argtypes = [ctypes.c_int]
    also_gone = getattr(lib, "sdrt_test_no_such_symbol_b")
''')


@pytest.fixture
def bindings(tmp_path, monkeypatch):
    (tmp_path / "sdrt_partial_bindings.py").write_text(BINDINGS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "sdrt_partial_bindings"
    sys.modules.pop("sdrt_partial_bindings", None)


def test_a_plain_import_fails(bindings):
    with pytest.raises(AttributeError):
        __import__(bindings)


def test_missing_symbols_raise_only_when_called(bindings, caplog):
    original = ctypes.CDLL.__getitem__
    module = import_tolerant(bindings)
    assert ctypes.CDLL.__getitem__ is original  # the patch is undone
    assert module.strlen(b"abcd") == 4
    assert module.HAS_ABSENT is False
    with pytest.raises(RuntimeError, match="sdrt_test_no_such_symbol_b is declared by the bindings"):
        module.also_gone()
    assert "sdrt_test_no_such_symbol_a, sdrt_test_no_such_symbol_b" in caplog.text


def test_other_attribute_errors_propagate(tmp_path, monkeypatch):
    (tmp_path / "sdrt_broken_bindings.py").write_text("import ctypes\nx = ctypes.CDLL(None).strlen.no_such_attr\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AttributeError):
        import_tolerant("sdrt_broken_bindings")
