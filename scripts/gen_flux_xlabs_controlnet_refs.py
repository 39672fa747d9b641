"""Tiny XLabs-style Flux.1 ControlNets (XLabs-AI's ``flux-*-controlnet`` design) and diffusers' images with them.

diffusers 0.42 runs XLabs' design as ``FluxControlNetModel(conditioning_embedding_channels=16, patch_size=2,
num_single_layers=0)``: the control picture in pixels through ``input_hint_block``, the transformer taking the
residuals in turn (``controlnet_blocks_repeat``). This builds tiny random ones of tiny-flux-dev's widths (2 double
blocks, as XLabs' v1/v2 nets; every weight drawn, the zero convolution and linears too), rounds their weights to
fp16 (the files are fp16, so diffusers runs the very values sdrt reads), saves each as a user downloads it:
XLabs' own key names (Black Forest Labs' ``double_blocks.N`` with fused ``qkv``, ``input_hint_block.{0,2,..,14}``,
``pos_embed_input``: ``xlabs-*.safetensors``), and the first one also in diffusers' names
(``xlabs-diffusers/diffusion_pytorch_model.safetensors``), and runs ``FluxControlNetPipeline`` on tiny-flux-dev's
parts (rebuilt by ``gen_flux_controlnet_refs``/``gen_flow_refs`` with their seeds and checked against the ONNX
parts) with ``torch.Generator("cpu").manual_seed(seed)``.

Checks, with onnxruntime against torch: the graph ``sdrt.checkpoint.fluxcontrolnet`` cuts from the tiny
weight-free dev graph for this layout (hint convolutions, patch embedding, blocks), weights bound by name; the
repeat rule on a weight-free transformer graph of 3 double blocks (tiny-flux-dev has one, where the rule cannot
show) bound to a random ``FluxTransformer2DModel`` run with ``controlnet_blocks_repeat=True``; and at full size the
graph derived from the shipped ``flux_dev_transformer`` for an XLabs v1/v2 net holds ``FluxControlNetModel``'s
parameters (less the last block's text-stream weights, which nothing reads).

Writes ``tests/data/pipelines/tiny-flux-xlabs-controlnet/`` (``refs.json``, ``refs.npz``, ``checks.json`` and the
nets); the nets' graphs are cut from ``tiny-flux-controlnet/flux_dev_transformer.onnx``.

    PYTHONPATH=scripts:scripts/_tvblock:core/src:SHIM /work/refvenv/bin/python scripts/gen_flux_xlabs_controlnet_refs.py

(SHIM: a folder holding a link to pluggy, which sdrt imports and the torch venv lacks.)
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_flow_refs as g  # noqa: E402  (blocks torchvision first)
import gen_flux_controlnet_refs as fc  # noqa: E402
import gen_flux_tools_refs as tools  # noqa: E402
import make_shipped_graphs as msg  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from diffusers import FluxControlNetModel, FluxTransformer2DModel  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from sdrt.checkpoint import fluxcontrolnet as fcn  # noqa: E402

OUT = g.OUT / "tiny-flux-xlabs-controlnet"
BASE = g.OUT / "tiny-flux-controlnet" / "flux_dev_transformer.onnx"
XLABS = dict(patch_size=2, in_channels=64, guidance_embeds=True, conditioning_embedding_channels=16,
             num_single_layers=0)
#: the nets: name -> (double blocks, seed)
NETS = {"xlabs-canny": (2, 41), "xlabs-depth": (2, 42)}
#: the hint convolutions' weights times this: at scale_weights' 1/sqrt(fan_in) the signal shrinks through each SiLU,
#: and after eight of them the embedded picture was 2-3% of the embedded latents (a net fed a blank picture, or its
#: patches in the wrong order, gave images within 1-4 levels of diffusers'); at 1.7 it is 0.6-2.5x
HINT_GAIN = 1.7
CASES = [
    dict(name="xlabs-96x64", nets=["xlabs-canny"], width=96, height=64, steps=3, seed=5, guidance=3.5, batch=1,
         scale=[0.7], start=[0.0], end=[1.0], mode=None),
    dict(name="xlabs-window-batch2", nets=["xlabs-canny"], width=64, height=64, steps=4, seed=9, guidance=4.0,
         batch=2, scale=[1.0], start=[0.25], end=[0.75], mode=None),
    dict(name="xlabs-multi", nets=["xlabs-canny", "xlabs-depth"], width=64, height=96, steps=3, seed=12,
         guidance=3.5, batch=1, scale=[0.6, 0.5], start=[0.0, 0.0], end=[1.0, 0.67], mode=None),
    dict(name="xlabs-true-cfg", nets=["xlabs-canny"], width=64, height=64, steps=2, seed=4, guidance=3.5, batch=1,
         scale=[0.9], start=[0.0], end=[0.5], mode=None, negative_prompt="blurry, dark", true_cfg=2.0),
]


def make_net(name: str) -> FluxControlNetModel:
    double, seed = NETS[name]
    torch.manual_seed(seed)
    net = FluxControlNetModel(**{**fc.TINY, **XLABS, "num_layers": double}).eval()
    g.scale_weights(net, seed)
    with torch.no_grad():
        for p in net.input_hint_block.parameters():
            if p.ndim == 4:
                p.mul_(HINT_GAIN)
    with torch.no_grad():  # the file's precision: diffusers runs the values sdrt reads
        for p in net.parameters():
            p.copy_(p.half().float())
    return net


def to_xlabs(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' FluxControlNetModel names -> XLabs' (Black Forest Labs' names for the Flux parts)."""
    out: dict[str, torch.Tensor] = {}
    top = {"x_embedder": "img_in", "context_embedder": "txt_in", "controlnet_x_embedder": "pos_embed_input",
           "input_hint_block.conv_in": "input_hint_block.0", "input_hint_block.conv_out": "input_hint_block.14",
           **{f"input_hint_block.blocks.{i}": f"input_hint_block.{2 * i + 2}" for i in range(6)}}
    for a, b in (("timestep_embedder", "time_in"), ("text_embedder", "vector_in"), ("guidance_embedder", "guidance_in")):
        top[f"time_text_embed.{a}.linear_1"] = f"{b}.in_layer"
        top[f"time_text_embed.{a}.linear_2"] = f"{b}.out_layer"
    block = {"norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin", "attn.to_out.0": "img_attn.proj",
             "attn.to_add_out": "txt_attn.proj", "ff.net.0.proj": "img_mlp.0", "ff.net.2": "img_mlp.2",
             "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2"}
    norms = {"attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
             "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
             "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale"}
    done = set()
    for k, v in state.items():
        mod, t = k.rsplit(".", 1)
        if mod in top:
            out[f"{top[mod]}.{t}"] = v
        elif k.startswith("controlnet_blocks."):
            out[k] = v
        elif k.startswith("transformer_blocks."):
            i, rest = k.split(".", 2)[1], k.split(".", 2)[2]
            p = f"double_blocks.{i}."
            rmod = rest.rsplit(".", 1)[0]
            if rest in norms:
                out[p + norms[rest]] = v
            elif rmod in block:
                out[f"{p}{block[rmod]}.{t}"] = v
            elif rmod in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                          "attn.add_v_proj"):
                img = rmod.startswith("attn.to_")
                names = ("to_q", "to_k", "to_v") if img else ("add_q_proj", "add_k_proj", "add_v_proj")
                key = f"{p}{'img' if img else 'txt'}_attn.qkv.{t}"
                if key not in done:
                    out[key] = torch.cat([state[f"transformer_blocks.{i}.attn.{n}.{t}"] for n in names])
                    done.add(key)
            else:
                raise KeyError(k)
        else:
            raise KeyError(k)
    return out


