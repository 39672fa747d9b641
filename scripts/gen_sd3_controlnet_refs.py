"""Tiny SD3 ControlNets (diffusers' ``SD3ControlNetModel`` with a text stream) and diffusers' images with them.

Builds the tiny SD3 pipeline of ``gen_flow_refs.py`` again (the same seeds: the text encoders, VAE and transformer
of ``tests/data/pipelines/tiny-sd3``, the transformer checked below against that folder's ONNX part with
onnxruntime), makes tiny random ``SD3ControlNetModel``s of its widths (every weight drawn, the zero-initialised
``pos_embed_input`` and ``controlnet_blocks`` included, so that the residuals show), and runs diffusers 0.42's
``StableDiffusion3ControlNetPipeline``.

diffusers samples the control image's VAE latents from torch's global generator (no ``generator`` is passed to
``vae.encode(...).latent_dist.sample()``); sdrt draws them from the run's generator before the noise, as its Flux
ControlNets do. The cases seed the global generator with the run's seed and pass the noise drawn after those
samples from ``torch.Generator("cpu").manual_seed(seed)``, which is the same stream.

Also writes the tiny weight-free SD3 transformer graphs sdrt cuts these nets' graphs from (what
``sd35_medium_transformer`` and ``sd35_large_transformer`` are at full size: ``scripts/make_shipped_graphs.py``'s
dynamo export at tiny-sd3's widths, 3 blocks, dual attention in block 0 for the first), and checks, with onnxruntime against torch: the ControlNet graphs ``sdrt.checkpoint.sd3controlnet``
derives (their weights bound by name), and tiny-sd3's ONNX transformer with the residual inputs ``residual_graph``
adds, against diffusers' transformer given the same ``block_controlnet_hidden_states``. At full size it checks the
structure: the graph derived from the shipped SD3.5 graphs for nets of their widths has exactly
``SD3ControlNetModel``'s parameters (less the last block's text-stream output weights, which nothing reads).

With the argument ``img2img`` it writes only ``img2img.json`` and ``img2img.npz`` there (the nets read back from
their folders): the nets in img2img and inpainting with tiny-sd3. diffusers has no SD3 ControlNet img2img or
(plain-net) inpaint pipeline, so the reference is diffusers' own ``StableDiffusion3Img2ImgPipeline`` /
``StableDiffusion3InpaintPipeline`` (their timesteps cut by ``get_timesteps`` with the scheduler's begin index,
``prepare_latents``, the inpaint blend) with ``StableDiffusion3ControlNetPipeline``'s ControlNet step on every
transformer call (its ``prepare_image``, the nets with the transformer's ``pos_embed`` copied in, the window as
its ``controlnet_keep`` over ``len(timesteps)`` of the cut schedule, the pooled projections and text it gives the
nets). The control samples are drawn from the run's generator before the pipeline's own draws (init image, noise,
masked image), the order diffusers' Flux ControlNet img2img / inpaint pipelines draw in.

With the argument ``inpaint-net`` it writes only ``inpaint/`` (a tiny random inpainting net of alimama's design:
``SD3ControlNetModel`` with ``extra_conditioning_channels=1``, checked against sdrt's derived graph as the others
are), ``inpaint-net.json`` and ``inpaint-net.npz``: diffusers 0.42's ``StableDiffusion3ControlNetInpaintingPipeline``
with it (txt2img; the picture and its mask are the control input). That pipeline samples the masked picture's
latents from torch's global generator (one per image, before CFG doubles them), seeded and drawn as the txt2img
cases above do.

Writes ``tests/data/pipelines/tiny-sd3-controlnet/``: ``sd35_medium_transformer.onnx`` and
``sd35_large_transformer.onnx`` (weight-free, tiny), ``canny/``, ``canny2/``, ``depth/`` (nets with a text stream;
``depth`` has ``force_zeros_for_pooled_projection: false``), ``blur/`` (Stability's SD3.5 Large design:
image-only blocks, the transformer's pos_embed), each ``diffusion_pytorch_model.safetensors`` in fp16 and
``config.json``; ``refs.json``, ``refs.npz`` and ``checks.json``.

    PYTHONPATH=scripts:scripts/_tvblock:core/src:SHIM /work/refvenv/bin/python scripts/gen_sd3_controlnet_refs.py

(SHIM: a folder holding a link to pluggy, which sdrt imports and the torch venv lacks.)
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_flow_refs as g  # noqa: E402  (blocks torchvision first)
import gen_flux_tools_refs as tools  # noqa: E402
import make_shipped_graphs as msg  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    SD3ControlNetModel,
    SD3Transformer2DModel,
    StableDiffusion3ControlNetInpaintingPipeline,
    StableDiffusion3ControlNetPipeline,
    StableDiffusion3Img2ImgPipeline,
    StableDiffusion3InpaintPipeline,
)
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from sdrt.checkpoint import sd3controlnet as scn  # noqa: E402

SD3 = g.OUT / "tiny-sd3"
OUT = g.OUT / "tiny-sd3-controlnet"
#: tiny-sd3's transformer (gen_flow_refs.build("sd3"))
TINY = dict(sample_size=16, patch_size=2, in_channels=16, attention_head_dim=8, num_attention_heads=4,
            joint_attention_dim=g.T5_WIDTH, caption_projection_dim=32, pooled_projection_dim=48, out_channels=16,
            pos_embed_max_size=16, dual_attention_layers=(0,), qk_norm="rms_norm")
#: the nets: name -> (SD3ControlNetModel overrides, seed)
NETS = {"canny": (dict(num_layers=2), 41), "canny2": (dict(num_layers=2), 42),
        "depth": (dict(num_layers=1, force_zeros_for_pooled_projection=False), 43),
        # Stability's SD3.5 Large design (as diffusers' convert_sd3_controlnet_to_diffusers.py configures it):
        # image-only blocks, the transformer's pos_embed, the prompt's pooled projections
        "blur": (dict(num_layers=2, joint_attention_dim=None, use_pos_embed=False, pos_embed_type=None,
                      pos_embed_max_size=None, force_zeros_for_pooled_projection=False, qk_norm=None,
                      dual_attention_layers=()), 44)}
#: the tiny weight-free base graph each net is cut from: SD3.5 Medium's design (dual attention in block 0) for the
#: nets with a text stream, SD3.5 Large's (no dual attention) for the image-only one
BASE_OF = {"canny": "sd35_medium_transformer", "canny2": "sd35_medium_transformer",
           "depth": "sd35_medium_transformer", "blur": "sd35_large_transformer"}
CASES = [
    dict(name="canny-64x96-cfg5", nets=["canny"], width=96, height=64, steps=3, seed=5, cfg=5.0, batch=1,
         scale=[0.7], start=[0.0], end=[1.0], negative_prompt="blurry, low quality"),
    dict(name="canny-window-batch2", nets=["canny"], width=64, height=64, steps=4, seed=9, cfg=4.0, batch=2,
         scale=[1.0], start=[0.25], end=[0.75], negative_prompt=None),
    dict(name="depth-cfg1", nets=["depth"], width=64, height=96, steps=3, seed=3, cfg=1.0, batch=1,
         scale=[0.8], start=[0.0], end=[1.0], negative_prompt=None),
    dict(name="multi", nets=["canny", "canny2"], width=64, height=64, steps=3, seed=12, cfg=3.5, batch=1,
         scale=[0.6, 0.5], start=[0.0, 0.0], end=[1.0, 0.67], negative_prompt=None),
    dict(name="blur-96x64-cfg4", nets=["blur"], width=96, height=64, steps=3, seed=7, cfg=4.0, batch=1,
         scale=[0.9], start=[0.0], end=[0.8], negative_prompt="blurry, low quality"),
]
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"


# -------------------------------------------------------------------------------- the tiny weight-free base graph
def tiny_inputs(cfg: dict, s: int) -> dict:
    gen = torch.Generator().manual_seed(s)
    return {"hidden_states": torch.randn(2, 16, 4 * s, 4 * s + 2, generator=gen),
            "encoder_hidden_states": torch.randn(2, 9 * s, cfg["joint_attention_dim"], generator=gen),
            "pooled_projections": torch.randn(2, cfg["pooled_projection_dim"], generator=gen),
            "timestep": torch.tensor([981.0, 17.5])}


def base_graph(name: str) -> onnx.ModelProto:
    spec = dataclasses.replace(msg.SPECS[name], inputs=tiny_inputs)
    dual = [0] if name == "sd35_medium_transformer" else []
    cfg = {**spec.config, **TINY, "dual_attention_layers": dual, "num_layers": 3}
    _, prog = msg.export_program(spec, cfg, fake=True)
    proto, _ = msg.weight_free(prog, name, "tests: tiny-sd3's widths")
    return proto


# -------------------------------------------------------------------------------- checks against torch
def transformer_feeds(seed: int, rows: int = 1, text: int = 9) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return {"hidden_states": rng.standard_normal((rows, 16, 8, 12)).astype(f32),
            "encoder_hidden_states": rng.standard_normal((rows, text, g.T5_WIDTH)).astype(f32),
            "pooled_projections": rng.standard_normal((rows, 48)).astype(f32),
            "timestep": np.full((rows,), 600.0, f32)}


def check_transformer(tr: SD3Transformer2DModel) -> None:
    """The rebuilt transformer is tiny-sd3's ONNX one."""
    feeds = transformer_feeds(3)
    sess = ort.InferenceSession(str(SD3 / "transformer" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    with torch.no_grad():
        want = tr(**{k: torch.from_numpy(v) for k, v in feeds.items()}, return_dict=False)[0].numpy()
    err = float(np.abs(got - want).max())
    assert err < 1e-4, f"the rebuilt transformer is not tiny-sd3's (max error {err})"
    print(f"  transformer: rebuilt = tiny-sd3's ONNX part (max error {err:.1e})")


def check_net_graph(base: onnx.ModelProto, net: SD3ControlNetModel, name: str,
                    tr: SD3Transformer2DModel) -> dict:
    """sdrt's derived graph of ``net``'s layout, its weights bound by name, against the torch module (an image-only
    net: given the transformer's pos_embed, as the pipeline gives it, and sdrt's graph the tokens it makes)."""
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    lay = scn.layout({k: tuple(v.shape) for k, v in state.items()}, net.config)
    assert isinstance(lay, scn.SD3NetLayout), lay
    proto = onnx.ModelProto()
    proto.CopyFrom(base)
    scn.controlnet_graph(proto, lay, "tiny base")
    dead = scn.unused_keys(lay)
    sess, wfeeds = msg.ort_session_bound(proto, {k: v for k, v in state.items() if not k.startswith(dead)})
    feeds = transformer_feeds(1, rows=2)
    cond = np.random.default_rng(2).standard_normal((2, lay.in_channels, 8, 12)).astype(np.float32)
    x = {**feeds, "controlnet_cond": cond}
    torch_net = net
    if lay.image_only:
        torch_net = SD3ControlNetModel.from_config(net.config)
        torch_net.load_state_dict(net.state_dict())
        torch_net.pos_embed = torch_net._get_pos_embed_from_transformer(tr)
        del x["encoder_hidden_states"]
        with torch.no_grad():
            x[scn.EMBEDDED] = tr.pos_embed(torch.from_numpy(feeds["hidden_states"])).numpy()
    names = {i.name for i in sess.get_inputs()}
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {**{k: v for k, v in x.items() if k in names},
                                                                          **wfeeds})))
    with torch.no_grad():
        t = {k: torch.from_numpy(v) for k, v in feeds.items()}
        if lay.image_only:
            t["encoder_hidden_states"] = None
        (blocks,) = torch_net(**t, controlnet_cond=torch.from_numpy(cond), conditioning_scale=1.0, return_dict=False)
    worst = max(float(np.abs(got[f"{scn.SAMPLE}{j}"] - r.numpy()).max()) for j, r in enumerate(blocks))
    assert len(got) == len(blocks), sorted(got)
    assert worst < 1e-4, f"{name}: the derived graph differs from SD3ControlNetModel by {worst}"
    print(f"  {name}: derived graph = SD3ControlNetModel ({lay.label}; max error {worst:.1e})")
    return {"layout": lay.label, "max_abs_err": worst}


