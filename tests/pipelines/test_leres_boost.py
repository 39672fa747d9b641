"""The ``depth_leres++`` preprocessor (LeReS in BoostingMonocularDepth's merge: res101.pth and latest_net_G.pth)
against the extension's code.

References: scripts/ref_leres_boost.py ran controlnet_aux 0.0.10's LeReS network and ``Pix2Pix4DepthModel`` (the
extension's annotator/leres code, ``estimateboost`` through ``LeresDetector.__call__(boost=True)``) inside the
extension's ``resize_image_with_pad`` / crop, on the seeded narrow files leres_helpers writes here (the same bytes,
from a fixed seed), and the full-size generator on a seeded pair; tests/data/leres/leres_boost_refs.npz holds what
they made.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from leres_helpers import NARROW_NGF, make_generator, write_file, write_generator  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402
from ref_leres_boost import pair  # noqa: E402  (numpy only: the seeded input)

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import leresboost, leresdepth  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "leres"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "leres_boost_refs.npz")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """ComfyUI's layout: <root>/custom_nodes/comfyui_controlnet_aux/ckpts/lllyasviel/Annotators with both files."""
    root = tmp_path_factory.mktemp("boost")
    where = root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    write_file(where)
    write_generator(where)
    return root


def _files(folder):
    where = folder / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    return where / leresdepth.LERES_FILE, where / leresboost.PIX2PIX_FILE


