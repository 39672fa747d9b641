"""The folder's discretization, computed as diffusers' schedulers compute it from ``scheduler_config.json``.

``FolderSchedule.from_config(config)`` reads the betas (``scaled_linear``, ``linear``,
``squaredcos_cap_v2`` or ``trained_betas``), the prediction type, ``timestep_spacing``,
``steps_offset``, ``interpolation_type``, ``set_alpha_to_one`` and ``rescale_betas_zero_snr``, as diffusers'
``Scheduler.from_config(pipe.scheduler.config)`` does. It is a model sampling object
(sigma table, ``timestep(sigma)``, ``denoised``) that ``sdrt.samplers`` can use, and it
makes the timesteps and sigmas of diffusers' ``EulerDiscreteScheduler``,
``EulerAncestralDiscreteScheduler``, ``DPMSolverMultistepScheduler`` and ``DDIMScheduler``
(:meth:`euler_plan`, :meth:`dpm_plan`, :meth:`ddim_plan`). The table is float32, as
diffusers keeps ``alphas_cumprod`` in a float32 tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelError
from ..samplers.model_sampling import DiscreteSchedule

SPACINGS = ("leading", "linspace", "trailing")
#: diffusers' ``prediction_type`` -> sdrt's prediction (``sdrt.samplers.DiscreteSchedule``): ``"sample"`` is x0
PREDICTIONS = {"epsilon": "eps", "v_prediction": "v", "sample": "x0"}

#: each scheduler's own defaults, used for keys the folder's config does not set (diffusers'
#: ``from_config`` ignores a value that was itself a default of the saved scheduler: ``_use_default_values``)
DEFAULTS: dict[str, dict[str, Any]] = {
    "euler": {"timestep_spacing": "linspace", "steps_offset": 0, "interpolation_type": "linear",
              "final_sigmas_type": "zero"},
    "dpm": {"timestep_spacing": "linspace", "steps_offset": 0, "final_sigmas_type": "zero",
            "lower_order_final": True, "euler_at_final": False},
    "ddim": {"timestep_spacing": "leading", "steps_offset": 0, "set_alpha_to_one": True},
}


def _torch_linspace_f32(start: float, end: float, n: int) -> np.ndarray:
    """``torch.linspace(start, end, n, dtype=torch.float32)`` as torch's CPU kernel computes it."""
    if n == 1:
        return np.array([start], np.float32)
    step = np.float32((np.float32(end) - np.float32(start)) / np.float32(n - 1))
    idx = np.arange(n, dtype=np.float32)
    half = n // 2
    out = np.empty(n, np.float32)
    out[:half] = np.float32(start) + step * idx[:half]
    out[half:] = np.float32(end) - step * (np.float32(n - 1) - idx[half:])
    return out


#: the most training timesteps a scheduler config may give (diffusers' models use 1000)
MAX_TRAIN_TIMESTEPS = 100_000


def config_number(config: dict[str, Any], key: str, default: float, where: str, *, whole: bool = False,
                  low: float = 0.0, high: float = math.inf, open_low: bool = False) -> Any:
    """``config[key]`` (``default`` when unset) checked as a finite number in its range (a whole one with
    ``whole``); else a ``ModelError`` naming the key: a hand-edited or broken scheduler config gave int()'s
    ValueError, or numpy's MemoryError for num_train_timesteps 1e12."""
    value = config.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
        (low < value if open_low else low <= value) and value <= high and (not whole or float(value).is_integer())
    if not ok:
        kind = "a whole number" if whole else "a number"
        span = (f"above {low:g}" + (f" and at most {high:g}" if math.isfinite(high) else "") if open_low else
                f"from {low:g}" + (f" to {high:g}" if math.isfinite(high) else ""))
        raise ModelError(f"the scheduler config's {key} is {value!r}, not {kind} {span}", where=where,
                         fix=f"fix {key} in the scheduler config (diffusers' default: {default!r}), or re-export the "
                             "model")
    return int(value) if whole else float(value)


