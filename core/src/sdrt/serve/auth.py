"""HTTP basic (A1111's ``--api-auth user:pass``) and bearer tokens (what OpenAI clients send)."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Sequence

from ..errors import InputError


def parse_api_auth(text: str) -> tuple[tuple[str, str], ...]:
    """``"user:pass"`` or ``"u1:p1,u2:p2"`` (A1111's format) -> pairs; refuses an entry without a colon."""
    pairs = []
    for item in text.split(","):
        item = item.strip()
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise InputError("--api-auth takes user:password (several separated by commas)",
                             where="--api-auth", fix="e.g. --api-auth alice:s3cret")
        pairs.append((user, password))
    return tuple(pairs)


def allowed(header: str | None, users: Sequence[tuple[str, str]], tokens: Sequence[str]) -> bool:
    """Whether an ``Authorization`` header carries one of the users or tokens (constant-time compares)."""
    if not users and not tokens:
        return True
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    scheme = scheme.lower()
    value = value.strip()
    if scheme == "bearer":
        return any(hmac.compare_digest(value.encode(), t.encode()) for t in tokens)
    if scheme == "basic":
        try:  # a header with bytes outside ASCII is refused (b64decode raises ValueError on them), not a 500
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return False
        user, _, password = decoded.partition(":")
        ok = False
        for u, p in users:  # check every pair, so the time does not tell which user exists
            ok |= hmac.compare_digest(user.encode(), u.encode()) & hmac.compare_digest(password.encode(), p.encode())
        return ok
    return False


__all__ = ["allowed", "parse_api_auth"]
