"""A ``.safetensors`` file is enough to generate (issue 33): ``pipelines.load(FILE)``, ``sdrt generate FILE``.

Full-size shipped graphs are too heavy to run here, so the end-to-end tests bind the files onto tiny
weight-free graphs (``graph_paths=``, the folder's own graphs stripped of their weights as sdrt ships its
graphs) with the tiny folder's tokenizers (``tokenizers=``); everything else is the single-file path: the
family and parts from the file's tensor names, the key maps, the release scheduler and VAE scaling,
``Part`` compiling a weight-free graph with the file's ``Weights``.

What each end-to-end test checks against:

- SD 1.x: ``tests/data/ckpt/pipe-sd15/custom.safetensors`` is an A1111/LDM file (written from diffusers
  by ``scripts/gen_checkpoint_data.py``) for ``tiny-sd15``'s architecture. Loaded as a single file it
  gives the image that ``tiny-sd15`` with ``load_weights(custom)`` gives, byte for byte, and on OpenVINO
  the image diffusers' ``StableDiffusionPipeline`` made from that file with its own single-file loader
  (``refs.npz["ckpt"]``, the tolerance of test_pipeline_weights.py).
- SDXL: an LDM file (UNet, CLIP-L and OpenCLIP-bigG in their LDM names) plus a separate diffusers-named VAE
  file, written here from ``tiny-sdxl``'s own weights in float32, give the image of ``tiny-sdxl`` itself,
  byte for byte; SD 2.x (v, with A1111's ``.yaml``) the same from ``tiny-sd2v``. Those folders' images are
  checked against diffusers in tests/pipelines, so these are transitive checks against diffusers.
- SD 3.5, Flux.1 dev / schnell and Chroma: test_flow_single_files.py (tiny transformers, named by ``family=``);
  full-size Flux files are planned here on file headers only.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h
from ckpt_data import DATA, PIPE_FOLDER

from sdrt import pipelines
from sdrt.checkpoint import shipped_graph
from sdrt.cli import main
from sdrt.errors import InputError, ModelError, ModelNotFoundError
from sdrt.graph import Graph
from sdrt.pipelines.png import read_parameters

TESTS = Path(__file__).resolve().parent.parent
CUSTOM = DATA / "pipe-sd15" / "custom.safetensors"
CASES = json.loads((DATA / "pipe-sd15" / "cases.json").read_text())
CASE = CASES["case"]
SD1_PARTS = ["unet", "text_encoder", "vae_decoder", "vae_encoder"]
XL = TESTS / "data" / "pipelines" / "tiny-sdxl"
QUICK = dict(steps=2, cfg=7.0, sampler="Euler", seed=1234, width=64, height=64)


def _sha10(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:10]


@pytest.fixture(scope="module")
def sd1_graphs(tmp_path_factory) -> dict[str, Path]:
    return h.stripped(PIPE_FOLDER, SD1_PARTS, tmp_path_factory.mktemp("sd1-graphs"))


def _sd1(backend: str, graphs: dict[str, Path], **kw):
    return pipelines.load(CUSTOM, backend=backend, graph_paths=graphs,
                          tokenizers={"tokenizer": PIPE_FOLDER / "tokenizer"}, **kw)


# -- end to end ---------------------------------------------------------------------------------------
def test_sd1_single_file_gives_the_folders_image_with_that_checkpoint(sd1_graphs):
    with _sd1("reference", sd1_graphs) as pipe:
        assert pipe.folder.family == "sd1" and pipe.folder.scheduler["_class_name"] == "PNDMScheduler"
        assert pipe.folder.scheduler["steps_offset"] == 1 and "timestep_spacing" not in pipe.folder.scheduler
        assert all(Graph.load(p.path).is_stripped for p in pipe.parts.values())
        gen = pipe.generate(CASE["prompt"], CASE["negative_prompt"], **QUICK)
    with pipelines.load(PIPE_FOLDER, backend="reference") as folder:
        folder.load_weights(CUSTOM)
        want = folder(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0]
    assert gen.images[0].tobytes() == want.tobytes()
    info = gen.settings[0]
    assert info["Model"] == "custom" and info["Model hash"] == _sha10(CUSTOM)


def test_sd1_low_memory_mode_rebinds_the_files_weights(sd1_graphs):
    with _sd1("reference", sd1_graphs) as pipe:
        want = pipe(CASE["prompt"], **QUICK)[0]
    with _sd1("reference", sd1_graphs, low_memory=True) as pipe:
        got = pipe(CASE["prompt"], **QUICK)[0]
        assert all(p.weights is None and not p.sessions for p in pipe.parts.values() if p.name != "vae_encoder")
        again = pipe(CASE["prompt"], **QUICK)[0]  # every part dropped and rebuilt from the file
    assert got.tobytes() == want.tobytes() == again.tobytes()


def test_loras_and_embeddings_on_a_single_file_as_on_the_folder(sd1_graphs):
    """A LoRA tag, then an embedding added after a first run (the token table gets rows on a weight-free graph):
    the same images as the folder with the same checkpoint, LoRA and embedding."""
    d = DATA / "pipe-sd15"
    images = {}
    for kind in ("file", "folder"):
        if kind == "file":
            pipe = _sd1("reference", sd1_graphs)
        else:
            pipe = pipelines.load(PIPE_FOLDER, backend="reference")
            pipe.load_weights(CUSTOM)
        with pipe:
            pipe.weights.lora_dir = d
            lora = pipe.generate(CASES["lora_prompt"], CASE["negative_prompt"], **QUICK)
            pipe.add_embedding(d / "tinyemb.safetensors")
            emb = pipe.generate(CASES["emb_prompt"], CASE["negative_prompt"], **QUICK)
            images[kind] = (lora.images[0].tobytes(), emb.images[0].tobytes())
            assert "tinylora: " in str(lora.settings[0]["Lora hashes"]) and "tinyemb: " in str(emb.settings[0]["TI hashes"])
    assert images["file"] == images["folder"]


def test_torch_ckpt_lora_and_embedding_give_the_safetensors_images(sd1_graphs):
    """``custom.ckpt``, ``tinylora.pt`` and ``tinyemb.pt`` as torch saved them (tests/data/torch/pipe-sd15,
    scripts/gen_torch_fixtures.py): the images of the same weights as .safetensors, byte for byte."""
    t = TESTS / "data" / "torch" / "pipe-sd15"
    d = DATA / "pipe-sd15"
    images = {}
    for kind, (model, loras, emb) in {"torch": (t / "custom.ckpt", t, t / "tinyemb.pt"),
                                      "safetensors": (CUSTOM, d, d / "tinyemb.safetensors")}.items():
        with pipelines.load(model, backend="reference", graph_paths=sd1_graphs,
                            tokenizers={"tokenizer": PIPE_FOLDER / "tokenizer"}) as pipe:
            plain = pipe.generate(CASE["prompt"], CASE["negative_prompt"], **QUICK)
            pipe.weights.lora_dir = loras
            lora = pipe.generate(CASES["lora_prompt"], CASE["negative_prompt"], **QUICK)
            pipe.add_embedding(emb)
            emb_gen = pipe.generate(CASES["emb_prompt"], CASE["negative_prompt"], **QUICK)
        images[kind] = [g.images[0].tobytes() for g in (plain, lora, emb_gen)]
        assert plain.settings[0]["Model"] == "custom" and plain.settings[0]["Model hash"] == _sha10(model)
    assert images["torch"] == images["safetensors"]
    assert len(set(images["torch"])) == 3  # the LoRA and the embedding each changed the image


@pytest.mark.needs_backend("openvino")
def test_sd1_single_file_matches_diffusers_single_file_loader(sd1_graphs):
    refs = dict(np.load(DATA / "pipe-sd15" / "refs.npz"))
    kw = dict(steps=CASE["steps"], cfg=CASE["cfg"], sampler=CASE["sampler"], seed=CASE["seed"], width=CASE["width"],
              height=CASE["height"])
    with _sd1("openvino", sd1_graphs) as pipe:
        img = pipe(CASE["prompt"], CASE["negative_prompt"], **kw)[0]
    diff = float(np.abs(img.astype(np.int32) - refs["ckpt"].astype(np.int32)).mean())
    assert diff < 24, diff  # test_pipeline_weights.py's tolerance (the folder's own weights are > 40 away)


@pytest.fixture(scope="module")
def sdxl_files(tmp_path_factory) -> tuple[Path, Path, dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("sdxl-file")
    ck = h.write(tmp / "tinyxl.safetensors", {
        **h.unet_tensors(Graph.load(XL / "unet" / "model.onnx")),
        **h.clip_tensors(Graph.load(XL / "text_encoder" / "model.onnx"), "conditioner.embedders.0.transformer."),
        **h.openclip_tensors(Graph.load(XL / "text_encoder_2" / "model.onnx"), "conditioner.embedders.1.model.")})
    vae = h.write(tmp / "tinyxl_vae.safetensors", h.vae_tensors(Graph.load(XL / "vae_decoder" / "model.onnx"),
                                                                 Graph.load(XL / "vae_encoder" / "model.onnx")))
    graphs = h.stripped(XL, ["unet", "text_encoder", "text_encoder_2", "vae_decoder", "vae_encoder"], tmp / "g")
    return ck, vae, graphs


def test_sdxl_single_file_with_a_separate_vae_gives_the_folders_image(sdxl_files):
    ck, vae, graphs = sdxl_files
    kw = dict(steps=3, cfg=5.0, sampler="Euler a", seed=7, width=64, height=64)
    with pipelines.load(ck, backend="reference", vae=vae, graph_paths=graphs,
                        tokenizers={"tokenizer": XL / "tokenizer", "tokenizer_2": XL / "tokenizer_2"}) as pipe:
        assert pipe.folder.family == "sdxl" and pipe.default_size == 1024
        assert pipe.folder.scheduler["timestep_spacing"] == "leading"
        gen = pipe.generate("a red cat", "blurry", **kw)
    with pipelines.load(XL, backend="reference") as folder:
        want = folder("a red cat", "blurry", **kw)[0]
    assert gen.images[0].tobytes() == want.tobytes()
    info = gen.settings[0]
    assert (info["Model"], info["Model hash"]) == ("tinyxl", _sha10(ck))
    assert (info["VAE"], info["VAE hash"]) == ("tinyxl_vae.safetensors", _sha10(vae))


def test_sd2_v_file_with_a1111s_yaml_gives_the_folders_image(tmp_path):
    """SD 2.x in LDM names (OpenCLIP-H as cond_stage_model.model.*) with A1111's ``<stem>.yaml`` saying v-prediction:
    the release's DDIM (v) schedule, '!' padding, and tiny-sd2v's own image byte for byte; without the yaml the
    file reads as eps (tiny-sd2v has no bias to test), with the release's 512 eps schedule."""
    src = TESTS / "data" / "pipelines" / "tiny-sd2v"
    ck = h.write(tmp_path / "tiny768v.safetensors", {
        **h.unet_tensors(Graph.load(src / "unet" / "model.onnx")),
        **h.openclip_tensors(Graph.load(src / "text_encoder" / "model.onnx"), "cond_stage_model.model.")})
    vae = h.write(tmp_path / "vae.safetensors", h.vae_tensors(Graph.load(src / "vae_decoder" / "model.onnx"),
                                                              Graph.load(src / "vae_encoder" / "model.onnx")))
    graphs = h.stripped(src, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp_path / "g")
    opts = dict(backend="reference", vae=vae, graph_paths=graphs, tokenizers={"tokenizer": src / "tokenizer"})
    with pipelines.load(ck, **opts) as pipe:
        assert (pipe.folder.prediction, pipe.default_size) == ("eps", 512)
        assert pipe.folder.scheduler["_class_name"] == "PNDMScheduler"
    (tmp_path / "tiny768v.yaml").write_text('model:\n  params:\n    parameterization: "v"\n')
    kw = dict(steps=3, cfg=6.0, sampler="DDIM", seed=5, width=64, height=64)
    with pipelines.load(ck, **opts) as pipe:
        assert (pipe.folder.family, pipe.folder.prediction, pipe.default_size) == ("sd2", "v", 768)
        assert pipe.folder.scheduler["_class_name"] == "DDIMScheduler"
        got = pipe("a red cat", "blurry", **kw)[0]
    with pipelines.load(src, backend="reference") as folder:
        want = folder("a red cat", "blurry", **kw)[0]
    assert got.tobytes() == want.tobytes()


