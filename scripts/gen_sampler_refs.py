"""Generate the golden data for tests/samplers from the real reference implementations (needs torch).

Run once, commit the .npz files; the tests then need no torch::

    python -m venv /work/venv-refs
    /work/venv-refs/bin/pip install torch==2.13.0 diffusers scipy torchsde torchdiffeq tqdm pillow safetensors
    /work/venv-refs/bin/pip install --no-deps k-diffusion          # pulls torchvision otherwise
    git clone https://github.com/comfyanonymous/ComfyUI /tmp/comfyui   # read-only, never committed
    /work/venv-refs/bin/python scripts/gen_sampler_refs.py --comfyui /tmp/comfyui --out tests/samplers/data

What it records:

- ``randn.npz``: ``torch.randn(shape, generator=torch.Generator().manual_seed(seed))``
  for many seeds (near 0, 2**31, 2**32, 2**63, 2**64) and odd shapes; small
  outputs in full, large ones as a SHA-256 of the float32 bytes plus their
  first and last 16 values; and three successive draws from one generator.
- ``schedules.npz``: sigmas from k-diffusion (karras, exponential,
  polyexponential), ComfyUI's scheduler functions (normal, simple,
  sgm_uniform, ddim_uniform, beta, linear_quadratic, kl_optimal) on its
  ModelSamplingDiscrete / ModelSamplingDiscreteFlow (SD3, shift 3) /
  ModelSamplingFlux, its Align Your Steps node, and diffusers'
  FlowMatchEulerDiscreteScheduler (SD3 shift, Flux dynamic shift) and
  Flux's ``calculate_shift``.
- ``samplers.npz``: final latents of k-diffusion's and ComfyUI's samplers on
  a closed-form denoiser (the exact denoiser of a Gaussian data
  distribution), in float64, with the per-step noise given explicitly (the
  k-th call of the noise sampler returns the k-th array of a fixed list; the
  arguments of each call are recorded too); diffusers' DDIMScheduler on the
  matching eps-prediction model; ComfyUI's euler_ancestral in float32 with its
  own seeded CPU noise.
- ``samplers_eta.npz``: k-diffusion's ancestral and SDE samplers with eta
  and s_noise other than 0 and 1 (``ETA_CASES``), and its Euler, Heun and
  DPM2 with churn (``s_churn``) and s_noise other than 1 (``CHURN_CASES``; their
  ``torch.randn_like`` draws come from the same noise list), on the same model;
  written alone by ``--eta-only`` (needs k-diffusion, not ComfyUI).
- ``samplers_dpm.npz``: k-diffusion's ``sample_dpm_fast`` (model-call budgets ``DPM_FAST_CALLS``, eta 0,
  and ``DPM_ETA_CASES`` with the noise list) and ``sample_dpm_adaptive`` (``DPM_ADAPTIVE_CASES``) on the
  same model, each with its trajectory (the callback's sigma and x at each step or attempt) and the
  adaptive runs' accepted/rejected step counts; written alone by ``--dpm-only`` (k-diffusion alone).
- ``samplers_plms.npz``: diffusers' ``PNDMScheduler`` with ``skip_prk_steps=True`` (PLMS; SD 1.x's
  default scheduler config) on the eps-prediction model of the same Gaussian data, for ``PLMS_STEPS``:
  its timesteps, final alpha and the sample after every transition (the first one's predictor call
  left out); written alone by ``--plms-only`` (diffusers alone).

Run it with the venv that has torch; nothing in sdrt imports torch.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import importlib.util
import math
import sys
import types
from pathlib import Path

import numpy as np
import torch

# -- the closed-form model: its inputs come from the tests' own module, so both sides use one definition --

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "samplers"))
from _sampler_refs import DATA_STD, data_mean, noise_list, start_noise  # noqa: E402


class ListNoise:
    """The k-th call returns the k-th array; records the (sigma, sigma_next) of each call."""

    def __init__(self, arrays: np.ndarray, dtype: torch.dtype = torch.float64) -> None:
        self.arrays = arrays
        self.dtype = dtype
        self.calls: list[tuple[float, float]] = []

    def __call__(self, sigma, sigma_next):  # noqa: ANN001
        k = len(self.calls)
        self.calls.append((float(sigma), float(sigma_next)))
        return torch.from_numpy(self.arrays[k]).to(self.dtype)


def ve_denoiser(mu: torch.Tensor):  # noqa: ANN201
    s2 = DATA_STD**2

    def model(x, sigma, **kw):  # noqa: ANN001, ANN003
        sig = sigma.reshape(-1)[0] if torch.is_tensor(sigma) else torch.tensor(sigma)
        sig2 = sig.to(x.dtype) ** 2
        return (s2 * x + sig2 * mu.to(x.dtype)) / (s2 + sig2)

    return model


def flow_denoiser(mu: torch.Tensor):  # noqa: ANN201
    s2 = DATA_STD**2

    def model(x, sigma, **kw):  # noqa: ANN001, ANN003
        sig = (sigma.reshape(-1)[0] if torch.is_tensor(sigma) else torch.tensor(sigma)).to(x.dtype)
        a = 1 - sig
        m = mu.to(x.dtype)
        return m + a * s2 / (a * a * s2 + sig * sig) * (x - a * m)

    return model


# -- loading the references -----------------------------------------------------------------------


def load_kdiffusion():  # noqa: ANN201
    """k-diffusion's sampling module without its package __init__ (which needs torchvision)."""
    spec = importlib.util.find_spec("k_diffusion")
    root = Path(spec.submodule_search_locations[0])
    tv = types.ModuleType("torchvision")
    tv.transforms = types.ModuleType("torchvision.transforms")
    tv.transforms.functional = types.ModuleType("torchvision.transforms.functional")
    sys.modules.setdefault("torchvision", tv)
    sys.modules.setdefault("torchvision.transforms", tv.transforms)
    sys.modules.setdefault("torchvision.transforms.functional", tv.transforms.functional)
    pkg = types.ModuleType("k_diffusion")
    pkg.__path__ = [str(root)]
    sys.modules["k_diffusion"] = pkg
    return importlib.import_module("k_diffusion.sampling")


