"""IP-Adapter files on single-file checkpoints and shipped graphs, and what is refused.

- a single file's UNet (bound onto a weight-free graph, here tiny-sd15's stripped, as test_single_file_controlnet
  points sdrt's graph lookup at tiny graphs) runs with IP attention and gives the ONNX folder's image, which
  tests/pipelines/test_ipadapter.py checks against diffusers; without the adapter it runs its plain graph again;
- the shipped full-size SD 1.x / SDXL UNet graphs (initializers named, nodes anonymous) get one IP attention per
  cross-attention layer at the places h94's files number (SD 1.5: 1..31, SDXL: 1..139) with the heads their own
  attention uses;
- refusals, one line each, in the caller's words: an adapter for another family, no image encoder, an encoder of
  another width, Plus / Full Face / FaceID files of an unknown layout, a file that is no adapter;
- full-size IP-Adapter Plus headers in h94's shapes open as Plus adapters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import single_file_helpers as h

from sdrt import pipelines
from sdrt.errors import InputError, ModelError
from sdrt.graph import Graph
from sdrt.pipelines import IPAdapter
from sdrt.weights import Weights

DATA = Path(__file__).resolve().parents[1] / "data"
IPA = DATA / "ipadapter"
FOLDER = DATA / "pipelines" / "tiny-sd15"
REFS = np.load(IPA / "refs.npz")
KW = dict(steps=3, cfg=6.0, sampler="Euler", seed=5, width=64, height=64)


def unit(adapter: Path = IPA / "ip-adapter_tiny.safetensors", encoder: object = IPA / "image_encoder",
         scale: float = 0.8) -> IPAdapter:
    return IPAdapter(adapter, image=REFS["ip_image"], scale=scale, image_encoder=encoder)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sf-ipa")
    graphs = h.stripped(FOLDER, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp / "g")
    ck = h.write(tmp / "tiny.safetensors", {
        **h.unet_tensors(Graph.load(FOLDER / "unet" / "model.onnx")),
        **h.clip_tensors(Graph.load(FOLDER / "text_encoder" / "model.onnx"), "cond_stage_model.transformer.")})
    vae = h.write(tmp / "tiny_vae.safetensors", h.vae_tensors(Graph.load(FOLDER / "vae_decoder" / "model.onnx"),
                                                               Graph.load(FOLDER / "vae_encoder" / "model.onnx")))
    shipped = {"sd1_unet": graphs["unet"], "clip_l": graphs["text_encoder"], "vae4_decoder": graphs["vae_decoder"],
               "vae4_encoder": graphs["vae_encoder"], "clip_vision_h": IPA / "clip_vision.onnx"}
    return ck, vae, shipped


@pytest.fixture
def tiny_graphs(tiny_file, monkeypatch):
    from sdrt.checkpoint import files, graphs

    shipped = tiny_file[2]
    monkeypatch.setattr(files, "shipped_graph", lambda name: shipped[name])
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: shipped[name])
    return tiny_file


def test_single_file_runs_ip_attention_and_its_plain_graph_without(tiny_graphs):
    ck, vae, _ = tiny_graphs
    with pipelines.load(ck, backend="reference", vae=vae, tokenizers={"tokenizer": FOLDER / "tokenizer"}) as pipe:
        plain1 = pipe.generate("a red cat", "blurry", **KW).images[0]
        with_ip = pipe.generate("a red cat", "blurry", ip_adapter=unit(), **KW).images[0]
        assert any(n.startswith("ip_adapter_") for n in pipe.unet.inputs)
        plain2 = pipe.generate("a red cat", "blurry", **KW).images[0]
        assert not any(n.startswith("ip_adapter_") for n in pipe.unet.inputs)
    with pipelines.load(FOLDER, backend="reference") as folder:
        want = folder.generate("a red cat", "blurry", ip_adapter=unit(), **KW).images[0]
    assert with_ip.tobytes() == want.tobytes()
    assert plain1.tobytes() == plain2.tobytes()
    assert np.abs(with_ip.astype(int) - plain1.astype(int)).max() > 20  # the adapter did something


@pytest.mark.parametrize("name, places, heads", [("sd1_unet", range(1, 32, 2), {320: 8, 640: 8, 1280: 8}),
                                                 ("sdxl_unet", range(1, 140, 2), {640: 10, 1280: 20})])
def test_shipped_unet_graphs_get_ip_attention_in_h94s_layer_order(name, places, heads):
    from sdrt.checkpoint import shipped_graph
    from sdrt.checkpoint.ipattention import ip_attention_graph, layer_widths

    model = onnx.load(str(shipped_graph(name)), load_external_data=False)
    before = len(model.graph.node)
    ip_attention_graph(model, lambda width: -1, name)  # every layer's heads read from its own graph
    widths = layer_widths(model)
    assert sorted(widths) == list(places)
    assert set(widths.values()) == set(heads)
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant" and n.output[0].endswith("heads_c")}
    got = {}
    for k, w in widths.items():
        t = consts[f"/ip_adapter/{k}/heads_c"].attribute[0].t
        got[w] = int(onnx.numpy_helper.to_array(t)[2])
    assert got == heads
    assert len(model.graph.node) == before + 16 * len(widths)


def _adapter(path: Path, cross: int, image_dim: int = 24, extra: dict | None = None) -> Path:
    rng = np.random.default_rng(0)
    t = {"image_proj.proj.weight": rng.standard_normal((4 * cross, image_dim), dtype=np.float32),
         "image_proj.proj.bias": np.zeros(4 * cross, np.float32), "image_proj.norm.weight": np.ones(cross, np.float32),
         "image_proj.norm.bias": np.zeros(cross, np.float32)}
    for k in (1, 3, 5, 7):
        t[f"ip_adapter.{k}.to_k_ip.weight"] = t[f"ip_adapter.{k}.to_v_ip.weight"] = \
            rng.standard_normal((16, cross), dtype=np.float32)
    t.update(extra or {})
    Weights.from_arrays(t).save(path)
    return path


def _refused(exc_type, adapter_unit, *words):
    with pytest.raises(exc_type) as info, pipelines.load(FOLDER, backend="reference") as pipe:
        pipe.generate("a red cat", ip_adapter=adapter_unit, **KW)
    text = str(info.value)
    print(text)
    assert "\n" not in text
    for w in words:
        assert w in text, text
    return text


@pytest.fixture
def folder_run(monkeypatch):
    from backend_helpers import register

    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph", lambda n: IPA / "clip_vision.onnx" if n == "clip_vision_h" else real(n))
    register("reference")


def test_an_sdxl_adapter_on_sd1_is_refused(folder_run, tmp_path):
    _refused(ModelError, unit(_adapter(tmp_path / "ip-adapter_sdxl.safetensors", 2048)),
             "is an SDXL IP-Adapter, and the model is SD 1.x", "ip_adapter")


def test_a_missing_image_encoder_is_refused(folder_run, tmp_path):
    import shutil

    alone = shutil.copyfile(IPA / "ip-adapter_tiny.safetensors", tmp_path / "ip-adapter_tiny.safetensors")
    _refused(InputError, unit(alone, encoder=None), "no image encoder for ip-adapter_tiny.safetensors",
             "image_encoder")
    _refused(ModelError, unit(encoder=tmp_path / "nowhere"), "does not exist", "image_encoder")


def test_an_image_encoder_of_another_width_is_refused(folder_run, tmp_path):
    _refused(ModelError, unit(_adapter(tmp_path / "ip16.safetensors", 32, image_dim=16)),
             "24-wide image embeds", "reads 16-wide ones", "image_encoder")



@pytest.mark.parametrize("config", ["[1, 2]", '{"image_size": "224"}', '{"vision_config": [224]}',
                                    '{"image_size": 224, "projection_dim": 24.5}'])
def test_an_image_encoder_config_that_is_no_clip_vision_config_is_refused(folder_run, tmp_path, config):
    """A config.json of another shape (a list, a string size) was an AttributeError / ValueError traceback."""
    import shutil

    enc = tmp_path / "image_encoder"
    enc.mkdir()
    shutil.copy(IPA / "image_encoder" / "model.safetensors", enc)
    (enc / "config.json").write_text(config)
    _refused(ModelError, unit(encoder=enc), "config.json is not a CLIP vision config", "download the image encoder",
             "image_encoder")

@pytest.mark.parametrize("extra, kind", [
    ({"image_proj.latents": np.zeros((1, 16, 32), np.float32)},
     "IP-Adapter Plus of a layout sdrt does not know (no image_proj.proj_in.weight)"),
    ({"image_proj.proj.0.weight": np.zeros((32, 32), np.float32)},
     "IP-Adapter FaceID of a layout sdrt does not know (no image_proj.proj.0.bias)"),
    ({"ip_adapter.1.to_q_lora.down.weight": np.zeros((4, 32), np.float32)},
     "IP-Adapter with LoRA weights of a kind sdrt does not know"),
    ({"image_proj.perceiver_resampler.proj_in.weight": np.zeros((32, 32), np.float32)},
     "IP-Adapter FaceID Plus of a layout sdrt does not know (no image_proj.proj.0.weight)"),
    ({"image_proj.proj.0.weight": np.zeros((32, 32), np.float32), "image_proj.proj.3.weight": np.ones(32, np.float32)},
     "Full Face of a layout sdrt does not know (no image_proj.proj.0.bias)")])
def test_adapter_variants_sdrt_does_not_build_are_refused(folder_run, tmp_path, extra, kind):
    """A Plus, Full Face, FaceID (an MLP of the face embedding beside image_proj.norm) or FaceID Plus
    (perceiver_resampler) file missing a key, naming it; LoRA keys without a FaceID projection by what they are."""
    if "image_proj.proj.3.weight" in extra:  # Full Face has no image_proj.proj / norm
        path = _adapter(tmp_path / "w.safetensors", 32, extra=extra)
        w = Weights.open(path)
        keep = {k: w.get_array(k) for k in w.shapes() if not k.startswith(("image_proj.proj.",
                "image_proj.norm.")) or k in extra}
        Weights.from_arrays(keep).save(tmp_path / "v.safetensors")
    else:
        _adapter(tmp_path / "v.safetensors", 32, extra=extra)
    _refused(ModelError, unit(tmp_path / "v.safetensors"), kind, "does not run",
             "runs the base IP-Adapter, IP-Adapter Plus, Full Face, FaceID, FaceID Plus and InstantID", "ip-adapter-plus_sd15",
             "ip-adapter-full-face_sd15")


@pytest.mark.parametrize("name, cross, image_dim, places, widths", [
    ("ip-adapter-plus_sd15.safetensors", 768, 1280, range(1, 32, 2), (320, 640, 1280)),
    ("ip-adapter-plus_sdxl_vit-h.safetensors", 2048, 1280, range(1, 140, 2), (640, 1280))])
def test_full_size_plus_files_open_with_h94s_shapes(tmp_path, name, cross, image_dim, places, widths):
    """Headers in h94's shapes (float16; 16 latents 768 / 1280 wide, 12 / 20 heads of 64, 4 blocks): a Plus adapter
    of the family its text width says, 16 tokens from the encoder's 1280-wide hidden states."""
    from sdrt.checkpoint.ipadapter import open_ip_adapter

    hidden = 768 if cross == 768 else 1280
    shapes = {"image_proj.latents": (1, 16, hidden), "image_proj.proj_in.weight": (hidden, image_dim),
              "image_proj.proj_in.bias": (hidden,), "image_proj.proj_out.weight": (cross, hidden),
              "image_proj.proj_out.bias": (cross,), "image_proj.norm_out.weight": (cross,),
              "image_proj.norm_out.bias": (cross,)}
    for n in range(4):
        a, f = f"image_proj.layers.{n}.0", f"image_proj.layers.{n}.1"
        shapes.update({f"{a}.norm1.weight": (hidden,), f"{a}.norm1.bias": (hidden,), f"{a}.norm2.weight": (hidden,),
                       f"{a}.norm2.bias": (hidden,), f"{a}.to_q.weight": (hidden, hidden),
                       f"{a}.to_kv.weight": (2 * hidden, hidden), f"{a}.to_out.weight": (hidden, hidden),
                       f"{f}.0.weight": (hidden,), f"{f}.0.bias": (hidden,), f"{f}.1.weight": (4 * hidden, hidden),
                       f"{f}.3.weight": (hidden, 4 * hidden)})
    for i, k in enumerate(places):
        shapes[f"ip_adapter.{k}.to_k_ip.weight"] = shapes[f"ip_adapter.{k}.to_v_ip.weight"] = \
            (widths[i % len(widths)], cross)
    h.sparse(tmp_path / name, shapes)
    ad = open_ip_adapter(tmp_path / name)
    assert (ad.kind, ad.base, ad.tokens, ad.image_dim, ad.cross) == (
        "plus", "sd1" if cross == 768 else "sdxl", 16, image_dim, cross)
    assert sorted(ad.layers) == list(places) and "Plus" in ad.label


