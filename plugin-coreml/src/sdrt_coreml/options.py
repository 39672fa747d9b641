"""Compile options of the Core ML backend: precision, deployment target, shapes, cache.

``precision`` defaults to ``"fp16"``: Core ML's GPU and Neural Engine compute in
float16 (the Neural Engine in nothing else), so an fp32 program would run on the
CPU or the GPU only. ``precision="fp32"`` asks for float32 compute.

``target`` is the oldest OS the package must load on. It picks the MIL opset:
macOS15/iOS18 get the fused ``scaled_dot_product_attention``; older targets run
attention as matmul, softmax and matmul.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdrt.errors import OptionError, check_known_options
from sdrt.precision import precision_name

#: deployment target -> MIL opset (iOS15 = 15 ...): ct.target has the same names
TARGETS: dict[str, int] = {"macOS13": 16, "macOS14": 17, "macOS15": 18, "iOS16": 16, "iOS17": 17, "iOS18": 18}
#: the precisions of sdrt's vocabulary (``sdrt.precision.PRECISIONS``) Core ML packages compute in
PRECISIONS = ("fp16", "fp32")
KNOWN = ("precision", "target", "shapes")
#: the target of packages built on a machine that is not a Mac (or on a Mac older than macOS 13)
DEFAULT_TARGET = "macOS14"


def host_target() -> str:
    """The newest target this Mac loads (macOS 15 or later: macOS15), else ``DEFAULT_TARGET``."""
    if platform.system() != "Darwin":
        return DEFAULT_TARGET
    try:
        major = int(platform.mac_ver()[0].split(".")[0])
    except ValueError:
        return DEFAULT_TARGET
    return "macOS15" if major >= 15 else "macOS14" if major == 14 else "macOS13" if major == 13 else DEFAULT_TARGET


@dataclass(frozen=True)
class Options:
    precision: str = "fp16"
    target: str = DEFAULT_TARGET
    shapes: Mapping[str, Any] | None = None

    @property
    def opset(self) -> int:
        return TARGETS[self.target]

    @property
    def sdpa(self) -> bool:
        return self.opset >= 18

    def key(self) -> str:
        """What of these options changes the package (for the cache key)."""
        return f"precision={self.precision};target={self.target}"


def parse_options(options: Mapping[str, Any], where: str = "sdrt.load(..., backend='coreml')") -> Options:
    """Check the options of ``compile``/``build`` for this backend and return ``Options``."""
    check_known_options("coreml", options, KNOWN, where=where)
    precision = precision_name(options.get("precision", "fp16"), PRECISIONS,
                               where=f"{where} precision= (default fp16: runs on every compute unit)")
    target = options.get("target") or host_target()
    match = {t.lower(): t for t in TARGETS}.get(str(target).lower())
    if match is None:
        raise OptionError(f"target {target!r} is not a Core ML deployment target this backend builds for",
                          where=where, fix=f"pass one of {', '.join(TARGETS)}")
    shapes = options.get("shapes")
    if shapes is not None and not isinstance(shapes, Mapping):
        raise OptionError(f"shapes must map input or dim names to sizes, got {type(shapes).__name__}", where=where,
                          fix="pass shapes={'sample': (2, 4, 64, 64)} or shapes={'batch': 2}")
    return Options(precision, match, shapes)