def _functions_from(path: Path, names: set[str], namespace: dict) -> dict:
    """Execute only the named top-level defs/assignments of a file (no module-level imports)."""
    tree = ast.parse(path.read_text())
    body = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            body.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) in names for t in node.targets):
            body.append(node)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace


def load_comfy(checkout: Path):  # noqa: ANN201
    """ComfyUI's sampling, model_sampling, uni_pc and scheduler functions from a checkout."""
    sys.path.insert(0, str(checkout))
    util = types.ModuleType("comfy.ldm.modules.diffusionmodules.util")
    util.__dict__.update(_functions_from(checkout / "comfy/ldm/modules/diffusionmodules/util.py",
                                         {"make_beta_schedule"}, {"torch": torch, "np": np, "math": math}))
    for name in ("comfy.ldm", "comfy.ldm.modules", "comfy.ldm.modules.diffusionmodules"):
        mod = types.ModuleType(name)
        mod.__path__ = []
        sys.modules[name] = mod
    sys.modules["comfy.ldm.modules.diffusionmodules.util"] = util
    from tqdm.auto import trange

    stubs = {"comfy.model_patcher": {}, "comfy.memory_management": {}, "comfy.utils": {"model_trange": trange}}
    for name, attrs in stubs.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
    ms = importlib.import_module("comfy.model_sampling")
    sampling = importlib.import_module("comfy.k_diffusion.sampling")
    uni_pc = importlib.import_module("comfy.extra_samplers.uni_pc")
    import functools

    import scipy.stats

    sched = _functions_from(
        checkout / "comfy/samplers.py",
        {"simple_scheduler", "ddim_scheduler", "normal_scheduler", "beta_scheduler",
         "linear_quadratic_schedule", "kl_optimal_scheduler"},
        {"torch": torch, "numpy": np, "scipy": scipy, "math": math, "partial": functools.partial},
    )
    ays = _functions_from(checkout / "comfy_extras/nodes_align_your_steps.py", {"loglinear_interp", "NOISE_LEVELS"},
                          {"np": np})
    # ComfyUI's model_base mixes a sampling table with a prediction type; do the same.
    ms.Eps = type("ModelSamplingEps", (ms.ModelSamplingDiscrete, ms.EPS), {})
    ms.SD3 = type("ModelSamplingSD3", (ms.ModelSamplingDiscreteFlow, ms.CONST), {})
    return types.SimpleNamespace(ms=ms, sampling=sampling, uni_pc=uni_pc, sched=sched, ays=ays)