def test_a_file_that_is_no_adapter_is_refused(folder_run):
    _refused(ModelError, unit(IPA / "image_encoder" / "model.safetensors"), "is not an IP-Adapter")


def _vit_folder(tmp_path: Path, name: str, drop_last_layer: bool = False) -> Path:
    """An image encoder folder as h94/IP-Adapter's models/image_encoder holds it (config.json + model.safetensors,
    headers only), with the shipped ViT-H/14 graph's tensor names and shapes (fp16, as the release stores it)."""
    import json

    from sdrt.checkpoint import shipped_graph

    graph = Graph.load(shipped_graph("clip_vision_h"))
    info = graph.initializer_info()
    shapes = {k: tuple(int(d) for d in info[k].shape) for k in graph.external_refs}
    if drop_last_layer:  # a 31-layer encoder: another size
        shapes = {k: v for k, v in shapes.items() if ".layers.31." not in k}
    folder = tmp_path / name
    folder.mkdir()
    h.sparse(folder / "model.safetensors", shapes)
    (folder / "config.json").write_text(json.dumps({"architectures": ["CLIPVisionModelWithProjection"],
                                                    "image_size": 224, "projection_dim": 1024, "hidden_size": 1280}))
    return folder


def test_a_full_size_vit_h_encoder_folder_binds_onto_the_shipped_graph(tmp_path):
    from sdrt.checkpoint.ipadapter import open_image_encoder

    enc = open_image_encoder(_vit_folder(tmp_path, "image_encoder"))
    assert (enc.image_size, enc.embed_dim) == (224, 1024)
    graph = Graph.load(enc.graph)  # the shipped graph: weight-free, pixel_values [batch, 3, 224, 224] -> image_embeds
    assert graph.is_stripped and [i.name for i in graph.inputs] == ["pixel_values"]
    assert not isinstance(graph.inputs[0].shape[0], int) and tuple(graph.inputs[0].shape[1:]) == (3, 224, 224)
    # image_embeds (the base adapter's) and the penultimate hidden states (IP-Adapter Plus's), all 257 tokens
    assert [o.name for o in graph.outputs] == ["image_embeds", "penultimate_hidden_states"]
    assert tuple(graph.outputs[1].shape[1:]) == (257, 1280)
    assert enc.weights is not None
    enc.weights.fits(Graph.load(enc.graph))  # every initializer bound, strictly
    with pytest.raises(ModelError, match="another size than ViT-H/14.*layers.31"):
        open_image_encoder(_vit_folder(tmp_path, "short", drop_last_layer=True))


