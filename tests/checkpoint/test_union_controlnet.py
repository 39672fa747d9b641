"""xinsir's SDXL ControlNet Union (diffusers' ``ControlNetUnionModel``) bound onto sdrt's shipped union graph.

Data: tests/data/pipelines/union/, written by scripts/gen_union_refs.py with diffusers: the full-size key names and
shapes (6 and 8 control types, from ``ControlNetUnionModel`` at xinsir's config on the meta device), a tiny union net
(its ``diffusion_pytorch_model.safetensors`` and a weight-free ONNX export with sdrt's union inputs) on the tiny
SDXL pipeline of tiny-sdxl-controlnet, and diffusers' ``StableDiffusionXLControlNetUnionPipeline`` images.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_controlnet_files import _sparse_safetensors

import sdrt
from sdrt.checkpoint.controlnet import identify, names_union, open_controlnet
from sdrt.checkpoint.unioncontrolnet import from_preprocessor, resize_types, type_index
from sdrt.errors import InputError, ModelError

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
UNION = DATA / "union"
FOLDER = DATA / "tiny-sdxl-controlnet"


def _full(types: int) -> dict[str, tuple[int, ...]]:
    keys = json.loads((UNION / "full_size_keys.json").read_text())[str(types)]
    return {k: tuple(v) for k, v in keys.items()}


@pytest.mark.parametrize("types", [6, 8])
def test_full_size_union_files_bind_onto_the_shipped_graph(types, tmp_path):
    f = tmp_path / ("diffusion_pytorch_model_promax.safetensors" if types == 8 else "diffusion_pytorch_model.safetensors")
    _sparse_safetensors(f, _full(types))
    ident = identify(_full(types))
    assert (ident.base, ident.layout, ident.union) == ("sdxl", "diffusers", types)
    assert f"ControlNet Union ({types} control types)" in ident.label
    net = open_controlnet(f, base="sdxl")
    g = sdrt.Graph.load(net.graph)
    external = {t.name for t in g.model.graph.initializer if t.external_data}
    assert set(net.weights) == set(g.initializer_names)
    assert all(net.weights.ref(n).source == str(f) for n in external)  # every weight from the file
    assert {k for k in _full(types)} <= external  # and every tensor of the file is used
    inputs = {i.name: i for i in g.inputs}
    assert list(inputs)[-2:] == ["control_type", "control_type_idx"]
    assert inputs["control_type"].shape[1] == types
    assert [o.name for o in g.outputs][-1] == "mid_block_res_sample" and len(g.outputs) == 10
    # the graph's shapes infer at its type count (the 6-type graph derived: its embeddings' reshape resized too)
    pinned = g.with_shapes({"sample": (2, 4, 128, 128), "encoder_hidden_states": (2, 77, 2048),
                            "controlnet_cond": (2, 3, 1024, 1024), "text_embeds": (2, 1280), "time_ids": (2, 6),
                            "control_type": (2, types)})
    assert pinned.outputs[-1].shape == [2, 1280, 32, 32] or tuple(pinned.outputs[-1].shape) == (2, 1280, 32, 32)


def test_a_plain_sdxl_controlnet_is_no_union_and_a_cut_union_is_refused(tmp_path):
    shapes = _full(8)
    plain = {k: v for k, v in shapes.items() if not k.startswith(("task_embedding", "transformer_layes",
                                                                  "spatial_ch_projs", "control_add_embedding"))}
    assert identify(plain).union == 0
    _sparse_safetensors(tmp_path / "plain.safetensors", plain)
    _sparse_safetensors(tmp_path / "union.safetensors", shapes)
    assert not names_union(tmp_path / "plain.safetensors") and names_union(tmp_path / "union.safetensors")
    assert names_union(UNION / "model.onnx") and names_union(UNION)  # the graph's control_type input; the folder
    cut = {k: v for k, v in shapes.items() if not k.startswith("transformer_layes")}
    f = tmp_path / "union_cut.safetensors"
    _sparse_safetensors(f, cut)
    with pytest.raises(ModelError, match="of another size than the shipped SDXL ControlNet graph .the architecture of "
                                         "xinsir/controlnet-union-sdxl-1.0"):
        open_controlnet(f)


def test_control_types_by_index_name_or_preprocessor():
    assert type_index(3, 8, "none", "u", "union_mode") == 3
    assert type_index("depth", 8, "none", "u", "union_mode") == 1
    assert type_index("Lineart", 8, "none", "u", "union_mode") == 3
    assert type_index("repaint", 8, "none", "u", "union_mode") == 7
    assert type_index(None, 8, "canny", "u", "union_mode") == 3
    assert type_index(None, 8, "depth_midas", "u", "union_mode") == 1
    assert type_index(None, 8, "dw_openpose_full", "u", "union_mode") == 0
    assert type_index(None, 8, "softedge_pidinet", "u", "union_mode") == 2
    assert type_index(None, 8, "tile_resample", "u", "union_mode") == 6
    assert from_preprocessor("none") is None and from_preprocessor("shuffle") is None
    with pytest.raises(InputError, match="its preprocessor 'none' does not tell which control type") as exc:
        type_index(None, 8, "none", "controlnets[0]", "{@union_mode}")
    assert "0 openpose, 1 depth" in exc.value.fix
    with pytest.raises(InputError, match="'sketchy' is no control type"):
        type_index("sketchy", 8, "none", "u", "union_mode")
    with pytest.raises(InputError, match="7 is not one of the net's 6 control types"):
        type_index(7, 6, "none", "u", "union_mode")
    with pytest.raises(InputError, match="is not one of the net's 6 control types"):
        type_index(None, 6, "inpaint_only", "u", "union_mode")


def _stripped(tmp_path) -> Path:
    """The tiny net's weight-free graph (written as the shipped graphs are: no weight in it)."""
    return UNION / "model.onnx"


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_the_tiny_union_file_gives_diffusers_residuals(backend, tmp_path, backends):
    net = open_controlnet(UNION / "diffusion_pytorch_model.safetensors", graph=_stripped(tmp_path))
    assert net.ident.union == 8
    with np.load(UNION / "parts.npz") as z:
        feeds = {k[5:]: z[k] for k in z.files if k.startswith("feed/")}
        want = {k[4:]: z[k] for k in z.files if k.startswith("out/")}
    g = sdrt.Graph.load(net.graph).with_shapes({k: v.shape for k, v in feeds.items()})
    with sdrt.load(g, weights=net.weights, backend=backend) as s:
        got = s.run(feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4, err_msg=k)
        other = s.run({**feeds, "control_type_idx": np.array([1], np.int64),
                       "control_type": np.eye(8, dtype=np.float32)[[1, 1]]})
    assert np.abs(other["mid_block_res_sample"] - want["mid_block_res_sample"]).max() > 1e-3  # the type matters


