"""reference_only references: sd-webui-controlnet's algorithm written in torch on diffusers' tiny SD 1.x.

The pipeline is ``gen_pipeline_refs.build("sd15")`` (the same seeds, so the same weights as
``tests/data/pipelines/tiny-sd15``'s ONNX UNet) with diffusers' ``EulerDiscreteScheduler``. The extension's steps
(``scripts/hook.py``: ``UnetHook.forward``'s "Handle attention and AdaIN control" and
``hacked_basic_transformer_inner_forward``) are written here with diffusers' modules, independently of sdrt:

- an attention processor on every ``attn1`` (self-attention) that, on the write pass, keeps its input (the block's
  ``norm1`` output) when the unit's weight passes the block's threshold, and on the read pass attends over
  ``cat([x] + bank)``, the unconditional rows mixed with their plain attention by the style fidelity;
- the thresholds: the blocks in the LDM UNet's module order (input, middle, output blocks), sorted widest first
  (a stable sort), block ``i`` of ``n`` at ``i / n``;
- a wrapper of ``unet.forward`` that, on a step the unit is on at, draws the noise from the pipeline's generator
  (``randn`` of the reference latent repeated to the call's rows, as diffusers' community
  ``StableDiffusionReferencePipeline`` draws it), noises the picture's latent (the VAE's mean times the scaling
  factor) to ``round(t)`` with the LDM schedule (``sqrt(a_t) x0 + sqrt(1 - a_t) noise``), runs the write pass,
  then the read pass;
- the style fidelity: the slider clamped to 0..1; 1 for "ControlNet is more important", 0 for "My prompt is
  more important"; several units' banks concatenated, their fidelities averaged per block.

Writes ``tests/data/refonly/refs.npz`` (images, the pictures) and ``refs.json`` (the cases)::

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/gen_refonly_refs.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_pipeline_refs as gp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "refonly"
BASE = dict(prompt="a photo of a red cat", negative_prompt="blurry", steps=4, cfg=7.0, seed=11)
CASES = [
    dict(name="balanced", **BASE, units=[dict(picture=0, weight=1.0, fidelity=0.5)]),
    dict(name="weight0.6-fidelity0", **{**BASE, "seed": 12},
         units=[dict(picture=0, weight=0.6, fidelity=0.0)]),
    dict(name="controlnet-important", **{**BASE, "seed": 13},
         units=[dict(picture=1, weight=1.0, fidelity=0.5, control_mode="ControlNet is more important")]),
    dict(name="prompt-important", **{**BASE, "seed": 13},
         units=[dict(picture=1, weight=1.0, fidelity=0.5, control_mode="My prompt is more important")]),
    dict(name="window-a1111", **{**BASE, "seed": 14, "steps": 5},
         units=[dict(picture=0, weight=1.0, fidelity=0.8, start=0.3, end=0.8, window="a1111")]),
    dict(name="two-units", **{**BASE, "seed": 15, "cfg": 5.0},
         units=[dict(picture=0, weight=1.0, fidelity=0.5), dict(picture=1, weight=0.5, fidelity=1.0)]),
    dict(name="cfg1", **{**BASE, "seed": 16, "cfg": 1.0}, units=[dict(picture=1, weight=1.0, fidelity=0.5)]),
    dict(name="adain", **{**BASE, "seed": 17},
         units=[dict(picture=0, weight=1.0, fidelity=0.5, module="reference_adain")]),
    dict(name="adain-weight1.5", **{**BASE, "seed": 18},
         units=[dict(picture=1, weight=1.5, fidelity=0.2, module="reference_adain")]),
    dict(name="adain+attn", **{**BASE, "seed": 19},
         units=[dict(picture=0, weight=1.0, fidelity=0.5, module="reference_adain+attn")]),
]
#: tests/data/pipelines/tiny-sdxl's pipeline (gen_pipeline_refs.build("sdxl"): two transformer blocks in its second
#: level), where the extension cubes the style fidelity
XL_CASES = [
    dict(name="sdxl/balanced", **{**BASE, "seed": 21, "cfg": 6.0}, units=[dict(picture=0, weight=1.0, fidelity=0.5)]),
    dict(name="sdxl/weight0.5-fidelity0.9", **{**BASE, "seed": 22, "cfg": 5.0},
         units=[dict(picture=1, weight=0.5, fidelity=0.9)]),
    dict(name="sdxl/adain+attn", **{**BASE, "seed": 23, "cfg": 6.0},
         units=[dict(picture=0, weight=1.5, fidelity=0.5, module="reference_adain+attn")]),
]


def pictures() -> list[np.ndarray]:
    """Two 64x64 pictures (the output size: no resize), with structure the attention can copy."""
    y, x = np.mgrid[0:64, 0:64]
    a = np.stack([(x * 4) % 256, (y * 4) % 256, ((x - 32) ** 2 + (y - 20) ** 2) % 256], -1)
    b = np.stack([((x // 8 + y // 8) % 2) * 220 + 20, (x * 3 + y) % 256, 255 - (y * 4) % 256], -1)
    return [a.astype(np.uint8), b.astype(np.uint8)]


def ldm_sqrt_alphas() -> tuple[torch.Tensor, torch.Tensor]:
    """The LDM schedule's sqrt(a_t) and sqrt(1 - a_t) as the extension's q_sample reads them (float64, then float32)."""
    betas = np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=np.float64) ** 2
    ac = np.cumprod(1.0 - betas)
    return torch.tensor(np.sqrt(ac), dtype=torch.float32), torch.tensor(np.sqrt(1.0 - ac), dtype=torch.float32)


def block_key(name: str) -> tuple:
    group = {"down_blocks": 0, "mid_block": 1, "up_blocks": 2}[name.split(".")[0]]
    return (group, *(int(v) for v in re.findall(r"\.(\d+)(?=\.|$)", name)))


class State:
    mode: str | None = None
    attn_write = True
    gn_write = False
    weight = 1.0
    fidelity = 0.0
    uncond_rows: list[int] = []  # noqa: RUF012


def attend(attn, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
    b, n, c = x.shape
    h = attn.heads
    q = attn.to_q(x).view(b, -1, h, c // h).transpose(1, 2)
    k = attn.to_k(ctx).view(b, -1, h, c // h).transpose(1, 2)
    v = attn.to_v(ctx).view(b, -1, h, c // h).transpose(1, 2)
    probs = torch.softmax(q @ k.transpose(-1, -2) * (c // h) ** -0.5, dim=-1)
    o = (probs @ v).transpose(1, 2).reshape(b, n, c)
    return attn.to_out[1](attn.to_out[0](o))


class RefAttn:
    """The extension's hacked self-attention, as a diffusers attention processor."""

    def __init__(self, state: State, threshold: float) -> None:
        self.state, self.threshold = state, threshold
        self.bank: list[torch.Tensor] = []
        self.fids: list[float] = []

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kw):
        assert encoder_hidden_states is None
        x, st = hidden_states, self.state
        if st.mode == "write":
            if st.attn_write and st.weight > self.threshold:
                self.bank.append(x.detach().clone())
                self.fids.append(st.fidelity)
            return attend(attn, x, x)
        if st.mode == "read" and self.bank:
            sf = sum(self.fids) / len(self.fids)
            uc = attend(attn, x, torch.cat([x, *self.bank], dim=1))
            c = uc.clone()
            if st.uncond_rows and sf > 1e-5:
                c[st.uncond_rows] = attend(attn, x[st.uncond_rows], x[st.uncond_rows])
            self.bank, self.fids = [], []
            return sf * c + (1.0 - sf) * uc
        self.bank, self.fids = [], []
        return attend(attn, x, x)


