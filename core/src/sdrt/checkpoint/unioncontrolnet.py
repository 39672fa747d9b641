"""xinsir's SDXL ControlNet Union (``controlnet-union-sdxl-1.0``: ``diffusion_pytorch_model.safetensors`` and
``diffusion_pytorch_model_promax.safetensors``), diffusers' ``ControlNetUnionModel``.

It is an SDXL ControlNet (diffusers' names) with a few more tensors: ``task_embedding`` (one row per control type),
a transformer over the condition features (``transformer_layes.*``, ``spatial_ch_projs``) and the control-type
embedding (``control_type_proj`` has no weights; ``control_add_embedding.linear_1`` reads 256 per type). The first
release knows 6 control types, the promax file 8 (tile and inpaint added): the count is ``task_embedding``'s rows.

sdrt ships its graph at 8 types (``sdxl_union_controlnet``, one image of one type per unit, as diffusers'
one-image path computes it; inputs ``control_type`` ``[batch, types]``, 1 at the type in use, and
``control_type_idx`` ``[1]``); a net of another count binds onto the graph derived from it here (the count appears
only in ``task_embedding``, ``control_add_embedding.linear_1.weight`` and the ``control_type`` input).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..errors import InputError, ModelError

GRAPH = "sdxl_union_controlnet"
#: the shipped graph's number of control types (the promax file's)
SHIPPED_TYPES = 8
#: the control types by index, as xinsir's model card and diffusers' union pipeline number them (``control_mode``)
TYPES = ("openpose", "depth", "softedge", "canny", "normal", "segment", "tile", "inpaint")
#: other names of the types (the model card's words, sd-webui-controlnet's / Forge's union control types)
ALIASES = {"pose": "openpose", "dwpose": "openpose", "hed": "softedge", "pidi": "softedge", "scribble": "softedge",
           "ted": "softedge", "soft_edge": "softedge", "thick_line": "softedge", "lineart": "canny",
           "anime_lineart": "canny", "mlsd": "canny", "hard_edge": "canny", "thin_line": "canny", "seg": "segment",
           "segmentation": "segment", "repaint": "inpaint"}
#: a unit's preprocessor (sdrt's / the extension's module names) -> the control type, by its name's start
_BY_PREPROCESSOR = (("openpose", "openpose"), ("dw_openpose", "openpose"), ("animal_openpose", "openpose"),
                    ("densepose", None), ("depth", "depth"), ("normal", "normal"), ("softedge", "softedge"),
                    ("scribble", "softedge"), ("hed", "softedge"), ("pidinet", "softedge"), ("canny", "canny"),
                    ("lineart", "canny"), ("mlsd", "canny"), ("seg_", "segment"), ("tile", "tile"),
                    ("blur_gaussian", "tile"), ("inpaint", "inpaint"))


def is_union(shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether a diffusers-layout ControlNet's tensors are a ControlNet Union's."""
    return "task_embedding" in shapes and any(k.startswith("control_add_embedding.") for k in shapes)


def type_count(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The number of control types a union net knows (``task_embedding``'s rows)."""
    return int(shapes["task_embedding"][0])


def graph_for(types: int) -> Path:
    """The weight-free union graph for a net of ``types`` control types (shipped at 8, derived for another count)."""
    from .graphs import derived_graph, shipped_graph

    base = shipped_graph(GRAPH)
    if types == SHIPPED_TYPES:
        return base
    if not 1 <= types <= 64:
        raise ModelError(f"a ControlNet Union with {types} control types", where=GRAPH,
                         fix="pass xinsir's controlnet-union-sdxl-1.0 (6 types) or its promax file (8)")

    return derived_graph(base, GRAPH, f"{types}types", lambda model: resize_types(model, types), [__file__],
                         "ControlNet Union", "pass sdrt's shipped graph (no graph=)")


def resize_types(model, types: int) -> None:
    """Edit a weight-free union graph (an ``onnx.ModelProto``) to ``types`` control types: ``task_embedding``'s rows,
    ``control_add_embedding.linear_1.weight``'s inputs, the ``control_type`` input's width, and the reshape of the
    types' sinusoidal embeddings (``[-1, 256 * types]``) that feeds that linear layer."""
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    linear = "control_add_embedding.linear_1.weight"
    width = inits[linear].dims[1] // inits["task_embedding"].dims[0]  # each type's embedding (256 at full size)
    inits["task_embedding"].dims[0] = types
    inits[linear].dims[1] = width * types
    for i in g.input:
        if i.name == "control_type":
            i.type.tensor_type.shape.dim[1].dim_value = types
    made = {o: n for n in g.node for o in n.output}
    gemm = next((n for n in g.node if n.op_type in ("Gemm", "MatMul") and linear in n.input), None)
    flat = made.get(gemm.input[0]) if gemm is not None else None
    if flat is None or flat.op_type != "Reshape" or flat.input[1] not in inits:
        raise ModelError("the ControlNet Union graph has no reshape of the control types' embeddings before "
                         f"{linear}", where=GRAPH, fix="pass sdrt's shipped graph (no graph=)")
    shape = numpy_helper.to_array(inits[flat.input[1]]).copy()
    shape[-1] = width * types
    name = f"{flat.input[1]}_{types}types"  # its own constant: the old one may shape another tensor too
    g.initializer.append(numpy_helper.from_array(shape, name))
    flat.input[1] = name


def type_index(mode: object, types: int, preprocessor: str, where: str, arg: str) -> int:
    """The control type a unit runs its union net with: ``mode`` (an index, or a name of :data:`TYPES` /
    :data:`ALIASES`), else the type its ``preprocessor`` makes; one-line ``InputError`` naming ``arg`` otherwise."""
    names = ", ".join(f"{i} {n}" for i, n in enumerate(TYPES[:types]))
    if mode is None:
        found = from_preprocessor(preprocessor)
        if found is None:
            raise InputError(f"{where} is a ControlNet Union, and its preprocessor {preprocessor!r} does not tell "
                             "which control type its image is", where=f"{where} {arg}",
                             fix=f"pass {arg} ({names})")
        mode = found
    if isinstance(mode, str):
        key = mode.strip().lower().replace(" ", "_").replace("-", "_")
        if key.isdigit():
            mode = int(key)
        else:
            key = ALIASES.get(key, key)
            if key not in TYPES:
                raise InputError(f"{where} {arg} {mode!r} is no control type of a ControlNet Union", where=f"{where} {arg}",
                                 fix=f"pass one of: {names}")
            mode = TYPES.index(key)
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode < types:
        raise InputError(f"{where} {arg} {mode!r} is not one of the net's {types} control types",
                         where=f"{where} {arg}", fix=f"pass one of: {names}")
    return mode


def from_preprocessor(preprocessor: str) -> str | None:
    """The control type a preprocessor's map is (``canny`` -> ``canny``, ``depth_midas`` -> ``depth``), None when
    its name does not tell (``none``, ``invert``, ``shuffle``, ...)."""
    name = (preprocessor or "").lower()
    for start, kind in _BY_PREPROCESSOR:
        if name.startswith(start):
            return kind
    return None