def _padded(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    return np.pad(image, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")


def _close_maps(made: np.ndarray, want: np.ndarray, share: float, flips: bool = False) -> None:
    """Equal but for at most ``share`` of the values one level apart (``flips``: or, with a threshold set, a value
    that a level's difference moved across it: 0 or 255 on one side)."""
    d = np.abs(made.astype(np.int16) - want)
    assert made.shape == want.shape and made.dtype == np.uint8
    far = d > 1
    if flips:  # Remove Near % zeroes before the inversion (255 after it), Remove Background % after it (0)
        far &= ~np.isin(made, (0, 255)) & ~np.isin(want, (0, 255))
    assert not far.any() and (d > 0).mean() <= share, (int(d.max()), int((d > 0).sum()), int(far.sum()))


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_the_merge_network_is_pix2pixs(refs, folder, backend):
    """The narrow generator (10 levels, the inner blocks' in-place LeakyReLU on the skip) within float32 noise of
    torch's on a seeded 1024 x 1024 pair (measured: 1.2e-7 on OpenVINO). Not on the reference backend: onnx's
    evaluator takes about a minute for the 1024 x 1024 graph (it passes there too)."""
    register(backend)
    with leresboost.Pix2PixMerge(_files(folder)[1], backend=backend) as net:
        assert net.ngf == NARROW_NGF
        fake = net.session(leresboost.MERGE_SIZE).run({"pair": pair()[None]})["fake"][0, 0]
    np.testing.assert_allclose(fake[::8, ::8], refs["pair_tiny"], rtol=0, atol=2e-6)
    assert refs["pair_tiny"].std() > 0.05


def test_the_full_size_merge_network(refs, tmp_path):
    """The published generator's size (ngf 64: 79.6 M values, 318 MB) on OpenVINO, the same pair."""
    register("openvino")
    path = write_generator(tmp_path, 64)
    with leresboost.Pix2PixMerge(path, backend="openvino") as net:
        assert net.ngf == 64
        fake = net.session(leresboost.MERGE_SIZE).run({"pair": pair()[None]})["fake"][0, 0]
    np.testing.assert_allclose(fake[::8, ::8], refs["pair_full"], rtol=0, atol=2e-6)


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_a_small_image_is_the_double_estimate(refs, folder, backend):
    """A 200 x 150 image (padded 256 x 192, under R_x = 448: no patches): LeReS at 448 twice, merged, resized; the
    merged depth within 5e-4 of its range of torch's (measured 4e-4: sdrt's bilinear uint8 resize to 448 is a level
    off OpenCV's on ~0.05 % of the values), the map a level apart on under 1 % of its values (measured 0.7 %)."""
    register(backend)
    res101, generator = _files(folder)
    with leresdepth.LeresDepth(res101, backend=backend) as le, leresboost.Pix2PixMerge(generator, backend=backend) as mg:
        det = leresboost.LeresBoost(le, mg)
        padded = _padded(refs["small_image"])
        assert leresboost.processing_res(padded)[0] == 448
        raw = det.depth(padded)
        made = det(refs["small_image"])
        thr = det(refs["small_image"], 10, 40)
    want = refs["small_raw"]
    np.testing.assert_allclose(raw, want, rtol=0, atol=5e-4 * float(np.abs(want).max()))
    assert refs["small_map"].std() > 10
    _close_maps(made, refs["small_map"], 0.01)
    _close_maps(thr, refs["small_map_thr"], 0.01, flips=True)
    assert (thr != made).any()


def test_a_large_image_merges_its_patches(refs, folder):
    """A 448 x 448 picture (R_x 448 = its side: the patches run, chosen from its gradients, merged biggest first):
    R_x and the patch scale as BoostingMonocularDepth's, the merged depth within 2e-4 of its range (measured 6.5e-5),
    the map a level apart on under 0.2 % of its values (measured 0.1 %). OpenVINO: about 8 s a run on two cores."""
    register("openvino")
    res101, generator = _files(folder)
    image = refs["big_image"]
    with leresdepth.LeresDepth(res101, backend="openvino") as le, \
            leresboost.Pix2PixMerge(generator, backend="openvino") as mg:
        r, scale = leresboost.processing_res(image)
        assert r == int(refs["big_r"]) and scale == pytest.approx(float(refs["big_scale"]), abs=1e-12)
        det = leresboost.LeresBoost(le, mg)
        raw = det.depth(image)
        made = det(image)
    want = refs["big_raw"]
    np.testing.assert_allclose(raw[::4, ::4], want, rtol=0, atol=2e-4 * float(np.abs(want).max()))
    _close_maps(made, refs["big_map"], 0.002)


def test_the_resolution_search_is_boostingmonoculardepths(refs):
    """R_x and the patch scale of pictures from few to many edges (R_x 448 to 1120) as ``calculateprocessingres``
    gives them."""
    from ref_leres_boost import RES_CASES, res_case

    got = np.array([leresboost.processing_res(res_case(*c)) for c in RES_CASES])
    assert got[:, 0].tolist() == refs["res_cases"][:, 0].tolist() and len({*got[:, 0]}) == 3
    np.testing.assert_allclose(got[:, 1], refs["res_cases"][:, 1], rtol=0, atol=1e-12)


def test_opencvs_float_steps():
    """The float resizes' taps (OpenCV keeps float images' positions in doubles; a float64 cubic from float32
    positions), the 14 x 14 dilation's anchor (offsets -7 to 6), max pooling padded with zeros, the mask."""
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    assert np.array_equal(leresboost.resize_float(a, 4, 3), a)
    up = leresboost.resize_float(np.array([[0.0, 1.0]], np.float32), 4, 1, "linear")
    np.testing.assert_allclose(up, [[0.0, 0.25, 0.75, 1.0]])
    one = np.zeros((20, 20))
    one[10, 10] = 1
    d = leresboost._dilate(one, 14)
    rows = np.flatnonzero(d[:, 10])
    assert rows.min() == 4 and rows.max() == 17  # y in 10 - 6 .. 10 + 7: the window reaches -7..+6 of each output
    # size 2 of 5: blocks of floor(5 / 2) = 2, the last ones padded with 0 (skimage's block_reduce, checked)
    assert leresboost._pool_max(np.arange(25.0).reshape(5, 5), 2).tolist() == [[6, 8, 9], [16, 18, 19], [21, 23, 24]]
    mask = leresboost.gaussian_mask(300)
    assert mask.dtype == np.float32 and mask.max() == 1 and mask.min() == 0
    assert mask[150, 150] == 1 and mask[0, 0] == 0 and np.allclose(mask, mask.T)


def test_files_errors_and_small_images(folder, tmp_path):
    """Both files are found in ComfyUI's folder; another network's file is one line naming it; an image whose
    padded longer side is under 160 pixels (the extension fails there) is one line naming the processor
    resolution."""
    from sdrt.pipelines import annotators, preprocessors

    assert [f.name for f in annotators.find("depth_leres++", folder, "m")] == ["res101.pth", "latest_net_G.pth"]
    weights = make_generator()
    weights.pop("model.model.3.bias")
    with pytest.raises(ModelError, match="merge network") as e:
        leresboost.Pix2PixMerge(write_pth(tmp_path / "cut.pth", weights))
    assert "\n" not in str(e.value) and "model.model.3.bias" in str(e.value)
    with pytest.raises(ModelError, match="latest_net_G.pth"):
        leresboost.Pix2PixMerge(_files(folder)[0])  # LeReS's file given as the merge network
    with pytest.raises(InputError, match="depth_leres\\+\\+ preprocessor needs LeReS's res101.pth and latest_net_G.pth"):
        preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "depth_leres++")
    register("openvino")
    with pytest.raises(InputError, match="at least 160 pixels") as e:
        preprocessors.preprocess(np.zeros((100, 120, 3), np.uint8), "depth_leres++", models=folder,
                                 backend="openvino")
    assert e.value.where.endswith("processor_res") and "\n" not in str(e.value)
    with pytest.raises(InputError, match="remove background %"):
        preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "depth_leres++", None, 120, models=folder)


