"""Stable Diffusion 2.x: SD 1.x's layout with OpenCLIP ViT-H (1024 wide, pads with '!'), 768 px, often v."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .sd1 import SD1


class SD2(SD1):
    name = "sd2"
    label = "SD 2.x"
    class_names = ()  # SD 2.x folders name SD 1.x's pipeline classes: told apart by their text encoder
    default_size = 768

    @classmethod
    def matches(cls, parts: set[str], configs: Mapping[str, Mapping[str, Any]], tokenizers: Path) -> bool:
        text = configs.get("text_encoder", {})
        if "text_encoder_2" in parts or "text_encoder" not in parts:
            return False
        if text.get("hidden_size") == 1024 or text.get("hidden_act") == "gelu":
            return True
        special = tokenizers / "tokenizer" / "special_tokens_map.json"
        if special.is_file():
            try:
                pad = json.loads(special.read_text(encoding="utf-8")).get("pad_token")
            except (OSError, ValueError, AttributeError):
                pad = None
            return pad == "!" or (isinstance(pad, dict) and pad.get("content") == "!")
        return False
