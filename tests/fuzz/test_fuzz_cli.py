"""Fuzz the ``sdrt`` command's arguments: generated flag combinations and values for ``sdrt generate`` (on the demo
model and the tiny test models) and the other commands that take user values. Whatever is given, a run exits 0, 1
or 2 with one ``error:`` line that says what, where and what to do; no traceback; no input changed or removed
(cli_fuzz.check_policy, cli_fuzz.Sandbox). Runs are 1-2 steps at 64x64 or less.

The flags come from the commands' own parsers: a new flag is fuzzed without a change here. Each value is drawn by
the flag's kind: numbers (out of range, NaN, inf, huge, negative, not numbers), paths (missing, a folder, a FIFO,
/dev/null, a dangling or looping link, a newline or odd unicode in the name, a text file, broken pictures), and
free text (empty, blank, odd unicode).

Not covered: unreadable files (the tests run as root here, which reads everything), NUL bytes (no argv holds one).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
from pathlib import Path

import numpy as np
from cli_fuzz import Sandbox, sdrt
from gw_fuzz import EXAMPLES, SETTINGS
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sdrt.cli import build_parser

DATA = Path(__file__).resolve().parents[1] / "data"
MODELS = [None, DATA / "pipelines" / "tiny-sd15", DATA / "pipelines" / "tiny-sd15-controlnet",
          DATA / "pipelines" / "tiny-sd15-inpaint", DATA / "pipelines" / "tiny-sdxl-dyn"]
UPSCALER = DATA / "upscalers" / "compact_x4.safetensors"
LORA = next((DATA / "lora").rglob("*.safetensors"), None)
BOX = Sandbox(Path(tempfile.mkdtemp(prefix="sdrt-fuzz-cli-")))
atexit.register(shutil.rmtree, BOX.root, ignore_errors=True)

def _data() -> dict[str, tuple[int, int]]:
    """Every file of the models the runs read, by (size, mtime): none may change, and none be added."""
    from sdrt import pipelines

    folders = [m for m in MODELS if m] + [pipelines.DEMO_MODEL, UPSCALER.parent]
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for f in folders for p in f.rglob("*") if p.is_file()}


DATA_BEFORE = _data()

#: examples per test: the runs are dearer than a file parse, so a quarter of the fuzz default
CLI_SETTINGS = settings(SETTINGS, max_examples=max(EXAMPLES // 4, 10))

NUMBERS = ["0", "1", "2", "-1", "-2", "0.5", "-0.5", "1.5", "7", "64", "65", "63", "8", "16", "1e-9", "0.999999",
           "nan", "-nan", "inf", "-inf", "1e308", "1e999", "-1e999", "99999999999999999999", "2147483648", "4294967297",
           "-9223372036854775809", "1e3", "0x10", "1_0", "٣", "²", " 1", "1 ", "", " ", "abc", "1,2", "1.0.0", "--"]
TEXT = ["", " ", "a", "x" * 300, "Euler a", "karras", "full", "auto", "cpu", "ünïcødé", "画像", "🦊", "\t",
        "a\nb", "\x1b[31mred", "'", '"', "{", "%s", "../..", "-", "—", "\u202e", "\ufeff", "\udcff", "0", "-1", "nan"]


def _path_values() -> list[str]:
    paths = [str(p) for p in BOX.paths.values()]
    extra = [str(BOX.inputs), str(BOX.inputs) + "/", str(BOX.inputs / ("x" * 300 + ".png")), "/", "/proc/self/status",
             "/dev/zero", str(BOX.inputs / "missing" / "deeper.png")]
    return paths + extra + [str(m) for m in MODELS if m] + [str(UPSCALER)] + ([str(LORA)] if LORA else [])


PATHS = _path_values()
OUTPUTS = [str(BOX.out / "o.png"), str(BOX.out / "o"), str(BOX.out / "o.jpg"), str(BOX.out / "o.webp"),
           str(BOX.out / "o.txt"), str(BOX.out / "o.PNG"), str(BOX.out), str(BOX.out) + "/", str(BOX.out / "no" / "o.png"),
           "-", "/dev/null", "/dev/full", str(BOX.picture), str(BOX.paths["text"]), str(BOX.paths["folder"]),
           str(BOX.paths["fifo"]), str(BOX.paths["dangling"]), str(BOX.paths["loop"]), str(BOX.out / ".png"),
           str(BOX.out / "\u202eo.png"), str(BOX.out / "\udcffo.png"), str(BOX.out / ("o" * 300 + ".png")), ""]

PATHISH = ("FILE", "DIR", "PNG", "IMAGE", "ONNX", "NAME|FILE", "FILE|DIR", "DIR|FILE", "FILE[:SCALE]")


def _values(action: argparse.Action) -> st.SearchStrategy[str]:
    """Values for one option, by its kind."""
    if action.choices:
        return st.one_of(st.sampled_from([str(c) for c in action.choices]), st.sampled_from(TEXT))
    if action.type in (int, float):
        return st.sampled_from(NUMBERS)
    if action.dest == "output":
        return st.sampled_from(OUTPUTS)
    if action.dest in ("preview_dir", "cache_dir"):  # folders written to: the sandbox's, never the test data's
        return st.sampled_from([str(BOX.out), str(BOX.inputs), *[str(p) for p in BOX.paths.values()]])
    if str(action.metavar) in PATHISH or action.dest in ("init_image", "mask", "lora_dir", "embedding_dir", "model",
                                                         "image"):
        return st.one_of(st.sampled_from(PATHS), st.sampled_from([p + ":" + n for p in PATHS[:3] for n in NUMBERS[:8]]))
    return st.one_of(st.sampled_from(TEXT), st.sampled_from(NUMBERS), st.text(max_size=12))


def _options(command: str) -> list[argparse.Action]:
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    return [a for a in parser._actions if a.option_strings and a.dest not in ("help", "verbose")]


@st.composite
def flags(draw: st.DrawFn, command: str, skip: tuple[str, ...] = ()) -> list[str]:
    """1-4 of the command's options, each with a value of its kind (a switch alone)."""
    actions = [a for a in _options(command) if a.dest not in skip]
    chosen = draw(st.lists(st.sampled_from(actions), min_size=1, max_size=4, unique_by=lambda a: a.dest))
    out: list[str] = []
    for action in chosen:
        name = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            out.append(name)
        else:
            value = draw(_values(action))
            out += [f"{name}={value}"] if value.startswith("-") and value != "-" else [name, value]
    return out


