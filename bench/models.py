"""The benchmark models now live in ``sdrt.testing.models``, where ``sdrt selftest`` builds them too."""

from sdrt.testing.models import MODELS, SIZES, build

__all__ = ["MODELS", "SIZES", "build"]
