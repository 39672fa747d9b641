"""What the commands write, tried as a new user tries it: a device or FIFO as -o (``sdrt strip -o /dev/null``
replaced /dev/null with a regular file when run as root), a read-only file, a file written over (its mode), a
prompt too long to be a file name, a folder given for a file."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.cli import main


def relu_model(path):
    w = numpy_helper.from_array(np.ones(2, np.float32), "w")
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                          "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    np.save(path.parent / "x.npy", np.array([-1, 2], np.float32))
    return path


def _bypasses_permissions() -> bool:
    """Whether this process writes into a read-only folder anyway (root with CAP_DAC_OVERRIDE)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o555)
        try:
            return os.access(d, os.W_OK)
        finally:
            os.chmod(d, 0o755)


PERMISSIONS = pytest.mark.skipif(os.name != "posix" or _bypasses_permissions(),
                                 reason="this process writes into read-only folders (root)")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", [["strip"], ["quantize", "--to", "int8"]])
def test_strip_and_quantize_never_replace_a_fifo_or_device(tmp_path, fifo, capsys, command):
    model = relu_model(tmp_path / "relu.onnx")
    assert main([command[0], str(model), *command[1:], "-o", str(fifo)]) == 1
    err = capsys.readouterr().err
    assert "not a regular file" in err and "Traceback" not in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO, not a file renamed over it


def test_write_atomic_refuses_what_a_rename_would_destroy_and_writes_through_a_symlink(tmp_path, fifo):
    from sdrt.cache.paths import write_atomic

    for target in (fifo, tmp_path):
        with pytest.raises(OSError, match="not replaced"):
            write_atomic(target, [b"x"])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    real = tmp_path / "real.bin"
    real.write_bytes(b"old")
    real.chmod(0o640)
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    assert write_atomic(link, [b"new"]) == link
    assert link.is_symlink() and real.read_bytes() == b"new" and stat.S_IMODE(real.stat().st_mode) == 0o640
    dangling = tmp_path / "dangling.bin"
    dangling.symlink_to(tmp_path / "nodir" / "x.bin")
    with pytest.raises(FileNotFoundError, match="symlink"):
        write_atomic(dangling, [b"x"])
    assert not (tmp_path / "nodir").exists()


@pytest.mark.parametrize("command", ["run", "demo", "generate"])
def test_a_fifo_given_without_a_suffix_is_refused_not_written_beside_it(tmp_path, registry, fifo, capsys, command):
    """-o /dev/null wrote /dev/null.npz (run) and /dev/null.png (demo) into /dev."""
    model = relu_model(tmp_path / "relu.onnx")
    args = {"run": ["run", str(model), "-i", f"x={tmp_path / 'x.npy'}"], "demo": ["demo"],
            "generate": ["generate", "a fox", "--steps", "1"]}[command]
    assert main([*args, "--backend", "reference", "-o", str(fifo)]) == 1
    err = capsys.readouterr().err
    assert "FIFO" in err and "--output" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["pipe", "relu.onnx", "x.npy"])


def test_every_output_written_over_keeps_its_mode(tmp_path, registry, capsys):
    """One behaviour for PNGs, .npz and graphs: an existing file keeps its mode, as a plain open() keeps it."""
    from sdrt.pipelines.png import write_png

    png = tmp_path / "out.png"
    png.write_bytes(b"old")
    png.chmod(0o600)
    write_png(png, np.zeros((8, 8, 3), np.uint8), "a cat")
    assert stat.S_IMODE(png.stat().st_mode) == 0o600 and png.read_bytes()[:4] == b"\x89PNG"
    model = relu_model(tmp_path / "relu.onnx")
    npz = tmp_path / "y.npz"
    npz.write_bytes(b"old")
    npz.chmod(0o640)
    assert main(["run", str(model), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(npz), "--backend", "reference"]) == 0
    assert stat.S_IMODE(npz.stat().st_mode) == 0o640
    np.testing.assert_array_equal(np.load(npz)["y"], [0, 2])


