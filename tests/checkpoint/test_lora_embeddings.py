"""LoRA and textual-inversion embeddings on the exported parts, against diffusers.

References: diffusers' ``load_lora_weights`` + ``fuse_lora(lora_scale=0.8)`` on the checkpoint's UNet and
text encoder (kohya keys, a 1x1-conv ``proj_in`` among them), and the text encoder with the embedding's
vectors appended as new token rows (what ``load_textual_inversion`` does). Same tolerance as the
checkpoint tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_data import DATA, feeds_for

import sdrt
from sdrt.checkpoint import Checkpoint, extend_table, load_embedding, reserve_rows, token_table
from sdrt.errors import WeightsError
from sdrt.graph import Graph
from sdrt.lora import Lora, merge
from sdrt.pipelines.weights import _targets
from sdrt.weights import Weights

ATOL = 1e-4


def _lora_arrays(part: str, path: str, scale: float) -> tuple[Graph, dict[str, np.ndarray], dict]:
    graph = Graph.load(DATA / "sd1" / part / "model.onnx")
    base = Checkpoint.open(DATA / "sd1" / "ldm.safetensors").arrays({part: graph})[part]
    lora = Lora.open(DATA / "sd1" / path)
    prefix = ("lora_unet_", "unet.") if part == "unet" else ("lora_te_", "text_encoder.")
    layers = {k: v for k, v in lora.layers.items() if k.startswith(prefix)}
    sub = Lora(layers, lora.format, lora.source)
    targets = _targets(graph, layers, part)
    assert len(targets) == len(layers)  # every layer found its initializer through the graph's map
    merged = merge(Weights.from_graph(graph).replaced(base), [(sub, scale)], graph=graph, targets=targets)
    return graph, base, merged


@pytest.mark.parametrize("backend", ["reference", "openvino"])
@pytest.mark.parametrize("part,key", [("unet", "unet"), ("text_encoder", "te")])
def test_kohya_lora_matches_diffusers_fuse_lora(inputs, part, key, backend):
    graph, base, merged = _lora_arrays(part, "lora_kohya.safetensors", 0.8)
    with sdrt.load(graph, backend=backend) as s:
        s.update_weights(Weights.from_graph(graph).replaced(base))
        before = s.run(feeds_for(part, inputs))
        s.update_weights(merged)
        out = next(iter(s.run(feeds_for(part, inputs)).values()))
        np.testing.assert_allclose(out, np.load(DATA / "sd1" / "refs_lora.npz")[key][:1], atol=ATOL)
        s.update_weights(merged.unmerge())  # removed: bit for bit what ran before
        after = s.run(feeds_for(part, inputs))
    for name in before:
        assert before[name].tobytes() == after[name].tobytes()


def test_peft_lora_equals_kohya_lora():
    for part in ("unet", "text_encoder"):
        _, _, kohya = _lora_arrays(part, "lora_kohya.safetensors", 0.8)
        _, _, peft = _lora_arrays(part, "lora_peft.safetensors", 0.8)
        assert set(kohya.originals) == set(peft.originals)
        for name in kohya.originals:
            np.testing.assert_allclose(kohya[name], peft[name], atol=1e-6)


def _embedded(graph: Graph, table_base: np.ndarray, emb, key: str) -> dict[str, np.ndarray]:
    init, (rows, _), _ = token_table(graph)
    table, ids = extend_table(table_base, [emb], key, capacity=rows, vocab=table_base.shape[0])
    return {init: table}, ids


@pytest.mark.parametrize("backend", ["reference", "openvino"])
def test_sd1_embedding_rows_match_diffusers(backend):
    emb = load_embedding(DATA / "sd1" / "emb.safetensors")
    assert emb.name == "emb" and emb.count == 2
    graph = Graph.load(DATA / "sd1" / "text_encoder" / "model.onnx")
    base = Checkpoint.open(DATA / "sd1" / "ldm.safetensors").arrays({"text_encoder": graph})["text_encoder"]
    init, (vocab, _), _ = token_table(graph)
    roomy = reserve_rows(graph, 16)
    assert token_table(roomy)[1][0] == vocab + 16
    over, ids = _embedded(roomy, base[init], emb, "clip_l")
    assert ids == {"emb": [vocab, vocab + 1]}
    ref = np.load(DATA / "sd1" / "refs_emb.npz")
    with sdrt.load(roomy, backend=backend) as s:
        s.update_weights(Weights.from_graph(roomy).replaced({**base, **over}))
        out = s.run({"input_ids": ref["input_ids"][1:2]})["last_hidden_state"]
    np.testing.assert_allclose(out, ref["te"][1:2], atol=ATOL)


@pytest.mark.needs_backend("openvino")
@pytest.mark.parametrize("part,key,ref_key", [("text_encoder", "clip_l", "te1"), ("text_encoder_2", "clip_g", "te2")])
def test_sdxl_embedding_clip_l_and_clip_g(part, key, ref_key):
    emb = load_embedding(DATA / "sdxl" / "emb.safetensors")
    assert set(emb.vectors) == {"clip_l", "clip_g"}
    graph = Graph.load(DATA / "sdxl" / part / "model.onnx")
    base = Checkpoint.open(DATA / "sdxl" / "ldm.safetensors").arrays({part: graph})[part]
    init = token_table(graph)[0]
    roomy = reserve_rows(graph, 4)
    over, _ = _embedded(roomy, base[init], emb, key)
    ref = np.load(DATA / "sdxl" / "refs_emb.npz")
    with sdrt.load(roomy, backend="openvino") as s:
        s.update_weights(Weights.from_graph(roomy).replaced({**base, **over}))
        out = next(iter(s.run({"input_ids": ref["input_ids"][1:2]}).values()))
    np.testing.assert_allclose(out, ref[ref_key][1:2], atol=ATOL)


@pytest.mark.parametrize("name", ["a1111_emb.pt", "rinongal_emb.pt", "learned_embeds.bin"])
def test_torch_embeddings_are_read(name):
    """A1111's .pt ({"string_to_param": {"*": v}}), rinongal's (a ParameterDict) and diffusers' learned_embeds.bin,
    as torch saved them (tests/data/torch, scripts/gen_torch_fixtures.py): the vectors torch.load gives."""
    torch_data = DATA.parent / "torch"
    with np.load(torch_data / name.replace(".pt", ".npz").replace(".bin", ".npz")) as z:
        want = z["string_to_param.*"] if "string_to_param.*" in z.files else z["<tiny>"]
    emb = load_embedding(torch_data / name)
    assert emb.name == name.split(".")[0] and emb.count == want.reshape(-1, 32).shape[0]
    assert np.array_equal(emb.vectors["clip_l"], want.reshape(-1, 32))


def test_an_embedding_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "MARKER"
    with pytest.raises(WeightsError, match="refusing to load easynegative.pt: its pickle calls posix.system") as e:
        load_embedding(_evil_pickle(tmp_path / "easynegative.pt", marker))
    assert "\n" not in str(e.value) and not marker.exists()


def _evil_pickle(path, marker):
    """A torch-style zip whose pickle, loaded by pickle.load, would run ``os.system("touch MARKER")``."""
    import pickle
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"cposix\nsystem\n(" + pickle.dumps(f"touch {marker}", protocol=0)[:-1] + b"tR.")
    return path


def test_embedding_of_another_width_is_refused():
    emb = load_embedding(DATA / "sdxl" / "emb.safetensors")
    table = np.zeros((10, 48), np.float32)
    with pytest.raises(WeightsError, match="wide"):
        extend_table(table, [emb], "clip_l")  # clip_l is 32 wide


def test_not_an_embedding_is_refused():
    with pytest.raises(WeightsError, match="not a textual-inversion embedding"):
        load_embedding(DATA / "sd1" / "lora_kohya.safetensors")


def test_more_embedding_tokens_than_reserved_rows_is_refused():
    emb = load_embedding(DATA / "sd1" / "emb.safetensors")
    with pytest.raises(WeightsError, match="reserved rows"):
        extend_table(np.zeros((10, 32), np.float32), [emb], "clip_l", capacity=11)


@pytest.mark.parametrize("folder", ["sd1", "sdxl"])
def test_ldm_module_names_round_trip_through_the_checked_converter(folder):
    """unet_to_ldm (for kohya SDXL LoRA names) is the inverse of convert_unet, which test_single_file checks
    against diffusers' own single-file loader."""
    from sdrt.checkpoint import param_map
    from sdrt.checkpoint.ldm import UNET_PREFIX, convert_unet, unet_ldm_layout, unet_to_ldm

    pmap = param_map(Graph.load(DATA / folder / "unet" / "model.onnx"))
    lpb, attn_up = unet_ldm_layout(pmap)
    names = {UNET_PREFIX + unet_to_ldm(c, lpb, attn_up): c for c in pmap if c.endswith((".weight", ".bias"))}
    back, unknown = convert_unet(names)
    assert not unknown
    assert {k: v.key for k, v in back.items()} == {c: k for k, c in names.items()}


