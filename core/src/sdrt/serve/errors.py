"""The one error a request can end in: an HTTP status, a one-line message, and the field at fault."""

from __future__ import annotations


class ApiError(Exception):
    """A request the server refuses (4xx) or cannot serve now (503). ``field`` names the request field."""

    def __init__(self, status: int, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


__all__ = ["ApiError"]
