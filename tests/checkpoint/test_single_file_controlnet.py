"""A ControlNet on a single-file checkpoint: the file's UNet runs sdrt's shipped twin graph that takes
ControlNet residuals (``sd1_unet_controlnet``, same parameters and initializer names as ``sd1_unet``) for a
run with ControlNets, and the plain graph again for a run without (``singlefile.denoiser_graph``).

The shipped graphs are full size, so here sdrt's graph lookup is pointed at tiny ones (as the CLI tests of
test_single_file_pipeline.py do): ``tiny-sd15-controlnet``'s UNet (which takes residuals) stripped of its
weights is the twin, and the same graph with its residual Adds cut out is the plain UNet. The checkpoint is
that folder's own weights written as an LDM single file, so the runs must give the folder's images (which
tests/pipelines checks against diffusers' StableDiffusionControlNetPipeline): byte for byte on the
reference backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import single_file_helpers as h

from sdrt import pipelines
from sdrt.graph import Graph

FOLDER = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
KW = dict(steps=2, cfg=7.0, sampler="Euler", seed=101, width=64, height=64)


def _without_residuals(src: Path, out: Path) -> Path:
    """The UNet with each ``Add(x, residual input)`` made ``Identity(x)`` and the residual inputs removed."""
    model = onnx.load(str(src), load_external_data=False)
    res = {i.name for i in model.graph.input if "additional_residual" in i.name}
    assert res
    for node in model.graph.node:
        hit = [x for x in node.input if x in res]
        if hit:
            assert node.op_type == "Add" and len(hit) == 1, node
            keep = next(x for x in node.input if x not in res)
            node.op_type = "Identity"
            del node.input[:]
            node.input.append(keep)
    kept = [i for i in model.graph.input if i.name not in res]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def tiny_twins(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sf-cn")
    graphs = h.stripped(FOLDER, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp / "g")
    plain = _without_residuals(graphs["unet"], tmp / "g" / "unet_plain.onnx")
    ck = h.write(tmp / "tinycn.safetensors", {
        **h.unet_tensors(Graph.load(FOLDER / "unet" / "model.onnx")),
        **h.clip_tensors(Graph.load(FOLDER / "text_encoder" / "model.onnx"), "cond_stage_model.transformer.")})
    vae = h.write(tmp / "tinycn_vae.safetensors", h.vae_tensors(Graph.load(FOLDER / "vae_decoder" / "model.onnx"),
                                                                 Graph.load(FOLDER / "vae_encoder" / "model.onnx")))
    shipped = {"sd1_unet": plain, "sd1_unet_controlnet": graphs["unet"], "clip_l": graphs["text_encoder"],
               "vae4_decoder": graphs["vae_decoder"], "vae4_encoder": graphs["vae_encoder"]}
    return ck, vae, shipped


def test_single_file_runs_a_controlnet_on_the_twin_unet_and_the_plain_one_without(tiny_twins, monkeypatch):
    from sdrt.checkpoint import files, graphs

    ck, vae, shipped = tiny_twins
    monkeypatch.setattr(files, "shipped_graph", lambda name: shipped[name])
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: shipped[name])
    edges = np.load(FOLDER / "refs.npz")["edges"]
    unit = [(FOLDER / "controlnet", edges, 1.0)]
    with pipelines.load(ck, backend="reference", vae=vae, tokenizers={"tokenizer": FOLDER / "tokenizer"}) as pipe:
        assert pipe.unet.path == shipped["sd1_unet"]
        plain1 = pipe.generate("a red cat", "blurry", **KW).images[0]
        controlled = pipe.generate("a red cat", "blurry", controlnets=unit, **KW).images[0]
        assert pipe.unet.path == shipped["sd1_unet_controlnet"]
        plain2 = pipe.generate("a red cat", "blurry", **KW).images[0]
        assert pipe.unet.path == shipped["sd1_unet"]
    with pipelines.load(FOLDER, backend="reference") as folder:
        want_controlled = folder.generate("a red cat", "blurry", controlnets=unit, **KW).images[0]
        want_plain = folder.generate("a red cat", "blurry", **KW).images[0]  # the folder's net at scale 0
    assert controlled.tobytes() == want_controlled.tobytes()
    assert plain1.tobytes() == plain2.tobytes()
    assert np.abs(plain1.astype(int) - want_plain.astype(int)).max() <= 1
    assert np.abs(controlled.astype(int) - plain1.astype(int)).max() > 10  # the ControlNet did something


def _with_own_constant(src: Path, out: Path, name: str) -> Path:
    """``src`` with its output multiplied by an inline constant 1.0 named ``name``: a constant the graph keeps itself
    (as the shipped graphs keep their exporter's ``val_*`` scalars), which the checkpoint does not hold."""
    from onnx import helper, numpy_helper

    model = onnx.load(str(src), load_external_data=False)
    output = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{output}_pre" if o == output else o for o in node.output]
    model.graph.node.append(helper.make_node("Mul", [f"{output}_pre", name], [output]))
    model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), name))
    onnx.save(model, str(out))
    return out


def test_the_twin_unet_gets_its_own_constants_not_the_plain_ones(tiny_twins, monkeypatch, tmp_path):
    """The file's weights are bound onto the plain UNet with that graph's own constants; the twin that takes
    residuals keeps constants of other names (the shipped sd1_unet and sd1_unet_controlnet differ in their exporter's
    val_* scalars). Moving to the twin swaps them (Part.retarget), so the run with a ControlNet binds strictly and
    gives the folder's image; until 2026-12-01 it failed with 'the weights do not fit graph sd1_unet_controlnet'."""
    from sdrt.checkpoint import files, graphs

    ck, vae, shipped = tiny_twins
    shipped = {**shipped, "sd1_unet": _with_own_constant(shipped["sd1_unet"], tmp_path / "plain.onnx", "one_plain"),
               "sd1_unet_controlnet": _with_own_constant(shipped["sd1_unet_controlnet"], tmp_path / "twin.onnx",
                                                         "one_twin")}
    monkeypatch.setattr(files, "shipped_graph", lambda name: shipped[name])
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: shipped[name])
    edges = np.load(FOLDER / "refs.npz")["edges"]
    unit = [(FOLDER / "controlnet", edges, 1.0)]
    with pipelines.load(ck, backend="reference", vae=vae, tokenizers={"tokenizer": FOLDER / "tokenizer"}) as pipe:
        plain1 = pipe.generate("a red cat", "blurry", **KW).images[0]
        controlled = pipe.generate("a red cat", "blurry", controlnets=unit, **KW).images[0]
        assert pipe.unet.path == shipped["sd1_unet_controlnet"]
        plain2 = pipe.generate("a red cat", "blurry", **KW).images[0]
    with pipelines.load(FOLDER, backend="reference") as folder:
        want_controlled = folder.generate("a red cat", "blurry", controlnets=unit, **KW).images[0]
    assert controlled.tobytes() == want_controlled.tobytes()
    assert plain1.tobytes() == plain2.tobytes()
