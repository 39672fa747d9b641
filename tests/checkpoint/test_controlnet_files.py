"""ControlNet files as people download them (LDM ``control_model.``/prefix-less and diffusers layouts) bound
onto a weight-free ControlNet graph (``sdrt.checkpoint.controlnet``).

The data is made here from the tiny ControlNet folders' own weights (scripts/gen_controlnet_refs.py made
them with diffusers): every initializer read through ``param_map`` (diffusers names), written out in
lllyasviel's LDM names (``input_blocks``, ``input_hint_block``, ``zero_convs``, ``middle_block_out``) and in
diffusers' names, each file bound onto the folder's graph *with its weights stripped* (no byte of the
folder's weights left), and run on real backends: the residuals must equal those of the folder's own ONNX
with its own weights, and a file whose zero convolution is changed must change them (so the check can fail).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import sdrt
from sdrt.checkpoint import param_map
from sdrt.checkpoint.controlnet import identify, open_controlnet
from sdrt.checkpoint.ldm import unet_to_ldm
from sdrt.errors import ModelError
from sdrt.graph.strip import strip
from sdrt.weights import stfile

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
FOLDERS = {"sd1": "tiny-sd15-controlnet", "sdxl": "tiny-sdxl-controlnet"}


def _diffusers_state(folder: str) -> dict[str, np.ndarray]:
    """The folder ControlNet's weights under diffusers' ``ControlNetModel`` names, torch layout."""
    g = sdrt.Graph.load(DATA / folder / "controlnet" / "model.onnx")
    arrays = g.initializer_arrays()
    out = {}
    for canon, slot in param_map(g).items():
        a = arrays[slot.init]
        if slot.layout == "T":
            a = a.T
        out[canon] = np.ascontiguousarray(a)
    return out


def _ldm_name(name: str, hint_convs: int) -> str:
    """diffusers ControlNetModel name -> lllyasviel's LDM name (written independently of the converter for the
    control-specific keys; the UNet encoder through ``unet_to_ldm``, the inverse ``ldm.convert_unet`` is tested
    against)."""
    if m := re.match(r"controlnet_down_blocks\.(\d+)\.(weight|bias)$", name):
        return f"zero_convs.{m[1]}.0.{m[2]}"
    if m := re.match(r"controlnet_mid_block\.(weight|bias)$", name):
        return f"middle_block_out.0.{m[1]}"
    if m := re.match(r"controlnet_cond_embedding\.(conv_in|conv_out|blocks\.(\d+))\.(weight|bias)$", name):
        idx = 0 if m[1] == "conv_in" else 2 * (hint_convs - 1) if m[1] == "conv_out" else 2 * (int(m[2]) + 1)
        return f"input_hint_block.{idx}.{m[3]}"
    ldm = unet_to_ldm(name, 1, set())  # the tiny folders: one layer per block
    assert ldm is not None, name
    return ldm


def _write(state: dict[str, np.ndarray], path, layout: str, dtype=np.float32) -> None:
    if layout == "diffusers":
        named = dict(state)
    else:
        convs = sum(1 for k in state if k.startswith("controlnet_cond_embedding.") and k.endswith(".weight"))
        prefix = "control_model." if layout == "ldm-prefixed" else ""
        named = {prefix + _ldm_name(k, convs): v for k, v in state.items()}
    stfile.write(path, {k: v.astype(dtype) for k, v in named.items()})


def _stripped(folder: str, tmp_path):
    """The folder's ControlNet graph with every weight stripped out (its weights file deleted)."""
    res = strip(sdrt.Graph.load(DATA / folder / "controlnet" / "model.onnx"), tmp_path / "g" / "cn.onnx")
    res.weights_path.unlink()
    return res.graph_path


def _feeds(folder: str, graph) -> dict[str, np.ndarray]:
    with np.load(DATA / folder / "parts.npz") as z:
        return {i.name: z[f"feed/{i.name}"] for i in graph.inputs}


