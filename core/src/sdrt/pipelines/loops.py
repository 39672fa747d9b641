"""Sampling loops in diffusers' own form, so that a seed gives diffusers' image.

``sdrt.samplers`` holds k-diffusion's samplers. Four of diffusers' schedulers differ from them in
ways that change the image: DDIM steps in alpha space to ``t - 1000 // steps`` (not to the next
timestep) and ends on the final alpha; DPM-Solver++(2M) takes its first and last steps at first order,
works on the alpha-scaled latent, and feeds rounded timesteps of Karras sigmas; Euler starts from ``init_noise_sigma``; Euler a draws its
noise from the pipeline's generator after the initial latents. Each loop here follows its scheduler's
``set_timesteps``/``step``/``add_noise`` on the raw (guided) UNet output, in float32.

A loop object owns its latent space: ``start`` makes the first latent from noise (and an image latent
for img2img), ``add_noise`` is the scheduler's ``add_noise`` at a step index (inpainting's masked
blend), ``run`` walks the steps. Every loop denoises through an ``sdrt.samplers`` denoiser (the
pipeline's ``CFGDenoiser`` around a ``Denoiser`` with the model's own model sampling): the diffusers-form
loops call ``denoiser.predict(model_input, timestep)`` (the guided raw output, eps or v) and step in
their scheduler's arithmetic; ``KLoop`` calls ``denoiser(x, sigma)`` (the denoised estimate), and its
start, re-noising and inpainting blend follow the model sampling's ``noise_scaling`` (VE for eps/v
models, ``(1 - sigma) x0 + sigma noise`` for flow models).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .scheduling import FolderSchedule, Plan

Model = Any  # an sdrt.samplers denoiser: predict(x_in, timestep) -> raw output; (x, sigma) -> denoised
StepHook = Callable[[int, np.ndarray], np.ndarray]  # (index of the next step, latent) -> latent; after every step
F32 = np.float32


class _SchedulerLoop:
    """What the three diffusers-form loops share: their plan, the step count, and the end of a step.

    ``denoised`` is the last step's denoised estimate (what a live preview shows)."""

    denoised: np.ndarray | None = None

    def __init__(self, ms: FolderSchedule, plan: Plan) -> None:
        self.ms, self.plan = ms, plan

    @property
    def steps(self) -> int:
        return self.plan.steps

    def start(self, noise: np.ndarray, image: np.ndarray | None = None) -> np.ndarray:
        return noise * F32(self.plan.init_noise_sigma) if image is None else self.add_noise(image, noise, 0)

    def add_noise(self, image: np.ndarray, noise: np.ndarray, index: int) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must implement add_noise")

    @staticmethod
    def _end_step(i: int, x: np.ndarray, after_step: StepHook | None,
                  callback: Callable[[int, np.ndarray], None] | None) -> np.ndarray:
        """Step ``i`` is done: back to float32, then the pipeline's hook (inpainting's blend), then the callback."""
        x = x.astype(np.float32, copy=False)
        if after_step is not None:
            x = after_step(i + 1, x)
        if callback is not None:
            callback(i, x)
        return x


