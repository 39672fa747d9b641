"""SD 3 Medium (the 2B original of June 2024) as Stability ships it and as a diffusers folder, against diffusers.

tests/data/pipelines/tiny-sd3-medium (scripts/gen_sd3_medium_refs.py) holds a tiny ``SD3Transformer2DModel`` of
SD 3 Medium's design (no q/k norm, no dual attention; fp16, diffusers' names), the tiny weight-free graph exported
from it exactly as the shipped ``sd3_medium_transformer`` is (make_shipped_graphs.py's export at these widths), an
InstantX-layout ``SD3ControlNetModel`` of the same design, and the images diffusers 0.42.1's
``StableDiffusion3Pipeline`` / ``StableDiffusion3Img2ImgPipeline`` / ``StableDiffusion3ControlNetPipeline`` made
with it and tiny-sd3's text encoders, VAE, tokenizers and scheduler (SD 3 Medium's other parts are SD 3.5's).

The files are written here as people download them: Stability's ``sd3_medium_incl_clips.safetensors`` layout
(``model.diffusion_model.joint_blocks.*``, ``first_stage_model.*``, ``text_encoders.{clip_l,clip_g,t5xxl}
.transformer.*``), a transformer without ComfyUI's prefix with separate ``clip_l`` / ``clip_g`` / ``t5xxl`` files
(flow_file_helpers: the renaming inverts diffusers' converters, not sdrt's maps), and the
``stable-diffusion-3-medium-diffusers`` folder of ``.safetensors``. Tiny widths are no release's, so single files
name ``family="sd3-medium"`` (the keys must still say it) and bind onto the tiny graphs (``graph_paths``); the
folder's family is read from its transformer's tensors. At full size (sparse files: headers only) every tensor of
Stability's three files binds onto the shipped graphs with nothing left over, and without ``family=``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h
from flow_file_helpers import (
    clip_file,
    diffusers_params,
    ldm_vae,
    sd3_medium_shapes,
    sd3_transformer,
    stripped,
    t5_file,
)

from sdrt import pipelines
from sdrt.checkpoint import open_single_file, shipped_graph
from sdrt.errors import ModelError
from sdrt.graph import Graph

PIPES = Path(__file__).resolve().parent.parent / "data" / "pipelines"
SD3 = PIPES / "tiny-sd3"
MED = PIPES / "tiny-sd3-medium"
GRAPH = MED / "sd3_medium_transformer.onnx"
CASES = json.loads((MED / "refs.json").read_text())
REFS = np.load(MED / "refs.npz")
ENCODERS = {"clip_l": "text_encoder", "clip_g": "text_encoder_2", "t5xxl": "text_encoder_3"}
BACKENDS = ("reference", "openvino", "ggml")


def _params(part: str) -> dict[str, np.ndarray]:
    return diffusers_params(SD3 / part / "model.onnx")


def _transformer() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k: v.astype(np.float32) for k, v in load_file(str(MED / "transformer" /
                                                               "diffusion_pytorch_model.safetensors")).items()}


def _stability(prefix: str) -> dict[str, np.ndarray]:
    """The tiny transformer in Stability's keys; ``pos_embed`` is the table the file carries (diffusers' buffer)."""
    p = _transformer()
    pos = p.pop("pos_embed.pos_embed")
    out = sd3_transformer(p, pos.shape)
    out["pos_embed"] = pos
    assert not any(".ln_q." in k or ".attn2." in k for k in out)  # SD 3 Medium's blocks: no q/k norm, one attention
    return {prefix + k: v for k, v in out.items()}


def _graphs(tmp: Path) -> dict[str, Path]:
    parts = [*ENCODERS.values(), "vae_decoder", "vae_encoder"]
    return {**stripped(SD3, parts, tmp / "graphs"), "transformer": GRAPH}


def _tokenizers() -> dict[str, Path]:
    return {n: SD3 / n for n in ("tokenizer", "tokenizer_2", "tokenizer_3")}


def _single_file(layout: str, tmp: Path) -> tuple[Path, list[Path], Path | None]:
    """``(file, text-encoder files, VAE file)``. ``incl_clips``: sd3_medium_incl_clips.safetensors' layout (ComfyUI's
    prefix, the VAE and the three text encoders baked in); ``bare``: the transformer alone without a prefix, the
    VAE (LDM keys) and the encoders as separate files."""
    vae = ldm_vae({**_params("vae_decoder"), **_params("vae_encoder")})
    enc = {name: (t5_file if name == "t5xxl" else clip_file)(_params(part)) for name, part in ENCODERS.items()}
    if layout == "incl_clips":
        main = {**_stability("model.diffusion_model."), **{"first_stage_model." + k: v for k, v in vae.items()}}
        for name, tensors in enc.items():
            main.update({f"text_encoders.{name}.transformer.{k}": v for k, v in tensors.items()})
        return h.write(tmp / "sd3_medium_incl_clips.safetensors", main), [], None
    extras = [h.write(tmp / f"{name}.safetensors", tensors) for name, tensors in enc.items()]
    return (h.write(tmp / "sd3_medium_transformer.safetensors", _stability("")), extras[::-1],  # any order
            h.write(tmp / "sd3_vae.safetensors", vae))


def _diffusers_folder(root: Path) -> Path:
    """stable-diffusion-3-medium-diffusers' layout of .safetensors: model_index.json, scheduler/, tokenizer*/,
    transformer/ (the fixture's own file), text_encoder*/model.safetensors (transformers' names), vae/."""
    root.mkdir()
    (root / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline",
                                                       "_diffusers_version": "0.29.0.dev0"}))
    for d in ("scheduler", "tokenizer", "tokenizer_2", "tokenizer_3"):
        shutil.copytree(SD3 / d, root / d)
    shutil.copytree(MED / "transformer", root / "transformer")
    for name, part in ENCODERS.items():
        (root / part).mkdir()
        shutil.copy(SD3 / part / "config.json", root / part / "config.json")
        h.write(root / part / "model.safetensors", (t5_file if name == "t5xxl" else clip_file)(_params(part)))
    (root / "vae").mkdir()
    shutil.copy(SD3 / "vae_decoder" / "config.json", root / "vae" / "config.json")
    h.write(root / "vae" / "diffusion_pytorch_model.safetensors",
            h.vae_tensors(Graph.load(SD3 / "vae_decoder" / "model.onnx"), Graph.load(SD3 / "vae_encoder" / "model.onnx")))
    return root


def _kwargs(case: dict) -> dict:
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              cfg=case["cfg"], sampler="Euler", max_sequence_length=case["max_sequence_length"])
    if case["mode"] == "img2img":
        kw.update(init_image=REFS[f"{case['name']}/init_image"], strength=case["strength"])
    return kw


def _diff(pipe, case: dict) -> int:
    got = np.stack(pipe(case["prompt"], case["negative_prompt"] or "", **_kwargs(case))).astype(int)
    want = REFS[f"{case['name']}/image"].astype(int)
    assert got.shape == want.shape
    return int(np.abs(got - want).max())


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("sd3-medium")
    return _diffusers_folder(tmp / "stable-diffusion-3-medium-diffusers"), _graphs(tmp)


# -- the tiny model against diffusers ----------------------------------------------------------------
@pytest.mark.parametrize("layout", ["incl_clips", "bare"])
def test_stability_single_file_gives_diffusers_image(layout, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    f, extras, vae = _single_file(layout, tmp_path)
    with pipelines.load(f, backend="reference", text_encoders=extras, vae=vae, graph_paths=_graphs(tmp_path),
                        tokenizers=_tokenizers(), family="sd3-medium") as pipe:
        single = pipe.folder.single_file
        assert (single.family, single.prediction, pipe.folder.family) == ("sd3-medium", "flow", "sd3")
        assert pipe.folder.scheduler == {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
                                         "shift": 3.0}  # the release's (stable-diffusion-3-medium-diffusers)
        assert set(single.files.values()) == {f, *extras, *([vae] if vae else [])}
        for case in CASES:
            diff = _diff(pipe, case)
            assert diff <= 1, f"{layout} {case['name']}: max {diff} levels from diffusers' image"
    assert "not used" not in caplog.text  # every tensor of every file bound


@pytest.mark.parametrize("backend", BACKENDS)
def test_diffusers_folder_gives_diffusers_image(backend, folder):
    root, graphs = folder
    with pipelines.load(root, backend=backend, graph_paths=graphs) as pipe:
        assert pipe.folder.single_file.family == "sd3-medium"  # from the transformer's tensors
        for case in CASES:
            diff = _diff(pipe, case)
            assert diff <= 1, f"{backend} {case['name']}: max {diff} levels from diffusers' image"


def test_the_keys_decide_the_family(tmp_path):
    """SD 3.5 Medium's keys (tiny-sd3: q/k norm, dual attention) are not SD 3 Medium, nor SD 3 Medium's SD 3.5's."""
    sd35 = h.write(tmp_path / "sd35.safetensors", {"model.diffusion_model." + k: v for k, v in sd3_transformer(
        diffusers_params(SD3 / "transformer" / "model.onnx"), (1, 256, 32)).items()})
    with pytest.raises(ModelError, match=r"sd35.safetensors is not SD 3 Medium: .*SD 3.5 Medium by its keys"):
        open_single_file(sd35, family="sd3-medium")
    f, _, _ = _single_file("incl_clips", tmp_path)
    with pytest.raises(ModelError, match=r"is not SD 3.5 Medium: .*SD 3 Medium by its keys"):
        open_single_file(f, family="sd35-medium")
    with pytest.raises(ModelError, match="an SD 3 MMDiT of width 32 without qk-norm"):
        open_single_file(f)  # release widths only without family=