def save(net: FluxControlNetModel, name: str) -> dict:
    state = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    xl = {k: v.half() for k, v in to_xlabs(state).items()}
    save_file(xl, str(OUT / f"{name}.safetensors"))
    info = {"xlabs_keys": len(xl), "diffusers_keys": len(state)}
    if name == "xlabs-canny":
        folder = OUT / "xlabs-diffusers"
        folder.mkdir()
        save_file({k: v.half() for k, v in state.items()}, str(folder / "diffusion_pytorch_model.safetensors"))
        net.save_config(folder)
    return info


# -------------------------------------------------------------------------------- checks against torch
def check_net_graph(base: onnx.ModelProto, net: FluxControlNetModel, name: str) -> dict:
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    lay = fcn.layout({k: tuple(v.shape) for k, v in state.items()})
    assert isinstance(lay, fcn.FluxNetLayout) and lay.hint, lay
    proto = onnx.ModelProto()
    proto.CopyFrom(base)
    fcn.controlnet_graph(proto, lay, "tiny base")
    dead = fcn.unused_keys(lay)
    sess, wfeeds = msg.ort_session_bound(proto, {k: v for k, v in state.items() if not k.startswith(dead)})
    feeds = fc.net_feeds(net, 7, 1)
    rng = np.random.default_rng(2)
    feeds["controlnet_cond"] = rng.uniform(-1, 1, (2, 3, 64, 96)).astype(np.float32)  # 4x6 tokens
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {**feeds, **wfeeds})))
    with torch.no_grad():
        blocks, singles = net(**{k: torch.from_numpy(v) for k, v in feeds.items()}, conditioning_scale=1.0,
                              return_dict=False)
    assert singles is None and len(got) == len(blocks), sorted(got)
    worst = max(float(np.abs(got[f"{fcn.DOUBLE_OUT}{j}"] - r.numpy()).max()) for j, r in enumerate(blocks))
    size = max(float(np.abs(r.numpy()).max()) for r in blocks)
    assert worst < 1e-4 * max(1.0, size), f"{name}: the derived graph differs from FluxControlNetModel by {worst}"
    print(f"  {name}: derived graph = FluxControlNetModel ({lay.label}; max error {worst:.1e}, outputs up to "
          f"{size:.1f})")
    return {"layout": lay.label, "max_abs_err": worst, "max_abs_output": size}


