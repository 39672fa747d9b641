"""The ViT-bigG/14 IP-Adapters and IP-Adapter Full Face against diffusers' ``load_ip_adapter``.

``scripts/gen_ipadapter_more_refs.py`` wrote, in ``tests/data/ipadapter``: a second tiny CLIP image encoder of another
width and depth (``image_encoder_g/``, standing in for h94's ``sdxl_models/image_encoder``, OpenCLIP ViT-bigG/14) and
its architecture exported as the shipped ``clip_vision_g`` is (``clip_vision_g.onnx``); base adapters reading its
``image_embeds`` for tiny-sd15 (as ``ip-adapter_sd15_vit-G``) and tiny-sdxl (as ``ip-adapter_sdxl``); a Full Face
adapter in h94's layout (``image_proj.proj.0/2/3``) reading the first tiny encoder's penultimate hidden states; and
diffusers' images of them. The two tiny graphs stand in for the shipped ones; which one an encoder binds onto is told
by its folder's config.json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import assert_matches_diffusers, register
from test_ipadapter import DATA, FOLDER, IPA, REFS, kwargs

from sdrt import pipelines
from sdrt.checkpoint.ipadapter import open_image_encoder, open_ip_adapter
from sdrt.errors import ModelError
from sdrt.pipelines import IPAdapter

MORE = np.load(IPA / "more_refs.npz")
ALL = json.loads((IPA / "more_refs.json").read_text())
G_CASES = [c for c in ALL if c["name"].startswith("vitg/sd15/")]
G_XL_CASES = [c for c in ALL if c["name"].startswith("vitg/sdxl/")]
FULL_CASES = [c for c in ALL if c["name"].startswith("fullface/")]
XL = DATA / "pipelines" / "tiny-sdxl"
TINY = {"clip_vision_h": IPA / "clip_vision.onnx", "clip_vision_g": IPA / "clip_vision_g.onnx"}


@pytest.fixture
def tiny_encoder_graphs(monkeypatch):
    """sdrt's shipped ViT-H/14 and ViT-bigG/14 graphs replaced by the tiny encoders', exported the same way."""
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: TINY.get(name) or real(name))
    register("reference")


def unit(scale: float, adapter: str, encoder: object) -> IPAdapter:
    return IPAdapter(IPA / adapter if isinstance(adapter, str) else adapter, image=REFS["ip_image"], scale=scale,
                     image_encoder=encoder)


def h94_layout(root: Path) -> Path:
    """h94/IP-Adapter's layout: models/ (ViT-H/14 encoder, SD 1.5 adapters, the vit-G one among them) and
    sdxl_models/ (ViT-bigG/14 encoder, ip-adapter_sdxl)."""
    for sub, enc in (("models", "image_encoder"), ("sdxl_models", "image_encoder_g")):
        (root / sub).mkdir(parents=True)
        shutil.copytree(IPA / enc, root / sub / "image_encoder")
    for sub, src, name in (("models", "ip-adapter_tiny_vit-G", "ip-adapter_sd15_vit-G"),
                           ("models", "ip-adapter-full-face_tiny", "ip-adapter-full-face_sd15"),
                           ("models", "ip-adapter_tiny", "ip-adapter_sd15"),
                           ("sdxl_models", "ip-adapter_tiny_sdxl_vit-G", "ip-adapter_sdxl"),
                           ("sdxl_models", "ip-adapter_tiny_sdxl", "ip-adapter_sdxl_vit-h")):
        shutil.copy(IPA / f"{src}.safetensors", root / sub / f"{name}.safetensors")
    return root


def test_full_face_projection_is_diffusers_ip_adapter_full_image_projection():
    ad = open_ip_adapter(IPA / "ip-adapter-full-face_tiny.safetensors", base="sd1", text_width=32)
    assert (ad.kind, ad.tokens, ad.image_dim, ad.cross, ad.reads) == ("full", 0, 32, 32, "hidden states")
    assert "Full Face" in ad.label
    got = ad.project(MORE["full_hidden"])
    assert got.shape == MORE["full_tokens"].shape == (1, 17, 32)  # a token per encoder token (16 patches + class)
    assert np.abs(got - MORE["full_tokens"]).max() < 1e-4


def test_full_face_on_an_onnx_folder_matches_diffusers(tiny_encoder_graphs, tmp_path):
    """The second case finds models/image_encoder beside the adapter in h94's layout."""
    h94 = h94_layout(tmp_path)
    with pipelines.load(FOLDER, backend="reference") as pipe:
        for k, case in enumerate(FULL_CASES):
            ip = unit(case["scale"], h94 / "models" / "ip-adapter-full-face_sd15.safetensors",
                      None if k else IPA / "image_encoder")
            got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=ip, **kwargs(case)).images
            assert_matches_diffusers(got, MORE[case["name"]])
        case = FULL_CASES[0]
        plain = pipe.generate(case["prompt"], case["negative_prompt"], **kwargs(case)).images[0]
        rp = pipe.plan(case["prompt"], case["negative_prompt"],
                       ip_adapter=unit(0.6, "ip-adapter-full-face_tiny.safetensors", IPA / "image_encoder"),
                       **kwargs(case))
    assert np.abs(plain.astype(int) - MORE[case["name"]][0].astype(int)).max() > 20  # the adapter did something
    enc = next(p for p in rp.parts if p.part == "image_encoder")  # the picture and a zero picture, one call
    assert enc.signatures == [((("pixel_values", (2, 3, 32, 32), "float32"),), 1)]
    unet = next(p for p in rp.parts if p.part == "unet")
    assert ("ip_adapter_1_key", (2, 17, 16), "float32") in unet.signatures[0][0]