class EulerLoop(_SchedulerLoop):
    """``EulerDiscreteScheduler`` / ``EulerAncestralDiscreteScheduler`` (``ancestral=True``)."""

    def __init__(self, ms: FolderSchedule, plan: Plan, *, ancestral: bool = False,
                 generator: Any = None) -> None:
        super().__init__(ms, plan)
        self.ancestral, self.generator = ancestral, generator

    def add_noise(self, image: np.ndarray, noise: np.ndarray, index: int) -> np.ndarray:
        return image + noise * F32(self.plan.sigmas[index])

    def run(self, model: Model, x: np.ndarray, *, after_step: StepHook | None = None,
            callback: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        p, v = self.plan, self.ms.prediction == "v"
        for i in range(p.steps):
            sigma, nxt = F32(p.sigmas[i]), F32(p.sigmas[i + 1])
            out = model.predict(x / ((sigma * sigma + F32(1)) ** F32(0.5)), p.timesteps[i])
            if v:
                x0 = out * (-sigma / (sigma * sigma + F32(1)) ** F32(0.5)) + x / (sigma * sigma + F32(1))
            elif self.ms.prediction == "x0":  # diffusers' prediction_type="sample": the output is the sample
                x0 = out
            else:
                x0 = x - sigma * out
            self.denoised = x0  # the step's denoised estimate (live previews)
            d = (x - x0) / sigma
            if self.ancestral:
                up = F32((float(nxt) ** 2 * (float(sigma) ** 2 - float(nxt) ** 2) / float(sigma) ** 2) ** 0.5)
                down = F32((float(nxt) ** 2 - float(up) ** 2) ** 0.5)
                x = x + d * (down - sigma)
                x = x + self.generator.randn(x.shape) * up
            else:
                x = x + d * (nxt - sigma)
            x = self._end_step(i, x, after_step, callback)
        return x


class DPMSolverLoop(_SchedulerLoop):
    """``DPMSolverMultistepScheduler``: DPM-Solver++ order 2, midpoint, ``lower_order_final``."""

    def __init__(self, ms: FolderSchedule, plan: Plan, *, offset: int = 0) -> None:
        super().__init__(ms, plan)
        self.offset = offset  # img2img's first step index
        self.lower_order_final = bool(ms.option("dpm", "lower_order_final"))
        self.euler_at_final = bool(ms.option("dpm", "euler_at_final"))
        self.final_zero = ms.option("dpm", "final_sigmas_type") == "zero"

    @staticmethod
    def _alpha_sigma(sigma: float) -> tuple[np.float32, np.float32]:
        alpha = F32(1) / ((F32(sigma) ** 2 + F32(1)) ** F32(0.5))
        return alpha, F32(sigma) * alpha

    def add_noise(self, image: np.ndarray, noise: np.ndarray, index: int) -> np.ndarray:
        alpha, sigma = self._alpha_sigma(self.plan.sigmas[index])
        return alpha * image + sigma * noise

    def run(self, model: Model, x: np.ndarray, *, after_step: StepHook | None = None,
            callback: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        p, v = self.plan, self.ms.prediction == "v"
        total = p.total or p.steps
        outputs: list[np.ndarray] = []
        lower_nums = 0
        for j in range(p.steps):
            i = j + self.offset  # diffusers' step_index counts from the full schedule's start
            out = model.predict(x, p.timesteps[j])
            alpha_s, sigma_s = self._alpha_sigma(p.sigmas[j])
            if self.ms.prediction == "x0":
                x0 = out
            else:
                x0 = alpha_s * x - sigma_s * out if v else (x - sigma_s * out) / alpha_s
            outputs = [*outputs[-1:], x0]
            self.denoised = x0
            final = i == total - 1 and (self.euler_at_final or (self.lower_order_final and total < 15)
                                        or self.final_zero)
            nxt = p.sigmas[j + 1]
            alpha_t, sigma_t = self._alpha_sigma(nxt)
            if nxt == 0:
                x = x0  # lambda_t = inf: both orders land on the data estimate
            else:
                lam_t = np.log(alpha_t) - np.log(sigma_t)
                lam_s = np.log(alpha_s) - np.log(sigma_s)
                h = lam_t - lam_s
                if lower_nums < 1 or final:
                    x = (sigma_t / sigma_s) * x - (alpha_t * (np.exp(-h) - F32(1))) * x0
                else:
                    alpha_1, sigma_1 = self._alpha_sigma(p.sigmas[j - 1])
                    lam_1 = np.log(alpha_1) - np.log(sigma_1)
                    r0 = (lam_s - lam_1) / h
                    d0, d1 = outputs[-1], (F32(1) / r0) * (outputs[-1] - outputs[-2])
                    x = ((sigma_t / sigma_s) * x - (alpha_t * (np.exp(-h) - F32(1))) * d0
                         - F32(0.5) * (alpha_t * (np.exp(-h) - F32(1))) * d1)
            lower_nums = min(lower_nums + 1, 2)
            x = self._end_step(j, x, after_step, callback)
        return x


class DDIMLoop(_SchedulerLoop):
    """``DDIMScheduler`` with eta 0: each step goes from alpha(t) to alpha(t - 1000 // steps)."""

    def add_noise(self, image: np.ndarray, noise: np.ndarray, index: int) -> np.ndarray:
        a = self.ms.ddim_alpha(int(self.plan.timesteps[index]))
        return a ** F32(0.5) * image + (F32(1) - a) ** F32(0.5) * noise

    def run(self, model: Model, x: np.ndarray, *, after_step: StepHook | None = None,
            callback: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        p, v = self.plan, self.ms.prediction == "v"
        assert p.prev_timesteps is not None
        for i in range(p.steps):
            t = int(p.timesteps[i])
            out = model.predict(x, float(t))
            a_t, a_prev = self.ms.ddim_alpha(t), self.ms.ddim_alpha(p.prev_timesteps[i])
            b_t = F32(1) - a_t
            if v:
                x0 = a_t ** F32(0.5) * x - b_t ** F32(0.5) * out
                eps = a_t ** F32(0.5) * out + b_t ** F32(0.5) * x
            elif self.ms.prediction == "x0":
                x0 = out
                eps = (x - a_t ** F32(0.5) * x0) / b_t ** F32(0.5)
            else:
                x0 = (x - b_t ** F32(0.5) * out) / a_t ** F32(0.5)
                eps = out
            self.denoised = x0
            x = a_prev ** F32(0.5) * x0 + (F32(1) - a_prev) ** F32(0.5) * eps
            x = self._end_step(i, x, after_step, callback)
        return x


class KLoop:
    """Any ``sdrt.samplers`` sampler (k-diffusion form) on the folder's sigma table.

    Inpainting with an ordinary UNet blends as ComfyUI's ``KSamplerX0Inpaint`` does, inside the
    denoiser, since a k-diffusion sampler keeps its own latent: ``after_step`` is not used here;
    pass ``inpaint=(mask, image_latent, noise)`` to ``run``.
    """

    denoised: np.ndarray | None = None

    def __init__(self, ms: Any, sigmas: list[float], sampler: Callable[..., np.ndarray],
                 options: dict[str, Any], *, seed: int, generator: Any) -> None:
        self.ms, self.sigmas, self.sampler, self.options = ms, sigmas, sampler, options
        self.seed, self.generator = seed, generator

    @property
    def steps(self) -> int:
        return len(self.sigmas) - 1

    def start(self, noise: np.ndarray, image: np.ndarray | None = None) -> np.ndarray:
        return self.add_noise(image, noise, 0)

    def add_noise(self, image: np.ndarray | None, noise: np.ndarray, index: int) -> np.ndarray:
        return self.ms.noise_scaling(F32(self.sigmas[index]), noise, image)

    def run(self, model: Model, x: np.ndarray, *, inpaint: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
            callback: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        ms = self.ms

        def denoiser(x: np.ndarray, sigma: float, **_: Any) -> np.ndarray:
            if inpaint is not None:
                mask, image, noise = inpaint
                x = x * mask + ms.noise_scaling(F32(sigma), noise, image) * (F32(1) - mask)
            den = model(x, sigma).astype(np.float32, copy=False)
            if inpaint is not None:
                den = den * inpaint[0] + inpaint[1] * (F32(1) - inpaint[0])
            return den

        denoiser.model_sampling = ms  # type: ignore[attr-defined]  # flow-aware samplers read it

        def noise_sampler(sigma: float, sigma_next: float) -> np.ndarray:
            return self.generator.randn(x.shape)

        def k_callback(info: dict[str, Any]) -> None:
            self.denoised = info.get("denoised")
            if callback is not None:
                callback(int(info["i"]), info["x"])

        options = dict(self.options)
        import inspect

        if "noise_sampler" in inspect.signature(self.sampler).parameters and not self._uses_brownian():
            options["noise_sampler"] = noise_sampler
        out = self.sampler(denoiser, x, self.sigmas, extra_args={"seed": self.seed}, callback=k_callback, **options)
        if inpaint is not None:
            out = out * inpaint[0] + inpaint[1] * (F32(1) - inpaint[0])
        return out.astype(np.float32, copy=False)

    def _uses_brownian(self) -> bool:
        # a functools.partial (the built-in dpmpp_2m_sde_heun) has no __name__: its function has
        name = getattr(getattr(self.sampler, "func", self.sampler), "__name__", "")
        return "sde" in name


class FlowLoop:
    """diffusers' ``FlowMatchEulerDiscreteScheduler`` (SD3, Flux, Chroma): ``x + (sigma_next - sigma) v``.

    ``timesteps``/``sigmas`` as the family's pipeline sets them (``sigmas`` one longer, ending in 0), cut at
    img2img's strength already; ``scale`` turns a scheduler timestep into the transformer's ``timestep``
    (SD3: 1; Flux and Chroma: 1/1000, as their pipelines divide it). The model's ``predict`` gives the guided
    velocity; img2img starts from ``scale_noise(image, noise, sigmas[0])``.
    """

    denoised: np.ndarray | None = None

    def __init__(self, timesteps: np.ndarray, sigmas: np.ndarray, scale: float = 1.0) -> None:
        self.timesteps = np.asarray(timesteps, np.float32)
        self.sigmas = np.asarray(sigmas, np.float32)
        self.divisor = F32(round(1 / scale))  # float32 division, as the pipelines' ``timestep / 1000``

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def start(self, noise: np.ndarray, image: np.ndarray | None = None) -> np.ndarray:
        return noise.astype(np.float32) if image is None else self.add_noise(image, noise, 0)

    def add_noise(self, image: np.ndarray, noise: np.ndarray, index: int) -> np.ndarray:
        from ..samplers.flowmatch import scale_noise

        return scale_noise(image, noise, float(self.sigmas[index]))

    def timestep(self, i: int) -> float:
        return float(self.timesteps[i] / self.divisor)

    def run(self, model: Model, x: np.ndarray, *, after_step: StepHook | None = None,
            callback: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        from ..samplers.flowmatch import euler_step

        for i in range(self.steps):
            v = np.asarray(model.predict(x, self.timestep(i)), np.float32)
            self.denoised = x - self.sigmas[i] * v  # the step's clean estimate (previews, Interrupted.partial)
            x = euler_step(x, v, float(self.sigmas[i]), float(self.sigmas[i + 1]))
            x = _SchedulerLoop._end_step(i, x, after_step, callback)
        return x