def train_timesteps(config: dict[str, Any], where: str) -> int:
    return config_number(config, "num_train_timesteps", 1000, where, whole=True, low=1, high=MAX_TRAIN_TIMESTEPS)


def betas_from_config(config: dict[str, Any], where: str) -> np.ndarray:
    n = train_timesteps(config, where)
    trained = config.get("trained_betas")
    if trained is not None:
        try:
            betas = np.asarray(trained, dtype=np.float32)
        except (TypeError, ValueError):
            betas = np.array([np.nan], np.float32)
        if betas.ndim != 1 or not np.all(np.isfinite(betas)) or not np.all((betas > 0) & (betas < 1)):
            # a zero-terminal-SNR schedule written out: its last beta is 1 (alpha 0), which diffusers' samplers
            # take only with rescale_betas_zero_snr (the last alpha_cumprod then set to 2**-24); elsewhere a NaN
            zsnr_end = (betas.ndim == 1 and betas.size > 1 and betas[-1] == 1 and np.all(np.isfinite(betas[:-1]))
                        and np.all((betas[:-1] > 0) & (betas[:-1] < 1)))
            if zsnr_end and config.get("rescale_betas_zero_snr"):
                return betas
            raise ModelError("the scheduler config's trained_betas are not a list of numbers between 0 and 1"
                             + (" (its last beta is 1: a zero-terminal-SNR schedule)" if zsnr_end else ""),
                             where=where, fix="set rescale_betas_zero_snr: true in the scheduler config for a "
                             "zero-terminal-SNR model" if zsnr_end else
                             "fix trained_betas in the scheduler config, or re-export the model")
        return betas
    kind = config.get("beta_schedule", "linear")
    start = config_number(config, "beta_start", 0.0001, where, low=0, high=1, open_low=True)
    end = config_number(config, "beta_end", 0.02, where, low=0, high=1, open_low=True)
    if kind == "scaled_linear":
        return _torch_linspace_f32(start**0.5, end**0.5, n) ** 2
    if kind == "linear":
        return _torch_linspace_f32(start, end, n)
    if kind == "squaredcos_cap_v2":
        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        return np.array([min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), 0.999) for i in range(n)], np.float32)
    raise ModelError(f"beta_schedule {kind!r} is not supported", where=where,
                     fix="use scaled_linear, linear or squaredcos_cap_v2 (diffusers' schedules)")


def _cumprod_f32(x: np.ndarray) -> np.ndarray:
    """``torch.cumprod`` of a float32 tensor on the CPU: accumulated in float64, each product rounded to float32
    (a float32 running product differs from it in the last bits, 944 of SD's 1000 alphas_cumprod)."""
    return np.cumprod(x.astype(np.float64)).astype(np.float32)


def rescale_zero_terminal_snr(betas: np.ndarray) -> np.ndarray:
    """diffusers' ``rescale_zero_terminal_snr`` (Lin et al. 2023, algorithm 1) in float32: shift and scale
    sqrt(alphas_cumprod) so the last step has zero signal and the first keeps its value."""
    f = np.float32
    ab = np.sqrt(_cumprod_f32(f(1.0) - betas.astype(f)))
    first, last = ab[0], ab[-1]
    ab = (ab - last) * (first / (first - last))
    ab2 = ab * ab
    alphas = np.concatenate([ab2[:1], ab2[1:] / ab2[:-1]]).astype(f)
    return (f(1.0) - alphas).astype(f)