@pytest.mark.parametrize("command", ["run", "demo", "generate", "quantize"])
def test_a_read_only_output_is_refused_up_front_and_kept(tmp_path, registry, capsys, command):
    """A rename ignores a file's write bits: a read-only output was replaced (generate, demo) or a traceback
    (run: PermissionError from numpy)."""
    model = relu_model(tmp_path / "relu.onnx")
    out = tmp_path / ("out.npz" if command == "run" else "out.onnx" if command == "quantize" else "out.png")
    out.write_bytes(b"keep me")
    out.chmod(0o444)
    args = {"run": ["run", str(model), "-i", f"x={tmp_path / 'x.npy'}", "--backend", "reference"],
            "demo": ["demo", "--backend", "reference"], "generate": ["generate", "a fox", "--steps", "1"],
            "quantize": ["quantize", str(model), "--to", "int8"]}[command]
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "read-only" in err and "Traceback" not in err and "backend" not in err  # nothing loaded
    assert out.read_bytes() == b"keep me"


@PERMISSIONS
@pytest.mark.parametrize("command", ["run", "generate"])
def test_an_output_in_a_folder_this_user_cannot_write_is_refused_before_the_run(tmp_path, registry, capsys, command):
    model = relu_model(tmp_path / "relu.onnx")
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    args = (["run", str(model), "-i", f"x={tmp_path / 'x.npy'}", "--backend", "reference"] if command == "run"
            else ["generate", "a fox", "--steps", "1"])
    assert main([*args, "-o", str(folder / "out.png" if command == "generate" else folder / "out.npz")]) == 1
    err = capsys.readouterr().err
    assert "not writable" in err and "backend" not in err


@PERMISSIONS
def test_a_preview_folder_this_user_cannot_write_is_refused_before_the_run(tmp_path, capsys):
    """It failed after the load, at the first step's preview, naming --output."""
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    assert main(["generate", "a fox", "--steps", "1", "--preview-dir", str(folder), "-o", str(tmp_path / "o.png")]) == 1
    err = capsys.readouterr().err
    assert "not writable. Where: --preview-dir." in err and "backend" not in err


@pytest.mark.parametrize("prompt", ["fox " * 10_000, "fox" * 1000])
def test_a_prompt_too_long_for_a_file_name_is_a_prompt(prompt, registry, capsys):
    """The lone word was looked up as a model path: OSError 'File name too long' with a traceback."""
    assert main(["generate", prompt, "--backend", "reference", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "chunks of 75 tokens" in err and "Traceback" not in err


def test_run_input_that_is_a_folder_says_so(tmp_path, capsys):
    model = relu_model(tmp_path / "relu.onnx")
    assert main(["run", str(model), "-i", f"x={tmp_path}", "-o", str(tmp_path / "y.npz")]) == 1
    assert "is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--json", "--markdown"])
def test_conformance_report_files_are_checked_before_the_tests_run(tmp_path, registry, capsys, flag, fifo):
    for bad, words in ((tmp_path, "is a folder"), (fifo, "FIFO")):
        assert main(["conformance", "reference", "-k", "test_abs$", "--no-isolate", flag, str(bad)]) == 1
        err = capsys.readouterr().err
        assert words in err and flag in err and "passed" not in err


@pytest.mark.parametrize("flag", ["--seed", "--subseed"])
def test_seed_and_subseed_out_of_range_read_alike(flag, capsys):
    """Two range checks with two wordings ('seed N is out of range' / 'subseed must be an integer from ...')."""
    assert main(["generate", "a fox", flag, str(2**64), "--subseed-strength", "0.5"]) == 1
    err = capsys.readouterr().err
    name = flag[2:]
    assert f"{name} {2**64} is out of range. Where: {flag}. What to do: use a {flag} from -2**63 to 2**64 - 1" in err