# -- ControlNet: InstantX's layout (a text stream, no q/k norm) ------------------------------------
NET_CASE = json.loads((MED / "controlnet.json").read_text())[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_instantx_controlnet_gives_diffusers_image(backend, folder):
    from sdrt.checkpoint.controlnet import open_controlnet
    from sdrt.pipelines.controlnet import ControlNet

    root, graphs = folder
    net = open_controlnet(MED / "instantx" / "diffusion_pytorch_model.safetensors", base="sd3", graph=GRAPH)
    assert (net.sd3.blocks, net.sd3.zero_pooled, net.sd3.image_only) == (2, True, False)
    c = NET_CASE
    unit = ControlNet(net, REFS[f"{c['name']}/control_image_0"], c["scale"][0], c["start"][0], c["end"][0])
    with pipelines.load(root, backend=backend, graph_paths=graphs) as pipe:
        got = np.stack(pipe(c["prompt"], c["negative_prompt"], steps=c["steps"], seed=c["seed"], width=c["width"],
                            height=c["height"], cfg=c["cfg"], sampler="Euler",
                            max_sequence_length=c["max_sequence_length"], controlnets=[unit])).astype(int)
    want = REFS[f"{c['name']}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got - want).max())
    assert diff <= 1, f"{backend}: max {diff} levels from diffusers' image"


# -- full size: Stability's files, headers only ----------------------------------------------------
def _graph_shapes(name: str) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.dims) for t in Graph.load(shipped_graph(name)).model.graph.initializer if t.external_data}


