"""The SDXL refiner as a single file: what it is, and binding it onto the shipped weight-free refiner UNet.

The file is written sparse (a safetensors header with the release's names and shapes, zeros the file system
does not store) in the layout stabilityai's ``sd_xl_refiner_1.0.safetensors`` has: ``model.diffusion_model.*``
(the SGM UNet: 4 levels of 384 x [1, 2, 4, 4] channels, 4 transformer layers at the two middle levels, context
1280, ADM input 2560), ``conditioner.embedders.0.model.*`` (OpenCLIP ViT-bigG, the only text encoder) and
``first_stage_model.*``. Its names come from the shipped graphs through the LDM converter's inverse, and the
release's own key names and shapes listed below are checked to be among them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from single_file_helpers import openclip_tensors, sparse, unet_tensors, vae_tensors

from sdrt.checkpoint import identify, open_single_file, shipped_graph
from sdrt.checkpoint.families import detect
from sdrt.errors import ModelError
from sdrt.graph import Graph

#: keys and shapes of stabilityai/stable-diffusion-xl-refiner-1.0's sd_xl_refiner_1.0.safetensors
RELEASE_KEYS = {
    "model.diffusion_model.label_emb.0.0.weight": (1536, 2560),
    "model.diffusion_model.time_embed.0.weight": (1536, 384),
    "model.diffusion_model.input_blocks.0.0.weight": (384, 4, 3, 3),
    "model.diffusion_model.input_blocks.4.1.transformer_blocks.3.attn2.to_k.weight": (768, 1280),
    "model.diffusion_model.input_blocks.8.1.proj_in.weight": (1536, 1536),
    "model.diffusion_model.input_blocks.11.0.out_layers.3.weight": (1536, 1536, 3, 3),
    "model.diffusion_model.middle_block.1.transformer_blocks.3.attn2.to_v.weight": (1536, 1280),
    "model.diffusion_model.output_blocks.5.1.transformer_blocks.0.ff.net.0.proj.weight": (12288, 1536),
    "model.diffusion_model.output_blocks.11.0.skip_connection.weight": (384, 768, 1, 1),
    "model.diffusion_model.out.2.weight": (4, 384, 3, 3),
    "conditioner.embedders.0.model.token_embedding.weight": (49408, 1280),
    "conditioner.embedders.0.model.transformer.resblocks.31.attn.in_proj_weight": (3840, 1280),
    "conditioner.embedders.0.model.text_projection": (1280, 1280),
}
NOT_IN_RELEASE = ("model.diffusion_model.input_blocks.1.1.", "model.diffusion_model.input_blocks.10.1.",
                  "model.diffusion_model.output_blocks.0.1.", "conditioner.embedders.1.")


def refiner_shapes(unet: bool = True, clip: bool = True, vae: bool = True) -> dict[str, tuple[int, ...]]:
    shapes: dict = {}
    if unet:
        shapes.update(unet_tensors(Graph.load(shipped_graph("sdxl_refiner_unet")), sparse=True))
    if clip:
        shapes.update(openclip_tensors(Graph.load(shipped_graph("clip_g")), "conditioner.embedders.0.model.",
                                       sparse=True))
    if vae:
        shapes.update(vae_tensors(Graph.load(shipped_graph("vae4_decoder")), Graph.load(shipped_graph("vae4_encoder")),
                                  "first_stage_model.", sparse=True))
    return shapes


@pytest.fixture(scope="module")
def refiner_file(tmp_path_factory) -> Path:
    return sparse(tmp_path_factory.mktemp("refiner") / "sd_xl_refiner_1.0.safetensors", refiner_shapes())


def test_the_release_layout_is_what_the_shipped_graph_takes() -> None:
    shapes = refiner_shapes(vae=False)
    for key, shape in RELEASE_KEYS.items():
        assert shapes.get(key) == shape, key
    assert not [k for k in shapes if k.startswith(NOT_IN_RELEASE)]
    g = Graph.load(shipped_graph("sdxl_refiner_unet"))
    infos = {i.name: i for i in g.inputs}
    assert infos["time_ids"].shape[1] == 5 and infos["encoder_hidden_states"].shape[2] == 1280


def test_refiner_file_is_the_refiner(refiner_file: Path) -> None:
    from sdrt.weights import Weights

    shapes = Weights.open(refiner_file).shapes()
    assert detect(shapes) == "SDXL refiner"
    ident = identify(shapes)
    assert (ident.family, ident.kind, ident.label) == ("sdxl-refiner", "checkpoint", "SDXL refiner")
    assert ident.components == {"unet": "model.diffusion_model.", "text_encoder_2": "conditioner.embedders.0.model.",
                                "vae": "first_stage_model."}


def test_refiner_file_binds_onto_the_shipped_graphs(refiner_file: Path) -> None:
    opened = open_single_file(refiner_file)
    assert opened.family == "sdxl-refiner" and opened.prediction == "epsilon"
    assert sorted(opened.parts) == ["text_encoder_2", "unet", "vae_decoder", "vae_encoder"]
    assert opened.parts["unet"][0] == shipped_graph("sdxl_refiner_unet")
    assert opened.release["tokenizers"] == {"tokenizer_2": "clip-pad-bang"}


def test_refiner_file_opens_as_an_sdxl_refiner_pipeline(refiner_file: Path) -> None:
    from sdrt.pipelines.singlefile import folder_from_file

    folder = folder_from_file(refiner_file)
    assert folder.family == "sdxl-refiner" and folder.name == "sd_xl_refiner_1.0"
    assert not folder.force_zeros_for_empty_prompt
    assert folder.family_class.aesthetic_score == 6.0 and folder.family_class.negative_aesthetic_score == 2.5


def test_refiner_unet_alone_is_named_and_needs_clip_g_and_a_vae(tmp_path: Path) -> None:
    f = sparse(tmp_path / "refiner_unet.safetensors", refiner_shapes(clip=False, vae=False))
    from sdrt.weights import Weights

    assert detect(Weights.open(f).shapes()) == "SDXL refiner (UNet only)"
    with pytest.raises(ModelError, match=r"SDXL refiner \(UNet only\); SDXL refiner also needs a CLIP-G"):
        open_single_file(f)


def test_refiner_text_encoder_beside_a_base_unet_is_refused(tmp_path: Path) -> None:
    shapes = refiner_shapes(unet=False, vae=False)
    shapes.update(unet_tensors(Graph.load(shipped_graph("sdxl_unet")), sparse=True))
    f = sparse(tmp_path / "odd.safetensors", shapes)
    with pytest.raises(ModelError, match="not the refiner's"):
        open_single_file(f)


def test_refiner_diffusers_folder_is_the_refiner(tmp_path: Path) -> None:
    """stabilityai/stable-diffusion-xl-refiner-1.0 as the hub serves it: unet/, text_encoder_2/, vae/ (headers)."""
    import json

    from single_file_helpers import clip_tensors

    from sdrt.checkpoint.diffusers_folder import open_diffusers_folder
    from sdrt.checkpoint.onnxmap import param_map

    root = tmp_path / "stable-diffusion-xl-refiner-1.0"
    unet = Graph.load(shipped_graph("sdxl_refiner_unet"))
    for sub, shapes, name in (
            ("unet", {c: s.shape for c, s in param_map(unet).items()}, "diffusion_pytorch_model.safetensors"),
            ("text_encoder_2", clip_tensors(Graph.load(shipped_graph("clip_g")), "", sparse=True),
             "model.safetensors"),
            ("vae", vae_tensors(Graph.load(shipped_graph("vae4_decoder")), Graph.load(shipped_graph("vae4_encoder")),
                                sparse=True), "diffusion_pytorch_model.safetensors")):
        (root / sub).mkdir(parents=True)
        sparse(root / sub / name, shapes)
    (root / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLImg2ImgPipeline",
                                                       "requires_aesthetics_score": True,
                                                       "force_zeros_for_empty_prompt": False}))
    opened = open_diffusers_folder(root)
    assert opened.family == "sdxl-refiner"
    assert sorted(opened.parts) == ["text_encoder_2", "unet", "vae_decoder", "vae_encoder"]


def test_refiner_unet_with_separate_clip_g_and_vae_files(tmp_path: Path) -> None:
    """A UNet-only refiner (as some finetunes ship) with clip_g.safetensors and sdxl_vae.safetensors given."""
    from single_file_helpers import clip_tensors

    unet = sparse(tmp_path / "refiner_unet.safetensors", refiner_shapes(clip=False, vae=False))
    clip_g = sparse(tmp_path / "clip_g.safetensors", clip_tensors(Graph.load(shipped_graph("clip_g")), "",
                                                                  sparse=True))
    vae = sparse(tmp_path / "sdxl_vae.safetensors", refiner_shapes(unet=False, clip=False))
    opened = open_single_file(unet, [clip_g, vae])
    assert opened.family == "sdxl-refiner"
    assert sorted(opened.parts) == ["text_encoder_2", "unet", "vae_decoder", "vae_encoder"]
    assert opened.files["text_encoder_2"] == clip_g


REF_FOLDER = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sdxl-refiner"
XL = REF_FOLDER.parent / "tiny-sdxl"


def test_tiny_refiner_file_gives_the_folders_images(tmp_path: Path) -> None:
    """tiny-sdxl-refiner's own weights as an LDM single file (conditioner.embedders.0.model = its CLIP-G, the VAE as
    first_stage_model) on its graphs stripped of their weights: the folder's image byte for byte, alone (img2img)
    and as the refiner of tiny-sdxl, given as a path or as a loaded pipeline."""
    import numpy as np
    from backend_helpers import register
    from single_file_helpers import stripped, write

    from sdrt import pipelines

    register("reference")
    parts = ["unet", "text_encoder_2", "vae_decoder", "vae_encoder"]
    f = write(tmp_path / "tiny_refiner.safetensors", {
        **unet_tensors(Graph.load(REF_FOLDER / "unet" / "model.onnx")),
        **openclip_tensors(Graph.load(REF_FOLDER / "text_encoder_2" / "model.onnx"), "conditioner.embedders.0.model."),
        **vae_tensors(Graph.load(REF_FOLDER / "vae_decoder" / "model.onnx"),
                      Graph.load(REF_FOLDER / "vae_encoder" / "model.onnx"), "first_stage_model.")})
    with pytest.raises(ModelError, match="not the refiner's"):  # tiny widths: its ADM input is not 2560 wide
        open_single_file(f)
    graphs = stripped(REF_FOLDER, parts, tmp_path / "g")
    init = np.load(REF_FOLDER / "refs.npz")["init_image"]
    kw = dict(steps=4, cfg=5.0, sampler="Euler a", seed=7)
    with pipelines.load(f, backend="reference", graph_paths=graphs, family="sdxl-refiner",
                        tokenizers={"tokenizer_2": REF_FOLDER / "tokenizer_2"}) as ref_file, \
            pipelines.load(REF_FOLDER, backend="reference") as ref_folder, \
            pipelines.load(XL, backend="reference") as base:
        assert ref_file.folder.family == "sdxl-refiner" and not ref_file.folder.force_zeros_for_empty_prompt
        alone = ref_file("a red cat", "", init_image=init, strength=0.5, **kw)[0]
        assert alone.tobytes() == ref_folder("a red cat", "", init_image=init, strength=0.5, **kw)[0].tobytes()
        after = base.generate("a red cat", "blurry", width=64, height=64, refiner=ref_file, **kw)
        want = base("a red cat", "blurry", width=64, height=64, refiner=ref_folder, **kw)[0]
        assert after.images[0].tobytes() == want.tobytes()
        import hashlib

        assert after.settings[0]["Refiner"] == f"tiny_refiner [{hashlib.sha256(f.read_bytes()).hexdigest()[:10]}]"


def test_full_size_refiner_file_plans_on_the_shipped_graphs(refiner_file: Path) -> None:
    """The run plan of a full-size (sparse) refiner file as img2img at 768x1024: what the shipped graphs are fed."""
    import numpy as np
    from backend_helpers import register

    from sdrt import pipelines

    register("reference")
    with pipelines.load(refiner_file, backend="reference") as pipe:
        plan = pipe.plan("a fox", init_image=np.zeros((1024, 768, 3), np.uint8), strength=0.3, steps=20)
    unet = plan.part("unet")
    assert unet is not None and unet.calls == 6
    (sig, _), = unet.signatures
    shapes = {name: shape for name, shape, _ in sig}
    assert shapes["time_ids"] == (2, 5) and shapes["encoder_hidden_states"] == (2, 77, 1280)
    assert shapes["sample"] == (2, 4, 128, 96) and shapes["text_embeds"] == (2, 1280)
    assert plan.part("text_encoder") is None and plan.part("text_encoder_2") is not None
