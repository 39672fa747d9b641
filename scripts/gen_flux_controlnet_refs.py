"""Tiny Flux.1 ControlNets (diffusers' ``FluxControlNetModel`` layout) and diffusers' images with them.

Builds the tiny Flux dev pipeline of ``gen_flow_refs.py`` again (the same seeds: the text encoders, VAE and
transformer of ``tests/data/pipelines/tiny-flux-dev``, checked below against that folder's ONNX parts with
onnxruntime), makes tiny random ``FluxControlNetModel``s of its widths (every weight drawn, the zero-initialised
linears included, so that the residuals show), and runs diffusers 0.42's ``FluxControlNetPipeline`` with
``torch.Generator("cpu").manual_seed(seed)``.

Also writes the tiny weight-free Flux dev transformer graph sdrt cuts these nets' graphs from (what
``flux_dev_transformer`` is at full size: ``scripts/make_shipped_graphs.py``'s dynamo export at the tiny widths),
and checks, with onnxruntime against torch: the ControlNet graphs ``sdrt.checkpoint.fluxcontrolnet`` derives (their
weights bound by name from the ``.safetensors``), and tiny-flux-dev's ONNX transformer with the residual inputs
``residual_graph`` adds, against diffusers' transformer given the same residuals. At full size it checks the
structure: the graph derived from the shipped ``flux_dev_transformer`` for InstantX's Canny (5 + 10 blocks) and
Shakker-Labs' Union Pro (5 + 10 blocks, 10 modes) has exactly ``FluxControlNetModel``'s parameters.

Writes ``tests/data/pipelines/tiny-flux-controlnet/``: ``flux_dev_transformer.onnx`` (weight-free, tiny),
``canny/``, ``canny2/``, ``union/`` (``diffusion_pytorch_model.safetensors`` and ``config.json`` each),
``refs.json`` (the cases) and ``refs.npz`` (the control images and each case's image).

    PYTHONPATH=scripts:scripts/_tvblock:core/src:SHIM /work/refvenv/bin/python scripts/gen_flux_controlnet_refs.py

(SHIM: a folder holding a link to pluggy, which sdrt imports and the torch venv lacks.)

With the argument ``img2img`` it writes only ``img2img.json`` and ``img2img.npz`` there: diffusers 0.42's
``FluxControlNetImg2ImgPipeline`` and ``FluxControlNetInpaintPipeline`` (a plain Flux.1 dev model, not Fill) on
tiny-flux-dev's parts with the nets as the fixtures hold them (``canny/``, ``union/`` and
``tiny-flux-xlabs-controlnet/xlabs-diffusers/``, read back with ``from_pretrained``): strengths below 1 (the
schedule cut), windows that are not 0..1 (judged over the steps the cut schedule runs), a mask with grays around
0.5, a union mode, batch 2, XLabs' design; the init picture, the mask and the control pictures are kept with the
images.
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
    FluxControlNetImg2ImgPipeline,
    FluxControlNetInpaintPipeline,
    FluxControlNetModel,
    FluxControlNetPipeline,
    FluxTransformer2DModel,
)
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from sdrt.checkpoint import fluxcontrolnet as fcn  # noqa: E402

DEV = g.OUT / "tiny-flux-dev"
OUT = g.OUT / "tiny-flux-controlnet"
TINY = dict(attention_head_dim=16, num_attention_heads=2, joint_attention_dim=g.T5_WIDTH, pooled_projection_dim=32,
            axes_dims_rope=[4, 6, 6], num_layers=1, num_single_layers=2)
#: the nets: name -> (FluxControlNetModel overrides of the tiny widths, seed)
NETS = {"canny": (dict(num_layers=1, num_single_layers=1), 31),
        "canny2": (dict(num_layers=1, num_single_layers=1), 32),
        "union": (dict(num_layers=2, num_single_layers=0, num_mode=4), 33)}
CASES = [
    dict(name="canny-64x96", nets=["canny"], width=96, height=64, steps=3, seed=5, guidance=3.5, batch=1,
         scale=[0.7], start=[0.0], end=[1.0], mode=None),
    dict(name="canny-window-batch2", nets=["canny"], width=64, height=64, steps=4, seed=9, guidance=3.5, batch=2,
         scale=[1.0], start=[0.25], end=[0.75], mode=None),
    dict(name="union-mode2", nets=["union"], width=64, height=96, steps=3, seed=3, guidance=5.0, batch=1,
         scale=[0.8], start=[0.0], end=[1.0], mode=2),
    dict(name="multi", nets=["canny", "canny2"], width=64, height=64, steps=3, seed=12, guidance=3.5, batch=1,
         scale=[0.6, 0.5], start=[0.0, 0.0], end=[1.0, 0.67], mode=None),
    dict(name="canny-true-cfg", nets=["canny"], width=64, height=64, steps=2, seed=4, guidance=3.5, batch=1,
         scale=[0.9], start=[0.0], end=[0.5], mode=None, negative_prompt="blurry, dark", true_cfg=2.0),
]
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"


# -------------------------------------------------------------------------------- the tiny weight-free base graph
def tiny_inputs(cfg: dict, s: int) -> dict:
    x = msg.flux_inputs(cfg, s)
    gen = torch.Generator().manual_seed(s)
    x["encoder_hidden_states"] = torch.randn(*x["encoder_hidden_states"].shape[:2], cfg["joint_attention_dim"],
                                             generator=gen)
    x["pooled_projections"] = torch.randn(x["pooled_projections"].shape[0], cfg["pooled_projection_dim"],
                                          generator=gen)
    return x


def base_graph() -> onnx.ModelProto:
    spec = dataclasses.replace(msg.SPECS["flux_dev_transformer"], inputs=tiny_inputs)
    cfg = {**spec.config, **TINY, "num_layers": 2}  # at least as many blocks as the nets have
    _, prog = msg.export_program(spec, cfg, fake=True)
    proto, _ = msg.weight_free(prog, "flux_dev_transformer", "tests: tiny-flux-dev's widths")
    return proto


# -------------------------------------------------------------------------------- checks against torch
def check_dev_transformer(tr: FluxTransformer2DModel) -> None:
    """The rebuilt transformer is tiny-flux-dev's ONNX one."""
    rng = np.random.default_rng(3)
    f32 = np.float32
    feeds = {"hidden_states": rng.standard_normal((1, 24, 64)).astype(f32),
             "encoder_hidden_states": rng.standard_normal((1, 9, g.T5_WIDTH)).astype(f32),
             "pooled_projections": rng.standard_normal((1, 32)).astype(f32), "timestep": np.array([0.6], f32),
             "txt_ids": np.zeros((9, 3), f32), "img_ids": ids(4, 6), "guidance": np.array([3.5], f32)}
    sess = ort.InferenceSession(str(DEV / "transformer" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    with torch.no_grad():
        want = tr(**{k: torch.from_numpy(v) for k, v in feeds.items()}, return_dict=False)[0].numpy()
    err = float(np.abs(got - want).max())
    assert err < 1e-4, f"the rebuilt transformer is not tiny-flux-dev's (max error {err})"
    print(f"  transformer: rebuilt = tiny-flux-dev's ONNX part (max error {err:.1e})")


def ids(h: int, w: int) -> np.ndarray:
    grid = np.zeros((h, w, 3), np.float32)
    grid[..., 1] = np.arange(h)[:, None]
    grid[..., 2] = np.arange(w)[None, :]
    return grid.reshape(-1, 3)


def net_feeds(net: FluxControlNetModel, text: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    feeds = {"hidden_states": rng.standard_normal((2, 24, 64)).astype(f32),
             "controlnet_cond": rng.standard_normal((2, 24, 64)).astype(f32),
             "encoder_hidden_states": rng.standard_normal((2, text, g.T5_WIDTH)).astype(f32),
             "pooled_projections": rng.standard_normal((2, 32)).astype(f32), "timestep": np.array([0.6, 0.6], f32),
             "txt_ids": np.zeros((text, 3), f32), "img_ids": ids(4, 6), "guidance": np.array([3.5, 3.5], f32)}
    if net.config.num_mode:
        feeds["controlnet_mode"] = np.array([[2], [1]], np.int64)
    return feeds


def check_net_graph(base: onnx.ModelProto, net: FluxControlNetModel, name: str) -> dict:
    """sdrt's derived graph of ``net``'s layout, its weights bound by name, against the torch module."""
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    lay = fcn.layout({k: tuple(v.shape) for k, v in state.items()})
    assert isinstance(lay, fcn.FluxNetLayout), lay
    proto = onnx.ModelProto()
    proto.CopyFrom(base)
    fcn.controlnet_graph(proto, lay, "tiny base")
    sess, wfeeds = msg.ort_session_bound(proto, state)
    feeds = net_feeds(net, 7, 1)
    x = dict(feeds)
    if lay.modes:  # the pipeline feeds the text ids one longer (the mode token's)
        x["txt_ids"] = np.zeros((8, 3), np.float32)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {**x, **wfeeds})))
    with torch.no_grad():
        blocks, singles = net(**{k: torch.from_numpy(v) for k, v in feeds.items()}, conditioning_scale=1.0,
                              return_dict=False)
    worst = 0.0
    for j, r in enumerate(blocks or []):
        worst = max(worst, float(np.abs(got[f"{fcn.DOUBLE_OUT}{j}"] - r.numpy()).max()))
    for j, r in enumerate(singles or []):
        worst = max(worst, float(np.abs(got[f"{fcn.SINGLE_OUT}{j}"][:, -24:] - r.numpy()).max()))
    assert len(got) == len(blocks or []) + len(singles or []), sorted(got)
    assert worst < 1e-4, f"{name}: the derived graph differs from FluxControlNetModel by {worst}"
    print(f"  {name}: derived graph = FluxControlNetModel ({lay.label}; max error {worst:.1e})")
    return {"layout": lay.label, "max_abs_err": worst}


