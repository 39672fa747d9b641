"""inpaint_area="only masked" on the flow families (SD3, Flux dev, FLUX.1 Fill): they share the pipeline's inpainting
path, so the crop and the paste are the ones tests/pipelines/test_only_masked.py checks against diffusers'
padding_mask_crop on SD 1.x/XL. Here: an only-masked run is exactly the whole-picture run of the cut-out (the picture
and mask cut and fitted by sdrt.pipelines.onlymasked.prepare) pasted back, as diffusers' FluxInpaintPipeline and
StableDiffusion3InpaintPipeline compose it; their whole-picture inpainting is checked against diffusers by
scripts/check_family_variants.py. (The tiny flow models cannot be rebuilt in torch as committed: the reference venv's
random initialisation differs, so no diffusers image of these folders can be made now.)"""

from __future__ import annotations

import numpy as np
import pytest
from flow_helpers import folder, register, tool_folder

from sdrt import pipelines
from sdrt.pipelines.onlymasked import prepare

pytest.importorskip("PIL.Image", reason="the crop is fitted and pasted with Pillow")


def _picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    y, x = np.mgrid[0:80, 0:96]
    picture = np.clip(np.stack([x * 2, y * 3, 200 - x], -1) + rng.integers(0, 25, (80, 96, 3)), 0, 255)
    mask = np.zeros((80, 96), np.uint8)
    mask[44:70, 60:86] = 255
    mask[50:60, 40:60] = 128  # a grey part: kept half by the overlay
    return picture.astype(np.uint8), mask


@pytest.mark.parametrize("kind", ["sd3", "flux-dev", "fill"])
def test_only_masked_is_the_cut_out_run_pasted_back(kind: str, tmp_path) -> None:
    register("openvino")
    path = tool_folder("fill", tmp_path) if kind == "fill" else folder(kind)
    picture, mask = _picture_and_mask()
    common = dict(steps=2, seed=3, width=64, height=64, max_sequence_length=32,
                  **({} if kind == "fill" else {"strength": 0.8}))
    with pipelines.load(path, backend="openvino") as pipe:
        only = pipe.generate("a cat", init_image=picture, mask=mask, inpaint_area="only masked", inpaint_padding=6,
                             **common)
        cut, cut_mask, paste = prepare(picture, mask, 64, 64, 6)
        whole = pipe.generate("a cat", init_image=cut, mask=cut_mask, **common)
    assert only.images[0].shape == picture.shape
    np.testing.assert_array_equal(only.images[0], paste(whole.images[0]))
    changed = np.any(only.images[0] != picture, axis=-1)
    assert changed.any() and not changed[mask == 0].any()
    assert only.settings[0]["Inpaint area"] == "Only masked" and only.settings[0]["Masked area padding"] == 6
