"""A diffusers folder of ``.safetensors`` (no ONNX parts) runs on the shipped graphs (issue 33, point 2).

The folders are written here from the tiny ONNX folders' own weights, in the names the hub's folders use
(diffusers' for ``unet/`` and ``vae/``, transformers' ``text_model.*`` for ``text_encoder*/``), with the
ONNX folder's tokenizers, scheduler config and VAE config. Full-size shipped graphs are too heavy to run
here, so they bind onto the ONNX folder's graphs stripped of their weights (``graph_paths=``, as in
test_single_file_pipeline.py); everything else is the diffusers-folder path. The image must equal the
ONNX folder's own, byte for byte. The scheduler and VAE configs are changed (trailing spacing, another
scaling factor) in both folders, so an equal image shows the folder's own configs were used, not the
release's; the tiny tokenizers' vocabulary is not CLIP's, so it shows the folder's tokenizers were used.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h

from sdrt import pipelines
from sdrt.checkpoint.diffusers_folder import denoiser_family, is_diffusers_folder, weight_files
from sdrt.cli import main
from sdrt.errors import ModelError, ModelNotFoundError, SdrtError
from sdrt.graph import Graph
from sdrt.pipelines import ModelFolder
from sdrt.pipelines.png import read_parameters
from sdrt.weights import Weights, stfile

TESTS = Path(__file__).resolve().parent.parent
SD15 = TESTS / "data" / "pipelines" / "tiny-sd15"
XL = TESTS / "data" / "pipelines" / "tiny-sdxl"
QUICK = dict(steps=3, cfg=7.0, sampler="Euler", seed=1234, width=64, height=64)


def _onnx_copy(src: Path, out: Path) -> Path:
    """The ONNX folder with its scheduler and VAE configs changed as the diffusers folder's are."""
    shutil.copytree(src, out)
    sched = out / "scheduler" / "scheduler_config.json"
    sched.write_text(json.dumps({**json.loads(sched.read_text()), "timestep_spacing": "trailing"}))
    for part in ("vae_decoder", "vae_encoder"):
        cfg = out / part / "config.json"
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "scaling_factor": 0.13025}))
    return out


