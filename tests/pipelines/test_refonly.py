"""sd-webui-controlnet's ``reference_only`` against its algorithm written in torch on diffusers' tiny SD 1.x.

``scripts/gen_refonly_refs.py`` wrote ``tests/data/refonly``: the extension's write / read passes as diffusers
attention processors on ``attn1`` and a wrapper of the UNet's forward (the reference latent noised to the rounded
timestep with noise from the pipeline's generator), run through ``StableDiffusionPipeline`` with Euler, for units
of several weights, style fidelities, control modes and windows. The UNet is ``tests/data/pipelines/tiny-sd15``'s
(an Optimum-style export: layers found by node names).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.errors import InputError, ModelError
from sdrt.pipelines import ControlNet

DATA = Path(__file__).resolve().parents[1] / "data"
REF = DATA / "refonly"
FOLDER = DATA / "pipelines" / "tiny-sd15"
REFS = np.load(REF / "refs.npz")
ALL = json.loads((REF / "refs.json").read_text())
CASES = [c for c in ALL if not c["name"].startswith("sdxl/")]
XL_CASES = [c for c in ALL if c["name"].startswith("sdxl/")]


def units(case: dict) -> list[ControlNet]:
    return [ControlNet(None, REFS[f"picture{u['picture']}"], scale=u["weight"], low=u["fidelity"],
                       preprocessor=u.get("module", "reference_only"), start=u.get("start", 0.0), end=u.get("end", 1.0),
                       window=u.get("window", "diffusers"), control_mode=u.get("control_mode", "Balanced"))
            for u in case["units"]]


def generate(pipe, case: dict, **kw):
    return pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                         sampler="Euler", seed=case["seed"], width=64, height=64, **kw)


def run_cases(backend: str) -> None:
    with pipelines.load(FOLDER, backend=backend) as pipe:
        for case in CASES:
            got = generate(pipe, case, controlnets=units(case))
            assert_matches_diffusers(got.images, REFS[case["name"]])
        plain = generate(pipe, CASES[0]).images
        assert not any(n.startswith("ref_") for n in pipe.unet.inputs)  # the file's own graph again
    assert_matches_diffusers(plain, REFS["plain"])
    assert np.abs(plain[0].astype(int) - REFS[CASES[0]["name"]][0].astype(int)).max() > 20  # the unit did something


def run_xl_cases(backend: str) -> None:
    """tiny-sdxl (two transformer blocks in a level, the extension's cubed style fidelity, time ids and pooled text
    in the write pass too)."""
    with pipelines.load(DATA / "pipelines" / "tiny-sdxl", backend=backend) as pipe:
        for case in XL_CASES:
            assert_matches_diffusers(generate(pipe, case, controlnets=units(case)).images, REFS[case["name"]])


BACKENDS = ["reference", "openvino", "ggml"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_units_on_sdxl(backend):
    register(backend)
    run_xl_cases(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_units_match_the_extensions_algorithm(backend):
    register(backend)
    run_cases(backend)


def test_reference_only_infotext_and_errors():
    register("reference")
    case = CASES[0]
    with pipelines.load(FOLDER, backend="reference") as pipe:
        got = generate(pipe, {**case, "steps": 1}, controlnets=units(case))
        assert got.settings[0]["ControlNet 0"] == (
            "Module: reference_only, Model: None, Weight: 1, Resize Mode: Crop and Resize, Processor Res: 64, "
            "Threshold A: 0.5, Guidance Start: 0, Guidance End: 1, Pixel Perfect: False, Control Mode: Balanced")
        plan = pipe.plan(case["prompt"], case["negative_prompt"], steps=4, cfg=7.0, sampler="Euler", width=64,
                         height=64, controlnets=[ControlNet(None, REFS["picture0"], preprocessor="reference_only",
                                                            end=0.5)])
        calls = {p.part: p.calls for p in plan.parts}
        assert calls["unet"] == 4 + 2 and calls["vae_encoder"] == 1  # a write pass on each of the 2 steps it is on
        assert any(n.startswith("controlnet 0: reference_only (no net") for n in plan.notes)
        with pytest.raises(InputError, match=r"controlnets\[0\] low.*style fidelity.*from 0 to 1"):
            generate(pipe, case, controlnets=[ControlNet(None, REFS["picture0"], preprocessor="reference_only",
                                                         low=1.5)])
        with pytest.raises(InputError, match="guess_mode.*reference units"):
            generate(pipe, case, controlnets=units(case), guess_mode=True)
        with pytest.raises(InputError, match="uses no ControlNet model"):
            generate(pipe, case, controlnets=[ControlNet("controlnet", REFS["picture0"],
                                                         preprocessor="reference_only")])
        with pytest.raises(InputError, match="guides an SD 1.x or SDXL UNet"):
            with pipelines.load(DATA / "pipelines" / "tiny-sd2v", backend="reference") as sd2:
                generate(sd2, case, controlnets=[ControlNet(None, REFS["picture0"], preprocessor="reference_adain")])


def test_reference_units_on_the_cli(tmp_path):
    """``--control-preprocessor reference_only`` with no ``--controlnet``: the unit reads no net (the folder's nets go
    to the other units), the picture as the API's."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")
    case = CASES[1]  # weight 0.6, style fidelity 0
    Image.fromarray(REFS["picture0"]).save(tmp_path / "ref.png")
    out = tmp_path / "out.png"
    assert main(["generate", str(FOLDER), case["prompt"], "--negative", case["negative_prompt"], "--steps",
                 str(case["steps"]), "--cfg", str(case["cfg"]), "--sampler", "Euler", "--seed", str(case["seed"]),
                 "--width", "64", "--height", "64", "--control-image", str(tmp_path / "ref.png"),
                 "--control-preprocessor", "reference_only", "--control-scale", "0.6", "--control-threshold-a", "0",
                 "--backend", "reference", "-o", str(out)]) == 0
    assert_matches_diffusers([np.asarray(Image.open(out).convert("RGB"))], REFS[case["name"]])


