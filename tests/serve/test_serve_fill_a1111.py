"""img2img's inpainting_fill 0 against AUTOMATIC1111's own ``masking.fill``, run on the same pictures and masks
by scripts/gen_a1111_fill_refs.py (tests/serve/data/a1111_fill.npz): a wide and a tall picture, a hard and a
blurred mask, a mask on the border, nothing masked, all but three pixels masked, a picture wider than the widest
blur. Both are Pillow's blurs and composites: equal pixel for pixel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL.Image", reason="the fill is Pillow's")

DATA = Path(__file__).parent / "data" / "a1111_fill.npz"
CASES = ("wide_blob", "tall_soft_border", "all_kept", "almost_all", "wider_than_radius", "request_64")


@pytest.fixture(scope="module")
def refs():
    with np.load(DATA) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("case", CASES)
def test_fill_is_a1111s(refs, case: str) -> None:
    from sdrt.pipelines.maskedcontent import fill

    picture, mask, want = refs[f"{case}/picture"], refs[f"{case}/mask"], refs[f"{case}/filled"]
    before = picture.copy()
    got = fill(picture, mask)
    np.testing.assert_array_equal(picture, before)  # the caller's picture is not written to
    assert got.shape == want.shape and got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


def test_the_references_fill_from_the_surroundings(refs) -> None:
    """What the fixture holds: kept pixels come back, the area to repaint is no single colour (the mean-colour
    fill was), and far from the kept pixels it takes the nearer side's colour."""
    picture, mask, filled = refs["wide_blob/picture"], refs["wide_blob/mask"], refs["wide_blob/filled"]
    np.testing.assert_array_equal(filled[mask == 0], picture[mask == 0])
    assert len(np.unique(filled[mask == 255].reshape(-1, 3), axis=0)) > 10
    np.testing.assert_array_equal(refs["all_kept/filled"], refs["all_kept/picture"])
    wide, wmask = refs["wider_than_radius/filled"], refs["wider_than_radius/mask"]
    assert wmask[:, 255].all() and wmask[:, 555].all()
    # the picture is red on the right (x * 200 // w): the two ends of the masked span differ in red
    assert int(wide[:, 555, 0].mean()) - int(wide[:, 255, 0].mean()) > 50
