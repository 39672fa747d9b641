"""``depth_midas`` / ``normal_midas`` (MiDaS v3 DPT-Hybrid, dpt_hybrid-midas-501f0c75.pt) against the extension's code.

References: scripts/ref_midas.py ran controlnet_aux 0.0.10's ``DPTDepthModel`` (the extension's annotator/midas
network code) loaded through ``torch.save`` / its ``path=`` from the seeded weights midas_helpers builds here, and
the extension's ``resize_image_with_pad`` + ``apply_midas`` around it; tests/data/midas holds its inputs, raw
depths, maps, the full model's tensor layout, and (full_refs.npz) the full-size network once at 64x64.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from midas_helpers import DATA, SMALL, full_layout, make_weights  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import midasdepth  # noqa: E402


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "refs.npz")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """sd-webui-controlnet's layout: <models>/extensions/sd-webui-controlnet/annotator/downloads/midas."""
    root = tmp_path_factory.mktemp("midas")
    folder = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "midas"
    folder.mkdir(parents=True)
    write_pth(folder / midasdepth.MIDAS_FILE, make_weights(SMALL))
    return root


def _close_maps(made: np.ndarray, ref: np.ndarray, share: float) -> None:
    """Maps equal but for float rounding at uint8 steps: at most ``share`` of the pixels differ."""
    assert made.shape == ref.shape and made.dtype == np.uint8
    off = (made != ref).reshape(ref.shape[0], ref.shape[1], -1).any(-1)
    assert off.mean() <= share, (int(off.sum()), off.size)


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_depth_and_normal_equal_the_extension(refs, models, backend):
    """The raw depth within float32 rounding of torch's, and both maps as the extension makes them, for a scaled,
    padded, non-square image (a 6x6 position grid resized to 8x4) and a 64x64 one (4x4)."""
    register(backend)
    with midasdepth.MidasDepth(midasdepth.find_file(models), backend=backend) as net:
        for key, bg in (("a", 0.4), ("b", 0.1)):
            padded, raw = refs[f"{key}_padded"], refs[f"{key}_raw"]
            depth = net.depth(padded)
            assert depth.shape == raw.shape and raw.max() > 5 and (raw == 0).mean() > 0.05
            np.testing.assert_allclose(depth, raw, atol=2e-4 * float(raw.max()))
            dmap, nmap = net.maps(padded, bg)
            h, w = refs[f"{key}_depth"].shape[:2]
            _close_maps(dmap[:h, :w], refs[f"{key}_depth"][..., 0], 0.002)
            _close_maps(nmap[:h, :w], refs[f"{key}_normal"], 0.002)


@pytest.mark.parametrize("bg", [0.1, 0.4])
def test_post_processing_equals_the_extension(refs, bg):
    """apply_midas' min-max depth map and Sobel normal map, bit for bit, of a depth with a positive minimum and flat
    areas (controlnet_aux's MidasDetector around a stand-in network that returns it)."""
    assert refs["post_in"].min() >= 1
    assert np.array_equal(midasdepth.depth_image(refs["post_in"]), refs[f"post_depth_{bg}"])
    made = midasdepth.normal_image(refs["post_in"], bg)
    assert np.array_equal(made, refs[f"post_normal_{bg}"]), int((made != refs[f"post_normal_{bg}"]).any(-1).sum())


@pytest.mark.parametrize("key", ["sobel", "sobel_even", "sobel_wide"])
def test_sobel_equals_opencv(refs, key):
    """cv2.Sobel (CV_32F, ksize 3) bit for bit: odd and even widths with a scalar tail, and a multiple of 64."""
    assert np.array_equal(midasdepth.sobel3(refs[f"{key}_in"], 1, 0), refs[f"{key}_x"])
    assert np.array_equal(midasdepth.sobel3(refs[f"{key}_in"], 0, 1), refs[f"{key}_y"])


