"""``sdrt generate`` with --weights, --lora, --lora-dir, --embedding, --low-memory: PNG metadata and refusals."""

from __future__ import annotations

import shutil

import pytest
from ckpt_data import DATA, PIPE_FOLDER

from sdrt.cli import main
from sdrt.cli.generate_weights import parse_lora
from sdrt.pipelines.png import read_parameters

D = DATA / "pipe-sd15"
BASE = [str(PIPE_FOLDER), "a photo of a cat", "--steps", "2", "--sampler", "Euler", "--seed", "1", "--backend",
        "openvino"]


@pytest.mark.needs_backend("openvino")
def test_generate_with_checkpoint_lora_tag_and_embedding_writes_a1111_metadata(tmp_path, capsys):
    loras = tmp_path / "loras"
    loras.mkdir()
    shutil.copy(D / "tinylora.safetensors", loras / "ink.safetensors")
    out = tmp_path / "x.png"
    args = [str(PIPE_FOLDER), "a photo of a cat, tinyemb <lora:ink:0.6>", "--steps", "2", "--sampler", "Euler",
            "--seed", "1", "--backend", "openvino", "--weights", str(D / "custom.safetensors"),
            "--lora-dir", str(loras), "--embedding", str(D / "tinyemb.safetensors"), "--low-memory", "-o", str(out)]
    assert main(["generate", *args]) == 0, capsys.readouterr().err
    params = read_parameters(out)
    assert params is not None
    assert params.startswith("a photo of a cat, tinyemb <lora:ink:0.6>")  # the prompt as typed, as A1111 keeps it
    assert "Model: custom" in params and "Model hash: " in params
    assert "Lora hashes: " in params and "ink: " in params
    assert "TI hashes: " in params and "tinyemb: " in params


@pytest.mark.needs_backend("openvino")
def test_generate_with_lora_flag_and_scale(tmp_path, capsys):
    out = tmp_path / "y.png"
    assert main(["generate", *BASE, "--lora", f"{D / 'tinylora.safetensors'}:0.5", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    assert "tinylora: " in read_parameters(out)


@pytest.mark.parametrize("flag,value,needle", [
    ("--weights", "nosuch.safetensors", "checkpoint does not exist"),
    ("--lora", "nosuch.safetensors:0.5", "LoRA file does not exist"),
    ("--lora-dir", "nosuchdir", "LoRA folder does not exist"),
    ("--embedding", "nosuch.safetensors", "embedding file does not exist"),
])
def test_missing_files_are_refused_before_loading(tmp_path, capsys, flag, value, needle):
    assert main(["generate", *BASE, flag, str(tmp_path / value), "-o", str(tmp_path / "z.png")]) == 1
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and not (tmp_path / "z.png").exists()


@pytest.mark.needs_backend("openvino")
def test_unknown_prompt_lora_is_one_line_error(tmp_path, capsys):
    args = [str(PIPE_FOLDER), "a cat <lora:nosuch:1>", "--steps", "1", "--backend", "openvino",
            "--lora-dir", str(D), "-o", str(tmp_path / "z.png")]
    assert main(["generate", *args]) == 1
    err = capsys.readouterr().err
    assert "no LoRA named 'nosuch'" in err and "tinylora" in err and "Traceback" not in err


def test_an_embedding_pickle_that_runs_code_is_refused_by_the_cli(tmp_path, capsys):
    """Refused while the options are checked, before a model loads; nothing in it runs."""
    import pickle
    import zipfile

    bad, marker = tmp_path / "bad.pt", tmp_path / "MARKER"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("archive/data.pkl", b"cposix\nsystem\n(" + pickle.dumps(f"touch {marker}", protocol=0)[:-1] + b"tR.")
    assert main(["generate", *BASE, "--embedding", str(bad), "-o", str(tmp_path / "z.png")]) == 1
    err = capsys.readouterr().err
    assert "--embedding: cannot open bad.pt: refusing to load bad.pt: its pickle calls posix.system" in err
    assert "Traceback" not in err and not marker.exists()


def test_lora_spec_parsing(tmp_path):
    f = tmp_path / "a.safetensors"
    f.write_bytes(b"")
    assert parse_lora(f"{f}:0.25") == (f, 0.25)
    assert parse_lora(str(f)) == (f, 1.0)


def test_dry_run_checks_the_lora_as_the_run_does(tmp_path, capsys):
    """``--lora FILE --dry-run`` planned a file that is no LoRA; the run then refused it. Now the plan refuses it too
    (its header and keys, mapped), and a real LoRA still plans."""
    import numpy as np

    from sdrt.weights import stfile

    bad = tmp_path / "not_a_lora.safetensors"
    stfile.write(bad, [("foo.weight", np.zeros((2, 2), np.float32))], {})
    assert main(["generate", *BASE, "--lora", str(bad), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "not_a_lora.safetensors is not a LoRA" in err and err.count("\n") == 1, err
    assert main(["generate", *BASE, "--lora", f"{D / 'tinylora.safetensors'}:0.5", "--dry-run"]) == 0
