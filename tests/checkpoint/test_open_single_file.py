"""Single files onto the shipped weight-free graphs (issue 33): what a file is, bad files, the model hash.

Files here are written sparse: a safetensors header with the real names and shapes of a release,
and a data section of zeros that the file system does not store. Identification, the part checks
and every error below read headers only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from sdrt.checkpoint import FAMILY_GRAPHS, hashing, identify, model_hash, open_single_file, shipped_graph, shipped_names
from sdrt.errors import ModelError, SdrtError, WeightsError
from sdrt.graph import Graph

DATA = Path(__file__).resolve().parent.parent / "data" / "ckpt"
SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1}


def sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "F16") -> Path:
    """A valid safetensors file whose data are zeros the file system does not store."""
    header, off = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + off)
    return path


def flux_shapes(guidance: bool = True, prefix: str = "", blocks: int = 1, single: int | None = None
                ) -> dict[str, tuple[int, ...]]:
    """Flux.1's keys as Black Forest Labs publish them (a few blocks)."""
    d, m = 3072, 12288
    s = {"img_in.weight": (d, 64), "img_in.bias": (d,), "txt_in.weight": (d, 4096), "txt_in.bias": (d,),
         "time_in.in_layer.weight": (d, 256), "time_in.in_layer.bias": (d,), "time_in.out_layer.weight": (d, d),
         "time_in.out_layer.bias": (d,), "vector_in.in_layer.weight": (d, 768), "vector_in.in_layer.bias": (d,),
         "vector_in.out_layer.weight": (d, d), "vector_in.out_layer.bias": (d,),
         "final_layer.linear.weight": (64, d), "final_layer.linear.bias": (64,),
         "final_layer.adaLN_modulation.1.weight": (2 * d, d), "final_layer.adaLN_modulation.1.bias": (2 * d,)}
    if guidance:
        s.update({"guidance_in.in_layer.weight": (d, 256), "guidance_in.in_layer.bias": (d,),
                  "guidance_in.out_layer.weight": (d, d), "guidance_in.out_layer.bias": (d,)})
    for i in range(blocks):
        for side in ("img", "txt"):
            p = f"double_blocks.{i}.{side}_"
            s.update({p + "mod.lin.weight": (6 * d, d), p + "mod.lin.bias": (6 * d,),
                      p + "attn.qkv.weight": (3 * d, d), p + "attn.qkv.bias": (3 * d,),
                      p + "attn.norm.query_norm.scale": (128,), p + "attn.norm.key_norm.scale": (128,),
                      p + "attn.proj.weight": (d, d), p + "attn.proj.bias": (d,),
                      p + "mlp.0.weight": (m, d), p + "mlp.0.bias": (m,), p + "mlp.2.weight": (d, m),
                      p + "mlp.2.bias": (d,)})
    for i in range(blocks if single is None else single):
        p = f"single_blocks.{i}."
        s.update({p + "linear1.weight": (3 * d + m, d), p + "linear1.bias": (3 * d + m,),
                  p + "linear2.weight": (d, d + m), p + "linear2.bias": (d,), p + "norm.query_norm.scale": (128,),
                  p + "norm.key_norm.scale": (128,), p + "modulation.lin.weight": (3 * d, d),
                  p + "modulation.lin.bias": (3 * d,)})
    return {prefix + k: v for k, v in s.items()}


def clip_shapes(width: int, layers: int = 1, projection: bool = False) -> dict[str, tuple[int, ...]]:
    s = {"text_model.embeddings.token_embedding.weight": (49408, width),
         "text_model.embeddings.position_embedding.weight": (77, width),
         "text_model.final_layer_norm.weight": (width,), "text_model.final_layer_norm.bias": (width,)}
    for i in range(layers):
        p = f"text_model.encoder.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[p + f"self_attn.{n}.weight"] = (width, width)
            s[p + f"self_attn.{n}.bias"] = (width,)
    if projection:
        s["text_projection.weight"] = (width, width)
    return s


