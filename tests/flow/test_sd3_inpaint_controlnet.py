"""SD3 inpainting ControlNets (alimama's design: ``SD3ControlNetModel`` with ``extra_conditioning_channels=1``, the
masked picture's latents and the mask as its 17 control channels) on tiny-sd3 against diffusers.

``tiny-sd3-controlnet/inpaint`` is a tiny random net of that design (2 blocks, every weight drawn, fp16), and
``inpaint-net.json`` / ``inpaint-net.npz`` the images diffusers 0.42.1's ``StableDiffusion3ControlNetInpaintingPipeline``
made with it (``scripts/gen_sd3_controlnet_refs.py inpaint-net``; the masked picture's samples drawn from the run's
seed before the noise, as the script explains). Tolerance: 1 of 255. A mask not read, the masked pixels not set to
black, the latents unshifted, the mask channel not inverted or the samples drawn per CFG row show as 9 to 255
levels.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flow_helpers import register

from sdrt import pipelines
from sdrt.checkpoint.controlnet import open_controlnet
from sdrt.errors import InputError, ModelError
from sdrt.pipelines.controlnet import ControlNet

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
NETS = DATA / "tiny-sd3-controlnet"
BASE = NETS / "sd35_medium_transformer.onnx"
FIXTURE = json.loads((NETS / "inpaint-net.json").read_text())
CASES = FIXTURE["cases"]
REFS = np.load(NETS / "inpaint-net.npz")

_PIPES: dict = {}


def _pipe(backend: str):
    register(backend)
    if backend not in _PIPES:
        _PIPES[backend] = pipelines.load(DATA / "tiny-sd3", backend=backend)
    return _PIPES[backend]


def _net(name: str = "inpaint"):
    return open_controlnet(NETS / name / "diffusion_pytorch_model.safetensors", graph=BASE)


def _kwargs(case: dict, picture: np.ndarray | None = None, mask: np.ndarray | None = None) -> dict:
    name = case["name"]
    unit = ControlNet(_net(), REFS[f"{name}/control_image_0"] if picture is None else picture, case["scale"],
                      case["start"], case["end"],
                      control_mask=REFS[f"{name}/control_mask_0"] if mask is None else mask)
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              sampler="Euler", cfg=case["cfg"], max_sequence_length=case["max_sequence_length"], controlnets=[unit])
    if case["negative_prompt"]:
        kw["negative_prompt"] = case["negative_prompt"]
    return kw


PARAMS = [(c["name"], b) for c in CASES for b in ("reference", "openvino", "ggml")]


@pytest.mark.parametrize(("name", "backend"), PARAMS, ids=[f"{n}-{b}" for n, b in PARAMS])
def test_image_matches_diffusers(name: str, backend: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    gen = _pipe(backend).generate(case["prompt"], **_kwargs(case))
    assert "ControlNet 0" in gen.settings[0] and "inpaint" in gen.settings[0]["ControlNet 0"]
    got = np.stack(gen.images).astype(int)
    want = REFS[f"{name}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got - want).max())
    assert diff <= 1, f"{name} on {backend}: max difference {diff}"


def test_the_picture_and_the_mask_each_matter() -> None:
    """Another picture, or another mask, moves the image far past the tolerance: the net reads both."""
    case = CASES[0]
    name = case["name"]
    pipe = _pipe("reference")
    plain = np.stack(pipe(case["prompt"], **_kwargs(case))).astype(int)
    other = np.ascontiguousarray(REFS[f"{name}/control_image_0"][::-1, ::-1])
    mask = np.ascontiguousarray(255 - REFS[f"{name}/control_mask_0"])
    moved = {what: int(np.abs(np.stack(pipe(case["prompt"], **_kwargs(case, **kw))).astype(int) - plain).max())
             for what, kw in (("picture", dict(picture=other)), ("mask", dict(mask=mask)))}
    assert min(moved.values()) > 10, moved


def test_refusals_name_the_argument() -> None:
    """What does not run with an inpainting net, one line each naming the argument: no mask, a mask on another
    net, an inpainting net with another, an init image, the hires fix."""
    pipe = _pipe("reference")
    case = CASES[0]
    picture, mask = REFS[f"{case['name']}/control_image_0"], REFS[f"{case['name']}/control_mask_0"]
    inpaint = _net()
    canny = _net("canny")
    common = dict(steps=2, width=96, height=64, max_sequence_length=32)
    errors = [
        (dict(controlnets=[ControlNet(inpaint, picture)]), "controlnets[0] control_mask", "needs the mask"),
        (dict(controlnets=[ControlNet(canny, picture, control_mask=mask)]), "controlnets[0] control_mask",
         "reads none"),
        (dict(controlnets=[ControlNet(inpaint, picture, control_mask=np.zeros((4, 4, 4, 4), np.uint8))]),
         "controlnets[0] control_mask", "the mask has shape"),
        (dict(controlnets=[ControlNet(inpaint, picture, control_mask=mask), ControlNet(canny, picture)]),
         "controlnets[1]", "do not run together"),
        (dict(controlnets=[ControlNet(inpaint, picture, control_mask=mask)], init_image=picture), "init_image",
         "StableDiffusion3ControlNetInpaintingPipeline"),
        (dict(controlnets=[ControlNet(inpaint, picture, control_mask=mask)], init_image=picture, mask=mask),
         "init_image", "an init image"),
        (dict(controlnets=[ControlNet(inpaint, picture, control_mask=mask)], hires_scale=1.5), "hires_scale",
         "hires fix"),
    ]
    for kw, where, words in errors:
        with pytest.raises(InputError) as exc:
            pipe("a cat", **common, **kw)
        assert exc.value.where == where and words in str(exc.value), (where, str(exc.value))
        assert "\n" not in str(exc.value)


def test_a_control_mask_on_an_sd_controlnet_is_refused() -> None:
    """Only SD3 inpainting nets read a control_mask: on an SD 1.x ControlNet it is one line naming it."""
    register("reference")
    sd = pipelines.load(DATA / "tiny-sd15-controlnet", backend="reference")
    image = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(InputError) as exc:
        sd("a cat", steps=1, width=64, height=64, controlnets=[ControlNet("controlnet", image, control_mask=image)])
    assert exc.value.where == "controlnets[0] control_mask" and "SD 1.x ControlNet" in str(exc.value)


def test_full_size_inpainting_file_binds_onto_the_sd3_medium_graph(tmp_path) -> None:
    """A full-size file of alimama's layout (SD3 Medium's widths, no q/k norm, ``pos_embed_input`` of 17 channels;
    fp16, written sparse) binds tensor for tensor onto the graph cut from the shipped SD3 Medium graph; the
    same channels without a text stream is a design sdrt has no graph for, one line."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
    from single_file_helpers import sparse
    from test_sd3_controlnet import _shapes

    shapes = _shapes("sd3_medium_transformer", 6)
    shapes["pos_embed_input.proj.weight"] = (1536, 17, 2, 2)
    opened = open_controlnet(sparse(tmp_path / "SD3-Controlnet-Inpainting.safetensors", shapes), base="sd3")
    assert opened.sd3.inpaint and opened.sd3.zero_pooled and opened.sd3.blocks == 6
    assert "inpainting" in opened.sd3.label
    last = "transformer_blocks.5."
    dead = [k for k in shapes if k.startswith((last + "attn.to_add_out.", last + "ff_context."))]
    assert len([k for k in opened.weights.shapes() if k in shapes]) == len(shapes) - len(dead)
    image_only = {k: v for k, v in shapes.items() if not k.startswith(("context_embedder.", "pos_embed."))}
    with pytest.raises(ModelError) as exc:
        open_controlnet(sparse(tmp_path / "odd.safetensors", image_only), base="sd3")
    assert "17 control input channels" in str(exc.value) and "\n" not in str(exc.value)


