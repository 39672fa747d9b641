"""diffusers' older LoRA files (attention processors: ``attn1.processor.to_q_lora.down.weight``, text encoder
``self_attn.to_q_lora`` and ``mlp.fc1.lora_linear_layer``) against diffusers' ``load_lora_weights`` + ``fuse_lora``.

Data: ``scripts/make_old_diffusers_lora_refs.py`` on the tiny SD 1.x parts of tests/data/ckpt/sd1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sdrt.checkpoint import param_map
from sdrt.graph import Graph
from sdrt.lora import Lora, merge
from sdrt.pipelines.weights import _route, _targets
from sdrt.weights import Weights

DATA = Path(__file__).resolve().parents[1] / "data"
SCALE = 0.8


def _deltas(lora: Lora) -> dict[str, np.ndarray]:
    by_part: dict[str, dict] = {}
    for key, layer in lora.layers.items():
        by_part.setdefault(_route(key), {})[key] = layer
    out = {}
    for part, layers in by_part.items():
        graph = Graph.load(DATA / "ckpt" / "sd1" / part / "model.onnx")
        targets = _targets(graph, layers, part)
        assert len(targets) == len(layers), sorted(set(layers) - set(targets))
        base = Weights.from_graph(graph)
        m = merge(base, [(Lora(layers, lora.format, lora.source), SCALE)], graph=graph, targets=targets)
        by_init = {s.init: (c, s.layout) for c, s in param_map(graph).items()}
        for init in m.originals:
            canon, layout = by_init[init]
            d = np.asarray(m[init], np.float32) - np.asarray(base[init], np.float32)
            out[f"{part}/{canon.removeprefix('text_model.')}"] = d.T if layout == "T" else d
    return out


def test_old_diffusers_lora_matches_diffusers_fuse_lora():
    lora = Lora.open(DATA / "lora" / "sd1_old_diffusers.safetensors")
    refs = np.load(DATA / "lora" / "sd1_old_diffusers_refs.npz")
    want = {k.replace("/text_model.", "/"): refs[k] for k in refs.files}
    got = _deltas(lora)
    assert set(got) == set(want) and len(got) == 19
    for k, ref in want.items():
        np.testing.assert_allclose(got[k], ref, atol=2e-5 * max(1.0, float(np.abs(ref).max())), err_msg=k)
    # the first such files had no unet. prefix: the same layers
    bare = Lora.from_arrays({k.removeprefix("unet."): v for k, v in Weights.open(lora.source).items()})
    for k, v in _deltas(bare).items():
        np.testing.assert_array_equal(v, got[k])