def t5_shapes() -> dict[str, tuple[int, ...]]:
    return {"shared.weight": (32128, 4096), "encoder.block.0.layer.0.SelfAttention.q.weight": (4096, 4096),
            "encoder.final_layer_norm.weight": (4096,)}


def vae_shapes(channels: int) -> dict[str, tuple[int, ...]]:
    return {"decoder.conv_in.weight": (512, channels, 3, 3), "decoder.conv_in.bias": (512,),
            "encoder.conv_out.weight": (2 * channels, 512, 3, 3)}


# -- the shipped set ------------------------------------------------------------------------------
#: graphs whose export did not finish in the session that built the set (scripts/make_shipped_graphs.py export NAME)
NOT_YET: set[str] = set()


def test_every_family_part_has_a_shipped_graph():
    names = set(shipped_names())
    wanted = {g for graphs in FAMILY_GRAPHS.values() for g in graphs.values()}
    assert wanted - NOT_YET <= names, sorted(wanted - NOT_YET - names)
    assert not NOT_YET & names, "shipped now: remove from NOT_YET"


@pytest.mark.parametrize("name", ["clip_l", "t5xxl", "vae16_decoder", "sd1_unet", "flux_dev_transformer"])
def test_shipped_graph_is_weight_free_with_dynamic_axes(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    if name + ".onnx.xz" not in {n + ".onnx.xz" for n in shipped_names()}:
        pytest.skip(f"{name} not exported yet")
    path = shipped_graph(name)
    assert path.is_file() and shipped_graph(name) == path  # unpacked once
    g = Graph.load(path)
    assert g.is_stripped
    weights = [t for t in g.model.graph.initializer if t.external_data]
    assert weights and all(not t.raw_data for t in weights)
    assert path.stat().st_size < 40 << 20
    for info in g.inputs:  # batch (and size or sequence) are symbolic
        assert not isinstance(info.shape[0], int) or info.shape[0] <= 0, (info.name, info.shape)


# -- what a file is -----------------------------------------------------------------------------
@pytest.mark.parametrize("shapes,family,kind", [
    (flux_shapes(True), "flux-dev", "checkpoint"),
    (flux_shapes(False, "model.diffusion_model."), "flux-schnell", "checkpoint"),
    ({**flux_shapes(False), "distilled_guidance_layer.in_proj.weight": (5120, 64)}, "chroma", "checkpoint"),
    (clip_shapes(768), None, "clip_l"),
    (clip_shapes(1280, projection=True), None, "clip_g"),
    (t5_shapes(), None, "t5xxl"),
    (vae_shapes(16), None, "vae16"),
    (vae_shapes(4), None, "vae4"),
    ({"first_stage_model." + k: v for k, v in vae_shapes(4).items()}, None, "vae4"),
])
def test_identify(shapes, family, kind):
    ident = identify(shapes)
    assert (ident.family, ident.kind) == (family, kind), ident


def test_identify_ldm_test_checkpoints():
    from sdrt.weights import Weights

    for name, fam in (("sd1/ldm.safetensors", "sd1"), ("sdxl/ldm.safetensors", "sdxl")):
        w = Weights.open(DATA / name)
        ident = identify({k: w.ref(k).shape for k in w})
        assert ident.family == fam and "unet" in ident.components


# -- bad files: one SdrtError before anything compiles, naming the file and what to pass -----------
def test_flux_transformer_only_without_text_encoders_is_refused(tmp_path):
    f = sparse_safetensors(tmp_path / "flux1-dev.safetensors", flux_shapes(True), "F8_E4M3")
    with pytest.raises(ModelError) as e:
        open_single_file(f)
    msg = str(e.value)
    assert "flux1-dev.safetensors" in msg and "Flux.1 dev (transformer only)" in msg
    assert "CLIP-L" in msg and "T5-XXL" in msg and "with text_encoders (" in msg and "with vae (" in msg
    assert "--" not in msg  # the API's words; the command's its own:
    cli = e.value.render({"text_encoders": "--text-encoder", "vae": "--vae"})
    assert "with --text-encoder (" in cli and "with --vae (" in cli and "text_encoders" not in cli


def test_vae_of_the_wrong_channel_count_is_refused(tmp_path):
    f = sparse_safetensors(tmp_path / "flux1-schnell.safetensors", flux_shapes(False))
    vae = sparse_safetensors(tmp_path / "sdxl_vae.safetensors", vae_shapes(4))
    with pytest.raises(ModelError) as e:
        open_single_file(f, [vae])
    msg = str(e.value)
    assert "sdxl_vae.safetensors" in msg and "4-channel VAE" in msg and "16-channel VAE" in msg


def test_text_encoder_of_another_kind_is_refused(tmp_path):
    f = sparse_safetensors(tmp_path / "flux1-dev.safetensors", flux_shapes(True))
    g = sparse_safetensors(tmp_path / "clip_g.safetensors", clip_shapes(1280, projection=True))
    with pytest.raises(ModelError, match="clip_g.safetensors is a CLIP-G .* which Flux.1 dev does not use"):
        open_single_file(f, [g])


def test_one_extra_file_given_as_a_string_is_that_file_not_its_letters(tmp_path):
    """``open_single_file(f, "sdxl_vae.safetensors")`` opened the files '/', 't', 'm', ...: "cannot open the file
    c"; one path is one file, as pipelines.load's text_encoders= takes it."""
    f = sparse_safetensors(tmp_path / "flux1-schnell.safetensors", flux_shapes(False))
    vae = sparse_safetensors(tmp_path / "sdxl_vae.safetensors", vae_shapes(4))
    for one in (str(vae), vae):
        with pytest.raises(ModelError, match="sdxl_vae.safetensors is a 4-channel VAE"):
            open_single_file(f, one)


def test_unknown_architecture_is_refused(tmp_path):
    f = sparse_safetensors(tmp_path / "mystery.safetensors", {"foo.bar.weight": (3, 3)})
    # it said "it looks like unknown": now what was checked, and the keys that are there
    with pytest.raises(ModelError, match=r"mystery.safetensors is not a model sdrt can run: it looks like no family "
                                         r"sdrt knows: none of the key layouts of an SD 1.x/2.x/XL/3 or Flux .*"
                                         r"its keys: foo.bar.weight\."):
        open_single_file(f)
    with pytest.raises(ModelError, match="looks like kohya LoRA"):
        open_single_file(DATA / "sd1" / "lora_kohya.safetensors")


def test_part_file_given_as_the_model_is_refused(tmp_path):
    f = sparse_safetensors(tmp_path / "t5xxl_fp16.safetensors", t5_shapes())
    with pytest.raises(ModelError, match="is a T5-XXL text encoder, not a model.*this file with text_encoders") as e:
        open_single_file(f)
    assert "this file with --text-encoder." in e.value.render({"text_encoders": "--text-encoder"})


def test_truncated_file_is_refused_naming_it(tmp_path):
    f = sparse_safetensors(tmp_path / "cut.safetensors", flux_shapes(True))
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    with pytest.raises(WeightsError) as e:
        open_single_file(f)
    assert "cut.safetensors" in str(e.value) and "truncated" in str(e.value)


def test_tiny_checkpoint_of_a_known_family_does_not_fit_the_release_graphs():
    """sdrt's tiny SD 1.x test checkpoint has SD 1.x's names but not its widths: refused before compiling."""
    with pytest.raises(WeightsError) as e:
        open_single_file(DATA / "sd1" / "ldm.safetensors", parts=["unet"])
    assert "ldm.safetensors" in str(e.value) and " vs " in str(e.value)


def test_fp8_where_the_backend_has_no_fp8(tmp_path):
    from sdrt.checkpoint.files import OpenedModel

    m = OpenedModel("flux-dev", "Flux.1 dev", "flow", {}, {}, {"transformer": tmp_path / "f8.safetensors"},
                    tmp_path / "f8.safetensors", {"transformer": {"float8_e4m3fn"}})
    with pytest.raises(SdrtError, match="f8.safetensors.*float8_e4m3fn.*ggml backend has no fp8"):
        m.require_dtypes({"float32", "float16"}, "ggml")
    m.require_dtypes({"float32", "float8_e4m3fn"}, "trt")


# -- A1111's model hash -----------------------------------------------------------------------------
def test_model_hash_is_a1111s_and_cached_by_path_size_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"abc" * 1000)
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    assert model_hash(f) == want
    calls = []
    monkeypatch.setattr(hashing, "file_digest", lambda p: calls.append(p) or "0" * 64)
    assert model_hash(f) == want and not calls  # not re-read
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert model_hash(f) == "0" * 64 and len(calls) == 1  # changed: hashed again