def check_residual_graph(tr: FluxTransformer2DModel) -> dict:
    """tiny-flux-dev's ONNX transformer with sdrt's residual inputs against diffusers' transformer."""
    model = onnx.load(str(DEV / "transformer" / "model.onnx"))
    out = {}
    for n_double, n_single in ((1, 1), (2, 0), (1, 2)):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        fcn.residual_graph(m, n_double, n_single)
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(4)
        f32 = np.float32
        text = 9
        feeds = {"hidden_states": rng.standard_normal((1, 24, 64)).astype(f32),
                 "encoder_hidden_states": rng.standard_normal((1, text, g.T5_WIDTH)).astype(f32),
                 "pooled_projections": rng.standard_normal((1, 32)).astype(f32), "timestep": np.array([0.6], f32),
                 "txt_ids": np.zeros((text, 3), f32), "img_ids": ids(4, 6), "guidance": np.array([3.5], f32)}
        blocks = [rng.standard_normal((1, 24, 32)).astype(f32) for _ in range(n_double)]
        singles = [rng.standard_normal((1, 24, 32)).astype(f32) for _ in range(n_single)]
        x = dict(feeds)
        names = {i.name for i in sess.get_inputs()}
        for j, b in enumerate(blocks):
            if f"{fcn.DOUBLE_IN}{j}" in names:
                x[f"{fcn.DOUBLE_IN}{j}"] = b
        for j, s in enumerate(singles):
            if f"{fcn.SINGLE_IN}{j}" in names:
                x[f"{fcn.SINGLE_IN}{j}"] = np.concatenate([np.zeros((1, text, 32), f32), s], axis=1)
        got = sess.run(None, x)[0]
        with torch.no_grad():
            want = tr(**{k: torch.from_numpy(v) for k, v in feeds.items()},
                      controlnet_block_samples=[torch.from_numpy(b) for b in blocks] or None,
                      controlnet_single_block_samples=[torch.from_numpy(s) for s in singles] or None,
                      return_dict=False)[0].numpy()
            plain = tr(**{k: torch.from_numpy(v) for k, v in feeds.items()}, return_dict=False)[0].numpy()
        err = float(np.abs(got - want).max())
        moved = float(np.abs(plain - want).max())
        assert err < 1e-4 and moved > 1e-2, (n_double, n_single, err, moved)
        out[f"{n_double}+{n_single}"] = {"max_abs_err": err, "residuals_move_output_by": moved}
        print(f"  residual graph {n_double}+{n_single}: = diffusers' transformer (max error {err:.1e}; "
              f"the residuals move it by {moved:.2f})")
    return out