def check_repeat_rule() -> dict:
    """The residual inputs with the repeat rule on a tiny weight-free dev graph of 3 double blocks, bound to a random
    FluxTransformer2DModel, against diffusers' transformer with ``controlnet_blocks_repeat=True``."""
    cfg = {**fc.TINY, "num_layers": 3, "num_single_layers": 1}
    spec = dataclasses.replace(msg.SPECS["flux_dev_transformer"], inputs=fc.tiny_inputs)
    _, prog = msg.export_program(spec, {**spec.config, **cfg}, fake=True)
    proto, _ = msg.weight_free(prog, "flux_dev_transformer", "tests: 3 double blocks")
    fcn.residual_graph(proto, 2, 0, repeat=True)
    torch.manual_seed(7)
    tr = FluxTransformer2DModel(patch_size=1, in_channels=64, guidance_embeds=True, **cfg).eval()
    g.scale_weights(tr, 7)
    sess, wfeeds = msg.ort_session_bound(proto, {k: v.detach().numpy() for k, v in tr.state_dict().items()})
    rng = np.random.default_rng(5)
    f32 = np.float32
    feeds = {"hidden_states": rng.standard_normal((1, 24, 64)).astype(f32),
             "encoder_hidden_states": rng.standard_normal((1, 9, g.T5_WIDTH)).astype(f32),
             "pooled_projections": rng.standard_normal((1, 32)).astype(f32), "timestep": np.array([0.6], f32),
             "txt_ids": np.zeros((9, 3), f32), "img_ids": fc.ids(4, 6), "guidance": np.array([3.5], f32)}
    blocks = [rng.standard_normal((1, 24, 32)).astype(f32) for _ in range(2)]
    got = sess.run(None, {**feeds, **wfeeds, **{f"{fcn.DOUBLE_IN}{j}": b for j, b in enumerate(blocks)}})[0]
    with torch.no_grad():
        tf = {k: torch.from_numpy(v) for k, v in feeds.items()}
        res = [torch.from_numpy(b) for b in blocks]
        want = tr(**tf, controlnet_block_samples=res, controlnet_blocks_repeat=True, return_dict=False)[0].numpy()
        interval = tr(**tf, controlnet_block_samples=res, return_dict=False)[0].numpy()
    err = float(np.abs(got - want).max())
    apart = float(np.abs(interval - want).max())
    assert err < 1e-4 and apart > 1e-2, (err, apart)
    print(f"  repeat rule (3 double blocks, 2 residuals): = diffusers' transformer (max error {err:.1e}; the interval "
          f"rule would be {apart:.2f} off)")
    return {"max_abs_err": err, "interval_rule_differs_by": apart}