#: generate's options that would make a run long or leave the machine (the backend: the reference one always)
SLOW = ("backend", "device", "steps", "batch", "batch_count", "hires_steps", "dry_run", "preview_every", "memory")


@CLI_SETTINGS
@given(data=st.data())
def test_fuzz_generate_flags(registry, monkeypatch, data):
    model = data.draw(st.sampled_from(MODELS), label="model")
    prompt = data.draw(st.sampled_from(["a red fox", "", "🦊 <lora:x:1>", "(a:1.5) [b|c] {d}", "a" * 500]),
                       label="prompt")
    extra = data.draw(flags("generate", SLOW), label="flags")
    if "-o" not in extra and "--output" not in extra and not any(f.startswith(("-o=", "--output=")) for f in extra):
        extra += ["-o", str(BOX.out / "out.png")]
    steps = data.draw(st.sampled_from(["1", "2"]), label="steps")
    args = ["generate", *([str(model)] if model else []), prompt, *extra, "--steps", steps, "--backend", "reference"]
    monkeypatch.chdir(BOX.cwd)
    rc, err = sdrt(args)
    event(f"exit {rc}")
    BOX.check(args)
    assert _data() == DATA_BEFORE, f"sdrt {args!r} changed the test models"


#: commands with the options to fuzz and a base command line that is valid
OTHERS = {
    "upscale": (["upscale", str(BOX.picture), "-m", str(UPSCALER), "-o", str(BOX.out / "up.png"), "--backend",
                 "reference"], ("backend", "device")),
    "plan": (["plan", str(MODELS[1])], ()),
    "demo": (["demo", "-o", str(BOX.out / "demo.png"), "--backend", "reference"], ("backend", "device")),
    "strip": (["strip", str(DATA / "pipelines" / "tiny-sd15" / "vae_decoder" / "model.onnx"), "-o",
               str(BOX.out / "s.onnx")], ()),
    "quantize": (["quantize", str(DATA / "pipelines" / "tiny-sd15" / "vae_decoder" / "model.onnx"), "--to", "int8",
                  "-o", str(BOX.out / "q.onnx")], ()),
    "cache": (["cache", "list", "--cache-dir", str(BOX.out / "cache")], ()),
    "install": (["install", "--dry-run"], ()),
    "info": (["info"], ()),
}


