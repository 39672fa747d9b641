"""Playground v2.5 and CosXL as people download them, against diffusers' images (scripts/make_edm_refs.py).

- a diffusers folder of safetensors (Playground's layout: ``scheduler/`` an ``EDMDPMSolverMultistepScheduler``,
  ``vae/config.json`` with ``latents_mean`` / ``latents_std``), written from tiny-sdxl's weights;
- single files in LDM names with ``edm_mean`` / ``edm_std`` (Playground v2.5: the keys' values are the latent stats,
  the release's EDM scheduler) or ``edm_vpred.sigma_min`` / ``edm_vpred.sigma_max`` (CosXL), with the VAE baked in;
- ``sdrt generate`` on the Playground file.

The full-size shipped graphs are too heavy here: the files bind onto tiny-sdxl's graphs stripped of their weights
(``graph_paths=``, as test_single_file_pipeline.py does). Every image must match diffusers' with
test_pipelines_diffusers.py's tolerance.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h

from sdrt import pipelines
from sdrt.cli import main
from sdrt.errors import InputError
from sdrt.graph import Graph
from sdrt.samplers import EDMSchedule

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS / "pipelines"))
from edm_helpers import COMMON, REFS, SPEC, case_kwargs, edm_copy, ref_name  # noqa: E402
from pipeline_helpers import assert_matches_diffusers, register  # noqa: E402

XL = TESTS / "data" / "pipelines" / "tiny-sdxl"
PARTS = ["unet", "text_encoder", "text_encoder_2", "vae_decoder", "vae_encoder"]
TOKENIZERS = {"tokenizer": XL / "tokenizer", "tokenizer_2": XL / "tokenizer_2"}
PLAYGROUND_TXT = SPEC["cases"][0]
PLAYGROUND_IMG = SPEC["cases"][2]
COSXL = SPEC["cases"][3]


def _xl_tensors(with_vae: bool = True) -> dict:
    out = {**h.unet_tensors(Graph.load(XL / "unet" / "model.onnx")),
           **h.clip_tensors(Graph.load(XL / "text_encoder" / "model.onnx"), "conditioner.embedders.0.transformer."),
           **h.openclip_tensors(Graph.load(XL / "text_encoder_2" / "model.onnx"), "conditioner.embedders.1.model.")}
    if with_vae:
        out.update(h.vae_tensors(Graph.load(XL / "vae_decoder" / "model.onnx"),
                                 Graph.load(XL / "vae_encoder" / "model.onnx"), "first_stage_model."))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("edm-files")
    vae = SPEC["playground"]["vae"]
    base = _xl_tensors()
    playground = h.write(tmp / "playground-v2.5-tiny.safetensors", {
        **base, "edm_mean": np.asarray(vae["latents_mean"], np.float32).reshape(1, 4, 1, 1),
        "edm_std": np.asarray(vae["latents_std"], np.float32).reshape(1, 4, 1, 1)})
    cos = SPEC["cosxl"]["scheduler"]
    cosxl = h.write(tmp / "cosxl-tiny.safetensors", {**base, "edm_vpred.sigma_min": np.float32(cos["sigma_min"]),
                                                     "edm_vpred.sigma_max": np.float32(cos["sigma_max"])})
    plain = h.write(tmp / "sdxl-tiny.safetensors", base)
    return {"playground": playground, "cosxl": cosxl, "plain": plain, "graphs": tmp / "g", "tmp": tmp,
            **{f"graph:{p}": g for p, g in h.stripped(XL, PARTS, tmp / "g").items()}}


def _graphs(files: dict) -> dict[str, Path]:
    return {k.removeprefix("graph:"): v for k, v in files.items() if k.startswith("graph:")}


def _run(model, case: dict, files: dict, **load) -> list[np.ndarray]:
    register("reference")
    with pipelines.load(model, backend="reference", graph_paths=_graphs(files), **load) as pipe:
        assert pipe.folder.family == "sdxl" and isinstance(pipe.schedule, EDMSchedule)
        return pipe(COMMON["prompt"], COMMON["negative_prompt"], **case_kwargs(case))


@pytest.mark.parametrize("case", [PLAYGROUND_TXT, PLAYGROUND_IMG], ids=ref_name)
def test_playground_diffusers_folder_matches_diffusers(case: dict, files, tmp_path) -> None:
    """Playground v2.5's diffusers folder (EDM scheduler, VAE latent stats) as safetensors: diffusers' image."""
    from test_diffusers_folder import _diffusers_folder

    onnx = edm_copy("playground", tmp_path / "onnx")
    folder = _diffusers_folder(onnx, tmp_path / "playground-v2.5-1024px-aesthetic", "StableDiffusionXLPipeline")
    assert_matches_diffusers(_run(folder, case, files), REFS[ref_name(case)])


@pytest.mark.parametrize("case", [PLAYGROUND_TXT, PLAYGROUND_IMG], ids=ref_name)
def test_playground_single_file_matches_diffusers(case: dict, files) -> None:
    """An LDM-named SDXL file with edm_mean / edm_std (its VAE baked in): the release's EDM scheduler, scaling 0.5
    and the keys' latent stats, as diffusers' single-file loader reads them; diffusers' image."""
    register("reference")
    with pipelines.load(files["playground"], backend="reference", graph_paths=_graphs(files),
                        tokenizers=TOKENIZERS) as pipe:
        f = pipe.folder
        assert f.scheduler["_class_name"] == "EDMDPMSolverMultistepScheduler" and f.prediction == "eps"
        assert f.configs["vae_decoder"]["scaling_factor"] == 0.5
        np.testing.assert_allclose(f.configs["vae_decoder"]["latents_std"], SPEC["playground"]["vae"]["latents_std"],
                                   rtol=1e-6)
        got = pipe(COMMON["prompt"], COMMON["negative_prompt"], **case_kwargs(case))
    assert_matches_diffusers(got, REFS[ref_name(case)])


