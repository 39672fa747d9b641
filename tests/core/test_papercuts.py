"""What a new user tripped on (issue 12, point 8), each tried the way the user tried it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.cli import main


def relu_model(path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    np.save(path.parent / "x.npy", np.array([-1, 2], np.float32))
    return path


def test_run_checks_a_missing_output_folder_before_loading_the_model(tmp_path, capsys):
    """The model does not even exist: the output path is what gets reported, at once."""
    assert main(["run", str(tmp_path / "absent.onnx"), "-o", str(tmp_path / "nodir" / "out.npz")]) == 1
    err = capsys.readouterr().err
    assert "folder of -o" in err and "does not exist" in err and "mkdir -p" in err and "Traceback" not in err


def test_run_output_without_suffix_says_the_file_it_wrote(tmp_path, registry, capsys):
    model = relu_model(tmp_path / "relu.onnx")
    assert main(["run", str(model), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "adir")]) == 0
    assert f"wrote {tmp_path / 'adir.npz'}" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(tmp_path / "adir.npz")["y"], [0, 2])


@pytest.mark.parametrize("command", ["run", "demo"])
def test_output_naming_a_folder_is_refused(tmp_path, registry, capsys, command):
    model = relu_model(tmp_path / "relu.onnx")
    args = ["run", str(model), "-i", f"x={tmp_path / 'x.npy'}"] if command == "run" else ["demo"]
    assert main([*args, "-o", str(tmp_path) + os.sep]) == 1
    assert "names a folder, not a file" in capsys.readouterr().err
    assert not list(tmp_path.glob(".npz")) and not (tmp_path / ".npz").exists()


def test_device_as_sdrt_info_prints_it_is_accepted(tmp_path, registry, capsys):
    model = relu_model(tmp_path / "relu.onnx")
    out = tmp_path / "y.npz"
    assert main(["run", str(model), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(out), "--device", "reference:CPU"]) == 0
    assert main(["run", str(model), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(out), "--backend", "other",
                 "--device", "reference:CPU"]) == 1
    assert "belongs to backend 'reference'" in capsys.readouterr().err


def test_lora_and_keymap_work_after_a_plain_import_sdrt():
    code = "import sdrt; print(sdrt.lora.merge.__name__, sdrt.keymap.KeyMap.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["merge", "KeyMap"]


def test_the_docs_submodules_work_after_a_plain_import_sdrt():
    # docs/flow-families.md: `pipe = sdrt.pipelines.load(...)`; README: sdrt.checkpoint.open_single_file,
    # sdrt.selftest.run, sdrt.pipelines.png.read_parameters; a name that is no submodule stays an AttributeError
    code = ("import sdrt; print(sdrt.pipelines.load.__name__, sdrt.checkpoint.open_single_file.__name__, "
            "sdrt.selftest.run.__name__, sdrt.samplers.resolve.__name__, hasattr(sdrt, 'no_such_module'), "
            "sdrt.pipelines.png.read_parameters.__name__, hasattr(sdrt.pipelines, 'no_such_module'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["load", "open_single_file", "run", "resolve", "False", "read_parameters", "False"]


def test_verbose_is_taken_after_the_command_too(capsys):
    # docs/memory.md: `sdrt generate MODEL "a fox" --memory 8GB -v`; `sdrt -v CMD` keeps working
    from sdrt.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["info"]).verbose == 0
    assert parser.parse_args(["-v", "info"]).verbose == 1
    assert parser.parse_args(["info", "-vv"]).verbose == 2
    assert parser.parse_args(["generate", "a fox", "--memory", "8GB", "-v"]).verbose == 1


def test_the_samplers_docstring_example_runs(registry):
    import sdrt
    import sdrt.samplers

    doc = sdrt.samplers.__doc__
    example = textwrap.dedent(doc[doc.index("Quick use::") + len("Quick use::"):doc.index("This package")])
    g = helper.make_graph(
        [helper.make_node("Mul", ["sample", "k"], ["out_sample"])], "unet",
        [helper.make_tensor_value_info("sample", TensorProto.FLOAT, [1, 4, 64, 64]),
         helper.make_tensor_value_info("timestep", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT, [1, 77, 768])],
        [helper.make_tensor_value_info("out_sample", TensorProto.FLOAT, [1, 4, 64, 64])],
        [numpy_helper.from_array(np.array(0.1, np.float32), "k")])
    unet = sdrt.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                     backend="reference")
    cond = np.zeros((1, 77, 768), np.float32)
    scope = {"seed": 1, "unet_session": unet, "cond": cond, "uncond": cond}
    exec(example, scope)  # noqa: S102 - the documented example, as a user pastes it
    assert scope["latent"].shape == (1, 4, 64, 64) and np.isfinite(scope["latent"]).all()


def endless_loop_model(path):
    """x + 1, 10**12 times, in a Loop: the reference backend runs it until interrupted."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "one")])
    g = helper.make_graph([helper.make_node("Loop", ["n", "go", "x"], ["y"], body=body)], "endless",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                          [numpy_helper.from_array(np.array(10**12, np.int64), "n"),
                           numpy_helper.from_array(np.array(True), "go")])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    np.save(path.parent / "x.npy", np.zeros(2, np.float32))
    return path