def test_a_vae_file_replaces_an_onnx_folders_vae(tmp_path):
    """--vae on an ONNX folder: the file's tensors (LDM names) bound onto the folder's own VAE graphs."""
    from sdrt.weights import Weights

    w = Weights.open(CUSTOM)
    vae = h.write(tmp_path / "custom_vae.safetensors", {k.removeprefix("first_stage_model."): np.asarray(w[k])
                                                        for k in w if k.startswith("first_stage_model.")})
    z = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    image = np.random.default_rng(1).uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)
    with pipelines.load(PIPE_FOLDER, backend="reference", vae=vae) as pipe:
        got = pipe.vae_decoder.run({"latent_sample": z}), pipe.vae_encoder.run({"sample": image})
        info = pipe.weights.infotext()
        own_unet = pipe.unet.weights
    with pipelines.load(PIPE_FOLDER, backend="reference") as ref:
        ref.load_weights(CUSTOM)
        want = ref.vae_decoder.run({"latent_sample": z}), ref.vae_encoder.run({"sample": image})
    for a, b in zip(got, want):
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
    assert own_unet is None  # the UNet keeps the folder's own weights
    assert (info["VAE"], info["VAE hash"]) == ("custom_vae.safetensors", _sha10(vae))


# -- the CLI -----------------------------------------------------------------------------------------
@pytest.fixture
def tiny_shipped(monkeypatch, sd1_graphs):
    """sdrt's shipped SD 1.x graphs and CLIP tokenizer replaced by tiny-sd15's (stripped), for the CLI."""
    from sdrt.checkpoint import files

    names = {"sd1_unet": "unet", "clip_l": "text_encoder", "vae4_decoder": "vae_decoder", "vae4_encoder": "vae_encoder"}
    monkeypatch.setattr(files, "shipped_graph", lambda name: sd1_graphs[names[name]])
    monkeypatch.setattr(files, "release_tokenizer", lambda name: PIPE_FOLDER / "tokenizer")


