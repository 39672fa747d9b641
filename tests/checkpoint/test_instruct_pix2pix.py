"""InstructPix2Pix (timbrooks/instruct-pix2pix: SD 1.x with an 8-channel UNet) in the forms people hold it: an ONNX
folder (Optimum's layout), the LDM single file (``instruct-pix2pix-00-22000.safetensors``) and the diffusers folder.

The tiny model and diffusers' ``StableDiffusionInstructPix2PixPipeline`` images come from ``scripts/gen_ip2p_refs.py``
(``tests/data/pipelines/tiny-sd15-ip2p``, ``tests/data/ckpt/sd1-ip2p``); every form must give them: at most 1 level
off, at most 0.5 % of values (tests/pipelines/pipeline_helpers.assert_matches_diffusers' bound). The single file and
the diffusers folder run on the folder's graphs without their weights, as sdrt ships its graphs; a full-size file
(headers only) binds onto the shipped ``sd1_ip2p_unet``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h
from backend_helpers import register

from sdrt import pipelines
from sdrt.checkpoint import identify, open_diffusers_folder, open_single_file, shipped_graph
from sdrt.errors import InputError, ModelError
from sdrt.graph import Graph

TESTS = Path(__file__).resolve().parent.parent
FOLDER = TESTS / "data" / "pipelines" / "tiny-sd15-ip2p"
FILES = TESTS / "data" / "ckpt" / "sd1-ip2p"
LDM = FILES / "instruct-pix2pix-tiny.safetensors"
DIFFUSERS = FILES / "diffusers"
SD15 = TESTS / "data" / "pipelines" / "tiny-sd15"
PARTS = ["unet", "text_encoder", "vae_decoder", "vae_encoder"]
#: a case or two per backend (the reference backend is slow); OpenVINO runs every case of the folder
CASES = {"reference": ["Euler a", "Euler/image cfg 2.5/negative"], "openvino": None, "ggml": None}


def _refs():
    return json.loads((FOLDER / "refs.json").read_text()), np.load(FOLDER / "refs.npz")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    return h.stripped(FOLDER, PARTS, tmp_path_factory.mktemp("ip2p-graphs"))


def _compare(pipe, names: list[str] | None) -> int:
    cases, refs = _refs()
    run = [c for c in cases if names is None or c["name"] in names]
    for case in run:
        images = pipe(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                      image_cfg=case["image_cfg"], sampler=case["sampler"], seed=case["seed"], batch=case["batch"],
                      init_image=refs["init_image"])
        got = np.stack(images).astype(np.int16)
        want = refs[case["name"]].astype(np.int16)
        assert got.shape == want.shape, (case["name"], got.shape, want.shape)
        diff = np.abs(got - want)
        assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, \
            f"{case['name']}: max difference {diff.max()}, {(diff > 0).mean():.2%} of values differ"
    return len(run)


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_onnx_folder_gives_diffusers_images(backend):
    """The ONNX export (unet/model.onnx takes an 8-channel sample; model_index.json names
    ORTStableDiffusionInstructPix2PixPipeline): diffusers' images at each sampler, image CFG 1, 1.5 and 2.5, CFG 1
    (diffusers runs no guidance then) and batch 2."""
    register(backend)
    with pipelines.load(FOLDER, backend=backend) as pipe:
        assert pipe.family.name == "sd1" and pipe.instruct_pix2pix
        assert pipe.unet.inputs["sample"].shape[1] == 8
        assert _compare(pipe, CASES[backend]) >= 1


def test_ldm_file_gives_diffusers_images(graphs, caplog):
    """instruct-pix2pix-00-22000.safetensors' layout (model.diffusion_model.input_blocks.0.0.weight 8 channels wide,
    cond_stage_model.transformer.*, first_stage_model.*): SD 1.x InstructPix2Pix, diffusers' images."""
    register("openvino")
    with pipelines.load(LDM, backend="openvino", graph_paths=graphs,
                        tokenizers={"tokenizer": FOLDER / "tokenizer"}) as pipe:
        opened = pipe.folder.single_file
        assert (opened.family, opened.label, opened.prediction) == ("sd1-ip2p", "SD 1.x InstructPix2Pix", "epsilon")
        assert pipe.folder.scheduler["_class_name"] == "EulerAncestralDiscreteScheduler"  # the release's
        assert pipe.instruct_pix2pix
        assert _compare(pipe, ["Euler a", "DDIM", "Euler/cfg 1"]) == 3
    assert "not used" not in caplog.text