def test_the_published_layout_is_read():
    """The tensors of controlnet_aux's DPTDepthModel (the file's names and shapes, tests/data/midas/layout.json):
    read as the published sizes; the network reads all but timm's unused norm and head and refinenet4's unused
    first unit."""
    layout = full_layout()
    size = midasdepth.sizes(layout)
    assert size == dict(embed=768, depth=12, layers=[3, 4, 9], stem=64, channels=[256, 512, 1024], features=256,
                        grid=24, mlp=3072) == midasdepth.PUBLISHED
    want = midasdepth.expected_shapes(**size)
    assert want == midasdepth.expected_shapes() and all(layout[n] == s for n, s in want.items())
    unused = sorted(set(layout) - set(want))
    assert unused == sorted(["pretrained.model.norm.weight", "pretrained.model.norm.bias",
                             "pretrained.model.head.weight", "pretrained.model.head.bias"]
                            + [f"scratch.refinenet4.resConfUnit1.conv{i}.{k}" for i in (1, 2)
                               for k in ("weight", "bias")])
    assert {midasdepth.bare(f"module.{k}") for k in layout} == set(layout)
    assert midasdepth.sizes({k: v for k, v in layout.items() if "blocks.11." not in k}) == size  # checked as published


def test_files_and_errors(tmp_path, models):
    with pytest.raises(InputError) as e:
        midasdepth.find_file(tmp_path, what="--control-preprocessor-models")
    msg = str(e.value)
    assert f"no {midasdepth.MIDAS_FILE} in" in msg and "--control-preprocessor-models" in msg and "\n" not in msg
    assert midasdepth.find_file(models).parent.name == "midas"
    comfy = tmp_path / "ComfyUI" / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    comfy.mkdir(parents=True)
    (comfy / midasdepth.MIDAS_FILE).write_bytes(b"x")
    assert midasdepth.find_file(tmp_path / "ComfyUI") == comfy / midasdepth.MIDAS_FILE
    from sdrt.pipelines.openposebody import BODY_FILE

    other = write_pth(tmp_path / BODY_FILE, {"conv1_1.weight": np.zeros((64, 3, 3, 3), np.float32)})
    with pytest.raises(ModelError, match="is not MiDaS's DPT-Hybrid depth model"):
        midasdepth.MidasDepth(other)
    w = make_weights(SMALL)
    w["scratch.layer2_rn.weight"] = w["scratch.layer2_rn.weight"][:, :8]
    bad = write_pth(tmp_path / "bad.pt", w)
    with pytest.raises(ModelError, match=r"layer2_rn.weight is \(64, 8, 3, 3\), not MiDaS's DPT-Hybrid depth model's"):
        midasdepth.MidasDepth(bad)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        midasdepth.MidasDepth(tmp_path / "junk.pt")
    assert "\n" not in str(e.value)


def test_flat_depth_and_odd_sizes(models):
    """A flat depth (the extension divides by zero) is a black depth map and a flat normal map; an image whose
    sides are not multiples of 64 is padded with its edges and the maps cropped back."""
    flat = np.zeros((5, 7), np.float32)
    assert not midasdepth.depth_image(flat).any()
    assert (midasdepth.normal_image(flat) == [255, 127, 127]).all()
    register("openvino")
    img = np.random.default_rng(4).integers(0, 256, (40, 70, 3), dtype=np.uint8)
    with midasdepth.MidasDepth(midasdepth.find_file(models), backend="openvino") as net:
        dmap, nmap = net.maps(img, 0.3)
        with pytest.raises(InputError, match="multiples of 32"):
            net.depth(img)
        depth = net.depth(np.pad(img, [(0, 24), (0, 58), (0, 0)], mode="edge"))  # 64x128, scaled as a whole
    assert dmap.shape == (40, 70) and nmap.shape == (40, 70, 3) and dmap.max() < 255
    assert np.array_equal(dmap, midasdepth.depth_image(depth)[:40, :70])
    assert np.array_equal(nmap, midasdepth.normal_image(depth, 0.3)[:40, :70])


