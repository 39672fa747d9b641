"""The sdrt command: info, run."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sdrt.cli import main


def test_info_lists_reference_backend_with_device(registry, capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sdrt 0.1.0 (plugin API 1.3)")
    assert "reference  [sdrt-reference" in out and "device reference:CPU" in out


def test_run_writes_outputs_that_match_numpy(registry, affine_path, affine, tmp_path, capsys):
    _, reference = affine
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    assert main(["run", str(affine_path), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out),
                 "--backend", "reference", "--device", "CPU"]) == 0
    np.testing.assert_allclose(np.load(out)["y"], reference(x), rtol=1e-6)
    assert "y: float32[2, 3]" in capsys.readouterr().out


def test_run_takes_a_precision(registry, affine_path, affine, tmp_path, capsys):
    """`sdrt run` had no way to ask for fp32: on a CPU with bf16 dot products (AVX-512-BF16, AMX) every run came
    back at bf16, 3e-3 off a float32 reference such as onnxruntime's. The reference backend computes fp32 alone:
    fp32 is taken, anything else refused in flag words."""
    _, reference = affine
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    argv = ["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
            "--backend", "reference"]
    assert main([*argv, "--precision", "fp32"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], reference(x), rtol=1e-6)
    capsys.readouterr()
    assert main([*argv, "--precision", "bf16"]) == 1
    err = capsys.readouterr().err
    assert err == ("error: the reference backend computes in fp32 only, not 'bf16'. Where: --precision. "
                   "What to do: pass --precision fp32, leave it out, or pick another --backend.\n")


@pytest.mark.parametrize("backend", ["ggml", "openvino"])
def test_run_at_fp32_matches_float32(backend, registry, affine_path, affine, tmp_path, monkeypatch, capsys):
    registry.register_plugin(pytest.importorskip(f"sdrt_{backend}"), backend)
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    _, reference = affine
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--backend", backend, "--precision", "fp32"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], reference(x), rtol=1e-5, atol=1e-6)
    assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--backend", backend, "--precision", "int8"]) == 1
    err = capsys.readouterr().err
    assert "precision 'int8' is not one this backend accepts" in err and "Where: --precision." in err


def test_run_an_input_without_a_declared_shape(registry, tmp_path, capsys):
    """An input that declares no shape, not even a rank (onnxruntime takes any array there): its TensorInfo reads
    as a scalar's, so `sdrt run` refused a (2, 2) array ("the graph takes x: float32[]"), and pinning it did
    nothing. The feed's shape pins it."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "any.onnx"))
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(tmp_path / "any.onnx"), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--backend", "reference"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(x, 0))
    assert "y: float32[2, 2]" in capsys.readouterr().out


def _graph(path, nodes, inputs, outputs, opset=17):
    import onnx
    from onnx import helper

    g = helper.make_graph(nodes, "g", inputs, outputs)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return str(path)