def test_diffusers_folder_gives_diffusers_images(graphs):
    """timbrooks/instruct-pix2pix's folder layout (StableDiffusionInstructPix2PixPipeline in model_index.json)."""
    register("openvino")
    with pipelines.load(DIFFUSERS, backend="openvino", graph_paths=graphs) as pipe:
        assert pipe.folder.single_file.family == "sd1-ip2p"
        assert _compare(pipe, ["Euler a/batch2", "Euler a/image cfg 1"]) == 2


def test_infotext_and_defaults():
    """image_cfg defaults to 1.5 (diffusers' and A1111's), which the PNG's parameters say as A1111 writes it; without a
    strength the run starts from noise alone and says no denoising strength."""
    register("openvino")
    cases, refs = _refs()
    case = cases[0]
    assert case["image_cfg"] == 1.5
    with pipelines.load(FOLDER, backend="openvino") as pipe:
        gen = pipe.generate(case["prompt"], steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"],
                            seed=case["seed"], init_image=refs["init_image"])
        assert np.abs(gen.images[0].astype(int) - refs[case["name"]][0].astype(int)).max() <= 1
        info = gen.settings[0]
        assert str(info["Image CFG scale"]) == "1.5" and "Denoising strength" not in info
        # with a strength: A1111's img2img start (the image latent noised), which differs
        strong = pipe(case["prompt"], steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"],
                      seed=case["seed"], init_image=refs["init_image"], strength=0.5)[0]
        assert np.abs(strong.astype(int) - refs[case["name"]][0].astype(int)).max() > 10


def test_refusals():
    register("reference")
    image = np.zeros((64, 64, 3), np.uint8)
    with pipelines.load(FOLDER, backend="reference") as pipe:
        with pytest.raises(InputError, match="InstructPix2Pix editing model.*edits a picture"):
            pipe("a red cat", steps=1)
        with pytest.raises(InputError, match="mask with an InstructPix2Pix"):
            pipe("a red cat", steps=1, init_image=image, mask=image[..., 0])
        # the three-way guidance has no rescale (diffusers' and A1111's have none): refused, not dropped in silence
        with pytest.raises(InputError, match="guidance_rescale rescales ordinary CFG.*three-way"):
            pipe("a red cat", steps=2, init_image=image, guidance_rescale=0.7)
        # diffusers' rule at image_cfg 0.5 runs one pass: the rescale is not used, and not written as if it ran
        gen = pipe.generate("a red cat", steps=2, cfg=7.5, image_cfg=0.5, init_image=image, guidance_rescale=0.7)
        assert "CFG Rescale" not in gen.settings[0]
        # at image_cfg 1 it is ordinary CFG, which the rescale changes
        plain, rescaled = (pipe("a red cat", steps=2, cfg=7.5, image_cfg=1.0, init_image=image, seed=3,
                                guidance_rescale=r)[0] for r in (0.0, 0.7))
        assert not np.array_equal(plain, rescaled)
    with pipelines.load(SD15, backend="reference") as pipe:
        with pytest.raises(InputError, match="image_cfg.*not one"):
            pipe("a red cat", steps=4, init_image=image, image_cfg=1.5)
    with pytest.raises(InputError, match="image_cfg.*init_image"):
        pipelines.validate("a red cat", image_cfg=1.5)
    with pytest.raises(InputError, match="pass image_cfg instead"):
        pipelines.validate("a red cat", image_guidance_scale=1.5)


