"""sdrt's shipped weight-free graphs: one ONNX graph per architecture, without weights.

``scripts/make_shipped_graphs.py`` exports each from its release's configuration and writes
``sdrt/data/graphs/<name>.onnx.xz``: every initializer is a typed, shaped external reference
to a file that does not exist (the ``sdrt strip`` marking), named with the diffusers/
transformers parameter name, so a single file's tensors bind onto it through
``sdrt.checkpoint``'s key maps and ``weights=``. ``shipped_graph(name)`` unpacks one into
sdrt's cache once (keyed by the packed file's content) and returns the path of the ``.onnx``.

Some graphs are *derived* rather than shipped (``DERIVED``): BFL's FLUX.1 Tools transformers are Flux.1 dev's
with a wider ``x_embedder`` (Fill: 384 input channels = 64 noise + 64 masked-image latent + 256 mask; Canny and
Depth: 128 = 64 noise + 64 control-image latent), and nothing else differs. ``shipped_graph`` makes one from
the shipped dev graph by widening ``hidden_states``' last axis and ``x_embedder.weight``'s input axis (the only
places that width appears: ``Transpose(x_embedder.weight)`` then ``MatMul(hidden_states, .)``), so they add
nothing to the wheel.
"""

from __future__ import annotations

import hashlib
import logging
import lzma
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from ..cache import cache_dir
from ..errors import ModelError
from ..graph.strip import write_atomic

log = logging.getLogger("sdrt.checkpoint.graphs")

SUFFIX = ".onnx.xz"


def _data() -> Path:
    return Path(str(resources.files("sdrt") / "data" / "graphs"))


#: a derived graph -> (the shipped graph it is made from, its transformer's input width)
DERIVED = {"flux_fill_transformer": ("flux_dev_transformer", 384),
           "flux_control_transformer": ("flux_dev_transformer", 128)}


def shipped_names() -> list[str]:
    """The architectures sdrt ships a graph of (or derives one for)."""
    folder = _data()
    names = [p.name[: -len(SUFFIX)] for p in folder.glob("*" + SUFFIX)] if folder.is_dir() else []
    return sorted([*names, *(d for d, (base, _) in DERIVED.items() if base in names)])


def widen_flux_input(raw: bytes, name: str, width: int) -> bytes:
    """A Flux transformer graph (serialized) whose ``hidden_states`` and ``x_embedder.weight`` take ``width``
    input channels instead of 64; metadata says ``name``. ``ModelError`` if the graph is not laid out so."""
    import onnx

    model = onnx.load_from_string(raw)
    g = model.graph
    inp = next((i for i in g.input if i.name == "hidden_states"), None)
    weight = next((t for t in g.initializer if t.name == "x_embedder.weight"), None)
    users = [n for n in g.node if "x_embedder.weight" in n.input]
    if inp is None or weight is None or len(weight.dims) != 2 or len(inp.type.tensor_type.shape.dim) != 3 \
            or [n.op_type for n in users] != ["Transpose"]:
        raise ModelError(f"the Flux graph for {name} does not take hidden_states through x_embedder.weight as "
                         "sdrt's shipped graph does", where=name, fix="reinstall sdrt")
    inp.type.tensor_type.shape.dim[2].dim_value = width
    weight.dims[1] = width
    for prop in model.metadata_props:
        if prop.key == "sdrt.architecture":
            prop.value = name
    return model.SerializeToString()


def shipped_graph(name: str) -> Path:
    """The path of the unpacked weight-free graph ``name`` (``sd1_unet``, ``flux_dev_transformer``, ...)."""
    base, width = DERIVED.get(name, (name, 0))
    packed = _data() / (base + SUFFIX)
    if not packed.is_file():
        raise ModelError(f"sdrt ships no graph named {name!r}", where=str(packed.parent),
                         fix=f"use one of: {', '.join(shipped_names()) or '(none installed: reinstall sdrt)'}")
    data = packed.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    out = cache_dir("graphs") / f"{name}-{digest}.onnx"
    if out.is_file():
        return out
    try:
        raw = lzma.decompress(data)
    except lzma.LZMAError as exc:
        raise ModelError(f"the shipped graph {base} is damaged ({exc})", where=str(packed),
                         fix="reinstall sdrt") from exc
    if width:
        raw = widen_flux_input(raw, name, width)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, raw, "unpack the shipped graph",
                 fix="check free space and permissions of the cache folder ($SDRT_CACHE_DIR)")
    log.info("unpacked %s (%d kB) to %s", name, len(raw) // 1024, out)
    return out


def derived_graph(base: Path, name: str, tag: str, edit: Callable[[Any], None], sources: Iterable[str],
                  what: str, fix_graph: str) -> Path:
    """The cached graph ``edit`` makes of the weight-free graph file ``base`` (a ControlNet cut from a shipped
    transformer), as ``graphs/<name>_<tag>-<digest>.onnx``. The key hashes the base graph, ``tag`` (the layout) and
    the source files of the code that edits (``sources``, e.g. ``[__file__]``), so a graph cut by an older sdrt is
    cut again, not read from its cache. ``what`` names the graph in messages ("Flux ControlNet"); ``fix_graph``
    says what to pass instead of a graph that holds its own weights."""
    import onnx

    raw = base.read_bytes()
    code = hashlib.sha256(b"".join(Path(s).read_bytes() for s in sources)).digest()
    digest = hashlib.sha256(raw + tag.encode() + code).hexdigest()[:16]
    out = cache_dir("graphs") / f"{name}_{tag}-{digest}.onnx"
    if out.is_file():
        return out
    model = onnx.load_from_string(raw)
    if not any(p.key == "sdrt.stripped_weights" for p in model.metadata_props):
        raise ModelError(f"{base.name} holds its own weights: a {what} graph is cut from a weight-free transformer "
                         "graph", where=str(base), fix=fix_graph)
    edit(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, model.SerializeToString(), f"write the derived {what} graph",
                 fix="check free space and permissions of the cache folder ($SDRT_CACHE_DIR)")
    log.info("derived the %s graph %s from %s", what, out.name, base.name)
    return out