def test_single_file_with_a_controlnet_runs_the_twin_graph_with_ip_attention(tmp_path, monkeypatch):
    """A single file's UNet switched to its ControlNet twin (sd1_unet_controlnet) and given IP attention on top:
    diffusers' StableDiffusionControlNetPipeline with load_ip_adapter (tests/data/ipadapter, controlnet+ip)."""
    import json

    from test_single_file_controlnet import _without_residuals

    from sdrt.checkpoint import files, graphs

    folder = DATA / "pipelines" / "tiny-sd15-controlnet"
    g = h.stripped(folder, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp_path / "g")
    shipped = {"sd1_unet": _without_residuals(g["unet"], tmp_path / "g" / "plain.onnx"), "sd1_unet_controlnet": g["unet"],
               "clip_l": g["text_encoder"], "vae4_decoder": g["vae_decoder"], "vae4_encoder": g["vae_encoder"],
               "clip_vision_h": IPA / "clip_vision.onnx"}
    monkeypatch.setattr(files, "shipped_graph", lambda name: shipped[name])
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: shipped[name])
    ck = h.write(tmp_path / "tinycn.safetensors", {
        **h.unet_tensors(Graph.load(folder / "unet" / "model.onnx")),
        **h.clip_tensors(Graph.load(folder / "text_encoder" / "model.onnx"), "cond_stage_model.transformer.")})
    vae = h.write(tmp_path / "vae.safetensors", h.vae_tensors(Graph.load(folder / "vae_decoder" / "model.onnx"),
                                                              Graph.load(folder / "vae_encoder" / "model.onnx")))
    case = next(c for c in json.loads((IPA / "refs.json").read_text()) if c["name"].startswith("controlnet+ip/"))
    edges = np.load(folder / "refs.npz")["edges"]
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=64, height=64)
    with pipelines.load(ck, backend="reference", vae=vae, tokenizers={"tokenizer": folder / "tokenizer"}) as pipe:
        got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=unit(scale=case["scale"]),
                            controlnets=[(folder / "controlnet", edges, case["control_scale"])], **kw).images
        assert pipe.unet.path == shipped["sd1_unet_controlnet"]
        assert any(n.startswith("ip_adapter_") for n in pipe.unet.inputs)
    diff = np.abs(np.stack(got).astype(int) - REFS[case["name"]].astype(int))  # the diffusers references' bound
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, (diff.max(), (diff > 0).mean())