@pytest.mark.parametrize("backend", ["reference", "openvino"])
def test_a_six_type_net_on_the_derived_graph_gives_diffusers_residuals(backend, tmp_path, backends):
    """xinsir's first release has 6 control types: sdrt derives its graph from the 8-type one (resize_types, as for
    the shipped graph); the tiny 6-type net's residuals against diffusers' (scripts/gen_union_refs.py six)."""
    import onnx

    model = onnx.load(str(UNION / "model.onnx"), load_external_data=False)
    resize_types(model, 6)
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    net = open_controlnet(UNION / "six" / "diffusion_pytorch_model.safetensors", graph=tmp_path / "model.onnx")
    assert net.ident.union == 6
    with np.load(UNION / "parts.npz") as z, np.load(UNION / "six" / "parts.npz") as six:
        feeds = {k[5:]: z[k] for k in z.files if k.startswith("feed/")}
        feeds.update({k[5:]: six[k] for k in six.files if k.startswith("feed/")})
        want = {k[4:]: six[k] for k in six.files if k.startswith("out/")}
    feeds["control_type_idx"] = feeds["control_type_idx"].astype(np.int64)
    g = sdrt.Graph.load(net.graph).with_shapes({k: v.shape for k, v in feeds.items()})
    with sdrt.load(g, weights=net.weights, backend=backend) as s:
        got = s.run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4, err_msg=k)


def _fast_backend(registry) -> str:
    return "openvino" if "openvino" in registry.backends else "reference"


@pytest.mark.parametrize("case,mode,backend", [(0, "Lineart", "reference"), (0, "canny", "openvino"), (0, "canny", "ggml"),
                                               (1, 3, "openvino"), (2, "depth", "openvino")])
def test_pipeline_with_the_union_file_gives_diffusers_image(case, mode, backend, tmp_path, backends):
    """diffusers' StableDiffusionXLControlNetUnionPipeline (control_mode=[3] at scale 1 and 0.5, [1] at 1) on the tiny
    SDXL folder: the union file bound onto its graph, the type by name or index, within 1 level."""
    from sdrt import pipelines
    from sdrt.pipelines import ControlNet

    c = json.loads((UNION / "refs.json").read_text())[case]
    prompt = json.loads((FOLDER / "refs.json").read_text())[0]
    z = np.load(UNION / "refs.npz")
    net = open_controlnet(UNION / "diffusion_pytorch_model.safetensors", graph=_stripped(tmp_path))
    if backend not in backends.backends:
        pytest.skip(f"the {backend} plugin is not installed")
    with pipelines.load(FOLDER, backend=backend) as pipe:
        gen = pipe.generate(prompt["prompt"], prompt["negative_prompt"],
                            controlnets=[ControlNet(net, z["edges"], c["scale"], union_mode=mode)], steps=8, cfg=7.0,
                            sampler="Euler", seed=c["seed"], width=64, height=64)
    d = np.abs(gen.images[0].astype(int) - z[c["name"]][0].astype(int))
    assert d.max() <= 1, d.max()
    assert f"Union Mode: {c['mode']}" in gen.settings[0]["ControlNet 0"]  # the number, however it was asked