class AdaIN:
    """The extension's ``hacked_group_norm_forward`` as a forward hook on the module whose output is the LDM block's."""

    def __init__(self, state: State, threshold: float) -> None:
        self.state, self.threshold = state, threshold
        self.means: list[torch.Tensor] = []
        self.vars: list[torch.Tensor] = []
        self.fids: list[float] = []

    def __call__(self, module, args, output):
        x = output[0] if isinstance(output, tuple) else output
        st, eps = self.state, 1e-6
        y = None
        if st.mode == "write" and st.gn_write and st.weight > self.threshold:
            var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True, correction=0)
            self.means.append(mean)
            self.vars.append(var)
            self.fids.append(st.fidelity)
        if st.mode == "read":
            if self.means:
                sf = sum(self.fids) / len(self.fids)
                var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True, correction=0)
                std = torch.maximum(var, torch.zeros_like(var) + eps) ** 0.5
                mean_acc = sum(self.means) / len(self.means)
                var_acc = sum(self.vars) / len(self.vars)
                std_acc = torch.maximum(var_acc, torch.zeros_like(var_acc) + eps) ** 0.5
                y_uc = (x - mean) / std * std_acc + mean_acc
                y_c = y_uc.clone()
                if st.uncond_rows and sf > 1e-5:
                    y_c[st.uncond_rows] = x[st.uncond_rows]
                y = sf * y_c + (1.0 - sf) * y_uc
            self.means, self.vars, self.fids = [], [], []
        if y is None:
            return output
        return (y, *output[1:]) if isinstance(output, tuple) else y


