"""SD 2.x inpainting models (stabilityai/stable-diffusion-2-inpainting, ``512-inpainting-ema.safetensors`` and its
finetunes) in the forms people hold them: an LDM single file, a diffusers folder, an ONNX export.

- The ONNX export (``tests/data/pipelines/tiny-sd2-inpaint``) is checked against diffusers'
  ``StableDiffusionInpaintPipeline`` in tests/pipelines/test_pipelines_diffusers.py.
- The LDM file and the diffusers folder (``tests/data/ckpt/sd2-inpaint``, ``scripts/gen_sd2_inpaint_files.py``: the
  same weights as that folder, in fp16, names written from diffusers' modules and read back by diffusers'
  ``from_single_file`` / ``from_pretrained``) run here onto the folder's graphs without their weights (as sdrt ships
  its graphs) and must give the same diffusers references: at most 1 level off, at most 0.5 % of values.
- Full-size files (headers only) bind every part onto the shipped ``sd2_inpaint_unet``, ``openclip_h`` and VAE graphs.
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
from sdrt.graph import Graph

TESTS = Path(__file__).resolve().parent.parent
FOLDER = TESTS / "data" / "pipelines" / "tiny-sd2-inpaint"
FILES = TESTS / "data" / "ckpt" / "sd2-inpaint"
LDM = FILES / "512-inpainting-tiny.safetensors"
DIFFUSERS = FILES / "diffusers"
PARTS = ["unet", "text_encoder", "vae_decoder", "vae_encoder"]
#: a case per backend (the reference backend is slow); OpenVINO runs every case of the folder
CASES = {"reference": ["inpaint/Euler a/strength 0.7"], "ggml": ["inpaint/DDIM"], "openvino": None}


def _refs():
    return json.loads((FOLDER / "refs.json").read_text()), np.load(FOLDER / "refs.npz")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    return h.stripped(FOLDER, PARTS, tmp_path_factory.mktemp("sd2-inpaint-graphs"))


def _compare(pipe, backend: str) -> int:
    """Run the folder's reference cases (``CASES[backend]``): each image at most 1 level from diffusers', at most
    0.5 % of the values off at all (tests/pipelines/pipeline_helpers.assert_matches_diffusers' bound)."""
    cases, refs = _refs()
    names = CASES[backend]
    run = [c for c in cases if names is None or c["name"] in names]
    for case in run:
        images = pipe(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                      sampler=case["sampler"], seed=case["seed"], batch=case["batch"], init_image=refs["init_image"],
                      mask=refs["mask"], strength=case["strength"])
        got = np.stack(images).astype(np.int16)
        want = refs[case["name"]].astype(np.int16)
        assert got.shape == want.shape, (case["name"], got.shape, want.shape)
        diff = np.abs(got - want)
        assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, \
            f"{case['name']}: max difference {diff.max()}, {(diff > 0).mean():.2%} of values differ"
    return len(run)


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_ldm_file_gives_diffusers_images(backend, graphs, caplog):
    """The LDM file (Stability's layout) is SD 2.x inpainting: eps, the release's PNDM schedule, '!' padding (the
    tiny tokenizer, given), the 9-channel UNet fed the mask and the masked image: diffusers' images."""
    register(backend)
    with pipelines.load(LDM, backend=backend, graph_paths=graphs,
                        tokenizers={"tokenizer": FOLDER / "tokenizer"}) as pipe:
        opened = pipe.folder.single_file
        assert (opened.family, opened.label, opened.prediction) == ("sd2-inpaint", "SD 2.x inpainting", "epsilon")
        assert pipe.folder.family == "sd2" and pipe.default_size == 512
        assert pipe.folder.scheduler["_class_name"] == "PNDMScheduler"
        assert pipe.unet.inputs["sample"].shape[1] == 9
        assert _compare(pipe, backend) >= 1
    assert "not used" not in caplog.text  # logit_scale, the 4th resblock, the schedule buffers: known, not warned


@pytest.mark.parametrize("backend", ["reference", "openvino"])
def test_diffusers_folder_gives_diffusers_images(backend, graphs):
    """stabilityai/stable-diffusion-2-inpainting's folder layout (fp16 variant only, transformers 4's text_model.*
    names, StableDiffusionInpaintPipeline in model_index.json): its own scheduler and tokenizer, diffusers' images."""
    register(backend)
    with pipelines.load(DIFFUSERS, backend=backend, graph_paths=graphs) as pipe:
        opened = pipe.folder.single_file
        assert (opened.family, opened.prediction) == ("sd2-inpaint", "epsilon")
        assert pipe.folder.tokenizers["tokenizer"] == DIFFUSERS / "tokenizer"
        assert _compare(pipe, backend) >= 1


def test_an_inpainting_model_needs_a_mask(graphs):
    from sdrt.errors import InputError

    register("reference")
    with pipelines.load(LDM, backend="reference", graph_paths=graphs,
                        tokenizers={"tokenizer": FOLDER / "tokenizer"}) as pipe:
        with pytest.raises(InputError, match="inpainting UNet"):
            pipe("a red cat", steps=1, width=64, height=64)


# -- full size, headers only -----------------------------------------------------------------------
def _g(name: str) -> Graph:
    return Graph.load(shipped_graph(name))


def _full_size(extra_resblock: bool = True, buffers: bool = True) -> dict:
    """512-inpainting-ema.safetensors' names and shapes: the UNet (9 input channels), OpenCLIP-H with its 24th
    resblock (the shipped graph stops at the penultimate), text_projection and logit_scale, the LDM VAE, and
    LatentDiffusion's schedule buffers."""
    shapes = {**h.unet_tensors(_g("sd2_inpaint_unet"), sparse=True),
              **h.openclip_tensors(_g("openclip_h"), "cond_stage_model.model.", sparse=True)}
    p = "cond_stage_model.model."
    if extra_resblock:
        last = {k: v for k, v in shapes.items() if k.startswith(p + "transformer.resblocks.22.")}
        shapes.update({k.replace(".22.", ".23."): v for k, v in last.items()})
        shapes.update({p + "text_projection": (1024, 1024), p + "logit_scale": ()})
    shapes.update(h.vae_tensors(_g("vae4_decoder"), _g("vae4_encoder"), "first_stage_model.", sparse=True))
    if buffers:
        shapes.update({k: ((1000,), "F32") for k in ("betas", "alphas_cumprod", "alphas_cumprod_prev",
                                                     "sqrt_alphas_cumprod", "posterior_variance")})
    return shapes


def test_full_size_ldm_file_binds_onto_the_shipped_graphs(tmp_path):
    from sdrt.weights import Weights

    f = h.sparse(tmp_path / "512-inpainting-ema.safetensors", _full_size())
    shapes = Weights.open(f).shapes()
    assert shapes["model.diffusion_model.input_blocks.0.0.weight"] == (320, 9, 3, 3)
    assert shapes["cond_stage_model.model.transformer.resblocks.23.attn.in_proj_weight"] == (3072, 1024)
    ident = identify(shapes)
    assert (ident.family, ident.label) == ("sd2-inpaint", "SD 2.x inpainting")
    opened = open_single_file(f)
    assert (opened.family, opened.prediction) == ("sd2-inpaint", "epsilon")
    assert set(opened.parts) == set(PARTS)
    assert opened.parts["unet"][0] == shipped_graph("sd2_inpaint_unet")
    assert opened.release["sample_size"] == 512 and opened.release["tokenizers"] == {"tokenizer": "clip-pad-bang"}
    for part, (gpath, weights) in opened.parts.items():  # every initializer bound
        assert set(weights) == set(Graph.load(gpath).initializer_names), part
    # A1111's <stem>.yaml beside it decides, as for any SD 2.x file (a v-prediction inpainting merge)
    (tmp_path / "512-inpainting-ema.yaml").write_text('model:\n  params:\n    parameterization: "v"\n')
    assert open_single_file(f).prediction == "v_prediction"


def test_civitai_finetunes_and_unet_only_files_are_found_by_the_same_keys(tmp_path):
    """A finetune saved pruned (no schedule buffers, no 24th layer or projection), bf16: the same family. A UNet-only
    file needs the text encoder and VAE, and says which."""
    from sdrt.errors import ModelError

    pruned = h.sparse(tmp_path / "sd2_inpainting_finetune.safetensors",
                      _full_size(extra_resblock=False, buffers=False), "BF16")
    assert open_single_file(pruned).family == "sd2-inpaint"
    unet = h.sparse(tmp_path / "unet_only.safetensors", h.unet_tensors(_g("sd2_inpaint_unet"), sparse=True))
    with pytest.raises(ModelError, match=r"SD 2.x inpainting \(UNet only\); SD 2.x inpainting also needs an "
                                         r"OpenCLIP-H text encoder \(SD 2.x\), a 4-channel VAE"):
        open_single_file(unet)


def test_full_size_diffusers_folder_plans_as_sd2_inpainting(tmp_path):
    root = tmp_path / "stable-diffusion-2-inpainting"
    (root / "unet").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionInpaintPipeline"}))
    h.sparse(root / "unet" / "diffusion_pytorch_model.fp16.safetensors", h._torch_layout(_g("sd2_inpaint_unet"), True))
    (root / "text_encoder").mkdir()
    h.sparse(root / "text_encoder" / "model.fp16.safetensors", h.clip_tensors(_g("openclip_h"), "", sparse=True))
    (root / "vae").mkdir()
    h.sparse(root / "vae" / "diffusion_pytorch_model.fp16.safetensors",
             h.vae_tensors(_g("vae4_decoder"), _g("vae4_encoder"), sparse=True))
    opened = open_diffusers_folder(root)
    assert opened.family == "sd2-inpaint" and opened.parts["unet"][0] == shipped_graph("sd2_inpaint_unet")
    register("reference")
    with pipelines.load(root, backend="reference") as pipe:
        image = np.zeros((512, 512, 3), np.uint8)
        plan = pipe.plan("a red fox", init_image=image, mask=image[..., 0], steps=4).format()
    assert "[2, 9, 64, 64]" in plan and all(not p.sessions for p in pipe.parts.values())


def test_sdrt_plan_takes_the_checkpoint_file(tmp_path, capsys, monkeypatch):
    """``sdrt plan FILE``: a checkpoint as downloaded is planned as ``sdrt generate FILE`` runs it (an inpainting
    UNet with its blank init image and mask), where plan refused every file that was not an .onnx."""
    from sdrt.cli import main

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    f = h.sparse(tmp_path / "512-inpainting-ema.safetensors", _full_size())
    # --precision fp32: with AMX (or a bf16 calibration) the CPU's plan picks bf16, halving the bytes checked below
    assert main(["plan", str(f), "--device", "cpu", "--precision", "fp32", "--steps", "4", "--json"]) == 0, \
        capsys.readouterr().err
    d = json.loads(capsys.readouterr().out)
    calls = {p["name"]: p["calls"] for p in d["parts"]}
    assert calls == {"text_encoder": 2, "vae_encoder": 1, "unet": 4, "vae_decoder": 1}
    assert (d["width"], d["height"]) == (512, 512)
    unet = next(p for p in d["parts"] if p["name"] == "unet")
    assert unet["weight_bytes"] > 3e9  # the file's 865M UNet values, bound as float32



def test_an_inpainting_file_on_an_inpainting_folder_is_not_said_to_be_v(tmp_path, caplog):
    """``--weights`` with an SD 2.x inpainting file onto an SD 2.x inpainting ONNX folder: the file is eps (A1111's
    config_sd2_inpainting; ComfyUI's weight test skips 9-channel UNets, as open_single_file does), so no weight
    spread makes it v; the warning said v-prediction for a file whose last norm bias is spread wide. (The tiny LDM
    file's blocks do not map onto the tiny ONNX export, so the checkpoint load_weights returns is given as it is.)"""
    import logging
    from types import SimpleNamespace

    from sdrt.checkpoint.files import SD2_V_KEY

    register("reference")
    f = tmp_path / "sd2_inpainting_finetune.safetensors"
    f.write_bytes(b"")
    wide = {SD2_V_KEY: np.random.default_rng(0).normal(0, 0.5, 64).astype(np.float32)}  # std 0.5: v by the test
    with pipelines.load(FOLDER, backend="reference") as pipe:
        for family, said in (("SD 2.x inpainting", False), ("SD 2.x", True)):  # a plain SD 2.x file is still v
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="sdrt"):
                pipe.weights._follow_prediction(SimpleNamespace(path=f, weights=wide, family=family))
            assert bool([r for r in caplog.records if "v-prediction" in r.getMessage()]) == said, (family, caplog.text)
            assert (pipe.family.prediction == "v") == said


