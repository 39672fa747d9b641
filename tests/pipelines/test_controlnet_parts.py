"""The tiny ControlNet folders' exported parts (scripts/gen_controlnet_refs.py) on every installed backend.

Each part (``controlnet/``, ``controlnet_2/`` and the ``unet/`` that takes their residuals) runs on fixed
feeds and is compared with diffusers' torch outputs saved beside it (``parts.npz``) and with onnxruntime.
The residuals are non-zero (the script perturbs ControlNet's zero convolutions), and the UNet's output
with them differs from its output with zero residuals, so these checks can fail.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import DATA, register

import sdrt

FOLDERS = ["tiny-sd15-controlnet", "tiny-sdxl-controlnet"]
PARTS = ["controlnet", "controlnet_2", "unet"]
BACKENDS = ["reference", "openvino", "ggml"]
#: float32 through other kernels: the torch outputs are O(1); measured max abs diff is about 1e-5
ATOL, RTOL = 2e-4, 2e-4


def _parts(folder: str) -> dict[str, np.ndarray]:
    with np.load(DATA / folder / "parts.npz") as z:
        return {k: z[k] for k in z.files}


def _feeds(folder: str, part: str, session_inputs: list[str]) -> dict[str, np.ndarray]:
    p = _parts(folder)
    feeds = {}
    for name in session_inputs:
        key = f"unet/feed/{name}" if f"unet/feed/{name}" in p else f"feed/{name}"
        feeds[name] = p[key]
    return feeds


def _expected(folder: str, part: str) -> dict[str, np.ndarray]:
    p = _parts(folder)
    prefix = f"{part}/"
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix) and "/feed/" not in k[len(prefix) - 1:]}


def test_folders_have_the_community_layout():
    for folder in FOLDERS:
        index = json.loads((DATA / folder / "model_index.json").read_text())
        assert index["controlnet"] == ["diffusers", "ControlNetModel"]
        xl = "sdxl" in folder
        for net in ("controlnet", "controlnet_2"):
            g = sdrt.Graph.load(DATA / folder / net / "model.onnx")
            names = [i.name for i in g.inputs]
            want = ["sample", "timestep", "encoder_hidden_states", "controlnet_cond", "conditioning_scale"]
            assert names == want + (["text_embeds", "time_ids"] if xl else [])
            outs = [o.name for o in g.outputs]
            assert outs[-1] == "mid_block_res_sample"
            assert outs[:-1] == [f"down_block_res_samples_{i}" for i in range(len(outs) - 1)]
        unet = sdrt.Graph.load(DATA / folder / "unet" / "model.onnx")
        names = [i.name for i in unet.inputs]
        n = len(outs) - 1
        assert names[-n - 1:] == [f"down_block_additional_residual_{i}" for i in range(n)] + [
            "mid_block_additional_residual"]


def test_residuals_are_not_zero_and_change_the_unet():
    for folder in FOLDERS:
        p = _parts(folder)
        for net in ("controlnet", "controlnet_2"):
            assert all(float(np.abs(v).max()) > 1e-3 for k, v in p.items() if k.startswith(f"{net}/"))
        assert not np.allclose(p["controlnet/mid_block_res_sample"], p["controlnet_2/mid_block_res_sample"])


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("part", PARTS)
def test_onnxruntime_matches_torch(folder, part):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(DATA / folder / part / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = _feeds(folder, part, [i.name for i in sess.get_inputs()])
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(names, feeds)))
    for name, want in _expected(folder, part).items():
        np.testing.assert_allclose(got[name], want, atol=ATOL, rtol=RTOL, err_msg=f"{folder}/{part}:{name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("part", PARTS)
def test_part_runs_on_backend_like_onnxruntime_and_torch(folder, part, backend):
    register(backend)
    ort = pytest.importorskip("onnxruntime")
    path = DATA / folder / part / "model.onnx"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds(folder, part, [i.name for i in sess.get_inputs()])
    names = [o.name for o in sess.get_outputs()]
    ours_ort = dict(zip(names, sess.run(names, feeds)))
    # pinned to the feeds' shapes, as the pipelines compile every part (ggml needs static shapes)
    graph = sdrt.Graph.load(path).with_shapes({k: tuple(v.shape) for k, v in feeds.items()})
    with sdrt.load(graph, backend=backend) as s:
        got = s.run(feeds)
    expected = _expected(folder, part)
    assert set(expected) == set(names)
    for name in names:
        np.testing.assert_allclose(got[name], ours_ort[name], atol=ATOL, rtol=RTOL,
                                   err_msg=f"{backend} vs onnxruntime: {folder}/{part}:{name}")
        np.testing.assert_allclose(got[name], expected[name], atol=ATOL, rtol=RTOL,
                                   err_msg=f"{backend} vs torch: {folder}/{part}:{name}")


def test_a_net_written_anew_on_disk_runs_its_new_weights(tmp_path):
    """An ONNX ControlNet (its model.onnx and data) written again in place under its name: the next run makes a
    new part of the files on disk, not the sessions compiled from the old ones (which ran the old net silently,
    132 levels off the new net's image on tiny SD 1.5)."""
    import shutil

    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet

    register("reference")
    src = DATA / "tiny-sd15-controlnet"
    shutil.copytree(src / "controlnet", tmp_path / "net")
    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    with pipelines.load(src, backend="reference") as pipe:

        def run(net) -> np.ndarray:
            return np.stack(pipe("a cat", steps=2, seed=1, width=64, height=64,
                                 controlnets=[ControlNet(net, image, 1.0)])).astype(int)

        old = run(tmp_path / "net" / "model.onnx")
        for name in ("model.onnx", "model.onnx_data"):
            with open(tmp_path / "net" / name, "r+b") as f:
                f.write((src / "controlnet_2" / name).read_bytes())
                f.truncate()
        want = run(src / "controlnet_2" / "model.onnx")
        assert int(np.abs(want - old).max()) > 10
        assert int(np.abs(run(tmp_path / "net" / "model.onnx") - want).max()) == 0
