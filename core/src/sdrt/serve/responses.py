"""A finished job -> the fields A1111 and OpenAI clients read: base64 PNGs carrying A1111's
``parameters`` chunk, A1111's ``info`` (a JSON string, as ``Processed.js()`` makes it) and ``parameters``."""

from __future__ import annotations

import base64
import json
import os
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


def info(work: Work, result: Result, texts: list[str], not_honoured: list[str], job_id: str) -> dict[str, Any]:
    """A1111's ``info`` fields (modules/processing.py ``Processed.js``), plus sdrt's own."""
    first = result.settings[0] if result.settings else {}
    kw = work.kwargs
    size = str(first.get("Size", f"{kw.get('width')}x{kw.get('height')}")).split("x")
    n = len(result.images)
    return {
        "prompt": result.prompt, "all_prompts": [result.prompt] * n,
        "negative_prompt": result.negative, "all_negative_prompts": [result.negative] * n,
        "seed": result.seeds[0] if result.seeds else work.seed, "all_seeds": result.seeds,
        "subseed": -1, "all_subseeds": [-1] * n, "subseed_strength": 0,
        "width": int(size[0]) if size[0].isdigit() else kw.get("width"),
        "height": int(size[1]) if len(size) > 1 and size[1].isdigit() else kw.get("height"),
        "sampler_name": first.get("Sampler", kw.get("sampler")), "scheduler": first.get("Schedule type"),
        "cfg_scale": kw.get("cfg"), "steps": kw.get("steps"), "batch_size": work.batch,
        "restore_faces": False, "face_restoration_model": None,
        "sd_model_name": work.model.model_name, "sd_model_hash": first.get("Model hash", work.model.hash),
        "sd_vae_name": None, "sd_vae_hash": None, "seed_resize_from_w": -1, "seed_resize_from_h": -1,
        "denoising_strength": kw.get("strength"), "extra_generation_params": {},
        "index_of_first_image": 0, "infotexts": texts, "styles": [],
        "job_timestamp": time.strftime("%Y%m%d%H%M%S"), "clip_skip": kw.get("clip_skip", 1),
        "is_using_inpainting_conditioning": False, "version": _version(),
        # sdrt's own: what the request asked that was not done, and how the job ran
        "sdrt_not_honoured": not_honoured, "sdrt_interrupted": result.interrupted,
        "sdrt_skipped_runs": result.skipped, "sdrt_worker": result.worker,
        "sdrt_host": f"{socket.gethostname()}:{os.getpid()}", "sdrt_task_id": job_id,
        "sdrt_seconds": round(result.seconds, 3),
    }


def _version() -> str:
    from .. import __version__

    return f"sdrt {__version__}"


def a1111(work: Work, result: Result, params: dict[str, Any], not_honoured: list[str], job_id: str,
          send_images: bool) -> dict[str, Any]:
    texts = infotexts(result)
    images = png_b64(result.images, texts) if send_images else []
    return {"images": images, "parameters": params,
            "info": json.dumps(info(work, result, texts, not_honoured, job_id), ensure_ascii=False)}


def preview_b64(latents: np.ndarray | None) -> str | None:
    """A cheap preview of SD latents (4 channels): a fixed latent -> RGB matrix, as A1111's
    "Approx cheap" live preview does; None when there is nothing to show."""
    if latents is None or latents.ndim != 4 or latents.shape[1] != 4:
        return None
    coefs = np.array([[0.298, 0.207, 0.208], [0.187, 0.286, 0.173],
                      [-0.158, 0.189, 0.264], [-0.184, -0.271, -0.473]], dtype=np.float32)
    rgb = np.einsum("chw,cr->hwr", latents[0].astype(np.float32), coefs)
    img = (np.clip((rgb + 1) / 2, 0, 1) * 255).round().astype(np.uint8)
    return base64.b64encode(encode_png(img)).decode("ascii")


__all__ = ["a1111", "info", "infotexts", "png_b64", "preview_b64"]
