"""XLabs-AI's Flux.1 ControlNets (their own key layout, and diffusers') on tiny-flux-dev against diffusers.

tests/data/pipelines/tiny-flux-xlabs-controlnet (scripts/gen_flux_xlabs_controlnet_refs.py) holds tiny random
XLabs-style nets of tiny-flux-dev's widths (2 double blocks, fp16), each saved with XLabs' own keys
(``double_blocks.N``, ``input_hint_block.{0,2,..,14}``, ``pos_embed_input``) as a downloaded file has them, the first
also in diffusers' names, and the images diffusers 0.42.1's ``FluxControlNetPipeline`` made with them. Their graphs
are cut from tiny-flux-controlnet's weight-free dev graph. Tolerance: 1 of 255 (the nets move the images by 121 to
255 levels, and their control pictures, against black ones, by 116 to 232: a net that misread its picture fails). tiny-flux-dev has one double block, where the repeat rule and diffusers' interval rule agree: the rule
is checked here on the shipped full-size graph, and by the script against diffusers' transformer on 3 blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flow_helpers import register

from sdrt import pipelines
from sdrt.checkpoint.controlnet import open_controlnet
from sdrt.errors import InputError, ModelError
from sdrt.pipelines.controlnet import ControlNet

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
NETS = DATA / "tiny-flux-xlabs-controlnet"
BASE = DATA / "tiny-flux-controlnet" / "flux_dev_transformer.onnx"
CASES = json.loads((NETS / "refs.json").read_text())
REFS = np.load(NETS / "refs.npz")
DIFFUSERS = NETS / "xlabs-diffusers" / "diffusion_pytorch_model.safetensors"

_PIPES: dict = {}


def _pipe(backend: str):
    register(backend)
    if backend not in _PIPES:
        _PIPES[backend] = pipelines.load(DATA / "tiny-flux-dev", backend=backend)
    return _PIPES[backend]


def _net(name: str, diffusers: bool = False):
    return open_controlnet(DIFFUSERS if diffusers else NETS / f"{name}.safetensors", graph=BASE)


def _kwargs(case: dict, diffusers: bool = False) -> dict:
    units = [ControlNet(_net(n, diffusers), REFS[f"{case['name']}/control_image_{k}"], case["scale"][k],
                        case["start"][k], case["end"][k]) for k, n in enumerate(case["nets"])]
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              sampler="Euler", guidance=case["guidance"], max_sequence_length=case["max_sequence_length"],
              controlnets=units)
    if case.get("negative_prompt"):
        kw.update(negative_prompt=case["negative_prompt"], cfg=case["true_cfg"])
    return kw


def _check(name: str, backend: str, got: np.ndarray) -> None:
    want = REFS[f"{name}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got.astype(int) - want).max())
    assert diff <= 1, f"{name} on {backend}: max difference {diff}"


PARAMS = [(c["name"], b) for c in CASES for b in ("reference", "openvino", "ggml")]


@pytest.mark.parametrize(("name", "backend"), PARAMS, ids=[f"{n}-{b}" for n, b in PARAMS])
def test_image_matches_diffusers(name: str, backend: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    gen = _pipe(backend).generate(case["prompt"], **_kwargs(case))
    _check(name, backend, np.stack(gen.images))


def test_the_pictures_steer_the_reference_images() -> None:
    """The fixtures can tell a net that reads its control picture from one that does not: in diffusers' images the
    picture (against a black one) moves the result by far more than the tolerance (at the hint convolutions' first
    draw it moved them by 1-4 levels, and a blank picture or transposed 2x2 patches passed)."""
    for case in CASES:
        assert case["picture_moves_image_by"] > 50, (case["name"], case["picture_moves_image_by"])


def test_diffusers_layout_file_gives_the_same_image() -> None:
    """The same net in diffusers' names (input_hint_block.conv_in, controlnet_x_embedder) binds to the same graph
    and gives diffusers' image."""
    case = CASES[0]
    _check(case["name"], "reference", np.stack(_pipe("reference")(case["prompt"], **_kwargs(case, diffusers=True))))