@pytest.mark.skipif(not (DATA / "full_refs.npz").is_file(), reason="scripts/ref_midas.py --full not run")
def test_full_size_network_once(tmp_path):
    """The published network's full size (123M numbers, seeded) once, at 64x64, on OpenVINO."""
    refs = np.load(DATA / "full_refs.npz")
    path = write_pth(tmp_path / midasdepth.MIDAS_FILE, make_weights(None))
    register("openvino")
    with midasdepth.MidasDepth(path, backend="openvino") as net:
        assert net.size["embed"] == 768 and net.size["layers"] == [3, 4, 9]
        raw = net.depth(refs["image"])
        np.testing.assert_allclose(raw, refs["raw"], atol=5e-4 * float(np.abs(refs["raw"]).max()))
        dmap, nmap = net.maps(refs["image"], 0.4)
    _close_maps(dmap, refs["depth"][..., 0], 0.005)
    _close_maps(nmap, refs["normal"], 0.005)


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    """ComfyUI's layout: <root>/custom_nodes/comfyui_controlnet_aux/ckpts/lllyasviel/Annotators."""
    root = tmp_path_factory.mktemp("comfy")
    folder = root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    folder.mkdir(parents=True)
    write_pth(folder / midasdepth.MIDAS_FILE, make_weights(SMALL))
    return root


def test_preprocess_at_a_resolution_equals_the_extension(refs, models, comfy):
    """preprocess() scales and pads as resize_image_with_pad (100x70 at 64: INTER_AREA to 91x64, padded to 128x64)
    and crops both maps back, from the extension's layout and ComfyUI's; normal_midas reads its threshold (low)."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    image = refs["a_image"]
    for where in (models, comfy):
        depth = preprocessors.preprocess(image, "depth_midas", resolution=64, models=where, backend="openvino")
        normal = preprocessors.preprocess(image, "normal_midas", low=0.4, resolution=64, models=where,
                                          backend="openvino")
        _close_maps(depth, refs["a_depth"], 0.002)
        _close_maps(normal, refs["a_normal"], 0.002)
    assert preprocessors.SPECS["normal_midas"].low.default == 0.4
    same = preprocessors.preprocess(image, "normal_midas", resolution=64, models=models, backend="openvino")
    assert np.array_equal(same, normal)  # 0.4 when low is not given
    other = preprocessors.preprocess(image, "normal_midas", low=0.0, resolution=64, models=models, backend="openvino")
    assert (other != normal).any(-1).mean() > 0.2  # no background: the flat (255, 127, 127) areas get slopes


def test_units_thresholds_and_missing_files(models):
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    img = np.zeros((8, 8, 3), np.uint8)
    for name in ("depth_midas", "normal_midas"):
        with pytest.raises(InputError, match=f"the {name} preprocessor needs dpt_hybrid-midas-501f0c75.pt") as e:
            parse_units([ControlNet("controlnet", img, preprocessor=name)])
        assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="the normal background threshold, must be a number from 0 to 1, got 1.5"):
        parse_units([ControlNet("controlnet", img, preprocessor="normal_midas", low=1.5, preprocessor_models=models)])
    with pytest.raises(InputError, match="the depth_midas preprocessor reads no low threshold"):
        parse_units([ControlNet("controlnet", img, preprocessor="depth_midas", low=0.5, preprocessor_models=models)])


def test_midas_in_a_controlnet_run_and_on_the_command_line(refs, models, tmp_path, capsys):
    """A unit with depth_midas gives the image of a unit fed its map by hand; the CLI's
    --control-preprocessor-models runs normal_midas with --control-threshold-a and writes the module and threshold
    in the infotext; without the file, one line naming the flag and the file."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlnet import ControlNet

    image = refs["a_image"]
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="depth_midas", processor_res=64,
                          preprocessor_models=models)
        gen = pipe.generate("a room", controlnets=[unit], **kw)
        by_hand = pipe("a room", controlnets=[("controlnet", preprocessors.preprocess(
            image, "depth_midas", resolution=64, models=models, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: depth_midas, Model: controlnet")
    png, out = tmp_path / "room.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "normal_midas"]
    assert main([*args, "--control-threshold-a", "0.3", "--control-preprocessor-models", str(models),
                 "-o", str(out)]) == 0, capsys.readouterr().err
    text = Image.open(out).text["parameters"]
    assert "Module: normal_midas, Model: controlnet" in text and "Threshold A: 0.3" in text, text
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and midasdepth.MIDAS_FILE in err, err
    assert main([*args, "--control-preprocessor-models", str(tmp_path), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no {midasdepth.MIDAS_FILE} in {tmp_path}" in err, err