def test_vit_bigg_adapters_match_diffusers_on_sd1_and_sdxl(tiny_encoder_graphs, tmp_path):
    """ip-adapter_sd15_vit-G (in models/, its encoder in sdxl_models/: found by what it reads, not by name) and
    ip-adapter_sdxl (its encoder beside it), each bound onto the bigG graph its encoder's config says."""
    h94 = h94_layout(tmp_path)
    for folder, cases, adapter in ((FOLDER, G_CASES, h94 / "models" / "ip-adapter_sd15_vit-G.safetensors"),
                                   (XL, G_XL_CASES, h94 / "sdxl_models" / "ip-adapter_sdxl.safetensors")):
        with pipelines.load(folder, backend="reference") as pipe:
            for case in cases:
                got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=unit(case["scale"], adapter,
                                    None), **kwargs(case)).images
                assert_matches_diffusers(got, MORE[case["name"]])
                assert [p.path for p in pipe._ip_encoders.values()] == [IPA / "clip_vision_g.onnx"]


def test_the_encoder_is_chosen_by_its_config_not_by_a_name(tiny_encoder_graphs, tmp_path):
    """A bigG folder named as h94's ViT-H one (models/image_encoder) binds onto the bigG graph, and the other way."""
    shutil.copytree(IPA / "image_encoder_g", tmp_path / "models" / "image_encoder")
    shutil.copytree(IPA / "image_encoder", tmp_path / "sdxl_models" / "image_encoder")
    g = open_image_encoder(tmp_path / "models" / "image_encoder")
    h = open_image_encoder(tmp_path / "sdxl_models" / "image_encoder")
    assert (g.graph, g.label, g.embed_dim, g.hidden_dim) == (IPA / "clip_vision_g.onnx", "ViT-bigG/14", 20, 40)
    assert (h.graph, h.label, h.embed_dim, h.hidden_dim) == (IPA / "clip_vision.onnx", "ViT-H/14", 24, 32)


def test_comfyuis_single_encoder_file_without_a_config_binds_by_its_tensors(tiny_encoder_graphs, tmp_path):
    """ComfyUI's clip_vision/ holds the bare model.safetensors: the size and the graph come from its tensors."""
    (tmp_path / "clip_vision").mkdir()
    f = shutil.copy(IPA / "image_encoder_g" / "model.safetensors",
                    tmp_path / "clip_vision" / "CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors")
    enc = open_image_encoder(f)
    assert (enc.graph, enc.image_size, enc.embed_dim) == (IPA / "clip_vision_g.onnx", 32, 20)
    with pipelines.load(FOLDER, backend="reference") as pipe:
        case = G_CASES[0]
        got = pipe.generate(case["prompt"], case["negative_prompt"],
                            ip_adapter=unit(case["scale"], "ip-adapter_tiny_vit-G.safetensors", f), **kwargs(case))
    assert_matches_diffusers(got.images, MORE[case["name"]])


@pytest.mark.parametrize("adapter, encoder, words", [
    ("ip-adapter_tiny_vit-G.safetensors", "image_encoder", ("the image encoder ipadapter/image_encoder (ViT-H/14) gives 24-wide "
                                                           "image embeds and ip-adapter_tiny_vit-G.safetensors reads "
                                                           "20-wide ones",)),
    ("ip-adapter_tiny.safetensors", "image_encoder_g", ("image_encoder_g (ViT-bigG/14) gives 20-wide image embeds",
                                                        "reads 24-wide ones")),
    ("ip-adapter-full-face_tiny.safetensors", "image_encoder_g", ("gives 40-wide hidden states",
                                                                  "reads 32-wide ones")),
])
def test_an_encoder_of_another_width_is_refused_before_it_runs(tiny_encoder_graphs, adapter, encoder, words):
    with pipelines.load(FOLDER, backend="reference") as pipe:
        with pytest.raises(ModelError) as info:
            pipe.generate("a cat", ip_adapter=unit(1.0, adapter, IPA / encoder), **kwargs(G_CASES[0]))
        assert not pipe.__dict__.get("_ip_encoders")  # refused before the encoder was compiled or run
    text = str(info.value)
    assert info.value.where == "image_encoder" and "\n" not in text
    for w in words:
        assert w in text, text


