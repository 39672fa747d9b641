"""No flag is silently ignored, and errors name flags (issue: the flags probe). Each case runs as the user ran it,
through ``sdrt.cli.main``; ``--backend nosuch`` marks the cases refused before any model loads."""

from __future__ import annotations

import numpy as np
import pytest

from sdrt.cli import main

FAST = ["--steps", "1", "--seed", "1", "--backend", "nosuch"]


def refused(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("flags", [["--control-scale", "0.2"], ["--control-start", "0.5"], ["--control-end", "0.5"],
                                   ["--control-preprocessor", "canny"], ["--control-resize", "Just Resize"],
                                   ["--controlnet", "cn"], ["--control-mode", "1"], ["--guess-mode"],
                                   ["--control-inpaint-crop", "off"], ["--control-hr-option", "Low res only"]])
def test_controlnet_flags_without_a_control_image_are_refused(capsys, flags):
    refused(capsys, ["generate", "a cat", *FAST, *flags], f"{flags[0]} needs a --control-image", f"Where: {flags[0]}")


def test_no_reference_resize_without_a_reference_is_refused(capsys):
    """--no-reference-resize sizes the --reference pictures: without one it would change nothing."""
    refused(capsys, ["generate", "a cat", *FAST, "--no-reference-resize"], "--no-reference-resize needs a --reference",
            "Where: --no-reference-resize")


def test_a_subseed_without_its_strength_is_refused(capsys):
    """A1111: a subseed at strength 0 changes nothing; as --hires-steps without --hires-scale, it is an error."""
    refused(capsys, ["generate", "a cat", *FAST, "--subseed", "5"], "--subseed without --subseed-strength",
            "pass --subseed-strength (e.g. 0.3) too")


def test_a_schedule_against_the_samplers_own_is_refused_in_flags(capsys):
    refused(capsys, ["generate", "a cat", *FAST, "--sampler", "DPM++ 2M Karras", "--schedule", "exponential"],
            "Where: --schedule", "pass --sampler 'DPM++ 2M' with --schedule 'exponential'")


@pytest.mark.parametrize("flags,where", [(["--sampler", "bogus"], "--sampler"),
                                         (["--sampler", "euler", "--schedule", "bogus"], "--schedule")])
def test_unknown_sampler_names_say_the_flag(capsys, flags, where):
    err = refused(capsys, ["generate", "a cat", *FAST, *flags], f"Where: {where}.")
    assert "sdrt.samplers" not in err


@pytest.mark.parametrize("args,where", [(["a cat <lora:x:abc>"], "PROMPT"), (["a cat", "-n", "<lora:x:abc>"], "--negative")])
def test_a_lora_tag_whose_weight_is_not_a_number_is_an_error(capsys, args, where):
    """As <lora:x:nan> is: it was skipped with two warnings and rc 0, the image made without the LoRA."""
    refused(capsys, ["generate", *args, *FAST], "the weight 'abc' of <lora:x:abc> is not a number",
            f"Where: {where}.")


@pytest.mark.parametrize("word", ["models/sd15-onnx", "model.safetensors", "sd.gguf"])
def test_a_lone_model_path_that_does_not_exist_is_not_a_prompt(capsys, tmp_path, word):
    """It made a demo image of the words "models/sd15-onnx" with rc 0."""
    refused(capsys, ["generate", str(tmp_path / word) if "/" in word else word, *FAST, "-o", str(tmp_path / "x.png")],
            "no model at", "Where: MODEL.", "give a model first: sdrt generate MODEL")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("flags,needles", [
    (["--steps", "0"], ["--steps must be an integer >= 1", "What to do: pass --steps 1 or more."]),
    (["--batch", "0"], ["What to do: pass --batch 1 or more."]),
    (["--clip-skip", "0"], ["What to do: pass --clip-skip 1 or more."]),
    (["--width", "0"], ["What to do: pass --width 8 or more."]),
    (["--hires-steps", "3"], ["--hires-steps needs --hires-scale", "pass --hires-scale 2 (for example) too"]),
    (["--hires-scale", "9"], ["pass e.g. --hires-scale 2."]),
])
def test_errors_speak_flags_not_argument_names(capsys, flags, needles):
    err = refused(capsys, ["generate", "a cat", *FAST[:-2], "--dry-run", *flags], *needles)
    assert "=" not in err.split("What to do:")[1] and "sdrt.samplers" not in err and "torch" not in err


def test_a_seed_out_of_range_names_the_flag(registry, tmp_path, capsys):
    assert main(["generate", "a cat", "--steps", "1", "--seed", "99999999999999999999", "--backend", "reference",
                 "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert "Where: --seed." in err and "sdrt.samplers" not in err and "manual_seed" not in err, err


def test_a_size_from_the_init_image_or_the_hires_scale_blames_that_flag(registry, tmp_path, capsys):
    """The demo model makes 64x64 only: a hires pass at 128x128 is not --width's fault. A 128x128 init image with no
    size is fitted to the model's 64x64 (it was refused, "resize or crop the image to 64x64"); with --width 128 the
    size asked is."""
    import numpy as np

    from sdrt.pipelines.png import write_png

    write_png(tmp_path / "red128.png", np.full((128, 128, 3), 200, np.uint8))
    assert main(["generate", "a cat", *FAST[:-2], "--dry-run", "--steps", "4",
                 "--init-image", str(tmp_path / "red128.png")]) == 0
    out = capsys.readouterr().out
    assert "64x64" in out
    # the fit the run would warn about is a line of the plan (a dry run said nothing about it)
    assert "the init image is 128x128 and this model makes 64x64 images only: Just Resize fits it" in out, out
    refused(capsys, ["generate", "a cat", *FAST[:-2], "--dry-run", "--steps", "4", "--width", "128",
             "--init-image", str(tmp_path / "red128.png")],
            "asks for 128x128. Where: --width. What to do: pass --width 64 and --height 64, or leave both unset: the "
            "picture is fitted to 64x64 (--resize-mode).")
    refused(capsys, ["generate", "a cat", *FAST[:-2], "--dry-run", "--hires-scale", "2"],
            "the hires fix's second pass is 128x128. Where: --hires-scale.")
    refused(capsys, ["generate", "a cat", *FAST[:-2], "--dry-run", "--width", "128"],
            "Where: --width. What to do: pass --width 64 and --height 64, or leave them unset.")


@pytest.mark.parametrize("flag,needle", [("--init-image", "is a folder, not an image file"),
                                         ("--control-image", "is a folder, not an image file")])
def test_a_folder_for_an_image_flag_says_it_is_a_folder(capsys, tmp_path, flag, needle):
    err = refused(capsys, ["generate", "a cat", *FAST, flag, str(tmp_path)], needle)
    assert "does not exist" not in err


@pytest.mark.parametrize("flag", ["--preview-dir", "--lora-dir", "--embedding-dir"])
def test_a_file_for_a_folder_flag_says_it_is_a_file(capsys, tmp_path, flag):
    (tmp_path / "f.txt").write_text("x")
    err = refused(capsys, ["generate", "a cat", *FAST, flag, str(tmp_path / "f.txt")], "is a file", flag)
    assert "does not exist" not in err


def test_a_folder_in_the_way_of_a_numbered_output_names_the_numbering(capsys, tmp_path):
    """-o e.png --batch 2 writes e-1.png and e-2.png: a folder e-2.png is not fixed by 'such as e-2.png/out.png'."""
    (tmp_path / "e-2.png").mkdir()
    err = refused(capsys, ["generate", "a cat", *FAST, "--batch", "2", "-o", str(tmp_path / "e.png")],
                  "with 2 images writes e-1.png to e-2.png, and", "is a folder", "pick another -o name")
    assert "out.png" not in err


def test_the_default_strength_is_not_blamed_on_strength(capsys, tmp_path):
    """--steps 1 with an init image and no --strength: 0.75 x 1 runs no step, and the user gave --steps."""
    from sdrt.pipelines.png import write_png

    write_png(tmp_path / "i.png", np.zeros((64, 64, 3), np.uint8))
    refused(capsys, ["generate", "a cat", *FAST, "--init-image", str(tmp_path / "i.png")],
            "the default strength 0.75 of 1 step leaves no step to run. Where: --steps.")  # "of 1 steps" read
    refused(capsys, ["generate", "a cat", *FAST, "--steps", "4", "--strength", "0.1", "--init-image",
                     str(tmp_path / "i.png")], "--strength 0.1 of 4 steps leaves no step to run. Where: --strength.")


@pytest.mark.parametrize("prompt", ["1girl,blue/red_hair", "(red/blue:1.2)", "a red/blue fox"])
def test_a_tag_prompt_with_a_slash_is_still_a_prompt(capsys, prompt):
    """Tags come without spaces but with commas or weights: they reach the backend, not 'no model at'."""
    err = refused(capsys, ["generate", prompt, *FAST], "no backend named 'nosuch'")
    assert "no model at" not in err


def test_guidance_rescale_on_a_flow_model_names_the_flag(registry, capsys):
    """The refusal spoke the API's guidance_rescale in its message on the command line."""
    from pathlib import Path

    model = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-flux-schnell"
    err = refused(capsys, ["generate", str(model), "a cat", *FAST[:-2], "--dry-run", "--guidance-rescale", "0.5"],
                  "error: --guidance-rescale rescales an eps or v prediction", "Where: --guidance-rescale.")
    assert "guidance_rescale" not in err
