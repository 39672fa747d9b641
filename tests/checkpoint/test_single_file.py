"""Single-file LDM checkpoints onto ONNX exports: sdrt's outputs equal diffusers' with the same file.

The references come from diffusers' own single-file loader (``from_single_file`` and
``single_file_utils.convert_*``) reading the same ``ldm.safetensors`` (scripts/gen_checkpoint_data.py,
which also checks that loader reads the file back equal to the weights written). Tolerance 1e-4
absolute on outputs of magnitude ~5: float32 kernels in another order, nothing more.
"""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_data import DATA, feeds_for

import sdrt
from sdrt.checkpoint import Checkpoint, detect_family, param_map
from sdrt.checkpoint.onnxmap import Slot, fit
from sdrt.errors import WeightsError
from sdrt.graph import Graph
from sdrt.weights import Weights

SD1_PARTS = ["text_encoder", "unet", "vae_decoder", "vae_encoder"]
REF_KEY = {"text_encoder": "te", "unet": "unet", "vae_decoder": "vae_dec", "vae_encoder": "vae_enc"}
ATOL = 1e-4


def _run(graph: Graph, arrays: dict[str, np.ndarray], feeds: dict[str, np.ndarray], backend: str) -> np.ndarray:
    with sdrt.load(graph, backend=backend) as s:
        s.update_weights(Weights.from_graph(graph).replaced(arrays))
        return next(iter(s.run(feeds).values()))


@pytest.fixture(scope="module")
def sd1() -> Checkpoint:
    return Checkpoint.open(DATA / "sd1" / "ldm.safetensors")


@pytest.mark.parametrize("backend", ["reference", "openvino"])
@pytest.mark.parametrize("part", SD1_PARTS)
def test_sd1_checkpoint_matches_diffusers_single_file(sd1, inputs, part, backend):
    graph = Graph.load(DATA / "sd1" / part / "model.onnx")
    arrays = sd1.arrays({part: graph})[part]
    assert set(arrays) == set(graph.initializer_names)  # every weight of the export comes from the file
    out = _run(graph, arrays, feeds_for(part, inputs), backend)
    ref = np.load(DATA / "sd1" / "refs_ldm.npz")[REF_KEY[part]][:1]
    base = np.load(DATA / "sd1" / "refs_base.npz")[REF_KEY[part]][:1]
    assert np.abs(ref - base).max() > 1  # the checkpoint's weights differ from the export's
    np.testing.assert_allclose(out, ref, atol=ATOL)


@pytest.mark.needs_backend("ggml")
def test_sd1_unet_checkpoint_on_ggml(sd1, inputs):
    graph = Graph.load(DATA / "sd1" / "unet" / "model.onnx")
    out = _run(graph, sd1.arrays({"unet": graph})["unet"], feeds_for("unet", inputs), "ggml")
    np.testing.assert_allclose(out, np.load(DATA / "sd1" / "refs_ldm.npz")["unet"], atol=1e-3)


def test_both_text_encoder_export_generations_map_to_the_same_parameters(sd1, inputs):
    """transformers 4 (text_model.* names, /text_model/ scopes) and >= 5.6 (neither) exports."""
    g5 = Graph.load(DATA / "sd1" / "text_encoder" / "model.onnx")
    g4 = Graph.load(DATA / "sd1" / "text_encoder_t4" / "model.onnx")
    assert any(n.startswith("text_model.") for n in g4.initializer_names)
    assert not any(n.startswith("text_model.") for n in g5.initializer_names)
    m4, m5 = param_map(g4), param_map(g5)
    assert set(m4) == set(m5) and len(m4) == 36
    assert sum(s.init.startswith("onnx::MatMul") and s.layout == "T" for s in m4.values()) == 12
    arrays = sd1.arrays({"text_encoder": g4})["text_encoder"]
    out = _run(g4, arrays, feeds_for("text_encoder", inputs), "reference")
    np.testing.assert_allclose(out, np.load(DATA / "sd1" / "refs_ldm.npz")["te"][:1], atol=ATOL)


def test_anonymous_matmul_found_by_its_bias_when_node_names_are_gone(sd1):
    g = Graph.load(DATA / "sd1" / "text_encoder_t4" / "model.onnx")
    before = param_map(g)
    for node in g.model.graph.node:
        node.name = ""
    after = param_map(g)
    for canon, slot in before.items():
        if slot.init.startswith("onnx::MatMul"):
            assert after[canon] == slot, canon


