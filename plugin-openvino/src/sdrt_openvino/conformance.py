"""What the conformance kit (``sdrt.testing``) should expect of OpenVINO on CPU.

Each entry maps a regex over test names to the reason, so that a failure is
either fixed in the plugin or explained here by OpenVINO's own limits.
"""

from __future__ import annotations

from typing import Any

XFAIL: dict[str, str] = {}

EXCLUDE: dict[str, str] = {}

TOLERANCES: dict[str, tuple[float, float]] = {}

CONFORMANCE: dict[str, Any] = {"xfail": XFAIL, "exclude": EXCLUDE, "tolerances": TOLERANCES}