@pytest.mark.parametrize(("unet", "encoders", "family"), [
    ("sd1_inpaint_unet", (("clip_l", "cond_stage_model.transformer.", "clip"),), "sd1-inpaint"),
    ("sd1_inpaint_unet", (), "sd1-inpaint"),
    ("sdxl_inpaint_unet", (("clip_l", "conditioner.embedders.0.transformer.", "clip"),
                           ("clip_g", "conditioner.embedders.1.model.", "openclip")), "sdxl-inpaint"),
    ("sdxl_inpaint_unet", (), "sdxl-inpaint"),
    ("sd2_inpaint_unet", (), "sd2-inpaint"),
])
def test_other_nine_channel_unets_are_not_sd2_inpainting(unet, encoders, family):
    """Every 9-channel UNet full size (with its file's text encoders, or alone): only SD 2.x's is sd2-inpaint."""
    shapes = h.unet_tensors(_g(unet), sparse=True)
    for graph, prefix, kind in encoders:
        shapes.update((h.clip_tensors if kind == "clip" else h.openclip_tensors)(_g(graph), prefix, sparse=True))
    assert identify(shapes).family == family


def test_a_diffusers_folder_bound_onto_a_folder_samples_as_its_scheduler_config_says(tmp_path):
    """A diffusers folder given to load_weights / --weights carries its prediction in scheduler_config.json; a
    v-prediction one bound onto an eps ONNX folder ran as eps without a word (only single files were read)."""
    import json
    import shutil

    register("reference")
    v = tmp_path / "v-folder"
    shutil.copytree(DIFFUSERS, v)
    config = v / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "prediction_type": "v_prediction",
                                  "rescale_betas_zero_snr": True}))
    with pipelines.load(FOLDER, backend="reference") as pipe:
        assert pipe.family.prediction == "eps"
        pipe.load_weights(v)
        assert pipe.family.prediction == "v"
        config = pipe.family.scheduler_config()
        assert config["prediction_type"] == "v_prediction" and config["rescale_betas_zero_snr"] is True
        pipe.load_weights(DIFFUSERS)  # its own config says epsilon: the folder's scheduler again
        assert pipe.family.prediction == "eps" and pipe.family.scheduler_overrides == {}
