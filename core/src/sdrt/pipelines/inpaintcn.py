"""ControlNet inpainting as sd-webui-controlnet does it (lllyasviel's ``control_v11p_sd15_inpaint``).

The preprocessors ``inpaint`` (the extension's label ``inpaint_global_harmonious``) and ``inpaint_only`` give the
net a hint made of the picture and a mask, step for step as the extension (``scripts/controlnet.py``
``choose_input_image`` / ``detectmap_proc``, ``scripts/hook.py``):

- the map is RGBA: the unit's picture and its mask as alpha (no mask: alpha 0, nothing masked); a unit without a
  picture in img2img takes the init image and the run's mask (blurred as the run blurs it);
- it is resized to the pass's size as other maps are (the interpolation picked from the picture's colours), the
  alpha with the same interpolation, then thresholded: ``> 127`` is 255;
- the hint is ``rgb / 255`` where alpha is 0 and ``-1`` where it is 255 (``c * (1 - m) - m``, ``m = a / 255 > 0.5``),
  diffusers' ``make_inpaint_condition``;
- ``inpaint_only`` also keeps what lies outside the mask: after every UNet call the predicted ``x0`` outside the
  mask (max-pooled to the latent grid: 10x10, stride 8, padding 1) is replaced by the VAE latent of the map's
  picture and the noise prediction recomputed from it, mixed at the unit's weight (clipped to 0..1); and the
  decoded image is blended with the map's picture, the mask dilated and box-blurred by 7 pixels
  (``control_net_inpaint_blur_sigma``). In a run with its own mask (A1111 inpainting) the extension runs
  ``inpaint_only`` as ``inpaint``, and so does sdrt.

``inpaint_only+lama`` (:mod:`sdrt.pipelines.lamafill`) fills the mask with LaMa first; the filled picture (the mask
kept as alpha) is then the map, as ``inpaint_only``'s picture is: the same hint, restore and pixel blend, which the
extension runs in a run with its own mask too (its fallback to ``inpaint`` is for ``inpaint_only`` alone). With
``Resize and Fill`` the picture is first fitted to the pass's size (the padding masked) so that LaMa fills the
padding: outpainting. And the run's noise of the first batch (A1111's ``p.rng``: the first noise, and an ancestral
sampler's draws at that size) becomes ``sqrt(acp[999]) * latent + sqrt(1 - acp[999]) * noise``, the latent being
the filled picture's (the extension's ``HackedImageRNG``; :func:`lean_noise`).

The picture's latent is the VAE encoder's mean (the extension samples the posterior with torch's global generator,
whose spread is about 1e-3 of the latent).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ALIASES", "INPAINT", "LAMA", "blend_pixels", "hint", "latent_mask", "lean_noise", "resize_map", "restore_eps",
           "rgba", "unleaned"]

#: sdrt's inpaint preprocessors (the extension's module names)
INPAINT = ("inpaint", "inpaint_only", "inpaint_only+lama")
#: the extension's label for ``inpaint``
ALIASES = {"inpaint_global_harmonious": "inpaint"}
#: ``inpaint_only`` with LaMa's fill of the mask first (sdrt.pipelines.lamafill; its model file is the unit's
#: ``preprocessor_models``): the filled picture is the map's, and the run's first noise leans towards its latent
LAMA = "inpaint_only+lama"
#: ``control_net_inpaint_blur_sigma``'s default: the pixel blend's dilation and box blur
BLUR = 7


def rgba(rgb: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The extension's RGBA input: ``rgb`` (HxWx3 uint8) with ``mask`` (HxW uint8, white = repaint; None: zeros) as
    alpha. The caller checks the sizes."""
    alpha = np.zeros(rgb.shape[:2], np.uint8) if mask is None else np.asarray(mask, np.uint8)
    return np.ascontiguousarray(np.concatenate([rgb[:, :, :3], alpha[:, :, None]], axis=2))