def check_full_size() -> dict:
    """Structure at full size: the graph derived from the shipped dev graph has FluxControlNetModel's parameters."""
    from sdrt.checkpoint.graphs import shipped_graph

    raw = shipped_graph("flux_dev_transformer").read_bytes()
    out = {}
    for name, cfg in (("InstantX/FLUX.1-dev-Controlnet-Canny", dict(num_layers=5, num_single_layers=10)),
                      ("Shakker-Labs/FLUX.1-dev-ControlNet-Union-Pro", dict(num_layers=5, num_single_layers=10,
                                                                            num_mode=10))):
        with torch.device("meta"):
            net = FluxControlNetModel(guidance_embeds=True, **cfg)
        params = {k: tuple(v.shape) for k, v in net.state_dict().items()}
        lay = fcn.layout(params)
        assert isinstance(lay, fcn.FluxNetLayout)
        model = onnx.load_from_string(raw)
        fcn.controlnet_graph(model, lay, "flux_dev_transformer")
        inits = {t.name: tuple(t.dims) for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
        diff = sorted(set(inits) ^ set(params)) + sorted(k for k in set(inits) & set(params) if inits[k] != params[k])
        assert not diff, (name, diff[:10])
        out[name] = {"layout": lay.label, "params": len(params), "nodes": len(model.graph.node)}
        print(f"  {name}: derived graph's initializers = FluxControlNetModel's {len(params)} parameters")
    return out


# -------------------------------------------------------------------------------- diffusers' images
def make_net(name: str) -> FluxControlNetModel:
    over, seed = NETS[name]
    torch.manual_seed(seed)
    cfg = {**TINY, **over}
    net = FluxControlNetModel(patch_size=1, in_channels=64, guidance_embeds=True, **cfg).eval()
    g.scale_weights(net, seed)
    return net


def save_net(net: FluxControlNetModel, folder: Path) -> None:
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(folder / "diffusion_pytorch_model.safetensors"))
    net.save_config(folder)