def check_residual_graph(tr: SD3Transformer2DModel) -> dict:
    """tiny-sd3's ONNX transformer with sdrt's residual inputs against diffusers' transformer."""
    model = onnx.load(str(SD3 / "transformer" / "model.onnx"))
    out = {}
    for samples in (1, 2, 3):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        scn.residual_graph(m, samples, embedded=samples == 2)
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = transformer_feeds(4)
        rng = np.random.default_rng(5)
        res = [rng.standard_normal((1, 24, 32)).astype(np.float32) for _ in range(samples)]
        names = {i.name for i in sess.get_inputs()}
        x = {**feeds, **{f"{scn.SAMPLE}{j}": r for j, r in enumerate(res) if f"{scn.SAMPLE}{j}" in names}}
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, x)))
        got = outs["out_hidden_states"]
        with torch.no_grad():
            t = {k: torch.from_numpy(v) for k, v in feeds.items()}
            want = tr(**t, block_controlnet_hidden_states=[torch.from_numpy(r) for r in res],
                      return_dict=False)[0].numpy()
            plain = tr(**t, return_dict=False)[0].numpy()
            if scn.EMBEDDED in outs:  # the image-only nets' input: the transformer's own patch embedding
                emb = tr.pos_embed(t["hidden_states"]).numpy()
                assert float(np.abs(outs[scn.EMBEDDED] - emb).max()) < 1e-5
        err, moved = float(np.abs(got - want).max()), float(np.abs(plain - want).max())
        assert err < 1e-4 and moved > 1e-2, (samples, err, moved)
        out[str(samples)] = {"max_abs_err": err, "residuals_move_output_by": moved}
        print(f"  residual graph, {samples} samples: = diffusers' transformer (max error {err:.1e}; "
              f"the residuals move it by {moved:.2f})")
    return out


