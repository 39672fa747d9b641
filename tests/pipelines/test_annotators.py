"""sdrt.pipelines.annotators.find: what the API's preprocessor_models takes, and one line for what it does not."""

from __future__ import annotations

import numpy as np
import pytest

from sdrt.errors import InputError
from sdrt.pipelines.annotators import find


@pytest.mark.parametrize("models", [5, 3.5, b"/tmp", {"a": 1}, [5], [""], ""])
@pytest.mark.parametrize("name", ["mlsd", "dw_openpose_full", "depth_midas"])
def test_models_that_are_no_paths_are_one_line(models, name):
    """A number, bytes, a mapping, a list holding a non-path or an empty path: one line naming the argument (a
    number or bytes went into Path() or were iterated: a TypeError's traceback; "" searched the current folder)."""
    with pytest.raises(InputError) as e:
        find(name, models, "controlnets[0] preprocessor_models")
    assert "\n" not in str(e.value) and str(e.value).startswith("controlnets[0] preprocessor_models")


def test_a_pathlike_is_a_path(tmp_path):
    (tmp_path / "mlsd_large_512_fp32.pth").write_bytes(b"x")

    class Folder:
        def __fspath__(self) -> str:
            return str(tmp_path)

    assert find("mlsd", Folder(), "m") == (tmp_path / "mlsd_large_512_fp32.pth",)


def test_a_unit_with_a_number_for_its_files_is_refused_in_its_words():
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(InputError, match=r"^controlnets\[0\] preprocessor_models must be a folder"):
        parse_units([ControlNet("controlnet", img, preprocessor="mlsd", preprocessor_models=5)])
    with pytest.raises(InputError, match=r"^controlnets\[0\] pose_models must be a folder"):
        parse_units([ControlNet("controlnet", img, preprocessor="openpose", pose_models=b"/x")])
