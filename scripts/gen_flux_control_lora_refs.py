"""A tiny FLUX.1 Canny/Depth control LoRA for tiny-flux-dev, and diffusers' images with it.

Builds tiny-flux-dev's pipeline again (gen_flux_tools_refs.py: the same seeds; checked against the folder's ONNX
parts, the transformer too), writes a random rank-4 control LoRA in Black Forest Labs' layout
(``flux1-canny-dev-lora.safetensors``: ``img_in.lora_A.weight`` [4, 128], fused ``qkv`` / ``linear1`` layers, a
``lora_B.bias`` on every layer, the qk-norm ``*.scale`` tensors whole) and the same LoRA in diffusers' layout
(``transformer.x_embedder.lora_A.weight``, ``transformer.transformer_blocks.0.attn.norm_q.weight``; the fused
layers split as diffusers' ``_convert_bfl_flux_control_lora_to_diffusers`` splits them, which itself only takes
19 + 38 blocks of width 3072, so it cannot convert a tiny file). The reference: diffusers 0.42.1's
``FluxControlPipeline`` with tiny-flux-dev's transformer, ``load_lora_weights(diffusers file)`` (which zero-pads
``x_embedder`` to 128 inputs and loads the norms whole), ``fuse_lora(lora_scale=s)``, and a control image.

A third case adds an ordinary Flux LoRA (``flux_peft.safetensors``) at 0.8 beside the control LoRA at 1
(``set_adapters`` then ``fuse_lora``).

Writes ``tests/data/lora/flux_control_lora_{bfl,diffusers}.safetensors`` and ``flux_control_lora_refs.{json,npz}``.

    PYTHONPATH=scripts /work/refvenv/bin/python scripts/gen_flux_control_lora_refs.py
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_flow_refs as g  # noqa: E402
import gen_flux_tools_refs as tools  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from diffusers import FluxControlPipeline  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

OUT = g.OUT.parent / "lora"
RANK = 4
CASES = [dict(name="scale1", scale=1.0, width=64, height=64, steps=3, seed=5, guidance=10.0),
         dict(name="scale0.5", scale=0.5, width=64, height=64, steps=3, seed=5, guidance=10.0),
         # the control LoRA with an ordinary one (flux_peft.safetensors of make_flow_lora_refs.py) at 0.8
         dict(name="mixed", scale=1.0, width=64, height=64, steps=3, seed=5, guidance=10.0, other=0.8)]


def check_transformer(tr) -> None:
    sess = ort.InferenceSession(str(tools.DEV / "transformer" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    f32 = np.float32
    feeds = {"hidden_states": rng.standard_normal((1, 16, 64)).astype(f32),
             "encoder_hidden_states": rng.standard_normal((1, 20, g.T5_WIDTH)).astype(f32),
             "pooled_projections": rng.standard_normal((1, 32)).astype(f32), "timestep": np.array([0.6], f32),
             "txt_ids": np.zeros((20, 3), f32), "img_ids": np.zeros((16, 3), f32), "guidance": np.array([3.5], f32)}
    got = sess.run(None, feeds)[0]
    with torch.no_grad():
        want = g._Flux(tr)(*[torch.from_numpy(feeds[k]) for k in feeds]).numpy()
    err = float(np.abs(got - want).max())
    assert err < 1e-3, f"transformer: the rebuilt one is not tiny-flux-dev's (max error {err})"
    print(f"  transformer: rebuilt = tiny-flux-dev's ONNX part (max error {err:.1e})")


def control_lora(d: int, mlp: int, norm: int) -> tuple[dict, dict]:
    """The same LoRA in BFL's and diffusers' keys."""
    gen = torch.Generator().manual_seed(3)

    def t(*shape, s=0.3):
        return (torch.randn(*shape, generator=gen) * s).contiguous()

    bfl: dict[str, torch.Tensor] = {}
    dif: dict[str, torch.Tensor] = {}

    def layer(b_name, out_f, in_f, d_names, splits):
        a, b, bias = t(RANK, in_f), t(out_f, RANK), t(out_f, s=0.2)
        bfl[f"{b_name}.lora_A.weight"], bfl[f"{b_name}.lora_B.weight"], bfl[f"{b_name}.lora_B.bias"] = a, b, bias
        start = 0
        for name, size in zip(d_names, splits):
            dif[f"transformer.{name}.lora_A.weight"] = a.clone()
            dif[f"transformer.{name}.lora_B.weight"] = b[start:start + size].clone()
            dif[f"transformer.{name}.lora_B.bias"] = bias[start:start + size].clone()
            start += size

    layer("img_in", d, 128, ["x_embedder"], [d])
    layer("double_blocks.0.img_attn.qkv", 3 * d, d, [f"transformer_blocks.0.attn.to_{x}" for x in "qkv"], [d] * 3)
    layer("double_blocks.0.txt_mlp.0", mlp, d, ["transformer_blocks.0.ff_context.net.0.proj"], [mlp])
    layer("single_blocks.1.linear1", 3 * d + mlp, d,
          [*(f"single_transformer_blocks.1.attn.to_{x}" for x in "qkv"), "single_transformer_blocks.1.proj_mlp"],
          [d, d, d, mlp])
    layer("single_blocks.0.modulation.lin", 3 * d, d, ["single_transformer_blocks.0.norm.linear"], [3 * d])
    norms = {"double_blocks.0.img_attn.norm.query_norm.scale": "transformer_blocks.0.attn.norm_q.weight",
             "double_blocks.0.img_attn.norm.key_norm.scale": "transformer_blocks.0.attn.norm_k.weight",
             "double_blocks.0.txt_attn.norm.query_norm.scale": "transformer_blocks.0.attn.norm_added_q.weight",
             "double_blocks.0.txt_attn.norm.key_norm.scale": "transformer_blocks.0.attn.norm_added_k.weight",
             "single_blocks.0.norm.query_norm.scale": "single_transformer_blocks.0.attn.norm_q.weight",
             "single_blocks.0.norm.key_norm.scale": "single_transformer_blocks.0.attn.norm_k.weight",
             "single_blocks.1.norm.query_norm.scale": "single_transformer_blocks.1.attn.norm_q.weight",
             "single_blocks.1.norm.key_norm.scale": "single_transformer_blocks.1.attn.norm_k.weight"}
    for b_name, d_name in norms.items():
        v = 1.0 + t(norm, s=0.5)
        bfl[b_name], dif[f"transformer.{d_name}"] = v, v.clone()
    return bfl, dif


def main() -> None:
    torch.set_num_threads(2)
    tools._tokenizers_from_dev()
    base = g.build("flux-dev")
    tools.check_shared_parts(base)
    check_transformer(base.transformer)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(tools.DEV / "scheduler")
    cfg = base.transformer.config
    d = cfg.num_attention_heads * cfg.attention_head_dim
    bfl, dif = control_lora(d, 4 * d, cfg.attention_head_dim)
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(bfl, str(OUT / "flux_control_lora_bfl.safetensors"))
    save_file(dif, str(OUT / "flux_control_lora_diffusers.safetensors"))
    refs: dict[str, np.ndarray] = {}
    cases = [dict(c) for c in CASES]
    for case in cases:
        pipe = FluxControlPipeline(scheduler=base.scheduler, vae=base.vae, text_encoder=base.text_encoder,
                                   tokenizer=base.tokenizer, text_encoder_2=base.text_encoder_2,
                                   tokenizer_2=base.tokenizer_2, transformer=copy.deepcopy(base.transformer))
        pipe.set_progress_bar_config(disable=True)
        pipe.load_lora_weights(str(OUT / "flux_control_lora_diffusers.safetensors"), adapter_name="control")
        assert pipe.transformer.x_embedder.weight.shape[1] == 128
        if "other" in case:
            pipe.load_lora_weights(str(OUT / "flux_peft.safetensors"), adapter_name="other")
            pipe.set_adapters(["control", "other"], [case["scale"], case["other"]])
            pipe.fuse_lora(adapter_names=["control", "other"])
        else:
            pipe.fuse_lora(lora_scale=case["scale"])
        h, w = case["height"], case["width"]
        c = tools.edges(h, w)
        refs["control_image"] = c
        gen = torch.Generator("cpu").manual_seed(case["seed"])
        with torch.no_grad():
            result = pipe(prompt=tools.PROMPT, control_image=Image.fromarray(c), height=h, width=w,
                          num_inference_steps=case["steps"], guidance_scale=case["guidance"], generator=gen,
                          output_type="np", max_sequence_length=g.MAX_SEQ)
        image = (result.images * 255).round().astype(np.uint8)
        refs[f"{case['name']}/image"] = image
        case.update(prompt=tools.PROMPT, max_sequence_length=g.MAX_SEQ)
        print(f"  {case['name']}: {image.shape} std {float(image.std()):.1f}")
    (OUT / "flux_control_lora_refs.json").write_text(json.dumps(cases, indent=1) + "\n")
    np.savez_compressed(OUT / "flux_control_lora_refs.npz", **refs)


if __name__ == "__main__":
    main()