def test_preprocess_api_and_the_kept_networks(refs, folder):
    """preprocess() at the image's own size makes the reference's map; LeReS is kept under depth_leres (shared with
    that module) and the merge network under leres_pix2pix, both released by the plan's release(depth_leres++)."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    preprocessors.release()
    before = preprocessors.keep_preprocessors(2)
    try:
        made = preprocessors.preprocess(refs["small_image"], "depth_leres++", resolution=150, models=folder,
                                        backend="openvino")
        assert made.shape == (150, 200, 3) and (made[..., 0] == made[..., 1]).all()
        _close_maps(made[..., 0], refs["small_map"], 0.01)
        assert sorted(k for k, *_ in preprocessors.kept_detectors()) == ["depth_leres", "leres_pix2pix"]
        det = preprocessors.detector("depth_leres++", folder)
        assert det.kind == "depth_leres++" and [f.name for f in det.files] == ["res101.pth", "latest_net_G.pth"]
        assert preprocessors.release(det.kind, det.files) == 2 and preprocessors.kept_detectors() == []
    finally:
        preprocessors.keep_preprocessors(before)
        preprocessors.release()


def test_depth_leres_boost_on_the_command_line(refs, folder, tmp_path, capsys):
    """The CLI runs depth_leres++ from an A1111/ComfyUI root (the map at the image's own size); a picture too small
    for its resolution search is one line; a slider above 100 is refused before anything runs."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt.cli import main
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    with pytest.raises(InputError, match="remove near %, must be a number from 0 to 100"):
        parse_units([ControlNet("controlnet", refs["small_image"], preprocessor="depth_leres++", low=101,
                                preprocessor_models=folder)])
    png, out = tmp_path / "room.png", tmp_path / "out.png"
    Image.fromarray(refs["small_image"]).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--seed", "3",
            "--backend", fast_backend(), "--control-preprocessor", "depth_leres++",
            "--control-preprocessor-models", str(folder), "--control-processor-res", "none"]
    assert main([*args, "--control-image", str(png), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: depth_leres++, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    Image.fromarray(refs["small_image"][:60, :80]).save(png)
    assert main([*args, "--control-image", str(png), "-o", str(out)]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the backend's line: the one-line error
    assert last.startswith("error:") and "160 pixels" in last and "128x64" in last, last  # 80x60, padded


def test_the_boosts_large_uint8_resizes_hold_no_full_size_float_copies():
    """The boost resizes the image up to twice R_x over its factor (up to 10 x 1568 pixels a side: a 2048x1536 photo
    of a few stars is resized to 13440x10080) and back: cvresize's bicubic works in strips of output rows, so its
    peak is a few output images' bytes, not ~40 (float64 copies of the whole), and its output is unchanged."""
    import tracemalloc

    from sdrt.pipelines import cvresize

    rgb = np.random.default_rng(4).integers(0, 256, (600, 800, 3), dtype=np.uint8)
    tracemalloc.start()
    try:
        big = cvresize.resample(rgb, 3200, 2400, "cubic")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert big.shape == (2400, 3200, 3) and peak < 4 * big.nbytes, peak / big.nbytes
    small = cvresize.resample(big, 800, 600, "cubic")
    strips = cvresize._STRIP
    try:
        cvresize._STRIP = 1 << 40  # one strip: the whole image at once, the same values
        assert np.array_equal(cvresize.resample(rgb, 3200, 2400, "cubic"), big)
        assert np.array_equal(cvresize.resample(big, 800, 600, "cubic"), small)
    finally:
        cvresize._STRIP = strips


def test_patches_grow_as_the_extensions(refs):
    """The patches selected on pictures whose dense part lies inside (the 448 x 448 one's patches all touch its
    edge, where growing stops at once): grown by int(32 / factor) while their gradient density stays at least the
    whole's and they stay inside, biggest first, as the extension's ``generatepatchs`` selects them."""
    from ref_leres_boost import PATCH_CASES, patch_image

    want = refs["patch_cases"]
    for i, (spec, factor) in enumerate(PATCH_CASES):
        got = leresboost.patches(patch_image(*spec), factor)
        assert got == want[want[:, 0] == i, 1:].tolist(), (i, got)
    assert (want[:, 3] > 896).any()  # some grew


def test_the_files_where_the_extension_reads_each(tmp_path):
    """An A1111 install that keeps res101.pth in the extension's older place (annotator/leres, read first) and
    latest_net_G.pth in annotator/downloads/leres (the only place the extension reads it): depth_leres++ finds each
    where the extension reads it, and the same res101.pth as depth_leres (one LeReS kept for both); a missing
    generator is named alone."""
    from sdrt.pipelines import annotators

    ann = tmp_path / "extensions" / "sd-webui-controlnet" / "annotator"
    (ann / "leres").mkdir(parents=True)
    (ann / "downloads" / "leres").mkdir(parents=True)
    (ann / "leres" / "res101.pth").write_bytes(b"x")
    with pytest.raises(InputError, match="no latest_net_G.pth in") as e:
        annotators.find("depth_leres++", tmp_path, "m")
    assert "res101.pth" not in str(e.value).split(" in ")[0]
    (ann / "downloads" / "leres" / "latest_net_G.pth").write_bytes(b"x")
    assert annotators.find("depth_leres++", tmp_path, "m") == (ann / "leres" / "res101.pth",
                                                               ann / "downloads" / "leres" / "latest_net_G.pth")
    (ann / "downloads" / "leres" / "res101.pth").write_bytes(b"x")
    assert annotators.find("depth_leres++", tmp_path, "m")[0] == annotators.find("depth_leres", tmp_path, "m")[0]