def _ldm_vae_shapes() -> dict[str, tuple[int, ...]]:
    """The shipped 16-channel VAE's parameters in LDM keys (``first_stage_model.*`` in Stability's files)."""
    shapes = {**_graph_shapes("vae16_decoder"), **_graph_shapes("vae16_encoder")}
    ldm = ldm_vae({k: np.broadcast_to(np.float32(0), v) for k, v in shapes.items()})
    return {"first_stage_model." + k: tuple(v.shape) for k, v in ldm.items()}


def _clip_shapes(name: str, prefix: str) -> dict[str, tuple[int, ...]]:
    return h.clip_tensors(Graph.load(shipped_graph(name)), prefix, sparse=True)


@pytest.mark.parametrize("name", ["sd3_medium", "sd3_medium_incl_clips", "sd3_medium_incl_clips_t5xxlfp8"])
def test_full_size_stability_files_bind_every_tensor(name, tmp_path, caplog):
    """Stability's three files (fp16; the T5 of the last in fp8 e4m3): the family is read from the keys (width 1536,
    no q/k norm, no attn2), every tensor of the file binds onto the shipped graphs and each graph's every weight is
    bound: the MMDiT's 491 tensors onto sd3_medium_transformer, the VAE, CLIP-L/G and T5-XXL onto theirs."""
    tr = sd3_medium_shapes()
    assert len(tr) == 491
    shapes = {k: (v, "F16") for k, v in {**tr, **_ldm_vae_shapes()}.items()}
    if "clips" in name:
        for enc, graph in (("clip_l", "clip_l_proj"), ("clip_g", "clip_g")):
            shapes.update({k: (v, "F16") for k, v in _clip_shapes(graph, f"text_encoders.{enc}.transformer.").items()})
    extras = []
    if name.endswith("t5xxlfp8"):
        t5 = h._torch_layout(Graph.load(shipped_graph("t5xxl")), True)
        shapes.update({f"text_encoders.t5xxl.transformer.{k}": (v, "F8_E4M3" if len(v) == 2 else "F16")
                       for k, v in t5.items()})
    else:  # the separate files ComfyUI's text_encoders/ folder holds
        extras.append(h.sparse(tmp_path / "t5xxl_fp16.safetensors",
                               h._torch_layout(Graph.load(shipped_graph("t5xxl")), True)))
        if "clips" not in name:
            extras += [h.sparse(tmp_path / "clip_g.safetensors", _clip_shapes("clip_g", "")),
                       h.sparse(tmp_path / "clip_l.safetensors", _clip_shapes("clip_l_proj", ""))]
    f = h.sparse(tmp_path / f"{name}.safetensors", shapes)
    with caplog.at_level(logging.WARNING, logger="sdrt"):
        m = open_single_file(f, extras)
    assert not [r for r in caplog.records if "not used" in r.getMessage()], caplog.text
    assert (m.family, m.prediction) == ("sd3-medium", "flow")
    assert m.release["scheduler"]["shift"] == 3.0 and m.release["vae"]["scaling_factor"] == 1.5305
    assert set(m.parts) == {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae_decoder",
                            "vae_encoder"}
    with open(f, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    used: set[str] = set()
    for part, (path, w) in m.parts.items():
        assert w.check(Graph.load(path)).ok, part  # every weight of the graph bound, shapes right
        for n in w:
            origin = w.ref(n).origin
            if origin is None or origin[0] != str(f) and Path(origin[0]) != f:
                continue
            start = origin[1] - 8 - size
            used.update(k for a, b, k in spans if a <= start < b)
    assert used == set(header), sorted(set(header) - used)[:10]  # no tensor of the file left unbound
    graph, weights = m.parts["transformer"]
    from_file = {n for n in weights if weights.ref(n).source == str(f)}
    assert from_file == set(_graph_shapes("sd3_medium_transformer"))
    assert tuple(weights.ref("pos_embed.pos_embed").shape) == (1, 36864, 1536)
    if name.endswith("t5xxlfp8"):
        assert "float8_e4m3fn" in m.dtypes["text_encoder_3"]


def test_full_size_diffusers_transformer_is_sd3_medium():
    """stable-diffusion-3-medium-diffusers' transformer: no norm_q, no attn2 (SD 3.5 Large has norm_q, 3.5 Medium
    attn2)."""
    from sdrt.checkpoint.diffusers_folder import denoiser_family

    shapes = _graph_shapes("sd3_medium_transformer")
    assert denoiser_family(shapes) == ("sd3-medium", "an SD 3 Medium transformer")
    assert denoiser_family(_graph_shapes("sd35_medium_transformer"))[0] == "sd35-medium"
    assert denoiser_family(_graph_shapes("sd35_large_transformer"))[0] == "sd35-large"


def test_a_flux_control_lora_on_sd3_medium_is_refused_in_one_line(folder, tmp_path):
    """BFL's Canny/Depth LoRA on an SD 3 Medium model: one line naming the model as the user knows it (it read
    'this is a SD3 model'); a truncated copy of it is a truncated file. Nothing changes."""
    from sdrt.errors import WeightsError

    lora = Path(__file__).resolve().parents[1] / "data" / "lora" / "flux_control_lora_bfl.safetensors"
    cut = tmp_path / "canny.safetensors"
    cut.write_bytes(lora.read_bytes()[: lora.stat().st_size // 2])
    root, graphs = folder
    with pipelines.load(root, backend="reference", graph_paths=graphs) as pipe:
        with pytest.raises(WeightsError, match="made for Flux.1 dev, and this is an SD 3 Medium model") as e:
            pipe.set_loras([(lora, 1.0)])
        assert "\n" not in str(e.value) and not pipe.weights.loras
        with pytest.raises(WeightsError, match="truncated or corrupt file") as e:
            pipe.set_loras([(cut, 1.0)])
        assert "\n" not in str(e.value) and not pipe.weights.loras



# -- SD 3 Medium without T5 (diffusers' text_encoder_3=None; scripts/gen_sd3_not5_refs.py) ---------------------
NOT5 = json.loads((MED / "refs_not5.json").read_text())
NOT5_REFS = np.load(MED / "refs_not5.npz")


def _diff_not5(pipe, case: dict) -> int:
    got = np.stack(pipe(case["prompt"], case["negative_prompt"] or "", **_kwargs(case))).astype(int)
    want = NOT5_REFS[f"{case['name']}/image"].astype(int)
    assert got.shape == want.shape
    return int(np.abs(got - want).max())


def test_stability_incl_clips_without_t5_gives_diffusers_image(tmp_path, caplog):
    """sd3_medium_incl_clips.safetensors on its own (its T5 not in it, no t5xxl file given): it loads with one
    warning instead of a refusal, the plan names the missing T5, and the image is diffusers' with
    text_encoder_3=None within 1 level (T5's states zeros [1, max_sequence_length, joint width])."""
    from safetensors.numpy import load_file

    f, _, _ = _single_file("incl_clips", tmp_path)
    main = {k: v for k, v in load_file(str(f)).items() if not k.startswith("text_encoders.t5xxl.")}
    f = h.write(tmp_path / "sd3_medium_incl_clips_no_t5.safetensors", main)
    caplog.set_level(logging.WARNING)
    with pipelines.load(f, backend="reference", graph_paths=_graphs(tmp_path), tokenizers=_tokenizers(),
                        family="sd3-medium") as pipe:
        assert "text_encoder_3" not in pipe.folder.single_file.parts
        hidden = pipe.prompts.encode("a cat", 1, max_length=16).hidden
        assert hidden.shape[:2] == (1, 77 + 16) and not hidden[:, 77:].any() and hidden[:, :77].any()
        plan = pipe.plan("a cat", steps=1, width=64, height=64).format()
        assert "text_encoder_3: none (no T5 text encoder)" in plan and "text_encoder_3 " not in plan, plan
        for case in NOT5:
            assert _diff_not5(pipe, case) <= 1, case["name"]
    assert caplog.text.count("no T5 text encoder") == 1, caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_diffusers_folder_without_t5_gives_diffusers_image(backend, tmp_path):
    """A stable-diffusion-3-medium-diffusers folder saved by diffusers with text_encoder_3=None: model_index.json
    names [null, null], no text_encoder_3/ or tokenizer_3/; diffusers' image within 1 level, and the same case
    with T5 (the fixture's own reference) is another image."""
    root = _diffusers_folder(tmp_path / "sd3-medium-no-t5")
    shutil.rmtree(root / "text_encoder_3")
    shutil.rmtree(root / "tokenizer_3")
    index = json.loads((root / "model_index.json").read_text())
    (root / "model_index.json").write_text(json.dumps({**index, "text_encoder_3": [None, None],
                                                       "tokenizer_3": [None, None]}))
    with pipelines.load(root, backend=backend, graph_paths=_graphs(tmp_path)) as pipe:
        assert pipe.folder.single_file.family == "sd3-medium" and "text_encoder_3" not in pipe.folder.parts
        for case in NOT5:
            assert _diff_not5(pipe, case) <= 1, f"{backend} {case['name']}"
    case = NOT5[0]
    with_t5 = next(c for c in CASES if c["name"].split("/", 1)[1] == case["name"].split("/", 1)[1])
    assert np.abs(REFS[f"{with_t5['name']}/image"].astype(int) - NOT5_REFS[f"{case['name']}/image"]).mean() > 3


def test_diffusers_folder_with_an_empty_text_encoder_3_is_refused(tmp_path):
    """A text_encoder_3/ without weights is an incomplete download, not a model without T5: refused in one line."""
    root = _diffusers_folder(tmp_path / "sd3-medium-broken")
    for f in (root / "text_encoder_3").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelError, match="no text_encoder_3 weights"):
        pipelines.load(root, backend="reference", graph_paths=_graphs(tmp_path))


def test_a_diffusion_model_prefix_reads_as_comfyuis(tmp_path):
    """An SD 3 transformer saved with the bare ``diffusion_model.`` prefix (no ``model.``; some trainers and
    ComfyUI's model-only saves; the same prefix foreign.PREFIXES reads) is the same model as with ComfyUI's:
    diffusers' image within 1 level, with the encoders and VAE as separate files."""
    _, extras, vae = _single_file("bare", tmp_path)
    f = h.write(tmp_path / "sd3_medium_diffusion_model.safetensors", _stability("diffusion_model."))
    with pipelines.load(f, backend="reference", text_encoders=extras, vae=vae, graph_paths=_graphs(tmp_path),
                        tokenizers=_tokenizers(), family="sd3-medium") as pipe:
        assert pipe.folder.single_file.family == "sd3-medium"
        assert _diff(pipe, CASES[0]) <= 1


@pytest.mark.parametrize("prefix", ["model.diffusion_model.", "diffusion_model.", ""])
def test_full_size_sd3_medium_is_read_with_any_transformer_prefix(prefix):
    """Stability's SD 3 Medium transformer at full size, keyed with ComfyUI's prefix, the bare ``diffusion_model.``
    or none: the keys say SD 3 Medium each time, and every one of its 491 tensors maps onto the shipped graph."""
    from sdrt.checkpoint.families import detect, identify
    from sdrt.checkpoint.flow import convert_sd3

    shapes = sd3_medium_shapes(prefix)
    ident = identify(shapes)
    assert ident.family == "sd3-medium" and ident.components["transformer"] == prefix, ident
    assert detect(shapes) == "SD 3"
    srcs, unknown = convert_sd3(shapes)
    assert not unknown and len({s.key for s in srcs.values()}) == 491


def test_full_size_incl_clips_without_t5_is_complete(tmp_path):
    """Full-size sd3_medium_incl_clips.safetensors (sparse): transformer, VAE, CLIP-L and CLIP-G, no T5. It opens
    without a T5 file (no refusal), every tensor binds, no text_encoder_3 part; the server's scan (missing_parts)
    takes it as a whole model, while the transformer alone still lacks its CLIPs and VAE (and T5 is not named)."""
    from sdrt.pipelines.singlefile import missing_parts

    shapes = {k: (v, "F16") for k, v in {**sd3_medium_shapes(), **_ldm_vae_shapes()}.items()}
    for enc, graph in (("clip_l", "clip_l_proj"), ("clip_g", "clip_g")):
        shapes.update({k: (v, "F16") for k, v in _clip_shapes(graph, f"text_encoders.{enc}.transformer.").items()})
    f = h.sparse(tmp_path / "sd3_medium_incl_clips.safetensors", shapes)
    m = open_single_file(f)
    assert m.family == "sd3-medium" and set(m.parts) == {"transformer", "text_encoder", "text_encoder_2",
                                                         "vae_decoder", "vae_encoder"}
    assert missing_parts(f) is None
    bare = h.sparse(tmp_path / "sd3_medium.safetensors", {k: (v, "F16") for k, v in sd3_medium_shapes().items()})
    assert "lacks" in (missing_parts(bare) or "") and "T5" not in missing_parts(bare)


def _incl_clips_and_t5(tmp_path: Path) -> tuple[Path, Path]:
    """Full-size sd3_medium_incl_clips.safetensors (no T5) and t5xxl_fp16.safetensors, sparse (headers only)."""
    t5 = h.sparse(tmp_path / "t5xxl_fp16.safetensors", h._torch_layout(Graph.load(shipped_graph("t5xxl")), True))
    shapes = {k: (v, "F16") for k, v in {**sd3_medium_shapes(), **_ldm_vae_shapes()}.items()}
    for enc, graph in (("clip_l", "clip_l_proj"), ("clip_g", "clip_g")):
        shapes.update({k: (v, "F16") for k, v in _clip_shapes(graph, f"text_encoders.{enc}.transformer.").items()})
    return h.sparse(tmp_path / "sd3_medium_incl_clips.safetensors", shapes), t5


def test_swapping_t5_on_a_model_loaded_without_or_with_it_is_refused_in_one_line(tmp_path):
    """``set_text_encoders([t5])`` on an SD 3 file loaded without T5 returned [] and ran without it, the file unread
    and unmentioned; ``set_text_encoders([])`` on one loaded with a T5 file it lacks raised a bare ValueError
    ("dictionary update sequence element #0 ..."). Both are one-line refusals now, and the pipeline keeps its
    parts."""
    from sdrt.errors import SdrtError

    f, t5 = _incl_clips_and_t5(tmp_path)
    with pipelines.load(f, backend="reference") as pipe:
        with pytest.raises(SdrtError, match=r"t5xxl_fp16.safetensors is a T5-XXL text encoder for text_encoder_3, "
                                            r"which this SD3 model was loaded without") as e:
            pipe.set_text_encoders([t5])
        assert "\n" not in str(e.value) and "text_encoder_3" not in pipe.parts
    with pipelines.load(f, backend="reference", text_encoders=[t5]) as pipe:
        with pytest.raises(SdrtError, match=r"sd3_medium_incl_clips.safetensors holds no text encoder of its own "
                                            r"for text_encoder_3") as e:
            pipe.set_text_encoders([])
        assert "\n" not in str(e.value) and pipe.weights.part_files["text_encoder_3"] == t5


def test_a_t5_file_with_t5_false_is_refused_not_ignored(tmp_path, capsys):
    """``--text-encoder t5xxl_fp16.safetensors --no-t5`` asks for two opposite things: refused in one line, in the
    caller's words, on a single file and on an ONNX folder alike. The T5 file was dropped without a word."""
    from sdrt.cli import main
    from sdrt.errors import InputError

    f, t5 = _incl_clips_and_t5(tmp_path)
    for model in (f, SD3):
        with pytest.raises(InputError, match=r"t5xxl_fp16.safetensors is a T5-XXL text encoder, and t5=False leaves"):
            pipelines.load(model, backend="reference", t5=False, text_encoders=[t5])
    assert main(["generate", str(f), "a cat", "--text-encoder", str(t5), "--no-t5", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "--text-encoder" in err and "--no-t5" in err and "t5=False" not in err and err.count("\n") == 1, err
