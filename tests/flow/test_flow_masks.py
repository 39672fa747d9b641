"""Attention masks are fed exactly when a graph declares them.

- A T5 encoder with an ``attention_mask`` input gets the family's mask: the tokenizer's for Chroma, all
  ones for SD3 and Flux (their diffusers pipelines pass none). sdrt's shipped ``t5xxl`` takes one.
- A Flux-family transformer gets ``[batch, text + image]`` ``attention_mask`` only when its graph declares it;
  a Chroma folder exported without mask inputs keeps running (every padding token attends then).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from flow_helpers import cases, folder, refs, register

from sdrt import pipelines
from sdrt.pipelines.textcond import T5Encoder

onnx = pytest.importorskip("onnx")


def _load(path: Path):
    register("reference")
    return pipelines.load(path, backend="reference")


def _image(pipe, case: dict) -> np.ndarray:
    images = pipe(case["prompt"], case["negative_prompt"] or "", steps=case["steps"], seed=case["seed"],
                  width=case["width"], height=case["height"], batch=case["batch"], cfg=case["cfg"], sampler="Euler",
                  max_sequence_length=case["max_sequence_length"])
    return np.stack(images).astype(int)


def test_t5_mask_per_family() -> None:
    chroma = _load(folder("chroma"))
    t5 = chroma.prompts.t5
    assert t5.mask == "tokenizer" and "attention_mask" in t5.part.inputs
    for kind in ("sd3", "flux-dev"):
        assert _load(folder(kind)).prompts.t5.mask == "ones"  # diffusers' SD3/Flux pass T5 no mask
    r = refs("chroma")
    case = cases("chroma")[0]
    states, mask = t5.encode(case["prompt"], case["max_sequence_length"])
    np.testing.assert_allclose(states, r[f"{case['name']}/prompt/prompt_embeds"], atol=2e-5)
    assert mask.sum() < mask.size  # the prompt is padded: the mask matters
    ones, _ = T5Encoder(t5.tokenizer, t5.part, mask="ones").encode(case["prompt"], case["max_sequence_length"])
    ids = r[f"{case['name']}/prompt/ids_t5"].astype(np.int64)
    want = t5.part.run({"input_ids": ids, "attention_mask": np.ones_like(ids)}, ("last_hidden_state",))
    np.testing.assert_allclose(ones, want["last_hidden_state"], atol=1e-6)
    assert np.abs(ones - states).max() > 1e-3


def _ones_instead_of(model, name: str, shape_of) -> None:
    """Replace graph input ``name`` by a constant-true/one tensor of the shape ``shape_of`` builds."""
    from onnx import TensorProto, helper

    value = next(i for i in model.graph.input if i.name == name)
    dtype = value.type.tensor_type.elem_type
    model.graph.input.remove(value)
    nodes = shape_of(f"{name}_shape")
    fill = helper.make_tensor("one", TensorProto.BOOL if dtype == TensorProto.BOOL else dtype, [1],
                              [True] if dtype == TensorProto.BOOL else [1])
    nodes.append(helper.make_node("ConstantOfShape", [f"{name}_shape"], [name], value=fill))
    for i, n in enumerate(nodes):
        model.graph.node.insert(i, n)


def _shape_nodes(pieces: list[tuple[str, int, int]], out: str, add_last: tuple[str, int] | None = None):
    """Concat of Shape(x)[a:b] pieces; with ``add_last``, the last piece plus Shape(y)[k]."""
    from onnx import helper

    def const(name, v):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, 7, [1], [v]))

    nodes, parts = [], []
    for j, (x, a, b) in enumerate(pieces):
        nodes += [helper.make_node("Shape", [x], [f"{out}_s{j}"]), const(f"{out}_a{j}", a), const(f"{out}_b{j}", b),
                  helper.make_node("Slice", [f"{out}_s{j}", f"{out}_a{j}", f"{out}_b{j}"], [f"{out}_p{j}"])]
        parts.append(f"{out}_p{j}")
    if add_last is not None:
        y, k = add_last
        nodes += [helper.make_node("Shape", [y], [f"{out}_y"]), const(f"{out}_ya", k), const(f"{out}_yb", k + 1),
                  helper.make_node("Slice", [f"{out}_y", f"{out}_ya", f"{out}_yb"], [f"{out}_yk"]),
                  helper.make_node("Add", [parts[-1], f"{out}_yk"], [f"{out}_sum"])]
        parts[-1] = f"{out}_sum"
    nodes.append(helper.make_node("Concat", parts, [out], axis=0))
    return nodes


def _copy(kind: str, tmp: Path) -> Path:
    dst = tmp / f"tiny-{kind}"
    shutil.copytree(folder(kind), dst)
    return dst


def test_chroma_folder_without_mask_inputs_runs(tmp_path: Path) -> None:
    """An older Chroma export (no attention_mask on T5 or the transformer): fed no mask, and with a prompt that
    fills the sequence (no padding: the mask would be all true) it gives diffusers' image."""
    dst = _copy("chroma", tmp_path)
    te = onnx.load(str(dst / "text_encoder" / "model.onnx"))
    _ones_instead_of(te, "attention_mask", lambda out: _shape_nodes([("input_ids", 0, 2)], out))
    onnx.save(te, str(dst / "text_encoder" / "model.onnx"))
    tr = onnx.load(str(dst / "transformer" / "model.onnx"), load_external_data=False)
    _ones_instead_of(tr, "attention_mask", lambda out: _shape_nodes(
        [("hidden_states", 0, 1), ("encoder_hidden_states", 1, 2)], out, add_last=("hidden_states", 1)))
    onnx.save(tr, str(dst / "transformer" / "model.onnx"))
    pipe = _load(dst)
    assert "attention_mask" not in pipe.prompts.t5.part.inputs
    full = next(c for c in cases("chroma") if "long" in c["name"])
    diff = np.abs(_image(pipe, full) - refs("chroma")[f"{full['name']}/image"].astype(int)).max()
    assert diff <= 2, diff
    padded = cases("chroma")[0]
    assert _image(pipe, padded).shape == refs("chroma")[f"{padded['name']}/image"].shape