@pytest.mark.parametrize("base", ["sd1", "sdxl"])
@pytest.mark.parametrize("layout", ["ldm", "ldm-prefixed", "diffusers"])
@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_bound_file_gives_the_folders_residuals(base, layout, backend, tmp_path):
    folder = FOLDERS[base]
    state = _diffusers_state(folder)
    f = tmp_path / f"control_{layout}.safetensors"
    _write(state, f, layout)
    graph = _stripped(folder, tmp_path)
    net = open_controlnet(f, base=base, graph=graph)
    assert net.ident.base == base and net.ident.layout == ("diffusers" if layout == "diffusers" else "ldm")
    own = sdrt.Graph.load(DATA / folder / "controlnet" / "model.onnx")
    feeds = _feeds(folder, own)
    shapes = {k: v.shape for k, v in feeds.items()}  # static shapes: every backend compiles these
    with sdrt.load(own.with_shapes(shapes), backend=backend) as s:
        want = s.run(feeds)
    with sdrt.load(sdrt.Graph.load(net.graph).with_shapes(shapes), weights=net.weights, backend=backend) as s:
        got = s.run(feeds)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    # the file's weights are what runs: a changed zero convolution changes that residual
    for k in ("controlnet_mid_block.weight", "controlnet_mid_block.bias"):
        state[k] = -state[k]
    f2 = tmp_path / "changed.safetensors"
    _write(state, f2, layout)
    net2 = open_controlnet(f2, base=base, graph=graph)
    with sdrt.load(sdrt.Graph.load(net2.graph).with_shapes(shapes), weights=net2.weights, backend=backend) as s:
        got2 = s.run(feeds)
    np.testing.assert_allclose(got2["mid_block_res_sample"], -want["mid_block_res_sample"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got2["down_block_res_samples_0"], want["down_block_res_samples_0"], rtol=1e-5,
                               atol=1e-5)


# -- full size: files as published, written sparse (the header and an unwritten data section: nothing is read) --
def _sparse_safetensors(path, shapes: dict[str, tuple[int, ...]], dtype: str = "F16") -> None:
    import json
    import struct

    size = {"F16": 2, "F32": 4, "BF16": 2}[dtype]
    header, offset = {}, 0
    for k, shape in shapes.items():
        n = int(np.prod(shape)) * size
        header[k] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def _published_shapes(base: str, layout: str) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a full-size ControlNet file: the shipped graph's parameters, under the file's names
    (lllyasviel's LDM names with two layers per block, or diffusers')."""
    from sdrt.checkpoint.controlnet import CONTROLNET_GRAPHS
    from sdrt.checkpoint.graphs import shipped_graph

    pm = param_map(sdrt.Graph.load(shipped_graph(CONTROLNET_GRAPHS[base])))
    attn_up: set[int] = set()
    shapes = {}
    convs = sum(1 for k in pm if k.startswith("controlnet_cond_embedding.") and k.endswith(".weight"))
    for canon, slot in pm.items():
        if layout == "diffusers":
            shapes[canon] = slot.shape
            continue
        name = _ldm_name(canon, convs) if canon.startswith("controlnet_") else unet_to_ldm(canon, 2, attn_up)
        assert name is not None, canon
        shapes[("control_model." if layout == "ldm-prefixed" else "") + name] = slot.shape
    return shapes


@pytest.mark.parametrize("base,layout", [("sd1", "ldm"), ("sd1", "ldm-prefixed"), ("sd1", "diffusers"),
                                         ("sdxl", "diffusers"), ("sdxl", "ldm")])
def test_full_size_files_bind_onto_the_shipped_graphs(base, layout, tmp_path):
    f = tmp_path / f"control_{base}_{layout}.safetensors"
    _sparse_safetensors(f, _published_shapes(base, layout))
    net = open_controlnet(f, base=base)
    assert net.base == base and net.ident.layout == ("diffusers" if layout == "diffusers" else "ldm")
    g = sdrt.Graph.load(net.graph)
    external = {t.name for t in g.model.graph.initializer if t.external_data}
    assert set(net.weights) == set(g.initializer_names)  # every initializer: the file's, and the graph's own constants
    assert all(net.weights.ref(n).source == str(f) for n in external)  # every weight from the file
    names = [i.name for i in g.inputs]
    assert names[:5] == ["sample", "timestep", "encoder_hidden_states", "controlnet_cond", "conditioning_scale"]
    assert names[5:] == (["text_embeds", "time_ids"] if base == "sdxl" else [])
    n = 12 if base == "sd1" else 9
    assert [o.name for o in g.outputs] == [f"down_block_res_samples_{i}" for i in range(n)] + ["mid_block_res_sample"]
    ref = net.weights.ref(next(iter(net.weights)))
    assert str(ref.dtype) == "float32"  # converted from the file's fp16 per tensor, when read


def test_identify_tells_sd1_from_sdxl_and_refuses_other_files():
    sd1 = identify(_published_shapes("sd1", "ldm"))
    xl = identify(_published_shapes("sdxl", "diffusers"))
    assert (sd1.base, sd1.layout, sd1.prefix) == ("sd1", "ldm", "")
    assert (xl.base, xl.layout) == ("sdxl", "diffusers")
    assert identify(_published_shapes("sd1", "ldm-prefixed")).prefix == "control_model."
    lora = identify({"lora_controlnet": (0,), "input_blocks.0.0.down": (8, 4, 3, 3)})
    assert lora.base is None and "Control-LoRA" in lora.label
    ckpt = identify({"model.diffusion_model.input_blocks.0.0.weight": (320, 4, 3, 3),
                     "cond_stage_model.transformer.text_model.final_layer_norm.weight": (768,)})
    assert ckpt.base is None and "not a ControlNet" in ckpt.label and "SD 1.x" in ckpt.label


def test_a_controlnet_for_another_base_is_one_clear_error(tmp_path):
    f = tmp_path / "controlnet-canny-sdxl-1.0.safetensors"
    _sparse_safetensors(f, _published_shapes("sdxl", "diffusers"))
    with pytest.raises(ModelError) as exc:
        open_controlnet(f, base="sd1")
    text = str(exc.value)
    assert "controlnet-canny-sdxl-1.0.safetensors is an SDXL ControlNet" in text and "the model is SD 1.x" in text
    assert "control_v11p_sd15_canny" in text and exc.value.where == str(f)


def test_a_file_of_another_size_or_kind_is_refused(tmp_path):
    shapes = _published_shapes("sdxl", "diffusers")
    # diffusers/controlnet-canny-sdxl-1.0-small style: fewer transformer layers than the shipped graph
    small = {k: v for k, v in shapes.items() if not re.match(r"(down_blocks\.2|mid_block)\.attentions\.\d+\."
                                                             r"transformer_blocks\.[1-9]", k)}
    f = tmp_path / "controlnet-canny-sdxl-1.0-small.safetensors"
    _sparse_safetensors(f, small)
    with pytest.raises(ModelError, match="of another size than the shipped SDXL ControlNet graph"):
        open_controlnet(f)
    g = tmp_path / "not_a_controlnet.safetensors"
    _sparse_safetensors(g, {"model.diffusion_model.input_blocks.0.0.weight": (320, 4, 3, 3)})
    with pytest.raises(ModelError, match="not_a_controlnet.safetensors is not a ControlNet"):
        open_controlnet(g)


# -- through the pipeline -----------------------------------------------------------------------
def _fast_backend(registry) -> str:
    return "openvino" if "openvino" in registry.backends else "reference"


@pytest.mark.parametrize("base", ["sd1", "sdxl"])
def test_pipeline_with_a_controlnet_file_gives_diffusers_image(base, tmp_path, backends):
    """The folder's first diffusers case (scripts/gen_controlnet_refs.py) with its ControlNet given as an LDM
    file (fp16 for SD 1.x) bound onto the stripped graph: within 2 levels of diffusers'
    StableDiffusion(XL)ControlNetPipeline."""
    import json

    from sdrt import pipelines

    folder = FOLDERS[base]
    f = tmp_path / "control_tiny.safetensors"
    _write(_diffusers_state(folder), f, "ldm", np.float16 if base == "sd1" else np.float32)
    net = open_controlnet(f, graph=_stripped(folder, tmp_path))
    case = json.loads((DATA / folder / "refs.json").read_text())[0]
    z = np.load(DATA / folder / "refs.npz")
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
              height=case["height"])
    with pipelines.load(DATA / folder, backend=_fast_backend(backends)) as pipe:
        gen = pipe.generate(case["prompt"], case["negative_prompt"],
                            controlnets=[(net, z[case["control_images"][0]], case["scale"][0])], **kw)
        assert "controlnet:control_tiny" in pipe.control_parts
    d = np.abs(gen.images[0].astype(int) - z[case["name"]][0].astype(int))
    # the SD 1.x file is fp16 (bound per tensor to the graph's float32): measured max 1 level; SDXL's fp32: 0
    assert d.max() <= 2, d.max()
    assert "Model: control_tiny" in gen.settings[0]["ControlNet 0"]


def test_pipeline_refuses_a_controlnet_file_for_another_base_or_size(tmp_path, backends):
    from sdrt import pipelines

    xl = tmp_path / "controlnet-canny-sdxl-1.0.safetensors"
    _sparse_safetensors(xl, _published_shapes("sdxl", "diffusers"))
    sd1 = tmp_path / "control_v11p_sd15_canny.safetensors"
    _sparse_safetensors(sd1, _published_shapes("sd1", "ldm"))
    image = np.zeros((64, 64, 3), np.uint8)
    with pipelines.load(DATA / FOLDERS["sd1"], backend=_fast_backend(backends)) as pipe:
        with pytest.raises(ModelError) as exc:
            pipe.plan("a cat", steps=2, controlnets=[(str(xl), image)])
        text = str(exc.value)
        assert "controlnet-canny-sdxl-1.0.safetensors is an SDXL ControlNet (diffusers layout), and the model is " \
               "SD 1.x" in text and "controlnets[0]" in text and "controlnets=[(FILE, image)]" in text
        assert "--controlnet" not in text  # the API's words alone (it named the flag and the argument)
        # the right base at full size on the tiny UNet: refused before anything compiles
        with pytest.raises(ModelError, match="gives 12 down residuals and the unet takes 4"):
            pipe.plan("a cat", steps=2, controlnets=[(str(sd1), image)])


@pytest.mark.parametrize("layout", ["ldm", "diffusers"])
def test_a_controlnet_given_as_the_model_says_so(layout, tmp_path):
    from sdrt.checkpoint import open_single_file

    f = tmp_path / "control_v11p_sd15_canny.safetensors"
    _sparse_safetensors(f, _published_shapes("sd1", layout))
    with pytest.raises(ModelError, match=r"looks like a ControlNet .*controlnets=\[\(FILE, image\)\]") as e:
        open_single_file(f)
    assert "--controlnet" not in str(e.value)  # the API's words alone


def test_cli_controlnet_file_and_diffusers_folder(tmp_path, capsys, backends):
    """``--controlnet FILE`` and a diffusers ControlNet folder (diffusion_pytorch_model.safetensors, no model.onnx)
    reach the binding; an SDXL one on an SD 1.x model is one line naming the file, no traceback."""
    from sdrt.cli import main
    from sdrt.pipelines.png import write_png

    png = tmp_path / "edges.png"
    write_png(png, np.zeros((64, 64, 3), np.uint8))
    folder = tmp_path / "controlnet-canny-sdxl-1.0"
    folder.mkdir()
    _sparse_safetensors(folder / "diffusion_pytorch_model.fp16.safetensors", _published_shapes("sdxl", "diffusers"))
    loose = tmp_path / "sdxl_canny.safetensors"
    _sparse_safetensors(loose, _published_shapes("sdxl", "ldm"))
    for net, name in ((folder, "diffusion_pytorch_model.fp16.safetensors"), (loose, "sdxl_canny.safetensors")):
        rc = main(["generate", str(DATA / FOLDERS["sd1"]), "a cat", "--dry-run", "--backend", _fast_backend(backends),
                   "--controlnet", str(net), "--control-image", str(png)])
        err = capsys.readouterr().err
        assert rc != 0 and "Traceback" not in err, err
        assert f"{name} is an SDXL ControlNet" in err and "the model is SD 1.x" in err and "--controlnet FILE" in err
        # in the flag's words, not the API's "Where: controlnets[0] (...)"
        assert "controlnets[" not in err and "Where: --controlnet (" in err, err
    rc = main(["generate", str(DATA / FOLDERS["sd1"]), "a cat", "--dry-run", "--backend", _fast_backend(backends),
               "--controlnet", str(loose), "--control-image", str(png), "--controlnet", str(loose),
               "--control-image", str(png)])
    err = capsys.readouterr().err
    assert rc != 0 and "Where: the 1st --controlnet (" in err and "controlnets[" not in err, err


def test_a_single_file_unet_binds_onto_the_shipped_unet_with_residual_inputs(tmp_path):
    """A full-size SD 1.x checkpoint (UNet in LDM keys, written sparse) onto ``sd1_unet_controlnet``: the
    shipped UNet with the residual inputs a shipped ControlNet graph's outputs feed."""
    from sdrt.checkpoint import open_single_file
    from sdrt.checkpoint.controlnet import CONTROLNET_GRAPHS, CONTROLNET_UNET_GRAPHS
    from sdrt.checkpoint.graphs import shipped_graph
    from sdrt.checkpoint.ldm import unet_ldm_layout

    for base, name in CONTROLNET_UNET_GRAPHS.items():
        graph = sdrt.Graph.load(shipped_graph(name))
        pm = param_map(graph)
        lpb, attn_up = unet_ldm_layout(pm)
        f = tmp_path / f"{base}.safetensors"
        _sparse_safetensors(f, {"model.diffusion_model." + unet_to_ldm(k, lpb, attn_up): s.shape for k, s in pm.items()})
        m = open_single_file(f, parts=["unet"], graph_paths={"unet": shipped_graph(name)})
        assert m.family == base
        path, weights = m.parts["unet"]
        assert set(weights) == set(graph.initializer_names)  # the file's weights and the graph's own constants
        assert all(weights.ref(t.name).source == str(f) for t in graph.model.graph.initializer if t.external_data)
        net = sdrt.Graph.load(shipped_graph(CONTROLNET_GRAPHS[base]))
        takes = [i.name for i in graph.inputs if "additional_residual" in i.name]
        gives = [o.name.replace("down_block_res_samples_", "down_block_additional_residual_")
                 .replace("mid_block_res_sample", "mid_block_additional_residual") for o in net.outputs]
        assert takes == gives
        channels = {o.name: o.shape[1] for o in net.outputs}
        assert [i.shape[1] for i in graph.inputs if "additional_residual" in i.name] == list(channels.values())
