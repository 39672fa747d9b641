"""BFL's FLUX.1 Tools on tiny transformers: Fill (384 input channels) and Canny/Depth (128) against diffusers.

tests/data/pipelines/tiny-flux-{fill,control} hold a tiny ``FluxTransformer2DModel`` with ``in_channels`` 384 / 128
(Optimum's export, ``hidden_states [batch, tokens, 384]``) and the images diffusers 0.42.1's ``FluxFillPipeline``
and ``FluxControlPipeline`` made with it (scripts/gen_flux_tools_refs.py); the other parts are tiny-flux-dev's,
linked beside it here. Tolerance: 2 of 255, as for the other flow families (tests/flow/test_flow_pipelines.py). A
wrong mask layout, conditioning order or RNG order shows as tens of levels.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flow_helpers import register, tool_folder

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines.controlnet import ControlNet

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
TOOLS = ("fill", "control")


def _cases(tool: str) -> list[dict]:
    return json.loads((DATA / f"tiny-flux-{tool}" / "refs.json").read_text())


def _refs(tool: str):
    return np.load(DATA / f"tiny-flux-{tool}" / "refs.npz")


def _kwargs(tool: str, case: dict, refs) -> dict:
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"],
              batch=case["batch"], sampler="Euler", guidance=case["guidance"],
              max_sequence_length=case["max_sequence_length"])
    name = case["name"]
    if tool == "fill":
        kw.update(init_image=refs[f"{name}/init_image"], mask=refs[f"{name}/mask"], strength=case["strength"])
    else:
        kw["control_image"] = refs[f"{name}/control_image"]
    return kw


_PIPES: dict = {}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tools")
    return {tool: tool_folder(tool, root) for tool in TOOLS}


def _pipe(folders: dict[str, Path], tool: str, backend: str):
    register(backend)
    key = (tool, backend)
    if key not in _PIPES:
        _PIPES[key] = pipelines.load(folders[tool], backend=backend)
    return _PIPES[key]


PARAMS = [(t, c["name"], b) for t in TOOLS for c in _cases(t) for b in ("reference", "openvino", "ggml")]


@pytest.mark.parametrize(("tool", "name", "backend"), PARAMS, ids=[f"{n}-{b}" for _, n, b in PARAMS])
def test_image_matches_diffusers(folders, tool: str, name: str, backend: str) -> None:
    case = next(c for c in _cases(tool) if c["name"] == name)
    refs = _refs(tool)
    pipe = _pipe(folders, tool, backend)
    assert pipe.flux_tool == tool
    got = np.stack(pipe(case["prompt"], **_kwargs(tool, case, refs))).astype(int)
    want = refs[f"{name}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got - want).max())
    assert diff <= 2, f"{name} on {backend}: max difference {diff}"


def test_fill_defaults_guidance_30_strength_1_and_plans_the_wide_input(folders) -> None:
    """No guidance given: diffusers' FluxFillPipeline default, 30; a mask's default strength is 1 (pure noise);
    the plan feeds the transformer 384-wide tokens."""
    case = _cases("fill")[0]
    refs = _refs("fill")
    kw = _kwargs("fill", case, refs)
    del kw["guidance"], kw["strength"]
    pipe = _pipe(folders, "fill", "reference")
    gen = pipe.generate(case["prompt"], **kw)
    assert gen.settings[0]["Distilled CFG Scale"] == 30 and gen.settings[0]["Denoising strength"] == 1
    diff = int(np.abs(np.stack(gen.images).astype(int) - refs[f"{case['name']}/image"].astype(int)).max())
    assert diff <= 2  # the case ran at guidance 30, strength 1
    plan = pipe.plan(case["prompt"], **kw)
    shapes = {name: tuple(shape) for sig, _ in plan.part("transformer").signatures for name, shape, _ in sig}
    assert shapes["hidden_states"] == (1, (64 // 16) * (96 // 16), 384), shapes
    assert plan.memory.peak_bytes > 0


def test_canny_preprocessor_through_a_control_unit(folders) -> None:
    """``--control-image PNG --control-preprocessor canny`` (a ControlNet unit naming no net of its own) is the
    model's control image after the preprocessor: the same image as passing that edge map as control_image."""
    from sdrt.pipelines.controlnet import ControlNet, preprocess

    case = _cases("control")[0]
    refs = _refs("control")
    kw = _kwargs("control", case, refs)
    photo = _refs("fill")["fill-96x64-g10/init_image"]  # 64x96, as the case
    del kw["control_image"]
    kw["steps"] = 1
    pipe = _pipe(folders, "control", "reference")
    a = pipe(case["prompt"], controlnets=[ControlNet("controlnet", photo, preprocessor="canny")], **kw)
    b = pipe(case["prompt"], control_image=preprocess(photo, "canny"), **kw)
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    assert pipe.flux_tool == "control"


