"""The MIGraphX backend's errors: everything MIGraphX raises reaches users as one of these."""

from __future__ import annotations

from sdrt.errors import SdrtError


class MIGraphXError(SdrtError):
    """MIGraphX failed while parsing, compiling, loading or running a program."""


def first_lines(exc: BaseException, limit: int = 3) -> str:
    """The informative lines of a MIGraphX exception, on one line.

    MIGraphX prefixes its messages with the C++ source location
    (``/src/onnx/onnx_parser.cpp:512: parse_graph: Unknown operator: Foo``);
    that prefix says nothing to a user, so it is cut.
    """
    lines = []
    for line in str(exc).splitlines():
        line = line.strip()
        if not line:
            continue
        head, sep, rest = line.partition(": ")
        if sep and head.startswith("/") and ".cpp:" in head:
            line = rest
        lines.append(line)
    text = " ".join(lines[:limit]) or type(exc).__name__
    return text[:600]
