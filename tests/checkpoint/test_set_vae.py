"""``Pipeline.set_vae`` / ``set_text_encoders``: another VAE file for a loaded pipeline, the rest kept loaded.

What a switch must give: the image of a pipeline loaded fresh with that VAE (``pipelines.load(model, vae=file)``,
whose binding tests/checkpoint/test_single_file_pipeline.py checks against the folder with that checkpoint), bit for
bit, on the reference backend, OpenVINO and ggml; switching back gives the first image back, bit for bit. The
denoiser's and text encoder's compiled sessions stay (the point: no second UNet in memory, no reload); a switch
while a job runs waits for it; a bad file raises one ``SdrtError`` naming ``vae`` and leaves the VAE in use.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import single_file_helpers as h
from ckpt_data import DATA, PIPE_FOLDER

from sdrt import pipelines
from sdrt.errors import InputError, SdrtError
from sdrt.weights import Weights

CUSTOM = DATA / "pipe-sd15" / "custom.safetensors"
JOB = dict(steps=3, cfg=7.0, sampler="Euler", seed=7, width=64, height=64)
PROMPT = ("a red cat on a mat", "blurry")


@pytest.fixture(scope="module")
def vaes(tmp_path_factory) -> dict[str, Path]:
    """custom: the VAE of custom.safetensors (LDM names), dim: the same with the decoder's last conv halved."""
    root = tmp_path_factory.mktemp("vaes")
    w = Weights.open(CUSTOM)
    tensors = {k.removeprefix("first_stage_model."): np.ascontiguousarray(np.asarray(w[k]), np.float32)
               for k in w if k.startswith("first_stage_model.")}
    dim = dict(tensors)
    dim["decoder.conv_out.weight"] = tensors["decoder.conv_out.weight"] * np.float32(0.5)
    return {"custom": h.write(root / "custom_vae.safetensors", tensors), "dim": h.write(root / "dim_vae.safetensors", dim)}


def _image(pipe, **kw) -> np.ndarray:
    return pipe(*PROMPT, **{**JOB, **kw})[0]


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_a_switched_vae_gives_the_image_of_a_pipeline_loaded_with_it_and_back(backend, vaes):
    fresh = {}
    for name, vae in (("own", None), ("custom", vaes["custom"]), ("dim", vaes["dim"])):
        with pipelines.load(PIPE_FOLDER, backend=backend, vae=vae) as pipe:
            fresh[name] = _image(pipe)
    assert np.abs(fresh["own"].astype(int) - fresh["custom"].astype(int)).mean() > 1
    assert np.abs(fresh["dim"].astype(int) - fresh["custom"].astype(int)).mean() > 1
    with pipelines.load(PIPE_FOLDER, backend=backend) as pipe:
        first = _image(pipe)
        kept = {p: dict(pipe.parts[p].sessions) for p in ("unet", "text_encoder")}
        for name, vae in (("custom", vaes["custom"]), ("dim", vaes["dim"]), ("own", None), ("custom", vaes["custom"]),
                          ("own", None)):
            assert pipe.set_vae(vae) == ["vae_decoder", "vae_encoder"]
            assert pipe.vae_file == vae
            got = _image(pipe)
            assert got.tobytes() == fresh[name].tobytes(), (backend, name)
            assert {p: dict(pipe.parts[p].sessions) for p in kept} == kept  # the same compiled UNet, text encoder
        assert first.tobytes() == fresh["own"].tobytes()
        assert pipe.set_vae(None) == []  # nothing to change: nothing closes


def test_the_infotext_names_the_vae_that_ran(vaes):
    with pipelines.load(PIPE_FOLDER, backend="reference") as pipe:
        pipe.set_vae(vaes["dim"])
        text = pipe.generate(*PROMPT, **{**JOB, "steps": 1}).settings[0]
        assert text["VAE"] == "dim_vae.safetensors" and len(text["VAE hash"]) == 10
        pipe.set_vae(None)
        assert "VAE" not in pipe.generate(*PROMPT, **{**JOB, "steps": 1}).settings[0]


def test_a_bad_vae_file_leaves_the_vae_in_use(vaes, tmp_path):
    data = vaes["custom"].read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    clip = h.write(tmp_path / "clip.safetensors", {k: np.asarray(v) for k, v in Weights.open(CUSTOM).items()
                                                    if k.startswith("cond_stage_model.")})
    sdxl_vae = h.sparse(tmp_path / "wide_vae.safetensors", {"decoder.conv_in.weight": (512, 16, 3, 3),
                                                            "decoder.conv_out.weight": (3, 128, 3, 3)})
    with pipelines.load(PIPE_FOLDER, backend="reference", vae=vaes["custom"]) as pipe:
        want = _image(pipe)
        sessions = {p: dict(part.sessions) for p, part in pipe.parts.items()}
        for bad, says in ((tmp_path / "cut.safetensors", "truncated"), (tmp_path / "none.safetensors", "does not exist"),
                          (clip, "not a VAE|is a whole"), (sdxl_vae, "16-channel|needs"),
                          (PIPE_FOLDER / "unet" / "model.onnx", "ONNX graph")):
            with pytest.raises(SdrtError, match=says) as exc:
                pipe.set_vae(bad)
            assert "vae" in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
            assert pipe.vae_file == vaes["custom"]
            assert {p: dict(part.sessions) for p, part in pipe.parts.items()} == sessions  # nothing closed
        with pytest.raises(InputError, match="vae must be a file path"):
            pipe.set_vae(3)
        assert _image(pipe).tobytes() == want.tobytes()


