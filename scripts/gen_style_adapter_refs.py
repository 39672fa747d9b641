"""T2I-Adapter style adapter references: sd-webui-controlnet's ``t2ia_style_clipvision`` written in torch around
diffusers' tiny SD 1.x pipeline (tests/data/pipelines/tiny-sd15's weights, ``gen_pipeline_refs.build("sd15")``).

The algorithm, as read in the extension (``annotator/clipvision``, ``scripts/adapter.py``, ``UnetHook.forward``), not
copied: the picture ``cv2.resize``d to the encoder's size (INTER_AREA) and through ``CLIPImageProcessor``, the
encoder's ``last_hidden_state``; the adapter (its learned tokens appended, ``ln_pre``, CLIP residual attention blocks
with ``nn.MultiheadAttention`` of 8 heads and QuickGELU MLPs, ``ln_post`` of the learned tokens, ``@ proj``); at a
step the unit is on at (``start <= i / n <= end``), ``weight * tokens`` appended to the conditional rows' context and
zeros to the unconditional rows'. Here ``prompt_embeds`` / ``negative_prompt_embeds`` go in by hand, lengthened, and
``callback_on_step_end`` gives the next step's (``prompt_embeds``: CFG's ``[uncond, cond]``).

Writes ``tests/data/styleadapter/``: ``clip_vision/clip_vitl.pth`` (a tiny ``CLIPVisionModelWithProjection`` with
QuickGELU, 40 wide, as the extension keeps openai's ViT-L/14), ``clip_vision_l.onnx`` (its architecture exported as
``make_shipped_graphs.py`` exports the shipped ``clip_vision_l``), ``t2iadapter_style_tiny.pth`` (the adapter's keys,
40 wide, 8 tokens of tiny-sd15's 32-wide context, random), ``refs.npz`` / ``refs.json``.

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/gen_style_adapter_refs.py
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_pipeline_refs as gp  # noqa: E402
import gen_revision_refs as gr  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "styleadapter"
VISION = dict(hidden_size=40, intermediate_size=56, num_attention_heads=4, num_hidden_layers=2, image_size=32,
              patch_size=8, projection_dim=24, hidden_act="quick_gelu", layer_norm_eps=1e-5)
CASES = [
    dict(name="style/1.0", prompt="a photo of a red cat", negative_prompt="blurry", steps=3, cfg=7.0, seed=71,
         sampler="Euler", units=[dict(weight=1.0, image=0)]),
    dict(name="style/two/window", prompt="a photo of a red cat", negative_prompt="", steps=4, cfg=6.0, seed=72,
         sampler="Euler", units=[dict(weight=1.5, image=1, start=0.0, end=0.3), dict(weight=0.8, image=0)]),
    # with tiny-sd15-controlnet's ControlNet (gen_controlnet_refs' seed): the net reads the lengthened context
    dict(name="style+controlnet", prompt="a photo of a red cat", negative_prompt="blurry", steps=3, cfg=7.0, seed=73,
         sampler="Euler", units=[dict(weight=1.0, image=0)], control_scale=0.8),
]


class Block(nn.Module):
    """A CLIP residual attention block (pre-norm attention, pre-norm QuickGELU MLP), sequence-first."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads)
        self.ln_1 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(OrderedDict(c_fc=nn.Linear(width, 4 * width), c_proj=nn.Linear(4 * width, width)))
        self.ln_2 = nn.LayerNorm(width)

    def forward(self, x):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = self.mlp.c_fc(self.ln_2(x))
        return x + self.mlp.c_proj(h * torch.sigmoid(1.702 * h))


class Style(nn.Module):
    def __init__(self, width: int, context: int, heads: int = 8, layers: int = 2, tokens: int = 8) -> None:
        super().__init__()
        self.transformer_layes = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.style_embedding = nn.Parameter(torch.randn(1, tokens, width) * width ** -0.5)
        self.ln_pre = nn.LayerNorm(width)
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(torch.randn(width, context) * width ** -0.5)
        self.tokens = tokens

    def forward(self, hidden):
        x = torch.cat([hidden, self.style_embedding.expand(hidden.shape[0], -1, -1)], dim=1)
        x = self.ln_pre(x).permute(1, 0, 2)
        x = self.transformer_layes(x).permute(1, 0, 2)
        return self.ln_post(x[:, -self.tokens:]) @ self.proj