def check_full_size() -> dict:
    from sdrt.checkpoint.graphs import shipped_graph

    with torch.device("meta"):
        net = FluxControlNetModel(**{**XLABS, "num_layers": 2})
    params = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    lay = fcn.layout(params)
    assert isinstance(lay, fcn.FluxNetLayout) and lay.hint
    model = onnx.load_from_string(shipped_graph("flux_dev_transformer").read_bytes())
    fcn.controlnet_graph(model, lay, "flux_dev_transformer")
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    dead = {k for k in params if k.startswith(fcn.unused_keys(lay))}
    diff = sorted(set(inits) ^ (set(params) - dead)) + sorted(k for k in set(inits) & set(params)
                                                               if inits[k] != params[k])
    assert not diff, diff[:10]
    print(f"  XLabs v1/v2 layout at full size: derived graph's initializers = FluxControlNetModel's {len(params)} "
          f"parameters less {len(dead)} unread")
    return {"layout": lay.label, "params": len(params), "unread": len(dead), "nodes": len(model.graph.node)}


# -------------------------------------------------------------------------------- diffusers' images
def run(base, nets: dict, case: dict, refs: dict) -> None:
    name = case["name"]
    used = [nets[n] for n in case["nets"]]
    pipe = fc.pipeline(base, used)
    images = fc.control_images(case, len(used), refs)
    image = (fc.generate(pipe, case, images) * 255).round().astype(np.uint8)
    plain = (fc.generate(pipe, case, images, [0.0] * len(used)) * 255).round()  # the nets' part of the image
    blank = [Image.fromarray(np.zeros_like(np.asarray(i))) for i in images]  # the pictures' part of it
    unseen = (fc.generate(pipe, case, blank) * 255).round()
    moved = int(np.abs(image.astype(int) - plain.astype(int)).max())
    seen = int(np.abs(image.astype(int) - unseen.astype(int)).max())
    assert moved > 20 and seen > 20, f"{name}: the nets ({moved}) or their pictures ({seen}) barely move the image"
    refs[f"{name}/image"] = image
    case.update(max_sequence_length=g.MAX_SEQ, prompt=fc.PROMPT, net_moves_image_by=moved,
                picture_moves_image_by=seen)
    print(f"  {name}: {image.shape} std {float(image.std()):.1f}; the nets move it by up to {moved} levels, their "
          f"pictures (against black ones) by {seen}")


def main() -> None:
    torch.set_num_threads(2)
    tools._tokenizers_from_dev()
    base = g.build("flux-dev")
    tools.check_shared_parts(base)
    fc.check_dev_transformer(base.transformer)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(fc.DEV / "scheduler")
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    report: dict = {"full_size": check_full_size(), "repeat_rule": check_repeat_rule()}
    tiny = onnx.load(str(BASE), load_external_data=False)
    nets = {name: make_net(name) for name in NETS}
    report["nets"] = {name: {**check_net_graph(tiny, net, name), **save(net, name)} for name, net in nets.items()}
    refs: dict[str, np.ndarray] = {}
    cases = [dict(c) for c in CASES]
    for case in cases:
        run(base, nets, case, refs)
    g.write_refs(OUT, cases, refs, report)


if __name__ == "__main__":
    main()
