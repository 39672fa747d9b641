"""Stability AI's Control-LoRA on an SDXL pipeline: the ControlNet is built from the model's own UNet plus the
file's up @ down differences and full tensors, and bound onto the SDXL ControlNet graph.

The file (``tiny-sdxl-controlnet/controllora/``, made by scripts/gen_controllora_refs.py) is in the real files' key
naming for tiny-sdxl-controlnet's UNet; the reference image is diffusers' StableDiffusionXLControlNetPipeline with
the ControlNet merged in torch by the published rule. The shipped SDXL ControlNet graph is full size, so sdrt's
graph lookup is pointed at the folder's ControlNet graph stripped of its weights (as sdrt ships graphs): every
weight comes from the Control-LoRA and the UNet.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h

from sdrt import pipelines
from sdrt.checkpoint.controlnet import identify, open_controlnet
from sdrt.errors import SdrtError
from sdrt.pipelines import ControlNet
from sdrt.weights.stfile import read_header

FOLDER = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sdxl-controlnet"
DATA = FOLDER / "controllora"
CASE = json.loads((DATA / "refs.json").read_text())
FILE = DATA / CASE["file"]


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return h.stripped(FOLDER, ["controlnet"], tmp_path_factory.mktemp("cl"))["controlnet"]


@pytest.fixture()
def shipped(graph, monkeypatch):
    from sdrt.checkpoint import controlnet

    monkeypatch.setattr(controlnet, "shipped_graph", lambda name: graph if name == "sdxl_controlnet" else None)


def _run(backend: str, unit) -> np.ndarray:
    with pipelines.load(FOLDER, backend=backend) as pipe:
        return pipe.generate(CASE["prompt"], CASE["negative_prompt"], steps=CASE["steps"], cfg=CASE["cfg"],
                             sampler=CASE["sampler"], seed=CASE["seed"], width=CASE["width"], height=CASE["height"],
                             controlnets=[unit]).images[0]


def test_identify_an_sdxl_control_lora():
    entries, _ = read_header(FILE)
    ident = identify({k: tuple(e.shape) for k, e in entries.items()})
    assert (ident.base, ident.layout) == ("sdxl", "controllora") and "Control-LoRA" in ident.label


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_control_lora_matches_diffusers(shipped, backend):
    if backend != "reference":
        pytest.importorskip(f"sdrt_{backend}")
    refs = np.load(DATA / "refs.npz")
    img = np.asarray(_run(backend, ControlNet(FILE, refs["edges"], CASE["scale"][0])))
    diff = np.abs(img.astype(int) - refs["image"].astype(int))
    assert diff.max() <= 1, (backend, diff.max(), diff.mean())


def test_control_lora_without_the_model_is_one_clear_error(shipped):
    with pytest.raises(SdrtError, match="built from the SDXL model's own UNet"):
        open_controlnet(FILE, base="sdxl")


def test_an_sd1_control_lora_is_refused_in_one_line(tmp_path):
    from safetensors.numpy import save_file

    f = tmp_path / "control-lora-sd15.safetensors"
    save_file({"lora_controlnet": np.zeros(0, np.float32), "input_blocks.1.0.in_layers.2.up": np.zeros((4, 2, 1, 1),
               np.float32), "input_blocks.1.0.in_layers.2.down": np.zeros((2, 4, 3, 3), np.float32)}, str(f))
    with pytest.raises(SdrtError) as err:
        open_controlnet(f, base="sdxl")
    assert "SD 1.x Control-LoRA" in str(err.value) and "\n" not in err.value.what


def test_cli_controlnet_flag_runs_a_control_lora(shipped, tmp_path, capsys):
    from PIL import Image

    from sdrt.cli import main

    refs = np.load(DATA / "refs.npz")
    png, out = tmp_path / "edges.png", tmp_path / "out.png"
    Image.fromarray(refs["edges"]).save(png)
    rc = main(["generate", str(FOLDER), CASE["prompt"], "--negative", CASE["negative_prompt"], "--steps",
               str(CASE["steps"]), "--cfg", str(CASE["cfg"]), "--seed", str(CASE["seed"]), "--sampler", CASE["sampler"],
               "--width", "64", "--height", "64", "--backend", "reference", "-o", str(out),
               "--controlnet", str(FILE), "--control-image", str(png), "--control-scale", str(CASE["scale"][0])])
    assert rc == 0, capsys.readouterr().err
    with Image.open(out) as img:
        diff = np.abs(np.asarray(img.convert("RGB")).astype(int) - refs["image"].astype(int))
    assert diff.max() <= 1, diff.max()


def test_a_grey_hint_convolution_takes_rgb_as_its_grey(tmp_path):
    """A one-channel ``input_hint_block.0`` (a grey control map) spread over RGB gives the same output for R = G = B."""
    from sdrt.checkpoint.controllora import BASE, widen_hint
    from sdrt.checkpoint.ldm import Source
    from sdrt.weights import Weights

    rng = np.random.default_rng(0)
    k = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    w = Weights.from_arrays({"input_hint_block.0.weight": k})
    srcs = {"controlnet_cond_embedding.conv_in.weight": Source("input_hint_block.0.weight")}
    wide = widen_hint(w, srcs)
    k3 = wide[srcs["controlnet_cond_embedding.conv_in.weight"].key]
    assert srcs["controlnet_cond_embedding.conv_in.weight"].key.startswith(BASE) and k3.shape == (16, 3, 3, 3)
    patch = rng.random((3, 3)).astype(np.float32)
    grey = np.einsum("oij,ij->o", k[:, 0], patch)
    rgb = np.einsum("ocij,cij->o", k3, np.stack([patch] * 3))
    np.testing.assert_allclose(rgb, grey, rtol=1e-5, atol=1e-5)


def test_an_sdxl_control_lora_on_an_sd1_model_is_one_clear_error():
    sd15 = FOLDER.parent / "tiny-sd15-controlnet"
    refs = np.load(DATA / "refs.npz")
    with pipelines.load(sd15, backend="reference") as pipe:
        with pytest.raises(SdrtError) as err:
            pipe.generate("a cat", steps=1, width=64, height=64, controlnets=[ControlNet(FILE, refs["edges"])])
    msg = str(err.value)
    assert "SDXL Control-LoRA" in msg and "the model is SD 1.x" in msg and "\n" not in msg, msg


def test_a_control_lora_given_as_the_model_says_where_it_goes(capsys):
    from sdrt.cli import main

    assert main(["generate", str(FILE), "a cat", "--backend", "reference"]) != 0
    err = capsys.readouterr().err
    assert "SDXL Control-LoRA" in err and "--controlnet FILE" in err and "not a model" in err, err
    assert err.count("error:") == 1 and "Traceback" not in err


def _xl_tensors() -> dict:
    """tiny-sdxl-controlnet's own weights as one LDM single file (UNet, both text encoders, VAE)."""
    from sdrt.graph import Graph

    def g(part: str) -> Graph:
        return Graph.load(FOLDER / part / "model.onnx")

    return {**h.unet_tensors(g("unet")), **h.clip_tensors(g("text_encoder"), "conditioner.embedders.0.transformer."),
            **h.openclip_tensors(g("text_encoder_2"), "conditioner.embedders.1.model."),
            **h.vae_tensors(g("vae_decoder"), g("vae_encoder"), "first_stage_model.")}


