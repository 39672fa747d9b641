"""A UNet runs at any multiple of 8, as diffusers' torch code and A1111 do (``sdrt.graph.upsample``).

An export traced at an even latent upsamples by a constant 2, so sizes whose latent does not halve evenly failed in
shape inference (and were refused as "multiples of 64" for SD 1.x, 32 for SDXL). The references are diffusers'
pipelines at 72x88, 120x40 and 40x72 on tiny-sd15-dyn's and tiny-sdxl-dyn's weights
(scripts/gen_any_size_refs.py): their UNets halve the latent once, so a 9x11 latent goes 5x6 and back to 9x11 with
the skip's size, as diffusers' ``forward_upsample_size`` does. Tolerance: test_pipelines_diffusers.py's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.errors import InputError, ModelError
from sdrt.graph import Graph
from sdrt.graph.upsample import SKIP_SIZED_KEY, skip_sized, skip_sized_upsampling

CASES = json.loads((DATA / "any_size_refs.json").read_text())
_PIPES: dict[tuple[str, str], pipelines.Pipeline] = {}


def _pipe(folder: str, backend: str) -> pipelines.Pipeline:
    if (folder, backend) not in _PIPES:
        register(backend)
        _PIPES[folder, backend] = pipelines.load(DATA / folder, backend=backend)
    return _PIPES[folder, backend]


@pytest.fixture(scope="module", autouse=True)
def _close_pipes():
    yield
    for p in _PIPES.values():
        p.close()
    _PIPES.clear()


@pytest.mark.parametrize("backend", ["openvino", "ggml", "reference"])
@pytest.mark.parametrize("name", [c["name"] for c in CASES])
def test_a_size_off_the_exports_grid_matches_diffusers(name: str, backend: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    pipe = _pipe(case["folder"], backend)
    gen = pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                        sampler=case["sampler"], seed=case["seed"], width=case["width"], height=case["height"])
    assert gen.images[0].shape == (case["height"], case["width"], 3)
    assert_matches_diffusers(gen.images, np.load(DATA / "any_size_refs.npz")[name])


def test_the_upsamplers_take_their_skips_size_and_pinning_folds_it() -> None:
    """The tiny UNet's one upsampler is re-pointed; pinned at a 9x11 latent the graph's output is 9x11 and its
    Resize's size folds to a constant 9x11 (a backend sees a fixed-size Resize); the VAE decoder (upsamplers with no
    skip) is left as it is."""
    g = Graph.load(DATA / "tiny-sd15-dyn" / "unet" / "model.onnx")
    assert skip_sized_upsampling(g.model) == (1, 1)
    assert skip_sized(g.model) == 1
    nodes = len(g.model.graph.node)
    assert skip_sized_upsampling(g.model) == (1, 1)  # already re-pointed: counted, nothing added
    assert len(g.model.graph.node) == nodes and skip_sized(g.model) == 1
    pinned = g.with_shapes(sample=(2, 4, 9, 11), timestep=(2,), encoder_hidden_states=(2, 77, 32))
    assert pinned.outputs[0].shape == (2, 4, 9, 11)  # shape inference reaches the output (it failed before)
    folded = pinned.fold_constants()
    resize = next(n for n in folded.model.graph.node if n.op_type == "Resize")
    assert folded.initializer_arrays([resize.input[3]])[resize.input[3]].tolist() == [2, 16, 9, 11]
    vae = Graph.load(DATA / "tiny-sd15-dyn" / "vae_decoder" / "model.onnx")
    rewritten, nearest = skip_sized_upsampling(vae.model)
    assert rewritten == 0 and nearest >= 1
    assert not any(p.key == SKIP_SIZED_KEY for p in vae.model.metadata_props)


def test_a_graph_declared_for_a_multiple_keeps_its_grid() -> None:
    """A torch.export graph whose latent sides are declared ``8*h`` computes its attention reshapes from ``h``:
    re-pointed upsamplers would not make an odd latent run (sdrt's SD 1.5 graph so exported asked for 36 columns
    where there were 33), so it is left as it is and keeps its grid (``_unet_size_error``)."""
    from sdrt.checkpoint.graphs import shipped_graph

    g = Graph.load(shipped_graph("sd1_unet"), load_external=False)
    dims = g.model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "8*h", "8*w"  # as that export declared them
    before = len(g.model.graph.node)
    rewritten, nearest = skip_sized_upsampling(g.model)
    assert rewritten == 0 and nearest == 3 and len(g.model.graph.node) == before and skip_sized(g.model) == 0


#: graph -> its upsamplers' spatial sizes pinned at a 45x65 latent (45x65 halves to 23x33, 12x17, 6x9)
SHIPPED_UNETS = {name: [[12, 17], [23, 33], [45, 65]] for name in (
    "sd1_unet", "sd2_unet", "sd1_inpaint_unet", "sd1_ip2p_unet", "sd2_inpaint_unet", "sd1_unet_controlnet",
    "sdxl_refiner_unet")}  # four levels; SDXL's base three
SHIPPED_UNETS.update({name: [[23, 33], [45, 65]] for name in (
    "sdxl_unet", "sdxl_inpaint_unet", "sdxl_ip2p_unet", "sdxl_unet_controlnet")})


@pytest.mark.parametrize("graph", sorted(SHIPPED_UNETS))
def test_a_shipped_unet_runs_at_any_multiple_of_8(graph: str) -> None:
    """The shipped UNets are exported with free latent sides from an odd example (torch sizes each upsampler by its
    skip there): their sides are plain ``h`` and ``w``, their upsamplers are diffusers' pattern, and pinned at a
    45x65 latent (520x360 pixels) the output has that size and each upsampler a fixed size, its skip's. Their
    numbers against torch at 33x41 and 64x80: ``scripts/make_shipped_graphs.py check``; a full-size SD 1.5 file at
    520x360 against diffusers: docs/pipelines.md."""
    from sdrt.checkpoint.graphs import shipped_graph

    want = SHIPPED_UNETS[graph]
    g = Graph.load(shipped_graph(graph), load_external=False)
    sample = next(i for i in g.inputs if i.name == "sample")
    assert sample.shape[0] == "batch" and sample.shape[2:] == ("h", "w")
    assert skip_sized_upsampling(g.model) == (len(want), len(want)) and skip_sized(g.model) == len(want)
    levels = [(45, 65), (23, 33), (12, 17), (6, 9)]
    residuals = [i.name for i in g.inputs if i.name.startswith("down_block_additional_residual_")]
    shapes = {}
    for i in g.inputs:
        if i.name in residuals:  # three per level
            shapes[i.name] = (2, i.shape[1], *levels[int(i.name.rsplit("_", 1)[1]) // 3])
        elif i.name == "mid_block_additional_residual":
            shapes[i.name] = (2, i.shape[1], *levels[len(residuals) // 3 - 1])
        else:
            shapes[i.name] = tuple({"h": 45, "w": 65, "text": 77}.get(d, 2) if isinstance(d, str) else d
                                   for d in i.shape)
    folded = g.with_shapes(**shapes).fold_constants()
    assert folded.outputs[0].shape == (2, 4, 45, 65)
    resizes = [n for n in folded.model.graph.node if n.op_type == "Resize"]
    sizes = folded.initializer_arrays([n.input[3] for n in resizes])
    assert sorted(sizes[n.input[3]].tolist()[2:] for n in resizes) == want


def test_an_init_image_with_no_size_keeps_its_own_multiple_of_8() -> None:
    """With no size given, a picture's size runs down to a multiple of 8 (diffusers' ``VaeImageProcessor``), not
    to the export's old grid of 16."""
    from PIL import Image

    pipe = _pipe("tiny-sd15-dyn", "openvino")
    assert pipe._size_multiple() == 8
    picture = Image.new("RGB", (75, 91), (200, 40, 40))
    assert pipe.generate("a cat", steps=2, init_image=picture, strength=0.5).images[0].shape == (88, 72, 3)


def test_an_export_the_pattern_misses_still_names_its_grid(monkeypatch) -> None:
    """An export whose upsamplers are not diffusers' pattern keeps the fixed scale: a size off its grid is still said
    in pixels (tiny-sdxl-dyn without the re-pointing: multiples of 16), and another ModelError at such a size (a clip
    skip the text encoder cannot give) is not replaced by that size message."""
    import sdrt.graph.upsample as up

    monkeypatch.setattr(up, "skip_sized_upsampling", lambda model: (0, 1))
    register("reference")
    with pipelines.load(DATA / "tiny-sdxl-dyn", backend="reference") as pipe:
        assert pipe._size_multiple() == 16
        with pytest.raises(InputError) as size:
            pipe("a cat", steps=1, width=72, height=64)
        assert size.value.where == "width" and "multiples of 16 pixels" in size.value.what
        with pytest.raises(ModelError) as skip:
            pipe("a cat", steps=1, width=72, height=64, clip_skip=12)
        assert skip.value.where == "clip_skip" and "asks for layer 12" in skip.value.what
