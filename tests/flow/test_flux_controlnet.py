"""Flux.1 ControlNets (diffusers' FluxControlNetModel layout) on tiny-flux-dev against diffusers.

tests/data/pipelines/tiny-flux-controlnet (scripts/gen_flux_controlnet_refs.py) holds tiny random
``FluxControlNetModel``s of tiny-flux-dev's widths (``canny``/``canny2``: 1 double + 1 single block; ``union``: 2
double + 0 single, 4 modes), each as its ``diffusion_pytorch_model.safetensors``, the tiny weight-free Flux dev
transformer graph sdrt cuts their graphs from (what the shipped ``flux_dev_transformer`` is at full size), and the
images diffusers 0.42.1's ``FluxControlNetPipeline`` made with them on tiny-flux-dev's parts. Tolerance: 1 of 255.
A net whose residuals went to the wrong blocks, a wrong control-latent order or window shows as tens of levels.
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
NETS = DATA / "tiny-flux-controlnet"
BASE = NETS / "flux_dev_transformer.onnx"
CASES = json.loads((NETS / "refs.json").read_text())
REFS = np.load(NETS / "refs.npz")

_PIPES: dict = {}


def _pipe(backend: str):
    register(backend)
    if backend not in _PIPES:
        _PIPES[backend] = pipelines.load(DATA / "tiny-flux-dev", backend=backend)
    return _PIPES[backend]


def _net(name: str):
    return open_controlnet(NETS / name / "diffusion_pytorch_model.safetensors", graph=BASE)


def _units(case: dict) -> list[ControlNet]:
    return [ControlNet(_net(n), REFS[f"{case['name']}/control_image_{k}"], case["scale"][k], case["start"][k],
                       case["end"][k], union_mode=case["mode"]) for k, n in enumerate(case["nets"])]


def _kwargs(case: dict) -> dict:
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              sampler="Euler", guidance=case["guidance"], max_sequence_length=case["max_sequence_length"],
              controlnets=_units(case))
    if case.get("negative_prompt"):
        kw.update(negative_prompt=case["negative_prompt"], cfg=case["true_cfg"])
    return kw


PARAMS = [(c["name"], b) for c in CASES for b in ("reference", "openvino", "ggml")]


@pytest.mark.parametrize(("name", "backend"), PARAMS, ids=[f"{n}-{b}" for n, b in PARAMS])
def test_image_matches_diffusers(name: str, backend: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    gen = _pipe(backend).generate(case["prompt"], **_kwargs(case))
    got = np.stack(gen.images).astype(int)
    if case["mode"] is not None:
        assert f"Union Mode: {case['mode']}" in gen.settings[0]["ControlNet 0"]
    want = REFS[f"{name}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got - want).max())
    assert diff <= 1, f"{name} on {backend}: max difference {diff}"


def test_plain_run_after_a_controlnet_run_is_the_plain_model() -> None:
    """The transformer takes the residual inputs only while a net is asked for: the next plain run gives
    tiny-flux-dev's own diffusers image (its graph as the file has it), and the plan of a ControlNet run lists the
    net and the residual inputs."""
    pipe = _pipe("reference")
    case = CASES[0]
    pipe(case["prompt"], **{**_kwargs(case), "steps": 1})
    assert any(n.startswith("controlnet_block_sample_") for n in pipe.denoiser.inputs)
    flow = json.loads((DATA / "tiny-flux-dev" / "refs.json").read_text())[0]
    got = np.stack(pipe(flow["prompt"], steps=flow["steps"], seed=flow["seed"], width=flow["width"],
                        height=flow["height"], sampler="Euler", guidance=flow["guidance"],
                        max_sequence_length=flow["max_sequence_length"])).astype(int)
    want = np.load(DATA / "tiny-flux-dev" / "refs.npz")[f"{flow['name']}/image"].astype(int)
    assert int(np.abs(got - want).max()) <= 2
    assert not any(n.startswith("controlnet_") for n in pipe.denoiser.inputs)
    plan = pipe.plan(case["prompt"], **_kwargs(case))
    shapes = {name: tuple(shape) for sig, _ in plan.part("transformer").signatures for name, shape, _ in sig}
    tokens = (case["height"] // 16) * (case["width"] // 16)
    assert shapes["controlnet_block_sample_0"] == (1, tokens, 32)
    assert shapes["controlnet_single_block_sample_0"] == (1, case["max_sequence_length"] + tokens, 32)


def test_layouts_and_refusals() -> None:
    """The layout read from a file's keys; an XLabs-layout file without its hint convolutions, an SD net on Flux and
    a Flux net on SD, a union net without its mode: one line each, naming the argument (XLabs' nets that run:
    test_flux_xlabs_controlnet.py)."""
    from sdrt.checkpoint.controlnet import identify

    canny, union = _net("canny"), _net("union")
    assert (canny.flux.double, canny.flux.single, canny.flux.modes, canny.flux.guidance) == (1, 1, None, True)
    assert (union.flux.double, union.flux.single, union.flux.modes) == (2, 0, 4)
    xlabs = identify({"double_blocks.0.img_attn.proj.weight": (8, 8), "controlnet_blocks.0.weight": (8, 8),
                      "input_hint_block.0.weight": (16, 3, 3, 3)})
    assert xlabs.base is None and "input_hint_block.2.weight" in xlabs.label and "XLabs" in xlabs.label
    from sdrt.checkpoint.families import detect

    assert detect(canny.weights.shapes()).startswith("a ControlNet")  # passed as the model: named as a ControlNet
    pipe = _pipe("reference")
    case = next(c for c in CASES if c["mode"] is not None)
    image = REFS[f"{case['name']}/control_image_0"][:64, :64]
    common = dict(steps=4, width=64, height=64, max_sequence_length=32)
    errors = [
        (dict(controlnets=[ControlNet(union, image)]), "controlnets[0] union_mode", "union ControlNet"),
        (dict(controlnets=[ControlNet(canny, image, union_mode=1)]), "controlnets[0] union_mode", "no union"),
        (dict(controlnets=[ControlNet(union, image, union_mode=4)]), "controlnets[0] union_mode", "4 modes"),
        (dict(controlnets=[ControlNet(canny, image), ControlNet(union, image, union_mode=0)]), "controlnets[1]",
         "cannot be summed"),
        (dict(controlnets=[ControlNet(canny, image, control_mode=1)]), "controlnets[0]", "scale and window only"),
    ]
    for kw, where, words in errors:
        with pytest.raises(InputError) as exc:
            pipe("a cat", **common, **kw)
        assert exc.value.where == where and words in str(exc.value), (where, str(exc.value))
        assert "\n" not in str(exc.value)
    sd = DATA / "tiny-sd15-controlnet"
    register("reference")
    with pytest.raises((InputError, ModelError)) as exc:
        pipelines.load(sd, backend="reference")("a cat", steps=1, width=64, height=64,
                                                controlnets=[ControlNet(canny, image)])
    assert "Flux.1 ControlNet" in str(exc.value) and "SD 1.x" in str(exc.value), str(exc.value)


def test_a_flux_controlnet_on_chroma_says_chroma_takes_none() -> None:
    """Chroma runs no ControlNet: a Flux net on it said "this model's transformer takes no ControlNet residuals ...
    use a model folder exported for ControlNet (its UNet takes down_block_additional_residual_*)", advice for an SD
    UNet export that no Chroma model can follow. The family is named first now."""
    register("reference")
    image = np.zeros((64, 64, 3), np.uint8)
    with pipelines.load(DATA / "tiny-chroma", backend="reference") as pipe, pytest.raises(InputError) as exc:
        pipe("a cat", steps=1, width=64, height=64, controlnets=[ControlNet(_net("canny"), image)])
    assert "ControlNet is not supported for Chroma" in str(exc.value), str(exc.value)
    assert "down_block_additional_residual" not in str(exc.value) and exc.value.where == "controlnets"


def test_incomplete_xlabs_file_is_refused_in_one_line(tmp_path) -> None:
    """A file of XLabs' key layout whose hint block lacks convolutions is not XLabs' design: one line."""
    from safetensors.numpy import save_file

    path = tmp_path / "flux-canny-controlnet-v3.safetensors"
    save_file({"double_blocks.0.img_attn.proj.weight": np.zeros((8, 8), np.float32),
               "controlnet_blocks.0.weight": np.zeros((8, 8), np.float32),
               "input_hint_block.0.weight": np.zeros((16, 3, 3, 3), np.float32)}, str(path))
    with pytest.raises(ModelError) as exc:
        open_controlnet(path, base="flux")
    assert "XLabs" in str(exc.value) and "\n" not in str(exc.value)


def test_derived_full_size_graphs() -> None:
    """At full size, from the shipped graphs: Shakker-Labs Union Pro's layout (5 + 10 blocks, 10 modes) gives a
    graph of FluxControlNetModel's parameters (blocks 0-4 and 0-9, the control embedder, one linear per block, the
    mode embedding) and outputs; the dev transformer takes 5 + 10 residual inputs, each block's by diffusers'
    interval rule (19 blocks / 5 samples: 4 a sample)."""
    import onnx

    from sdrt.checkpoint import fluxcontrolnet as fcn
    from sdrt.checkpoint.graphs import shipped_graph

    lay = fcn.FluxNetLayout(5, 10, 10, True, 3072)
    path = fcn.derived_controlnet_graph(shipped_graph("flux_dev_transformer"), lay)
    model = onnx.load(str(path), load_external_data=False)
    names = {t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    blocks = {int(n.split(".")[1]) for n in names if n.startswith("transformer_blocks.")}
    singles = {int(n.split(".")[1]) for n in names if n.startswith("single_transformer_blocks.")}
    assert blocks == set(range(5)) and singles == set(range(10))
    assert {f"controlnet_blocks.{j}.weight" for j in range(5)} <= names
    assert {f"controlnet_single_blocks.{j}.bias" for j in range(10)} <= names
    assert {"controlnet_x_embedder.weight", "controlnet_mode_embedder.weight"} <= names
    assert not any(n.startswith(("norm_out.", "proj_out.")) for n in names)
    assert [o.name for o in model.graph.output] == [f"controlnet_block_sample_{j}" for j in range(5)] + [
        f"controlnet_single_block_sample_{j}" for j in range(10)]
    assert {i.name for i in model.graph.input} >= {"controlnet_cond", "controlnet_mode", "guidance"}
    dev = onnx.load(str(shipped_graph("flux_dev_transformer")), load_external_data=False)
    fcn.residual_graph(dev, 5, 10)
    adds = [n for n in dev.graph.node if n.name.startswith("sdrt_controlnet_add_")]
    assert len(adds) == 19 + 38
    assert fcn.residual_map(19, 5) == [k // 4 for k in range(19)] and fcn.residual_map(38, 10)[-1] == 9
    assert sorted(i.name for i in dev.graph.input if i.name.startswith("controlnet_")) == sorted(
        [f"controlnet_block_sample_{j}" for j in range(5)] + [f"controlnet_single_block_sample_{j}" for j in range(10)])


def test_cli_flags_reach_the_net(tmp_path, capsys) -> None:
    """``--controlnet FILE --control-image PNG --control-union-mode N``: the net binds onto the shipped full-size
    graph, which the tiny net does not fit: one line saying so (the tiny tests bind with graph= above)."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")  # the test alone: no earlier test registered it
    png = tmp_path / "edges.png"
    Image.fromarray(REFS["canny-64x96/control_image_0"]).save(png)
    rc = main(["generate", str(DATA / "tiny-flux-dev"), "a cat", "--controlnet",
               str(NETS / "union" / "diffusion_pytorch_model.safetensors"), "--control-image", str(png),
               "--control-union-mode", "2", "--steps", "1", "--max-sequence-length", "32", "--backend", "reference",
               "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc != 0 and "Flux.1 ControlNet" in err and "32 wide" in err and "3072" in err, err
    assert "Traceback" not in err and err.count("error:") == 1


def _published_shapes(double: int, single: int, modes: int | None) -> dict[str, tuple[int, ...]]:
    """A full-size diffusers Flux ControlNet's tensors: Flux dev's embeddings and first blocks (their names and shapes
    as the shipped dev graph holds them, which make_shipped_graphs.py checks against FluxTransformer2DModel), plus
    FluxControlNetModel's own: the control embedder, one 3072x3072 linear per block, the mode embedding."""
    import onnx

    from sdrt.checkpoint.graphs import shipped_graph

    dev = onnx.load(str(shipped_graph("flux_dev_transformer")), load_external_data=False)
    shapes = {}
    for t in dev.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        parts = t.name.split(".")
        if parts[0] == "transformer_blocks" and int(parts[1]) >= double or \
                parts[0] == "single_transformer_blocks" and int(parts[1]) >= single or \
                parts[0] in ("norm_out", "proj_out"):
            continue
        shapes[t.name] = tuple(t.dims)
    shapes.update({"controlnet_x_embedder.weight": (3072, 64), "controlnet_x_embedder.bias": (3072,)})
    for prefix, n in (("controlnet_blocks", double), ("controlnet_single_blocks", single)):
        for j in range(n):
            shapes.update({f"{prefix}.{j}.weight": (3072, 3072), f"{prefix}.{j}.bias": (3072,)})
    if modes:
        shapes["controlnet_mode_embedder.weight"] = (modes, 3072)
    return shapes


@pytest.mark.parametrize(("name", "double", "single", "modes"), [
    ("FLUX.1-dev-Controlnet-Canny", 5, 10, None), ("FLUX.1-dev-ControlNet-Union-Pro", 5, 10, 10),
    ("FLUX.1-dev-ControlNet-Union-Pro-2.0", 6, 0, None)])
def test_full_size_files_bind_onto_the_derived_graph(tmp_path, name: str, double: int, single: int,
                                                     modes: int | None) -> None:
    """Full-size files of the published layouts (bf16, written sparse: nothing is read) bind tensor for tensor onto
    the graph cut from the shipped dev graph (Union Pro 2.0's last block's text-stream weights, which nothing reads
    without single blocks, are left out); a file with a block of another width is one line naming it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
    from single_file_helpers import sparse

    shapes = _published_shapes(double, single, modes)
    path = sparse(tmp_path / f"{name}.safetensors", shapes, "BF16")
    opened = open_controlnet(path, base="flux")
    assert (opened.flux.double, opened.flux.single, opened.flux.modes) == (double, single, modes)
    dead = 6 if single == 0 else 0  # to_add_out and ff_context.net.{0.proj,2}, weight and bias
    assert len([k for k in opened.weights.shapes() if k in shapes]) == len(shapes) - dead
    shapes["controlnet_blocks.0.weight"] = (3072, 1536)
    with pytest.raises(ModelError) as exc:
        open_controlnet(sparse(tmp_path / "bad.safetensors", shapes, "BF16"), base="flux")
    assert "bad.safetensors" in str(exc.value) and "\n" not in str(exc.value)
