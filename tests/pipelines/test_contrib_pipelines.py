"""Stable Diffusion folders optimized by onnxruntime's transformer optimizer (com.microsoft contrib ops) give the
images of the folders they were optimized from (scripts/make_contrib_fixtures.py made them from tiny-sd15 and
tiny-sdxl: ``-ort`` with optimize_pipeline's settings, ``-olive`` with Olive's DirectML ones, ``-fp16`` converted to
float16 as those tools do).

float32 folders: the diffusers references of the source folder, to the same bound as the unoptimized folder
(``assert_matches_diffusers``: 1 level, 0.5 % of values). float16 folders compute in float16 where the unoptimized
ones compute in float32: measured max 1 (SD 1.5) and 2 (SDXL) levels with 7 % and 18 % of values off by one or two;
a wrong formula moves tens of levels over most of the image, so the bound is 3 levels and 25 %.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, call_kwargs, cases, refs, register

from sdrt import pipelines

#: optimized folder -> (the folder it was made from, the reference cases it runs)
FOLDERS = {"tiny-sd15-ort": ("tiny-sd15", ["txt2img/Euler", "img2img/Euler a"]),
           "tiny-sd15-ort-fp16": ("tiny-sd15", ["txt2img/Euler a"]),
           "tiny-sdxl-olive-fp16": ("tiny-sdxl", ["txt2img/Euler", "img2img/Euler a"])}


def _params():
    for folder, (_, names) in FOLDERS.items():
        for name in names:
            for backend in ("openvino", "ggml"):
                yield pytest.param(folder, name, backend, id=f"{folder}:{name}:{backend}")


@pytest.mark.parametrize(("folder", "name", "backend"), list(_params()))
def test_optimized_folder_gives_the_source_folders_image(folder: str, name: str, backend: str, caplog) -> None:
    register(backend)
    source = FOLDERS[folder][0]
    case = next(c for c in cases(source) if c["name"] == name)
    ref = refs(source)
    caplog.set_level(logging.INFO, logger="sdrt.graph.contrib")
    with pipelines.load(DATA / folder, backend=backend) as pipe:
        images = pipe(case["prompt"], case["negative_prompt"], **call_kwargs(case, ref))
    assert any(f"rewrote onnxruntime contrib ops into standard ONNX ops for {backend}" in r.getMessage()
               for r in caplog.records)
    if "fp16" not in folder:
        assert_matches_diffusers(images, ref[name])
        return
    diff = np.abs(np.stack(images).astype(np.int16) - ref[name].astype(np.int16))
    assert diff.max() <= 3 and (diff > 0).mean() <= 0.25, (diff.max(), (diff > 0).mean())


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_sdrt_run_on_an_optimized_part_matches_onnxruntime(tmp_path, backend: str, capsys) -> None:
    """``sdrt run`` on the optimized text encoder (SkipLayerNormalization, QuickGelu) gives onnxruntime's output."""
    ort = pytest.importorskip("onnxruntime")
    from sdrt.cli import main

    register(backend)
    model = DATA / "tiny-sd15-ort" / "text_encoder" / "model.onnx"
    ids = np.random.default_rng(1).integers(0, 1000, (1, 77)).astype(np.int32)
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "out.npz"
    assert main(["run", str(model), "-i", f"input_ids={tmp_path / 'ids.npy'}", "-o", str(out),
                 "--backend", backend]) == 0
    got = np.load(out)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for name, want in zip(names, sess.run(None, {"input_ids": ids})):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_an_unknown_contrib_op_is_refused_in_one_line(tmp_path, backend: str) -> None:
    """A contrib op the rewrite does not know (RotaryEmbedding) is named with its node in the backend's usual
    refusal; the Gelu before it, which the rewrite knows, is not."""
    from onnx import TensorProto, helper

    import sdrt
    from sdrt.errors import UnsupportedGraph

    register(backend)
    nodes = [helper.make_node("Gelu", ["x"], ["g"], name="gelu0", domain="com.microsoft"),
             helper.make_node("RotaryEmbedding", ["g", "pos", "cos", "sin"], ["y"], name="rope0",
                              domain="com.microsoft")]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 2, 8]),
                                       helper.make_tensor_value_info("pos", TensorProto.INT64, [1, 2]),
                                       helper.make_tensor_value_info("cos", f, [4, 4]),
                                       helper.make_tensor_value_info("sin", f, [4, 4])],
                          [helper.make_tensor_value_info("y", f, [1, 2, 8])])
    path = tmp_path / "rope.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                         helper.make_opsetid("com.microsoft", 1)]).SerializeToString())
    with pytest.raises(UnsupportedGraph) as err:
        sdrt.load(path, backend=backend)
    text = str(err.value)
    assert "\n" not in text and "com.microsoft.RotaryEmbedding (nodes: rope0)" in text and "Gelu" not in text