def test_control_lora_on_a_single_file_checkpoint_matches_diffusers(shipped, tmp_path):
    """The base UNet a single-file checkpoint's (its tensors bound onto a weight-free UNet graph, as sdrt's shipped
    ones): the folder's weights as one file give diffusers' image."""
    ckpt = h.write(tmp_path / "tiny-sdxl.safetensors", _xl_tensors())
    graphs = h.stripped(FOLDER, ["unet", "text_encoder", "text_encoder_2", "vae_decoder", "vae_encoder"],
                        tmp_path / "g")
    refs = np.load(DATA / "refs.npz")
    with pipelines.load(ckpt, backend="reference", graph_paths=graphs,
                        tokenizers={"tokenizer": FOLDER / "tokenizer", "tokenizer_2": FOLDER / "tokenizer_2"}) as pipe:
        assert pipe.denoiser.default_weights is not None  # the checkpoint's, bound onto the weight-free graph
        img = pipe.generate(CASE["prompt"], CASE["negative_prompt"], steps=CASE["steps"], cfg=CASE["cfg"],
                            sampler=CASE["sampler"], seed=CASE["seed"], width=64, height=64,
                            controlnets=[ControlNet(FILE, refs["edges"], CASE["scale"][0])]).images[0]
    diff = np.abs(np.asarray(img).astype(int) - refs["image"].astype(int))
    assert diff.max() <= 1, (diff.max(), diff.mean())