# -- comfy model wrapper ---------------------------------------------------------------------------


class ComfyModel:
    """Enough of ComfyUI's model wrapper chain for its samplers to find model_sampling."""

    def __init__(self, fn, model_sampling) -> None:  # noqa: ANN001
        self.fn = fn
        inner = types.SimpleNamespace(model_sampling=model_sampling)
        patcher = types.SimpleNamespace(get_model_object=lambda name: model_sampling)
        self.inner_model = types.SimpleNamespace(inner_model=inner, model_patcher=patcher)

    def __call__(self, x, sigma, **kw):  # noqa: ANN001, ANN003
        kw.pop("seed", None)
        return self.fn(x, sigma, **kw)


# -- generators ----------------------------------------------------------------------------------------

RANDN_SEEDS = [0, 1, 2, 3, 42, 1234, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**33 + 7,
               2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1, -1, -2, -(2**63)]
RANDN_SHAPES = [(1,), (2,), (3,), (7,), (15,), (16,), (17,), (31,), (32,), (33,), (47,), (3, 5), (4, 4),
                (1, 4, 3, 3), (2, 3, 5, 7), (1, 4, 8, 8), (1, 4, 9, 11), (1, 16, 13, 13), (1, 4, 64, 64),
                (2, 4, 96, 96), (1, 16, 128, 128)]
SMALL = 64


def gen_randn(out: Path) -> None:
    rng = np.random.default_rng(7)
    seeds = RANDN_SEEDS + [int(v) for v in rng.integers(0, 2**63, 12)]
    # One array per kind (a zip member per case would cost more than the data).
    rows, full, heads, tails, shas = [], [], [], [], []
    for si, seed in enumerate(seeds):
        for hi, shape in enumerate(RANDN_SHAPES):
            if int(np.prod(shape)) > 20000 and si % 4:
                continue
            flat = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).numpy().reshape(-1)
            if flat.size <= SMALL:
                rows.append((si, hi, 0, sum(len(f) for f in full)))
                full.append(flat)
            else:
                rows.append((si, hi, 1, len(heads)))
                heads.append(flat[:16])
                tails.append(flat[-16:])
                shas.append(np.frombuffer(hashlib.sha256(flat.astype("<f4").tobytes()).digest(), np.uint8))
    data: dict[str, np.ndarray] = {
        "seeds": np.array([str(s) for s in seeds]),
        "shapes": np.array([",".join(map(str, s)) for s in RANDN_SHAPES]),
        "cases": np.array(rows, dtype=np.int64),  # seed index, shape index, hashed?, offset/row
        "full": np.concatenate(full),
        "heads": np.stack(heads),
        "tails": np.stack(tails),
        "sha256": np.stack(shas),
    }
    g = torch.Generator().manual_seed(2024)
    data["seq"] = np.concatenate([torch.randn(shape, generator=g).numpy().reshape(-1)
                                  for shape in [(2, 4, 6, 6), (5,), (2, 4, 6, 6)]])
    np.savez_compressed(out / "randn.npz", **data)
    print("randn:", len(rows), "cases")


STEPS = [1, 2, 4, 10, 25]