def test_pipeline_refuses_a_union_unit_it_cannot_type(tmp_path, backends):
    from sdrt import pipelines

    net = open_controlnet(UNION / "diffusion_pytorch_model.safetensors", graph=_stripped(tmp_path))
    image = np.zeros((64, 64, 3), np.uint8)
    with pipelines.load(FOLDER, backend=_fast_backend(backends)) as pipe:
        with pytest.raises(InputError) as exc:
            pipe.plan("a cat", steps=2, controlnets=[(net, image)])
        assert "controlnets[0] is a ControlNet Union" in str(exc.value) and "union_mode" in str(exc.value)
        with pytest.raises(InputError, match="'sketchy' is no control type"):
            pipe.plan("a cat", steps=2, controlnets=[pipelines.ControlNet(net, image, union_mode="sketchy")])
        pipe.plan("a cat", steps=2, controlnets=[pipelines.ControlNet(net, image, preprocessor="canny")])  # told


def test_cli_union_mode_by_name_and_the_missing_type_in_flags(tmp_path, capsys, backends):
    """``--control-union-mode canny`` names the type; without it (and a preprocessor that does not tell) the one line
    asks for the flag. The full-size file on the tiny SDXL folder: typed, then refused for its size (residual count)."""
    from sdrt.cli import main
    from sdrt.pipelines.png import write_png

    f = tmp_path / "diffusion_pytorch_model_promax.safetensors"
    _sparse_safetensors(f, _full(8))
    png = tmp_path / "edges.png"
    write_png(png, np.zeros((64, 64, 3), np.uint8))
    base = ["generate", str(FOLDER), "a cat", "--steps", "1", "--controlnet", str(f), "--control-image", str(png),
            "--backend", _fast_backend(backends), "-o", str(tmp_path / "x.png")]
    assert main(base) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --controlnet is a ControlNet Union, and its preprocessor 'none' does not tell"), err
    assert "What to do: pass --control-union-mode (0 openpose, 1 depth, 2 softedge, 3 canny" in err[-1]
    assert not any(line.startswith(" ") or "Traceback" in line for line in err)
    for mode in ("canny", "3"):
        assert main([*base, "--control-union-mode", mode]) == 1
        err = capsys.readouterr().err
        assert "ControlNet Union" not in err and "down residuals" in err, err  # typed; then the size mismatch
    assert main([*base, "--control-union-mode", "sketchy"]) == 1
    err = capsys.readouterr().err
    assert "--control-union-mode 'sketchy' is no control type" in err and "3 canny" in err, err
    assert main([*base, "--control-union-mode", "a b"]) == 1
    assert "must be a mode number (0, 1, ...) or a control type's name" in capsys.readouterr().err


def test_two_union_units_with_cfg_1_and_guess_mode(tmp_path, backends):
    """Each unit its own type (its own one-hot, at the rows the net runs: CFG 1, guess mode's cond rows)."""
    from sdrt import pipelines
    from sdrt.pipelines import ControlNet

    z = np.load(UNION / "refs.npz")
    net = open_controlnet(UNION / "diffusion_pytorch_model.safetensors", graph=_stripped(tmp_path))
    units = [ControlNet(net, z["edges"], 0.7, union_mode="canny"),
             ControlNet(net, z["edges"], 0.5, union_mode="depth", guess_mode=True)]
    with pipelines.load(FOLDER, backend=_fast_backend(backends)) as pipe:
        one = pipe.generate("a cat", controlnets=units, steps=2, cfg=1.0, sampler="Euler", seed=3, width=64, height=64)
        seven = pipe.generate("a cat", controlnets=units, steps=2, cfg=7.0, sampler="Euler", seed=3, width=64,
                              height=64)
        canny = pipe.generate("a cat", controlnets=units[:1], steps=2, cfg=7.0, sampler="Euler", seed=3, width=64,
                              height=64)
    assert one.images[0].shape == seven.images[0].shape == (64, 64, 3)
    assert np.abs(seven.images[0].astype(int) - canny.images[0].astype(int)).max() > 1  # the depth unit counts
    info = seven.settings[0]
    assert "Union Mode: 3" in info["ControlNet 0"] and "Union Mode: 1" in info["ControlNet 1"], info