def test_the_extensions_layers_on_sdrts_shipped_graphs():
    """sdrt's shipped single-file UNet graphs (the dynamo exporter: layers named by initializer only) get every
    self-attention layer and exactly the LDM blocks the extension wraps: SD 1.x's middle block, input blocks 4, 5,
    7, 8, 10, 11 and output blocks 0 to 7; SDXL's middle block, input blocks 4, 5, 7, 8 and output blocks 0 to 5."""
    import onnx

    from sdrt.checkpoint import graphs
    from sdrt.checkpoint.refattention import adain_graph, gn_blocks, reference_graph, self_layers

    sd1_in = ["down_blocks.1.attentions.0", "down_blocks.1.attentions.1", "down_blocks.2.attentions.0",
              "down_blocks.2.attentions.1", "down_blocks.3.resnets.0", "down_blocks.3.resnets.1"]
    sd1_out = ["up_blocks.0.resnets.0", "up_blocks.0.resnets.1", "up_blocks.0.upsamplers.0", "up_blocks.1.attentions.0",
               "up_blocks.1.attentions.1", "up_blocks.1.upsamplers.0", "up_blocks.2.attentions.0",
               "up_blocks.2.attentions.1"]
    xl_in = sd1_in[:4]
    xl_out = ["up_blocks.0.attentions.0", "up_blocks.0.attentions.1", "up_blocks.0.upsamplers.0",
              "up_blocks.1.attentions.0", "up_blocks.1.attentions.1", "up_blocks.1.upsamplers.0"]
    for name, attn, inputs, outputs in (("sd1_unet", 16, sd1_in, sd1_out), ("sdxl_unet", 70, xl_in, xl_out)):
        model = onnx.load(str(graphs.shipped_graph(name)), load_external_data=False)
        assert len(self_layers(model)) == attn
        want = [("mid_block.resnets.1", 0.0)]
        want += [(p, 2 * (1 - w / len(inputs))) for w, p in enumerate(inputs)]
        want += [(p, 2 * w / len(outputs)) for w, p in enumerate(outputs)]
        got = gn_blocks(model)
        assert [p for p, _, _, _ in got] == [p for p, _ in want]
        assert [t for _, _, t, _ in got] == pytest.approx([t for _, t in want])
        heads = (lambda width: 8) if name == "sd1_unet" else (lambda width: width // 64)
        model = adain_graph(reference_graph(model, heads, name), name)
        names = {i.name for i in model.graph.input}
        assert {f"ref_bank_in_{2 * k}" for k in range(attn)} <= names
        assert {f"ref_gn_mix_{i}" for i in range(len(want))} <= names


def test_a_reference_units_bad_picture_is_named_by_its_place_among_the_units():
    """A reference unit after a ControlNet unit: an error about its picture names controlnets[1], its place in the
    list given (the hook once numbered the reference units among themselves: controlnets[0], the ControlNet's); a
    ControlNet unit after a reference unit likewise (it was numbered among the ControlNet units)."""
    register("reference")
    case = CASES[0]
    with pipelines.load(DATA / "pipelines" / "tiny-sd15-controlnet", backend="reference") as pipe:
        with pytest.raises(InputError, match=r"control image has shape \(0, 5, 3\).*Where: controlnets\[1\]"):
            generate(pipe, {**case, "steps": 1}, controlnets=[
                ("controlnet", REFS["picture0"], 0.8),
                ControlNet(None, np.zeros((0, 5, 3), np.uint8), preprocessor="reference_only")])
        # and a ControlNet unit after a reference unit: its errors and the plan's notes name it controlnets[1]
        ref = ControlNet(None, REFS["picture0"], preprocessor="reference_only")
        with pytest.raises(InputError, match=r"control image has shape \(0, 5, 3\).*Where: controlnets\[1\]"):
            generate(pipe, {**case, "steps": 1}, controlnets=[ref, ("controlnet", np.zeros((0, 5, 3), np.uint8), 0.8)])
        plan = pipe.plan(case["prompt"], steps=1, sampler="Euler", width=64, height=64,
                         controlnets=[ref, ("controlnet", REFS["picture0"], 0.8)])
        notes = sorted(n[:len("controlnet 0: r")] for n in plan.notes if n.startswith("controlnet "))
        assert notes == ["controlnet 0: r", "controlnet 1: c"], plan.notes


def test_a_vae_encoder_that_does_not_say_its_output_size_plans_the_passs_latent(tmp_path):
    """tiny-sd15 with tiny-sd15-ort's VAE encoder (ONNX Runtime's optimizer names its output's height and width
    with symbols no input gives): the plan's dry run encodes the picture to zeros of the pass's latent size, not 1x1
    (once a 'cannot pin sample to (2, 4, 1, 1)' error), and the run matches the plain folder's picture."""
    register("reference")
    for part in ("model_index.json", "scheduler", "text_encoder", "tokenizer", "unet", "vae_decoder"):
        (tmp_path / part).symlink_to(FOLDER / part)
    (tmp_path / "vae_encoder").symlink_to(DATA / "pipelines" / "tiny-sd15-ort" / "vae_encoder")
    case = next(c for c in CASES if c["name"] == "adain")
    with pipelines.load(tmp_path, backend="reference") as pipe:
        got = generate(pipe, case, controlnets=units(case))
    assert_matches_diffusers(got.images, REFS[case["name"]])


def test_reference_units_on_an_onnx_runtime_optimized_unet_are_refused_in_one_line():
    """ONNX Runtime's optimized UNet (fused attention, channels-last NhwcConv, SkipGroupNorm): neither the attention
    layers nor the blocks' NCHW outputs can be found, and both kinds of unit are refused naming the graph (the AdaIN
    edit once took a cast or a channels-last tensor for a block's output: a runtime type error, or statistics over
    the wrong axes)."""
    register("reference")
    case = CASES[0]
    with pipelines.load(DATA / "pipelines" / "tiny-sd15-ort", backend="reference") as pipe:
        for module, words in (("reference_only", "self-attention layers cannot be found"),
                              ("reference_adain", "blocks cannot be found.*fused those layers")):
            with pytest.raises(ModelError, match=words):
                generate(pipe, {**case, "steps": 1}, controlnets=[
                    ControlNet(None, REFS["picture0"], preprocessor=module)])


def test_a_reference_unit_acting_in_a_hires_checkpoints_pass_is_refused():
    """The hires fix's own checkpoint replaces the UNet the unit guides (its graph edit is the first model's): a unit
    acting in the second pass is refused as a ControlNet unit is (it once ran silently in the first pass only: 'High
    res only' changed nothing), and with 'Low res only' the run goes on."""
    register("reference")
    kw = dict(steps=1, cfg=5.0, sampler="Euler", seed=1, width=64, height=64, hires_scale=1.5, hires_steps=1,
              hires_checkpoint=DATA / "pipelines" / "tiny-sd15-dyn-b")
    with pipelines.load(DATA / "pipelines" / "tiny-sd15-dyn", backend="reference") as pipe:
        for hr in ("Both", "High res only"):
            with pytest.raises(InputError, match=r"controlnets\[1\] acts in the hires pass.*guides the first model"):
                pipe.generate("a cat", "", controlnets=[
                    ControlNet(None, REFS["picture0"], preprocessor="reference_only", hr_option="Low res only"),
                    ControlNet(None, REFS["picture1"], preprocessor="reference_adain", hr_option=hr)], **kw)
        pipe.generate("a cat", "", controlnets=[ControlNet(None, REFS["picture0"], preprocessor="reference_only",
                                                           hr_option="Low res only")], **kw)


def test_a_windowed_reference_unit_compiles_the_unet_once():
    """The write pass and the steps outside the unit's window feed banks of the read pass's shape (zeros, mix 0):
    one compiled UNet through the run (docs/toolbox.md, "How sdrt does it")."""
    register("reference")
    case = next(c for c in CASES if c["name"] == "window-a1111")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        generate(pipe, case, controlnets=units(case) + [ControlNet(None, REFS["picture1"], 0.8, 0.0, 1.0,
                                                                   "reference_adain", window="a1111")])
        assert len(pipe.unet.sessions) == 1, list(pipe.unet.sessions)


def test_the_read_calls_copy_no_bank_out(monkeypatch):
    """Only the write pass asks the edited UNet for its banks and statistics; the read calls (the steps themselves)
    get ``out_sample`` alone, so the session copies none of the hundreds of MiB of banks out (``Session.run``'s
    ``outputs=``; docs/toolbox.md)."""
    register("reference")
    from sdrt.checkpoint.refattention import written
    from sdrt_reference.backend import ReferenceSession

    asked: list[tuple[str, ...] | None] = []
    whole, some = ReferenceSession._run, ReferenceSession._run_outputs

    def run(self, feeds):
        if any(n.startswith("ref_") for n in feeds):
            asked.append(None)
        return whole(self, feeds)

    def run_outputs(self, feeds, names):
        if any(n.startswith("ref_") for n in feeds):
            asked.append(tuple(names))
        return some(self, feeds, names)

    monkeypatch.setattr(ReferenceSession, "_run", run)
    monkeypatch.setattr(ReferenceSession, "_run_outputs", run_outputs)
    case = next(c for c in CASES if c["name"] == "window-a1111")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        got = generate(pipe, case, controlnets=units(case) + [ControlNet(None, REFS["picture1"], 0.8, 0.0, 1.0,
                                                                         "reference_adain", window="a1111")])
    assert got.images and asked and None not in asked, asked  # every UNet call named what it wants
    reads = [a for a in asked if a == ("out_sample",)]
    writes = [a for a in asked if a != ("out_sample",)]
    assert len(reads) == 2 * case["steps"] or len(reads) == case["steps"], len(reads)  # one a step (batched CFG)
    assert writes and all(a and all(written(n) for n in a) for a in writes), writes
    assert any(n.startswith("ref_bank_") for a in writes for n in a)
    assert any(n.startswith("ref_gn_") for a in writes for n in a)