def test_ctrl_c_while_sampling_leaves_no_image_and_exits_130(tmp_path):
    import signal
    import subprocess
    import sys

    out = tmp_path / "fox.png"
    env = {**os.environ, "SDRT_LOAD_ENTRY_POINTS": "1", "SDRT_PLUGINS": "reference"}
    proc = subprocess.Popen([sys.executable, "-m", "sdrt", "generate", "a fox", "--steps", "10000", "--batch-count",
                             "2", "-o", str(out)], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:  # loaded: sampling starts now
            seen.append(line)
            if line.startswith("backend "):
                break
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    err = "".join(seen) + rest
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no image, no temporary file


def test_a_ctrl_c_that_python_swallows_still_ends_the_run(tmp_path, registry, monkeypatch, capsys, request):
    """A SIGINT handled inside a weakref callback (the import system's module locks use them) raised its
    KeyboardInterrupt there, where CPython prints "Exception ignored in" and goes on: the run sampled on and wrote
    its image (the Ctrl-C test above timed out once in CI that way)."""
    import signal
    import sys
    import weakref

    from sdrt.pipelines.progress import ProgressBar

    class Locked:
        pass

    steps = []

    def press_inside_a_callback(self, step, total, latents=None):
        steps.append(step)
        if step == 2:
            obj = Locked()
            ref = weakref.ref(obj, lambda ref: os.kill(os.getpid(), signal.SIGINT) or sum(range(1000)))
            del obj  # the callback runs here; its KeyboardInterrupt is reported and dropped by CPython
            assert ref() is None

    monkeypatch.setattr(ProgressBar, "__call__", press_inside_a_callback)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (CI may ignore SIGINT)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))  # where CPython reports it
    code = main(["generate", "a fox", "--steps", "6", "--backend", "reference", "-o", str(tmp_path / "o.png")])
    err = capsys.readouterr().err
    assert dropped == [KeyboardInterrupt]  # CPython did swallow it
    assert steps == [1, 2]  # ended at the next step, not after the sixth
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted"
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command's handler is gone


@pytest.mark.parametrize("flag", ["--weights", "--lora", "--embedding"])
def test_a_broken_weights_file_is_refused_before_the_load_naming_its_flag(tmp_path, registry, capsys, flag):
    """--vae and --text-encoder said '--vae: cannot open ...' up front; these three failed after the model had
    loaded, without the flag."""
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes((100).to_bytes(8, "little") + b"{")
    assert main(["generate", "a fox", "--backend", "reference", flag, str(broken), "-o", str(tmp_path / "o.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}: cannot open broken.safetensors:") and "backend" not in err


def test_a_fifo_as_the_model_is_named_as_one(fifo, registry, capsys):
    """It 'did not exist'."""
    assert main(["generate", str(fifo), "a fox", "--backend", "reference"]) == 1
    assert "is a FIFO (named pipe), not a model folder or file" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["generate", "a fox", "--device", ""], ["generate", "a fox", "--preview-dir", ""],
                                  ["generate", "a fox", "--lora-dir", ""], ["generate", "a fox", "--weights", ""],
                                  ["generate", "a fox", "--lora", "x.safetensors", "--lora", ""],
                                  ["plan", "model", "--device", ""], ["run", "m.onnx", "-o", "y.npz", "--backend", ""],
                                  ["cache", "list", "--cache-dir", ""]])
def test_an_empty_option_value_is_refused_naming_the_flag(args, capsys):
    """--preview-dir "" wrote no previews, --lora-dir/--weights "" were dropped, --device "" said no backend had a
    usable device, plan --device "" planned the default device: each an unset shell variable read as not given."""
    assert main(args) == 1
    flag = next(a for a, b in zip(args, args[1:]) if b == "")
    assert f"error: {flag} is given an empty value. Where: {flag}." in capsys.readouterr().err


def test_an_empty_negative_prompt_is_no_negative_prompt(tmp_path, registry, capsys):
    assert main(["generate", "a fox", "--negative", "", "--steps", "1", "--backend", "reference",
                 "-o", str(tmp_path / "o.png")]) == 0


@pytest.mark.parametrize("action", ["list", "clear", "prune"])
def test_cache_dir_naming_a_file_is_refused(tmp_path, capsys, action):
    """It listed '0 entries' and cleared 'removed 0 entries' under a.png/compiled."""
    blocker = tmp_path / "a.png"
    blocker.write_bytes(b"x")
    assert main(["cache", action, "--cache-dir", str(blocker)]) == 1
    assert "is a file, not a cache folder" in capsys.readouterr().err and blocker.read_bytes() == b"x"