def hidden_of(enc, rgb: np.ndarray) -> torch.Tensor:
    import cv2
    from transformers import CLIPImageProcessor

    size = enc.config.image_size
    proc = CLIPImageProcessor(crop_size=size, do_center_crop=True, do_convert_rgb=True, do_normalize=True,
                              do_resize=True, image_mean=[0.48145466, 0.4578275, 0.40821073],
                              image_std=[0.26862954, 0.26130258, 0.27577711], resample=3, size=size)
    px = proc(images=cv2.resize(rgb, (size, size), interpolation=cv2.INTER_AREA), return_tensors="pt")
    with torch.no_grad():
        return enc(pixel_values=px["pixel_values"]).last_hidden_state


def run(pipe, enc, style, case: dict, images: list[np.ndarray], net=None, edges=None) -> np.ndarray:
    n = case["steps"]
    with torch.no_grad():
        pe, npe = pipe.encode_prompt(case["prompt"], "cpu", 1, True, case["negative_prompt"] or None)
        units = [(u, style(hidden_of(enc, images[u["image"]]))) for u in case["units"]]

    def tensors(i: int) -> torch.Tensor:
        neg, pos = [npe], [pe]
        for u, tok in units:
            if u.get("start", 0.0) <= i / n <= u.get("end", 1.0):
                pos.append(tok * u["weight"])
                neg.append(torch.zeros_like(tok))
        return torch.cat([torch.cat(neg, 1), torch.cat(pos, 1)])

    ctx0 = tensors(0)

    def step_end(p, i, t, kw):
        return {"prompt_embeds": tensors(i + 1)}

    from PIL import Image

    sched = gp.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
    extra = {}
    if net is not None:
        from diffusers import StableDiffusionControlNetPipeline

        p = StableDiffusionControlNetPipeline(**{**pipe.components, "scheduler": sched}, controlnet=net)
        extra = dict(image=Image.fromarray(edges), controlnet_conditioning_scale=case["control_scale"])
    else:
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
    p.set_progress_bar_config(disable=True)
    out = p(**extra, prompt_embeds=ctx0[1:], negative_prompt_embeds=ctx0[:1], num_inference_steps=n,
            guidance_scale=case["cfg"], height=64, width=64, generator=torch.Generator("cpu").manual_seed(case["seed"]),
            output_type="np", callback_on_step_end=step_end, callback_on_step_end_tensor_inputs=["prompt_embeds"])
    return (out.images * 255).round().astype(np.uint8)


def main() -> None:
    import make_shipped_graphs as msg
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(8)
    enc = CLIPVisionModelWithProjection(CLIPVisionConfig(**VISION)).eval()
    gp.scale_weights(enc, 19)
    (OUT / "clip_vision").mkdir(exist_ok=True)
    torch.save({k: v.clone() for k, v in enc.state_dict().items()}, OUT / "clip_vision" / "clip_vitl.pth")
    _, prog = msg.export_program(msg.SPECS["clip_vision_l"], {**VISION, "num_channels": 3}, fake=True)
    proto, _ = msg.weight_free(prog, "clip_vision_l_tiny", "scripts/gen_style_adapter_refs.py VISION")
    (OUT / "clip_vision_l.onnx").write_bytes(proto.SerializeToString())
    pipe = gp.build("sd15")
    import gen_controlnet_refs as gc

    net = gc.make_controlnet(pipe.unet, 40 + gc.CONTROLNETS.index("controlnet"))  # tiny-sd15-controlnet's
    torch.manual_seed(9)
    style = Style(VISION["hidden_size"], pipe.unet.config.cross_attention_dim).eval()
    gp.scale_weights(style, 23)
    g = torch.Generator().manual_seed(29)
    with torch.no_grad():  # scale_weights knows norms by "norm" in the name: CLIP's ln_* get theirs here
        for mod in style.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.copy_(1 + 0.1 * torch.randn(mod.weight.shape, generator=g))
                mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=g))
        style.style_embedding.mul_(3.0)  # learned tokens as strong as the encoder's
    torch.save({k: v.clone() for k, v in style.state_dict().items()}, OUT / "t2iadapter_style_tiny.pth")
    images = gr.pictures()
    refs: dict[str, np.ndarray] = {f"image{k}": im for k, im in enumerate(images)}
    with torch.no_grad():
        refs["hidden0"] = hidden_of(enc, images[0]).numpy()
        refs["tokens0"] = style(hidden_of(enc, images[0])).numpy()
    refs["edges"] = gc.control_edges()
    for case in CASES:
        cn = "control_scale" in case
        refs[case["name"]] = run(pipe, enc, style, case, images, net if cn else None, refs["edges"] if cn else None)
        print(case["name"], float(refs[case["name"]].std()), flush=True)
    np.savez_compressed(OUT / "refs.npz", **refs)
    (OUT / "refs.json").write_text(json.dumps(CASES, indent=1) + "\n")


if __name__ == "__main__":
    main()