def test_errors_are_one_line_input_errors(folders) -> None:
    fill = _pipe(folders, "fill", "reference")
    control = _pipe(folders, "control", "reference")
    refs = _refs("fill")
    img, mask = refs["fill-96x64-g10/init_image"], refs["fill-96x64-g10/mask"]
    edges = _refs("control")["control-96x64/control_image"]
    common = dict(steps=2, max_sequence_length=32)
    cases = [
        (fill, dict(width=64, height=96), "mask", "Fill"),  # txt2img on Fill
        (fill, dict(init_image=img), "mask", "Fill"),  # img2img without a mask
        (fill, dict(init_image=img, mask=mask, control_image=edges), "control_image", "Canny or Depth"),
        (fill, dict(init_image=img, mask=mask, reference_images=[img]), "reference_images", "Kontext"),
        (control, dict(width=64, height=96), "control_image", "control image"),
        (control, dict(control_image=edges, init_image=edges), "init_image", "txt2img"),
        (control, dict(control_image=edges, hires_scale=2), "hires_scale", "hires fix"),
        (control, dict(controlnets=[("somewhere/cn.safetensors", edges)]), "controlnets", "not through a ControlNet"),
        (control, dict(controlnets=[("controlnet", edges), ("controlnet", edges)]), "controlnets", "one control image"),
        (control, dict(controlnets=[("controlnet", edges, 1.0, 0.0, 1.0, "ControlNet is more important")]),
         "controlnets", "not through a ControlNet"),
        # an inpaint unit's RGBA map (or a unit without an image) is no control image: one line, not the VAE's pin
        (control, dict(controlnets=[ControlNet("controlnet", img, preprocessor="inpaint_only", control_mask=mask)]),
         "controlnets[0] preprocessor", "SD inpaint ControlNet"),
        (control, dict(controlnets=[ControlNet("controlnet", None, preprocessor="inpaint")]),
         "controlnets[0] preprocessor", "Canny/Depth model"),
        (control, dict(controlnets=[ControlNet("controlnet", edges, control_mask=edges[:, :, 0])]),
         "controlnets[0] control_mask", "control_mask"),
    ]
    register("reference")
    plain = pipelines.load(DATA / "tiny-flux-dev", backend="reference")
    cases.append((plain, dict(width=64, height=64, control_image=edges[:64]), "control_image", "takes none"))
    for pipe, kw, where, words in cases:
        with pytest.raises(InputError) as exc:
            pipe("a cat", **common, **kw)
        assert exc.value.where == where and words in str(exc.value), (kw.keys(), str(exc.value))
        assert "\n" not in str(exc.value)


def test_cli_fill_and_canny(folders, tmp_path, capsys) -> None:
    """``sdrt generate FILL --init-image --mask`` gives diffusers' image; ``sdrt generate CANNY --control-image PNG
    --control-preprocessor canny`` runs at the control image's size; a Fill model without a mask is one line."""
    from PIL import Image

    from sdrt.cli import main

    refs = _refs("fill")
    case = next(c for c in _cases("fill") if c["name"] == "fill-96x64-g10")
    init, mask = tmp_path / "init.png", tmp_path / "mask.png"
    Image.fromarray(refs["fill-96x64-g10/init_image"]).save(init)
    Image.fromarray(refs["fill-96x64-g10/mask"]).save(mask)
    out = tmp_path / "fill.png"
    rc = main(["generate", str(folders["fill"]), case["prompt"], "--init-image", str(init), "--mask", str(mask),
               "--steps", str(case["steps"]), "--seed", str(case["seed"]), "--guidance", "10", "--sampler", "Euler",
               "--max-sequence-length", "32", "--backend", "reference", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    got = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert int(np.abs(got - refs["fill-96x64-g10/image"][0].astype(int)).max()) <= 2
    out = tmp_path / "canny.png"
    rc = main(["generate", str(folders["control"]), "a cat", "--control-image", str(init), "--control-preprocessor",
               "canny", "--steps", "1", "--max-sequence-length", "32", "--backend", "reference", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert Image.open(out).size == (64, 96)
    capsys.readouterr()
    rc = main(["generate", str(folders["fill"]), "a cat", "--steps", "1", "--backend", "reference",
               "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc != 0 and "Flux.1 Fill model" in err and "--mask" in err and "Traceback" not in err