def test_ctrl_c_prints_one_line_not_a_traceback(tmp_path):
    import signal

    model = endless_loop_model(tmp_path / "endless.onnx")
    env = {**os.environ, "SDRT_LOAD_ENTRY_POINTS": "1", "SDRT_PLUGINS": "reference"}
    proc = subprocess.Popen([sys.executable, "-m", "sdrt", "-v", "run", str(model), "-i", f"x={tmp_path / 'x.npy'}",
                             "-o", str(tmp_path / "y.npz"), "--backend", "reference"],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            # as from a terminal: a test run started in the background (`pytest &`) ignores
                            # SIGINT, and an ignored signal stays ignored in its children
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:  # wait until the model runs: then Ctrl-C
            seen.append(line)
            if "compiling" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:  # never leave the endless run behind, whatever went wrong
        proc.kill()
        proc.wait()
    err = "".join(seen) + rest
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err


def test_serve_ray_without_ray_is_one_line(capsys):
    # README: `sdrt serve --ray` needs sdrt[ray]; without Ray it printed import ray's traceback
    import importlib.util

    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed here")
    assert main(["serve", "--ray", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: sdrt serve --ray needs Ray Serve") and "sdrt[ray]" in err and "Traceback" not in err


@pytest.mark.parametrize("flag, value, words", [("--shift", "3", "--shift applies to flow-matching models"),
                                                ("--strength", "0.5", "--strength applies only with an init image")])
def test_refusals_name_the_flag_not_the_api_argument(capsys, flag, value, words):
    """`sdrt generate --shift 3` on SD 1.x read "error: shift applies to ...": the API's name on the command line."""
    from backend_helpers import register

    from sdrt.cli import main

    register("reference")
    assert main(["generate", "a fox", flag, value, "--steps", "1", "--backend", "reference", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {words}"), err


def _flux_transformer_only(path):
    """A header of Black Forest Labs' Flux.1 dev transformer keys (one block; no data stored)."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
    from single_file_helpers import sparse

    d = 3072
    return sparse(path, {"img_in.weight": (d, 64), "txt_in.weight": (d, 4096), "guidance_in.in_layer.weight": (d, 256),
                         "double_blocks.0.img_attn.qkv.weight": (3 * d, d),
                         "single_blocks.0.linear1.weight": (3 * d + 12288, d)})


def test_missing_parts_are_said_in_each_callers_words(tmp_path, capsys, registry):
    """A transformer-only file's refusal read "pass them: --text-encoder FILE ... (text_encoders=[...] / vae= in
    pipelines.load, extra_files=[...] in open_single_file)" everywhere: flags in the API, the API on the command line,
    and flags `sdrt plan` has not."""
    from sdrt import pipelines
    from sdrt.errors import SdrtError

    f = _flux_transformer_only(tmp_path / "flux1-dev.safetensors")
    fix = ("pass the text encoders with {te} (one file each: clip_l.safetensors, t5xxl_fp16.safetensors) and the VAE "
           "with {vae} (ae.safetensors)")
    assert main(["generate", str(f), "a fox", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert fix.format(te="--text-encoder", vae="--vae") in err and "pipelines.load" not in err, err
    assert "text_encoders" not in err and "extra_files" not in err
    assert main(["plan", str(f)]) == 1  # plan takes no part files: sdrt generate does
    err = capsys.readouterr().err
    assert fix.format(te="sdrt generate's --text-encoder", vae="sdrt generate's --vae") in err, err
    with pytest.raises(SdrtError) as exc:
        pipelines.load(f)
    assert fix.format(te="text_encoders", vae="vae") in str(exc.value) and "--" not in str(exc.value), exc.value


def test_the_no_t5_warning_is_said_in_each_callers_words(caplog, monkeypatch):
    """SD3 without T5 warned "add one with --text-encoder t5xxl_fp16.safetensors (text_encoders=[...] in
    pipelines.load)" to every caller, `sdrt plan` (which has no --text-encoder) among them."""
    import importlib
    import logging
    from pathlib import Path

    from sdrt.pipelines.families import by_name
    from sdrt.pipelines.folder import no_t5

    def warn(args=None):  # the warning as a run gives it, a model without T5 being loaded
        no_t5(by_name("sd3"), {}, Path("sd3_medium_incl_clips.safetensors"))
        return 0

    caplog.set_level(logging.WARNING)
    warn()
    tail = "; pass a T5-XXL file with {} (t5xxl_fp16.safetensors)"
    assert caplog.records[-1].getMessage().endswith(tail.format("text_encoders")), caplog.text
    for command, words in (("generate", "--text-encoder"), ("plan", "sdrt generate's --text-encoder")):
        monkeypatch.setattr(importlib.import_module(f"sdrt.cli.{command}"), "run", warn)
        caplog.clear()
        assert main([command, "x", "a fox"] if command == "generate" else [command, "x"]) == 0
        assert caplog.records[-1].getMessage().endswith(tail.format(words)), caplog.text
