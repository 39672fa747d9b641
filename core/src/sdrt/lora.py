"""``sdrt.lora``, kept as a public path: the code lives in ``sdrt.weights.lora``."""

from .weights.lora import *  # noqa: F403
from .weights.lora import __all__ as __all__