# -- ViT-bigG/14 and Full Face at full size (headers only) ----------------------------------------------------------
#: h94/IP-Adapter's image_encoder/config.json values (models/: laion ViT-H/14; sdxl_models/: laion ViT-bigG/14)
H94_CONFIGS = {"models": dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=16, num_hidden_layers=32,
                              image_size=224, patch_size=14, projection_dim=1024),
               "sdxl_models": dict(hidden_size=1664, intermediate_size=8192, num_attention_heads=16,
                                   num_hidden_layers=48, image_size=224, patch_size=14, projection_dim=1280)}


def clip_vision_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """transformers' CLIPVisionModelWithProjection parameters for a config, written out from its modules."""
    d, n = c["hidden_size"], (c["image_size"] // c["patch_size"]) ** 2 + 1
    v = "vision_model."
    shapes = {f"{v}embeddings.class_embedding": (d,),
              f"{v}embeddings.patch_embedding.weight": (d, 3, c["patch_size"], c["patch_size"]),
              f"{v}embeddings.position_embedding.weight": (n, d), "visual_projection.weight": (c["projection_dim"], d)}
    for norm in ("pre_layrnorm", "post_layernorm"):
        shapes.update({f"{v}{norm}.weight": (d,), f"{v}{norm}.bias": (d,)})
    for i in range(c["num_hidden_layers"]):
        a = f"{v}encoder.layers.{i}."
        for lin in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes.update({f"{a}self_attn.{lin}.weight": (d, d), f"{a}self_attn.{lin}.bias": (d,)})
        for norm in ("layer_norm1", "layer_norm2"):
            shapes.update({f"{a}{norm}.weight": (d,), f"{a}{norm}.bias": (d,)})
        shapes.update({f"{a}mlp.fc1.weight": (c["intermediate_size"], d), f"{a}mlp.fc1.bias": (c["intermediate_size"],),
                       f"{a}mlp.fc2.weight": (d, c["intermediate_size"]), f"{a}mlp.fc2.bias": (d,)})
    return shapes


def h94_encoder_folder(root: Path, sub: str, config: dict | None = None) -> Path:
    """h94's ``<sub>/image_encoder`` (config.json + fp16 model.safetensors, headers only)."""
    import json

    folder = root / sub / "image_encoder"
    folder.mkdir(parents=True)
    h.sparse(folder / "model.safetensors", clip_vision_shapes(H94_CONFIGS[sub]))
    (folder / "config.json").write_text(json.dumps({"architectures": ["CLIPVisionModelWithProjection"],
                                                    "model_type": "clip_vision_model", "hidden_act": "gelu",
                                                    **(config or H94_CONFIGS[sub])}))
    return folder


def h94_adapter(path: Path, kind: str, cross: int, image_dim: int) -> Path:
    """A full-size adapter header in h94's layout: ``base`` (ImageProjection) or ``full`` (Full Face's MLP)."""
    widths = {768: (320, 640, 1280), 2048: (640, 1280)}[cross]
    places = range(1, 32, 2) if cross == 768 else range(1, 140, 2)
    shapes: dict[str, tuple[int, ...]] = (
        {"image_proj.proj.weight": (4 * cross, image_dim), "image_proj.proj.bias": (4 * cross,),
         "image_proj.norm.weight": (cross,), "image_proj.norm.bias": (cross,)} if kind == "base" else
        {"image_proj.proj.0.weight": (image_dim, image_dim), "image_proj.proj.0.bias": (image_dim,),
         "image_proj.proj.2.weight": (cross, image_dim), "image_proj.proj.2.bias": (cross,),
         "image_proj.proj.3.weight": (cross,), "image_proj.proj.3.bias": (cross,)})
    for i, k in enumerate(places):
        shapes[f"ip_adapter.{k}.to_k_ip.weight"] = shapes[f"ip_adapter.{k}.to_v_ip.weight"] = (widths[i % len(widths)],
                                                                                               cross)
    path.parent.mkdir(parents=True, exist_ok=True)
    return h.sparse(path, shapes)


def test_the_shipped_bigg_graph_has_the_published_configs_shapes():
    """clip_vision_g: every initializer of transformers' CLIPVisionModelWithProjection for h94's sdxl_models config
    (written out above, not read from the graph), both outputs, 257 tokens 1664 wide."""
    from sdrt.checkpoint import shipped_graph

    graph = Graph.load(shipped_graph("clip_vision_g"))
    info = graph.initializer_info()
    got = {k: tuple(int(d) for d in info[k].shape) for k in graph.external_refs}
    want = clip_vision_shapes(H94_CONFIGS["sdxl_models"])
    assert got == want, (sorted(set(got) ^ set(want))[:5], [k for k in want if got.get(k) != want[k]][:5])
    assert sum(int(np.prod(s)) for s in want.values()) == 1844907264  # the 1844.9M parameters h94's card gives
    assert graph.is_stripped and tuple(graph.inputs[0].shape[1:]) == (3, 224, 224)
    assert [o.name for o in graph.outputs] == ["image_embeds", "penultimate_hidden_states"]
    assert tuple(graph.outputs[0].shape[1:]) == (1280,) and tuple(graph.outputs[1].shape[1:]) == (257, 1664)


def test_h94s_bigg_encoder_folder_binds_onto_the_bigg_graph_by_its_config(tmp_path):
    from sdrt.checkpoint import shipped_graph
    from sdrt.checkpoint.ipadapter import open_image_encoder

    enc = open_image_encoder(h94_encoder_folder(tmp_path, "sdxl_models"))
    assert (enc.graph, enc.label, enc.image_size, enc.embed_dim, enc.hidden_dim) == (
        shipped_graph("clip_vision_g"), "ViT-bigG/14", 224, 1280, 1664)
    enc.weights.fits(Graph.load(enc.graph))  # every initializer bound, strictly
    h = open_image_encoder(h94_encoder_folder(tmp_path, "models"))
    assert (h.graph, h.label, h.embed_dim, h.hidden_dim) == (shipped_graph("clip_vision_h"), "ViT-H/14", 1024, 1280)
    # a config.json saying bigG beside ViT-H tensors: refused, naming both
    wrong = h94_encoder_folder(tmp_path / "w", "models", H94_CONFIGS["sdxl_models"])
    with pytest.raises(ModelError, match="config.json says 1664 wide, 48 layers and 1280-wide image_embeds, and "
                                         "model.safetensors holds 1280 wide, 32 layers and 1024-wide"):
        open_image_encoder(wrong)


@pytest.mark.parametrize("name, kind, cross, image_dim, base", [
    ("sdxl_models/ip-adapter_sdxl.safetensors", "base", 2048, 1280, "sdxl"),
    ("models/ip-adapter_sd15_vit-G.safetensors", "base", 768, 1280, "sd1"),
    ("models/ip-adapter-full-face_sd15.safetensors", "full", 768, 1280, "sd1")])
def test_full_size_bigg_and_full_face_files_open_with_h94s_shapes(tmp_path, name, kind, cross, image_dim, base):
    from sdrt.checkpoint.ipadapter import open_ip_adapter

    ad = open_ip_adapter(h94_adapter(tmp_path / name, kind, cross, image_dim))
    assert (ad.kind, ad.base, ad.image_dim, ad.cross, ad.tokens) == (kind, base, image_dim, cross,
                                                                     4 if kind == "base" else 0)
    assert ad.reads == ("image embeds" if kind == "base" else "hidden states")


def test_h94s_layout_gives_each_adapter_the_encoder_it_reads(tmp_path):
    """Found by what the adapter reads (the folders' config.json), not by its name: ip-adapter_sd15_vit-G (models/)
    reads sdxl_models/'s bigG, ip-adapter_sdxl_vit-h and plus_sdxl_vit-h (sdxl_models/) models/'s ViT-H."""
    from sdrt.pipelines.ipadapter import default_encoder

    for sub in ("models", "sdxl_models"):
        h94_encoder_folder(tmp_path, sub)
    files = {"models/ip-adapter_sd15.safetensors": ("base", 768, 1024, "models"),
             "models/ip-adapter_sd15_vit-G.safetensors": ("base", 768, 1280, "sdxl_models"),
             "models/ip-adapter-full-face_sd15.safetensors": ("full", 768, 1280, "models"),
             "sdxl_models/ip-adapter_sdxl.safetensors": ("base", 2048, 1280, "sdxl_models"),
             "sdxl_models/ip-adapter_sdxl_vit-h.safetensors": ("base", 2048, 1024, "models")}
    for name, (kind, cross, image_dim, where) in files.items():
        got = default_encoder(h94_adapter(tmp_path / name, kind, cross, image_dim))
        assert got == tmp_path / where / "image_encoder", name


@pytest.mark.parametrize("adapter, kind, cross, image_dim, encoder, words", [
    ("ip-adapter_sdxl.safetensors", "base", 2048, 1280, "models",
     ("the image encoder models/image_encoder (ViT-H/14) gives 1024-wide image embeds and ip-adapter_sdxl.safetensors "
      "reads 1280-wide ones (an OpenCLIP ViT-bigG/14's)", "the ViT-bigG/14, h94/IP-Adapter's sdxl_models/image_encoder "
      "folder (ComfyUI's clip_vision/CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors)")),
    ("ip-adapter_sd15.safetensors", "base", 768, 1024, "sdxl_models",
     ("sdxl_models/image_encoder (ViT-bigG/14) gives 1280-wide image embeds", "reads 1024-wide ones",
      "h94/IP-Adapter's models/image_encoder folder")),
    ("ip-adapter-full-face_sd15.safetensors", "full", 768, 1280, "sdxl_models",
     ("gives 1664-wide hidden states", "reads 1280-wide ones", "ViT-H/14, h94/IP-Adapter's models/image_encoder"))])
def test_an_encoder_of_the_other_kind_is_refused_naming_the_one_to_pass(tmp_path, adapter, kind, cross, image_dim,
                                                                        encoder, words):
    from sdrt.checkpoint.ipadapter import check_encoder, open_image_encoder, open_ip_adapter

    ad = open_ip_adapter(h94_adapter(tmp_path / adapter, kind, cross, image_dim))
    enc = open_image_encoder(h94_encoder_folder(tmp_path, encoder))
    with pytest.raises(ModelError) as info:
        check_encoder(ad, enc)
    text = str(info.value)
    assert info.value.where == "image_encoder" and "\n" not in text
    for w in words:
        assert w in text, text


def test_the_infotext_names_sd_webui_controlnets_bigg_module(tmp_path):
    from sdrt.pipelines.ipadapter import IPAdapter, infotext

    xl = IPAdapter(h94_adapter(tmp_path / "ip-adapter_sdxl.safetensors", "base", 2048, 1280), image=None)
    vith = IPAdapter(h94_adapter(tmp_path / "ip-adapter_sdxl_vit-h.safetensors", "base", 2048, 1024), image=None)
    assert "Module: ip-adapter_clip_g, Model: ip-adapter_sdxl," in infotext(xl, "sdxl", 0)["ControlNet 0"]
    assert "Module: ip-adapter_clip_sdxl_plus_vith," in infotext(vith, "sdxl", 0)["ControlNet 0"]


def test_the_infotext_names_each_units_module_when_a_bigg_and_a_vit_h_adapter_run_together(tmp_path):
    """Several adapters of both encoders: one entry each, numbered after the ControlNet units, each with its own
    module (ip-adapter_clip_g for the ViT-bigG/14 one, the ViT-H/14 one for Full Face) and window."""
    from sdrt.pipelines.ipadapter import IPAdapter, infotext

    g = IPAdapter(h94_adapter(tmp_path / "ip-adapter_sd15_vit-G.safetensors", "base", 768, 1280), image=None, end=0.5)
    full = IPAdapter(h94_adapter(tmp_path / "ip-adapter-full-face_sd15.safetensors", "full", 768, 1280), image=None,
                     start=0.3)
    got = infotext([g, full], "sd1", 1)
    assert list(got) == ["ControlNet 1", "ControlNet 2"]
    assert got["ControlNet 1"].startswith("Module: ip-adapter_clip_g, Model: ip-adapter_sd15_vit-G, Weight: 1,")
    assert "Guidance Start: 0, Guidance End: 0.5," in got["ControlNet 1"]
    assert got["ControlNet 2"].startswith("Module: ip-adapter_clip_sd15, Model: ip-adapter-full-face_sd15,")
    assert "Guidance Start: 0.3, Guidance End: 1," in got["ControlNet 2"]
