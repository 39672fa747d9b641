"""A LoRA merged into the tiny checkpoint parts of tests/data/ckpt, part by part, as the pipeline merges it, for the
tests that compare the weight changes with diffusers' ``load_lora_weights`` + ``fuse_lora``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdrt.checkpoint import param_map
from sdrt.graph import Graph
from sdrt.lora import Lora, merge
from sdrt.pipelines.weights import _route, _targets
from sdrt.weights import Weights

DATA = Path(__file__).resolve().parents[1] / "data"


@dataclass
class MergedPart:
    layers: dict[str, Any]          # the LoRA's layers routed to this part
    targets: dict[str, str]         # layer key -> initializer it changes
    by_init: dict[str, tuple[str, str]]  # initializer -> (canonical name, layout)
    deltas: dict[str, np.ndarray]   # "part/canonical name" (text_model. dropped) -> merged - base, torch's layout


def merged_parts(lora: Lora, ckpt: str, scale: float) -> dict[str, MergedPart]:
    """``lora`` at ``scale`` merged into each part of tests/data/ckpt/``ckpt`` it has layers for; every layer must
    find its weight."""
    by_part: dict[str, dict] = {}
    for key, layer in lora.layers.items():
        by_part.setdefault(_route(key), {})[key] = layer
    out = {}
    for part, layers in by_part.items():
        graph = Graph.load(DATA / "ckpt" / ckpt / part / "model.onnx")
        targets = _targets(graph, layers, part)
        assert len(targets) == len(layers), sorted(set(layers) - set(targets))
        base = Weights.from_graph(graph)
        m = merge(base, [(Lora(layers, lora.format, lora.source), scale)], graph=graph, targets=targets)
        by_init = {s.init: (c, s.layout) for c, s in param_map(graph).items()}
        deltas = {}
        for init in m.originals:
            canon, layout = by_init[init]
            d = np.asarray(m[init], np.float32) - np.asarray(base[init], np.float32)
            deltas[f"{part}/{canon.removeprefix('text_model.')}"] = d.T if layout == "T" else d
        out[part] = MergedPart(layers, targets, by_init, deltas)
    return out


def transformer_deltas(pipe: Any, lora: Path, scale: float) -> dict[str, np.ndarray]:
    """``{diffusers parameter: merged - base}`` (torch's layout) of a loaded pipeline's transformer with ``lora`` set
    at ``scale``, as the pipeline merges it; the LoRA is unset after."""
    pipe.set_loras([(lora, scale)])
    try:
        merged = pipe.weights._merge(pipe.weights.loras)["transformer"]
        graph = pipe.parts["transformer"].graph
        by_init = {s.init: (c, s.layout) for c, s in param_map(graph).items()}
        base = graph.initializer_arrays(list(merged))
        out = {}
        for init, arr in merged.items():
            canon, layout = by_init[init]
            d = np.asarray(arr, np.float32) - np.asarray(base[init], np.float32)
            out[canon] = d.T if layout == "T" else d
        return out
    finally:
        pipe.set_loras([])