@PERMISSIONS
def test_cache_clear_of_a_folder_this_user_cannot_write_says_so(tmp_path, capsys):
    """It said 'removed 3 entries (3.7 MiB)' and removed none."""
    from sdrt.cache import CompileCache

    cache = CompileCache("demo", tmp_path)
    assert cache.store("ab" * 32, lambda d: (d / "blob").write_bytes(b"p")) is not None
    (tmp_path / "compiled" / "demo").chmod(0o555)
    try:
        assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 1
        assert "this user cannot write there" in capsys.readouterr().err
    finally:
        (tmp_path / "compiled" / "demo").chmod(0o755)
    assert len(cache.entries()) == 1


@pytest.mark.parametrize("args", [["info"], ["generate", "a fox", "--steps", "1", "-o", "-"]])
def test_a_full_disk_behind_stdout_is_one_line(tmp_path, args):
    """`sdrt info > /dev/full` was an OSError traceback (ENOSPC), from print or from the PNG bytes of -o -."""
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    env = {**os.environ, "SDRT_LOAD_ENTRY_POINTS": "1", "SDRT_PLUGINS": "reference"}
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, "-m", "sdrt", *args], stdout=full, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("error: cannot write to standard output (No space left on "
                                                   "device). Where: standard output. What to do: free space where "
                                                   "it goes, or redirect it elsewhere.")
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_control_values_are_checked_in_the_flags_words(registry, tmp_path, capsys):
    """It said 'controlnets[0] start must be a number from 0 to 1. Where: controlnets[0] start'."""
    image = tmp_path / "c.png"
    from sdrt.pipelines.png import write_png

    write_png(image, np.zeros((8, 8, 3), np.uint8))
    assert main(["generate", "a fox", "--control-image", str(image), "--control-start", "2",
                 "-o", str(tmp_path / "o.png")]) == 1
    assert "error: --control-start must be a number from 0 to 1, got 2.0. Where: --control-start." in \
        capsys.readouterr().err


def test_a_clip_skip_past_the_text_encoders_layers_says_the_largest(registry, tmp_path, capsys):
    """It said the graph lacked hidden_states outputs (export with output_hidden_states=True), which it has."""
    assert main(["generate", "a fox", "--clip-skip", "12", "--backend", "reference", "-o", str(tmp_path / "o.png")]) == 1
    err = capsys.readouterr().err
    assert "--clip-skip 12 asks for layer 12 from the end" in err and "its largest clip skip is 3" in err
    assert "Where: --clip-skip. What to do: use a --clip-skip from 1 to 3" in err


@pytest.mark.parametrize("prompt,name", [("a [fox:cat:0.5]", "prompt editing"), ("a [fox|cat]", "alternation"),
                                         ("a fox AND a cat", "composable diffusion")])