def test_run_feeds_bfloat16_strings_and_saves_sequences(registry, tmp_path, capsys):
    """Inputs and outputs a .npy/.npz holds only in other words: a bfloat16 input (numpy has none; the fix said
    numpy.bfloat16), a string input (the fix said numpy.object; a str array, which Session.run takes, was refused),
    a string output (saved pickled: np.load refused it) and a sequence output (AttributeError traceback)."""
    from onnx import TensorProto, helper

    from sdrt.graph import Graph

    vi = helper.make_tensor_value_info
    x = np.array([1.0, 2.5, -3.0, 1 / 3], np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o.npz"
    bf = _graph(tmp_path / "bf.onnx", [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
                [vi("x", TensorProto.BFLOAT16, [4])], [vi("y", TensorProto.FLOAT, [4])])
    assert main(["run", bf, "-i", f"x={tmp_path / 'x.npy'}", "-o", str(out), "--backend", "reference"]) == 0
    np.testing.assert_array_equal(np.load(out)["y"], np.array([1.0, 2.5, -3.0, 0.333984375], np.float32))
    np.save(tmp_path / "i.npy", np.arange(4))
    assert main(["run", bf, "-i", f"x={tmp_path / 'i.npy'}", "-o", str(out), "--backend", "reference"]) == 1
    assert "save it as float32 (rounded to bfloat16 here)" in capsys.readouterr().err

    st = _graph(tmp_path / "st.onnx", [helper.make_node("Identity", ["s"], ["y"])],
                [vi("s", TensorProto.STRING, [2])], [vi("y", TensorProto.STRING, [2])])
    np.save(tmp_path / "s.npy", np.array(["ab", "c"]))
    assert main(["run", st, "-i", f"s={tmp_path / 's.npy'}", "-o", str(out), "--backend", "reference"]) == 0
    assert np.load(out)["y"].tolist() == ["ab", "c"]  # no allow_pickle
    assert main(["run", st, "-i", f"s={tmp_path / 'x.npy'}", "-o", str(out), "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert "the graph takes strings" in err and "numpy.array(['text', ...])" in err and "numpy.object" not in err

    seq = _graph(tmp_path / "seq.onnx", [helper.make_node("SequenceConstruct", ["a", "a"], ["q"])],
                 [vi("a", TensorProto.FLOAT, [4])], [helper.make_tensor_sequence_value_info("q", TensorProto.FLOAT, [4])])
    assert Graph.load(seq)
    assert main(["run", seq, "-i", f"a={tmp_path / 'x.npy'}", "-o", str(out), "--backend", "reference"]) == 0
    saved = np.load(out)
    assert saved.files == ["q[0]", "q[1]"] and np.array_equal(saved["q[1]"], x)
    assert "q: a sequence of 2, saved as q[0] ... q[1]" in capsys.readouterr().out


def test_a_negative_dim_is_any_size(registry, tmp_path, capsys):
    """Some exporters write -1 for a dynamic dim (onnxruntime reads it as any size): sdrt took it as a size, so
    `sdrt run` refused a (2, 4) array for float32[-1, 4] and `sdrt plan` counted -16 bytes of activations."""
    import json

    import onnx
    from onnx import TensorProto, helper

    from sdrt.graph import Graph

    vi = helper.make_tensor_value_info
    path = tmp_path / "neg.onnx"
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                            [vi("x", TensorProto.FLOAT, [-1, 4])], [vi("y", TensorProto.FLOAT, [-1, 4])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    assert Graph.load(path).inputs[0].shape == (None, 4)
    x = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--backend", "reference"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(x, 0))
    capsys.readouterr()
    assert main(["plan", str(path), "--json", "--device", "cpu"]) == 0
    part = json.loads(capsys.readouterr().out)["parts"][0]
    assert part["activation_bytes"] > 0 and part["predicted_peak_bytes"] > 0


def test_run_refuses_a_sequence_input_saying_so(registry, tmp_path, capsys):
    """A sequence input cannot come from one .npy: the refusal asked for `-i seq=FILE.npy` (seq: non-tensor[]),
    which no file satisfies. An optional tensor input still takes its .npy."""
    from onnx import TensorProto, helper

    seq = _graph(tmp_path / "seq.onnx", [helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)],
                 [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    assert main(["run", seq, "-o", str(tmp_path / "o.npz")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: input 'seq' is a sequence of tensors, and sdrt run feeds tensors only")
    assert "sdrt.load(MODEL, backend='reference').run({'seq': ...})" in err and len(err.splitlines()) == 1
    opt = helper.make_value_info("m", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    path = _graph(tmp_path / "opt.onnx", [helper.make_node("OptionalHasElement", ["m"], ["has"])], [opt],
                  [helper.make_tensor_value_info("has", TensorProto.BOOL, [])], opset=18)
    np.save(tmp_path / "m.npy", np.ones(2, np.float32))
    assert main(["run", path, "-i", f"m={tmp_path / 'm.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--backend", "reference"]) == 0
    assert bool(np.load(tmp_path / "o.npz")["has"])


def test_run_device_errors_speak_flags(registry, affine_path, tmp_path, capsys):
    """A device of another backend was refused in the API's words on the command line: 'Where:
    sdrt.load(backend=..., device=...). What to do: drop the backend, or pass device=...'."""
    registry.register_plugin(pytest.importorskip("sdrt_openvino"), "openvino")
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    argv = ["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz")]
    assert main([*argv, "--backend", "openvino", "--device", "reference:CPU"]) == 1
    err = capsys.readouterr().err
    assert "Where: --device. What to do: drop --backend, or pass --device 'CPU'." in err and "sdrt.load" not in err
    assert main([*argv, "--device", "reference:GPU"]) == 1
    assert "pass one of those device ids as --device, or leave it unset" in capsys.readouterr().err


def test_run_given_a_weights_file_as_the_model_names_the_weights_flag(registry, tmp_path, capsys):
    """A .safetensors or PyTorch file given as the graph: the fix said 'pass this file as weights=...', the API's
    keyword, on the command line, where the flag is --weights; the API keeps weights=."""
    from safetensors.numpy import save_file

    import sdrt
    from sdrt.errors import ModelError

    st = tmp_path / "unet.safetensors"
    save_file({"w": np.zeros((2, 2), np.float32)}, str(st))
    pt = tmp_path / "unet.ckpt"
    pt.write_bytes(b"\x80\x02}q\x00.")
    for path in (st, pt):
        assert main(["run", str(path), "-o", str(tmp_path / "o.npz")]) == 1
        err = capsys.readouterr().err
        assert "pass this file as --weights FILE" in err and "weights=" not in err, err
        with pytest.raises(ModelError, match=r"pass this file as weights=FILE"):
            sdrt.load(path, backend="reference")


@pytest.mark.parametrize("spec, message", [
    ("x", "bad --input 'x'"),
    ("x=/nonexistent/x.npy", "input file for 'x' does not exist"),
])
def test_run_bad_input_spec_is_a_clear_error(registry, affine_path, tmp_path, capsys, spec, message):
    assert main(["run", str(affine_path), "--input", spec, "--output", str(tmp_path / "o.npz")]) == 1
    err = capsys.readouterr().err
    assert message in err and "What to do" in err


def test_run_input_file_that_is_not_npy(registry, affine_path, tmp_path, capsys):
    (tmp_path / "x.npy").write_text("hello")
    assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz")]) == 1
    assert "the file for 'x' is not a .npy file" in capsys.readouterr().err
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(16))  # numpy: "pickled (object) data"
    assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'x.png'}", "-o", str(tmp_path / "o.npz")]) == 1
    err = capsys.readouterr().err
    assert "is not a .npy file" in err and "pickle" not in err


@pytest.mark.parametrize("arrays,needles", [
    ({"x": np.zeros((2, 4), np.float64)}, ["input 'x' is float64 in", "Where: -i x=",
                                           "save it as float32: numpy.save("]),
    ({}, ["no -i for 'x'. Where: --input.", "pass -i NAME=FILE.npy for each input of the graph"]),
    ({"x": np.zeros((2, 4), np.float32), "z": np.zeros(1, np.float32)}, ["the graph has no input 'z'"]),
])
def test_run_input_errors_speak_the_command(registry, affine_path, tmp_path, capsys, arrays, needles):
    specs = []
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr)
        specs += ["-i", f"{name}={tmp_path / name}.npy"]
    assert main(["run", str(affine_path), *specs, "-o", str(tmp_path / "o.npz"), "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert all(n in err for n in needles) and "Session.run" not in err and "astype(np." not in err, err


def test_run_wrong_shape_names_input(registry, affine_path, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz")]) == 1
    err = capsys.readouterr().err
    assert "input 'x' has shape (2, 5) in" in err and "float32[batch, 4]" in err and "Where: -i x=" in err


def test_python_dash_m_sdrt_works():
    proc = subprocess.run([sys.executable, "-m", "sdrt", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "sdrt 0.1.0"


def test_run_pins_dynamic_inputs_to_the_feeds(registry, affine_path, affine, tmp_path, caplog):
    _, reference = affine
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    with caplog.at_level("INFO", logger="sdrt.runtime"):
        assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                     "--backend", "reference"]) == 0
    assert "affine.onnx pinned to x: float32[3, 4]" in caplog.text
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], reference(x), rtol=1e-6)


def test_run_with_two_sizes_for_one_dim_names_both_inputs(registry, tmp_path, capsys):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "add",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])])
    (tmp_path / "add.onnx").write_bytes(helper.make_model(graph).SerializeToString())
    np.save(tmp_path / "a.npy", np.zeros((2, 2), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((3, 2), np.float32))
    assert main(["run", str(tmp_path / "add.onnx"), "-i", f"a={tmp_path / 'a.npy'}", "-i", f"b={tmp_path / 'b.npy'}",
                 "-o", str(tmp_path / "o.npz"), "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert "inputs 'a' and 'b' give the graph's dim 'batch' the sizes 2 and 3" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_reader_that_leaves_early_is_a_quiet_exit(registry, monkeypatch, capsys):
    """`sdrt quantize --plan | head`: the pipe closes under the output; a BrokenPipeError traceback before."""
    import io

    class _Gone(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise io.UnsupportedOperation("no file")

    monkeypatch.setattr(sys, "stdout", _Gone())
    assert main(["info"]) == 141
    assert capsys.readouterr().err == ""


def test_run_refuses_an_input_given_twice(registry, affine_path, tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros((2, 4), np.float32))
    np.save(tmp_path / "b.npy", np.ones((2, 4), np.float32))
    assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'a.npy'}", "-i", f"x={tmp_path / 'b.npy'}",
                 "-o", str(tmp_path / "o.npz")]) == 1
    assert "--input 'x' is given twice" in capsys.readouterr().err and not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("argv", [["run", "MODEL", "-i", "x=X", "-o", "OUT/r.txt"], ["demo", "-o", "OUT/x.gif"]])
def test_an_output_with_another_extension_is_refused(registry, affine_path, tmp_path, capsys, argv):
    """It was written as r.txt.npz and x.gif.png: not the file asked for."""
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float32))
    argv = [a.replace("MODEL", str(affine_path)).replace("X", str(tmp_path / "x.npy")).replace("OUT", str(tmp_path))
            for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "and this command writes" in err and "Where: -o." in err  # the option, not "sdrt -o"
    # "or give none" read as "give no -o", which sdrt run requires: the suffix is what may be left out
    assert "or leave the suffix out (r)" in err or "or leave the suffix out (x)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["affine.onnx", "x.npy"]


def test_controlnet_ordinals_in_cli_errors() -> None:
    """Errors name one of several --controlnet flags by its English ordinal (it said "21th")."""
    from sdrt.cli.generate_toolbox import _ordinal

    assert [_ordinal(i) for i in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 111)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "111th"]


#: each family a single file binds onto (sdrt.checkpoint.families.FAMILY_GRAPHS) -> the words `generate --help` names
#: it by; a family added without a row fails here until the help names it
HELP_FAMILIES = {"sd1": "SD 1.x", "sd2": "SD 2.x", "sdxl": "SDXL", "sd1-inpaint": "with their inpainting models",
                 "sd2-inpaint": "with their inpainting models", "sdxl-inpaint": "with their inpainting models",
                 "sdxl-refiner": "the SDXL refiner", "sd3-medium": "SD 3 Medium", "sd35-medium": "SD 3.5 Medium",
                 "sd35-large": "SD 3.5 Medium and Large", "flux-dev": "Flux.1 dev", "flux-schnell": "Flux.1 dev and schnell",
                 "flux-fill": "Fill", "flux-control": "Canny/Depth", "chroma": "Chroma", "sd1-ip2p": "InstructPix2Pix",
                 "sdxl-ip2p": "CosXL Edit"}


def test_generate_help_names_every_family_a_single_file_runs_as(capsys):
    """The help said "SD 1.x/2.x/XL, SD 3.5, Flux.1, Chroma": no SD 3 Medium, which runs, nor the inpainting models."""
    from sdrt.checkpoint.families import FAMILY_GRAPHS

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert set(HELP_FAMILIES) == set(FAMILY_GRAPHS)
    for family, words in HELP_FAMILIES.items():
        assert words in text, (family, words)
