"""A UNet or transformer in diffusers' own names given as one file (the ``unet/`` or ``transformer/`` file of a
diffusers folder on its own, SDXL-Lightning's ``sdxl_lightning_4step_unet.safetensors``, diffusers-format
finetunes; ComfyUI's "Load Diffusion Model" reads them). sdrt refused these ("is not a model sdrt can run: it
looks like diffusers UNet", or "no family sdrt knows" for a transformer) although its shipped graphs carry
exactly these parameter names; the diffusers-folder path already read them.

The tiny SD 1.x pipeline folder's weights written in diffusers' names (UNet) beside text-encoder and VAE files must
give the ONNX folder's image byte for byte (that folder's images are diffusers', scripts/gen_checkpoint_data.py); full-size key sets
(every shipped denoiser's parameters, sparse files) are read as their family and bind every parameter.
"""

from __future__ import annotations

import pytest
import single_file_helpers as h
from ckpt_data import PIPE_FOLDER

from sdrt import pipelines
from sdrt.checkpoint import open_single_file, param_map, shipped_graph
from sdrt.checkpoint.families import identify
from sdrt.errors import ModelError
from sdrt.graph import Graph


def _graph_shapes(name: str) -> dict[str, tuple[int, ...]]:
    return {c: tuple(s.shape) for c, s in param_map(Graph.load(shipped_graph(name))).items()}


def test_a_diffusers_named_unet_file_gives_the_folders_image(tmp_path):
    """tests/pipelines' tiny SD 1.x folder (its scheduler the release's) as a UNet file in diffusers' names, a CLIP
    file and a VAE file: the folder's own image."""
    unet = h.write(tmp_path / "tiny_unet.safetensors",
                   h._torch_layout(Graph.load(PIPE_FOLDER / "unet" / "model.onnx"), False))
    te = h.write(tmp_path / "te.safetensors", h.clip_tensors(Graph.load(PIPE_FOLDER / "text_encoder" / "model.onnx"), ""))
    vae = h.write(tmp_path / "vae.safetensors", h.vae_tensors(Graph.load(PIPE_FOLDER / "vae_decoder" / "model.onnx"),
                                                              Graph.load(PIPE_FOLDER / "vae_encoder" / "model.onnx")))
    graphs = h.stripped(PIPE_FOLDER, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp_path / "g")
    kw = dict(steps=3, cfg=7.0, sampler="Euler a", seed=7, width=64, height=64)
    with pipelines.load(unet, backend="reference", vae=vae, text_encoders=[te], graph_paths=graphs, family="sd1",
                        tokenizers={"tokenizer": PIPE_FOLDER / "tokenizer"}) as pipe:
        assert (pipe.folder.family, pipe.folder.scheduler["_class_name"]) == ("sd1", "PNDMScheduler")
        gen = pipe.generate("a red cat", "blurry", **kw)
    with pipelines.load(PIPE_FOLDER, backend="reference") as folder:
        want = folder("a red cat", "blurry", **kw)[0]
    assert gen.images[0].tobytes() == want.tobytes()
    assert gen.settings[0]["Model"] == "tiny_unet"


DENOISERS = [("sd1_unet", "sd1", "unet"), ("sd2_unet", "sd2", "unet"), ("sdxl_unet", "sdxl", "unet"),
             ("sdxl_refiner_unet", "sdxl-refiner", "unet"), ("sdxl_inpaint_unet", "sdxl-inpaint", "unet"),
             ("sd3_medium_transformer", "sd3-medium", "transformer"),
             ("sd35_medium_transformer", "sd35-medium", "transformer"),
             ("sd35_large_transformer", "sd35-large", "transformer"), ("flux_dev_transformer", "flux-dev", "transformer"),
             ("flux_schnell_transformer", "flux-schnell", "transformer"), ("chroma_transformer", "chroma", "transformer")]


@pytest.mark.parametrize(("graph", "family", "part"), DENOISERS, ids=[d[0] for d in DENOISERS])
def test_full_size_diffusers_named_denoisers_bind_every_parameter(tmp_path, graph, family, part):
    shapes = _graph_shapes(graph)
    f = h.sparse(tmp_path / "diffusion_pytorch_model.safetensors", shapes)
    ident = identify(shapes)
    assert (ident.family, ident.layout, ident.components) == (family, "diffusers", {part: ""})
    m = open_single_file(f, parts=[part])
    (gpath, w), = m.parts.values()
    assert m.family == family and set(shapes) <= set(w)  # the shipped graphs' initializers carry these names
    assert all(w.ref(c).source == str(f) for c in shapes)


def test_a_diffusers_named_transformer_alone_is_asked_for_its_other_parts(tmp_path):
    f = h.sparse(tmp_path / "flux-dev-diffusers.safetensors", _graph_shapes("flux_dev_transformer"))
    with pytest.raises(ModelError, match=r"is Flux\.1 dev \(transformer only, diffusers' names\); Flux\.1 dev also "
                                         r"needs a CLIP-L text encoder"):
        open_single_file(f)


def test_a_diffusers_named_transformer_of_another_width_has_no_graph():
    shapes = {k: v for k, v in _graph_shapes("flux_dev_transformer").items()}
    shapes["x_embedder.weight"] = (2048, 64)
    ident = identify(shapes)
    assert ident.family is None and "width 2048 (the release's is 3072)" in ident.label
    assert identify(shapes, "flux-dev").family == "flux-dev"  # a reduced model on graphs of its own (family=)


def test_an_sd2_unet_in_diffusers_names_is_told_v_or_eps_by_the_same_bias(tmp_path):
    """ComfyUI's v test (the spread of the last transformer's first norm bias; LDM's output_blocks.11.1) reads that
    tensor under its diffusers name, up_blocks.3.attentions.2."""
    import numpy as np

    from sdrt.checkpoint.files import sd2_prediction
    from sdrt.weights import Weights

    key = "up_blocks.3.attentions.2.transformer_blocks.0.norm1.bias"
    spread = np.random.default_rng(0).normal(0, 0.2, 1024).astype(np.float32)
    assert sd2_prediction(tmp_path / "u.safetensors", Weights.from_arrays({key: spread}), "", diffusers=True) \
        == "v_prediction"
    assert sd2_prediction(tmp_path / "u.safetensors", Weights.from_arrays({key: spread * 0.1}), "", diffusers=True) \
        == "epsilon"


@pytest.mark.parametrize(("graph", "family", "blocks"), [
    ("sd1_unet", "sd1", [320, 640, 1280, 1280]), ("sd2_unet", "sd2", [320, 640, 1280, 1280]),
    ("sdxl_unet", "sdxl", [320, 640, 1280]), ("sdxl_refiner_unet", "sdxl-refiner", [384, 768, 1536, 1536])])
def test_the_down_blocks_of_a_full_size_unet_come_from_its_weights(tmp_path, graph, family, blocks):
    """A single file's UNet has no config.json: its down blocks (the multiple of its sides: 64 pixels, 32 for SDXL)
    are read from the bound weights, as the release's config.json gives them."""
    from sdrt.pipelines.folder import unet_blocks

    f = h.sparse(tmp_path / "diffusion_pytorch_model.safetensors", _graph_shapes(graph))
    (_, w), = open_single_file(f, parts=["unet"]).parts.values()
    assert unet_blocks(w) == blocks