def pipeline(base, used: list) -> FluxControlNetPipeline:
    """``FluxControlNetPipeline`` on tiny-flux-dev's parts with the nets ``used`` (one, or a list)."""
    pipe = FluxControlNetPipeline(scheduler=base.scheduler, vae=base.vae, text_encoder=base.text_encoder,
                                  tokenizer=base.tokenizer, text_encoder_2=base.text_encoder_2,
                                  tokenizer_2=base.tokenizer_2, transformer=base.transformer,
                                  controlnet=used if len(used) > 1 else used[0])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def control_images(case: dict, count: int, refs: dict) -> list:
    """The case's control pictures (edges, then an inverted picture), kept in ``refs``."""
    h, w = case["height"], case["width"]
    images = []
    for k in range(count):
        c = tools.edges(h, w) if k == 0 else 255 - tools.picture(h, w)
        refs[f"{case['name']}/control_image_{k}"] = c
        images.append(Image.fromarray(c))
    return images


def generate(pipe: FluxControlNetPipeline, case: dict, images: list, scale: list | None = None) -> np.ndarray:
    """diffusers' images (float, NHWC) for ``case`` with these control images, at the case's scales or ``scale``."""
    def each(values: list) -> object:
        return values if len(images) > 1 else values[0]

    with torch.no_grad():
        return pipe(prompt=PROMPT, height=case["height"], width=case["width"], num_inference_steps=case["steps"],
                    guidance_scale=case["guidance"], generator=torch.Generator("cpu").manual_seed(case["seed"]),
                    num_images_per_prompt=case["batch"], output_type="np", max_sequence_length=g.MAX_SEQ,
                    control_image=each(images), controlnet_conditioning_scale=each(scale or case["scale"]),
                    control_guidance_start=each(case["start"]), control_guidance_end=each(case["end"]),
                    control_mode=case["mode"], negative_prompt=case.get("negative_prompt"),
                    true_cfg_scale=case.get("true_cfg", 1.0)).images