def _openclip_file(path: Path, text: dict) -> Path:
    """The tiny bigG encoder's weights in open_clip's own layout (``visual.`` keys, fused in_proj, ``proj`` applied as
    x @ proj), with ``text``'s tensors beside them, written to ``path``."""
    from sdrt.weights import Weights

    w = Weights.open(IPA / "image_encoder_g" / "model.safetensors")
    get = {k: w.get_array(k) for k in w.shapes()}
    v, out = "vision_model.", dict(text)
    names = {"class_embedding": "embeddings.class_embedding", "conv1.weight": "embeddings.patch_embedding.weight",
             "positional_embedding": "embeddings.position_embedding.weight", "ln_pre.weight": "pre_layrnorm.weight",
             "ln_pre.bias": "pre_layrnorm.bias", "ln_post.weight": "post_layernorm.weight",
             "ln_post.bias": "post_layernorm.bias"}
    out.update({f"visual.{o}": get[v + t] for o, t in names.items()})
    out["visual.proj"] = np.ascontiguousarray(get["visual_projection.weight"].T)
    for i in range(3):
        a, b = f"{v}encoder.layers.{i}.", f"visual.transformer.resblocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{b}attn.in_proj_{kind}"] = np.concatenate([get[f"{a}self_attn.{q}_proj.{kind}"] for q in "qkv"])
            for o, t in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"), ("attn.out_proj", "self_attn.out_proj"),
                         ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
                out[f"{b}{o}.{kind}"] = get[f"{a}{t}.{kind}"]
    return Weights.from_arrays(out).save(path)


def test_an_openclip_layout_encoder_file_binds_as_transformers_own(tiny_encoder_graphs, tmp_path):
    """open_clip's own layout (``visual.`` keys beside a text tower: fused in_proj, ``proj`` applied as x @ proj), as
    ComfyUI's clip_vision loader takes it: the tiny bigG encoder's weights written so by hand, found in clip_vision/
    by what the adapter reads, give diffusers' image (made from the transformers layout)."""
    from sdrt.checkpoint.ipadapter import find_encoder

    (tmp_path / "clip_vision").mkdir()
    f = _openclip_file(tmp_path / "clip_vision" / "open_clip_model.safetensors",
                       {"text.token_embedding.weight": np.zeros((8, 4), np.float32)})
    other = shutil.copy(IPA / "image_encoder" / "model.safetensors", tmp_path / "clip_vision" / "vit-h.safetensors")
    assert find_encoder(IPA / "ip-adapter_tiny_vit-G.safetensors", [Path(other), f]) == f
    enc = open_image_encoder(f)
    assert (enc.graph, enc.image_size, enc.embed_dim, enc.hidden_dim) == (IPA / "clip_vision_g.onnx", 32, 20, 40)
    with pipelines.load(FOLDER, backend="reference") as pipe:
        case = G_CASES[0]
        got = pipe.generate(case["prompt"], case["negative_prompt"],
                            ip_adapter=unit(case["scale"], "ip-adapter_tiny_vit-G.safetensors", f), **kwargs(case))
    assert_matches_diffusers(got.images, MORE[case["name"]])


def test_a_whole_openclip_file_with_its_text_tower_is_found_by_what_it_gives(tmp_path):
    """open_clip's whole model file (laion's open_clip_model.safetensors) holds the text tower at the top level
    (``transformer.resblocks.N.attn.in_proj_weight``, ``text_projection``), sorted before ``visual.``: the encoder's
    widths are the visual tower's, so clip_vision/ finds it for a bigG adapter beside a ViT-H/14 file; until
    2026-12-01 the text tower's in_proj was taken for the visual one's and the file was never found."""
    from sdrt.checkpoint.ipadapter import encoder_widths, find_encoder

    (tmp_path / "clip_vision").mkdir()
    text = {"positional_embedding": np.zeros((8, 4), np.float32), "text_projection": np.zeros((4, 4), np.float32),
            "token_embedding.weight": np.zeros((8, 4), np.float32),
            "transformer.resblocks.0.attn.in_proj_weight": np.zeros((12, 4), np.float32),
            "transformer.resblocks.0.attn.in_proj_bias": np.zeros((12,), np.float32)}
    f = _openclip_file(tmp_path / "clip_vision" / "open_clip_model.safetensors", text)
    other = shutil.copy(IPA / "image_encoder" / "model.safetensors", tmp_path / "clip_vision" / "vit-h.safetensors")
    assert encoder_widths(f) == (20, 40)
    assert find_encoder(IPA / "ip-adapter_tiny_vit-G.safetensors", [Path(other), f]) == f