def test_cli_generate(tmp_path, capsys):
    """``sdrt generate FOLDER "edit" --init-image in.png --image-cfg 2.5``: diffusers' image; --image-cfg on an
    ordinary model is refused in the flag's words."""
    from PIL import Image

    from sdrt.cli import main

    cases, refs = _refs()
    case = next(c for c in cases if c["name"] == "Euler/image cfg 2.5/negative")
    src = tmp_path / "in.png"
    Image.fromarray(refs["init_image"]).save(src)
    out = tmp_path / "out.png"
    argv = ["generate", str(FOLDER), case["prompt"], "--negative", case["negative_prompt"], "--init-image", str(src),
            "--image-cfg", str(case["image_cfg"]), "--cfg", str(case["cfg"]), "--steps", str(case["steps"]),
            "--sampler", case["sampler"], "--seed", str(case["seed"]), "--backend", "openvino", "-o", str(out)]
    register("openvino")
    assert main(argv) == 0, capsys.readouterr().err
    got = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert np.abs(got - refs[case["name"]][0].astype(int)).max() <= 1
    assert "Image CFG scale: 2.5" in Image.open(out).info["parameters"]
    bad = ["generate", str(SD15), "a cat", "--init-image", str(src), "--image-cfg", "1.5", "--steps", "1",
           "--backend", "openvino", "-o", str(tmp_path / "x.png")]
    capsys.readouterr()
    assert main(bad) != 0
    err = capsys.readouterr().err
    assert "--image-cfg" in err and "InstructPix2Pix" in err and "Traceback" not in err


# -- full size, headers only -----------------------------------------------------------------------
def _g(name: str) -> Graph:
    return Graph.load(shipped_graph(name))


def test_full_size_ldm_file_binds_onto_the_shipped_graph(tmp_path):
    """instruct-pix2pix-00-22000.safetensors' names and shapes bind every part onto the shipped graphs."""
    from sdrt.weights import Weights

    shapes = {**h.unet_tensors(_g("sd1_ip2p_unet"), sparse=True),
              **h.clip_tensors(_g("clip_l"), "cond_stage_model.transformer.", sparse=True),
              **h.vae_tensors(_g("vae4_decoder"), _g("vae4_encoder"), "first_stage_model.", sparse=True)}
    f = h.sparse(tmp_path / "instruct-pix2pix-00-22000.safetensors", shapes)
    got = Weights.open(f).shapes()
    assert got["model.diffusion_model.input_blocks.0.0.weight"] == (320, 8, 3, 3)
    assert identify(got).family == "sd1-ip2p"
    opened = open_single_file(f)
    assert opened.family == "sd1-ip2p" and set(opened.parts) == set(PARTS)
    assert opened.parts["unet"][0] == shipped_graph("sd1_ip2p_unet")
    for part, (gpath, weights) in opened.parts.items():  # every initializer bound
        assert set(weights) == set(Graph.load(gpath).initializer_names), part
    # the UNet alone stays refused: IC-Light's fc UNet has its shapes
    unet = h.sparse(tmp_path / "iclight_sd15_fc.safetensors", h.unet_tensors(_g("sd1_ip2p_unet"), sparse=True))
    with pytest.raises(ModelError, match="8 input channels alone"):
        open_single_file(unet)


