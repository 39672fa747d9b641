"""Leftovers of the fresh-eyes passes over the CLI and the API (each test failed before its fix)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from sdrt.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "pipelines" / "tiny-sd15"


def _diffusers_unet(path: Path, lcm: bool = False) -> Path:
    """A UNet file in diffusers' names (SDXL-Lightning's ``sdxl_lightning_4step_unet.safetensors`` layout); ``lcm``:
    with LCM's guidance embedding (``time_embedding.cond_proj``), as LCM_Dreamshaper_v7's unet is."""
    t = {"conv_in.weight": np.zeros((16, 4, 3, 3), np.float32), "conv_in.bias": np.zeros(16, np.float32),
         "time_embedding.linear_1.weight": np.zeros((64, 16), np.float32),
         "down_blocks.0.resnets.0.conv1.weight": np.zeros((16, 16, 3, 3), np.float32),
         "conv_out.weight": np.zeros((4, 16, 3, 3), np.float32)}
    if lcm:
        t["time_embedding.cond_proj.weight"] = np.zeros((64, 256), np.float32)
    save_file(t, str(path))
    return path


def _error(capsys) -> str:
    """The one error line of a failed command (after the "backend ..." line a loaded model prints)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("backend ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# -- --weights with a UNet in diffusers' names: "no model weights in the LDM layout", and nothing to do ---------
def test_weights_given_a_diffusers_unet_says_to_run_the_file_itself(tmp_path, capsys, registry):
    unet = _diffusers_unet(tmp_path / "unet.safetensors")
    args = ["generate", str(TINY), "a fox", "--weights", str(unet), "--steps", "1", "--backend", "reference",
            "-o", str(tmp_path / "o.png")]
    assert main(args) == 1
    err = _error(capsys)
    assert "diffusers' own tensor names" in err
    assert "run the file itself as the MODEL" in err and "--text-encoder" in err and "--vae" in err
    assert "text_encoders=" not in err


def test_load_weights_given_a_diffusers_unet_speaks_the_api(tmp_path, registry):
    from sdrt import pipelines
    from sdrt.errors import WeightsError

    pipe = pipelines.load(TINY, backend="reference")
    try:
        with pytest.raises(WeightsError, match=r"run the file itself as the model, .*text_encoders=.*vae="):
            pipe.load_weights(_diffusers_unet(tmp_path / "unet.safetensors"))
    finally:
        pipe.close()


# -- an LCM UNet (time_embedding.cond_proj): refused as "does not fit" or "needs a text encoder", not as LCM ------
@pytest.mark.parametrize("as_weights", [False, True])
def test_an_lcm_unet_is_named_as_one(tmp_path, capsys, registry, as_weights):
    lcm = _diffusers_unet(tmp_path / "lcm_unet.safetensors", lcm=True)
    model = [str(TINY), "a fox", "--weights", str(lcm)] if as_weights else [str(lcm), "a fox"]
    assert main(["generate", *model, "--steps", "1", "--backend", "reference", "-o", str(tmp_path / "o.png")]) == 1
    err = _error(capsys)
    assert "LCM-distilled UNet" in err and "no graph" in err and "LCM-LoRA" in err


# -- a picture given as a model: plan said "init_image" (the API's word), --vae / --weights "a model folder" -------
def test_a_picture_given_as_a_model_is_told_in_the_commands_words(tmp_path, capsys, registry):
    from sdrt.pipelines.png import write_png

    pic = tmp_path / "fox.png"
    write_png(pic, np.zeros((8, 8, 3), np.uint8))
    assert main(["plan", str(pic)]) == 1
    err = _error(capsys)
    assert "sdrt generate's --init-image" in err and "init_image" not in err
    for flag in ("--vae", "--weights"):
        assert main(["generate", str(TINY), "a fox", flag, str(pic), "--backend", "reference"]) == 1
        err = _error(capsys)
        assert err.startswith(f"error: {flag}: ") and "--init-image" in err and "folder" not in err


# -- sdrt plan --json --list-devices printed the table -------------------------------------------------------------
def test_plan_list_devices_speaks_json(capsys):
    import json

    assert main(["plan", "--json", "--list-devices"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["kind"] == "cpu" and len(listed) > 5
    assert all({"name", "memory_bytes", "peak_flops"} <= set(d) for d in listed)


# -- --preview-size's errors named TaesdPreview (an API class) and "None, or full on the command line" ---------------
@pytest.mark.parametrize("size", ["abc", "300"])
def test_preview_size_errors_speak_the_command_line(tmp_path, capsys, size):
    args = ["generate", "a red circle", "--preview-dir", str(tmp_path), "--preview-size", size, "--steps", "1",
            "-o", str(tmp_path / "o.png")]
    assert main(args) == 1
    err = _error(capsys)
    assert "--preview-size" in err and "TaesdPreview" not in err and "preview_size" not in err
    assert "on the command line" not in err


def test_preview_size_none_on_the_command_line_is_full_size(tmp_path, capsys, registry):
    """The error's fix writes "--preview-size None": the command line takes it, as it takes "full"."""
    pil = pytest.importorskip("PIL.Image")
    decoder = DATA / "preview" / "tiny-taesd" / "vae_decoder" / "model.onnx"
    args = ["generate", str(TINY), "a cat", "--steps", "1", "--width", "64", "--height", "64", "--backend",
            "reference", "-o", str(tmp_path / "out.png"), "--preview-dir", str(tmp_path), "--preview-decoder",
            str(decoder), "--preview-size", "None"]
    assert main(args) == 0, capsys.readouterr().err
    with pil.open(tmp_path / "preview-1-001.png") as img:
        assert img.size == (64, 64)


# -- a <lora:...> tag in the negative prompt: the errors said "Where: prompt" ---------------------------------------
def test_a_lora_tag_in_the_negative_prompt_is_named_there(tmp_path, registry):
    from sdrt import pipelines
    from sdrt.errors import WeightsError

    pipe = pipelines.load(TINY, backend="reference")
    try:
        with pytest.raises(WeightsError, match="the negative prompt asks for <lora:ink:...>") as info:
            pipe.generate("a fox", negative_prompt="blurry <lora:ink:1>", steps=1)
        assert info.value.where == "negative_prompt" and "Where: negative_prompt." in str(info.value)
        assert "Where: --negative." in info.value.render({"negative_prompt": "--negative"})
        pipe.weights.lora_dir = tmp_path
        with pytest.raises(WeightsError, match="no LoRA named 'ink'") as info:
            pipe.generate("a fox", negative_prompt="blurry <lora:ink:1>", steps=1)
        assert info.value.where == "<lora:ink:...> in the negative prompt"
        with pytest.raises(WeightsError, match="no LoRA named 'ink'") as info:
            pipe.generate("a fox <lora:ink:1>", steps=1)
        assert info.value.where == "<lora:ink:...> in the prompt"
    finally:
        pipe.close()


# -- --weights of another family: "has no VAE weights" warnings came before the refusal ---------------------------
def test_a_checkpoint_of_another_family_is_refused_quietly(tmp_path, capsys, caplog, registry):
    sdxl = DATA / "ckpt" / "sdxl" / "ldm.safetensors"  # its VAE is not in the file
    args = ["generate", str(TINY), "a fox", "--weights", str(sdxl), "--steps", "1", "--backend", "reference",
            "-o", str(tmp_path / "o.png")]
    assert main(args) == 1
    err = _error(capsys)
    assert "does not fit this model" in err and "SDXL" in err
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.records


# -- a bad $SDRT_CACHE_MAX_SIZE was refused at the first compile, after the model had loaded ---------------------
def test_a_bad_cache_size_is_refused_before_the_model_loads(monkeypatch, registry):
    """On a backend with a compile cache (OpenVINO's); ``cache=False`` keeps no cache, so no cap is read."""
    pytest.importorskip("openvino")
    import sdrt_openvino

    registry.register_plugin(sdrt_openvino, "openvino", distribution="sdrt-openvino", version="0.1.0")
    from sdrt import pipelines
    from sdrt.errors import SdrtError

    monkeypatch.setenv("SDRT_CACHE_MAX_SIZE", "lots")
    with pytest.raises(SdrtError, match="cache size 'lots' is not a size") as info:
        pipelines.load(pipelines.DEMO_MODEL, backend="openvino")
    assert info.value.where == "SDRT_CACHE_MAX_SIZE"
    pipelines.load(pipelines.DEMO_MODEL, backend="openvino", cache=False).close()


# -- a newline in an output path broke the one-line messages (printed raw) ----------------------------------------
def test_control_characters_in_an_output_path_are_printed_escaped(tmp_path, capsys, registry):
    from sdrt.errors import printable

    assert printable("a\nb\tc\x1bd é") == "a\\nb\\tc\\x1bd é"
    odd = tmp_path / "a\nb.png"
    args = ["generate", str(TINY), "a fox", "--steps", "1", "--width", "64", "--height", "64", "--backend",
            "reference", "-o"]
    assert main([*args, str(odd)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "a\\nb.png" in out and odd.is_file()
    assert main([*args, str(tmp_path / "no\x1bdir" / "x.png")]) == 1
    err = _error(capsys)
    assert "no\\x1bdir" in err and "\x1b" not in err


# -- tile_resample with a rate the picture cannot take: the error named the control image, not its threshold A ------
def test_a_tile_rate_too_large_names_the_threshold(tmp_path, capsys, registry):
    from sdrt import pipelines
    from sdrt.pipelines.controlmaps import ControlImageError
    from sdrt.pipelines.controlnet import ControlNet
    from sdrt.pipelines.png import write_png

    folder = DATA / "pipelines" / "tiny-sd15-controlnet"
    small = tmp_path / "small.png"
    write_png(small, np.zeros((16, 16, 3), np.uint8))
    args = ["generate", str(folder), "a fox", "--control-image", str(small), "--control-preprocessor",
            "tile_resample", "--control-threshold-a", "500", "--steps", "1", "--backend", "reference",
            "-o", str(tmp_path / "o.png")]
    assert main(args) == 1
    err = _error(capsys)
    assert "down sampling rate of 500" in err and "Where: --control-threshold-a." in err, err
    pipe = pipelines.load(folder, backend="reference")
    try:
        unit = ControlNet("controlnet", np.zeros((16, 16, 3), np.uint8), preprocessor="tile_resample", low=500)
        with pytest.raises(ControlImageError, match="down sampling rate") as info:
            pipe.generate("a fox", steps=1, width=64, height=64, controlnets=[unit])
        assert info.value.where == "controlnets[0] low"
    finally:
        pipe.close()


# -- --preview-every past the step count: A1111 shows the last step's preview; so does sdrt ------------------------
def test_preview_every_past_the_steps_writes_the_last_steps(tmp_path, capsys, registry):
    args = ["generate", str(TINY), "a fox", "--steps", "3", "--width", "64", "--height", "64", "--backend",
            "reference", "-o", str(tmp_path / "o.png"), "--preview-dir", str(tmp_path), "--preview-every", "10"]
    assert main(args) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.glob("preview-*.png")) == ["preview-1-003.png"]
