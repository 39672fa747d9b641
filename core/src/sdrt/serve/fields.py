"""Typed reads of JSON request fields: a wrong type is a 422 and a value out of range a 400,
each naming the field. ``null`` means the field's default, and a number or boolean sent as a string
(``"20"``, ``"7.5"``, ``"true"``) is taken, as in A1111's pydantic models; a fraction where an integer
belongs (``4.5`` steps) is a 422, where pydantic would cut it to 4."""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import ApiError

_MISSING = object()
#: numbers sent as JSON strings ("20", "7.5"), which A1111's pydantic models take; "4.5" for an integer stays a 422
_INT = re.compile(r"^\s*[-+]?\d{1,30}\s*$")
_NUMBER = re.compile(r"^\s*[-+]?(\d{1,30}(\.\d*)?|\.\d+)([eE][-+]?\d{1,3})?\s*$")
_BOOLS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False, "1": True, "0": False}


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def get_int(body: dict[str, Any], key: str, default: Any, low: int | None = None, high: int | None = None,
            *, why: str = "", fixed: bool = False) -> Any:
    """``fixed``: ``low``-``high`` are the values the field has (``resize_mode``'s modes), not a bound this server
    sets."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and _INT.match(value):  # "20": A1111's pydantic takes a number in a string
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(422, f"{key} must be an integer, got {_kind(value)} ({str(value)[:40]!r})", field=key)
    if fixed and not low <= value <= high:
        raise ApiError(400, f"{key} must be {low} {'or' if high == low + 1 else 'to'} {high}, got {value}{why}",
                       field=key)
    if low is not None and value < low:
        raise ApiError(400, f"{key} must be at least {low}, got {value}", field=key)
    if high is not None and value > high:
        raise ApiError(400, f"{key} is {value}, above this server's limit of {high}{why}", field=key)
    return value


def get_float(body: dict[str, Any], key: str, default: Any, low: float | None = None, high: float | None = None,
              *, low_open: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, str) and _NUMBER.match(value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(422, f"{key} must be a number, got {_kind(value)} ({str(value)[:40]!r})", field=key)
    value = float(value)
    if not math.isfinite(value):
        raise ApiError(400, f"{key} must be a finite number", field=key)
    if low is not None and (value < low or (low_open and value == low)):
        raise ApiError(400, f"{key} must be {'above' if low_open else 'at least'} {low:g}, got {value:g}", field=key)
    if high is not None and value > high:
        raise ApiError(400, f"{key} must be at most {high:g}, got {value:g}", field=key)
    return value


def get_str(body: dict[str, Any], key: str, default: Any, *, max_len: int | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ApiError(422, f"{key} must be a string, got {_kind(value)}", field=key)
    if max_len is not None and len(value) > max_len:
        raise ApiError(400, f"{key} has {len(value)} characters, above this server's limit of {max_len}", field=key)
    return value


def get_bool(body: dict[str, Any], key: str, default: Any) -> Any:
    """JSON booleans, and 0/1 (Easy Diffusion sends ``"inpaint_full_res": 0``; pydantic takes it)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _BOOLS:  # pydantic's "true", "off", "1", ...
        return _BOOLS[value.strip().lower()]
    raise ApiError(422, f"{key} must be true or false, got {_kind(value)} ({str(value)[:40]!r})", field=key)


def get_dict(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(422, f"{key} must be an object, got {_kind(value)}", field=key)
    return value


def get_list(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ApiError(422, f"{key} must be a list, got {_kind(value)}", field=key)
    return value


def get_size(body: dict[str, Any], limits: Any) -> tuple[int | None, int | None]:
    """``size``: ``"WxH"`` within this server's limits, or (None, None) for ``auto`` or none."""
    size = get_str(body, "size", None, max_len=20)
    if size in (None, "", "auto"):
        return None, None
    m = re.match(r"^(\d+)x(\d+)$", size)
    if not m:
        raise ApiError(400, f"size must be WIDTHxHEIGHT (e.g. 512x512) or auto, got {size!r}", field="size")
    width, height = int(m.group(1)), int(m.group(2))
    if width > limits.max_width or height > limits.max_height:
        raise ApiError(400, f"size {size} is above this server's limit of {limits.max_width}x{limits.max_height}; "
                            "pass a smaller size", field="size")
    return width, height


def get_grid_size(body: dict[str, Any], limits: Any) -> tuple[int | None, int | None]:
    """``size`` (``get_size``) with sides on the grid of 8: one off it is a 400 naming ``size``, where A1111's
    routes round ``width`` and ``height`` down with a note (OpenAI's callers send sizes from a fixed list)."""
    width, height = get_size(body, limits)
    if width is not None:
        from ..errors import SdrtError
        from ..pipelines import validate

        try:
            validate("", width=width, height=height)
        except SdrtError as exc:
            if getattr(exc, "where", None) not in ("width", "height"):
                raise
            raise size_refused(exc, body.get("size"), limits) from None
    return width, height


def size_refused(exc: Exception, size: Any, limits: Any) -> ApiError:
    """The pipeline's refusal of the width or height of ``size`` (OpenAI's routes: a side off the grid of 8, too
    small), as a 400 naming ``size``."""
    from ..errors import _render

    return ApiError(400, f"size {size}: {_render(getattr(exc, 'what', str(exc)), None)}; pass a size whose sides are "
                         f"multiples of 8, from 8 to {limits.max_width}x{limits.max_height}", field="size")


def size_words(message: str) -> str:
    """A message in the words of a caller that sends ``size`` (OpenAI's routes), not width and height: the pipeline's
    "pass width=64 and height=64, or leave them unset" read "pass size=64 and size=64" once renamed."""
    message = re.sub(r"\bwidth=(\d+) and height=(\d+)", r"size=\1x\2", message)
    message = re.sub(r"\b(pass|sets no) width and height\b", r"\1 size", message)
    return message.replace("size=", "size ").replace("or leave them unset", "or leave size unset")


__all__ = ["get_bool", "get_dict", "get_float", "get_int", "get_list", "get_grid_size", "get_size", "get_str", "size_refused",
           "size_words"]
