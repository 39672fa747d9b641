"""FLUX.1 Fill / Canny / Depth files as people download them: detected, bound onto graphs with the right width.

Release-shaped files are sparse (a safetensors header with FLUX.1-Fill-dev's and FLUX.1-Canny-dev's names and
shapes, zeros the file system does not store): BFL's single files (``img_in.weight`` [3072, 384] / [3072, 128],
as ``flux1-fill-dev.safetensors`` and ``flux1-canny-dev.safetensors`` ship), and diffusers folders (in
test_diffusers_folder.py's every-family test). The tiny Fill transformer (tests/data/pipelines/tiny-flux-fill)
written in BFL's keys, and as a city96-style GGUF file, gives diffusers' image.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h
import test_flow_single_files as flow
from flow_file_helpers import bfl_transformer, diffusers_params
from test_open_single_file import _graph_shapes, flux_shapes, sparse_safetensors

from sdrt import pipelines
from sdrt.checkpoint import identify, open_single_file, shipped_graph
from sdrt.checkpoint.diffusers_folder import denoiser_family
from sdrt.errors import ModelError
from sdrt.graph import Graph

PIPES = Path(__file__).resolve().parent.parent / "data" / "pipelines"
sys.path.insert(0, str(PIPES.parent.parent / "flow"))
from flow_helpers import tool_folder  # noqa: E402


def _tool_shapes(width: int, prefix: str = "", blocks: int = 1, single: int | None = None, guidance: bool = True):
    s = flux_shapes(guidance, prefix, blocks, single)
    s[prefix + "img_in.weight"] = (3072, width)
    return s


@pytest.mark.parametrize(("width", "prefix", "family"), [
    (384, "", "flux-fill"), (384, "model.diffusion_model.", "flux-fill"), (128, "", "flux-control"),
    (64, "", "flux-dev")])
def test_identify_flux_tools(width, prefix, family):
    ident = identify(_tool_shapes(width, prefix))
    assert ident.family == family and ident.kind == "checkpoint", ident
    assert ident.label.endswith("(transformer only)")


def test_other_widths_are_refused_by_name():
    for shapes in (_tool_shapes(100), _tool_shapes(384, guidance=False)):  # no schnell-based Fill exists
        ident = identify(shapes)
        assert ident.family is None and "input channels" in ident.label, ident


def test_derived_graphs_differ_from_dev_only_in_the_input_width(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    dev = Graph.load(shipped_graph("flux_dev_transformer"))
    for name, width in (("flux_fill_transformer", 384), ("flux_control_transformer", 128)):
        g = Graph.load(shipped_graph(name))
        assert g.is_stripped
        assert g.inputs[0].name == "hidden_states" and tuple(g.inputs[0].shape)[2] == width
        shapes, dev_shapes = _graph_shapes(name), _graph_shapes("flux_dev_transformer")
        assert shapes["x_embedder.weight"] == (3072, width)
        assert {k: v for k, v in shapes.items() if k != "x_embedder.weight"} == \
            {k: v for k, v in dev_shapes.items() if k != "x_embedder.weight"}
        assert len(g.model.graph.node) == len(dev.model.graph.node)


@pytest.mark.parametrize(("width", "family", "graph"), [(384, "flux-fill", "flux_fill_transformer"),
                                                      (128, "flux-control", "flux_control_transformer")])
def test_full_size_tool_files_bind_onto_the_derived_graphs(width, family, graph, tmp_path, monkeypatch):
    """Every tensor of a full-size FLUX.1 Fill / Canny file (19 + 38 blocks, bf16) and the clip_l, t5xxl and ae
    files finds its place in the graphs, with the right shape (headers only)."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    f = sparse_safetensors(tmp_path / f"flux1-{family}.safetensors", _tool_shapes(width, "", 19, 38), "BF16")
    clip = sparse_safetensors(tmp_path / "clip_l.safetensors", _graph_shapes("clip_l"))
    t5 = sparse_safetensors(tmp_path / "t5xxl_fp16.safetensors", _graph_shapes("t5xxl"))
    ae = sparse_safetensors(tmp_path / "ae.safetensors",
                            {**_graph_shapes("vae16_decoder"), **_graph_shapes("vae16_encoder")}, "BF16")
    m = open_single_file(f, [clip, t5, ae])
    assert m.family == family and m.prediction == "flow"
    assert m.release["scheduler"]["use_dynamic_shifting"] is True  # FLUX.1-dev's scheduler
    path, weights = m.parts["transformer"]
    assert path == shipped_graph(graph)
    assert tuple(weights.ref("x_embedder.weight").shape) == (3072, width)
    for part, (p, w) in m.parts.items():
        report = w.check(Graph.load(p))
        assert report.ok, (part, str(report))
    with pipelines.load(f, backend="reference", text_encoders=[clip, t5], vae=ae) as pipe:  # nothing compiles
        assert pipe.flux_tool == ("fill" if width == 384 else "control")
        assert pipe.folder.configs["transformer"]["guidance_embeds"] is True


