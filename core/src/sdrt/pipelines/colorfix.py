"""sd-webui-controlnet's ``tile_colorfix`` and ``tile_colorfix+sharp`` (for the tile ControlNet,
``control_v11f1e_sd15_tile``), step for step as the extension (``scripts/hook.py``, its UNet forward):

- the map is the unit's image as it is (the extension's preprocessor is ``identity``: no resolution, no down
  sampling), resized to the pass's size as other maps are; the net gets it as any map;
- the map's picture is VAE-encoded (``used_hint_cond_latent``), and after every UNet call, on every row and every
  step of every pass (the unit's guidance window and ``hr_option`` do not gate it; they gate the net), the
  predicted ``x0`` (from the noise at the scaled input, the DDPM ``x_t``, and the rounded timestep) keeps its high
  frequencies and takes the picture latent's low ones: ``x0 - blur(x0, k) + blur(origin, k)``, ``blur`` a
  ``(2k+1)`` box mean over the latent with its edges replicated, ``k`` the ``Variation`` slider
  (``threshold_a``, 8, truncated to a whole number; doubled in the hires fix's second pass when the unit takes part
  in it); the noise is recomputed from that ``x0`` and mixed with the UNet's at the unit's weight clipped to
  [0, 1];
- ``+sharp``: on the uncond rows of a CFG batch only, ``x0`` is then pulled toward its own blur by
  ``Sharpness * 0.01`` (``threshold_b``, 1.0), so that the guidance pushes away from a blur: sharper;
- it reads the UNet's output as noise at a DDPM timestep: an eps model's (SD 1.x, SDXL). A v-prediction model is
  refused (the extension would read its v as noise), and so is an EDM-trained one (Playground v2.5: no
  ``alphas_cumprod``), as the transformer families' nets are.

The picture's latent is the VAE encoder's mean (the extension samples the posterior with torch's global generator,
whose spread is about 1e-3 of the latent), as :mod:`sdrt.pipelines.inpaintcn`'s restore.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NAMES", "SHARP", "blur", "cond_marks", "fix_eps", "radius"]

#: the colour-fix preprocessors (the extension's module names)
NAMES = ("tile_colorfix", "tile_colorfix+sharp")
#: the one that also sharpens
SHARP = "tile_colorfix+sharp"


def radius(variation: float | None, hires: bool = False) -> int:
    """The blur's ``k``: ``int(threshold_a)`` (8 when not given), twice that in the hires fix's second pass for a
    unit that takes part in it."""
    k = int(8.0 if variation is None else variation)
    return 2 * k if hires else k


def blur(x: np.ndarray, k: int) -> np.ndarray:
    """The extension's ``blur``: ``x`` (N, C, H, W) padded by ``k`` with its edges replicated, then the mean of each
    ``(2k+1) x (2k+1)`` window (``avg_pool2d``, stride 1): the same shape, float32."""
    x = np.asarray(x, np.float32)
    if k <= 0:
        return x.copy()
    p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (k, k), (k, k)), mode="edge")
    n = 2 * k + 1
    c = np.cumsum(np.pad(p, ((0, 0), (0, 0), (1, 0), (0, 0))), axis=2)
    rows = c[:, :, n:] - c[:, :, :-n]
    c = np.cumsum(np.pad(rows, ((0, 0), (0, 0), (0, 0), (1, 0))), axis=3)
    return ((c[:, :, :, n:] - c[:, :, :, :-n]) / (n * n)).astype(np.float32)


def cond_marks(rows: int, batch: int | None) -> np.ndarray:
    """``(rows, 1, 1, 1)`` float32, 1 on the rows of a positive prompt and 0 on the uncond ones (the extension's
    ``cond_mark``): a guided call of ``2 * batch`` rows is ``[uncond, cond]`` (sdrt's batched CFG), one of
    ``3 * batch`` an InstructPix2Pix call ``[cond, uncond, uncond]``; any other call is all cond."""
    mark = np.ones((rows, 1, 1, 1), np.float32)
    if batch and rows == 2 * batch:
        mark[:batch] = 0
    elif batch and rows == 3 * batch:
        mark[batch:] = 0
    return mark


def fix_eps(eps: np.ndarray, x_in: np.ndarray, timestep: float, alphas_cumprod: np.ndarray, origin: np.ndarray,
            k: int, weight: float, sharpness: float | None = None, marks: np.ndarray | None = None) -> np.ndarray:
    """The extension's colour fix of one UNet call: ``x0`` predicted from the noise ``eps`` at the scaled input
    ``x_in`` and the rounded ``timestep``, its low frequencies (``blur`` of radius ``k``) replaced by the picture
    latent ``origin``'s; with ``sharpness`` (``+sharp``) the rows whose ``marks`` are 0 pulled toward their blur by
    ``sharpness * 0.01``; the noise recomputed and mixed with ``eps`` at ``weight`` clipped to [0, 1]."""
    from .scheduling import through_x0

    def change(x0: np.ndarray) -> np.ndarray:
        x0 = x0 - blur(x0, k) + blur(origin, k)
        if sharpness is not None:
            d = np.float32(float(sharpness) * 0.01)
            neg = d * blur(x0, k) + (1 - d) * x0
            mark = np.ones((x0.shape[0], 1, 1, 1), np.float32) if marks is None else marks
            x0 = mark * x0 + (1 - mark) * neg
        return x0

    return through_x0(eps, x_in, timestep, alphas_cumprod, weight, change)