def _graph_shapes(name: str, prefix: str = "") -> dict[str, tuple[int, ...]]:
    g = Graph.load(shipped_graph(name))
    return {prefix + t.name: tuple(t.dims) for t in g.model.graph.initializer if t.external_data}


def test_full_size_flux_files_bind_onto_the_shipped_graphs(tmp_path, monkeypatch):
    """Every tensor of full-size Flux.1 dev (BFL keys, fp8), clip_l, t5xxl and ae files finds its place in the
    shipped graphs, with the right shape, and nothing is left over (headers only: the files are sparse)."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    if "flux_dev_transformer" not in shipped_names():
        pytest.skip("flux_dev_transformer not exported yet")
    f = sparse_safetensors(tmp_path / "flux1-dev-fp8.safetensors",
                           flux_shapes(True, "model.diffusion_model.", 19, 38), "F8_E4M3")
    clip = sparse_safetensors(tmp_path / "clip_l.safetensors", _graph_shapes("clip_l"))
    t5 = sparse_safetensors(tmp_path / "t5xxl_fp16.safetensors", _graph_shapes("t5xxl"))
    vae = {**_graph_shapes("vae16_decoder"), **_graph_shapes("vae16_encoder")}
    ae = sparse_safetensors(tmp_path / "ae.safetensors", vae, "BF16")
    m = open_single_file(f, [clip, t5, ae])
    assert m.family == "flux-dev" and m.prediction == "flow"
    assert set(m.parts) == {"transformer", "text_encoder", "text_encoder_2", "vae_decoder", "vae_encoder"}
    graph, weights = m.parts["transformer"]
    from_file = [n for n in weights if weights.ref(n).source == str(f)]
    assert sorted(from_file) == sorted(_graph_shapes("flux_dev_transformer"))  # the rest: the graph's own constants
    assert set(weights) == set(Graph.load(graph).initializer_names)
    for part, (path, w) in m.parts.items():  # strict binding holds: no graph constant counts as missing
        report = w.check(Graph.load(path))
        assert report.ok, (part, str(report))
    assert m.dtypes["transformer"] == {"float8_e4m3fn"} and m.files["text_encoder_2"] == t5
    assert m.release["scheduler"]["use_dynamic_shifting"] is True
    ref = weights.ref("single_transformer_blocks.37.proj_mlp.weight")
    assert tuple(ref.shape) == (12288, 3072)


def test_sd2_prediction_from_yaml_and_from_weights(tmp_path):
    from sdrt.checkpoint.files import SD2_V_KEY, sd2_prediction
    from sdrt.weights import Weights

    f = tmp_path / "model.safetensors"
    wide = Weights.from_arrays({SD2_V_KEY: np.linspace(-0.5, 0.5, 1280, dtype=np.float16)})
    narrow = Weights.from_arrays({SD2_V_KEY: np.linspace(-0.05, 0.05, 1280, dtype=np.float16)})
    assert sd2_prediction(f, wide) == "v_prediction" and sd2_prediction(f, narrow) == "epsilon"
    (tmp_path / "model.yaml").write_text('model:\n  params:\n    parameterization: "v"\n')
    assert sd2_prediction(f, narrow) == "v_prediction"
    (tmp_path / "model.yaml").write_text("model:\n  params:\n    linear_start: 0.00085\n")
    assert sd2_prediction(f, wide) == "epsilon"



def test_a_bad_vae_file_gets_advice_for_what_it_is(tmp_path):
    """The fix said "re-download the file (it may be truncated or not a .safetensors file)" for an .onnx graph
    and for a .gguf alike."""
    from sdrt.pipelines import DEMO_MODEL
    from sdrt.pipelines.singlefile import check_part_file

    with pytest.raises(WeightsError, match=r"this is an ONNX graph.*What to do: pass a VAE \.safetensors file.*"
                                           r"or leave vae out to use the model folder's own VAE"):
        check_part_file(Path(DEMO_MODEL) / "vae_decoder" / "model.onnx", "vae", "sd1", "SD 1.x")
    cut = tmp_path / "vae.gguf"
    cut.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (0).to_bytes(8, "little") + b"x")
    with pytest.raises(WeightsError, match=r"not a readable GGUF file: the file ends at byte 25, before the end of "
                                           r"the 0 metadata keys and 1 tensors.*truncated.*re-download the \.gguf file"):
        check_part_file(cut, "vae", "sd1", "SD 1.x")


def test_sdxl_v_pred_file_and_its_ztsnr_key(tmp_path, caplog):
    """NoobAI-XL v-pred files carry empty ``v_pred`` and ``ztsnr`` tensors: v-prediction is read from the first, zero
    terminal SNR from the second (the release scheduler gets ``rescale_betas_zero_snr``, as A1111 and ComfyUI rescale
    the schedule for it; tests/pipelines/test_pipelines_schedule.py checks the rescaled schedule against diffusers)."""
    import logging

    from sdrt.weights import Weights, stfile

    base = Weights.open(DATA / "sdxl" / "ldm.safetensors")
    f = tmp_path / "noob_vpred.safetensors"
    stfile.write(f, {**{k: np.asarray(base[k]) for k in base}, "v_pred": np.zeros(0, np.float32),
                     "ztsnr": np.zeros(0, np.float32)})
    parts = ["unet", "text_encoder", "text_encoder_2"]
    with caplog.at_level(logging.INFO, logger="sdrt.checkpoint.files"):
        m = open_single_file(f, graph_paths={p: DATA / "sdxl" / p / "model.onnx" for p in parts}, parts=parts)
    assert m.prediction == "v_prediction" and m.release["scheduler"]["prediction_type"] == "v_prediction"
    assert m.release["scheduler"]["rescale_betas_zero_snr"] is True
    assert any("zero terminal SNR" in r.getMessage() for r in caplog.records)
    from sdrt.pipelines.scheduling import FolderSchedule

    assert FolderSchedule.from_config(m.release["scheduler"]).alphas_cumprod_f32[-1] == np.float32(2.0**-24)


def _edm_file(tmp_path, name: str, extra: dict) -> Path:
    from sdrt.weights import Weights, stfile

    base = Weights.open(DATA / "sdxl" / "ldm.safetensors")
    f = tmp_path / name
    stfile.write(f, {**{k: np.asarray(base[k]) for k in base}, **extra})
    return f


XL_PARTS = ["unet", "text_encoder", "text_encoder_2"]


def _open_xl(f, **kw):
    return open_single_file(f, graph_paths={p: DATA / "sdxl" / p / "model.onnx" for p in XL_PARTS}, parts=XL_PARTS,
                            **kw)


def test_playground_v25_opens_with_its_edm_scheduler_and_latent_stats(tmp_path):
    """Playground v2.5 has SDXL's keys plus edm_mean/edm_std: its release's EDM scheduler (EDMDPMSolverMultistep, sigma
    0.002..80, sigma_data 0.5, epsilon) and, as diffusers' single-file loader writes them, the VAE's scaling_factor 0.5
    with the keys' values as latents_mean / latents_std. CosXL's edm_vpred keys: v-prediction EDM, sigma_data 1, the
    keys' sigmas (ComfyUI's reading; the release's 0.002..120 where a key is missing). tests/checkpoint/test_edm_files.py runs both against diffusers' images."""
    mean, std = [-1.6574, 1.886, -1.383, 2.5155], [8.4927, 5.9022, 6.5498, 5.2299]
    f = _edm_file(tmp_path, "playground-v2.5-1024px-aesthetic.fp16.safetensors",
                  {"edm_mean": np.asarray(mean, np.float32).reshape(1, 4, 1, 1),
                   "edm_std": np.asarray(std, np.float32).reshape(1, 4, 1, 1)})
    m = _open_xl(f)
    assert m.family == "sdxl" and m.label.startswith("Playground v2.5") and m.prediction == "epsilon"
    sched = m.release["scheduler"]
    assert (sched["_class_name"], sched["sigma_min"], sched["sigma_max"], sched["sigma_data"],
            sched["prediction_type"]) == ("EDMDPMSolverMultistepScheduler", 0.002, 80.0, 0.5, "epsilon")
    assert m.release["vae"]["scaling_factor"] == 0.5
    np.testing.assert_allclose(m.release["vae"]["latents_mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(m.release["vae"]["latents_std"], std, rtol=1e-6)
    cos = _open_xl(_edm_file(tmp_path, "cosxl.safetensors", {"edm_vpred.sigma_min": np.float32(0.003),
                                                             "edm_vpred.sigma_max": np.float32(100.0)}))
    sched = cos.release["scheduler"]
    assert cos.label.startswith("CosXL") and cos.prediction == "v_prediction"
    assert (sched["_class_name"], sched["sigma_data"], sched["prediction_type"]) == \
        ("EDMEulerScheduler", 1.0, "v_prediction")
    assert sched["sigma_max"] == 100.0 and abs(sched["sigma_min"] - 0.003) < 1e-9  # the keys' (release: 0.002..120)
    assert "latents_mean" not in cos.release["vae"]


def test_broken_edm_keys_are_named(tmp_path):
    """edm_mean of the wrong size, an edm_std of 0, CosXL sigmas the wrong way round: one line naming the key."""
    cases = [({"edm_mean": np.zeros((1, 3, 1, 1), np.float32), "edm_std": np.ones((1, 4, 1, 1), np.float32)},
              "its edm_mean tensor holds 3 value"),
             ({"edm_mean": np.zeros((1, 4, 1, 1), np.float32), "edm_std": np.zeros((1, 4, 1, 1), np.float32)},
              "its edm_std tensor .* not 4 finite numbers above 0"),
             ({"edm_vpred.sigma_min": np.asarray([200.0], np.float32),
               "edm_vpred.sigma_max": np.asarray([120.0], np.float32)}, "edm_vpred.sigma_min 200 is not below")]
    for i, (extra, msg) in enumerate(cases):
        with pytest.raises(ModelError, match=msg) as e:
            _open_xl(_edm_file(tmp_path, f"bad{i}.safetensors", extra))
        assert "\n" not in str(e.value)


def test_a_yaml_beside_an_sd1_or_sdxl_file_sets_v_prediction(tmp_path):
    """A1111 reads ``<stem>.yaml`` beside any checkpoint: a v-prediction SD 1.x finetune ships LDM's
    ``parameterization: "v"``, an SDXL one SGM's ``VScaling`` denoiser; without a yaml both stay epsilon."""
    import shutil

    cases = (("sd1", ["unet", "text_encoder", "vae_decoder"],
              'model:\n  params:\n    parameterization: "v"   # v-pred finetune\n'),
             ("sdxl", ["unet", "text_encoder", "text_encoder_2"],
              "model:\n  params:\n    denoiser_config:\n      params:\n        scaling_config:\n"
              "          target: sgm.modules.diffusionmodules.denoiser_scaling.VScaling\n"))
    for fam, parts, yaml in cases:
        f = tmp_path / f"{fam}-vpred.safetensors"
        shutil.copy(DATA / fam / "ldm.safetensors", f)
        graphs = {p: DATA / fam / p / "model.onnx" for p in parts}
        assert open_single_file(f, graph_paths=graphs, parts=parts).prediction == "epsilon"
        f.with_suffix(".yaml").write_text(yaml)
        m = open_single_file(f, graph_paths=graphs, parts=parts)
        assert m.prediction == "v_prediction" and m.release["scheduler"]["prediction_type"] == "v_prediction", fam
