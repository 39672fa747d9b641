"""What kind of file this is, from its first bytes: used to read PyTorch pickles as weights (``weights.torchfile``),
and to say what a wrong file is."""

from __future__ import annotations

PICKLE_HINT = "a PyTorch/pickle checkpoint (zip or pickle data)"


def sniff(head: bytes) -> str | None:
    """Name the kind of a file that is clearly not ONNX, from its first bytes."""
    # safetensors first: a header of 640, 896, 1152 or 1408 bytes starts with b"\x80\x02".."\x80\x05",
    # which is also how a pickle starts; a pickle never has a small length then "{" there
    if len(head) >= 9 and head[8:9] == b"{":
        n = int.from_bytes(head[:8], "little")
        if 0 < n < 100_000_000:
            return "a safetensors weights file"
    if head[:4] == b"PK\x03\x04":
        return PICKLE_HINT
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return PICKLE_HINT
    if head[:4] == b"GGUF":
        return "a GGUF file"
    if head.lstrip()[:1] in (b"{", b"["):
        return "a JSON/text file"
    return None