def test_a_tool_file_without_text_encoders_names_what_it_needs(tmp_path):
    f = sparse_safetensors(tmp_path / "flux1-fill-dev.safetensors", _tool_shapes(384), "BF16")
    with pytest.raises(ModelError, match=r"Flux\.1 Fill dev \(transformer only\); Flux\.1 Fill dev also needs"):
        open_single_file(f)


def test_diffusers_transformer_family_from_x_embedder():
    base = {"single_transformer_blocks.0.proj_out.weight": (3072, 15360),
            "time_text_embed.guidance_embedder.linear_1.weight": (3072, 256)}
    assert denoiser_family({**base, "x_embedder.weight": (3072, 384)})[0] == "flux-fill"
    assert denoiser_family({**base, "x_embedder.weight": (3072, 128)})[0] == "flux-control"
    assert denoiser_family({**base, "x_embedder.weight": (3072, 64)})[0] == "flux-dev"
    fam, looks = denoiser_family({**base, "x_embedder.weight": (3072, 100)})
    assert fam is None and "100 input channels" in looks


def _fill_files(tmp: Path) -> dict:
    """tiny-flux-dev's release-style files (test_flow_single_files) with the Fill transformer in BFL's keys."""
    f = flow._files("flux-dev", tmp)
    folder = tool_folder("fill", tmp / "folders")
    f["graphs"].update(h.stripped(folder, ["transformer"], tmp / "fill-graphs"))
    f["params"] = bfl_transformer(diffusers_params(folder / "transformer" / "model.onnx"))
    f["file"] = h.write(tmp / "flux1-fill-dev.safetensors", f["params"])
    f["family"] = "flux-fill"
    return f


def _fill_case() -> tuple[dict, dict]:
    case = json.loads((PIPES / "tiny-flux-fill" / "refs.json").read_text())[0]
    refs = np.load(PIPES / "tiny-flux-fill" / "refs.npz")
    name = case["name"]
    kw = dict(steps=case["steps"], seed=case["seed"], sampler="Euler", guidance=case["guidance"],
              max_sequence_length=case["max_sequence_length"], init_image=refs[f"{name}/init_image"],
              mask=refs[f"{name}/mask"])
    return case, kw


def test_tiny_fill_single_file_gives_diffusers_image(tmp_path):
    f = _fill_files(tmp_path)
    case, kw = _fill_case()
    with flow._load(f) as pipe:
        assert pipe.folder.single_file.family == "flux-fill" and pipe.flux_tool == "fill"
        got = np.stack(pipe(case["prompt"], **kw)).astype(int)
    want = np.load(PIPES / "tiny-flux-fill" / "refs.npz")[f"{case['name']}/image"].astype(int)
    assert int(np.abs(got - want).max()) <= 2


@pytest.mark.needs_backend("ggml")
def test_tiny_fill_gguf_on_ggml(tmp_path):
    """The Fill transformer as city96's GGUF files hold it (BFL keys, big matrices Q8_0): diffusers' image within
    the GGUF Flux test's bound (35 dB PSNR)."""
    pytest.importorskip("gguf", reason="the optional gguf package is not installed (pip install gguf)")
    from test_gguf_flux import _psnr, _write

    f = _fill_files(tmp_path)
    path = tmp_path / "flux1-fill-dev-Q8_0.gguf"
    kinds = _write(path, f["params"], "Q8_0")
    assert kinds["img_in.weight"] == "Q8_0"
    f["file"] = path
    case, kw = _fill_case()
    with pipelines.load(path, backend="ggml", text_encoders=f["text_encoders"], vae=f["vae"], graph_paths=f["graphs"],
            tokenizers=f["tokenizers"], family="flux-fill") as pipe:
        assert pipe.flux_tool == "fill"
        got = np.stack(pipe(case["prompt"], **kw))
    want = np.load(PIPES / "tiny-flux-fill" / "refs.npz")[f"{case['name']}/image"]
    assert _psnr(got, want) >= 35, _psnr(got, want)