def run(base, nets: dict, case: dict, refs: dict) -> None:
    name = case["name"]
    used = [nets[n] for n in case["nets"]]
    image = (generate(pipeline(base, used), case, control_images(case, len(used), refs)) * 255).round().astype(np.uint8)
    refs[f"{name}/image"] = image
    case.update(max_sequence_length=g.MAX_SEQ, prompt=PROMPT)
    print(f"  {name}: {image.shape} std {float(image.std()):.1f}")


# -------------------------------------------------------------------------------- img2img and inpainting
XLABS = g.OUT / "tiny-flux-xlabs-controlnet" / "xlabs-diffusers"
#: the nets' folders, read back as the fixtures hold them (xlabs-canny: XLabs' file in diffusers' names)
NET_FOLDERS = {"canny": OUT / "canny", "union": OUT / "union", "xlabs-canny": XLABS}
#: img2img / inpaint cases. A window is judged over the steps the cut schedule runs: canny's 0.3-0.7 over 3 run steps
#: (5 at strength 0.6) is on at run step 1 only, where over the whole schedule (steps 2-4 of 5) it would be on at the
#: first run step; xlabs' 0-0.5 over 2 run steps is on at the first only
IMG2IMG_CASES = [
    dict(name="img2img/canny/96x64/strength 0.6/window 0.3-0.7", mode="img2img", nets=["canny"], width=96, height=64,
         steps=5, strength=0.6, seed=7, guidance=3.5, batch=1, scale=[0.8], start=[0.3], end=[0.7], union=None),
    dict(name="img2img/union mode 1/64x64/strength 0.75/batch 2", mode="img2img", nets=["union"], width=64,
         height=64, steps=4, strength=0.75, seed=8, guidance=4.0, batch=2, scale=[0.9], start=[0.0], end=[1.0],
         union=1),
    dict(name="img2img/xlabs/64x64/strength 0.5/window 0-0.5", mode="img2img", nets=["xlabs-canny"], width=64,
         height=64, steps=4, strength=0.5, seed=10, guidance=3.5, batch=1, scale=[0.7], start=[0.0], end=[0.5],
         union=None),
    dict(name="inpaint/canny/64x96/strength 0.6/window 0-0.67", mode="inpaint", nets=["canny"], width=64, height=96,
         steps=5, strength=0.6, seed=11, guidance=3.5, batch=1, scale=[0.9], start=[0.0], end=[0.67], union=None),
    dict(name="inpaint/canny/64x64/strength 1/window 0.34-1", mode="inpaint", nets=["canny"], width=64, height=64,
         steps=3, strength=1.0, seed=13, guidance=3.5, batch=1, scale=[1.0], start=[0.34], end=[1.0], union=None),
    dict(name="inpaint/union mode 2/64x64/strength 0.7/batch 2", mode="inpaint", nets=["union"], width=64, height=64,
         steps=4, strength=0.7, seed=14, guidance=3.5, batch=2, scale=[0.8], start=[0.25], end=[1.0], union=2),
    dict(name="inpaint/xlabs/96x64/strength 0.7", mode="inpaint", nets=["xlabs-canny"], width=96, height=64,
         steps=4, strength=0.7, seed=15, guidance=3.5, batch=1, scale=[0.8], start=[0.0], end=[1.0], union=None),
]