def test_layouts_and_refusals() -> None:
    """The layout of both key layouts; a run the Flux ControlNet path refuses is one line naming the argument; an
    XLabs net and a diffusers-design net together are refused."""
    xl, df = _net("xlabs-canny"), _net("xlabs-canny", diffusers=True)
    for opened in (xl, df):
        lay = opened.flux
        assert (lay.double, lay.single, lay.modes, lay.guidance, lay.hint) == (2, 0, None, True, True)
    assert xl.flux.bfl and not df.flux.bfl and "XLabs" in xl.ident.label
    assert sorted(xl.weights.shapes()) == sorted(df.weights.shapes())
    pipe = _pipe("reference")
    image = REFS[f"{CASES[0]['name']}/control_image_0"][:64, :64]
    canny = open_controlnet(DATA / "tiny-flux-controlnet" / "canny" / "diffusion_pytorch_model.safetensors",
                            graph=BASE)
    common = dict(steps=2, width=64, height=64, max_sequence_length=32)
    errors = [
        (dict(controlnets=[ControlNet(xl, image, union_mode=1)]), "controlnets[0] union_mode", "no union"),
        (dict(controlnets=[ControlNet(xl, image), ControlNet(canny, image)]), "controlnets[1]", "in turn"),
    ]
    for kw, where, words in errors:
        with pytest.raises(InputError) as exc:
            pipe("a cat", **common, **kw)
        assert exc.value.where == where and words in str(exc.value), (where, str(exc.value))
        assert "\n" not in str(exc.value)
    register("reference")
    with pytest.raises(InputError) as exc:  # schnell: no guidance input
        pipelines.load(DATA / "tiny-flux-schnell", backend="reference")("a cat", **common,
                                                                        controlnets=[ControlNet(xl, image)])
    assert exc.value.where == "controlnets" and "dev" in str(exc.value) and "\n" not in str(exc.value)


