"""SD 3.5, Flux.1 dev / schnell and Chroma single files end to end on tiny graphs (issue 33).

Each tiny folder (tests/data/pipelines/tiny-{sd3,flux-dev,flux-schnell,chroma}: diffusers pipelines exported to
ONNX, whose images match diffusers' own within 1 level, tests/flow/test_flow_pipelines.py) is turned into the files
people download: the transformer in its publisher's keys (Black Forest Labs' ``double_blocks.*`` for Flux and
Chroma, with ComfyUI's ``model.diffusion_model.`` prefix for schnell; Stability's ``joint_blocks.*`` with the VAE
baked in as ``first_stage_model.*`` for SD 3.5), ``clip_l`` / ``clip_g`` / ``t5xxl`` files in transformers' names
and an ``ae.safetensors`` in LDM keys (flow_file_helpers.py: the renaming inverts diffusers' converters, not sdrt's
maps), all float32 in tmp_path. The folder's graphs are stripped of their weights, as sdrt ships its graphs, and
``pipelines.load(FILE, text_encoders=[...], vae=..., graph_paths=..., family=...)`` must give diffusers' image
(the folder's reference, refs.npz) within the flow tests' tolerance, and the folder's own sdrt image byte for byte.

The tiny transformers are not Flux.1's or SD 3.5's widths, so ``family=`` names the family (the keys must still
say it) and the text-encoder files, of no release width either, are matched to the graphs they bind onto.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h
from flow_file_helpers import bfl_transformer, clip_file, diffusers_params, ldm_vae, sd3_transformer, stripped, t5_file

from sdrt import pipelines
from sdrt.checkpoint import open_single_file
from sdrt.errors import ModelError

PIPES = Path(__file__).resolve().parent.parent / "data" / "pipelines"


def _params(folder: Path, part: str) -> dict[str, np.ndarray]:
    return diffusers_params(folder / part / "model.onnx")


def _vae(folder: Path) -> dict[str, np.ndarray]:
    return ldm_vae({**_params(folder, "vae_decoder"), **_params(folder, "vae_encoder")})


def flux_dev_folder_parts(root: Path) -> Path:
    """tiny-flux-dev as a diffusers folder of ``.safetensors`` at ``root``, all but ``transformer/`` (the caller
    writes that one): text encoders in transformers' names, the VAE in diffusers', tokenizers and scheduler."""
    import json
    import shutil

    import single_file_helpers as h

    src = PIPES / "tiny-flux-dev"
    for part in ("text_encoder", "text_encoder_2"):
        (root / part).mkdir(parents=True)
        h.write(root / part / "model.safetensors", _params(src, part))
    (root / "vae").mkdir()
    h.write(root / "vae" / "diffusion_pytorch_model.safetensors",
            {**_params(src, "vae_decoder"), **_params(src, "vae_encoder")})
    (root / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL", "scaling_factor": 0.3611,
                                                          "shift_factor": 0.1159, "latent_channels": 16}))
    for part in ("tokenizer", "tokenizer_2", "scheduler"):
        shutil.copytree(src / part, root / part)
    index = json.loads((src / "model_index.json").read_text())
    index["_class_name"] = "FluxPipeline"
    (root / "model_index.json").write_text(json.dumps(index))
    return root


def _files(kind: str, tmp: Path) -> dict:
    """The publisher-format files of tiny-KIND and its weight-free graphs: ``{file, text_encoders, vae, graphs,
    tokenizers, family}``."""
    folder = PIPES / f"tiny-{kind}"
    parts = [p.name for p in folder.iterdir() if (p / "model.onnx").is_file()]
    out: dict = {"graphs": stripped(folder, parts, tmp / "graphs"), "vae": None,
                 "tokenizers": {t.name: t for t in folder.iterdir() if t.name.startswith("tokenizer")}}
    tr = _params(folder, "transformer")
    if kind == "sd3":
        cfg = json.loads((folder / "transformer" / "config.json").read_text())
        n = cfg["pos_embed_max_size"]
        main = {**{"model.diffusion_model." + k: v for k, v in
                   sd3_transformer(tr, (1, n * n, cfg["num_attention_heads"] * cfg["attention_head_dim"])).items()},
                **{"first_stage_model." + k: v for k, v in _vae(folder).items()}}
        out["family"] = "sd35-medium"
        encoders = {"clip_l": "text_encoder", "clip_g": "text_encoder_2", "t5xxl_fp16": "text_encoder_3"}
    else:
        prefix = "model.diffusion_model." if kind == "flux-schnell" else ""  # ComfyUI's prefix, or BFL's none
        main = {prefix + k: v for k, v in bfl_transformer(tr).items()}
        out["family"] = kind
        out["vae"] = h.write(tmp / "ae.safetensors", _vae(folder))
        encoders = ({"t5xxl_fp16": "text_encoder"} if kind == "chroma" else
                    {"clip_l": "text_encoder", "t5xxl_fp16": "text_encoder_2"})
    out["file"] = h.write(tmp / f"{kind}.safetensors", main)
    files = []
    for name, part in encoders.items():
        p = _params(folder, part)
        files.append(h.write(tmp / f"{name}.safetensors", t5_file(p) if name.startswith("t5") else clip_file(p)))
    out["text_encoders"] = files[::-1]  # any order: each goes to the graph it fits
    return out


def _load(f: dict, **kw):
    return pipelines.load(f["file"], backend="reference", text_encoders=f["text_encoders"], vae=f["vae"],
                          graph_paths=f["graphs"], tokenizers=f["tokenizers"], family=f["family"], **kw)


def _case(kind: str) -> tuple[dict, dict]:
    case = json.loads((PIPES / f"tiny-{kind}" / "refs.json").read_text())[0]
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              cfg=case["cfg"], sampler="Euler", max_sequence_length=case["max_sequence_length"])
    if "guidance" in case:
        kw["guidance"] = case["guidance"]
    return case, kw


@pytest.mark.parametrize("kind", ["sd3", "flux-dev", "flux-schnell", "chroma"])
def test_flow_single_file_gives_the_folders_image(kind, tmp_path):
    f = _files(kind, tmp_path)
    case, kw = _case(kind)
    with _load(f) as pipe:
        single = pipe.folder.single_file
        assert single.family == f["family"] and single.prediction == "flow"
        assert pipe.folder.scheduler["_class_name"] == "FlowMatchEulerDiscreteScheduler"  # the release's
        assert set(single.files.values()) == {f["file"], *f["text_encoders"], *([f["vae"]] if f["vae"] else [])}
        got = np.stack(pipe(case["prompt"], case["negative_prompt"] or "", **kw)).astype(int)
    want = np.load(PIPES / f"tiny-{kind}" / "refs.npz")[f"{case['name']}/image"].astype(int)
    assert got.shape == want.shape
    diff = np.abs(got - want)
    assert diff.max() <= 2, f"{kind}: max {diff.max()} levels from diffusers' image"  # the flow tests' tolerance
    with pipelines.load(PIPES / f"tiny-{kind}", backend="reference") as folder:
        own = np.stack(folder(case["prompt"], case["negative_prompt"] or "", **kw)).astype(int)
    assert np.array_equal(got, own), f"{kind}: max {np.abs(got - own).max()} levels from the folder's own image"


def test_family_must_agree_with_the_files_keys(tmp_path):
    f = _files("flux-dev", tmp_path)
    extras = [*f["text_encoders"], f["vae"]]
    with pytest.raises(ModelError, match="is not a model sdrt can run: it looks like a Flux-like transformer of width 32"):
        open_single_file(f["file"], extras, graph_paths=f["graphs"])  # release widths only, without family=
    with pytest.raises(ModelError, match=r"flux-dev\.safetensors is not Flux\.1 schnell: .*Flux\.1 dev by its keys"):
        open_single_file(f["file"], extras, graph_paths=f["graphs"], family="flux-schnell")  # dev has guidance_in
    with pytest.raises(ModelError, match="is not SD 3.5 Medium"):
        open_single_file(f["file"], extras, graph_paths=f["graphs"], family="sd35-medium")
    with pytest.raises(ModelError, match="unknown family 'flux'"):
        open_single_file(f["file"], extras, graph_paths=f["graphs"], family="flux")
    # a text encoder that fits none of the given graphs (tiny-sd3's CLIP-L is 16 wide, tiny-flux-dev's 32)
    other = h.write(tmp_path / "other_clip.safetensors", clip_file(_params(PIPES / "tiny-sd3", "text_encoder")))
    with pytest.raises(ModelError, match="other_clip.safetensors .* fits none of the text-encoder graphs"):
        open_single_file(f["file"], [other, f["text_encoders"][0], f["vae"]], graph_paths=f["graphs"],
                         family="flux-dev")
    with pytest.raises(Exception, match="family applies to a single-file checkpoint"):
        pipelines.load(PIPES / "tiny-flux-dev", backend="reference", family="flux-dev")


def _llama_t5(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' T5 names -> llama.cpp's (gguf's ``T5ENCODER`` tensors), as city96's T5 GGUF files hold them,
    written here from gguf's own name table (not from sdrt's map)."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS
    from gguf.tensor_mapping import get_tensor_name_map

    names = get_tensor_name_map(MODEL_ARCH.T5ENCODER, 2)
    out = {}
    for k, v in p.items():
        new = names.get_name(k, try_suffixes=(".weight",))
        assert new is not None, k
        out[new] = v
    assert len(out) == len(p) and MODEL_TENSORS[MODEL_ARCH.T5ENCODER]
    return out


@pytest.mark.parametrize("stored", ["F32", "Q8_0"])
def test_a_t5_gguf_in_llama_cpp_names_is_a_text_encoder(stored, tmp_path):
    """A T5 encoder GGUF as llama.cpp's converter names it (``enc.blk.N.attn_q.weight``, ``token_embd.weight``;
    city96's ``t5-v1_1-xxl-encoder-Q8_0.gguf`` for Flux) gives the image of a safetensors file in transformers'
    names holding the same values (for Q8_0: the values gguf's own dequantizer reads from the blocks)."""
    gguf = pytest.importorskip("gguf", reason="the gguf package writes the test file (pip install gguf)")
    from gguf import quants

    f = _files("flux-dev", tmp_path)
    t5 = t5_file(_params(PIPES / "tiny-flux-dev", "text_encoder_2"))
    w = gguf.GGUFWriter(str(tmp_path / "t5-encoder.gguf"), "t5encoder")
    same = {}
    for name, v in _llama_t5(t5).items():
        if stored == "Q8_0" and v.ndim == 2 and v.shape[-1] % 32 == 0 and "rel_b" not in name:
            q = quants.quantize(v, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            same[name] = quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(v.shape)
        else:
            w.add_tensor(name, v)
            same[name] = v
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    back = dict(zip(_llama_t5(t5), t5, strict=True))  # llama.cpp name -> transformers' name
    ref_file = h.write(tmp_path / "t5_same_values.safetensors", {back[k]: v for k, v in same.items()})
    case, kw = _case("flux-dev")
    images = []
    for t5_path in (tmp_path / "t5-encoder.gguf", ref_file):
        g = dict(f, text_encoders=[f["text_encoders"][1], t5_path])  # clip_l, then the T5 under test
        with _load(g) as pipe:
            images.append(np.stack(pipe(case["prompt"], case["negative_prompt"] or "", **kw)))
    assert np.array_equal(images[0], images[1])
    if stored == "F32":  # the same values as the folder: diffusers' image within the flow tolerance
        want = np.load(PIPES / "tiny-flux-dev" / "refs.npz")[f"{case['name']}/image"].astype(int)
        assert np.abs(images[0].astype(int) - want).max() <= 2


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_flux_kontext_single_file_takes_reference_images(fmt, tmp_path):
    """A Kontext checkpoint is a Flux dev file (the same keys), as a .safetensors or a GGUF (city96's layout: arch
    ``flux``, BFL's names): with reference images it gives diffusers' FluxKontextPipeline image
    (scripts/gen_kontext_refs.py, first case) within the flow tolerance."""
    f = _files("flux-dev", tmp_path)
    if fmt == "gguf":
        gguf = pytest.importorskip("gguf", reason="the gguf package writes the test file (pip install gguf)")
        from safetensors.numpy import load_file

        w = gguf.GGUFWriter(str(tmp_path / "flux1-kontext-dev.gguf"), "flux")
        for name, v in load_file(f["file"]).items():
            w.add_tensor(name, np.ascontiguousarray(v, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        f["file"] = tmp_path / "flux1-kontext-dev.gguf"
    case = json.loads((PIPES / "tiny-flux-dev" / "kontext.json").read_text())[0]
    refs = np.load(PIPES / "tiny-flux-dev" / "kontext.npz")
    with _load(f) as pipe:
        got = pipe(case["prompt"], steps=case["steps"], seed=case["seed"], guidance=case["guidance"], sampler="Euler",
                   max_sequence_length=case["max_sequence_length"], reference_resize=False,
                   reference_images=[refs[f"picture/{k}"] for k in case["refs"]])[0]
    want = refs[f"{case['name']}/image"][0]
    assert got.shape == want.shape and np.abs(got.astype(int) - want.astype(int)).max() <= 2
