"""The PEFT adapter configuration a LoRA file carries: each layer's scaling where no ``.alpha`` tensor gives it.

PEFT-format LoRAs (``lora_A``/``lora_B``, or PEFT's LoHa/LoKr) hold no alpha tensors: peft scales each layer by
``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``), both from the adapter's ``LoraConfig``, per
module through ``rank_pattern`` / ``alpha_pattern``. Two places keep that configuration:

- diffusers' ``save_lora_weights(..., unet_lora_adapter_metadata=...)`` (its training scripts pass the
  ``LoraConfig``, ``_collate_lora_metadata``) and ``save_lora_adapter`` write it into the ``.safetensors``
  header as ``__metadata__["lora_adapter_metadata"]``: JSON of ``{"<component>.<field>": value}``
  (``unet.r``, ``transformer.lora_alpha``, ...), or of the bare fields for one model's adapter;
- peft's ``save_pretrained`` writes ``adapter_config.json`` beside ``adapter_model.safetensors``.

diffusers' ``load_lora_weights`` builds its ``LoraConfig`` from the first, peft's ``PeftModel.from_pretrained``
from the second; without either, alpha is the rank (scaling 1). ``configs_for`` reads them; ``layer_scaling``
gives one module's scaling as peft computes it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import WeightsError

#: the safetensors ``__metadata__`` key diffusers writes (``diffusers.loaders.lora_base.LORA_ADAPTER_METADATA_KEY``)
METADATA_KEY = "lora_adapter_metadata"
#: the file peft's ``save_pretrained`` writes beside ``adapter_model.safetensors``
ADAPTER_CONFIG = "adapter_config.json"
_FIELDS = ("r", "lora_alpha", "alpha", "use_rslora", "rank_pattern", "alpha_pattern", "peft_type")


def _bad(path: Path, what: str) -> WeightsError:
    return WeightsError(f"{path.name}: {what}", where=str(path),
                        fix="re-save the LoRA (diffusers' save_lora_weights, peft's save_pretrained), or remove "
                        "the broken adapter configuration")


def _check(cfg: Mapping[str, Any], path: Path, where: str) -> dict[str, Any]:
    """The fields of one adapter configuration that scale layers, checked."""
    out = {k: cfg[k] for k in _FIELDS if k in cfg}
    alpha_field = "lora_alpha" if "lora_alpha" in out or out.get("peft_type", "LORA") == "LORA" else "alpha"
    for k in ("r", alpha_field):
        v = out.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (k == "r" and v <= 0):
            raise _bad(path, f"{where} gives {k} = {v!r}, expected a positive number")
    for k in ("rank_pattern", "alpha_pattern"):
        pat = out.get(k) or {}
        if not isinstance(pat, Mapping) or not all(
                isinstance(n, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                for n, v in pat.items()):
            raise _bad(path, f"{where} gives {k} = {pat!r:.80}, expected module names mapped to numbers")
        out[k] = dict(pat)
    out["alpha_field"] = alpha_field
    return out


def configs_for(path: str | Path, metadata: Mapping[str, str] | None) -> dict[str, dict[str, Any]]:
    """``{component prefix: config}`` from the file's ``lora_adapter_metadata`` (prefix ``"unet"``,
    ``"transformer"``, ``"text_encoder"``...; ``""`` for one model's bare configuration), else, for peft's
    ``adapter_model.safetensors`` / ``.bin``, from the ``adapter_config.json`` beside it (prefix ``""``); ``{}``
    when neither is there. A configuration that
    cannot be read is one ``WeightsError`` naming the file."""
    p = Path(path)
    raw = (metadata or {}).get(METADATA_KEY)
    if raw:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise _bad(p, f"its {METADATA_KEY} header is not JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise _bad(p, f"its {METADATA_KEY} header is not a JSON object")
        grouped: dict[str, dict[str, Any]] = {}
        for key, value in data.items():
            prefix, _, name = key.rpartition(".")  # "unet.lora_alpha"; a bare "lora_alpha" has prefix ""
            grouped.setdefault(prefix, {})[name] = value
        return {pre: _check(cfg, p, f"{METADATA_KEY} ({pre or 'the model'})") for pre, cfg in grouped.items()
                if "r" in cfg}
    side = p.with_name(ADAPTER_CONFIG)
    if p.stem == "adapter_model" and side.is_file():  # peft's own pair, not any LoRA in a folder that has one
        try:
            data = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise _bad(side, f"cannot read it ({exc})") from exc
        if isinstance(data, dict) and "r" in data:
            return {"": _check(data, side, ADAPTER_CONFIG)}
    return {}


def _pattern(pattern: Mapping[str, Any], module: str) -> Any:
    """peft's ``get_pattern_key``: the first pattern key that ends the module's name at a dot boundary."""
    for key in pattern:
        if re.match(rf"(.*\.)?({key})$", module):
            return pattern[key]
    return None


def layer_scaling(configs: Mapping[str, Mapping[str, Any]], module: str) -> float | None:
    """peft's scaling of the layer on ``module`` (the LoRA's module key, its component prefix included), or None
    when no configuration covers it."""
    best = None
    for prefix in configs:
        if prefix == "" or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best):
                best = prefix
    if best is None:
        return None
    cfg = configs[best]
    name = module[len(best) + 1:] if best else module
    name = name.removeprefix("base_model.model.")
    r = _pattern(cfg["rank_pattern"], name) or cfg["r"]
    alpha = _pattern(cfg["alpha_pattern"], name) or cfg[cfg["alpha_field"]]
    return float(alpha) / (math.sqrt(r) if cfg.get("use_rslora") else float(r))