def test_a1111_syntax_sdrt_reads_as_text_is_said(registry, tmp_path, caplog, prompt, name):
    """[fox:cat:0.5] was read as the text 'fox:cat:0.5' at weight 1/1.1 without a word."""
    import logging

    with caplog.at_level(logging.WARNING, "sdrt"):
        assert main(["generate", prompt, "--steps", "1", "--backend", "reference", "-o", str(tmp_path / "o.png")]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and f"A1111's {name}" in said[0] and "does not implement" in said[0]


def test_plain_brackets_and_escapes_are_not_taken_for_prompt_editing():
    from sdrt.text.attention import unsupported_syntax

    for text in ("a [fox] (cat:1.2)", r"a \[x:1\]", "[fox:cat:abc]", "(fox:0.5)", "ANDROID and"):
        assert unsupported_syntax(text) == [], text


def test_run_with_an_empty_input_is_one_line(tmp_path, registry, capsys):
    """A (0, 4, 8, 8) latent gave a 2,650-character shape-inference error over 17 lines."""
    np.save(tmp_path / "empty.npy", np.zeros((0, 2), np.float32))
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    model = tmp_path / "relu.onnx"
    model.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert main(["run", str(model), "-i", f"x={tmp_path / 'empty.npy'}", "-o", str(tmp_path / "y.npz")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "input 'x' is empty: its shape (0, 2)" in err


def test_a_failed_shape_inference_is_one_line():
    """ONNX reports every node after the first failing one, a line each (17 lines for the demo VAE)."""
    import onnx

    from sdrt import pipelines
    from sdrt.errors import ModelError
    from sdrt.graph.protos import infer

    model = onnx.load(str(pipelines.DEMO_MODEL / "vae_decoder" / "model.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0  # batch 0
    with pytest.raises(ModelError) as info:
        infer(model, "model.onnx")
    text = str(info.value)
    assert "\n" not in text and text.startswith("shape inference failed: ") and "more node(s) after it" in text


@pytest.mark.parametrize("args,words", [
    (["--seed", str(2**64 - 1), "--batch-count", "2"], "--seed 18446744073709551615 with --batch 1 and --batch-count 2 "
                                                        "draws seeds up to 18446744073709551616"),
    (["--seed", str(2**64 - 1), "--batch", "2", "--rng", "gpu"], "draws seeds up to 18446744073709551616"),
    (["--subseed", str(2**64 - 1), "--subseed-strength", "0.3", "--batch", "2"], "draws subseeds up to")])
def test_seeds_past_2_64_are_refused_before_the_run(args, words, registry, tmp_path, capsys):
    """The first image ran, then 'seed 18446744073709551616 is out of range' (a seed the user never gave)."""
    assert main(["generate", "a fox", *args, "--backend", "reference", "-o", str(tmp_path / "o.png")]) == 1
    err = capsys.readouterr().err
    assert words in err and "backend" not in err and not list(tmp_path.iterdir())


def test_one_stream_batch_at_the_largest_seed_runs(registry, tmp_path, capsys):
    """rng cpu draws the batch from one stream of the one seed: 2**64 - 1 with --batch 2 is fine."""
    assert main(["generate", "a fox", "--seed", str(2**64 - 1), "--batch", "2", "--steps", "1", "--backend",
                 "reference", "-o", str(tmp_path / "o.png")]) == 0


@pytest.mark.parametrize("var", ["SDRT_PLUGINS", "SDRT_DISABLE_PLUGINS"])
def test_a_plugin_variable_naming_no_plugin_is_said(var):
    """SDRT_DISABLE_PLUGINS=OpenVINO blocked nothing (names are case-sensitive), without a word."""
    import subprocess
    import sys

    env = {**os.environ, "SDRT_LOAD_ENTRY_POINTS": "1", var: "reference,Nosuch"}
    proc = subprocess.run([sys.executable, "-m", "sdrt", "info"], capture_output=True, text=True, env=env, timeout=120)
    assert f"{var} names 'Nosuch', which no installed plugin is called (installed: " in proc.stderr
    assert "reference" not in proc.stderr.split("names")[1].split("(installed")[0]


@PERMISSIONS
@pytest.mark.parametrize("locked", ["", "unet"])
@pytest.mark.parametrize("command", ["generate", "plan"])
def test_an_unreadable_model_folder_is_one_line(tmp_path, registry, capsys, command, locked):
    """A PermissionError traceback from a glob (the folder) or a stat (a part's folder)."""
    import shutil

    from sdrt import pipelines

    model = tmp_path / "model"
    shutil.copytree(pipelines.DEMO_MODEL, model)
    (model / locked).chmod(0)
    try:
        args = ["generate", str(model), "a fox", "--backend", "reference"] if command == "generate" else ["plan",
                                                                                                           str(model)]
        assert main([*args]) == 1
    finally:
        (model / locked).chmod(0o755)
    err = capsys.readouterr().err
    assert f"cannot read the {locked or 'model'} folder (Permission denied)" in err and "Traceback" not in err


@PERMISSIONS
@pytest.mark.parametrize("args,words", [(["generate", "a fox", "--embedding-dir"], "cannot read the embedding folder"),
                                        (["generate", "a fox", "--lora-dir"], "cannot read the LoRA folder"),
                                        (["cache", "list", "--cache-dir"], "cannot read the cache folder")])
def test_an_unreadable_folder_flag_is_one_line(tmp_path, capsys, args, words):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    try:
        assert main([*args, str(locked)]) == 1
    finally:
        locked.chmod(0o755)
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@PERMISSIONS
def test_a_cache_folder_this_user_cannot_read_is_a_miss_and_one_warning(tmp_path, monkeypatch, caplog):
    """lookup's is_dir raised a PermissionError: generate stopped with a traceback."""
    import logging

    from sdrt.cache import CompileCache

    locked = tmp_path / "cache"
    locked.mkdir(mode=0)
    monkeypatch.setenv("SDRT_CACHE_DIR", str(locked))
    try:
        with caplog.at_level(logging.WARNING, "sdrt"):
            cache = CompileCache("demo")
            assert cache.lookup("ab" * 32) is None
            assert cache.store("ab" * 32, lambda d: (d / "blob").write_bytes(b"p")) is None
    finally:
        locked.chmod(0o755)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "cannot write in" in said[0]


@pytest.mark.parametrize("value,words", [("-inf", "got -inf"), ("-1e3", "got -1000.0"), ("-Infinity", "got -inf"),
                                         ("-nan", "got nan"), ("-NaN", "got nan")])
def test_a_negative_exponent_or_infinity_is_a_value_not_an_option(value, words, capsys):
    """argparse read '--cfg -inf' as an unknown option: 'argument --cfg: expected one argument'; '-nan' it split as
    generate's '-n' with 'an'."""
    assert main(["generate", "a fox", "--cfg", value]) == 1
    assert f"--cfg must be a finite number from 0 to 100, {words}" in capsys.readouterr().err


@pytest.mark.parametrize("args,words", [(["plan", "m.onnx", "--memory", "-5G"], "cannot read the memory size '-5G'"),
                                        (["cache", "prune", "--max-size", "-1G"], "cache size '-1G' is not a size"),
                                        (["generate", "a fox", "--memory", "-8GiB"], "memory size '-8GiB'")])
def test_a_negative_size_is_a_value_not_an_option(args, words, capsys):
    """argparse read '--memory -5G' as an unknown option: 'argument --memory: expected one argument', which names
    neither the value nor what is wrong with it."""
    assert main(args) != 0
    err = capsys.readouterr().err
    assert words in err and "expected one argument" not in err, err


@pytest.mark.parametrize("command", ["generate", "demo", "run"])
def test_an_output_name_too_long_is_one_line(tmp_path, registry, capsys, command):
    """pathlib's is_symlink raised OSError 'File name too long' with a traceback."""
    model = relu_model(tmp_path / "relu.onnx")
    name = str(tmp_path / ("x" * 300))
    args = {"generate": ["generate", "a fox", "-o", name + ".png"], "demo": ["demo", "-o", name],
            "run": ["run", str(model), "-i", f"x={tmp_path / 'x.npy'}", "-o", name]}[command]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "(File name too long). Where: --output." in err and "Traceback" not in err


@pytest.mark.parametrize("args,where", [(["generate", "{long}", "a fox"], "MODEL"),
                                        (["generate", "a fox", "--lora", "{long}"], "--lora"),
                                        (["generate", "a fox", "--init-image", "{long}"], "--init-image"),
                                        (["plan", "{long}"], "MODEL"), (["cache", "list", "--cache-dir", "{long}"],
                                                                       "--cache-dir")])
def test_a_path_too_long_to_look_at_is_one_line_naming_its_option(args, where, registry, capsys):
    """pathlib's is_file()/exists() raise ENAMETOOLONG (they swallow only 'no such file'): tracebacks."""
    long = "x" * 300
    assert main([a.format(long=long) for a in args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: a path is too long for the file system (File name too long: 'xxx")
    assert f"Where: {where}. What to do: give a shorter path." in err and err.count("\n") == 1


@pytest.mark.parametrize("args,flag", [(["run", "", "-o", "y.npz"], "MODEL"), (["strip", ""], "MODEL"),
                                       (["quantize", "", "--to", "int8"], "MODEL"), (["plan", ""], "MODEL"),
                                       (["generate", "", "a fox"], "MODEL"), (["conformance", ""], "BACKEND")])
def test_an_empty_positional_is_refused_not_read_as_the_current_folder(args, flag, capsys):
    """Path('') is '.': strip/quantize raised ValueError ('PosixPath('.') has an empty name'), the others looked
    for a model in the current folder."""
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} is given an empty value. Where: {flag}. What to do: give ")


@pytest.mark.parametrize("config,words", [({"num_train_timesteps": -5}, "num_train_timesteps is -5, not a whole number"),
                                          ({"num_train_timesteps": "x"}, "num_train_timesteps is 'x'"),
                                          ({"num_train_timesteps": 1e12}, "num_train_timesteps is 1000000000000.0, not a whole number from 1 to 100000"),
                                          ({"beta_start": "x"}, "beta_start is 'x', not a number above 0 and at most 1"),
                                          ({"trained_betas": [1, "a"]}, "trained_betas are not a list of numbers")])
def test_a_broken_scheduler_config_is_one_line(tmp_path, registry, capsys, config, words):
    """int()'s ValueError, numpy's ValueError ('Number of samples, -5') or a 7 TiB MemoryError, with tracebacks."""
    import json
    import shutil

    from sdrt import pipelines

    model = tmp_path / "model"
    shutil.copytree(pipelines.DEMO_MODEL, model)
    (model / "scheduler" / "scheduler_config.json").write_text(json.dumps(config))
    assert main(["generate", str(model), "a fox", "--steps", "1", "--backend", "reference",
                 "-o", str(tmp_path / "o.png")]) == 1
    err = capsys.readouterr().err
    assert f"the scheduler config's {words}" in err and err.count("\n") == 1


@pytest.mark.parametrize("key,value", [("scaling_factor", "x"), ("scaling_factor", 0), ("shift_factor", "x")])
def test_a_vae_scaling_that_is_no_number_is_refused(tmp_path, registry, capsys, key, value):
    """'x' was silently the family's 0.18215; 0 divided the latents into a NaN image, written without a word."""
    import json
    import shutil

    from sdrt import pipelines

    model = tmp_path / "model"
    shutil.copytree(pipelines.DEMO_MODEL, model)
    config = model / "vae_decoder" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), key: value}))
    assert main(["generate", str(model), "a fox", "--steps", "1", "--backend", "reference",
                 "-o", str(tmp_path / "o.png")]) == 1
    err = capsys.readouterr().err
    assert f"the vae_decoder config's {key} is {value!r}, not a finite number" in err
    assert not (tmp_path / "o.png").exists()


@pytest.mark.parametrize("size", ["x", 1e9, 64])
def test_a_config_sample_size_the_fixed_graph_contradicts_is_not_asked_for(tmp_path, registry, capsys, size):
    """Nothing asked, yet 'this model makes 64x64 images only ... and 512x512 was asked. Where: --width'."""
    import json
    import shutil

    from sdrt import pipelines

    model = tmp_path / "model"
    shutil.copytree(pipelines.DEMO_MODEL, model)
    config = model / "unet" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "sample_size": size}))
    assert main(["generate", str(model), "a fox", "--steps", "1", "--backend", "reference",
                 "-o", str(tmp_path / "o.png")]) == 0
    from sdrt.pipelines.png import read_parameters

    assert "Size: 64x64" in read_parameters(tmp_path / "o.png")


