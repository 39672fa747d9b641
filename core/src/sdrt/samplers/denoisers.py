"""Denoisers: wrap a backend ``Session`` (a UNet or DiT graph) as ``model(x, sigma, **kw) -> denoised``.

``Denoiser`` converts between the sampler's view (a latent at noise level
sigma) and the network's view (a scaled input and a timestep), runs the
session once, and turns its output (eps, v or flow velocity, per the model
sampling's ``prediction``) into the denoised estimate. ``CFGDenoiser`` adds
classifier-free guidance and skips the unconditional pass at scale 1.

Input names differ between exports, so they are arguments: by default the
diffusers/optimum names ``sample``, ``timestep`` and ``encoder_hidden_states``.

Two views of one call: ``denoiser(x, sigma)`` is k-diffusion's (a latent at
sigma in, the denoised estimate out), and ``denoiser.predict(x_in, timestep)``
is a scheduler's (the already scaled input and the timestep in, the raw network
output out), for loops that step in diffusers' own arithmetic. A conditioning
may be one array (fed as ``cond_name``) or a mapping of several inputs (hidden
states and a pooled embedding, say). ``hooks`` add inputs computed per call
from the feeds so far (a family's extra inputs, ControlNet residuals).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ModelError, SamplerError

__all__ = ["CFGDenoiser", "Denoiser", "EditCFGDenoiser", "rescale_guidance"]


class Denoiser:
    """``model(x, sigma, cond=..., **feeds)`` around ``session.run``.

    - ``model_sampling``: a ``DiscreteSchedule`` (eps or v) or ``FlowSchedule``.
    - ``sample_name``, ``timestep_name``, ``cond_name``: the session's input names.
    - ``output_name``: which output to read (default: the first).
    - ``timestep_dtype``: dtype of the timestep feed (default: the session's
      declared dtype for that input, else float32).
    - ``feeds``: constant extra inputs (e.g. SDXL's ``text_embeds``, ``time_ids``).
    - ``quantize``: feed the nearest integer timestep instead of an interpolated one.
    - ``hooks``: callables ``hook(feeds) -> more feeds`` run in order before every call
      (they see the sample, timestep and conditioning; what they return is added or replaces).
    - ``after``: callables ``after(feeds, output) -> output`` run in order on the raw network output of every call
      (sd-webui-controlnet's ``inpaint_only`` restore).
    """

    def __init__(self, session: Any, model_sampling: Any, *, sample_name: str = "sample",
                 timestep_name: str = "timestep", cond_name: str | None = "encoder_hidden_states",
                 output_name: str | None = None, timestep_dtype: Any = None,
                 feeds: Mapping[str, np.ndarray] | None = None, quantize: bool = False,
                 hooks: Sequence[Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]] = (),
                 after: Sequence[Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]] = ()) -> None:
        self.session = session
        self.model_sampling = model_sampling
        self.sample_name = sample_name
        self.timestep_name = timestep_name
        self.cond_name = cond_name
        self.output_name = output_name
        self.feeds = dict(feeds or {})
        self.quantize = quantize
        self.hooks = list(hooks)
        self.after = list(after)
        infos = getattr(session, "inputs", [])
        declared = {info.name: info for info in (infos.values() if isinstance(infos, Mapping) else infos)}
        missing = [n for n in (sample_name, timestep_name, cond_name) if n and declared and n not in declared]
        if missing:
            raise SamplerError(
                f"the session has no input named {', '.join(map(repr, missing))}",
                where=f"Denoiser inputs (the session has: {', '.join(declared)})",
                fix="pass sample_name=, timestep_name=, cond_name= with the graph's input names",
            )
        if timestep_dtype is None:
            info = declared.get(timestep_name)
            timestep_dtype = info.dtype if info is not None else "float32"
        self.timestep_dtype = np.dtype(timestep_dtype)
        if getattr(model_sampling, "kind", None) == "edm" and self.timestep_dtype.kind in "iu":
            where = getattr(session, "path", None) or getattr(session, "name", None) or "the denoiser"
            raise ModelError(f"the denoiser's {timestep_name} input is {self.timestep_dtype}, and an EDM-trained model "
                             "(Playground v2.5, CosXL) takes c_noise = 0.25 ln sigma, a fraction from about -1.6 to "
                             "1.2: rounded to whole numbers it would give noise", where=str(where),
                             fix="export the UNet with a float timestep input (diffusers' UNet2DConditionModel takes "
                                 "float timesteps), or use sdrt's shipped graphs")
        ts_info = declared.get(timestep_name)
        self._timestep_shape = tuple(ts_info.shape) if ts_info is not None else None
        sample_info = declared.get(sample_name)
        #: the sample is fed in the session's declared dtype (samplers work in float64 or float32)
        self._sample_dtype = _float_dtype(sample_info.dtype) if sample_info is not None else None

    def _timestep(self, timestep: float, batch: int) -> np.ndarray:
        t = np.asarray(timestep, dtype=np.float64)
        if self.timestep_dtype.kind in "iu":
            t = np.rint(t)
        shape = self._timestep_shape
        if shape is not None and len(shape) == 0:
            return t.astype(self.timestep_dtype).reshape(())
        return np.full((batch,), float(t), dtype=self.timestep_dtype)

    def predict(self, x_in: np.ndarray, timestep: float, *, cond: Any = None, **feeds: np.ndarray) -> np.ndarray:
        """One network call on an input already scaled for the model, at ``timestep``: its raw output."""
        inputs: dict[str, np.ndarray] = dict(self.feeds)
        inputs.update(feeds)
        inputs[self.sample_name] = np.ascontiguousarray(x_in, dtype=self._sample_dtype or x_in.dtype)
        inputs[self.timestep_name] = self._timestep(timestep, x_in.shape[0])
        if isinstance(cond, Mapping):
            inputs.update(cond)
        elif self.cond_name is not None:
            if cond is None:
                raise SamplerError("no conditioning given", where=f"Denoiser input {self.cond_name!r}",
                                   fix="pass cond= (the text encoder's hidden states), or cond_name=None")
            inputs[self.cond_name] = cond
        for hook in self.hooks:
            inputs.update(hook(inputs))
        outputs = self.session.run(inputs)
        out = np.asarray(outputs[self.output_name] if self.output_name else next(iter(outputs.values())))
        if out.shape != x_in.shape:  # the samplers mix it with the sample: numpy's broadcast error, a traceback
            where = getattr(self.session, "path", None) or getattr(self.session, "name", None) or "the denoiser"
            raise ModelError(f"the denoiser's output has shape {list(out.shape)} for a sample of shape "
                             f"{list(x_in.shape)}; a denoiser's output must have its sample's shape", where=str(where),
                             fix="check that the graph is the model's UNet or transformer as exported (its output "
                                 "is the noise, v or velocity prediction of the sample), or re-export it")
        out = out.astype(np.float32) if out.dtype.kind == "f" and out.dtype.itemsize < 4 else out
        for after in self.after:
            out = after(inputs, out)
        return out

    def __call__(self, x: np.ndarray, sigma: float, *, cond: Any = None, **feeds: np.ndarray) -> np.ndarray:
        sigma = float(np.asarray(sigma).reshape(-1)[0])
        ms = self.model_sampling
        t = ms.timestep(sigma, quantize=self.quantize)
        out = self.predict(ms.scale_input(x, sigma), float(t), cond=cond, **feeds)
        return ms.denoised(x, sigma, np.asarray(out, dtype=x.dtype)).astype(x.dtype, copy=False)


class CFGDenoiser:
    """Classifier-free guidance: ``uncond + scale * (cond - uncond)``, one pass when ``scale == 1``.

    ``model`` is a denoiser taking ``cond=``; ``cond``/``uncond`` are the
    positive and negative conditionings (arrays, or mappings of several inputs).
    By default the guidance is applied to the denoised estimates, which equals
    guiding eps, v or velocity since each denoised estimate is affine in the
    network output with the same coefficients.

    ``batched=True`` runs both conditionings in one call (rows ``[uncond, cond]``
    stacked on the batch axis, as diffusers does) and guides the raw network
    output, then turns it into the denoised estimate; ``predict(x_in, timestep)``
    gives that guided raw output to loops that step in a scheduler's own form.

    ``rescale`` (diffusers' ``guidance_rescale``, "Common Diffusion Noise Schedules and Sample Steps are Flawed"
    section 3.4): the guided network output is rescaled to the standard deviation of the positive one and mixed
    back, ``rescale * out * std(pos) / std(out) + (1 - rescale) * out``, per image, in the network's own output
    (eps or v), as diffusers' ``rescale_noise_cfg`` does. Since that is not affine, it needs the raw outputs:
    with a rescale every guided call goes through ``predict``.
    """

    def __init__(self, model: Any, cond: Any, uncond: Any, scale: float, *, batched: bool = False,
                 rescale: float = 0.0) -> None:
        self.model = model
        self.cond = cond
        self.uncond = uncond
        self.scale = float(scale)
        self.batched = batched
        self.rescale = float(rescale)
        self.model_sampling = getattr(model, "model_sampling", None)
        self.calls = 0

    @property
    def guided(self) -> bool:
        return self.scale != 1.0 and self.uncond is not None

    def predict(self, x_in: np.ndarray, timestep: float, **kwargs: Any) -> np.ndarray:
        """The guided raw network output for an input already scaled for the model."""
        if not self.guided:
            self.calls += 1
            return self.model.predict(x_in, timestep, cond=self.cond, **kwargs)
        if self.batched:
            n = x_in.shape[0]
            out = self.model.predict(np.concatenate([x_in, x_in], axis=0), timestep,
                                     cond=_stack(self.uncond, self.cond), **kwargs)
            self.calls += 2
            negative, positive = out[:n], out[n:]
        else:
            positive = self.model.predict(x_in, timestep, cond=self.cond, **kwargs)
            negative = self.model.predict(x_in, timestep, cond=self.uncond, **kwargs)
            self.calls += 2
        guided = negative + self.scale * (positive - negative)
        return rescale_guidance(guided, positive, self.rescale) if self.rescale else guided

    def __call__(self, x: np.ndarray, sigma: float, **kwargs: Any) -> np.ndarray:
        if self.guided and (self.batched or self.rescale):
            ms = self.model_sampling
            sigma = float(np.asarray(sigma).reshape(-1)[0])
            t = ms.timestep(sigma, quantize=getattr(self.model, "quantize", False))
            return ms.denoised(x, sigma, self.predict(ms.scale_input(x, sigma), float(t), **kwargs))
        positive = self.model(x, sigma, cond=self.cond, **kwargs)
        self.calls += 1
        if not self.guided:
            return positive
        negative = self.model(x, sigma, cond=self.uncond, **kwargs)
        self.calls += 1
        return negative + (positive - negative) * self.scale


class EditCFGDenoiser(CFGDenoiser):
    """InstructPix2Pix's guidance by text and by image (diffusers' ``StableDiffusionInstructPix2PixPipeline``, A1111's
    ``combine_denoised_for_edit_model``): one call of three row blocks ``[cond, uncond, uncond]``, the input image's
    latent concatenated to the first two and zeros to the third (the model's hook does that: it sees 3 blocks), and
    ``uncond_noimage + scale * (cond - uncond) + image_scale * (uncond - uncond_noimage)``. Affine in the outputs,
    so guiding the raw output equals guiding the denoised estimates."""

    def __init__(self, model: Any, cond: Any, uncond: Any, scale: float, image_scale: float) -> None:
        super().__init__(model, cond, uncond, scale, batched=True)
        self.image_scale = float(image_scale)

    @property
    def guided(self) -> bool:
        return True

    def predict(self, x_in: np.ndarray, timestep: float, **kwargs: Any) -> np.ndarray:
        n = x_in.shape[0]
        out = self.model.predict(np.concatenate([x_in, x_in, x_in], axis=0), timestep,
                                 cond=_stack(_stack(self.cond, self.uncond), self.uncond), **kwargs)
        self.calls += 3
        text, image, plain = out[:n], out[n:2 * n], out[2 * n:]
        return plain + self.scale * (text - image) + self.image_scale * (image - plain)


def rescale_guidance(guided: np.ndarray, positive: np.ndarray, rescale: float) -> np.ndarray:
    """diffusers' ``rescale_noise_cfg``: ``guided`` brought to ``positive``'s standard deviation per image (torch's
    ``std``, Bessel-corrected, over all but the batch axis), mixed ``rescale : 1 - rescale`` with ``guided``."""
    axes = tuple(range(1, guided.ndim))
    g = guided.astype(np.float64)
    spread = g.std(axis=axes, ddof=1, keepdims=True)
    # a constant guided output (the plan's dry run feeds zeros) has no spread to rescale: kept as it is
    ratio = positive.astype(np.float64).std(axis=axes, ddof=1, keepdims=True) / np.where(spread > 0, spread, 1.0)
    ratio = np.where(spread > 0, ratio, 1.0)
    return (rescale * g * ratio + (1.0 - rescale) * g).astype(guided.dtype, copy=False)


def _stack(first: Any, second: Any) -> Any:
    """Two conditionings as one batch: ``first``'s rows, then ``second``'s (per input for mappings)."""
    if isinstance(first, Mapping):
        return {k: np.concatenate([first[k], second[k]], axis=0) for k in first}
    return np.concatenate([first, second], axis=0)


def _float_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of a declared floating-point input, else None (feed as given)."""
    try:
        dtype = np.dtype(name)
    except TypeError:
        return None
    return dtype if dtype.kind == "f" else None
