"""Write tests/pipelines/data/a1111_timestep_steps.json: what A1111's DDIM, PLMS and UniPC run in img2img, from its own
functions (torch needed: /work/refvenv).

A1111's source is read, never copied: pass a folder whose ``modules/`` holds its ``sd_samplers_common.py``,
``sd_samplers_timesteps.py`` and ``sd_samplers_timesteps_impl.py`` (a stable-diffusion-webui checkout, read-only,
never committed)::

    /work/refvenv/bin/python scripts/gen_a1111_timestep_refs.py --a1111 /tmp/a1111

A1111's "timesteps" samplers (``CompVisSampler``: DDIM, PLMS, UniPC) cut img2img differently from its k-diffusion
ones: ``sample_img2img`` takes ``setup_img2img_steps`` (``img2img_fix_steps`` off and on; the hires pass passes its
steps), ``get_timesteps`` (``range(0, 1000, 1000 // steps) + 1``), keeps ``timesteps[:t_enc]``, noises the image
latent to ``timesteps[t_enc]`` and hands the sampler the kept ones. ``CompVisSampler.sample_img2img`` is taken out of
the file with ``ast`` and run as A1111 runs it, on stand-ins for ``p``, ``opts``, ``shared.sd_model`` (SD's
scaled-linear ``alphas_cumprod``) and the CFG denoiser: a model whose noise prediction is 0, recording the timestep
of every call. Each row: the sampler, ``steps``, ``strength``, ``fix`` (``img2img_fix_steps``), ``hires`` (the
steps given, as the hires pass gives them), the step count A1111 shows (``launch_sampling``'s), the timestep the
latent is noised to, the timesteps of the model's calls in order, and the factor the latent ends scaled by (the
sampler's last alpha over its first, with a prediction of 0). UniPC runs A1111's own solver
(``modules/models/diffusion/uni_pc/uni_pc.py``, imported from the checkout, and ``UniPCCFG``) with A1111's defaults
(order 3, ``time_uniform``, ``bh1``, lower order at the end) on a model whose noise prediction is
``0.2 x + 0.001 t`` (``t`` its input time): the ``steps`` and ``t_start`` the solver is given, the input time of every
call, and the latent it ends with from a latent of 1 noised to ``timesteps[t_enc]`` (``null`` where A1111's
solver refuses: fewer steps than its order).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

STEPS = (1, 2, 3, 5, 7, 10, 20, 25, 30, 50)
STRENGTHS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.33, 0.5, 0.7, 0.75, 0.9, 0.999, 1.0)
HIRES = ((10, 0.7), (20, 0.5), (4, 0.45), (7, 0.999), (2, 0.5))
OUT = Path(__file__).resolve().parents[1] / "tests" / "pipelines" / "data" / "a1111_timestep_steps.json"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _function(tree: ast.Module, name: str, cls: str | None = None) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and cls is not None and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
        if cls is None and isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise SystemExit(f"{name} not found in A1111's source")


def _compile(fn: ast.FunctionDef, env: dict) -> object:
    fn.decorator_list = []  # @torch.no_grad(): nothing here needs grads
    module = ast.Module(body=[fn], type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), "<a1111>", "exec"), env)
    return env[fn.name]


def alphas_cumprod() -> torch.Tensor:
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, dim=0).to(torch.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a1111", type=Path, required=True, help="a folder holding A1111's modules/")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    mods = args.a1111 / "modules"
    ac = alphas_cumprod()
    opts = SimpleNamespace(img2img_fix_steps=False, always_discard_next_to_last_sigma=False, img2img_extra_noise=0,
                           uni_pc_variant="bh1", uni_pc_skip_type="time_uniform", uni_pc_order=3,
                           uni_pc_lower_order_final=True)
    common = SimpleNamespace()
    env: dict = {"opts": opts, "torch": torch, "np": np, "inspect": inspect}
    common.setup_img2img_steps = _compile(_function(_tree(mods / "sd_samplers_common.py"), "setup_img2img_steps"), env)

    class Trange:  # tqdm.trange
        @staticmethod
        def trange(n, disable=None):
            return range(n)

    import importlib.util

    spec = importlib.util.spec_from_file_location("uni_pc", mods / "models" / "diffusion" / "uni_pc" / "uni_pc.py")
    uni_pc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(uni_pc)
    unipc_seen: dict = {}
    real_sample = uni_pc.UniPC.sample

    def recording_sample(self, x, **kw):  # what A1111's unipc hands its solver, then the solver itself
        unipc_seen.update(steps=int(kw["steps"]), t_start=None if kw["t_start"] is None else float(kw["t_start"]))
        return real_sample(self, x, **kw)

    uni_pc.UniPC.sample = recording_sample
    impl_env = {"torch": torch, "np": np, "tqdm": Trange, "shared": SimpleNamespace(opts=opts),
                "k_diffusion": SimpleNamespace(sampling=SimpleNamespace(torch=torch)), "uni_pc": uni_pc}
    impl = _tree(mods / "sd_samplers_timesteps_impl.py")
    cls = next(n for n in ast.walk(impl) if isinstance(n, ast.ClassDef) and n.name == "UniPCCFG")
    exec(compile(ast.fix_missing_locations(ast.Module(body=[cls], type_ignores=[])), "<a1111>", "exec"), impl_env)
    funcs = {name: _compile(_function(impl, name), impl_env) for name in ("ddim", "plms", "unipc")}
    tree = _tree(mods / "sd_samplers_timesteps.py")
    env.update(sd_samplers_common=common, devices=SimpleNamespace(device="cpu"),
               shared=SimpleNamespace(sd_model=SimpleNamespace(alphas_cumprod=ac)))
    get_timesteps = _compile(_function(tree, "get_timesteps", "CompVisSampler"), env)
    sample_img2img = _compile(_function(tree, "sample_img2img", "CompVisSampler"), env)

    calls: list[int] = []

    class Model:  # the CFG denoiser: a noise prediction of 0, its timestep recorded
        inner_model = SimpleNamespace(inner_model=SimpleNamespace(alphas_cumprod=ac))
        padded_cond_uncond = False

        linear = False

        def __call__(self, x, t, **kw):
            if self.linear:  # UniPC: its input time is continuous
                calls.append(float(t.reshape(-1)[0].item()))
                return 0.2 * x + 0.001 * t.reshape(-1)[0].to(x.dtype)
            calls.append(int(t.reshape(-1)[0].item()))
            return torch.zeros_like(x)

    def run(label: str, steps: int, strength: float, fix: bool, given: int | None) -> dict:
        opts.img2img_fix_steps = fix
        calls.clear()
        unipc_seen.clear()
        shown: list[int] = []
        p = SimpleNamespace(steps=steps, denoising_strength=strength, cfg_scale=7.0, extra_generation_params={})
        wrap = Model()
        wrap.linear = label == "UniPC"
        self = SimpleNamespace(config=None, func=funcs[label.lower()], model_wrap_cfg=wrap, s_min_uncond=0.0,
                               initialize=lambda p: {}, callback_state=lambda d: None)
        self.get_timesteps = lambda p, n: get_timesteps(self, p, n)
        self.launch_sampling = lambda n, f: (shown.append(n), f())[1]
        x, noise = torch.ones(1, 1, 1, 1), torch.zeros(1, 1, 1, 1)
        row: dict = {"sampler": label, "steps": steps, "strength": strength, "fix": fix, "hires": given}
        try:
            out = sample_img2img(self, p, x, noise, None, None, steps=given)
        except (ValueError, ZeroDivisionError, IndexError) as exc:  # 1000 // steps = 0: range() of step 0
            row["error"] = type(exc).__name__
            return row
        except AssertionError:  # UniPC: fewer steps than its order
            out = None
        # the timestep the latent was noised to, and the latent then: x = 1, noise = 0 became sqrt(alphas_cumprod[t])
        length, t_enc = common.setup_img2img_steps(p, given)
        noised = int(get_timesteps(self, p, length)[t_enc])
        xi = float(torch.sqrt(ac[noised]))
        if label == "UniPC":
            row.update(shown=t_enc + 1, noise_t=noised, unipc_steps=unipc_seen["steps"],
                       unipc_t_start=unipc_seen["t_start"], calls=list(calls) if out is not None else None,
                       out=float(out.reshape(-1)[0]) if out is not None else None)
            return row
        row.update(shown=shown[0], noise_t=noised, calls=list(calls), scale=float(out.reshape(-1)[0]) / xi)
        return row

    rows = []
    for label in ("DDIM", "PLMS", "UniPC"):
        for steps in STEPS:
            for strength in STRENGTHS:
                for fix in (False, True):
                    rows.append(run(label, steps, strength, fix, None))
        for steps, strength in HIRES:
            rows.append(run(label, steps, strength, False, steps))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, separators=(",", ":")) + "\n")
    print(args.out, len(rows), "rows")


if __name__ == "__main__":
    main()
