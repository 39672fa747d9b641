"""What kind of file this is, from its first bytes: used to read PyTorch pickles as weights (``weights.torchfile``),
and to say what a wrong file is."""

from __future__ import annotations

PICKLE_HINT = "a PyTorch/pickle checkpoint (zip or pickle data)"
#: a Git LFS pointer: what a clone of a Hugging Face repository holds in place of each large file without git-lfs
LFS_HINT = "a Git LFS pointer (a placeholder of a few lines, not the file's data)"
#: what a download that fetched a web page (a login or error page) instead of the file holds
HTML_HINT = "an HTML page (a download that fetched a web page instead of the file)"
#: the fix for either: fetch the file itself
FETCH_FIX = "fetch the file itself: `git lfs pull` in the clone (git-lfs installed), or download it again"


def weights_kind(path: object) -> str | None:
    """What a weights file that is no ONNX graph is (``"a safetensors weights file"``, ``"a GGUF file"``, a PyTorch
    pickle), from its first bytes; None for anything else, or a path that cannot be read (its reader says why)."""
    import os

    try:
        if not os.path.isfile(path):  # type: ignore[arg-type]  # a FIFO's open waits for a writer forever
            return None
        with open(path, "rb") as f:  # type: ignore[call-overload]
            kind = sniff(f.read(64))
    except (OSError, ValueError, TypeError):
        return None
    return kind if kind in ("a safetensors weights file", "a GGUF file", PICKLE_HINT) else None


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
    if head[:6] == b"\x93NUMPY":  # a feed given where weights go (sdrt run --weights x.npy)
        return "a NumPy .npy array"
    if head.startswith(b"version https://git-lfs.github.com/spec/"):
        return LFS_HINT
    if head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        return HTML_HINT
    if head.lstrip()[:1] in (b"{", b"["):
        return "a JSON/text file"
    return image_kind(head)


#: the first bytes of the picture formats people pass by mistake for a model (``sdrt generate in.png "..."``)
_IMAGES = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
           (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))  # not BMP's "BM": an ONNX file may start so


def image_kind(head: bytes) -> str | None:
    """``"a PNG image"`` (JPEG, WebP, GIF, TIFF) for a picture's first bytes, else None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    return next((f"a {name} image" for magic, name in _IMAGES if head.startswith(magic)), None)