@pytest.mark.needs_backend("openvino")
def test_sd2_openclip_in_proj_split_and_extra_layer(inputs):
    ck = Checkpoint.open(DATA / "sd2_te" / "ldm.safetensors")
    assert ck.family == "SD 2.x"
    graph = Graph.load(DATA / "sd2_te" / "text_encoder" / "model.onnx")
    arrays = ck.arrays({"text_encoder": graph})["text_encoder"]
    out = _run(graph, arrays, feeds_for("text_encoder", inputs), "openvino")
    np.testing.assert_allclose(out, np.load(DATA / "sd2_te" / "refs_ldm.npz")["te"][:1], atol=ATOL)


@pytest.mark.needs_backend("openvino")
@pytest.mark.parametrize("part,key", [("text_encoder", "te1"), ("text_encoder_2", "te2"), ("unet", "unet")])
def test_sdxl_checkpoint_parts(inputs, part, key):
    ck = Checkpoint.open(DATA / "sdxl" / "ldm.safetensors")
    assert ck.family == "SDXL base"
    graph = Graph.load(DATA / "sdxl" / part / "model.onnx")
    arrays = ck.arrays({part: graph})[part]
    if part == "unet":
        feeds = {"sample": inputs["sample"], "timestep": inputs["timestep"], "encoder_hidden_states": inputs["ehs_xl"],
                 "text_embeds": inputs["text_embeds"], "time_ids": inputs["time_ids"]}
    else:
        feeds = feeds_for("text_encoder", inputs)
    out = _run(graph, arrays, feeds, "openvino")
    ref = np.load(DATA / "sdxl" / "refs_ldm.npz")[key]
    np.testing.assert_allclose(out, ref[:1] if part != "unet" else ref, atol=ATOL)


def test_bf16_checkpoint_loads_onto_an_fp32_graph(sd1, tmp_path):
    import ml_dtypes

    from sdrt.weights import stfile

    src = Weights.open(DATA / "sd1" / "ldm.safetensors")
    path = tmp_path / "bf16.safetensors"
    stfile.write(path, ((k, np.asarray(src[k]).astype(ml_dtypes.bfloat16)) for k in src))
    graph = Graph.load(DATA / "sd1" / "unet" / "model.onnx")
    a16 = sd1.arrays({"unet": graph})["unet"]
    abf = Checkpoint.open(path).arrays({"unet": graph})["unet"]
    for name, arr in abf.items():
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr, a16[name].astype(ml_dtypes.bfloat16).astype(np.float32))


def test_fit_casts_to_an_fp16_slot_and_transposes():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = fit(w, Slot("onnx::MatMul_1", (3, 2), "float16", "T"))
    assert got.dtype == np.float16 and got.shape == (3, 2)
    np.testing.assert_array_equal(got, w.T.astype(np.float16))
    conv = fit(w.reshape(2, 3, 1, 1), Slot("onnx::MatMul_2", (3, 2), "float32", "T"))  # conv proj_in -> linear
    np.testing.assert_array_equal(conv, w.T)
    gn = fit(np.arange(4, dtype=np.float16), Slot("onnx::Mul_3", (4, 1, 1), "float32", "reshape"))
    assert gn.shape == (4, 1, 1) and gn.dtype == np.float32


@pytest.mark.needs_backend("openvino")
def test_diffusers_folder_of_safetensors(sd1, tmp_path, inputs):
    from sdrt.weights import stfile

    graph = Graph.load(DATA / "sd1" / "unet" / "model.onnx")
    comp = sd1.components["unet"]
    (tmp_path / "unet").mkdir()
    stfile.write(tmp_path / "unet" / "diffusion_pytorch_model.safetensors",
                 ((name, np.asarray(sd1.array(src))) for name, src in comp.items()))
    folder = Checkpoint.open(tmp_path)
    assert folder.family == "diffusers folder"
    out = _run(graph, folder.arrays({"unet": graph})["unet"], feeds_for("unet", inputs), "openvino")
    np.testing.assert_allclose(out, np.load(DATA / "sd1" / "refs_ldm.npz")["unet"], atol=ATOL)


@pytest.mark.parametrize("name,family", [("sd1/ldm.safetensors", "SD 1.x"), ("sd2_te/ldm.safetensors", "SD 2.x"),
                                         ("sdxl/ldm.safetensors", "SDXL base"),
                                         ("sd1/lora_kohya.safetensors", "kohya LoRA")])