def test_full_size_diffusers_folder_opens_onto_the_shipped_graph(tmp_path):
    root = tmp_path / "instruct-pix2pix"
    (root / "unet").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionInstructPix2PixPipeline"}))
    h.sparse(root / "unet" / "diffusion_pytorch_model.safetensors", h._torch_layout(_g("sd1_ip2p_unet"), True))
    (root / "text_encoder").mkdir()
    h.sparse(root / "text_encoder" / "model.safetensors", h.clip_tensors(_g("clip_l"), "", sparse=True))
    (root / "vae").mkdir()
    h.sparse(root / "vae" / "diffusion_pytorch_model.safetensors",
             h.vae_tensors(_g("vae4_decoder"), _g("vae4_encoder"), sparse=True))
    opened = open_diffusers_folder(root)
    assert opened.family == "sd1-ip2p" and opened.parts["unet"][0] == shipped_graph("sd1_ip2p_unet")
    # a folder whose model_index.json says SDXL InstructPix2Pix and whose UNet is SD 1.x's is refused
    (root / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLInstructPix2PixPipeline"}))
    with pytest.raises(ModelError, match="model_index.json names StableDiffusionXLInstructPix2PixPipeline"):
        open_diffusers_folder(root)


# -- CosXL Edit: SDXL with 8 input channels, EDM v-prediction ---------------------------------------
XL = TESTS / "data" / "pipelines" / "tiny-sdxl-ip2p"
XL_PARTS = ["unet", "text_encoder", "text_encoder_2", "vae_decoder", "vae_encoder"]
XL_TOKENIZERS = {"tokenizer": XL / "tokenizer", "tokenizer_2": XL / "tokenizer_2"}


def _xl_compare(pipe) -> int:
    cases = json.loads((XL / "refs.json").read_text())
    refs = np.load(XL / "refs.npz")
    for case in cases:
        images = pipe(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                      image_cfg=case["image_cfg"], sampler=case["sampler"], seed=case["seed"], batch=case["batch"],
                      init_image=refs["init_image"])
        diff = np.abs(np.stack(images).astype(np.int16) - refs[case["name"]].astype(np.int16))
        assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, \
            f"{case['name']}: max difference {diff.max()}, {(diff > 0).mean():.2%} of values differ"
    return len(cases)


def test_cosxl_edit_onnx_folder_gives_diffusers_images():
    """CosXL Edit as an ONNX folder (EDMEulerScheduler v-prediction, sigma_data 1, 0.002..120): diffusers'
    StableDiffusionXLInstructPix2PixPipeline with is_cosxl_edit (the picture's latent scaled) at Euler Exponential and
    Euler Karras, image CFG 1.5 and 2."""
    from sdrt.samplers import EDMSchedule

    register("openvino")
    with pipelines.load(XL, backend="openvino") as pipe:
        assert pipe.family.name == "sdxl" and pipe.instruct_pix2pix and isinstance(pipe.schedule, EDMSchedule)
        assert _xl_compare(pipe) == 2


def test_cosxl_edit_single_file_gives_diffusers_images(tmp_path):
    """cosxl_edit.safetensors' layout: an LDM SDXL checkpoint with an 8-channel UNet and the edm_vpred.sigma_min /
    sigma_max keys (its VAE baked in): SDXL InstructPix2Pix, EDM v-prediction, diffusers' images."""
    from sdrt.samplers import EDMSchedule

    cfg = json.loads((XL / "scheduler" / "scheduler_config.json").read_text())
    tensors = {**h.unet_tensors(Graph.load(XL / "unet" / "model.onnx")),
               **h.clip_tensors(Graph.load(XL / "text_encoder" / "model.onnx"), "conditioner.embedders.0.transformer."),
               **h.openclip_tensors(Graph.load(XL / "text_encoder_2" / "model.onnx"), "conditioner.embedders.1.model."),
               **h.vae_tensors(Graph.load(XL / "vae_decoder" / "model.onnx"),
                               Graph.load(XL / "vae_encoder" / "model.onnx"), "first_stage_model."),
               "edm_vpred.sigma_min": np.float32(cfg["sigma_min"]), "edm_vpred.sigma_max": np.float32(cfg["sigma_max"])}
    f = h.write(tmp_path / "cosxl_edit-tiny.safetensors", tensors)
    graphs = h.stripped(XL, XL_PARTS, tmp_path / "g")
    register("openvino")
    with pipelines.load(f, backend="openvino", graph_paths=graphs, tokenizers=XL_TOKENIZERS) as pipe:
        opened = pipe.folder.single_file
        assert (opened.family, opened.prediction) == ("sdxl-ip2p", "v_prediction")
        assert pipe.instruct_pix2pix and isinstance(pipe.schedule, EDMSchedule)
        assert _xl_compare(pipe) == 2


def test_full_size_cosxl_edit_binds_onto_the_shipped_graph(tmp_path):
    """cosxl_edit.safetensors' names and shapes (SDXL's with an 8-channel UNet and the edm_vpred keys): every part
    onto the shipped graphs, EDM v-prediction with CosXL's sigmas."""
    shapes = {**h.unet_tensors(_g("sdxl_ip2p_unet"), sparse=True),
              **h.clip_tensors(_g("clip_l"), "conditioner.embedders.0.transformer.", sparse=True),
              **h.openclip_tensors(_g("clip_g"), "conditioner.embedders.1.model.", sparse=True),
              **h.vae_tensors(_g("vae4_decoder"), _g("vae4_encoder"), "first_stage_model.", sparse=True),
              "edm_vpred.sigma_min": ((), "F32"), "edm_vpred.sigma_max": ((), "F32")}
    f = h.sparse(tmp_path / "cosxl_edit.safetensors", shapes)
    raw = f.read_bytes()  # the two sigmas written in (the rest stays sparse zeros)
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    with open(f, "r+b") as out:
        for key, value in (("edm_vpred.sigma_min", 0.002), ("edm_vpred.sigma_max", 120.0)):
            out.seek(8 + n + header[key]["data_offsets"][0])
            out.write(np.float32(value).tobytes())
    opened = open_single_file(f)
    assert (opened.family, opened.prediction) == ("sdxl-ip2p", "v_prediction")
    assert opened.parts["unet"][0] == shipped_graph("sdxl_ip2p_unet")
    assert opened.release["scheduler"]["_class_name"] == "EDMEulerScheduler"
    for part, (gpath, weights) in opened.parts.items():
        assert set(weights) == set(Graph.load(gpath).initializer_names), part


def test_a_refiner_with_extra_input_channels_is_refused(tmp_path):
    """A refiner pass feeds the base's latents alone: an InstructPix2Pix (8-channel) or inpainting (9-channel) model as
    the refiner is refused in one line naming refiner (it failed in Graph.with_shapes, 'pin only the dynamic dims')."""
    import shutil

    register("reference")
    inpaint = shutil.copytree(SD15.parent / "tiny-sd15-inpaint", tmp_path / "inpaint-refiner")
    image = np.zeros((64, 64, 3), np.uint8)
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255
    for base, refiner, what, kw in ((SD15, FOLDER, "InstructPix2Pix editing model: its sample takes 8", {}),
                                    (SD15.parent / "tiny-sd15-inpaint", inpaint, "inpainting model: its sample takes 9",
                                     {"init_image": image, "mask": mask})):
        with pipelines.load(base, backend="reference") as pipe:
            with pytest.raises(InputError, match=f"the refiner \\({refiner.name}\\) is an {what} channels") as e:
                pipe("a red cat", steps=2, width=64, height=64, refiner=refiner, **kw)
        assert "\n" not in str(e.value) and "Where: refiner" in str(e.value)


def test_the_plan_says_the_guidance_that_runs():
    """The run plan's guidance is the InstructPix2Pix rule's: three rows with the image cfg, or one pass where
    diffusers' rule runs none (image_cfg below 1), not the plain CFG that cfg 7 would say of another model."""
    register("reference")
    image = np.zeros((64, 64, 3), np.uint8)
    with pipelines.load(FOLDER, backend="reference") as pipe:
        three = pipe.plan("a red cat", steps=2, init_image=image).format()
        assert "guidance cfg and image cfg 1.5 (InstructPix2Pix, three rows) (cfg 7)" in three, three
        assert "sample [3, 8, 8, 8]" in three
        one = pipe.plan("a red cat", steps=2, init_image=image, image_cfg=0.5).format()
        assert "guidance none (cfg 7)" in one and "sample [1, 8, 8, 8]" in one, one


@pytest.mark.parametrize(("cfg", "image_cfg", "diffusers", "a1111"), [
    (7.5, 1.5, "edit", "edit"), (7.5, 1.0, "cfg", "cfg"), (1.0, 1.5, "none", "edit"), (7.5, 0.5, "none", "edit"),
    (0.5, 1.5, "none", "edit"), (1.0, 1.0, "none", "none")])
def test_when_the_guidance_runs(cfg, image_cfg, diffusers, a1111):
    """diffusers' rule (guided with cfg > 1 and image_cfg >= 1) and A1111's (image_cfg 1: ordinary CFG, else three-way),
    by strength_rule: sdrt.pipelines.edit.guidance."""
    from sdrt.pipelines.edit import guidance

    assert guidance(cfg, image_cfg, "diffusers") == diffusers
    assert guidance(cfg, image_cfg, "a1111") == guidance(cfg, image_cfg, "a1111-fix-steps") == a1111
