"""Builds sdrt-ggml's native kernels (plugin-ggml/native/*.c) as a plain shared library.

It is a setuptools ``Extension`` only so that pip builds it with the platform's C compiler
(no cmake, no extra build dependency); Python never imports it as a module: ``sdrt_ggml.native``
loads it with ctypes and registers its functions with ggml as custom ops. The extension is
``optional``: without a working C compiler pip still installs sdrt-ggml (with one warning
line from setuptools), and the backend runs ggml's own kernels, logging why.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(HERE)).replace("\\", "/") for p in (HERE / "native").glob("*.c"))
#: every header: a change to one rebuilds the library (the kernel bodies live in simd_body.h)
HEADERS = sorted(str(p.relative_to(HERE)).replace("\\", "/") for p in (HERE / "native").glob("*.h"))


class BuildNative(build_ext):
    """Per-compiler flags; no Python module init symbol (the library is loaded with ctypes)."""

    def build_extensions(self) -> None:
        msvc = self.compiler.compiler_type == "msvc"
        for ext in self.extensions:
            # per-function target attributes and runtime dispatch pick the ISA: no -march here
            ext.extra_compile_args = ["/O2", "/std:c11"] if msvc else ["-O3", "-std=c11", "-fvisibility=hidden", "-pthread"]
            # the ops' thread pool (native/pool.c): POSIX threads, in libc itself only from glibc 2.34
            ext.extra_link_args = [] if msvc else ["-pthread"]
        super().build_extensions()

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return list(ext.export_symbols or [])  # not PyInit_<name>: this is no Python module


setup(
    ext_modules=[Extension("sdrt_ggml._native", sources=SOURCES, include_dirs=["native"], depends=HEADERS,
                           optional=True)],
    cmdclass={"build_ext": BuildNative},
)