def _diffusers_folder(src: Path, out: Path, pipeline_class: str, *, shards: int = 1) -> Path:
    """``src`` (an ONNX folder, already ``_onnx_copy``'d) written as the hub's diffusers folder of safetensors."""
    out.mkdir()
    index = json.loads((src / "model_index.json").read_text())
    index["_class_name"] = pipeline_class
    (out / "model_index.json").write_text(json.dumps(index))
    for d in ("scheduler", "tokenizer", "tokenizer_2"):
        if (src / d).is_dir():
            shutil.copytree(src / d, out / d)
    (out / "unet").mkdir()
    shutil.copy(src / "unet" / "config.json", out / "unet" / "config.json")
    unet = h._torch_layout(Graph.load(src / "unet" / "model.onnx"), False)
    if shards == 1:
        h.write(out / "unet" / "diffusion_pytorch_model.safetensors", unet)
    else:
        names = sorted(unet)
        weight_map = {}
        for i in range(shards):
            fname = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
            chunk = names[i::shards]
            h.write(out / "unet" / fname, {k: unet[k] for k in chunk})
            weight_map.update(dict.fromkeys(chunk, fname))
        (out / "unet" / "diffusion_pytorch_model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))
    for te in ("text_encoder", "text_encoder_2"):
        if (src / te).is_dir():
            (out / te).mkdir()
            shutil.copy(src / te / "config.json", out / te / "config.json")
            tensors = {k: np.ascontiguousarray(v, np.float32)
                       for k, v in h.clip_tensors(Graph.load(src / te / "model.onnx"), "").items()}
            # the int64 buffer that transformers before 4.31 saved with CLIP (the SD 1.5 release's file has it)
            tensors["text_model.embeddings.position_ids"] = np.arange(77, dtype=np.int64)[None]
            stfile.write(out / te / "model.safetensors", tensors)
    (out / "vae").mkdir()
    shutil.copy(src / "vae_decoder" / "config.json", out / "vae" / "config.json")
    h.write(out / "vae" / "diffusion_pytorch_model.safetensors",
            h.vae_tensors(Graph.load(src / "vae_decoder" / "model.onnx"), Graph.load(src / "vae_encoder" / "model.onnx")))
    return out


@pytest.fixture(scope="module")
def sd15(tmp_path_factory) -> tuple[Path, Path, dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("diffusers-sd15")
    onnx = _onnx_copy(SD15, tmp / "tiny-sd15-onnx")
    folder = _diffusers_folder(onnx, tmp / "tiny-sd15", "StableDiffusionPipeline")
    graphs = h.stripped(onnx, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp / "g")
    return onnx, folder, graphs


def test_sd15_diffusers_folder_gives_the_onnx_folders_image(sd15):
    onnx, folder, graphs = sd15
    with pipelines.load(folder, backend="reference", graph_paths=graphs) as pipe:
        f = pipe.folder
        assert (f.family, f.prediction, f.name) == ("sd1", "eps", "tiny-sd15")
        assert f.scheduler["timestep_spacing"] == "trailing" and f.vae_scaling_factor == 0.13025
        assert f.tokenizers["tokenizer"] == folder / "tokenizer"
        assert all(Graph.load(p.path).is_stripped for p in pipe.parts.values())
        gen = pipe.generate("a red cat", "blurry", **QUICK)
    with pipelines.load(onnx, backend="reference") as ref:
        want = ref("a red cat", "blurry", **QUICK)[0]
    assert gen.images[0].tobytes() == want.tobytes()
    unet_file = folder / "unet" / "diffusion_pytorch_model.safetensors"
    info = gen.settings[0]
    assert info["Model"] == "tiny-sd15"
    assert info["Model hash"] == hashlib.sha256(unet_file.read_bytes()).hexdigest()[:10]


def test_sharded_unet_and_fp16_variant(sd15, tmp_path):
    """A sharded UNet (with its index) gives the same image; of plain and ``.fp16`` files the plain ones are
    taken, and an fp16-only folder takes the fp16 files; a shard the index lists but the folder lacks is named."""
    onnx, single, graphs = sd15
    folder = _diffusers_folder(onnx, tmp_path / "sharded", "StableDiffusionPipeline", shards=2)
    shards = weight_files(folder / "unet")
    assert [p.name for p in shards] == [f"diffusion_pytorch_model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    with pipelines.load(folder, backend="reference", graph_paths=graphs) as pipe:  # the model's size: every shard
        assert set(shards) <= set(pipe.folder.single_file.all_files)
    with pipelines.load(single, backend="reference", graph_paths=graphs) as pipe:
        want = pipe("a red cat", "blurry", **QUICK)[0]
    with pipelines.load(folder, backend="reference", graph_paths=graphs) as pipe:
        got = pipe("a red cat", "blurry", **QUICK)[0]
    assert got.tobytes() == want.tobytes()
    vae = folder / "vae"
    h.write(vae / "diffusion_pytorch_model.fp16.safetensors", {"x": np.zeros(1)})
    assert [p.name for p in weight_files(vae)] == ["diffusion_pytorch_model.safetensors"]
    (vae / "diffusion_pytorch_model.safetensors").unlink()
    assert [p.name for p in weight_files(vae)] == ["diffusion_pytorch_model.fp16.safetensors"]
    shards[1].unlink()
    with pytest.raises(ModelNotFoundError, match="lacks shards its diffusion_pytorch_model.safetensors.index.json "
                                                 "lists: diffusion_pytorch_model-00002-of-00002"):
        weight_files(folder / "unet")


def test_sdxl_diffusers_folder_gives_the_onnx_folders_image(tmp_path):
    onnx = _onnx_copy(XL, tmp_path / "tiny-sdxl-onnx")
    folder = _diffusers_folder(onnx, tmp_path / "tiny-sdxl", "StableDiffusionXLPipeline")
    graphs = h.stripped(onnx, ["unet", "text_encoder", "text_encoder_2", "vae_decoder", "vae_encoder"], tmp_path / "g")
    kw = dict(steps=3, cfg=5.0, sampler="Euler a", seed=7, width=64, height=64)
    with pipelines.load(folder, backend="reference", graph_paths=graphs) as pipe:
        assert pipe.folder.family == "sdxl"
        assert pipe.folder.tokenizers["tokenizer_2"] == folder / "tokenizer_2"
        got = pipe("a red cat", "blurry", **kw)[0]
    with pipelines.load(onnx, backend="reference") as ref:
        want = ref("a red cat", "blurry", **kw)[0]
    assert got.tobytes() == want.tobytes()


def test_cli_generates_from_a_diffusers_folder(sd15, tmp_path, monkeypatch, capsys):
    """``sdrt generate FOLDER "prompt"`` writes the API's image, with the folder's name as ``Model:`` (the shipped
    graphs replaced by the tiny stripped ones, as test_single_file_pipeline.py's ``tiny_shipped`` does)."""
    from sdrt.checkpoint import diffusers_folder

    _, folder, graphs = sd15
    names = {"sd1_unet": "unet", "clip_l": "text_encoder", "vae4_decoder": "vae_decoder", "vae4_encoder": "vae_encoder"}
    monkeypatch.setattr(diffusers_folder, "shipped_graph", lambda name: graphs[names[name]])
    out = tmp_path / "out.png"
    rc = main(["generate", str(folder), "a red cat", "--steps", "2", "--sampler", "Euler", "--seed", "3",
               "--width", "64", "--height", "64", "--backend", "reference", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    with pipelines.load(folder, backend="reference", graph_paths=graphs) as pipe:
        want = pipe("a red cat", steps=2, sampler="Euler", seed=3, width=64, height=64)[0]
    from PIL import Image

    assert np.asarray(Image.open(out).convert("RGB")).tobytes() == want.tobytes()
    assert "Model: tiny-sd15," in read_parameters(out)


def test_cli_dry_run_on_a_full_size_diffusers_folder(tmp_path, capsys):
    """A full-size SD 1.5 diffusers folder (sparse files: headers only), planned on the shipped graphs."""
    from sdrt.checkpoint import shipped_graph

    def g(name):
        return Graph.load(shipped_graph(name))

    root = tmp_path / "stable-diffusion-v1-5"
    for d in ("unet", "text_encoder", "vae", "scheduler"):
        (root / d).mkdir(parents=True)
    shutil.copytree(SD15 / "tokenizer", root / "tokenizer")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    sched = json.loads((SD15 / "scheduler" / "scheduler_config.json").read_text())
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps({**sched, "_class_name": "DDIMScheduler"}))
    h.sparse(root / "unet" / "diffusion_pytorch_model.fp16.safetensors", h._torch_layout(g("sd1_unet"), True))
    h.sparse(root / "text_encoder" / "model.fp16.safetensors", h.clip_tensors(g("clip_l"), "", sparse=True))
    h.sparse(root / "vae" / "diffusion_pytorch_model.fp16.safetensors",
             h.vae_tensors(g("vae4_decoder"), g("vae4_encoder"), sparse=True))
    assert main(["generate", str(root), "a red fox", "--dry-run", "--backend", "reference"]) == 0
    out = capsys.readouterr().out
    assert "SD 1.x (sd1), txt2img, 512x512" in out and "unet (denoiser): 20 call(s)" in out
    assert "sd1_unet-" in out and "[2, 4, 64, 64]" in out
    with pipelines.load(root, backend="reference") as pipe:  # nothing compiles until it runs
        assert pipe.folder.scheduler["_class_name"] == "DDIMScheduler" and pipe.default_size == 512
        assert pipe.folder.single_file.dtypes["unet"] == {"float16"}
    assert ModelFolder.open(root).family == "sd1"  # ModelFolder.open takes it too (sdrt serve's folders)


def test_a_vae_file_replaces_the_diffusers_folders_vae(sd15, tmp_path):
    """``vae=`` on a diffusers folder: the file's tensors (LDM names) replace the folder's VAE weights, giving
    the VAE outputs of the ONNX folder with that file; the UNet keeps the folder's own."""
    onnx, folder, graphs = sd15
    dec, enc = (Graph.load(onnx / p / "model.onnx") for p in ("vae_decoder", "vae_encoder"))
    rng = np.random.default_rng(0)
    # other values (equal tensors stay equal: the export merged some); diffusers' names, as sdxl-vae ships
    vae = h.write(tmp_path / "other_vae.safetensors", {k: v * 1.5 for k, v in h.vae_tensors(dec, enc).items()})
    z = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    with pipelines.load(folder, backend="reference", graph_paths=graphs, vae=vae) as pipe:
        got = pipe.vae_decoder.run({"latent_sample": z})
        own = pipelines.load(folder, backend="reference", graph_paths=graphs)
    with pipelines.load(onnx, backend="reference", vae=vae) as ref:
        want = ref.vae_decoder.run({"latent_sample": z})
    with own:
        before = own.vae_decoder.run({"latent_sample": z})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        assert not np.array_equal(got[k], before[k])


def test_sdrt_serve_lists_a_diffusers_folder(sd15, tmp_path, monkeypatch, caplog):
    """``sdrt serve --models DIR``: a diffusers folder of .safetensors is listed beside the ONNX folders, under its
    name, with A1111's short hash of its UNet file; a folder with model_index.json and no weights is skipped."""
    from sdrt.serve.registry import Registry

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    onnx, folder, _ = sd15
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(folder, models / "tiny-diffusers")
    (models / "empty" / "unet").mkdir(parents=True)
    shutil.copy(folder / "model_index.json", models / "empty")
    with caplog.at_level("WARNING", logger="sdrt.serve.registry"):
        reg = Registry(models)
    by_name = {m.name: m for m in reg.models}
    assert list(by_name) == ["tiny-diffusers"] and "skipping" in caplog.text and "empty" in caplog.text
    unet = folder / "unet" / "diffusion_pytorch_model.safetensors"
    assert by_name["tiny-diffusers"].path == models / "tiny-diffusers"
    assert by_name["tiny-diffusers"].hash == hashlib.sha256(unet.read_bytes()).hexdigest()[:10]


def test_a_single_file_with_clips_position_ids_binds(tmp_path):
    """A1111's SD 1.5 files hold ``cond_stage_model.transformer.text_model.embeddings.position_ids`` (int64, saved by
    transformers < 4.31): it is a buffer the graphs keep themselves, not a weight, and must not stop the file binding
    (it did: 'checkpoint weights have no place in the graph')."""
    from ckpt_data import DATA, PIPE_FOLDER

    from sdrt.checkpoint import open_single_file
    from sdrt.weights import Weights

    w = Weights.open(DATA / "pipe-sd15" / "custom.safetensors")
    items = {k: np.asarray(w[k]) for k in w}
    items["cond_stage_model.transformer.text_model.embeddings.position_ids"] = np.arange(77, dtype=np.int64)[None]
    stfile.write(tmp_path / "v1-5-like.safetensors", items)
    graphs = h.stripped(PIPE_FOLDER, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp_path / "g")
    opened = open_single_file(tmp_path / "v1-5-like.safetensors", graph_paths=graphs)
    assert opened.family == "sd1" and "text_encoder" in opened.parts


def test_family_from_the_denoisers_tensors():
    assert denoiser_family({"conv_in.weight": (320, 4, 3, 3), "down_blocks.0.attentions.0.proj_in.weight":
                            (320, 320, 1, 1)})[0] == "sd1"
    assert denoiser_family({"conv_in.weight": (320, 9, 3, 3), "down_blocks.0.attentions.0.proj_in.weight":
                            (320, 320, 1, 1)})[0] == "sd1-inpaint"
    assert denoiser_family({"conv_in.weight": (320, 4, 3, 3), "down_blocks.0.attentions.0.proj_in.weight":
                            (320, 320)})[0] == "sd2"
    assert denoiser_family({"conv_in.weight": (320, 9, 3, 3), "down_blocks.0.attentions.0.proj_in.weight":
                            (320, 320)})[0] == "sd2-inpaint"
    assert denoiser_family({"conv_in.weight": (320, 4, 3, 3), "down_blocks.1.attentions.0.proj_in.weight": (640, 640),
                            "add_embedding.linear_1.weight": (1280, 2816)})[0] == "sdxl"
    flux = {"x_embedder.weight": (3072, 64), "single_transformer_blocks.0.proj_out.weight": (3072, 15360)}
    assert denoiser_family(flux)[0] == "flux-schnell"
    assert denoiser_family({**flux, "time_text_embed.guidance_embedder.linear_1.weight": (3072, 256)})[0] == "flux-dev"
    sd3 = {"pos_embed.proj.weight": (1536, 16, 2, 2), "context_embedder.weight": (1536, 4096),
           "transformer_blocks.0.attn.norm_q.weight": (64,)}
    assert denoiser_family({**sd3, "transformer_blocks.0.attn2.to_q.weight": (1536, 1536)})[0] == "sd35-medium"
    assert denoiser_family(sd3)[0] == "sd35-large"
    sd3_medium = {k: v for k, v in sd3.items() if "norm_q" not in k}
    assert denoiser_family({**sd3_medium, "transformer_blocks.0.attn.to_q.weight": (1536, 1536)})[0] == "sd3-medium"


# -- errors -----------------------------------------------------------------------------------------
def test_a_folder_of_pytorch_bin_files_is_a_diffusers_folder(tmp_path):
    """Older hub folders hold ``diffusion_pytorch_model.bin`` / ``pytorch_model.bin`` (torch pickles, read by
    sdrt.weights.torchfile); .safetensors beside them win."""
    src = Path(__file__).resolve().parent.parent / "data" / "torch" / "views.pt"
    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "diffusion_pytorch_model.bin").write_bytes(src.read_bytes())
    assert is_diffusers_folder(tmp_path)
    assert [p.name for p in weight_files(tmp_path / "unet")] == ["diffusion_pytorch_model.bin"]
    assert Weights.open(weight_files(tmp_path / "unet"))["t"].shape == (6, 4)
    h.write(tmp_path / "unet" / "diffusion_pytorch_model.safetensors", {"x": np.zeros(1, np.float32)})
    assert [p.name for p in weight_files(tmp_path / "unet")] == ["diffusion_pytorch_model.safetensors"]


def test_a_training_runs_state_beside_the_bin_weights_is_not_read(tmp_path):
    """transformers' Trainer saves ``training_args.bin`` (a pickled TrainingArguments), ``optimizer.pt``,
    ``scheduler.pt`` and ``rng_state.pth`` beside ``pytorch_model.bin``; torchfile refuses those pickles (they name
    classes), so taking them as weights refused the whole folder."""
    import argparse
    import pickle

    src = Path(__file__).resolve().parent.parent / "data" / "torch" / "views.pt"
    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "pytorch_model.bin").write_bytes(src.read_bytes())
    state = pickle.dumps(argparse.Namespace(learning_rate=1e-4), protocol=2)
    for name in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "Scaler.PT",
                 # accelerate's save_state: the second optimizer/scheduler, data-loader samplers, custom objects
                 "optimizer_1.bin", "scheduler_1.bin", "sampler.bin", "sampler_1.bin", "random_states_0.pkl",
                 "custom_checkpoint_0.pkl"):
        (tmp_path / "unet" / name).write_bytes(state)
    with pytest.raises(SdrtError, match="training_args.bin is a pickle"):  # what reading one as weights says
        Weights.open([tmp_path / "unet" / "training_args.bin"])
    assert [p.name for p in weight_files(tmp_path / "unet")] == ["pytorch_model.bin"]
    assert Weights.open(weight_files(tmp_path / "unet"))["t"].shape == (6, 4)


def test_an_empty_unet_folder_is_named(sd15, tmp_path):
    _, src, _ = sd15
    folder = tmp_path / "broken"
    shutil.copytree(src, folder)
    for f in (folder / "unet").iterdir():
        f.unlink()
    with pytest.raises(ModelNotFoundError) as err:
        pipelines.load(folder, backend="reference")
    msg = str(err.value)
    assert "\n" not in msg and "unet" in msg and "holds no .safetensors" in msg
    # model_index.json and an empty unet/ only (no weights at all): today's ONNX-folder error, naming the part
    bare = tmp_path / "bare"
    (bare / "unet").mkdir(parents=True)
    shutil.copy(src / "model_index.json", bare)
    with pytest.raises(SdrtError) as err:
        pipelines.load(bare, backend="reference")
    assert "\n" not in str(err.value) and "unet" in str(err.value)


def test_a_missing_part_and_a_wrong_class_name_are_named(sd15, tmp_path):
    _, src, graphs = sd15
    folder = tmp_path / "novae"
    shutil.copytree(src, folder)
    shutil.rmtree(folder / "vae")
    with pytest.raises(ModelNotFoundError, match=r"no vae weights \(SD 1.x needs a 4-channel VAE"):
        pipelines.load(folder, backend="reference", graph_paths=graphs)
    wrong = tmp_path / "wrong"
    shutil.copytree(src, wrong)
    index = json.loads((wrong / "model_index.json").read_text())
    (wrong / "model_index.json").write_text(json.dumps({**index, "_class_name": "FluxPipeline"}))
    with pytest.raises(ModelError, match="model_index.json names FluxPipeline and the unet's tensors are an SD 1.x"):
        pipelines.load(wrong, backend="reference", graph_paths=graphs)


def test_cli_names_the_empty_unet(sd15, tmp_path, capsys):
    _, src, _ = sd15
    folder = tmp_path / "broken"
    shutil.copytree(src, folder)
    (folder / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    assert main(["generate", str(folder), "a red cat", "--backend", "reference", "--dry-run"]) != 0
    err = capsys.readouterr().err
    assert "unet" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1



# -- every family, full size (sparse files: headers only) -------------------------------------------
_CLASSES = {"sd1": "StableDiffusionPipeline", "sd1-inpaint": "StableDiffusionInpaintPipeline",
            "sd2": "StableDiffusionPipeline", "sd2-inpaint": "StableDiffusionInpaintPipeline",
            "sdxl": "StableDiffusionXLPipeline",
            "sdxl-inpaint": "StableDiffusionXLInpaintPipeline", "sd3-medium": "StableDiffusion3Pipeline",
            "sd35-medium": "StableDiffusion3Pipeline",
            "sd35-large": "StableDiffusion3Pipeline", "flux-dev": "FluxPipeline", "flux-schnell": "FluxPipeline",
            "flux-fill": "FluxFillPipeline", "flux-control": "FluxControlPipeline", "chroma": "ChromaPipeline"}


@pytest.mark.parametrize("family", sorted(_CLASSES))
def test_every_family_as_a_full_size_diffusers_folder(family, tmp_path):
    """Each family's folder in diffusers/transformers names (the names of the shipped graphs, which were exported
    from diffusers' and transformers' modules), fp16 variants only, T5 in two shards: the family is read from the
    denoiser's tensors and every part binds onto its shipped graph. Without tokenizer folders the release's are
    used; the folder's scheduler config is its own."""
    from sdrt.checkpoint import FAMILY_GRAPHS, open_diffusers_folder, release_defaults, shipped_graph
    from sdrt.checkpoint.files import graph_kind

    def g(name):
        return Graph.load(shipped_graph(name))

    root = tmp_path / family
    (root / "scheduler").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": _CLASSES[family]}))
    sched = {**release_defaults(family)["scheduler"], "shift": 2.5}
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(sched))
    for part, gname in FAMILY_GRAPHS[family].items():
        if part == "vae_encoder":
            continue
        if part == "vae_decoder":
            (root / "vae").mkdir()
            h.sparse(root / "vae" / "diffusion_pytorch_model.fp16.safetensors",
                     h.vae_tensors(g(gname), g(FAMILY_GRAPHS[family]["vae_encoder"]), sparse=True))
            continue
        (root / part).mkdir()
        if part in ("unet", "transformer"):
            h.sparse(root / part / "diffusion_pytorch_model.fp16.safetensors", h._torch_layout(g(gname), True))
        elif graph_kind(gname) == "t5xxl":
            shapes = h._torch_layout(g(gname), True)
            names = sorted(shapes)
            for i in (1, 2):
                h.sparse(root / part / f"model.fp16-0000{i}-of-00002.safetensors", {k: shapes[k] for k in names[i - 1::2]})
        else:
            h.sparse(root / part / "model.fp16.safetensors", h.clip_tensors(g(gname), "", sparse=True))
    opened = open_diffusers_folder(root)
    assert opened.family == family and set(opened.parts) == set(FAMILY_GRAPHS[family])
    assert opened.scheduler_config()["shift"] == 2.5
    with pipelines.load(root, backend="reference") as pipe:  # nothing compiles until it runs
        assert pipe.folder.single_file.family == family and pipe.folder.name == family
