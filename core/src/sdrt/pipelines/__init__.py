"""Stable Diffusion pipelines: a diffusers/Optimum ONNX model folder -> images, on any backend.

    from sdrt import pipelines
    pipe = pipelines.load("path/to/sd15-onnx")                 # backend="auto", device=None
    images = pipe("a red fox in snow", steps=20, cfg=7, sampler="DPM++ 2M Karras", seed=1)
    gen = pipe.generate("a red fox", init_image=img, strength=0.6, callback=show_preview)

Images are HxWx3 uint8 numpy arrays (Pillow images and image files are accepted too when Pillow is
installed). ``sdrt.pipelines.DEMO_MODEL`` is the tiny model folder that ships with sdrt.
See docs/pipelines.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .controlnet import ControlNet
    from .folder import ModelFolder
    from .images import RESIZE_MODES
    from .ipadapter import IPAdapter
    from .pipeline import Generation, Pipeline, load, validate
    from .plan import RunPlan
    from .settings import Settings

#: the embedded default model folder (Optimum layout) that ``sdrt generate`` uses without a folder
DEMO_MODEL = Path(__file__).resolve().parent.parent / "data" / "demo-sd"

_LAZY = {"load": "pipeline", "Pipeline": "pipeline", "Generation": "pipeline", "validate": "pipeline",
         "ModelFolder": "folder", "Settings": "settings", "RunPlan": "plan", "ControlNet": "controlnet",
         "RESIZE_MODES": "images", "IPAdapter": "ipadapter"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name.isidentifier() and not name.startswith("_"):  # a submodule: sdrt.pipelines.png.read_parameters(...)
        import importlib
        import importlib.util

        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'sdrt.pipelines' has no attribute {name!r}")


__all__ = ["DEMO_MODEL", "RESIZE_MODES", "ControlNet", "Generation", "IPAdapter", "ModelFolder", "Pipeline", "RunPlan", "Settings",
           "load", "validate"]
