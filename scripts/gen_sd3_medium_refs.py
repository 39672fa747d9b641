"""A tiny SD 3 Medium (June 2024) model and diffusers' images with it, for sdrt's ``sd3-medium`` family.

SD 3 Medium's MMDiT is SD 3.5's without the q/k RMS norms and without MMDiT-X's dual attention
(``stabilityai/stable-diffusion-3-medium-diffusers`` transformer/config.json: no ``qk_norm``, no
``dual_attention_layers``; ``pos_embed_max_size`` 192). Its other parts are SD 3.5's, so this script rebuilds the tiny
SD3 pipeline of ``gen_flow_refs.py`` (the text encoders, VAE, tokenizers and scheduler of
``tests/data/pipelines/tiny-sd3``, each checked here against that folder's ONNX part with onnxruntime) and gives it a
tiny random ``SD3Transformer2DModel`` of SD 3 Medium's design (3 blocks, 4 heads of 8, no q/k norm, no dual
attention). diffusers 0.42.1's ``StableDiffusion3Pipeline`` (and ``StableDiffusion3Img2ImgPipeline``) make the
reference images with ``torch.Generator("cpu").manual_seed(seed)``.

Also an InstantX-layout ControlNet of that design (``SD3ControlNetModel`` with a text stream, no q/k norm, its own
``pos_embed``, zero pooled projections as diffusers' default: InstantX's ``SD3-Controlnet-Canny`` and kind), with
``StableDiffusion3ControlNetPipeline``'s images (the control samples drawn as ``gen_sd3_controlnet_refs.py`` explains).

Writes ``tests/data/pipelines/tiny-sd3-medium/``:

- ``transformer/``: ``config.json`` and ``diffusion_pytorch_model.safetensors`` (fp16, diffusers' names; the tests
  write Stability's single-file keys and the diffusers folder from it);
- ``sd3_medium_transformer.onnx``: the tiny weight-free graph sdrt binds it onto, exported exactly as
  ``scripts/make_shipped_graphs.py`` exports the shipped ``sd3_medium_transformer`` (its dynamo export of diffusers'
  module, at these widths), checked here against the torch module with its weights bound by name;
- ``instantx/``: the ControlNet's ``config.json`` and fp16 ``diffusion_pytorch_model.safetensors``; the graph
  ``sdrt.checkpoint.sd3controlnet`` cuts from the tiny graph is checked against ``SD3ControlNetModel``;
- ``refs.json``, ``refs.npz`` (images, control images) and ``checks.json``.

    PYTHONPATH=scripts:scripts/_tvblock:core/src /work/refvenv/bin/python scripts/gen_sd3_medium_refs.py
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_flow_refs as g  # noqa: E402  (blocks torchvision first)
import gen_sd3_controlnet_refs as scr  # noqa: E402
import make_shipped_graphs as msg  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from diffusers import SD3ControlNetModel, SD3Transformer2DModel, StableDiffusion3Img2ImgPipeline  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

SD3 = g.OUT / "tiny-sd3"
OUT = g.OUT / "tiny-sd3-medium"
#: SD 3 Medium's design at tiny-sd3's widths: no qk_norm, no dual_attention_layers (diffusers' defaults)
TINY = dict(sample_size=16, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=8, num_attention_heads=4,
            joint_attention_dim=g.T5_WIDTH, caption_projection_dim=32, pooled_projection_dim=48, out_channels=16,
            pos_embed_max_size=24)
CASES = [
    dict(name="txt2img/96x64/cfg 5/negative", mode="txt2img", width=96, height=64, steps=3, seed=1, cfg=5.0, batch=1,
         negative_prompt=g.NEGATIVE),
    dict(name="txt2img/64x64/cfg 4/batch 2", mode="txt2img", width=64, height=64, steps=2, seed=5, cfg=4.0, batch=2,
         negative_prompt=None),
    dict(name="img2img/strength 0.6", mode="img2img", width=64, height=64, steps=4, seed=6, cfg=5.0, batch=1,
         negative_prompt=g.NEGATIVE, strength=0.6),
]
NET_CASE = dict(name="instantx-64x96-cfg5", nets=["instantx"], width=96, height=64, steps=3, seed=5, cfg=5.0, batch=1,
                scale=[0.7], start=[0.0], end=[1.0], negative_prompt="blurry, low quality")


def check_parts(pipe) -> dict:
    """The rebuilt text encoders and VAE are tiny-sd3's ONNX parts (the tests bind those parts' weights)."""
    rng = np.random.default_rng(0)
    out = {}
    for part, module in (("text_encoder", pipe.text_encoder), ("text_encoder_2", pipe.text_encoder_2),
                         ("text_encoder_3", pipe.text_encoder_3)):
        sess = ort.InferenceSession(str(SD3 / part / "model.onnx"), providers=["CPUExecutionProvider"])
        ids = rng.integers(0, 200, (1, 12)).astype(np.int64)
        got = sess.run(None, {"input_ids": ids})[0]
        with torch.no_grad():
            want = module(torch.from_numpy(ids))[0].numpy()
        out[part] = float(np.abs(got - want).max())
    sess = ort.InferenceSession(str(SD3 / "vae_decoder" / "model.onnx"), providers=["CPUExecutionProvider"])
    lat = rng.standard_normal((1, 16, 4, 6)).astype(np.float32)
    with torch.no_grad():
        want = pipe.vae.decode(torch.from_numpy(lat), return_dict=False)[0].numpy()
    out["vae_decoder"] = float(np.abs(sess.run(None, {"latent_sample": lat})[0] - want).max())
    assert max(out.values()) < 1e-4, f"the rebuilt parts are not tiny-sd3's: {out}"
    print(f"  text encoders and VAE = tiny-sd3's ONNX parts (max errors {out})")
    return out


def make_transformer() -> SD3Transformer2DModel:
    torch.manual_seed(7)
    tr = SD3Transformer2DModel(**TINY).eval()
    assert tr.config.qk_norm is None and not tr.config.dual_attention_layers
    g.scale_weights(tr, 7)
    return tr.half().float()  # fp16 values: the file is fp16, the pipeline runs in float32


def tiny_graph() -> onnx.ModelProto:
    """make_shipped_graphs.py's export of the shipped sd3_medium_transformer, at TINY's widths."""
    spec = dataclasses.replace(msg.SPECS["sd3_medium_transformer"], inputs=scr.tiny_inputs)
    cfg = {**spec.config, **TINY}
    _, prog = msg.export_program(spec, cfg, fake=True)
    proto, _ = msg.weight_free(prog, "sd3_medium_transformer", "tests: tiny SD 3 Medium (gen_sd3_medium_refs.py)")
    return proto


def check_graph(proto: onnx.ModelProto, tr: SD3Transformer2DModel) -> dict:
    """The tiny weight-free graph, every weight bound by its diffusers name, against the torch module."""
    state = {k: v.detach().numpy() for k, v in tr.state_dict().items()}
    inits = {t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert inits == set(state), sorted(inits ^ set(state))[:10]
    assert not any(".norm_q." in k or ".attn2." in k for k in inits)
    sess, wfeeds = msg.ort_session_bound(proto, state)
    worst = 0.0
    for s in (1, 2):
        x = scr.tiny_inputs({**TINY}, s)
        with torch.no_grad():
            want = tr(**x, return_dict=False)[0].numpy()
        got = sess.run(None, {**{k: v.numpy() for k, v in x.items()}, **wfeeds})[0]
        worst = max(worst, float(np.abs(got - want).max()))
    assert worst < 1e-4, worst
    print(f"  tiny sd3_medium_transformer graph = SD3Transformer2DModel ({len(inits)} weights; max error {worst:.1e})")
    return {"weights": len(inits), "max_abs_err": worst}


def make_net() -> SD3ControlNetModel:
    torch.manual_seed(45)
    net = SD3ControlNetModel(**{**TINY, "num_layers": 2}).eval()
    assert net.config.qk_norm is None and net.config.force_zeros_for_pooled_projection
    g.scale_weights(net, 45)
    return net.half().float()


def run(pipe, case: dict, refs: dict) -> None:
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    kw = dict(prompt=g.PROMPT, negative_prompt=case["negative_prompt"], guidance_scale=case["cfg"],
              num_inference_steps=case["steps"], generator=gen, num_images_per_prompt=case["batch"], output_type="np",
              max_sequence_length=g.MAX_SEQ)
    with torch.no_grad():
        if case["mode"] == "img2img":
            p = StableDiffusion3Img2ImgPipeline(**pipe.components)
            p.set_progress_bar_config(disable=True)
            init = g.init_image()
            refs[f"{case['name']}/init_image"] = init
            result = p(image=Image.fromarray(init), strength=case["strength"], height=case["height"],
                       width=case["width"], **kw)
        else:
            result = pipe(height=case["height"], width=case["width"], **kw)
    image = (result.images * 255).round().astype(np.uint8)
    refs[f"{case['name']}/image"] = image
    case.update(prompt=g.PROMPT, max_sequence_length=g.MAX_SEQ)
    print(f"  {case['name']}: {image.shape} std {float(image.std()):.1f}")


def main() -> None:
    torch.set_num_threads(2)
    scr._tokenizers_from_sd3()
    pipe = g.build("sd3")
    pipe.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(SD3 / "scheduler")
    report: dict = {"parts_vs_tiny_sd3": check_parts(pipe)}
    tr = make_transformer()
    pipe.transformer = tr
    pipe.register_modules(transformer=tr)
    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "transformer").mkdir(parents=True)
    save_file({k: v.half().contiguous() for k, v in tr.state_dict().items()},
              str(OUT / "transformer" / "diffusion_pytorch_model.safetensors"))
    tr.save_config(OUT / "transformer")
    proto = tiny_graph()
    report["graph"] = check_graph(proto, tr)
    onnx.save(proto, str(OUT / "sd3_medium_transformer.onnx"))
    net = make_net()
    report["instantx_net"] = scr.check_net_graph(proto, net, "instantx", tr)
    scr.save_net(net, OUT / "instantx")
    refs: dict[str, np.ndarray] = {}
    cases = [dict(c) for c in CASES]
    for case in cases:
        run(pipe, case, refs)
    net_case = dict(NET_CASE)
    scr.run(pipe, {"instantx": net}, net_case, refs)
    (OUT / "controlnet.json").write_text(json.dumps([net_case], indent=1) + "\n")
    g.write_refs(OUT, cases, refs, report)


if __name__ == "__main__":
    main()