def gen_schedules(out: Path, kd, comfy) -> None:  # noqa: ANN001
    data: dict[str, np.ndarray] = {}
    disc = comfy.ms.ModelSamplingDiscrete()
    sd3 = comfy.ms.ModelSamplingDiscreteFlow()
    sd3.set_parameters(shift=3.0, multiplier=1000)
    flux = comfy.ms.ModelSamplingFlux()
    flux.set_parameters(shift=1.15)
    models = {"eps": disc, "sd3": sd3, "flux": flux}
    data["discrete_sigmas"] = disc.sigmas.double().numpy()
    for mname, m in models.items():
        smin, smax = float(m.sigma_min), float(m.sigma_max)
        for n in STEPS:
            data[f"karras_{mname}_{n}"] = kd.get_sigmas_karras(n, smin, smax).double().numpy()
            data[f"exponential_{mname}_{n}"] = kd.get_sigmas_exponential(n, smin, smax).double().numpy()
            data[f"polyexponential_{mname}_{n}"] = kd.get_sigmas_polyexponential(n, smin, smax, rho=1.0).double().numpy()
            data[f"kl_optimal_{mname}_{n}"] = comfy.sched["kl_optimal_scheduler"](n, smin, smax).double().numpy()
            for name, fn in (("normal", "normal_scheduler"), ("simple", "simple_scheduler"),
                             ("ddim_uniform", "ddim_scheduler"), ("beta", "beta_scheduler"),
                             ("linear_quadratic", "linear_quadratic_schedule")):
                data[f"{name}_{mname}_{n}"] = comfy.sched[fn](m, n).double().numpy()
            data[f"sgm_uniform_{mname}_{n}"] = comfy.sched["normal_scheduler"](m, n, sgm=True).double().numpy()
    for model_type in ("SD1", "SDXL"):
        for n in STEPS + [10, 30]:
            levels = comfy.ays["NOISE_LEVELS"][model_type][:]
            sig = levels if n + 1 == len(levels) else comfy.ays["loglinear_interp"](levels, n + 1)
            sig = np.array(sig, dtype=np.float64)
            sig[-1] = 0
            data[f"ays_{model_type}_{n}"] = torch.FloatTensor(sig).double().numpy()
    # diffusers flow-matching schedules (SD3 constant shift, Flux dynamic shift).
    from diffusers import FlowMatchEulerDiscreteScheduler
    # Flux's calculate_shift, taken from diffusers' pipeline file (importing it needs transformers).
    flux_file = Path(importlib.util.find_spec("diffusers").submodule_search_locations[0]) / "pipelines/flux/pipeline_flux.py"
    calculate_shift = _functions_from(flux_file, {"calculate_shift"}, {})["calculate_shift"]

    for n in (4, 10, 28):
        s = FlowMatchEulerDiscreteScheduler(shift=3.0)
        s.set_timesteps(n)
        data[f"diffusers_sd3_{n}"] = s.sigmas.double().numpy()
        for w, h in ((512, 512), (1024, 1024), (768, 1344)):
            seq = (h // 16) * (w // 16)
            mu = calculate_shift(seq, 256, 4096, 0.5, 1.15)
            f = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
            f.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n), mu=mu)
            data[f"diffusers_flux_{n}_{w}x{h}"] = f.sigmas.double().numpy()
            data[f"diffusers_flux_mu_{w}x{h}"] = np.array(mu)
    # sigma <-> t on the discrete model (k-diffusion's interpolating DiscreteSchedule).
    from k_diffusion import external

    class _Fake(torch.nn.Module):
        alphas_cumprod = torch.cumprod(1 - torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2, 0)

    den = external.CompVisDenoiser(_Fake(), quantize=False) if hasattr(external, "CompVisDenoiser") else None
    probe = torch.tensor([0.03, 0.1, 0.5, 1.0, 3.3, 7.0, 14.6], dtype=torch.float64)
    data["t_probe_sigma"] = probe.numpy()
    data["t_probe_t"] = den.sigma_to_t(probe).double().numpy()
    data["t_probe_back"] = den.t_to_sigma(torch.tensor([0.0, 0.5, 10.25, 500.7, 998.9, 999.0], dtype=torch.float64)).double().numpy()
    np.savez_compressed(out / "schedules.npz", **data)
    print("schedules:", len(data), "arrays")