def test_sdxl_kohya_lora_with_ldm_unet_names():
    from sdrt.checkpoint import param_map
    from sdrt.checkpoint.ldm import unet_ldm_layout, unet_to_ldm

    graph = Graph.load(DATA / "sdxl" / "unet" / "model.onnx")
    pmap = param_map(graph)
    lpb, attn_up = unet_ldm_layout(pmap)
    rng = np.random.default_rng(0)
    diffusers_keys, ldm_keys = {}, {}
    for mod in ("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k", "mid_block.attentions.0.proj_in",
                "up_blocks.0.resnets.1.conv1"):
        w = pmap[mod + ".weight"]
        shape_in = (w.shape[0] if w.layout == "T" else w.shape[1])
        down = rng.standard_normal((2, shape_in, *([3, 3] if mod.endswith("conv1") else []))).astype(np.float32)
        out_f = w.shape[1] if w.layout == "T" else w.shape[0]
        up = rng.standard_normal((out_f, 2, *([1, 1] if mod.endswith("conv1") else []))).astype(np.float32)
        for keys, name in ((diffusers_keys, mod), (ldm_keys, unet_to_ldm(mod, lpb, attn_up))):
            k = "lora_unet_" + name.replace(".", "_")
            keys.update({f"{k}.lora_down.weight": down, f"{k}.lora_up.weight": up})
    assert "lora_unet_input_blocks_3_1_transformer_blocks_0_attn2_to_k.lora_down.weight" in ldm_keys  # 1 layer per block
    a, b = Lora.from_arrays(diffusers_keys), Lora.from_arrays(ldm_keys)
    ma = merge(graph, [(a, 1.0)], graph=graph, targets=_targets(graph, a.layers, "unet"))
    mb = merge(graph, [(b, 1.0)], graph=graph, targets=_targets(graph, b.layers, "unet"))
    assert set(ma.originals) == set(mb.originals) and len(ma.originals) == 3
    for name in ma.originals:
        np.testing.assert_array_equal(ma[name], mb[name])