def test_the_controlnet_is_rebuilt_from_a_checkpoint_bound_with_load_weights(shipped, graph, tmp_path):
    """After ``load_weights`` (the folder's UNet written as an LDM checkpoint, one convolution changed), the
    Control-LoRA's UNet copy is the checkpoint's UNet plus up @ down (numpy here), not the folder's."""
    from sdrt.checkpoint.onnxmap import param_map
    from sdrt.graph import Graph
    from sdrt.weights import Weights

    mod = "input_blocks.1.0.in_layers.2"
    tensors = _xl_tensors()
    tensors[f"model.diffusion_model.{mod}.weight"] = tensors[f"model.diffusion_model.{mod}.weight"] + 0.25
    ckpt = h.write(tmp_path / "changed.safetensors", tensors)
    lora, ck = Weights.open(FILE), Weights.open(ckpt)
    up, down = lora[f"{mod}.up"], lora[f"{mod}.down"]
    delta = (up.reshape(up.shape[0], -1) @ down.reshape(down.shape[0], -1)).reshape(down.shape[:0] + (up.shape[0],)
                                                                                     + down.shape[1:])
    init = param_map(Graph.load(graph, load_external=False))["down_blocks.0.resnets.0.conv1.weight"].init
    edges = np.load(DATA / "refs.npz")["edges"]
    kw = dict(steps=1, width=64, height=64, controlnets=[ControlNet(FILE, edges)])
    with pipelines.load(FOLDER, backend="reference") as pipe:
        pipe.generate("a cat", **kw)
        (first,) = pipe.control_parts.values()
        folder_w = np.asarray(first.weights[init])
        pipe.load_weights(ckpt)
        pipe.generate("a cat", **kw)
        (part,) = pipe.control_parts.values()
        assert part is not first
        got = np.asarray(part.weights[init])
    want = np.asarray(ck[f"model.diffusion_model.{mod}.weight"], np.float32) + delta
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(folder_w - want).max() > 1e-3


def test_a_full_size_rank128_file_binds_onto_the_shipped_sdxl_graphs(tmp_path):
    """A full-size control-lora-canny-rank128 file (the key names and shapes scripts/gen_controllora_refs.py lists
    from SDXL's UNet config; written sparse, a header and an unwritten data section) on the shipped SDXL UNet graph
    binds onto the shipped SDXL ControlNet graph: every initializer, merged weights of the graph's shapes."""
    from test_controlnet_files import _sparse_safetensors

    from sdrt.checkpoint import shipped_graph
    from sdrt.graph import Graph
    from sdrt.weights import TensorRef, Weights

    keys = {k: tuple(v) for k, v in json.loads((DATA / "full_size_rank128_keys.json").read_text()).items()}
    f = tmp_path / "control-lora-canny-rank128.safetensors"
    _sparse_safetensors(f, keys)
    assert identify(keys).base == "sdxl"
    unet = Graph.load(shipped_graph("sdxl_unet"), load_external=False)
    info = unet.initializer_info()
    zeros = Weights({n: TensorRef(n, np.dtype(np.float16), tuple(i.shape), "unet",
                                  (lambda s=tuple(i.shape): np.zeros(s, np.float16))) for n, i in info.items()})
    opened = open_controlnet(f, base="sdxl", unet=lambda: (unet, zeros))
    cn = Graph.load(opened.graph, load_external=False)
    assert set(cn.initializer_names) <= set(opened.weights)
    name = next(n for n in opened.weights if "ff.net.0.proj.weight" in n or n.startswith("onnx::MatMul"))
    ref = opened.weights.ref(name)
    assert np.asarray(opened.weights[name]).shape == tuple(ref.shape)