KD_SAMPLERS = ["euler", "euler_ancestral", "heun", "dpm_2", "dpm_2_ancestral", "lms", "dpmpp_2s_ancestral",
               "dpmpp_sde", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_2m_sde_heun", "dpmpp_3m_sde"]
COMFY_EXTRA = ["ddpm", "lcm", "ipndm", "deis", "uni_pc", "uni_pc_bh2"]
STOCHASTIC = {"euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde", "dpmpp_2m_sde",
              "dpmpp_2m_sde_heun", "dpmpp_3m_sde", "ddpm", "lcm"}
FLOW_SAMPLERS = ["euler", "heun", "euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde",
                 "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_3m_sde", "lcm", "ipndm"]


def _run(fn, model, x, sigmas, name, extra=None):  # noqa: ANN001, ANN201
    kwargs = {}
    noise = None
    if name in STOCHASTIC:
        noise = ListNoise(noise_list(64))
        kwargs["noise_sampler"] = noise
    if name == "dpmpp_2m_sde_heun":
        kwargs["solver_type"] = "heun"
    with torch.no_grad():
        # A fresh copy each time: ComfyUI's uni_pc writes 0.001 into sigmas[-1] in place.
        y = fn(model, x.clone(), sigmas.clone(), extra_args=extra or {}, disable=True, **kwargs)
    calls = np.array(noise.calls, dtype=np.float64).reshape(-1, 2) if noise is not None else np.zeros((0, 2))
    return y.double().numpy(), calls


def gen_samplers(out: Path, kd, comfy) -> None:  # noqa: ANN001
    torch.set_default_dtype(torch.float64)
    mu = torch.from_numpy(data_mean())
    data: dict[str, np.ndarray] = {}
    disc = comfy.ms.ModelSamplingDiscrete()
    eps_sigmas = {
        "karras10": kd.get_sigmas_karras(10, 0.0291675, 14.614642).double(),
        "normal8": torch.from_numpy(comfy.sched["normal_scheduler"](disc, 8).double().numpy()),
    }
    x0 = torch.from_numpy(start_noise())
    for sname, sig in eps_sigmas.items():
        data[f"sigmas_{sname}"] = sig.numpy().copy()
        x = x0 * sig[0]
        for name in KD_SAMPLERS:
            fn = getattr(kd, "sample_" + ("dpmpp_2m_sde" if name == "dpmpp_2m_sde_heun" else name))
            y, calls = _run(fn, ve_denoiser(mu), x, sig, name)
            data[f"kd_{name}_{sname}"], data[f"kdcalls_{name}_{sname}"] = y, calls
        cmodel = ComfyModel(ve_denoiser(mu), comfy.ms.Eps())
        for name in KD_SAMPLERS + COMFY_EXTRA:
            if name == "uni_pc":
                fn = comfy.uni_pc.sample_unipc
            elif name == "uni_pc_bh2":
                fn = comfy.uni_pc.sample_unipc_bh2
            else:
                fn = getattr(comfy.sampling, "sample_" + name)
            y, calls = _run(fn, cmodel, x, sig, name)
            data[f"comfy_{name}_{sname}"], data[f"comfycalls_{name}_{sname}"] = y, calls
    # Flow matching (SD3, shift 3) through ComfyUI's flow-aware samplers.
    sd3 = comfy.ms.SD3()
    sd3.set_parameters(shift=3.0, multiplier=1000)
    fsig = torch.from_numpy(comfy.sched["simple_scheduler"](sd3, 8).double().numpy())
    data["sigmas_flow8"] = fsig.numpy().copy()
    fmodel = ComfyModel(flow_denoiser(mu), sd3)
    xf = x0 * fsig[0] + (1 - fsig[0]) * 0  # noise_scaling for a pure-noise start
    for name in FLOW_SAMPLERS:
        y, calls = _run(getattr(comfy.sampling, "sample_" + name), fmodel, xf, fsig, name)
        data[f"comfyflow_{name}_flow8"], data[f"comfyflowcalls_{name}_flow8"] = y, calls
    # ComfyUI euler_ancestral in float32 with its own seeded CPU noise (seed + 1 generator).
    torch.set_default_dtype(torch.float32)
    sig32 = eps_sigmas["karras10"].float()
    cmodel = ComfyModel(ve_denoiser(mu.float()), comfy.ms.Eps())
    with torch.no_grad():
        y = comfy.sampling.sample_euler_ancestral(cmodel, (x0.float() * sig32[0]), sig32, extra_args={"seed": 31337},
                                                  disable=True)
    data["comfy32_euler_ancestral_seed31337"] = y.numpy()
    # diffusers DDIM (eta 0) on the eps-prediction model of the same Gaussian data.
    from diffusers import DDIMScheduler

    torch.set_default_dtype(torch.float64)
    sch = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                        clip_sample=False, set_alpha_to_one=False, steps_offset=1, timestep_spacing="leading")
    sch.set_timesteps(10)
    ac = sch.alphas_cumprod.double()
    sample = x0.clone() * 1.0
    den = ve_denoiser(mu)
    for t in sch.timesteps:
        a = ac[int(t)]
        sigma = ((1 - a) / a).sqrt()
        x_ve = sample / a.sqrt()
        eps = (x_ve - den(x_ve, sigma)) / sigma
        sample = sch.step(eps, t, sample, eta=0.0).prev_sample
    data["diffusers_ddim_timesteps"] = sch.timesteps.numpy().astype(np.int64)
    data["diffusers_ddim_final"] = sample.double().numpy()
    data["diffusers_ddim_final_alpha"] = np.array(float(ac[0]))
    # eta = 0.7 with the k-th step's variance noise taken from the fixed noise list.
    noises = noise_list(64)
    sample = x0.clone()
    for k, t in enumerate(sch.timesteps):
        a = ac[int(t)]
        sigma = ((1 - a) / a).sqrt()
        x_ve = sample / a.sqrt()
        eps = (x_ve - den(x_ve, sigma)) / sigma
        sample = sch.step(eps, t, sample, eta=0.7, variance_noise=torch.from_numpy(noises[k])).prev_sample
    data["diffusers_ddim_eta07_final"] = sample.double().numpy()
    np.savez_compressed(out / "samplers.npz", **data)
    print("samplers:", len(data), "arrays")


