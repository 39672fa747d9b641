"""A tiny FLUX.1 Canny/Depth control LoRA for tiny-flux-dev, and diffusers' images with it.

Builds tiny-flux-dev's pipeline again (gen_flux_tools_refs.py: the same seeds; checked against the folder's ONNX
parts, the transformer too), writes a random rank-4 control LoRA in Black Forest Labs' layout
(``flux1-canny-dev-lora.safetensors``: ``img_in.lora_A.weight`` [4, 128], fused ``qkv`` / ``linear1`` layers, a
``lora_B.bias`` on every layer, the qk-norm ``*.scale`` tensors whole) and the same LoRA in diffusers' layout
(``transformer.x_embedder.lora_A.weight``, ``transformer.transformer_blocks.0.attn.norm_q.weight``), converted
by diffusers' own ``_convert_bfl_flux_control_lora_to_diffusers`` (its block counts and width, 19 / 38 / 3072,
set to the tiny model's in its code object; ``bfl_converter``), every linear layer of the model carrying a LoRA
and a ``lora_B.bias``, so a wrong split, order or swap of any BFL tensor shows. One correction: the converter
swaps the final adaLN's ``lora_A`` rows as well as ``lora_B``'s, which changes the product; the reference takes
``lora_A`` unswapped (see ``main``). The reference: diffusers 0.42.1's
``FluxControlPipeline`` with tiny-flux-dev's transformer, ``load_lora_weights(diffusers file)`` (which zero-pads
``x_embedder`` to 128 inputs and loads the norms whole), ``fuse_lora(lora_scale=s)``, and a control image.

A case at weight 0 (``fuse_lora(lora_scale=0)``): diffusers still runs the control model (the widened input and the
LoRA's norms), which sdrt matches. A last case adds an ordinary Flux LoRA (``flux_peft.safetensors``) at 0.8 beside the control LoRA at 1
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
         # weight 0: diffusers keeps the 128-input x_embedder and the LoRA's norms (loaded whole); only the deltas go
         dict(name="scale0", scale=0.0, width=64, height=64, steps=3, seed=5, guidance=10.0),
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


def bfl_converter(n_double: int, n_single: int, d: int):
    """diffusers' own ``_convert_bfl_flux_control_lora_to_diffusers`` for this model's size: the function as diffusers
    ships it, its constants 19 / 38 / 3072 (blocks, width) set to tiny-flux-dev's. Patched in place, so
    ``load_lora_weights`` of BFL's file converts it with diffusers' code, not this script's."""
    from diffusers.loaders import lora_conversion_utils as lcu

    fn = lcu._convert_bfl_flux_control_lora_to_diffusers
    code = fn.__code__
    consts = list(code.co_consts)
    for old, new in ((19, n_double), (38, n_single), (3072, d)):
        assert consts.count(old) == 1, (old, code.co_consts)
        consts[consts.index(old)] = new
    fn.__code__ = code.replace(co_consts=tuple(consts))
    return fn


def control_lora(cfg) -> dict:
    """A control LoRA in BFL's keys on every layer diffusers' converter takes (all of tiny-flux-dev's linear modules,
    a ``lora_B.bias`` on each, every qk-norm scale)."""
    gen = torch.Generator().manual_seed(3)
    d = cfg.num_attention_heads * cfg.attention_head_dim
    mlp, head = 4 * d, cfg.attention_head_dim

    def t(*shape, s=0.3):
        return (torch.randn(*shape, generator=gen) * s).contiguous()

    mods = {"img_in": (d, 128), "txt_in": (d, cfg.joint_attention_dim), "time_in.in_layer": (d, 256),
            "time_in.out_layer": (d, d), "vector_in.in_layer": (d, cfg.pooled_projection_dim),
            "vector_in.out_layer": (d, d), "guidance_in.in_layer": (d, 256), "guidance_in.out_layer": (d, d),
            "final_layer.linear": (cfg.patch_size ** 2 * cfg.in_channels, d),
            "final_layer.adaLN_modulation.1": (2 * d, d)}
    for i in range(cfg.num_layers):
        for x in ("img", "txt"):
            mods.update({f"double_blocks.{i}.{x}_mod.lin": (6 * d, d), f"double_blocks.{i}.{x}_attn.qkv": (3 * d, d),
                         f"double_blocks.{i}.{x}_attn.proj": (d, d), f"double_blocks.{i}.{x}_mlp.0": (mlp, d),
                         f"double_blocks.{i}.{x}_mlp.2": (d, mlp)})
    for i in range(cfg.num_single_layers):
        mods.update({f"single_blocks.{i}.modulation.lin": (3 * d, d), f"single_blocks.{i}.linear1": (3 * d + mlp, d),
                     f"single_blocks.{i}.linear2": (d, d + mlp)})
    bfl: dict[str, torch.Tensor] = {}
    for m, (o, i) in mods.items():
        s = 0.1 if m.startswith(("time_in", "guidance_in", "vector_in")) else 0.3
        bfl[f"{m}.lora_A.weight"], bfl[f"{m}.lora_B.weight"] = t(RANK, i, s=s), t(o, RANK, s=s)
        bfl[f"{m}.lora_B.bias"] = t(o, s=0.2)
    norms = [f"double_blocks.{i}.{x}_attn.norm.{n}_norm.scale" for i in range(cfg.num_layers) for x in ("img", "txt")
             for n in ("query", "key")]
    norms += [f"single_blocks.{i}.norm.{n}_norm.scale" for i in range(cfg.num_single_layers) for n in ("query", "key")]
    for n in norms:
        bfl[n] = 1.0 + t(head, s=0.5)
    return bfl


def main() -> None:
    torch.set_num_threads(2)
    tools._tokenizers_from_dev()
    base = g.build("flux-dev")
    tools.check_shared_parts(base)
    check_transformer(base.transformer)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(tools.DEV / "scheduler")
    cfg = base.transformer.config
    convert = bfl_converter(cfg.num_layers, cfg.num_single_layers, cfg.num_attention_heads * cfg.attention_head_dim)
    bfl = control_lora(cfg)
    dif = convert({k: v.clone() for k, v in bfl.items()})  # diffusers' layout, by diffusers' converter
    # ... but for one tensor: diffusers 0.42.1's converter runs swap_scale_shift on the final adaLN's lora_A too,
    # whose rows are the LoRA's rank components, not (shift, scale) outputs: swap(B) @ swap(A) != swap(B @ A), the
    # final layer's modulation of BFL's file (as BFL's own code and ComfyUI apply it, on BFL's layout). Only
    # lora_B's rows swap; the reference keeps diffusers' conversion of every other tensor.
    key = "transformer.norm_out.linear.lora_A.weight"
    assert not torch.equal(dif[key], bfl["final_layer.adaLN_modulation.1.lora_A.weight"])
    dif[key] = bfl["final_layer.adaLN_modulation.1.lora_A.weight"].clone()
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
