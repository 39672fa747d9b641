"""Samplers, noise schedules, model sampling, denoisers and torch-compatible seeded noise, in numpy.

Quick use::

    from sdrt import samplers as S

    ms = S.DiscreteSchedule("eps")                      # SD1.5 / SDXL
    choice = S.resolve("DPM++ 2M Karras")               # or S.resolve("dpmpp_2m", "karras")
    sigmas = S.get_sigmas(choice.schedule, 20, ms, discard_penultimate=choice.discard_penultimate)
    x = S.randn(seed, (1, 4, 64, 64)) * sigmas[0]       # same latents as torch.randn with that seed
    model = S.CFGDenoiser(S.Denoiser(unet_session, ms), cond, uncond, scale=7.0)
    latent = S.get_sampler(choice.sampler)(model, x, sigmas, extra_args={"seed": seed}, **choice.options)

This package is not imported by ``import sdrt``.
"""

from __future__ import annotations

from .dd_samplers import ddim, ddpm, lcm
from .denoisers import CFGDenoiser, Denoiser, EditCFGDenoiser
from .dpm_solver import dpm_adaptive, dpm_fast
from .k_samplers import (
    dpm_2,
    dpm_2_ancestral,
    dpmpp_2m,
    dpmpp_2m_sde,
    dpmpp_2s_ancestral,
    dpmpp_3m_sde,
    dpmpp_sde,
    euler,
    euler_ancestral,
    heun,
    lms,
)
from .model_sampling import (
    DiscreteSchedule,
    EDMSchedule,
    FlowSchedule,
    flux_mu,
    flux_schedule,
    scaled_linear_betas,
    sd3_schedule,
)
from .multistep import deis, ipndm, plms
from .names import SamplerChoice, resolve
from .noise import BrownianTreeNoiseSampler, TorchGenerator, TorchNoiseSampler, brownian_interval, randn
from .philox import CudaGenerator, NvGenerator, cuda_thread_capacity, philox4x32_10, randn_cuda, randn_nv
from .registry import available_samplers, available_schedules, get_sampler, get_schedule, get_sigmas
from .schedules import (
    DISCARD_PENULTIMATE_SIGMA,
    align_your_steps,
    beta,
    ddim_uniform,
    exponential,
    karras,
    kl_optimal,
    linear_quadratic,
    normal,
    polyexponential,
    sgm_uniform,
    simple,
)
from .seeds import (
    RNG_SOURCES,
    ImageNoise,
    batch_seeds,
    make_generator,
    resolve_seed,
    rng_infotext,
    seed_infotext,
    slerp,
)
from .unipc import uni_pc, uni_pc_bh2

__all__ = [
    "seed_infotext",
    "slerp",
    "rng_infotext",
    "resolve_seed",
    "make_generator",
    "batch_seeds",
    "randn_nv",
    "randn_cuda",
    "philox4x32_10",
    "cuda_thread_capacity",
    "ImageNoise",
    "NvGenerator",
    "CudaGenerator",
    "RNG_SOURCES",
    "DISCARD_PENULTIMATE_SIGMA",
    "BrownianTreeNoiseSampler",
    "CFGDenoiser",
    "EditCFGDenoiser",
    "Denoiser",
    "DiscreteSchedule",
    "EDMSchedule",
    "FlowSchedule",
    "SamplerChoice",
    "TorchGenerator",
    "TorchNoiseSampler",
    "align_your_steps",
    "available_samplers",
    "available_schedules",
    "beta",
    "brownian_interval",
    "ddim",
    "ddim_uniform",
    "ddpm",
    "deis",
    "dpm_2",
    "dpm_2_ancestral",
    "dpm_adaptive",
    "dpm_fast",
    "dpmpp_2m",
    "dpmpp_2m_sde",
    "dpmpp_2s_ancestral",
    "dpmpp_3m_sde",
    "dpmpp_sde",
    "euler",
    "euler_ancestral",
    "exponential",
    "flux_mu",
    "flux_schedule",
    "get_sampler",
    "get_schedule",
    "get_sigmas",
    "heun",
    "ipndm",
    "karras",
    "kl_optimal",
    "lcm",
    "linear_quadratic",
    "lms",
    "normal",
    "plms",
    "polyexponential",
    "randn",
    "resolve",
    "scaled_linear_betas",
    "sd3_schedule",
    "sgm_uniform",
    "simple",
    "uni_pc",
    "uni_pc_bh2",
]