@CLI_SETTINGS
@given(data=st.data())
def test_fuzz_other_commands(registry, monkeypatch, data):
    name = data.draw(st.sampled_from(sorted(OTHERS)), label="command")
    base, skip = OTHERS[name]
    extra = data.draw(flags(name, skip), label="flags")
    if name == "cache":  # an action with another cache folder: never the user's
        base = ["cache", data.draw(st.sampled_from(["list", "clear", "prune"])), *base[2:]]
        if any(f.startswith("--cache-dir") for f in extra):
            base = base[:2]
    if name == "install" and "--dry-run" in extra:  # installs nothing either way: --dry-run stays
        base = ["install"]
    if data.draw(st.booleans()) and name in ("upscale", "plan", "strip", "quantize"):  # the positional: a path
        base = [base[0], data.draw(st.sampled_from(PATHS)), *base[2:]]
    args = [*base, *extra]
    monkeypatch.chdir(BOX.cwd)
    rc, err = sdrt(args)
    event(f"{name}: exit {rc}")
    BOX.check(args)
    assert _data() == DATA_BEFORE, f"sdrt {args!r} changed the test models"


#: values an app may pass to any keyword: the wrong type, out of range, NaN, huge, empty, numpy scalars, containers
API_VALUES = [None, True, False, 0, 1, -1, 2, 7, 64, 65, 2**31, 2**64, -(2**63) - 1, 0.0, 0.5, -0.5, 1.5, 7.5,
              float("nan"), float("inf"), -float("inf"), 1e308, np.float32(0.5), np.int64(64), np.uint8(8),
              np.float64("nan"), np.bool_(True), "", " ", "1", "64", "nan", "Euler a", "karras", "cpu", "🦊", "\udcff",
              "a\nb", [], [1], [1, 2], (64, 64), {}, {"a": 1}, b"", b"/no/such.png", np.zeros(3), np.zeros((2, 2)),
              object(), 1 + 2j, slice(1), Path("/no/such.png")]


@CLI_SETTINGS
@given(data=st.data())
def test_fuzz_validate_keywords(data):
    """The Python API's ``validate`` (what ``generate`` checks first) with 1-4 keywords of any type and value: it
    returns Settings or raises an SdrtError of one line that says where and what to do, naming an argument."""
    import inspect

    from sdrt.errors import SdrtError
    from sdrt.pipelines.settings import validate
    from sdrt.pipelines.toolbox import KEYWORDS

    names = [n for n in inspect.signature(validate).parameters if n not in ("prompt", "toolbox")] + list(KEYWORDS)
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True), label="keywords")
    kwargs = {n: data.draw(st.sampled_from(API_VALUES), label=n) for n in chosen}
    prompt = data.draw(st.sampled_from(["a fox", "", None, 3, "\udcff", "a" * 2000]), label="prompt")
    try:
        validate(prompt, **kwargs)
        event("accepted")
    except SdrtError as exc:
        text = str(exc)
        event(f"refused: {type(exc).__name__}")
        assert "\n" not in text and " Where: " in text and " What to do: " in text, text