def check_full_size() -> dict:
    """Structure at full size: a net of each shipped graph's width (InstantX's 6 blocks at SD3.5 Medium's widths,
    12 at Large's) gives a derived graph of SD3ControlNetModel's parameters."""
    from sdrt.checkpoint.graphs import shipped_graph

    out = {}
    for base, cfg, blocks in (("sd35_medium_transformer", msg.SD35M, 6), ("sd35_large_transformer", msg.SD35L, 12)):
        kw = {k: v for k, v in cfg.items() if k not in ("num_layers", "dual_attention_layers")}
        dual = tuple(d for d in cfg["dual_attention_layers"] if d < blocks)
        with torch.device("meta"):
            net = SD3ControlNetModel(num_layers=blocks, dual_attention_layers=dual, **kw)
        params = {k: tuple(v.shape) for k, v in net.state_dict().items()}
        lay = scn.layout(params)
        assert isinstance(lay, scn.SD3NetLayout)
        model = onnx.load(str(shipped_graph(base)), load_external_data=False)
        scn.controlnet_graph(model, lay, base)
        inits = {t.name: tuple(t.dims) for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
        want = {k: v for k, v in params.items() if not k.startswith(scn.unused_keys(lay))}
        diff = sorted(set(inits) ^ set(want)) + sorted(k for k in set(inits) & set(want) if inits[k] != want[k])
        assert not diff, (base, diff[:10])
        out[base] = {"layout": lay.label, "params": len(want), "nodes": len(model.graph.node)}
        print(f"  {base}: derived graph's initializers = SD3ControlNetModel's {len(want)} parameters")
    # Stability's SD3.5 Large nets, configured as diffusers' convert_sd3_controlnet_to_diffusers.py does
    with torch.device("meta"):
        net = SD3ControlNetModel(patch_size=2, in_channels=16, num_layers=19, attention_head_dim=64,
                                 num_attention_heads=38, joint_attention_dim=None, caption_projection_dim=2048,
                                 pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=None,
                                 pos_embed_type=None, use_pos_embed=False, force_zeros_for_pooled_projection=False)
    params = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    lay = scn.layout(params)
    assert isinstance(lay, scn.SD3NetLayout) and lay.image_only and not lay.zero_pooled, lay
    model = onnx.load(str(shipped_graph("sd35_large_transformer")), load_external_data=False)
    scn.controlnet_graph(model, lay, "sd35_large_transformer")
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    diff = sorted(set(inits) ^ set(params)) + sorted(k for k in set(inits) & set(params) if inits[k] != params[k])
    assert not diff, ("sd3.5 large controlnet", diff[:10])
    out["sd3.5_large_controlnet"] = {"layout": lay.label, "params": len(params), "nodes": len(model.graph.node)}
    print(f"  sd3.5 Large ControlNet: derived graph's initializers = SD3ControlNetModel's {len(params)} parameters")
    return out


# -------------------------------------------------------------------------------- diffusers' images
def make_net(name: str) -> SD3ControlNetModel:
    over, seed = NETS[name]
    torch.manual_seed(seed)
    net = SD3ControlNetModel(**{**TINY, **over}).eval()
    g.scale_weights(net, seed)
    return net.half().float()  # fp16 values: the files are saved in fp16 (half the size), the pipeline runs fp32


def save_net(net: SD3ControlNetModel, folder: Path) -> None:
    folder.mkdir(parents=True)
    save_file({k: v.half().contiguous() for k, v in net.state_dict().items()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    net.save_config(folder)


def run(base, nets: dict, case: dict, refs: dict) -> None:
    name, h, w, batch = case["name"], case["height"], case["width"], case["batch"]
    used = [nets[n] for n in case["nets"]]
    pipe = StableDiffusion3ControlNetPipeline(**{k: v for k, v in base.components.items()
                                                 if k not in ("image_encoder", "feature_extractor")},
                                              controlnet=used if len(used) > 1 else used[0])
    pipe.set_progress_bar_config(disable=True)
    images = []
    for k in range(len(used)):
        c = tools.edges(h, w) if k == 0 else 255 - tools.picture(h, w)
        refs[f"{name}/control_image_{k}"] = c
        images.append(Image.fromarray(c))
    multi = len(used) > 1
    rows = batch * (2 if case["cfg"] > 1 else 1)
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    for _ in used:  # the control samples the pipeline draws from the global generator, seeded alike below
        torch.randn(rows, 16, h // 8, w // 8, generator=gen)
    latents = torch.randn(batch, 16, h // 8, w // 8, generator=gen)
    torch.manual_seed(case["seed"])
    with torch.no_grad():
        result = pipe(prompt=PROMPT, negative_prompt=case["negative_prompt"], height=h, width=w,
                      num_inference_steps=case["steps"], guidance_scale=case["cfg"], latents=latents,
                      num_images_per_prompt=batch, output_type="np", max_sequence_length=g.MAX_SEQ,
                      control_image=images if multi else images[0],
                      controlnet_conditioning_scale=case["scale"] if multi else case["scale"][0],
                      control_guidance_start=case["start"] if multi else case["start"][0],
                      control_guidance_end=case["end"] if multi else case["end"][0])
    image = (result.images * 255).round().astype(np.uint8)
    refs[f"{name}/image"] = image
    case.update(max_sequence_length=g.MAX_SEQ, prompt=PROMPT)
    print(f"  {name}: {image.shape} std {float(image.std()):.1f}")


def _tokenizers_from_sd3() -> None:
    """The tokenizers as tiny-sd3 saved them (building them again needs open_clip's BPE file and a SentencePiece
    training run); check_transformer and the images show the rest came out the same."""
    from transformers import CLIPTokenizer, T5TokenizerFast

    def clip(folder: Path, pad: str):
        shutil.copytree(SD3 / folder.name, folder, dirs_exist_ok=True)
        return CLIPTokenizer.from_pretrained(folder)

    def t5(folder: Path):
        shutil.copytree(SD3 / folder.name, folder, dirs_exist_ok=True)
        return T5TokenizerFast.from_pretrained(folder)

    g.write_tokenizer, g.write_t5_tokenizer = clip, t5


def main() -> None:
    torch.set_num_threads(2)
    _tokenizers_from_sd3()
    base = g.build("sd3")
    check_transformer(base.transformer)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(SD3 / "scheduler")
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    report: dict = {"full_size": check_full_size()}
    bases = {name: base_graph(name) for name in sorted(set(BASE_OF.values()))}
    for name, proto in bases.items():
        onnx.save(proto, str(OUT / f"{name}.onnx"))
    nets = {name: make_net(name) for name in NETS}
    report["nets"] = {name: check_net_graph(bases[BASE_OF[name]], net, name, base.transformer)
                      for name, net in nets.items()}
    report["residual_graph"] = check_residual_graph(base.transformer)
    for name, net in nets.items():
        save_net(net, OUT / name)
    refs: dict[str, np.ndarray] = {}
    cases = [dict(c) for c in CASES]
    for case in cases:
        run(base, nets, case, refs)
    g.write_refs(OUT, cases, refs, report)


# -------------------------------------------------------------------------------- img2img and inpainting
#: img2img / inpaint cases. A window is judged over the steps the cut schedule runs: canny's 0.3-0.7 over 3 run steps
#: (5 at strength 0.6) is on at run step 1 only, where over the whole schedule (steps 2-4 of 5) it would be on at the
#: first run step; the inpaint windows likewise
IMG2IMG_CASES = [
    dict(name="img2img/canny/96x64/cfg 5/strength 0.6/window 0.3-0.7", mode="img2img", nets=["canny"], width=96,
         height=64, steps=5, strength=0.6, seed=7, cfg=5.0, batch=1, scale=[0.8], start=[0.3], end=[0.7],
         negative_prompt="blurry, low quality"),
    dict(name="img2img/blur/64x64/cfg 4/strength 0.75/batch 2", mode="img2img", nets=["blur"], width=64, height=64,
         steps=4, strength=0.75, seed=8, cfg=4.0, batch=2, scale=[0.9], start=[0.0], end=[1.0], negative_prompt=None),
    dict(name="img2img/depth/64x96/cfg 1/strength 0.7", mode="img2img", nets=["depth"], width=64, height=96,
         steps=4, strength=0.7, seed=3, cfg=1.0, batch=1, scale=[0.8], start=[0.0], end=[1.0], negative_prompt=None),
    dict(name="img2img/two nets/64x64/cfg 3.5/strength 0.8", mode="img2img", nets=["canny", "canny2"], width=64,
         height=64, steps=4, strength=0.8, seed=12, cfg=3.5, batch=1, scale=[0.6, 0.5], start=[0.0, 0.0],
         end=[1.0, 0.67], negative_prompt=None),
    dict(name="inpaint/canny/64x96/cfg 5/strength 0.6/window 0-0.67", mode="inpaint", nets=["canny"], width=64,
         height=96, steps=5, strength=0.6, seed=11, cfg=5.0, batch=1, scale=[0.9], start=[0.0], end=[0.67],
         negative_prompt="blurry, low quality"),
    dict(name="inpaint/canny/64x64/cfg 4/strength 1/window 0.34-1", mode="inpaint", nets=["canny"], width=64,
         height=64, steps=3, strength=1.0, seed=13, cfg=4.0, batch=1, scale=[1.0], start=[0.34], end=[1.0],
         negative_prompt=None),
    dict(name="inpaint/blur/96x64/cfg 4/strength 0.7/batch 2", mode="inpaint", nets=["blur"], width=96, height=64,
         steps=4, strength=0.7, seed=15, cfg=4.0, batch=2, scale=[0.8], start=[0.0], end=[1.0], negative_prompt=None),
]


def controlled(pipe, cn_pipe: StableDiffusion3ControlNetPipeline, controls, case: dict):
    """``pipe``'s transformer with ``StableDiffusion3ControlNetPipeline``'s ControlNet step before every call (the
    loop body of its ``__call__``: ``controlnet_keep`` over the steps ``pipe`` runs, the scale, the nets' pooled
    projections and text), as a bound ``forward`` on the module; the original is given back by ``del``."""
    tr, net = pipe.transformer, cn_pipe.controlnet
    # the first net's config decides for all, as the pipeline's controlnet_config (nets[0].config for several)
    cfg0 = net.nets[0].config if hasattr(net, "nets") else net.config
    multi = len(case["nets"]) > 1
    forward = tr.forward
    calls: list[int] = []

    def step(hidden_states, timestep, encoder_hidden_states, pooled_projections, joint_attention_kwargs=None,
             return_dict=True, **kw):
        i, n = len(calls), pipe._num_timesteps  # len(timesteps) after get_timesteps
        calls.append(i)
        keeps = [1.0 - float(i / n < s or (i + 1) / n > e) for s, e in zip(case["start"], case["end"])]
        if multi:
            cond_scale = [c * k for c, k in zip(case["scale"], keeps)]
        else:
            cond_scale = case["scale"][0] * keeps[0]
        pooled = torch.zeros_like(pooled_projections) if cfg0.force_zeros_for_pooled_projection else pooled_projections
        text = encoder_hidden_states if cfg0.joint_attention_dim is not None else None
        samples = net(hidden_states=hidden_states, timestep=timestep, encoder_hidden_states=text,
                      pooled_projections=pooled, joint_attention_kwargs=joint_attention_kwargs,
                      controlnet_cond=controls if multi else controls[0], conditioning_scale=cond_scale,
                      return_dict=False)[0]
        return forward(hidden_states=hidden_states, timestep=timestep, encoder_hidden_states=encoder_hidden_states,
                       pooled_projections=pooled_projections, block_controlnet_hidden_states=samples,
                       joint_attention_kwargs=joint_attention_kwargs, return_dict=return_dict, **kw)

    tr.forward = step
    return calls


def img2img_image(base, case: dict, refs: dict) -> None:
    """The reference image of an img2img / inpaint case; its pictures and image kept in ``refs``."""
    name, h, w, batch = case["name"], case["height"], case["width"], case["batch"]
    nets = [SD3ControlNetModel.from_pretrained(OUT / n, torch_dtype=torch.float32).eval() for n in case["nets"]]
    parts = {k: v for k, v in base.components.items() if k not in ("image_encoder", "feature_extractor")}
    cn_pipe = StableDiffusion3ControlNetPipeline(**parts, controlnet=nets if len(nets) > 1 else nets[0])
    init = tools.picture(h, w)
    refs[f"{name}/init_image"] = init
    pictures = []
    for k in range(len(nets)):
        c = tools.edges(h, w) if k == 0 else 255 - tools.picture(h, w)
        refs[f"{name}/control_image_{k}"] = c
        pictures.append(Image.fromarray(c))
    guided = case["cfg"] > 1
    cfg0 = nets[0].config
    shift = 0 if cfg0.force_zeros_for_pooled_projection else base.vae.config.shift_factor
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    controls = []
    with torch.no_grad():
        for picture in pictures:  # StableDiffusion3ControlNetPipeline's step 3, its samples from the run's generator
            image = cn_pipe.prepare_image(image=picture, width=w, height=h, batch_size=batch, num_images_per_prompt=batch,
                                          device="cpu", dtype=torch.float32, do_classifier_free_guidance=guided)
            lat = base.vae.encode(image).latent_dist.sample(generator=gen)
            controls.append((lat - shift) * base.vae.config.scaling_factor)
    kw = dict(prompt=PROMPT, negative_prompt=case["negative_prompt"], image=Image.fromarray(init), height=h, width=w,
              strength=case["strength"], num_inference_steps=case["steps"], guidance_scale=case["cfg"],
              num_images_per_prompt=batch, generator=gen, max_sequence_length=g.MAX_SEQ)
    if case["mode"] == "inpaint":
        mask = tools.mask(h, w)
        refs[f"{name}/mask"] = mask
        pipe = StableDiffusion3InpaintPipeline(**parts)
        # SD3's inpaint pipeline decodes without the VAE's shift_factor (diffusers issue #13611), unlike every other
        # SD3 pipeline; its latents are decoded as the others decode (gen_family_variants.py does the same)
        kw.update(mask_image=Image.fromarray(mask), output_type="latent")
    else:
        pipe = StableDiffusion3Img2ImgPipeline(**parts)
        kw.update(output_type="np")
    pipe.set_progress_bar_config(disable=True)
    calls = controlled(pipe, cn_pipe, controls, case)
    try:
        with torch.no_grad():
            images = pipe(**kw).images
            if case["mode"] == "inpaint":
                lat = images / base.vae.config.scaling_factor + base.vae.config.shift_factor
                images = pipe.image_processor.postprocess(base.vae.decode(lat, return_dict=False)[0], output_type="np")
    finally:
        del base.transformer.forward
    image = (images * 255).round().astype(np.uint8)
    refs[f"{name}/image"] = image
    case.update(max_sequence_length=g.MAX_SEQ, prompt=PROMPT, steps_run=len(calls))
    print(f"  {name}: {image.shape} std {float(image.std()):.1f}, {len(calls)} steps run")


def img2img_main() -> None:
    """``img2img.json`` and ``img2img.npz`` in tiny-sd3-controlnet (the other fixtures are left as they are)."""
    import json

    torch.set_num_threads(2)
    _tokenizers_from_sd3()
    base = g.build("sd3")
    check_transformer(base.transformer)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(SD3 / "scheduler")
    refs: dict[str, np.ndarray] = {}
    cases = [dict(c) for c in IMG2IMG_CASES]
    for case in cases:
        img2img_image(base, case, refs)
    (OUT / "img2img.json").write_text(json.dumps(cases, indent=1) + "\n")
    np.savez_compressed(OUT / "img2img.npz", **refs)
    print(f"  img2img.npz: {(OUT / 'img2img.npz').stat().st_size / 1e6:.2f} MB")


# -------------------------------------------------------------------------------- alimama's inpainting design
#: the tiny inpainting net (alimama's design: a text-stream net, 17 control channels), its seed
INPAINT_NET = (dict(num_layers=2, extra_conditioning_channels=1), 45)
INPAINT_CASES = [
    dict(name="inpaint net/96x64/cfg 5", width=96, height=64, steps=3, seed=21, cfg=5.0, batch=1, scale=0.9,
         start=0.0, end=1.0, negative_prompt="blurry, low quality"),
    dict(name="inpaint net/64x64/cfg 4/batch 2/window 0.25-0.75", width=64, height=64, steps=4, seed=22, cfg=4.0,
         batch=2, scale=1.0, start=0.25, end=0.75, negative_prompt=None),
    dict(name="inpaint net/64x96/cfg 1", width=64, height=96, steps=3, seed=23, cfg=1.0, batch=1, scale=0.8,
         start=0.0, end=1.0, negative_prompt=None),
]


def inpaint_net_image(base, net: SD3ControlNetModel, case: dict, refs: dict) -> None:
    name, h, w, batch = case["name"], case["height"], case["width"], case["batch"]
    parts = {k: v for k, v in base.components.items() if k not in ("image_encoder", "feature_extractor")}
    pipe = StableDiffusion3ControlNetInpaintingPipeline(**parts, controlnet=net)
    pipe.set_progress_bar_config(disable=True)
    picture, mask = tools.picture(h, w), tools.mask(h, w)
    refs[f"{name}/control_image_0"], refs[f"{name}/control_mask_0"] = picture, mask
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    torch.randn(batch, 16, h // 8, w // 8, generator=gen)  # the masked picture's samples, from the global generator
    latents = torch.randn(batch, 16, h // 8, w // 8, generator=gen)
    torch.manual_seed(case["seed"])
    with torch.no_grad():
        result = pipe(prompt=PROMPT, negative_prompt=case["negative_prompt"], height=h, width=w,
                      num_inference_steps=case["steps"], guidance_scale=case["cfg"], latents=latents,
                      num_images_per_prompt=batch, output_type="np", max_sequence_length=g.MAX_SEQ,
                      control_image=Image.fromarray(picture), control_mask=Image.fromarray(mask),
                      controlnet_conditioning_scale=case["scale"], control_guidance_start=case["start"],
                      control_guidance_end=case["end"])
    image = (result.images * 255).round().astype(np.uint8)
    refs[f"{name}/image"] = image
    case.update(max_sequence_length=g.MAX_SEQ, prompt=PROMPT)
    print(f"  {name}: {image.shape} std {float(image.std()):.1f}")


def inpaint_net_main() -> None:
    """``inpaint/``, ``inpaint-net.json`` and ``inpaint-net.npz`` in tiny-sd3-controlnet (the rest left as it is)."""
    import json

    torch.set_num_threads(2)
    _tokenizers_from_sd3()
    base = g.build("sd3")
    check_transformer(base.transformer)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(SD3 / "scheduler")
    over, seed = INPAINT_NET
    torch.manual_seed(seed)
    net = SD3ControlNetModel(**{**TINY, **over}).eval()
    g.scale_weights(net, seed)
    net = net.half().float()
    graph = onnx.load(str(OUT / "sd35_medium_transformer.onnx"), load_external_data=False)
    report = {"net": check_net_graph(graph, net, "inpaint", base.transformer)}
    if (OUT / "inpaint").exists():
        shutil.rmtree(OUT / "inpaint")
    save_net(net, OUT / "inpaint")
    refs: dict[str, np.ndarray] = {}
    cases = [dict(c) for c in INPAINT_CASES]
    for case in cases:
        inpaint_net_image(base, net, case, refs)
    (OUT / "inpaint-net.json").write_text(json.dumps({"cases": cases, "checks": report}, indent=1) + "\n")
    np.savez_compressed(OUT / "inpaint-net.npz", **refs)
    print(f"  inpaint-net.npz: {(OUT / 'inpaint-net.npz').stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    mains = {"img2img": img2img_main, "inpaint-net": inpaint_net_main}
    mains[sys.argv[1]]() if sys.argv[1:2] and sys.argv[1] in mains else main()