def gn_modules(unet) -> list[tuple[str, float]]:
    """The diffusers modules whose outputs are the LDM blocks the extension wraps, with its gn_weight (times 2):
    the middle block; the resnet / attention pairs of every down level but the first; the first two thirds of the
    output blocks (a level's last pair's output is its upsampler's): the extension's SD 1.x input blocks 4, 5, 7, 8,
    10, 11 and output blocks 0 to 7 of 12, SDXL's 4, 5, 7, 8 and 0 to 5 of 9."""
    inputs, outputs = [], []
    for b, block in enumerate(unet.down_blocks):
        if b == 0:
            continue
        for j in range(len(block.resnets)):
            has_attn = getattr(block, "attentions", None) is not None and j < len(block.attentions)
            inputs.append(f"down_blocks.{b}.{'attentions' if has_attn else 'resnets'}.{j}")
    for b, block in enumerate(unet.up_blocks):
        for j in range(len(block.resnets)):
            has_attn = getattr(block, "attentions", None) is not None and j < len(block.attentions)
            last = j == len(block.resnets) - 1 and block.upsamplers is not None
            outputs.append(f"up_blocks.{b}.upsamplers.0" if last else
                           f"up_blocks.{b}.{'attentions' if has_attn else 'resnets'}.{j}")
    outputs = outputs[: 2 * len(outputs) // 3]
    mods = [("mid_block", 0.0)]
    mods += [(n, 2 * (1.0 - w / len(inputs))) for w, n in enumerate(inputs)]
    mods += [(n, 2 * (w / len(outputs))) for w, n in enumerate(outputs)]
    return mods


def on(unit: dict, step: int, total: int) -> bool:
    start, end = unit.get("start", 0.0), unit.get("end", 1.0)
    if unit.get("window", "diffusers") == "a1111":
        return start <= step / total <= end
    return not (step / total < start or (step + 1) / total > end)


def fidelity(unit: dict, xl: bool) -> float:
    sf = min(max(unit["fidelity"], 0.0), 1.0)
    if xl:
        sf = sf ** 3.0
    mode = unit.get("control_mode", "Balanced")
    if mode == "ControlNet is more important":
        return 1.0
    if mode == "My prompt is more important":
        return 0.0
    return sf


def run_case(pipe, case: dict, pics: list[np.ndarray]) -> np.ndarray:
    unet = pipe.unet
    xl = "XL" in type(pipe).__name__
    state = State()
    layers = sorted((n[: -len(".processor")] for n in unet.attn_processors if n.endswith("attn1.processor")),
                    key=block_key)
    ranked = sorted(layers, key=lambda n: -unet.get_submodule(n).to_q.weight.shape[0])
    procs = {}
    for name, proc in unet.attn_processors.items():
        mod = name[: -len(".processor")]
        procs[name] = RefAttn(state, ranked.index(mod) / len(ranked)) if mod in ranked else proc
    unet.set_attn_processor(procs)
    handles = [unet.get_submodule(n).register_forward_hook(AdaIN(state, thr)) for n, thr in gn_modules(unet)]
    sa, s1a = ldm_sqrt_alphas()
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    with torch.no_grad():
        lats = []
        for u in case["units"]:
            px = torch.from_numpy(pics[u["picture"]]).float().permute(2, 0, 1)[None] / 255.0
            lats.append(pipe.vae.encode(px * 2 - 1).latent_dist.mean * pipe.vae.config.scaling_factor)
    forward = unet.forward
    calls = [0]

    def wrapped(sample, timestep, encoder_hidden_states, *args, **kwargs):
        step = calls[0]
        calls[0] += 1
        rows = sample.shape[0]
        t = int(torch.round(torch.as_tensor(timestep).float().reshape(-1)[0]))
        for u, lat in zip(case["units"], lats):
            if not on(u, step, case["steps"]):
                continue
            noise = torch.randn((rows, *lat.shape[1:]), generator=gen)
            ref_xt = sa[t] * lat.repeat(rows, 1, 1, 1) + s1a[t] * noise
            state.mode, state.weight, state.fidelity = "write", u["weight"], fidelity(u, xl)
            module = u.get("module", "reference_only")
            state.attn_write = module in ("reference_only", "reference_adain+attn")
            state.gn_write = module in ("reference_adain", "reference_adain+attn")
            forward(ref_xt, timestep, encoder_hidden_states, *args, **kwargs)
        state.mode = "read"
        state.uncond_rows = list(range(rows // 2)) if case["cfg"] > 1 else []
        try:
            return forward(sample, timestep, encoder_hidden_states, *args, **kwargs)
        finally:
            state.mode = None

    unet.forward = wrapped
    try:
        sched = gp.SCHEDULERS["Euler"](pipe.scheduler.config)
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
        p.set_progress_bar_config(disable=True)
        out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], num_inference_steps=case["steps"],
                guidance_scale=case["cfg"], height=64, width=64, generator=gen, output_type="np")
    finally:
        unet.forward = forward
        for handle in handles:
            handle.remove()
    assert calls[0] == case["steps"], calls
    return (out.images * 255).round().astype(np.uint8)


def main() -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    pipe = gp.build("sd15")
    pics = pictures()
    refs: dict[str, np.ndarray] = {f"picture{k}": p for k, p in enumerate(pics)}
    for case in CASES:
        refs[case["name"]] = run_case(pipe, case, pics)
        print(case["name"], float(refs[case["name"]].std()))
    sched = gp.SCHEDULERS["Euler"](pipe.scheduler.config)
    p = type(pipe)(**{**pipe.components, "scheduler": sched})
    p.set_progress_bar_config(disable=True)
    c = CASES[0]
    out = p(prompt=c["prompt"], negative_prompt=c["negative_prompt"], num_inference_steps=c["steps"],
            guidance_scale=c["cfg"], height=64, width=64, generator=torch.Generator().manual_seed(c["seed"]),
            output_type="np")
    refs["plain"] = (out.images * 255).round().astype(np.uint8)  # the first case without the unit
    xl = gp.build("sdxl")
    for case in XL_CASES:
        refs[case["name"]] = run_case(xl, case, pics)
        print(case["name"], float(refs[case["name"]].std()))
    np.savez_compressed(OUT / "refs.npz", **refs)
    (OUT / "refs.json").write_text(json.dumps(CASES + XL_CASES, indent=1) + "\n")


if __name__ == "__main__":
    main()
