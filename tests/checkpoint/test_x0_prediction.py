"""x0-prediction UNets: SDXL-Lightning's 1-step ``sdxl_lightning_1step_unet_x0.safetensors`` predicts the denoised
sample, and ByteDance runs it with ``EulerDiscreteScheduler(prediction_type="sample", timestep_spacing="trailing")``.
Its tensors are any SDXL UNet's, so its name (``x0`` as a word) or ``prediction="sample"`` (``--prediction sample``)
says it; sdrt ran it as an eps model before (noise).

tiny-sdxl's weights as a single file named as an x0 model, and a VAE file, on its stripped graphs, against diffusers' images of the same architecture and weights with that scheduler
(scripts/make_x0_refs.py): one step without CFG as the model card runs it, and 4 steps with CFG for Euler, DPM++ 2M
Karras and DDIM (diffusers' loops, each with its x0 arithmetic), with test_pipelines_diffusers.py's tolerance.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h
from backend_helpers import register
from ckpt_data import DATA

from sdrt import pipelines
from sdrt.graph import Graph

XL = DATA.parent / "pipelines" / "tiny-sdxl"
REFS = DATA.parent / "pipelines" / "x0_refs.npz"
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"
TOKENIZERS = {"tokenizer": XL / "tokenizer", "tokenizer_2": XL / "tokenizer_2"}


def assert_matches_diffusers(images, want: np.ndarray) -> None:
    """tests/pipelines/pipeline_helpers' bound: no value more than 1 level off, at most 0.5 % of them off at all."""
    diff = np.abs(np.stack(images).astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, f"max difference {diff.max()}, {(diff > 0).mean():.2%} differ"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """tiny-sdxl as an A1111/LDM SDXL file named as an x0 model (UNet, CLIP-L, OpenCLIP-G; the tiny text encoders are
    of one width, so separate files of them could not be told apart) and a VAE file, on its stripped graphs."""
    register("reference")
    tmp = tmp_path_factory.mktemp("x0")
    ck = h.write(tmp / "tinyxl_lightning_1step_x0.safetensors", {
        **h.unet_tensors(Graph.load(XL / "unet" / "model.onnx")),
        **h.clip_tensors(Graph.load(XL / "text_encoder" / "model.onnx"), "conditioner.embedders.0.transformer."),
        **h.openclip_tensors(Graph.load(XL / "text_encoder_2" / "model.onnx"), "conditioner.embedders.1.model.")})
    vae = h.write(tmp / "vae.safetensors", h.vae_tensors(Graph.load(XL / "vae_decoder" / "model.onnx"),
                                                         Graph.load(XL / "vae_encoder" / "model.onnx")))
    graphs = h.stripped(XL, ["unet", "text_encoder", "text_encoder_2", "vae_decoder", "vae_encoder"], tmp / "g")
    return ck, vae, graphs


def _load(files, model=None, **kw):
    ck, vae, graphs = files
    return pipelines.load(model or ck, backend="reference", vae=vae, graph_paths=graphs, tokenizers=TOKENIZERS, **kw)


def _run(pipe, sampler: str, steps: int, cfg: float) -> list:
    return pipe(PROMPT, "blurry" if cfg > 1 else "", steps=steps, cfg=cfg, sampler=sampler, seed=7, width=64,
                height=64)


@pytest.mark.parametrize("sampler,steps,cfg", [("Euler", 1, 1.0), ("Euler", 4, 5.0), ("DPM++ 2M Karras", 4, 5.0),
                                               ("DDIM", 4, 5.0)])
def test_an_x0_named_unet_gives_diffusers_sample_prediction_image(files, sampler, steps, cfg):
    with _load(files) as pipe:
        assert pipe.family.prediction == "x0" and pipe.folder.scheduler["timestep_spacing"] == "trailing"
        got = _run(pipe, sampler, steps, cfg)
    assert_matches_diffusers(got, np.load(REFS)[f"{sampler}/{steps}"])


def test_prediction_sample_says_it_for_a_file_named_otherwise(files, tmp_path):
    """The same UNet renamed: read as eps (the image far from diffusers'), and ``prediction="sample"`` makes it x0."""
    plain = shutil.copy(files[0], tmp_path / "tinyxl_lightning_1step.safetensors")
    want = np.load(REFS)["Euler/1"]
    with _load(files, plain) as pipe:
        assert pipe.family.prediction == "eps"
        eps = _run(pipe, "Euler", 1, 1.0)
    assert np.abs(np.stack(eps).astype(int) - want).mean() > 20
    with _load(files, plain, prediction="sample") as pipe:
        assert_matches_diffusers(_run(pipe, "Euler", 1, 1.0), want)


def test_an_x0_named_checkpoint_bound_onto_a_folder_runs_as_x0(files):
    """``--weights`` / ``load_weights``: an LDM file named ``..._x0`` on tiny-sdxl's ONNX folder (eps) is sampled as
    x0 with trailing timesteps while bound, as when it is the model itself; a file that says nothing gives eps back."""
    with pipelines.load(XL, backend="reference") as pipe:
        pipe.load_weights(files[0])
        assert pipe.family.prediction == "x0" and pipe.family.scheduler_config()["timestep_spacing"] == "trailing"
        assert_matches_diffusers(_run(pipe, "Euler", 4, 5.0), np.load(REFS)["Euler/4"])
        plain = shutil.copy(files[0], files[0].with_name("tinyxl_plain.safetensors"))
        pipe.load_weights(plain)
        assert pipe.family.prediction == "eps" and not pipe.family.scheduler_overrides


def test_an_onnx_folder_whose_scheduler_says_sample_runs_as_x0(tmp_path):
    """tiny-sdxl's ONNX folder with ByteDance's scheduler config (``prediction_type="sample"``, trailing), as
    ``save_pretrained`` would write it: diffusers' image (it refused "prediction_type 'sample' is not supported")."""
    import json

    register("reference")
    folder = tmp_path / "tiny-sdxl-x0"
    shutil.copytree(XL, folder)
    cfg_path = folder / "scheduler" / "scheduler_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "prediction_type": "sample",
                                    "timestep_spacing": "trailing"}))
    with pipelines.load(folder, backend="reference") as pipe:
        assert_matches_diffusers(_run(pipe, "Euler", 4, 5.0), np.load(REFS)["Euler/4"])


