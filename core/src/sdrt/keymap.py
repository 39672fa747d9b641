"""``sdrt.keymap``, kept as a public path: the code lives in ``sdrt.weights.keymap``."""

from .weights.keymap import *  # noqa: F403
from .weights.keymap import __all__ as __all__