#: the k-diffusion samplers that take eta and s_noise, and the (eta, s_noise) pairs recorded for each: an eta
#: applied to the variance instead of the standard deviation, or s_noise dropped or squared, differs at these
ETA_SAMPLERS = ["euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde", "dpmpp_2m_sde",
                "dpmpp_2m_sde_heun", "dpmpp_3m_sde"]
ETA_CASES = [(0.5, 1.0), (0.5, 0.7), (0.25, 1.3), (1.0, 0.8)]


CHURN_SAMPLERS = ["euler", "heun", "dpm_2"]
CHURN_CASES = [(2.0, 0.7), (0.5, 1.3)]


class _ListRandnTorch:
    """torch, except that randn_like returns the next array of a noise list (k-diffusion's churn draws)."""

    def __init__(self, arrays: np.ndarray) -> None:
        self.noise = ListNoise(arrays)

    def randn_like(self, x, **kw):  # noqa: ANN001, ANN003, ANN201
        return self.noise(0.0, 0.0).to(x.dtype)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(torch, name)


def eta_key(name: str, eta: float, s_noise: float, sname: str) -> str:
    return f"{name}_eta{eta:g}_snoise{s_noise:g}_{sname}"


def gen_samplers_eta(out: Path, kd) -> None:  # noqa: ANN001
    torch.set_default_dtype(torch.float64)
    mu = torch.from_numpy(data_mean())
    data: dict[str, np.ndarray] = {}
    sig = kd.get_sigmas_karras(10, 0.0291675, 14.614642).double()
    data["sigmas_karras10"] = sig.numpy().copy()
    x = torch.from_numpy(start_noise()) * sig[0]
    for name in ETA_SAMPLERS:
        fn = getattr(kd, "sample_" + ("dpmpp_2m_sde" if name == "dpmpp_2m_sde_heun" else name))
        for eta, s_noise in ETA_CASES:
            noise = ListNoise(noise_list(64))
            kwargs = {"solver_type": "heun"} if name == "dpmpp_2m_sde_heun" else {}
            with torch.no_grad():
                y = fn(ve_denoiser(mu), x.clone(), sig.clone(), extra_args={}, disable=True, eta=eta,
                       s_noise=s_noise, noise_sampler=noise, **kwargs)
            key = eta_key(name, eta, s_noise, "karras10")
            data[f"kd_{key}"] = y.double().numpy()
            data[f"kdcalls_{key}"] = np.array(noise.calls, dtype=np.float64).reshape(-1, 2)
    for name in CHURN_SAMPLERS:
        for s_churn, s_noise in CHURN_CASES:
            fake = _ListRandnTorch(noise_list(64))
            kd.torch = fake
            try:
                with torch.no_grad():
                    y = getattr(kd, "sample_" + name)(ve_denoiser(mu), x.clone(), sig.clone(), extra_args={},
                                                      disable=True, s_churn=s_churn, s_noise=s_noise)
            finally:
                kd.torch = torch
            key = f"{name}_churn{s_churn:g}_snoise{s_noise:g}_karras10"
            data[f"kd_{key}"] = y.double().numpy()
            data[f"kddraws_{key}"] = np.array(len(fake.noise.calls))
    np.savez_compressed(out / "samplers_eta.npz", **data)
    print("samplers_eta:", len(data), "arrays")