@dataclass(frozen=True)
class Plan:
    """The steps diffusers' scheduler takes: sigmas (k-diffusion's VE form, ending in the last sigma)
    and the UNet timestep fed at each step. ``prev_timesteps`` (DDIM only) is where each step lands
    (negative: the final alpha)."""

    sigmas: list[float]
    timesteps: list[float]
    init_noise_sigma: float
    prev_timesteps: list[int] | None = None
    #: the full schedule's length (diffusers' DPM-Solver picks lower orders by it, also in img2img)
    total: int = 0

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def tail(self, start: int) -> Plan:
        """The plan from step ``start`` on (img2img's strength)."""
        prev = self.prev_timesteps[start:] if self.prev_timesteps is not None else None
        return Plan(self.sigmas[start:], self.timesteps[start:], self.init_noise_sigma, prev, self.total)


class FolderSchedule(DiscreteSchedule):
    """A DDPM-trained model's schedule as its folder's ``scheduler_config.json`` sets it."""

    config: dict[str, Any]
    where: str
    alphas_cumprod_f32: np.ndarray
    sigmas_f32: np.ndarray
    #: DDIM's alphas_cumprod: the same, but under zero terminal SNR the last one stays 0 (diffusers' DDIMScheduler)
    ddim_ac: np.ndarray

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "scheduler_config.json") -> FolderSchedule:
        kind = str(config.get("prediction_type", "epsilon"))
        prediction = PREDICTIONS.get(kind)
        if prediction is None:
            raise ModelError(f"prediction_type {kind!r} is not supported", where=where,
                             fix="use a model trained for 'epsilon', 'v_prediction' or 'sample'")
        spacing = config.get("timestep_spacing")
        if spacing is not None and spacing not in SPACINGS:
            raise ModelError(f"timestep_spacing {spacing!r} is not supported", where=where,
                             fix=f"use one of {', '.join(SPACINGS)}")
        n = train_timesteps(config, where)
        self = cls(prediction=prediction, num_timesteps=n)
        self.config = dict(config)
        self.where = where
        betas = betas_from_config(config, where)
        if betas.shape != (n,):
            raise ModelError(f"trained_betas has {betas.size} values, not num_train_timesteps={n}", where=where,
                             fix="fix the scheduler config")
        zero_snr = bool(config.get("rescale_betas_zero_snr"))
        if zero_snr:
            betas = rescale_zero_terminal_snr(betas)
        ac = _cumprod_f32(np.float32(1.0) - betas)
        self.ddim_ac = ac.copy()  # diffusers' DDIM keeps the zero alpha of the last step (v-prediction: x0 = -v)
        if zero_snr:  # as diffusers' Euler, Euler a and DPM-Solver do: a finite last sigma (about 4096)
            ac[-1] = np.float32(2.0**-24)
        self.alphas_cumprod_f32 = ac
        self.sigmas_f32 = np.sqrt((np.float32(1.0) - ac) / ac).astype(np.float32)
        self.alphas_cumprod = ac.astype(np.float64)
        self.sigmas = self.sigmas_f32.astype(np.float64)
        self.log_sigmas = np.log(self.sigmas)
        return self

    def option(self, scheduler: str, key: str) -> Any:
        """The config's value for ``key``, or ``scheduler``'s default where the folder leaves it unset."""
        unset = self.config.get("_use_default_values") or []
        if key in self.config and key not in unset and self.config[key] is not None:
            return self.config[key]
        return DEFAULTS[scheduler].get(key)

    # ---------------------------------------------------------------- diffusers' timesteps
    def _sigma_to_t(self, sigma: float) -> float:
        """diffusers' ``_sigma_to_t``: linear interpolation in log sigma (float32 table)."""
        log_sigmas = np.log(self.sigmas_f32)
        log_sigma = np.log(max(sigma, 1e-10))
        dists = log_sigma - log_sigmas
        low = int(min(np.cumsum(dists >= 0).argmax(), len(log_sigmas) - 2))
        lo, hi = float(log_sigmas[low]), float(log_sigmas[low + 1])
        w = min(max((lo - log_sigma) / (lo - hi), 0.0), 1.0)
        return (1 - w) * low + w * (low + 1)

    def _karras(self, sigma_min: float, sigma_max: float, steps: int) -> np.ndarray:
        rho = 7.0
        ramp = np.linspace(0, 1, steps)
        lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
        return (hi + ramp * (lo - hi)) ** rho

    def euler_plan(self, steps: int, *, karras: bool = False, ancestral: bool = False) -> Plan:
        """``EulerDiscreteScheduler`` / ``EulerAncestralDiscreteScheduler.set_timesteps(steps)``.

        The ancestral scheduler has no ``interpolation_type``, Karras sigmas or ``final_sigmas_type``:
        it always interpolates sigma linearly and ends at 0 (``karras`` then gives Euler's Karras sigmas).
        """
        n = self.num_timesteps
        spacing, offset = self.option("euler", "timestep_spacing"), int(self.option("euler", "steps_offset"))
        if spacing == "linspace":
            ts = np.linspace(0, n - 1, steps, dtype=np.float32)[::-1].copy()
        elif spacing == "leading":
            ratio = n // steps
            ts = (np.arange(0, steps) * ratio).round()[::-1].copy().astype(np.float32) + offset
        else:
            ts = np.arange(n, 0, -n / steps).round().copy().astype(np.float32) - 1
        table = self.sigmas_f32
        interp = "linear" if ancestral else str(self.option("euler", "interpolation_type"))
        if interp == "log_linear":
            sig = np.exp(np.linspace(np.log(table[-1]), np.log(table[0]), steps + 1, dtype=np.float32))
        elif interp == "linear":
            sig = np.interp(ts, np.arange(0, len(table)), table)
        else:
            raise ModelError(f"interpolation_type {interp!r} is not supported", where=self.where,
                             fix="use 'linear' or 'log_linear'")
        if karras:
            sig = self._karras(float(sig[-1]), float(sig[0]), steps)
            ts = np.array([self._sigma_to_t(float(s)) for s in sig])
        sigma_min_end = not ancestral and self.option("euler", "final_sigmas_type") == "sigma_min"
        final = float(self.sigmas_f32[0]) if sigma_min_end else 0.0
        sigmas = np.concatenate([sig, [final]]).astype(np.float32)
        top = float(sigmas.max())
        init = top if spacing in ("linspace", "trailing") else (top**2 + 1) ** 0.5
        return Plan([float(s) for s in sigmas], [float(np.float32(t)) for t in ts], float(np.float32(init)),
                    total=steps)

    def dpm_plan(self, steps: int, *, karras: bool = False) -> Plan:
        """``DPMSolverMultistepScheduler.set_timesteps(steps)`` (``use_karras_sigmas`` as given)."""
        n = self.num_timesteps
        last = n  # lambda_min_clipped = -inf
        spacing, offset = self.option("dpm", "timestep_spacing"), int(self.option("dpm", "steps_offset"))
        if spacing == "linspace":
            ts = np.linspace(0, last - 1, steps + 1).round()[::-1][:-1].copy().astype(np.int64)
        elif spacing == "leading":
            ratio = last // (steps + 1)
            ts = (np.arange(0, steps + 1) * ratio).round()[::-1][:-1].copy().astype(np.int64) + offset
        else:
            ts = np.arange(last, 0, -n / steps).round().copy().astype(np.int64) - 1
        table = self.sigmas_f32
        if karras:
            sig = self._karras(float(table[0]), float(table[-1]), steps)
            ts_f = np.array([self._sigma_to_t(float(s)) for s in sig])
            if self.config.get("beta_schedule") != "squaredcos_cap_v2":
                ts_f = ts_f.round()
            ts = ts_f.astype(np.int64)
        else:
            sig = np.interp(ts, np.arange(0, len(table)), table)
        final = float(self.sigmas_f32[0]) if self.option("dpm", "final_sigmas_type") == "sigma_min" else 0.0
        sigmas = np.concatenate([sig, [final]]).astype(np.float32)
        return Plan([float(s) for s in sigmas], [float(t) for t in ts], 1.0, total=steps)

    def ddim_plan(self, steps: int) -> Plan:
        """``DDIMScheduler.set_timesteps(steps)``; each step lands on ``t - num_train_timesteps // steps``."""
        n = self.num_timesteps
        spacing, offset = self.option("ddim", "timestep_spacing"), int(self.option("ddim", "steps_offset"))
        if spacing == "linspace":
            ts = np.linspace(0, n - 1, steps).round()[::-1].copy().astype(np.int64)
        elif spacing == "leading":
            ratio = n // steps
            ts = (np.arange(0, steps) * ratio).round()[::-1].copy().astype(np.int64) + offset
        else:
            ts = np.round(np.arange(n, 0, -n / steps)).astype(np.int64) - 1
        prev = [int(t) - n // steps for t in ts]
        sig = [self.ddim_sigma(int(t)) for t in [*ts, prev[-1]]]
        return Plan(sig, [float(t) for t in ts], 1.0, prev, steps)

    def ddim_alpha(self, t: int) -> np.float32:
        """alphas_cumprod[t]; below 0 the final alpha (1 with ``set_alpha_to_one``, else alphas_cumprod[0])."""
        ac = self.ddim_ac
        if t >= 0:
            return ac[t]
        return np.float32(1.0) if self.option("ddim", "set_alpha_to_one") else ac[0]

    def ddim_sigma(self, t: int) -> float:
        a = self.ddim_alpha(t)
        return float("inf") if a == 0 else float(np.sqrt((np.float32(1.0) - a) / a))


#: diffusers' schedulers of DDPM-trained (eps / v) models: one discrete model sampling, read by ``FolderSchedule``
DISCRETE_SCHEDULERS = frozenset({
    "PNDMScheduler", "DDIMScheduler", "DDPMScheduler", "EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler",
    "DPMSolverMultistepScheduler", "DPMSolverSinglestepScheduler", "DPMSolverSDEScheduler", "LMSDiscreteScheduler",
    "HeunDiscreteScheduler", "KDPM2DiscreteScheduler", "KDPM2AncestralDiscreteScheduler", "UniPCMultistepScheduler",
    "DEISMultistepScheduler", "LCMScheduler", "TCDScheduler",
})
#: rectified-flow schedulers (SD3, Flux, Chroma): velocity prediction with a shift
FLOW_SCHEDULERS = frozenset({"FlowMatchEulerDiscreteScheduler", "FlowMatchHeunDiscreteScheduler"})
#: schedulers of EDM-trained models (Playground v2.5, CosXL in diffusers): continuous sigmas, EDM preconditioning
EDM_SCHEDULERS = frozenset({"EDMDPMSolverMultistepScheduler", "EDMEulerScheduler"})


def alpha_at(alphas_cumprod: np.ndarray, timestep: float) -> float:
    """``alphas_cumprod`` at ``timestep`` rounded (half to even) and kept in the table: the DDPM ``alpha_bar`` that
    sd-webui-controlnet's UNet hooks read at a call's timestep."""
    return float(alphas_cumprod[int(np.clip(np.round(float(timestep)), 0, len(alphas_cumprod) - 1))])


def through_x0(eps: np.ndarray, x_in: np.ndarray, timestep: float, alphas_cumprod: np.ndarray, weight: float,
               change: Any) -> np.ndarray:
    """One UNet call's noise ``eps`` edited through its ``x0``, as sd-webui-controlnet's hooks edit it: ``x0``
    predicted from ``eps`` at the scaled input ``x_in`` (the DDPM ``x_t``) and the rounded ``timestep``,
    ``change(x0)`` made, the noise recomputed from it and mixed with ``eps`` at ``weight`` clipped to [0, 1]."""
    ab = alpha_at(alphas_cumprod, timestep)
    sr, srm1 = np.float32(np.sqrt(1.0 / ab)), np.float32(np.sqrt(1.0 / ab - 1.0))
    x = np.asarray(x_in, np.float32)
    x0 = change(sr * x - srm1 * eps)
    new = (sr * x - x0) / srm1
    w = np.float32(max(0.0, min(1.0, float(weight))))
    return (new * w + eps * (1 - w)).astype(eps.dtype, copy=False)


def edm_sampling(config: dict[str, Any], where: str) -> Any:
    """The ``EDMSchedule`` an EDM scheduler config describes: its ``sigma_min``, ``sigma_max``, ``sigma_data`` and
    ``prediction_type`` (diffusers' EDM schedulers' defaults where unset: 0.002, 80, 0.5, epsilon)."""
    from ..samplers.model_sampling import EDMSchedule

    kind = str(config.get("prediction_type", "epsilon"))
    prediction = {"epsilon": "eps", "v_prediction": "v"}.get(kind)
    if prediction is None:
        raise ModelError(f"prediction_type {kind!r} is not supported", where=where,
                         fix="use a model trained for 'epsilon' or 'v_prediction'")
    lo = config_number(config, "sigma_min", 0.002, where, open_low=True)
    hi = config_number(config, "sigma_max", 80.0, where, open_low=True)
    if lo >= hi:
        raise ModelError(f"the scheduler config's sigma_min {lo:g} is not below its sigma_max {hi:g}", where=where,
                         fix="fix sigma_min / sigma_max in the scheduler config, or re-export the model")
    return EDMSchedule(prediction, lo, hi, config_number(config, "sigma_data", 0.5, where, open_low=True),
                       train_timesteps(config, where))


def model_sampling(config: dict[str, Any], where: str = "scheduler_config.json", *, shift: float | None = None,
                   multiplier: float | None = None, width: int | None = None, height: int | None = None) -> Any:
    """The model sampling a folder's ``scheduler_config.json`` describes, chosen by its ``_class_name``.

    DDPM-trained schedulers give a :class:`FolderSchedule` (eps or v); flow-matching schedulers give a
    ``FlowSchedule`` with the config's ``shift`` (or ``shift=`` when the family fixes one), and, with
    ``use_dynamic_shifting``, Flux's resolution-dependent ``mu`` for ``width`` x ``height``. A folder
    without a class name is read as a DDPM scheduler (the older exports). ``multiplier`` maps sigma to
    the timestep the network takes (``num_train_timesteps`` by default, as SD3; Flux takes sigma: 1).
    EDM schedulers (Playground v2.5) give an ``EDMSchedule`` (``edm_sampling``).
    """
    from ..samplers.model_sampling import FlowSchedule, flux_mu

    name = str(config.get("_class_name") or "PNDMScheduler")
    if name in DISCRETE_SCHEDULERS:
        return FolderSchedule.from_config(config, where)
    if name in EDM_SCHEDULERS:
        return edm_sampling(config, where)
    if name in FLOW_SCHEDULERS:
        n = train_timesteps(config, where)
        mult = float(n if multiplier is None else multiplier)
        if config.get("use_dynamic_shifting"):
            if width is None or height is None:
                raise ModelError("a dynamically shifted flow schedule needs the image size", where=where,
                                 fix="pass width= and height=")
            mu = flux_mu(width, height, base_shift=float(config.get("base_shift", 0.5)),
                         max_shift=float(config.get("max_shift", 1.15)),
                         base_seq_len=int(config.get("base_image_seq_len", 256)),
                         max_seq_len=int(config.get("max_image_seq_len", 4096)))
            return FlowSchedule(mu=mu, multiplier=mult, num_timesteps=n)
        value = float(shift if shift is not None else config.get("shift", 1.0))
        return FlowSchedule(shift=value, multiplier=mult, num_timesteps=n)
    raise ModelError(f"the scheduler {name!r} is not supported", where=where,
                     fix="use a folder whose scheduler_config.json names one of diffusers' schedulers: "
                         + ", ".join(sorted(DISCRETE_SCHEDULERS | FLOW_SCHEDULERS | EDM_SCHEDULERS)))