@pytest.mark.parametrize("name,said", [("sdxl_lightning_1step_unet_x0.safetensors", "sample"),
                                       ("sdxl_lightning_4step_unet.safetensors", "epsilon"),
                                       ("sdxl-x0.safetensors", "sample"), ("box0_unet.safetensors", "epsilon")])
def test_the_full_size_lightning_unet_file_is_told_x0_by_its_name(tmp_path, name, said):
    """ByteDance's file itself: an SDXL UNet alone in diffusers' names (sparse, headers only), read by its name."""
    from sdrt.checkpoint import open_single_file, param_map, shipped_graph

    shapes = {c: tuple(s.shape) for c, s in param_map(Graph.load(shipped_graph("sdxl_unet"))).items()}
    m = open_single_file(h.sparse(tmp_path / name, shapes), parts=["unet"])
    assert m.prediction == said
    sched = m.release["scheduler"]
    assert sched["prediction_type"] == said
    assert (sched.get("timestep_spacing") == "trailing") == (said == "sample")


def test_cli_prediction_flag_reaches_the_load_and_is_refused_on_an_onnx_folder(tmp_path, capsys):
    from sdrt.cli import main

    out = tmp_path / "z.png"
    assert main(["generate", str(XL), "a cat", "--backend", "reference", "--prediction", "sample", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "--prediction applies to a single-file checkpoint or a diffusers folder" in err and "Traceback" not in err
    assert not out.exists()


def test_x0_from_a_name_is_a_warning_a_user_sees(caplog):
    """x0 read from a file's name is a guess: it was an info line, so `sdrt generate` said nothing about sampling a
    file as x0. It is a warning naming the file and how to say otherwise; a name without x0 as a word says nothing."""
    import logging

    from sdrt.checkpoint.files import name_prediction

    with caplog.at_level(logging.INFO, logger="sdrt"):
        assert name_prediction(Path("sdxl_lightning_1step_unet_x0.safetensors")) == "sample"
        assert name_prediction(Path("box0rd_mix.safetensors")) is None
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "sdxl_lightning_1step_unet_x0.safetensors" in warned[0].getMessage()
    assert "set its prediction" in warned[0].getMessage() and len(caplog.records) == 1


def test_loading_an_x0_named_file_warns_once(files, caplog):
    """One load, one warning (the name is read once per file opened), not one per part or per run."""
    import logging

    with caplog.at_level(logging.WARNING, logger="sdrt"), _load(files) as pipe:
        _run(pipe, "Euler", 1, 1.0)
    warned = [r for r in caplog.records if "sampled as x0-prediction" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