@pytest.fixture
def tiny_lookup(monkeypatch):
    """sdrt's lookup of the shipped graph a net binds onto, given the tiny weight-free one (sdrt's own function)."""
    from sdrt.checkpoint import graphs
    from sdrt.checkpoint import sd3controlnet as scn

    shipped = graphs.shipped_graph
    monkeypatch.setattr(scn, "base_of", lambda lay, shapes: "sd35_medium_transformer")
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: BASE if name == "sd35_medium_transformer"
                        else shipped(name))


def test_cli_control_mask(tmp_path, capsys, tiny_lookup) -> None:
    """``--controlnet NET --control-image PICTURE --control-mask MASK`` gives diffusers' picture; without
    ``--control-mask`` the refusal names the flag."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")
    case = CASES[0]
    name = case["name"]
    picture, mask, out = tmp_path / "picture.png", tmp_path / "mask.png", tmp_path / "out.png"
    Image.fromarray(REFS[f"{name}/control_image_0"]).save(picture)
    Image.fromarray(REFS[f"{name}/control_mask_0"]).save(mask)
    args = ["generate", str(DATA / "tiny-sd3"), case["prompt"], "--controlnet", str(NETS / "inpaint"),
            "--control-image", str(picture), "--control-scale", str(case["scale"]), "--steps", str(case["steps"]),
            "--seed", str(case["seed"]), "--cfg", str(case["cfg"]), "--sampler", "Euler", "--width",
            str(case["width"]), "--height", str(case["height"]), "--negative", case["negative_prompt"],
            "--max-sequence-length", str(case["max_sequence_length"]), "--backend", "reference", "-o", str(out)]
    rc = main([*args, "--control-mask", str(mask)])
    err = capsys.readouterr().err
    assert rc == 0, err
    got = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert int(np.abs(got - REFS[f"{name}/image"][0].astype(int)).max()) <= 1
    rc = main(args)
    err = capsys.readouterr().err
    assert rc != 0 and err.count("error:") == 1 and "--control-mask" in err and "Traceback" not in err, err
