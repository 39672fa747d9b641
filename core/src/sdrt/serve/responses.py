"""A finished job -> the fields A1111 and OpenAI clients read: base64 PNGs carrying A1111's
``parameters`` chunk, A1111's ``info`` (a JSON string, as ``Processed.js()`` makes it) and ``parameters``."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import time
from typing import Any

import numpy as np

from ..pipelines.png import encode_png, format_parameters
from .jobs import Result, Work


def infotexts(result: Result) -> list[str]:
    return [format_parameters(result.prompt, result.negative, s) for s in result.settings]


def png_b64(images: list[np.ndarray], texts: list[str]) -> list[str]:
    return [base64.b64encode(encode_png(img, text)).decode("ascii") for img, text in zip(images, texts)]


def info(work: Work, result: Result, texts: list[str], not_honoured: list[str], job_id: str,
         ignored: list[str] | None = None) -> dict[str, Any]:
    """A1111's ``info`` fields (modules/processing.py ``Processed.js``), plus sdrt's own."""
    first = result.settings[0] if result.settings else {}
    kw = work.kwargs
    size = str(first.get("Size", f"{kw.get('width')}x{kw.get('height')}")).split("x")
    n = len(result.images)
    return {
        "prompt": result.prompt, "all_prompts": [result.prompt] * n,
        "negative_prompt": result.negative, "all_negative_prompts": [result.negative] * n,
        "seed": result.seeds[0] if result.seeds else work.seed, "all_seeds": result.seeds,
        "subseed": first.get("Variation seed", -1 if work.subseed is None else work.subseed),
        "all_subseeds": [s.get("Variation seed", -1 if work.subseed is None else work.subseed + j)
                         for j, s in enumerate(result.settings)],
        "subseed_strength": kw.get("subseed_strength", 0),
        "width": int(size[0]) if size[0].isdecimal() else kw.get("width"),
        "height": int(size[1]) if len(size) > 1 and size[1].isdecimal() else kw.get("height"),
        "sampler_name": first.get("Sampler", kw.get("sampler")), "scheduler": first.get("Schedule type"),
        "cfg_scale": first.get("CFG scale", kw.get("cfg")), "steps": kw.get("steps"), "batch_size": work.batch,
        "restore_faces": False, "face_restoration_model": None,
        "sd_model_name": work.model.model_name, "sd_model_hash": first.get("Model hash", work.model.hash),
        "sd_vae_name": first.get("VAE"), "sd_vae_hash": first.get("VAE hash"), "seed_resize_from_w": -1, "seed_resize_from_h": -1,
        "denoising_strength": kw.get("strength"), "extra_generation_params": {},
        "index_of_first_image": 0, "infotexts": texts, "styles": [],
        "job_timestamp": time.strftime("%Y%m%d%H%M%S"), "clip_skip": kw.get("clip_skip", 1),
        "is_using_inpainting_conditioning": False, "version": _version(),
        # sdrt's own: what the request asked that was not done, and how the job ran
        "sdrt_not_honoured": not_honoured + result.not_honoured, "sdrt_ignored_fields": ignored or [],
        "sdrt_interrupted": result.interrupted,
        "sdrt_skipped_runs": result.skipped, "sdrt_worker": result.worker,
        "sdrt_host": f"{socket.gethostname()}:{os.getpid()}", "sdrt_task_id": job_id,
        "sdrt_seconds": round(result.seconds, 3),
    }


def _version() -> str:
    from .. import __version__

    return f"sdrt {__version__}"


def a1111(work: Work, result: Result, params: dict[str, Any], not_honoured: list[str], job_id: str,
          send_images: bool, ignored: list[str] | None = None) -> dict[str, Any]:
    texts = infotexts(result)
    images = png_b64(result.images, texts) if send_images else []
    return {"images": images, "parameters": params,
            "info": json.dumps(info(work, result, texts, not_honoured, job_id, ignored), ensure_ascii=False)}


#: one ``Key: value`` of an infotext's settings line; a value is bare (up to the next comma) or JSON-quoted
_SETTING = re.compile(r'\s*(\w[\w \-/+.()]*):\s*("(?:\\.|[^\\"])*"|[^,]*)(?:,|$)')
_SIZE = re.compile(r"^(\d+)x(\d+)$")


def parse_infotext(text: str) -> dict[str, Any]:
    """An A1111 ``parameters`` text as A1111's ``/png-info`` answers it (``parse_generation_parameters``):
    ``Prompt``, ``Negative prompt`` and each setting of the last line as a string (``Size`` also as
    ``Size-1`` and ``Size-2``)."""
    lines = text.strip().split("\n")
    settings = _SETTING.findall(lines[-1]) if lines else []
    if len(settings) < 3:  # no settings line: all of it is prompt
        settings = []
    else:
        lines = lines[:-1]
    prompt, negative, in_negative = [], [], False
    for line in lines:
        if line.startswith("Negative prompt:"):
            in_negative = True
            line = line[len("Negative prompt:"):].strip()
        (negative if in_negative else prompt).append(line)
    out: dict[str, Any] = {"Prompt": "\n".join(prompt), "Negative prompt": "\n".join(negative)}
    for key, value in settings:
        if len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                value = json.loads(value)
            except ValueError:
                value = value[1:-1]
        size = _SIZE.match(value) if isinstance(value, str) else None
        if size:
            out[f"{key}-1"], out[f"{key}-2"] = size.group(1), size.group(2)
        else:
            out[key] = value
    return out


def preview_b64(rgb: np.ndarray | None) -> str | None:
    """A job's live preview as a base64 PNG: the pipeline's projection of the step's denoised estimate
    (``Pipeline.preview``, A1111's "Approx cheap"); None when there is nothing to show."""
    if rgb is None or rgb.ndim != 3 or rgb.shape[2] != 3:
        return None
    return base64.b64encode(encode_png(np.ascontiguousarray(rgb, dtype=np.uint8))).decode("ascii")


__all__ = ["a1111", "info", "infotexts", "parse_infotext", "png_b64", "preview_b64"]