def test_a1111_pt_layout_in_a_safetensors_file(tmp_path):
    from sdrt.weights import stfile

    v = np.arange(2 * 32, dtype=np.float32).reshape(2, 32) / 64
    f = tmp_path / "style.safetensors"
    stfile.write(f, {"string_to_param.*": v, "string_to_token.*": np.array([265], np.int64)})
    e = load_embedding(f)
    assert e.name == "style" and e.count == 2
    np.testing.assert_array_equal(e.for_encoder("clip_l"), v)


def test_a1111_layout_with_another_placeholder_than_star(tmp_path):
    """rinongal's textual inversion saves its term under the placeholder it was trained with (``S*``, ...), its token
    id as a tensor beside it; A1111 takes the file's one term whatever its name. Before, sdrt read only ``*`` and
    refused the file ("not a textual-inversion embedding")."""
    from sdrt.weights import stfile

    vec = np.random.default_rng(3).normal(size=(2, 32)).astype(np.float32)
    f = tmp_path / "mystyle.safetensors"
    stfile.write(f, {"string_to_token.S*": np.array(265, np.int64), "string_to_param.S*": vec})
    emb = load_embedding(f)
    assert emb.name == "mystyle" and np.array_equal(emb.vectors["clip_l"], vec)
    stfile.write(f, {"string_to_param.S*": vec, "string_to_param.T*": vec})
    with pytest.raises(WeightsError, match=r"holds 2 terms .*A1111's format holds one") as e:
        load_embedding(f)
    assert "\n" not in str(e.value)
