"""The swappable form (sdrt_openvino/swap.py) is kept in the compile cache across processes: its blob holds no weight,
so it is keyed by the graph, device, OpenVINO version and compile properties, and a hit imports it with the weights of
the call. A LoRA active at the first compile compiles straight into that form (``rebind_options``). A LoRA job in a
process that finds it stored gives the image a process that compiles it gives, bit for bit, with other LoRA weights than
those it was stored with (docs/openvino.md, "Why the two forms differ").

Run at the device's own precision (bf16 on a CPU with AVX-512-BF16 or AMX), where the two compiled forms differ by up to
22 levels: an image from any other form than the swappable one shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sdrt.cache import file_digest

DATA = Path(__file__).resolve().parents[2] / "data"
FOLDER = DATA / "pipelines" / "tiny-sd15"
LORA = DATA / "ckpt" / "pipe-sd15" / "tinylora.safetensors"

CHILD = """
import logging, sys
import numpy as np
import sdrt_openvino
from sdrt import pipelines, plugins
logging.basicConfig(level=logging.WARNING)
logging.getLogger("sdrt.openvino").setLevel(logging.INFO)
plugins.get_registry().register_plugin(sdrt_openvino, "openvino", distribution="sdrt-openvino", version="0.1.0")
folder, lora, scale, out = sys.argv[1:5]
with pipelines.load(folder, backend="openvino") as pipe:
    pipe.set_loras([(lora, float(scale))])
    image = pipe("a red cat on a mat", "blurry", steps=3, cfg=7.0, sampler="Euler", seed=7, width=64, height=64)[0]
np.save(out, np.asarray(image))
"""


def _job(cache: Path, scale: float, out: Path, precision: str | None = None) -> tuple[np.ndarray, str]:
    """A LoRA job in a fresh process over the compile cache ``cache``: its image and its log."""
    pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
    env = {**os.environ, "SDRT_CACHE_DIR": str(cache), "SDRT_LOAD_ENTRY_POINTS": "0"}
    env.pop("SDRT_PRECISION", None)  # the device's own precision
    if precision is not None:
        env["SDRT_PRECISION"] = precision
    done = subprocess.run([sys.executable, "-c", CHILD, str(FOLDER), str(LORA), str(scale), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out), done.stderr


def _default_precision() -> str:
    from sdrt_openvino.backend import OpenVINOBackend

    return next(d for d in OpenVINOBackend().devices() if d.id == "CPU").properties["precision"]


def _swap_entries(cache: Path) -> list[Path]:
    return [p.parent for p in (cache / "compiled" / "openvino").glob("*/weightless.blob")]


def test_a_stored_swappable_form_gives_the_image_of_a_fresh_one_in_another_process(tmp_path):
    _job(tmp_path / "cache", 1.0, tmp_path / "f32.npy", precision="fp32")  # stored at float32: another key
    stored_with, log = _job(tmp_path / "cache", 1.0, tmp_path / "a.npy")
    other = _default_precision() != "fp32"
    assert ("to a weightless blob" in log and "from the compile cache" not in log) or not other, log
    entries = _swap_entries(tmp_path / "cache")
    assert len(entries) == (4 if other else 2), "the text encoder's and the UNet's swappable forms, per precision"
    for entry in entries:  # no weight in it: the constants stored beside the blob are few against the weights
        layout = json.loads((entry / "swap.json").read_text())
        weights = sum(n for _, n, _ in layout["weights"].values())
        held = (entry / "extras.bin").stat().st_size
        assert held < weights / 10, f"{entry.name}: {held} bytes of constants stored for {weights} bytes of weights"

    # another process, other LoRA weights: the stored form is imported and binds this job's weights
    cached, log = _job(tmp_path / "cache", 0.4, tmp_path / "b.npy")
    assert "weightless import from the compile cache" in log, log
    assert "to a weightless blob" not in log, log
    fresh, log = _job(tmp_path / "other-cache", 0.4, tmp_path / "c.npy")
    assert "to a weightless blob" in log, log

    diff = np.abs(cached.astype(int) - fresh.astype(int))
    assert diff.max() == 0, f"the cached swappable form's image is {diff.max()} levels off a fresh one's"
    assert np.abs(cached.astype(int) - stored_with.astype(int)).mean() > 0.5, "the LoRA's scale does not show"


def test_a_stored_swappable_form_that_does_not_fit_the_graph_is_discarded_and_compiled_again(tmp_path):
    first, _ = _job(tmp_path / "cache", 1.0, tmp_path / "a.npy")
    for entry in _swap_entries(tmp_path / "cache"):  # a layout naming a weight the graph does not have
        layout = json.loads((entry / "swap.json").read_text())
        name = next(iter(layout["weights"]))
        layout["weights"]["not.a.weight"] = layout["weights"].pop(name)
        (entry / "swap.json").write_text(json.dumps(layout))
        manifest = json.loads((entry / "sdrt-entry.json").read_text())  # checksum-valid: past the cache's checks
        manifest["files"]["swap.json"].update(size=(entry / "swap.json").stat().st_size,
                                              sha256=file_digest(entry / "swap.json"))
        (entry / "sdrt-entry.json").write_text(json.dumps(manifest))
    again, log = _job(tmp_path / "cache", 1.0, tmp_path / "b.npy")
    assert "is unusable" in log and "to a weightless blob" in log, log
    assert np.array_equal(first, again)
    assert _swap_entries(tmp_path / "cache"), "the rebuilt swappable form was not stored again"


def test_a_swappable_form_is_stored_only_while_it_holds_fewer_bytes_than_the_weights_it_leaves_out(tmp_path):
    pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
    from sdrt.cache import CompileCache
    from sdrt_openvino import swap

    arrays = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.ones(8, np.float32),
              "shape": np.array([1, 64], np.int64)}
    layout = {"w": (0, 256, np.dtype(np.float32))}
    store = swap.Store(CompileCache("openvino", tmp_path), lambda props, a: "k" * 64, {"model": "m"})

    def form(extras: bytes) -> swap.Rebinder:
        return swap.Rebinder(b"blob", "CPU", {}, layout, [(256, extras)], 256 + len(extras),
                             {"b": np.dtype(np.float32)}, {"shape": arrays["shape"]})

    store.save(form(b"\1" * 300), arrays, {})  # more bytes of constants than of weights: int8 weights, say
    assert store.load(arrays, "CPU", {}) is None
    store.save(form(b"\1" * 16), arrays, {})
    back = store.load(arrays, "CPU", {})
    assert back is not None and back.blob == b"blob" and back.layout == layout and back.extras == [(256, b"\1" * 16)]
    assert back.inputs == {"b": np.dtype(np.float32)} and back.fits(arrays)
    assert store.load({**arrays, "shape": np.array([2, 32], np.int64)}, "CPU", {}) is None  # another baked value
