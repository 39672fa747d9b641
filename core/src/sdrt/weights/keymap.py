"""Key-mapping rules: how checkpoint keys become a graph's initializer names.

Rules run in this order for every key:

1. ``explicit``: an exact ``{checkpoint key: initializer name}`` map; a hit ends the rules;
2. ``strip_prefix``: the first prefix (of a list) that the key starts with is removed;
3. ``renames``: regex ``(pattern, replacement)`` pairs applied in order with ``re.sub``;
4. ``add_prefix``: prepended to the result.

``drop`` (regexes) removes keys entirely, before the rules. A ``KeyMap`` can
also be built from a plain dict (explicit map) or any callable
``key -> name | None`` (``None`` drops the key).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import WeightsError


@dataclass(frozen=True)
class KeyMap:
    explicit: Mapping[str, str] = field(default_factory=dict)
    strip_prefix: str | tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    add_prefix: str = ""
    drop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "_renames", [(re.compile(p), r) for p, r in self.renames])
            object.__setattr__(self, "_drop", [re.compile(p) for p in self.drop])
        except (re.error, TypeError, ValueError) as exc:
            raise WeightsError(f"bad key-mapping regex: {exc}", where="KeyMap",
                               fix="give renames as (pattern, replacement) pairs of valid Python regexes") from exc

    def __call__(self, key: str) -> str | None:
        if any(p.search(key) for p in self._drop):  # type: ignore[attr-defined]
            return None
        if key in self.explicit:
            return self.explicit[key]
        prefixes = (self.strip_prefix,) if isinstance(self.strip_prefix, str) else self.strip_prefix
        for p in prefixes:
            if p and key.startswith(p):
                key = key[len(p):]
                break
        for pattern, repl in self._renames:  # type: ignore[attr-defined]
            try:
                key = pattern.sub(repl, key)
            except (re.error, IndexError) as exc:
                raise WeightsError(f"bad regex replacement {repl!r}: {exc}", where="KeyMap.renames",
                                   fix="check the group references in the replacement") from exc
        return self.add_prefix + key


MappingLike = KeyMap | Mapping[str, str] | Callable[[str], "str | None"] | None


def as_keymap(mapping: MappingLike) -> Callable[[str], str | None]:
    if mapping is None:
        return lambda k: k
    if isinstance(mapping, Mapping):
        explicit = dict(mapping)
        return lambda k: explicit.get(k, k)
    if callable(mapping):
        return mapping
    raise WeightsError(f"mapping must be a KeyMap, a dict or a callable, got {type(mapping).__name__}",
                       where="Weights.open(mapping=...)", fix="pass sdrt.keymap.KeyMap(...) or a dict")


def apply(keys: Iterable[str], mapping: MappingLike, where: str) -> dict[str, str]:
    """``{target name: source key}`` for every key the mapping keeps; collisions are an error."""
    fn = as_keymap(mapping)
    out: dict[str, str] = {}
    clashes: list[str] = []
    for k in keys:
        t = fn(k)
        if t is None:
            continue
        if not isinstance(t, str):
            raise WeightsError(f"key mapping returned {t!r} for {k!r}, expected a string or None", where=where,
                               fix="make the mapping return names")
        if t in out:
            clashes.append(f"{out[t]!r} and {k!r} -> {t!r}")
        out[t] = k
    if clashes:
        raise WeightsError(f"key mapping sends several keys to one name: {'; '.join(clashes)}", where=where,
                           fix="make the mapping rules one-to-one (or drop the duplicates with drop=...)")
    return out


__all__ = ["KeyMap", "MappingLike", "apply", "as_keymap"]