def test_a_switch_while_a_job_runs_waits_for_it(vaes):
    """The job runs with the VAE it started with; set_vae returns after it, and the next job has the new VAE."""
    with pipelines.load(PIPE_FOLDER, backend="reference", vae=vaes["dim"]) as ref:
        want_dim = _image(ref)
    with pipelines.load(PIPE_FOLDER, backend="reference") as pipe:
        own = _image(pipe)
        at_step, go = threading.Event(), threading.Event()

        def hold(step, total, latents):
            at_step.set()
            assert go.wait(30)

        out: dict[str, object] = {}
        job = threading.Thread(target=lambda: out.setdefault("job", pipe(*PROMPT, callback=hold, **JOB)[0]))
        job.start()
        assert at_step.wait(60)
        swap = threading.Thread(target=lambda: out.setdefault("swap", pipe.set_vae(vaes["dim"])))
        swap.start()
        time.sleep(0.5)
        assert swap.is_alive() and "swap" not in out  # waiting for the job
        go.set()
        job.join(60)
        swap.join(60)
        assert out["swap"] == ["vae_decoder", "vae_encoder"]
        assert out["job"].tobytes() == own.tobytes()  # the running job kept its VAE
        assert _image(pipe).tobytes() == want_dim.tobytes()

        def inside(step, total, latents):
            pipe.set_vae(None)

        with pytest.raises(InputError, match=r"set_vae\(\) was called from inside"):
            pipe(*PROMPT, callback=inside, **JOB)


def test_a_checkpoint_keeps_the_chosen_vae_and_set_vae_none_gives_the_checkpoints(vaes):
    """load_weights binds a checkpoint over every part but a part a separate file fills; going back to the model's
    own VAE then gives the checkpoint's (custom.safetensors holds the custom VAE)."""
    z = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)

    def decode(pipe):
        return pipe.vae_decoder.run({"latent_sample": z})["sample"]

    with pipelines.load(PIPE_FOLDER, backend="reference", vae=vaes["dim"]) as ref:
        want_dim = decode(ref)
    with pipelines.load(PIPE_FOLDER, backend="reference", vae=vaes["custom"]) as ref:
        want_ckpt = decode(ref)
    with pipelines.load(PIPE_FOLDER, backend="reference", vae=vaes["dim"]) as pipe:
        pipe.load_weights(CUSTOM)
        assert pipe.vae_file == vaes["dim"]
        np.testing.assert_array_equal(decode(pipe), want_dim)
        pipe.set_vae(None)
        np.testing.assert_array_equal(decode(pipe), want_ckpt)


@pytest.mark.parametrize("backend", ["reference", "openvino"])
def test_a_single_files_vae_switches_and_goes_back_to_its_own(backend, vaes, sd1_graphs):
    def load(**kw):
        return pipelines.load(CUSTOM, backend=backend, graph_paths=sd1_graphs,
                              tokenizers={"tokenizer": PIPE_FOLDER / "tokenizer"}, **kw)

    with load() as ref:
        own = _image(ref)
    with load(vae=vaes["dim"]) as ref:
        dim = _image(ref)
    assert np.abs(own.astype(int) - dim.astype(int)).mean() > 1
    with load(vae=vaes["dim"]) as pipe:  # given at load: its own VAE is read from the file again
        assert pipe.vae_file == vaes["dim"]
        assert _image(pipe).tobytes() == dim.tobytes()
        pipe.set_vae(None)
        assert pipe.vae_file is None
        assert _image(pipe).tobytes() == own.tobytes()
        pipe.set_vae(vaes["dim"])
        assert _image(pipe).tobytes() == dim.tobytes()


@pytest.fixture(scope="module")
def sd1_graphs(tmp_path_factory) -> dict[str, Path]:
    return h.stripped(PIPE_FOLDER, ["unet", "text_encoder", "vae_decoder", "vae_encoder"],
                      tmp_path_factory.mktemp("sd1-graphs"))


def test_text_encoder_files_switch_on_a_full_size_onnx_folder_and_back(tmp_path):
    """set_text_encoders / set_part_files on an ONNX folder of SD 1.5's full-size architecture (sdrt's shipped
    graphs laid out as an Optimum folder; the files are full-size headers, sparse): the text encoder is bound to the
    file and back to the folder's own, the UNet untouched; both files are checked before either changes."""
    folder, clip, vae = h.sd15_onnx_folder(tmp_path)
    with pipelines.load(folder, backend="reference") as pipe:
        assert pipe.set_text_encoders([clip]) == ["text_encoder"]
        assert pipe.text_encoder_files == (clip,) and pipe.vae_file is None
        bound = pipe.text_encoder.weights
        assert bound is not None and set(bound) == {t.name for t in pipe.text_encoder.graph.model.graph.initializer}
        with pytest.raises(SdrtError, match="text_encoders: vae.safetensors is a 4-channel VAE"):
            pipe.set_part_files(vae=vae, text_encoders=[vae])  # the VAE would fit; nothing changes
        assert pipe.vae_file is None and pipe.text_encoder_files == (clip,)
        assert pipe.set_part_files(vae=vae, text_encoders=[clip]) == ["vae_decoder", "vae_encoder"]
        assert pipe.set_text_encoders([]) == ["text_encoder"]
        assert pipe.text_encoder_files == () and pipe.vae_file == vae
        assert pipe.text_encoder.weights is None and pipe.unet.weights is None  # the folder's own again
        assert all(not p.sessions for p in pipe.parts.values())