def test_a_weight_held_in_full_beside_its_pair_is_the_base_of_the_pair():
    """As ComfyUI: the file's tensors are set over the UNet's, and the layer adds up @ down to its weight."""
    from sdrt.checkpoint.controllora import sources
    from sdrt.checkpoint.ldm import Source
    from sdrt.weights import Weights

    rng = np.random.default_rng(1)
    full, up, down = (rng.standard_normal(s).astype(np.float32) for s in ((6, 5), (6, 2), (2, 5)))
    w = Weights.from_arrays({"lora_controlnet": np.zeros(0, np.float32), "m.weight": full, "m.up": up, "m.down": down,
                             "n.up": up, "n.down": down})
    unet = rng.standard_normal((6, 5)).astype(np.float32)
    bound, srcs, _ = sources(w, {}, lambda name, shape: unet, "f",
                             lambda keys: ({f"x.{k}": Source(k) for k in keys}, []))
    np.testing.assert_allclose(bound[srcs["x.m.weight"].key], full + up @ down, rtol=1e-6)
    np.testing.assert_allclose(bound[srcs["x.n.weight"].key], unet + up @ down, rtol=1e-6)


def test_the_controlnet_copy_takes_the_unet_with_its_active_loras(shipped, graph, tmp_path):
    """As ComfyUI (``ControlLora.pre_run`` copies ``diffusion_model.state_dict()`` after the model's LoRA patches are
    applied) and the A1111 extension (``bind_control_lora`` binds the live UNet modules): the Control-LoRA's UNet copy
    is the UNet with the active LoRAs merged, plus up @ down; removing the LoRA makes it the plain one again."""
    from safetensors.numpy import save_file

    from sdrt.checkpoint.onnxmap import param_map
    from sdrt.graph import Graph
    from sdrt.weights import Weights

    mod = "input_blocks.1.0.in_layers.2"
    lora, unet = Weights.open(FILE), _xl_tensors()
    base = np.asarray(unet[f"model.diffusion_model.{mod}.weight"], np.float32)
    up, down = lora[f"{mod}.up"], lora[f"{mod}.down"]
    delta = (up.reshape(up.shape[0], -1) @ down.reshape(down.shape[0], -1)).reshape(base.shape)
    rng = np.random.default_rng(3)
    kup = rng.standard_normal((base.shape[0], 2, 1, 1)).astype(np.float32)
    kdown = rng.standard_normal((2,) + base.shape[1:]).astype(np.float32)
    kohya = tmp_path / "style.safetensors"  # kohya's naming, alpha = rank: the delta is scale * up @ down
    key = "lora_unet_" + mod.replace(".", "_")
    save_file({f"{key}.lora_up.weight": kup, f"{key}.lora_down.weight": kdown,
               f"{key}.alpha": np.asarray(2.0, np.float32)}, str(kohya))
    style = 0.5 * (kup.reshape(kup.shape[0], -1) @ kdown.reshape(2, -1)).reshape(base.shape)
    init = param_map(Graph.load(graph, load_external=False))["down_blocks.0.resnets.0.conv1.weight"].init
    kw = dict(steps=1, width=64, height=64, controlnets=[ControlNet(FILE, np.load(DATA / "refs.npz")["edges"])])
    with pipelines.load(FOLDER, backend="reference") as pipe:
        pipe.set_loras([(kohya, 0.5)])
        pipe.generate("a cat", **kw)
        (part,) = pipe.control_parts.values()
        np.testing.assert_allclose(np.asarray(part.weights[init]), base + style + delta, rtol=1e-5, atol=1e-5)
        pipe.set_loras([])
        pipe.generate("a cat", **kw)
        (plain,) = pipe.control_parts.values()
        assert plain is not part
        np.testing.assert_allclose(np.asarray(plain.weights[init]), base + delta, rtol=1e-5, atol=1e-5)