def test_family_detection(name, family):
    w = Weights.open(DATA / name)
    assert detect_family({k: w.ref(k).shape for k in w}) == family


def test_sdxl_checkpoint_on_sd1_export_is_refused_naming_family_and_keys():
    ck = Checkpoint.open(DATA / "sdxl" / "ldm.safetensors")
    graph = Graph.load(DATA / "sd1" / "unet" / "model.onnx")
    with pytest.raises(WeightsError) as e:
        ck.arrays({"unet": graph, "text_encoder": Graph.load(DATA / "sd1" / "text_encoder" / "model.onnx")})
    msg = str(e.value)
    assert "looks like SDXL base" in msg and "model.diffusion_model." in msg and " vs " in msg


def test_lora_file_passed_as_checkpoint_is_refused():
    with pytest.raises(WeightsError, match="looks like kohya LoRA"):
        Checkpoint.open(DATA / "sd1" / "lora_kohya.safetensors")


def test_truncated_checkpoint_is_refused(tmp_path):
    data = (DATA / "sd1" / "ldm.safetensors").read_bytes()
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError):
        Checkpoint.open(bad)


def test_garbage_checkpoint_is_refused(tmp_path):
    bad = tmp_path / "junk.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(WeightsError):
        Checkpoint.open(bad)


def test_a_ckpt_reads_as_its_safetensors():
    """custom.ckpt: custom.safetensors saved by torch, Lightning-style (state_dict, global_step as a numpy scalar)."""
    ck = Checkpoint.open(DATA.parent / "torch" / "pipe-sd15" / "custom.ckpt")
    st = Checkpoint.open(DATA / "pipe-sd15" / "custom.safetensors")
    assert ck.family == st.family and ck.components.keys() == st.components.keys()
    for comp, srcs in st.components.items():
        assert ck.components[comp].keys() == srcs.keys()
        for canon, src in srcs.items():
            assert np.array_equal(ck.array(ck.components[comp][canon]), st.array(src)), (comp, canon)


def test_a_truncated_pickle_checkpoint_is_refused(tmp_path):
    p = tmp_path / "model.ckpt"
    p.write_bytes(b"\x80\x04\x95")
    with pytest.raises(WeightsError, match="not a readable PyTorch checkpoint"):
        Checkpoint.open(p)


def test_a_checkpoint_is_keyed_for_the_compile_cache_without_reading_it(sd1, monkeypatch):
    """Lazy checkpoint weights carry where their bytes are and how they are derived: keying reads none."""
    from sdrt.cache.identity import weights_identity
    from sdrt.checkpoint import single_file

    graph = Graph.load(DATA / "sd1" / "unet" / "model.onnx")
    refs = sd1.lazy({"unet": graph})["unet"]
    assert all(r.origin is not None and r.origin[0] == str(sd1.path) for r in refs.values())
    first = weights_identity(graph, Weights(refs))
    monkeypatch.setattr(single_file.Checkpoint, "_fitted", lambda self, pl: pytest.fail("a tensor was read"))
    assert weights_identity(graph, Weights(sd1.lazy({"unet": graph})["unet"])) == first
    assert weights_identity(graph, Weights.from_graph(graph)) != first  # the export's own weights


def test_a_ckpt_is_keyed_for_the_compile_cache_without_reading_it(monkeypatch):
    """A PyTorch checkpoint's tensors carry their place in the file too (torchfile's origins)."""
    from ckpt_data import PIPE_FOLDER

    from sdrt.cache.identity import weights_identity
    from sdrt.checkpoint import single_file

    ck = Checkpoint.open(DATA.parent / "torch" / "pipe-sd15" / "custom.ckpt")
    graph = Graph.load(PIPE_FOLDER / "unet" / "model.onnx")
    refs = ck.lazy({"unet": graph})["unet"]
    assert all(r.origin is not None and r.origin[0] == str(ck.path) for r in refs.values())
    again = ck.lazy({"unet": graph})["unet"]  # (binding checks the export's merged tensors: it reads those)
    monkeypatch.setattr(single_file.Checkpoint, "_fitted", lambda self, pl: pytest.fail("a tensor was read"))
    assert weights_identity(graph, Weights(refs)) == weights_identity(graph, Weights(again))