def test_plan_feeds_the_picture() -> None:
    """The dry run's plan: the net reads the control picture at the output size; tiny-flux-dev's one double block
    takes the net's first residual (0 % 2), its single blocks none."""
    case = CASES[0]
    plan = _pipe("reference").plan(case["prompt"], **_kwargs(case))
    shapes = {name: tuple(shape) for p in plan.parts for sig, _ in p.signatures for name, shape, _ in sig}
    assert shapes["controlnet_cond"] == (1, 3, case["height"], case["width"])
    tokens = (case["height"] // 16) * (case["width"] // 16)
    assert shapes["controlnet_block_sample_0"] == (1, tokens, 32)
    assert not any(n.startswith("controlnet_single_block_sample_") or n == "controlnet_block_sample_1"
                   for n in shapes)


def test_other_designs_in_xlabs_keys_are_one_line(tmp_path) -> None:
    """A file of XLabs' key layout without the hint convolutions, or with block layers of another design
    (MistoLine's ``controlnet_blocks.N.linear``), is refused in one line."""
    from safetensors.numpy import save_file

    from sdrt.checkpoint.xlabscontrolnet import HINT

    z = np.zeros((8, 8), np.float32)
    hint = {f"input_hint_block.{2 * i}.weight": np.zeros((16, 3 if i == 0 else 16, 3, 3), np.float32)
            for i in range(8)}
    files = {"flux-latent-controlnet": ({"double_blocks.0.img_attn.proj.weight": z, "controlnet_blocks.0.weight": z,
                                         "pos_embed_input.weight": np.zeros((8, 64), np.float32)}, "input_hint_block"),
             "mistoline": ({"double_blocks.0.img_attn.proj.weight": z, "controlnet_blocks.0.linear.weight": z,
                            "pos_embed_input.weight": np.zeros((8, 64), np.float32), **hint}, "MistoLine"),
             # diffusers' names, its image embedding left out: the key it lacks, in those names
             "no-x-embedder": ({"transformer_blocks.0.attn.to_out.0.weight": z, "controlnet_blocks.0.weight": z,
                                "controlnet_x_embedder.weight": np.zeros((8, 64), np.float32),
                                **{f"input_hint_block.{n}.weight": np.zeros((16, 3 if n == "conv_in" else 16, 3, 3),
                                                                            np.float32) for n in HINT}},
                               "without its image embedding (x_embedder.weight)")}
    for name, (tensors, words) in files.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        with pytest.raises(ModelError) as exc:
            open_controlnet(path, base="flux")
        assert words in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
        assert "InstantX" in exc.value.fix and "SD 1.x" not in exc.value.fix, exc.value.fix  # a Flux net is wanted


def test_full_size_repeat_rule_and_binding(tmp_path) -> None:
    """At full size: an XLabs-layout file of 4 double blocks (XLabs' own have 2; fp16, written sparse) binds tensor for tensor onto the
    graph cut from the shipped dev graph, whose control input is the picture; the dev transformer's 19 double blocks
    take its residuals in turn (block k: k % 4) and its single blocks none."""
    import sys

    import onnx

    from sdrt.checkpoint import fluxcontrolnet as fcn
    from sdrt.checkpoint.graphs import shipped_graph

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
    from single_file_helpers import sparse

    shapes = _xlabs_shapes(4)
    opened = open_controlnet(sparse(tmp_path / "flux-canny-controlnet-v3.safetensors", shapes, "F16"), base="flux")
    assert (opened.flux.double, opened.flux.single, opened.flux.hint, opened.flux.bfl) == (4, 0, True, True)
    dead = 3 * 2 * 2  # the last block's txt_attn.proj, txt_mlp.0 and txt_mlp.2, weight and bias; qkv is read
    assert len(opened.weights.shapes()) >= len(shapes) - dead
    model = onnx.load(str(opened.graph), load_external_data=False)
    cond = next(i for i in model.graph.input if i.name == "controlnet_cond")
    assert [d.dim_value or d.dim_param for d in cond.type.tensor_type.shape.dim] == ["batch", 3, "height", "width"]
    dev = onnx.load(str(shipped_graph("flux_dev_transformer")), load_external_data=False)
    fcn.residual_graph(dev, 4, 0, repeat=True)
    adds = [n for n in dev.graph.node if n.name.startswith("sdrt_controlnet_add_")]
    assert [n.input[1] for n in adds] == [f"controlnet_block_sample_{k % 4}" for k in range(19)]


def _xlabs_shapes(double: int) -> dict[str, tuple[int, ...]]:
    """A full-size XLabs Flux ControlNet's tensors in XLabs' names (Flux dev's embeddings and double blocks)."""
    w = 3072
    shapes: dict[str, tuple[int, ...]] = {"img_in.weight": (w, 64), "img_in.bias": (w,), "txt_in.weight": (w, 4096),
                                          "txt_in.bias": (w,), "pos_embed_input.weight": (w, 64),
                                          "pos_embed_input.bias": (w,)}
    for a, n in (("time_in", 256), ("vector_in", 768), ("guidance_in", 256)):
        shapes.update({f"{a}.in_layer.weight": (w, n), f"{a}.in_layer.bias": (w,), f"{a}.out_layer.weight": (w, w),
                       f"{a}.out_layer.bias": (w,)})
    for i in range(8):
        shapes.update({f"input_hint_block.{2 * i}.weight": (16, 3 if i == 0 else 16, 3, 3),
                       f"input_hint_block.{2 * i}.bias": (16,)})
    for b in range(double):
        p = f"double_blocks.{b}."
        for s in ("img", "txt"):
            shapes.update({f"{p}{s}_mod.lin.weight": (6 * w, w), f"{p}{s}_mod.lin.bias": (6 * w,),
                           f"{p}{s}_attn.qkv.weight": (3 * w, w), f"{p}{s}_attn.qkv.bias": (3 * w,),
                           f"{p}{s}_attn.norm.query_norm.scale": (128,), f"{p}{s}_attn.norm.key_norm.scale": (128,),
                           f"{p}{s}_attn.proj.weight": (w, w), f"{p}{s}_attn.proj.bias": (w,),
                           f"{p}{s}_mlp.0.weight": (4 * w, w), f"{p}{s}_mlp.0.bias": (4 * w,),
                           f"{p}{s}_mlp.2.weight": (w, 4 * w), f"{p}{s}_mlp.2.bias": (w,)})
        shapes.update({f"controlnet_blocks.{b}.weight": (w, w), f"controlnet_blocks.{b}.bias": (w,)})
    return shapes


def test_cli_flags_reach_the_net(tmp_path, capsys) -> None:
    """``--controlnet FILE --control-image PNG`` with an XLabs file: it binds onto the shipped full-size graph, which
    the tiny net does not fit: one line saying so (the tiny tests bind with graph= above)."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")  # the test alone: no earlier test registered it
    png = tmp_path / "edges.png"
    Image.fromarray(REFS[f"{CASES[0]['name']}/control_image_0"]).save(png)
    rc = main(["generate", str(DATA / "tiny-flux-dev"), "a cat", "--controlnet", str(NETS / "xlabs-canny.safetensors"),
               "--control-image", str(png), "--steps", "1", "--max-sequence-length", "32", "--backend", "reference",
               "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc != 0 and "XLabs Flux.1 ControlNet" in err and "32 wide" in err and "3072" in err, err
    assert "Traceback" not in err and err.count("error:") == 1


def test_a_changed_graph_edit_is_not_read_from_the_cache(tmp_path, monkeypatch) -> None:
    """The derived net graph is cached by the base graph and the layout, and by the code that cuts it: an sdrt whose
    edit differs (a fixed hint convolution, say) makes its graph again instead of reading an older one."""
    from sdrt.checkpoint import fluxcontrolnet as fcn

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    lay = _net("xlabs-canny").flux
    first = fcn.derived_controlnet_graph(BASE, lay)
    assert fcn.derived_controlnet_graph(BASE, lay) == first
    monkeypatch.setattr(fcn, "edit_sources", lambda: [__file__])
    second = fcn.derived_controlnet_graph(BASE, lay)
    assert second != first and second.is_file()