#: dpm_fast's model-call budgets (each a different split into orders 3, 2, 1) and its range (SD's sigma range:
#: A1111's txt2img passes the model's own); (eta, s_noise) of the ancestral runs; dpm_adaptive's options
DPM_FAST_CALLS = [1, 2, 3, 4, 5, 6, 10, 20]
DPM_RANGE = (0.0291675, 14.614642)
DPM_ETA_CASES = [(1.0, 1.0), (0.5, 0.7)]
DPM_ADAPTIVE_CASES = {"default": {}, "order2": {"order": 2}, "rtol01": {"rtol": 0.1, "atol": 0.02},
                      "pid": {"pcoeff": 0.3, "icoeff": 0.9, "dcoeff": 0.2}, "eta1": {"eta": 1.0},
                      "eta05_snoise07": {"eta": 0.5, "s_noise": 0.7}}


def gen_samplers_dpm(out: Path, kd) -> None:  # noqa: ANN001
    torch.set_default_dtype(torch.float64)
    mu = torch.from_numpy(data_mean())
    data: dict[str, np.ndarray] = {"range": np.array(DPM_RANGE)}
    lo, hi = DPM_RANGE
    x = torch.from_numpy(start_noise()) * hi

    def run(fn, key, **kw):  # noqa: ANN001, ANN003, ANN202
        seen = []

        def callback(d):  # noqa: ANN001, ANN202
            seen.append((float(d["sigma"]), d["x"].double().numpy().copy()))

        noise = ListNoise(noise_list(512)) if kw.get("eta") else None
        if noise is not None:
            kw["noise_sampler"] = noise
        with torch.no_grad():
            y = fn(ve_denoiser(mu), x.clone(), lo, hi, extra_args={}, callback=callback, disable=True, **kw)
        if isinstance(y, tuple):
            y, info = y
            data[f"info_{key}"] = np.array([info["n_accept"], info["n_reject"], info["nfe"]])
        data[f"kd_{key}"] = y.double().numpy()
        data[f"sigmas_{key}"] = np.array([s for s, _ in seen])
        data[f"traj_{key}"] = np.stack([v for _, v in seen])
        if noise is not None:
            data[f"calls_{key}"] = np.array(noise.calls, dtype=np.float64).reshape(-1, 2)

    for n in DPM_FAST_CALLS:
        run(kd.sample_dpm_fast, f"fast_{n}", n=n)
        for eta, s_noise in DPM_ETA_CASES:
            run(kd.sample_dpm_fast, f"fast_{n}_eta{eta:g}_snoise{s_noise:g}", n=n, eta=eta, s_noise=s_noise)
    # return_info: the accepted and rejected step counts and k-diffusion's model calls
    for key, kw in DPM_ADAPTIVE_CASES.items():
        run(kd.sample_dpm_adaptive, f"adaptive_{key}", return_info=True, **kw)
    np.savez_compressed(out / "samplers_dpm.npz", **data)
    print("samplers_dpm:", len(data), "arrays")


