"""Export a diffusers pipeline folder to ONNX with Optimum, as users make their folders.

    PYTHONPATH=OPTIMUM_SITE /work/refvenv/bin/python scripts/export_optimum.py TORCH_FOLDER OUT [--fp16]

the same as ``optimum-cli export onnx --model TORCH_FOLDER --task text-to-image OUT`` (optimum-onnx 0.1.0 needs
transformers < 4.58 and huggingface_hub < 1: install them with ``pip install --target`` beside the reference venv
and put that folder first on PYTHONPATH, with diffusers 0.36 there too).
"""

from __future__ import annotations

import sys

sys.modules["torchvision"] = None  # type: ignore[assignment]

from optimum.exporters.onnx import main_export  # noqa: E402

if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    main_export(src, output=out, task="text-to-image", device="cpu")