def test_cli_and_server_read_a1111_syntax_alike():
    """The CLI's warnings and the server's notes came from two sets of patterns that disagreed: the server named
    [a:b] as prompt editing and the CLI missed A1111's AND next to punctuation ("cat AND(dog)"). One set now."""
    from sdrt.serve.a1111 import _prompt_syntax
    from sdrt.text.attention import unsupported_syntax

    for text, named in (("a [cat:dog]", False), ("a [cat:dog:0.5]", True), ("cat AND(dog)", True), ("[a|b]", True),
                        (r"a \[x:1\]", False), ("ANDROID", False), ("a (cat:1.2) [blurry]", False)):
        assert bool(unsupported_syntax(text)) is named and bool(_prompt_syntax(text, "prompt")) is named, text


def test_generate_adds_png_to_a_name_without_a_suffix_as_the_other_commands_do(tmp_path, registry, capsys):
    """`sdrt generate -o noext` wrote a PNG named `noext` (demo and run add their suffix), and `-o newdir/` wrote a
    file named `newdir`; the input check sees the name written (`--init-image x.png -o x` would replace x.png)."""
    from sdrt.pipelines.png import read_parameters

    assert main(["generate", "a fox", "--steps", "1", "--backend", "reference", "-o", str(tmp_path / "noext")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noext.png"]
    assert "Steps: 1" in read_parameters(tmp_path / "noext.png")
    assert f"wrote {tmp_path / 'noext.png'} " in capsys.readouterr().out
    assert main(["generate", "a fox", "--steps", "1", "--backend", "reference", "--batch", "2",
                 "-o", str(tmp_path / "many")]) == 0  # numbered as before
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many-1.png", "many-2.png", "noext.png"]
    before = (tmp_path / "noext.png").read_bytes()
    assert main(["generate", "a fox", "--steps", "4", "--init-image", str(tmp_path / "noext.png"),
                 "-o", str(tmp_path / "noext")]) == 1
    err = capsys.readouterr().err
    assert "is the same file as --init-image" in err and "backend" not in err
    assert (tmp_path / "noext.png").read_bytes() == before
    assert main(["generate", "a fox", "--steps", "1", "-o", str(tmp_path / "newdir") + "/"]) == 1
    err = capsys.readouterr().err
    assert "names a folder, not a file" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many-1.png", "many-2.png", "noext.png"]


def test_a_folder_no_file_can_be_made_in_is_refused_before_the_run(capsys):
    """`-o /proc/x.png` passed the permission check (root may "write" /proc) and failed after the whole run."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    assert main(["generate", "a fox", "--steps", "1", "-o", "/proc/x.png"]) == 1
    err = capsys.readouterr().err
    assert "cannot write into the folder /proc" in err and "Where: --output." in err and "backend" not in err
    assert not [n for n in os.listdir("/proc") if n.startswith(".sdrt-probe")]


@pytest.mark.parametrize("args,flag,suffix", [(["strip", "-o", "graph.png"], "-o", ".onnx"),
                                              (["strip", "--weights", "w.png"], "--weights", ".safetensors"),
                                              (["quantize", "--to", "int8", "-o", "q.png"], "-o", ".onnx")])
def test_strip_and_quantize_refuse_an_output_named_as_another_format(tmp_path, capsys, monkeypatch, args, flag,
                                                                     suffix):
    """``sdrt quantize m.onnx -o q.png`` wrote an ONNX graph named q.png (``sdrt run -o out.png`` is refused)."""
    model = relu_model(tmp_path / "relu.onnx")
    monkeypatch.chdir(tmp_path)
    assert main([args[0], str(model), *args[1:]]) == 1
    err = capsys.readouterr().err
    assert f"{flag} '{args[-1]}' ends in .png, and this command writes {suffix} files" in err, err
    assert "Traceback" not in err and sorted(p.name for p in tmp_path.iterdir()) == ["relu.onnx", "x.npy"]


@pytest.mark.parametrize("name", ["preview-1-002.png", "preview-2-001.png"])
def test_an_output_named_as_a_preview_in_the_preview_dir_is_refused(tmp_path, capsys, name):
    """-o prev/preview-1-002.png --preview-dir prev: the final image replaced that preview (or a later preview the
    image), in silence."""
    (tmp_path / "prev").mkdir()
    out = tmp_path / "prev" / name
    assert main(["generate", "a fox", "--steps", "2", "--preview-dir", str(tmp_path / "prev"), "-o", str(out)]) == 1
    assert "is a name the previews take in --preview-dir" in capsys.readouterr().err
    assert not out.exists()