def _hq_resize(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """``high_quality_resize`` of an RGBA map: the picture as :func:`controlmaps._hq_resize` resizes a map, the
    alpha with the same interpolation, then ``> 127`` -> 255."""
    from .cvresize import resample
    from .edgethin import binarize, one_pixel_edges

    h, w = a.shape[:2]
    rgb, alpha = a[:, :, :3], a[:, :, 3]
    if (h, w) != (height, width):
        packed = rgb[:, :, 0].astype(np.uint32) << 16 | rgb[:, :, 1].astype(np.uint32) << 8 | rgb[:, :, 2]
        ordered = np.sort(packed, axis=None)
        colors = int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1
        binary = colors == 2 and int(rgb.min()) < 16 and int(rgb.max()) > 240
        one_pixel = binary and one_pixel_edges(rgb)
        kind = "nearest" if 2 < colors < 200 else "area" if width * height < w * h else "cubic"
        rgb = resample(np.ascontiguousarray(rgb), width, height, kind)
        alpha = resample(np.ascontiguousarray(alpha), width, height, kind)
        if binary:
            rgb = binarize(rgb, one_pixel, width * height > w * h)
    alpha = np.where(alpha > 127, 255, 0).astype(np.uint8)
    return np.ascontiguousarray(np.concatenate([rgb, alpha[:, :, None]], axis=2))


def resize_map(a: np.ndarray, width: int, height: int, mode: str) -> np.ndarray:
    """The RGBA map at ``width x height`` with the unit's resize mode, as the extension's ``detectmap_proc`` resizes
    an inpaint map (:func:`sdrt.pipelines.controlmaps.fit`: ``Resize and Fill`` pads with the borders' median
    colour, masked)."""
    from .controlmaps import fit

    return fit(a, width, height, mode, _hq_resize, "control image")


def hint(a: np.ndarray) -> np.ndarray:
    """``controlnet_cond`` of an RGBA map (HxWx4 uint8): ``(1, 3, H, W)`` float32, the picture in [0, 1] and -1
    under the mask, as the extension's hook makes it."""
    x = a.astype(np.float32) / np.float32(255.0)
    c, m = x[:, :, :3], (x[:, :, 3:4] > 0.5).astype(np.float32)
    return (c * (1 - m) - m).transpose(2, 0, 1)[None].copy()


def latent_mask(a: np.ndarray) -> np.ndarray:
    """The map's mask on the latent grid, ``(1, 1, H/8, W/8)`` float32: ``max_pool2d((10, 10), stride 8,
    padding 1)`` of alpha / 255, as the extension's restore step."""
    m = a[:, :, 3].astype(np.float32) / np.float32(255.0)
    h, w = m.shape
    p = np.pad(m, 1, constant_values=-np.inf)
    oh, ow = (h + 2 - 10) // 8 + 1, (w + 2 - 10) // 8 + 1
    out = np.empty((oh, ow), np.float32)
    for i in range(oh):
        rows = p[i * 8:i * 8 + 10]
        for j in range(ow):
            out[i, j] = rows[:, j * 8:j * 8 + 10].max()
    return out[None, None]


def restore_eps(eps: np.ndarray, x_in: np.ndarray, timestep: float, alphas_cumprod: np.ndarray,
                mask: np.ndarray, origin: np.ndarray, weight: float) -> np.ndarray:
    """The extension's ``inpaint_only`` restore of one UNet call: ``x0`` predicted from the noise ``eps`` at the
    scaled input ``x_in`` (the DDPM ``x_t``) and the rounded ``timestep``, the picture's latent ``origin`` put back
    outside ``mask``, the noise recomputed, mixed with ``eps`` at ``weight`` clipped to [0, 1]."""
    from .scheduling import through_x0

    return through_x0(eps, x_in, timestep, alphas_cumprod, weight, lambda x0: x0 * mask + origin * (1 - mask))


def _max3(m: np.ndarray, r: int, axis: int) -> np.ndarray:
    n = m.shape[axis]
    p = np.pad(m, [(r, r) if k == axis else (0, 0) for k in range(2)], constant_values=-np.inf)
    return np.max([np.take(p, np.arange(d, d + n), axis=axis) for d in range(2 * r + 1)], axis=0)


def _box(m: np.ndarray, k: int, axis: int) -> np.ndarray:
    n, r = m.shape[axis], k // 2
    p = np.pad(m, [(r, k - 1 - r) if a == axis else (0, 0) for a in range(2)], mode="reflect")
    return np.sum([np.take(p, np.arange(d, d + n), axis=axis) for d in range(k)], axis=0) / np.float32(k)


def blend_pixels(image: np.ndarray, a: np.ndarray, k: int = BLUR) -> np.ndarray:
    """The extension's ``inpaint_only`` post-processing of a decoded image (HxWx3 uint8): the mask dilated by a
    ``k x k`` square (``cv2.dilate``) and box-blurred ``k x k`` (``cv2.blur``, borders reflected), the image kept
    there and the map's picture elsewhere."""
    m = a[:, :, 3].astype(np.float32) / np.float32(255.0)
    r = k // 2
    m = _max3(_max3(m, r, 0), r, 1) if k > 1 else m
    m = _box(_box(m, k, 1), k, 0).astype(np.float32)[:, :, None]
    x = image.astype(np.float32) / np.float32(255.0)
    raw = a[:, :, :3].astype(np.float32) / np.float32(255.0)
    y = np.clip(m * x + (1 - m) * raw, 0, 1)
    return np.clip(np.round(y * 255), 0, 255).astype(np.uint8)


def lean_noise(noise: np.ndarray, latent: np.ndarray, alphas_cumprod: np.ndarray) -> np.ndarray:
    """The extension's ``HackedImageRNG`` of one draw: ``predict_q_sample(x0=latent, t=999, noise)`` in float32."""
    acp = np.asarray(alphas_cumprod, np.float64)[999]
    a, b = np.float32(np.sqrt(acp)), np.float32(np.sqrt(1.0 - acp))
    return (a * latent.astype(np.float32) + b * noise.astype(np.float32)).astype(np.float32)


class LeanNoise:
    """A run's noise source whose draws of the latent's size lean towards ``latent`` (:func:`lean_noise`): the
    extension's ``HackedImageRNG`` around A1111's ``p.rng``. The VAE's own draws (``vae_generator``) are left as
    they are."""

    def __init__(self, inner: Any, latent: np.ndarray, alphas_cumprod: np.ndarray) -> None:
        self.inner, self.latent, self.alphas_cumprod = inner, latent, alphas_cumprod
        #: the last draw as the inner source gave it (:func:`unleaned`)
        self.raw: np.ndarray | None = None

    @property
    def vae_generator(self) -> Any:
        return getattr(self.inner, "vae_generator", self.inner)

    def randn(self, shape: Any) -> np.ndarray:
        noise = self.raw = self.inner.randn(shape)
        if np.ndim(noise) == 4 and noise.shape[1:] == self.latent.shape[1:]:
            return lean_noise(noise, self.latent, self.alphas_cumprod)
        return noise

    def __getattr__(self, name: str) -> Any:
        if "inner" not in self.__dict__:  # (copy and pickle look for hooks before the state is back)
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)


def unleaned(generator: Any, noise: np.ndarray) -> np.ndarray:
    """``noise``, the draw just taken from ``generator``, as drawn before a :class:`LeanNoise` leaned it: A1111's
    "latent noise" masked content is ``create_random_tensors`` of the seeds, not ``p.rng``'s draw the extension
    hacks."""
    raw = generator.raw if isinstance(generator, LeanNoise) else None
    return noise if raw is None else raw


def check_size(rgb: np.ndarray, mask: np.ndarray, where: str) -> None:
    from ..errors import InputError

    if mask.shape[:2] != rgb.shape[:2]:
        raise InputError(f"{where}: the control mask is {mask.shape[1]}x{mask.shape[0]} and its image "
                         f"{rgb.shape[1]}x{rgb.shape[0]}", where=f"{where} control_mask",
                         fix="give a mask of the control image's size (white = repaint)")


def is_inpaint(name: Any) -> bool:
    return name in INPAINT