def test_cosxl_single_file_matches_diffusers(files) -> None:
    """CosXL's edm_vpred.sigma_min / sigma_max keys: v-prediction EDM, sigma_data 1, the keys' sigmas (0.002..120),
    the SDXL VAE's own scaling; diffusers' EDMEulerScheduler image (exponential sigmas: "Euler Exponential")."""
    register("reference")
    with pipelines.load(files["cosxl"], backend="reference", graph_paths=_graphs(files), tokenizers=TOKENIZERS) as pipe:
        ms = pipe.schedule
        assert (ms.prediction, ms.sigma_data, ms.sigma_max) == ("v", 1.0, 120.0)
        assert pipe.family.latent_stats is None
        got = pipe(COMMON["prompt"], COMMON["negative_prompt"], **case_kwargs(COSXL))
    assert_matches_diffusers(got, REFS[ref_name(COSXL)])


def test_cli_generate_on_a_playground_file(files, monkeypatch, tmp_path, capsys) -> None:
    """``sdrt generate playground.safetensors`` (the shipped graphs and tokenizers stood in for by tiny-sdxl's)."""
    from PIL import Image

    from sdrt.checkpoint import files as ckfiles
    from sdrt.pipelines.png import read_parameters

    graphs = _graphs(files)
    names = {"sdxl_unet": "unet", "clip_l": "text_encoder", "clip_g": "text_encoder_2", "vae4_decoder": "vae_decoder",
             "vae4_encoder": "vae_encoder"}
    monkeypatch.setattr(ckfiles, "shipped_graph", lambda name: graphs[names[name]])
    monkeypatch.setattr(ckfiles, "release_tokenizer",
                        lambda name: XL / ("tokenizer_2" if name == "clip-pad-bang" else "tokenizer"))
    out = tmp_path / "out.png"
    case = PLAYGROUND_TXT
    rc = main(["generate", str(files["playground"]), COMMON["prompt"], "--negative", COMMON["negative_prompt"],
               "--steps", str(COMMON["steps"]), "--cfg", str(COMMON["cfg"]), "--sampler", case["sampler"],
               "--seed", str(COMMON["seed"]), "--width", "64", "--height", "64", "--backend", "reference",
               "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    got = np.asarray(Image.open(out).convert("RGB"))
    assert_matches_diffusers([got], REFS[ref_name(case)])
    text = read_parameters(out)
    assert "Model: playground-v2.5-tiny," in text and "Sampler: DPM++ 2M" in text
    assert main(["generate", str(files["playground"]), "x", "--dry-run", "--backend", "reference", "--width", "64",
                 "--height", "64"]) == 0
    assert "model sampling edm eps (sigma 0.002..80, sigma_data 0.5)" in capsys.readouterr().out


def test_an_edm_checkpoint_is_not_bound_onto_a_ddpm_model(files, tmp_path) -> None:
    """load_weights (--weights): Playground's file onto plain SDXL would be sampled with SDXL's betas, a plain SDXL
    file onto Playground with EDM, CosXL's (v, sigma_data 1) onto Playground (eps, 0.5): each is refused in one line
    before anything changes."""
    register("reference")
    with pipelines.load(XL, backend="reference") as pipe:
        with pytest.raises(InputError, match="playground-v2.5-tiny.safetensors is Playground v2.5 .*run it as the "
                                             "model itself") as e:
            pipe.load_weights(files["playground"])
        assert "\n" not in str(e.value) and pipe.weights.checkpoint is None
    with pipelines.load(edm_copy("playground", tmp_path / "pg"), backend="reference") as pipe:
        with pytest.raises(InputError, match="sdxl-tiny.safetensors is not EDM-trained"):
            pipe.load_weights(files["plain"])
        with pytest.raises(InputError, match="cosxl-tiny.safetensors is CosXL .*predicting v_prediction with "
                                             "sigma_data 1, and this model .* epsilon and sigma_data 0.5"):
            pipe.load_weights(files["cosxl"])
        pipe.load_weights(files["playground"])  # Playground onto Playground: bound
        assert pipe.weights.checkpoint is not None


def test_an_x0_prediction_on_an_edm_file_is_refused_in_one_line(files, capsys) -> None:
    """``--prediction sample`` (x0, landed beside EDM) on a Playground file: EDM's preconditioning is for eps or v
    outputs, so it is refused in the caller's words before anything loads; it raised EDMSchedule's own error."""
    from sdrt.checkpoint.files import open_single_file
    from sdrt.errors import ModelError

    with pytest.raises(ModelError, match=r"playground-v2.5-tiny.safetensors is Playground v2.5.*prediction 'sample' "
                                         r"does not apply to its EDM sampling"):
        open_single_file(files["playground"], prediction="sample", graph_paths=_graphs(files))
    assert main(["generate", str(files["playground"]), "x", "--prediction", "sample", "--dry-run", "--backend",
                 "reference", "--width", "64", "--height", "64"]) == 1
    err = capsys.readouterr().err
    assert "--prediction" in err and "does not apply to its EDM sampling" in err and err.count("\n") == 1, err