PLMS_STEPS = [1, 2, 3, 4, 5, 10, 20]


def gen_samplers_plms(out: Path) -> None:
    from diffusers import PNDMScheduler

    torch.set_default_dtype(torch.float64)
    mu = torch.from_numpy(data_mean())
    den = ve_denoiser(mu)
    data: dict[str, np.ndarray] = {}
    for n in PLMS_STEPS:
        sch = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                            num_train_timesteps=1000, skip_prk_steps=True, set_alpha_to_one=False, steps_offset=1)
        sch.set_timesteps(n)
        ac = sch.alphas_cumprod.double()
        sample = torch.from_numpy(start_noise())
        states = []
        for k, t in enumerate(sch.timesteps):
            a = ac[int(t)]
            sigma = ((1 - a) / a).sqrt()
            x_ve = sample / a.sqrt()
            eps = (x_ve - den(x_ve, sigma)) / sigma
            sample = sch.step(eps, t, sample).prev_sample
            if k != 0 or n == 1:  # with two steps or more, the first call only predicts (pseudo improved Euler)
                states.append(sample.double().numpy())
        data[f"timesteps_{n}"] = sch.timesteps.numpy().astype(np.int64)
        data[f"final_alpha_{n}"] = np.array(float(sch.final_alpha_cumprod))
        data[f"traj_{n}"] = np.stack(states)
    np.savez_compressed(out / "samplers_plms.npz", **data)
    print("samplers_plms:", len(data), "arrays")


def gen_randn_default_capability(out: Path) -> None:
    """torch.randn from torch's non-AVX2 kernel (run in a child with ATEN_CPU_CAPABILITY=default)."""
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT", torch.backends.cpu.get_cpu_capability()
    seeds = [0, 1, 42, 2**32 - 1]
    values = np.stack([torch.randn((1, 4, 16, 16), generator=torch.Generator().manual_seed(s)).numpy().reshape(-1)
                       for s in seeds])
    np.savez_compressed(out / "randn_default_capability.npz", seeds=np.array(seeds, dtype=np.uint64), values=values)
    print("randn (default capability):", values.size, "values")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfyui", type=Path, help="path of a ComfyUI checkout (read only)")
    parser.add_argument("--out", type=Path, default=Path("tests/samplers/data"))
    parser.add_argument("--default-capability-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--eta-only", action="store_true", help="write only samplers_eta.npz (k-diffusion alone)")
    parser.add_argument("--dpm-only", action="store_true", help="write only samplers_dpm.npz (k-diffusion alone)")
    parser.add_argument("--plms-only", action="store_true", help="write only samplers_plms.npz (diffusers alone)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.eta_only:
        gen_samplers_eta(args.out, load_kdiffusion())
        return
    if args.dpm_only:
        gen_samplers_dpm(args.out, load_kdiffusion())
        return
    if args.plms_only:
        gen_samplers_plms(args.out)
        return
    if args.default_capability_only:
        gen_randn_default_capability(args.out)
        return
    if args.comfyui is None:
        parser.error("--comfyui is required")
    import os
    import subprocess

    subprocess.run([sys.executable, __file__, "--out", str(args.out), "--default-capability-only"], check=True,
                   env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    import diffusers  # noqa: F401 - before load_kdiffusion's torchvision stub, which diffusers would probe

    kd = load_kdiffusion()
    comfy = load_comfy(args.comfyui)
    print("torch", torch.__version__, "cpu capability", torch.backends.cpu.get_cpu_capability())
    gen_randn(args.out)
    gen_schedules(args.out, kd, comfy)
    gen_samplers(args.out, kd, comfy)
    gen_samplers_eta(args.out, kd)
    gen_samplers_dpm(args.out, kd)
    gen_samplers_plms(args.out)


if __name__ == "__main__":
    main()