def test_cli_generate_file_writes_model_and_model_hash(tiny_shipped, tmp_path, capsys):
    out = tmp_path / "out.png"
    rc = main(["generate", str(CUSTOM), "a red cat", "--steps", "2", "--sampler", "Euler", "--seed", "3",
               "--width", "64", "--height", "64", "--backend", "reference", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    text = read_parameters(out)
    assert "Model: custom," in text
    assert f"Model hash: {hashlib.sha256(CUSTOM.read_bytes()).hexdigest()[:10]}," in text


def test_cli_dry_run_on_a_full_size_checkpoint_compiles_nothing(tmp_path, capsys):
    """A full-size SD 1.5 file in LDM names (sparse: headers only), planned on the shipped graphs."""
    def g(name):
        return Graph.load(shipped_graph(name))

    shapes = {**h.unet_tensors(g("sd1_unet"), sparse=True),
              **h.clip_tensors(g("clip_l"), "cond_stage_model.transformer.", sparse=True),
              **h.vae_tensors(g("vae4_decoder"), g("vae4_encoder"), "first_stage_model.", sparse=True)}
    f = h.sparse(tmp_path / "dreamshaper_8.safetensors", shapes)
    assert main(["generate", str(f), "a red fox", "--dry-run", "--backend", "reference"]) == 0
    out = capsys.readouterr().out
    assert "SD 1.x (sd1), txt2img, 512x512" in out and "unet (denoiser): 20 call(s)" in out
    assert "sd1_unet-" in out and "[2, 4, 64, 64]" in out
    # any multiple of 8: the shipped UNet takes free latent sides (it was refused off multiples of 64)
    assert main(["generate", str(f), "a red fox", "--dry-run", "--backend", "reference", "--width", "520",
                 "--height", "360"]) == 0
    out = capsys.readouterr().out
    assert "SD 1.x (sd1), txt2img, 520x360" in out and "[2, 4, 45, 65]" in out


def _flux_files(tmp_path):
    from test_open_single_file import clip_shapes, flux_shapes, t5_shapes, vae_shapes

    return (h.sparse(tmp_path / "flux1-dev.safetensors", flux_shapes(True), "F8_E4M3"),
            h.sparse(tmp_path / "clip_l.safetensors", clip_shapes(768)),
            h.sparse(tmp_path / "t5xxl_fp16.safetensors", t5_shapes()),
            h.sparse(tmp_path / "sdxl_vae.safetensors", vae_shapes(4)))


def _cli_error(capsys, *argv) -> str:
    assert main(["generate", *[str(a) for a in argv]]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_cli_errors_name_the_flags(tmp_path, capsys):
    flux, clip, t5, vae4 = _flux_files(tmp_path)
    err = _cli_error(capsys, flux, "a cat")  # transformer only, no text encoders
    assert "flux1-dev.safetensors" in err and "--text-encoder" in err and "T5-XXL" in err
    err = _cli_error(capsys, flux, "a cat", "--text-encoder", clip, "--text-encoder", t5, "--vae", vae4)
    assert err.startswith("error: --vae: sdxl_vae.safetensors is a 4-channel VAE") and "16-channel VAE" in err
    err = _cli_error(capsys, flux, "a cat", "--vae", clip)
    assert "--vae: clip_l.safetensors is a CLIP-L text encoder, not a VAE" in err and "--text-encoder" in err
    err = _cli_error(capsys, flux, "a cat", "--vae", tmp_path)
    assert "is a folder, and --vae takes one .safetensors file" in err
    err = _cli_error(capsys, flux, "a cat", "--text-encoder", tmp_path / "nope.safetensors")
    assert "the text-encoder file does not exist" in err and "--text-encoder" in err
    err = _cli_error(capsys, tmp_path / "missing.safetensors", "a cat")
    assert "the model file does not exist" in err
    err = _cli_error(capsys, PIPE_FOLDER, "a cat", "--vae", h.sparse(tmp_path / "ae.safetensors", {
        "decoder.conv_in.weight": (512, 16, 3, 3), "encoder.conv_out.weight": (32, 512, 3, 3)}))
    assert "--vae: ae.safetensors is a 16-channel VAE" in err and "SD 1.x needs a 4-channel VAE" in err


def test_api_errors_name_the_arguments(tmp_path):
    flux, clip, t5, vae4 = _flux_files(tmp_path)
    with pytest.raises(ModelError, match="vae: sdxl_vae.safetensors is a 4-channel VAE"):
        pipelines.load(flux, backend="reference", vae=vae4, text_encoders=[clip, t5])
    with pytest.raises(InputError, match="graph_paths applies to a single-file checkpoint"):
        pipelines.load(PIPE_FOLDER, backend="reference", graph_paths={"unet": flux})
    with pytest.raises(ModelNotFoundError, match="the model file does not exist"):
        pipelines.load(tmp_path / "gone.safetensors", backend="reference")


# -- the shipped T5 tokenizer ------------------------------------------------------------------------
def test_the_shipped_t5_tokenizer_gives_the_releases_ids():
    """Flux.1, SD 3.5 and Chroma ship T5's spiece.model with add_prefix_space (transformers 4 builds the fast
    tokenizer from it): the shipped folder gives T5TokenizerFast's ids of that configuration, 374 of 374."""
    from sdrt.checkpoint import release_tokenizer
    from sdrt.text import T5Tokenizer

    ref = json.loads(gzip.decompress((TESTS / "data" / "t5-tokenizer" / "reference_ids.json.gz").read_bytes()))
    folder = release_tokenizer("t5")
    assert sum(f.stat().st_size for f in folder.iterdir()) < 460_000
    tok = T5Tokenizer.from_folder(folder)
    assert [tok.encode(t) for t in ref["texts"]] == ref["flux"]["ids"]


def test_release_tokenizers_resolve_for_every_family():
    from sdrt.checkpoint import release_defaults, release_tokenizer
    from sdrt.checkpoint.families import FAMILY_GRAPHS
    from sdrt.text import CLIPTokenizer, T5Tokenizer

    for fam in FAMILY_GRAPHS:
        for name in release_defaults(fam)["tokenizers"].values():
            tok = (T5Tokenizer if name == "t5" else CLIPTokenizer).from_folder(release_tokenizer(name))
            assert tok.encode("a cat")
    pad, plain = (CLIPTokenizer.from_folder(release_tokenizer(n)) for n in ("clip-pad-bang", "clip"))
    assert pad.pad_id == pad.token_to_id("!") == 0 and plain.pad_id == plain.eos_id == 49407  # SD 2.x pads with '!'
    assert pad.encode("a red fox") == plain.encode("a red fox")


@pytest.mark.parametrize("guidance", [True, False], ids=["dev", "schnell"])
def test_flux_files_plan_on_the_shipped_graphs(guidance, tmp_path):
    """Full-size Flux.1 files (BFL keys in fp8, clip_l, t5xxl, ae; sparse: headers only): the Flux family with
    dev's guidance input or schnell's none, T5 from the shipped tokenizer, the release schedule; nothing compiles."""
    from test_open_single_file import _graph_shapes, flux_shapes

    f = h.sparse(tmp_path / "flux1.safetensors", flux_shapes(guidance, "model.diffusion_model.", 19, 38), "F8_E4M3")
    clip = h.sparse(tmp_path / "clip_l.safetensors", _graph_shapes("clip_l"))
    t5 = h.sparse(tmp_path / "t5xxl_fp16.safetensors", _graph_shapes("t5xxl"))
    ae = h.sparse(tmp_path / "ae.safetensors", {**_graph_shapes("vae16_decoder"), **_graph_shapes("vae16_encoder")},
                  "BF16")
    pipe = pipelines.load(f, backend="reference", vae=ae, text_encoders=[t5, clip])
    assert pipe.folder.family == "flux" and pipe.folder.configs["transformer"]["guidance_embeds"] is guidance
    plan = pipe.plan("a red fox", width=256, height=256, steps=4).format()
    assert ("guidance [1]" in plan) is guidance
    assert f"input_ids [1, {512 if guidance else 256}]" in plan  # diffusers' max_sequence_length: dev 512, schnell 256
    assert ("mu 0.500" if guidance else "shift 1") in plan
    assert all(not p.sessions for p in pipe.parts.values())


def test_text_encoder_and_vae_files_bind_onto_a_full_size_onnx_folder(tmp_path):
    """--text-encoder / --vae on an ONNX folder of SD 1.5's full-size architecture (sdrt's shipped graphs laid out
    as an Optimum folder): full-size files (headers only, sparse) are planned onto the folder's own graphs, every
    initializer bound, nothing compiled; a file of another kind is refused naming the argument."""
    folder, clip, vae = h.sd15_onnx_folder(tmp_path, "vae-ft-mse.safetensors")
    with pipelines.load(folder, backend="reference", vae=vae, text_encoders=[clip]) as pipe:
        for part in ("text_encoder", "vae_decoder", "vae_encoder"):
            bound = pipe.parts[part].weights
            assert bound is not None and set(bound) == {t.name for t in pipe.parts[part].graph.model.graph.initializer}
            assert not pipe.parts[part].sessions
        assert pipe.weights.part_files == {"text_encoder": clip, "vae_decoder": vae, "vae_encoder": vae}
        assert pipe.unet.weights is None  # untouched
    clip_g = h.sparse(tmp_path / "clip_g.safetensors", {"text_model.embeddings.token_embedding.weight": (49408, 1280),
                                                        "text_model.encoder.layers.0.self_attn.q_proj.weight": (1280, 1280)})
    with pytest.raises(ModelError, match="text_encoders: clip_g.safetensors is a CLIP-G .* which SD 1.x does not use"):
        pipelines.load(folder, backend="reference", text_encoders=[clip_g])