def img2img_image(base, case: dict, refs: dict) -> None:
    """diffusers' image for an img2img / inpaint case; its pictures and image kept in ``refs``."""
    name, h, w = case["name"], case["height"], case["width"]
    net = FluxControlNetModel.from_pretrained(NET_FOLDERS[case["nets"][0]], torch_dtype=torch.float32).eval()
    parts = dict(scheduler=base.scheduler, vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer,
                 text_encoder_2=base.text_encoder_2, tokenizer_2=base.tokenizer_2, transformer=base.transformer,
                 controlnet=net)
    init = tools.picture(h, w)
    control = tools.edges(h, w) if case["union"] is None else np.ascontiguousarray(255 - tools.picture(h, w)[::-1])
    refs[f"{name}/init_image"] = init
    refs[f"{name}/control_image_0"] = control
    kw = dict(prompt=PROMPT, image=Image.fromarray(init), control_image=Image.fromarray(control), height=h, width=w,
              strength=case["strength"], num_inference_steps=case["steps"], guidance_scale=case["guidance"],
              control_guidance_start=case["start"][0], control_guidance_end=case["end"][0],
              controlnet_conditioning_scale=case["scale"][0], num_images_per_prompt=case["batch"],
              generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
              max_sequence_length=g.MAX_SEQ)
    if case["union"] is not None:  # one per image: the pipeline reshapes it to [-1, 1], which batch 2 must fill
        kw["control_mode"] = [case["union"]] * case["batch"]
    if case["mode"] == "inpaint":
        mask = tools.mask(h, w)
        refs[f"{name}/mask"] = mask
        pipe = FluxControlNetInpaintPipeline(**parts)
        kw["mask_image"] = Image.fromarray(mask)
    else:
        pipe = FluxControlNetImg2ImgPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        image = (pipe(**kw).images * 255).round().astype(np.uint8)
    refs[f"{name}/image"] = image
    case.update(max_sequence_length=g.MAX_SEQ, prompt=PROMPT)
    print(f"  {name}: {image.shape} std {float(image.std()):.1f}")


def img2img_main() -> None:
    """``img2img.json`` and ``img2img.npz`` in tiny-flux-controlnet (the other fixtures are left as they are)."""
    import json

    torch.set_num_threads(2)
    tools._tokenizers_from_dev()
    base = g.build("flux-dev")
    tools.check_shared_parts(base)
    check_dev_transformer(base.transformer)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(DEV / "scheduler")
    refs: dict[str, np.ndarray] = {}
    cases = [dict(c) for c in IMG2IMG_CASES]
    for case in cases:
        img2img_image(base, case, refs)
    (OUT / "img2img.json").write_text(json.dumps(cases, indent=1) + "\n")
    np.savez_compressed(OUT / "img2img.npz", **refs)
    print(f"  img2img.npz: {(OUT / 'img2img.npz').stat().st_size / 1e6:.2f} MB")


def main() -> None:
    torch.set_num_threads(2)
    tools._tokenizers_from_dev()
    base = g.build("flux-dev")
    tools.check_shared_parts(base)
    check_dev_transformer(base.transformer)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(DEV / "scheduler")
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    report: dict = {"full_size": check_full_size()}
    tiny = base_graph()
    onnx.save(tiny, str(OUT / "flux_dev_transformer.onnx"))
    nets = {name: make_net(name) for name in NETS}
    report["nets"] = {name: check_net_graph(tiny, net, name) for name, net in nets.items()}
    report["residual_graph"] = check_residual_graph(base.transformer)
    for name, net in nets.items():
        save_net(net, OUT / name)
    refs: dict[str, np.ndarray] = {}
    cases = [dict(c) for c in CASES]
    for case in cases:
        run(base, nets, case, refs)
    g.write_refs(OUT, cases, refs, report)


if __name__ == "__main__":
    img2img_main() if sys.argv[1:] == ["img2img"] else main()