def test_flux_transformer_gets_a_declared_mask(tmp_path: Path) -> None:
    """A Flux transformer whose graph declares ``attention_mask`` gets ``[batch, text + image]`` all true (diffusers'
    FluxPipeline passes none); the graph here turns its output to NaN unless it got exactly that."""
    from onnx import TensorProto, helper

    dst = _copy("flux-schnell", tmp_path)
    path = dst / "transformer" / "model.onnx"
    tr = onnx.load(str(path), load_external_data=False)
    out = tr.graph.output[0]
    raw = out.name + "_unmasked"
    for n in tr.graph.node:
        n.output[:] = [raw if o == out.name else o for o in n.output]
    tr.graph.input.append(helper.make_tensor_value_info("attention_mask", TensorProto.BOOL,
                                                        ["batch_size", "text_and_image"]))
    want = _shape_nodes([("hidden_states", 0, 1), ("encoder_hidden_states", 1, 2)], "want_shape",
                        add_last=("hidden_states", 1))
    tr.graph.node.extend([*want,
                          helper.make_node("Shape", ["attention_mask"], ["got_shape"]),
                          helper.make_node("Equal", ["got_shape", "want_shape"], ["same_dims"]),
                          helper.make_node("Cast", ["same_dims"], ["same_f"], to=TensorProto.FLOAT),
                          helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
                          helper.make_node("ReduceMin", ["mask_f"], ["all_true"], keepdims=0),
                          helper.make_node("ReduceMin", ["same_f"], ["all_same"], keepdims=0),
                          helper.make_node("Mul", ["all_true", "all_same"], ["fine"]),
                          helper.make_node("Constant", [], ["half"], value=helper.make_tensor("h", 1, [], [0.5])),
                          helper.make_node("Greater", ["fine", "half"], ["ok"]),
                          helper.make_node("Constant", [], ["nan"], value=helper.make_tensor("n", 1, [], [np.nan])),
                          helper.make_node("Where", ["ok", raw, "nan"], [out.name])])
    onnx.save(tr, str(path))
    pipe = _load(dst)
    assert "attention_mask" in pipe.denoiser.inputs
    case = cases("flux-schnell")[0]
    diff = np.abs(_image(pipe, case) - refs("flux-schnell")[f"{case['name']}/image"].astype(int)).max()
    assert diff <= 2, diff
