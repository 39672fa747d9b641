"""The pipeline with a checkpoint, LoRAs and embeddings: pipe.load_weights / set_loras / add_embedding.

tests/data/ckpt/pipe-sd15 holds an LDM checkpoint, a kohya LoRA and an A1111 embedding for the pipe
helper's tiny-sd15 folder, and the images diffusers' own StableDiffusionPipeline makes with them
(single-file loader, load_lora_weights + fuse_lora(0.7), load_textual_inversion), Euler, 8 steps, 64x64.

Tolerance: the weights themselves are checked exactly in test_single_file.py; whole images go through
8 sampler steps with CFG 7 on a random-weight model, which amplifies float32 rounding, and the
pipeline's own images differ from diffusers' by up to a mean of ~4.4 levels on this folder. So an image is
"equal" here when its mean absolute difference to diffusers' is below 24 levels (of 255) while the
export's own weights give a mean difference above 40.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from ckpt_data import DATA, PIPE_FOLDER

from sdrt import pipelines
from sdrt.errors import InputError, WeightsError

# every test here runs the pipeline on OpenVINO
pytestmark = pytest.mark.needs_backend("openvino")

D = DATA / "pipe-sd15"
CASES = json.loads((D / "cases.json").read_text())
CASE = CASES["case"]
KW = dict(steps=CASE["steps"], cfg=CASE["cfg"], sampler=CASE["sampler"], seed=CASE["seed"], width=CASE["width"],
          height=CASE["height"])
MEAN_TOL = 24
QUICK = dict(KW, steps=2)  # for tests that compare sdrt with itself


def _mean_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int32) - b.astype(np.int32)).mean())


@pytest.fixture
def pipe():
    with pipelines.load(PIPE_FOLDER, backend="openvino") as p:
        yield p


@pytest.fixture(scope="module")
def refs():
    return dict(np.load(D / "refs.npz"))


def test_checkpoint_swap_matches_diffusers_without_recompiling(pipe, refs):
    base = pipe(CASE["prompt"], CASE["negative_prompt"], **KW)[0]
    sessions = {name: dict(part.sessions) for name, part in pipe.parts.items()}
    pipe.load_weights(D / "custom.safetensors")
    img = pipe(CASE["prompt"], CASE["negative_prompt"], **KW)[0]
    for name, part in pipe.parts.items():  # the same compiled sessions, rebound
        for key, sess in sessions[name].items():
            assert part.sessions[key] is sess
    assert _mean_diff(base, refs["ckpt"]) > 40
    assert _mean_diff(img, refs["ckpt"]) < MEAN_TOL


def test_prompt_lora_tag_matches_diffusers_and_unapplies_bit_for_bit(pipe, refs):
    pipe.load_weights(D / "custom.safetensors")
    pipe.weights.lora_dir = D
    plain = pipe(CASE["prompt"], CASE["negative_prompt"], **KW)[0]
    unet_before = {k: np.array(pipe.unet.weights[k]) for k in pipe.weights.base["unet"]}
    gen = pipe.generate(CASES["lora_prompt"], CASE["negative_prompt"], **KW)
    assert _mean_diff(gen.images[0], refs["lora"]) < MEAN_TOL
    assert _mean_diff(plain, refs["lora"]) > 40
    assert "tinylora: " in str(gen.settings[0]["Lora hashes"])
    again = pipe(CASE["prompt"], CASE["negative_prompt"], **KW)[0]  # no tag: the LoRA is removed
    assert again.tobytes() == plain.tobytes()
    bound = pipe.unet.weights
    for name, arr in unet_before.items():
        assert np.asarray(bound[name]).tobytes() == arr.tobytes()


def test_explicit_loras_with_scales(pipe):
    pipe.set_loras([(D / "tinylora.safetensors", 0.7)])
    a = pipe(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0]
    pipe.set_loras([(D / "tinylora.safetensors", 0.35), (D / "tinylora.safetensors", 0.35)])
    b = pipe(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0]
    assert _mean_diff(a, b) < 2  # two halves merge to the same weights (float32 rounding aside)
    pipe.set_loras([])
    assert not pipe.weights.loras


def test_missing_lora_name_is_refused_before_anything_changes(pipe):
    pipe.weights.lora_dir = D
    before = pipe(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0]
    with pytest.raises(WeightsError, match="no LoRA named 'nosuch'"):
        pipe(CASE["prompt"] + " <lora:nosuch:1>", CASE["negative_prompt"], **QUICK)
    assert pipe(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0].tobytes() == before.tobytes()


def test_lora_tag_without_a_lora_folder_is_refused(pipe):
    with pytest.raises(WeightsError, match="no LoRA folder"):
        pipe(CASE["prompt"] + " <lora:tinylora:1>", CASE["negative_prompt"], **QUICK)


def test_embedding_by_name_in_the_prompt_matches_diffusers(pipe, refs):
    pipe.load_weights(D / "custom.safetensors")
    pipe.add_embedding(D / "tinyemb.safetensors")
    gen = pipe.generate(CASES["emb_prompt"], CASE["negative_prompt"], **KW)
    assert _mean_diff(gen.images[0], refs["emb"]) < MEAN_TOL
    assert "tinyemb: " in str(gen.settings[0]["TI hashes"])
    assert gen.settings[0]["Model"] == "custom" and len(str(gen.settings[0]["Model hash"])) == 10
    # A1111 names the embeddings the prompts use: a loaded one that no prompt holds is not listed (it was)
    unused = pipe.generate(CASE["prompt"], CASE["negative_prompt"], **QUICK).settings[0]
    assert "TI hashes" not in unused, unused
    negative = pipe.generate(CASE["prompt"], "TinyEmb, blurry", **QUICK).settings[0]  # any case, the negative too
    assert "tinyemb: " in str(negative["TI hashes"])
    assert "TI hashes" not in pipe.generate(CASE["prompt"], "tinyembx", **QUICK).settings[0]  # not a whole word
    # a checkpoint loaded after the embedding keeps it
    pipe.load_weights(D / "custom.safetensors")
    again = pipe.generate(CASES["emb_prompt"], CASE["negative_prompt"], **KW).images[0]
    assert again.tobytes() == gen.images[0].tobytes()


def test_other_architecture_checkpoint_is_refused_and_nothing_changes(pipe):
    before = pipe(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0]
    with pytest.raises(WeightsError, match="looks like SDXL base"):
        pipe.load_weights(DATA / "sdxl" / "ldm.safetensors")
    assert pipe(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0].tobytes() == before.tobytes()


def test_low_memory_mode_frees_parts_and_gives_the_same_image(refs):
    with pipelines.load(PIPE_FOLDER, backend="openvino") as normal:
        normal.load_weights(D / "custom.safetensors")
        want = normal(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0]
    with pipelines.load(PIPE_FOLDER, backend="openvino", low_memory=True) as low:
        low.load_weights(D / "custom.safetensors")
        got = low(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0]
        assert all(not part.sessions for part in low.parts.values())
        assert low.unet._graph is None and low.unet.weights is None  # graph and weights dropped, not held
        assert got.tobytes() == want.tobytes()
        low.set_loras([(D / "tinylora.safetensors", 0.7)])  # reloads, binds, and frees again
        low.set_loras([])
        assert low(CASE["prompt"], CASE["negative_prompt"], **QUICK)[0].tobytes() == want.tobytes()


@pytest.mark.parametrize("key", ["ckpt", "lora", "emb"])
def test_pipeline_parts_match_diffusers_exactly(pipe, refs, key):
    """No sampler in between: the prompt embeddings and one UNet call inside the pipeline, with the
    checkpoint (plus the LoRA at 0.7, or the embedding in the prompt), equal diffusers' to 1e-4."""
    pipe.load_weights(D / "custom.safetensors")
    prompt = CASE["prompt"]
    if key == "lora":
        pipe.set_loras([(D / "tinylora.safetensors", 0.7)])
    if key == "emb":
        pipe.add_embedding(D / "tinyemb.safetensors")
        prompt = CASES["emb_prompt"]
    embeds = pipe.prompts.encode(prompt).hidden
    np.testing.assert_allclose(embeds, refs[f"{key}_embeds"], atol=1e-4)
    out = pipe.unet.run({"sample": refs["unet_sample"], "timestep": np.array([500], np.int64),
                         "encoder_hidden_states": refs[f"{key}_embeds"]})["out_sample"]
    np.testing.assert_allclose(out, refs[f"{key}_unet"], atol=1e-4)


def test_removing_the_last_lora_gives_the_exports_image_back_bit_for_bit(pipe):
    """No checkpoint: the sessions first compiled with the export's own weights. Rebinding those weights after a LoRA
    ran OpenVINO's swappable form (biases fed as inputs), 1 level off in fp32 (this case) and 18 in bf16; the parts
    compile again as they were at load instead."""
    kw = dict(steps=2, seed=1, sampler="Euler")
    before = pipe("a red cat", **kw)[0]
    pipe.set_loras([(D / "tinylora.safetensors", 0.5)])
    assert pipe("a red cat", **kw)[0].tobytes() != before.tobytes()
    pipe.set_loras([])
    assert pipe("a red cat", **kw)[0].tobytes() == before.tobytes()


@pytest.mark.parametrize("low_memory", [False, True])
@pytest.mark.parametrize("first", ["embedding", "checkpoint before a job", "checkpoint after a job", "nothing"])
def test_removing_the_last_lora_gives_what_ran_before_it(first, low_memory):
    """Whatever the base weights are and however they were bound, removing the LoRA gives the image the base gave.
    With an embedding, the text encoder's base (its table with reserved rows) first ran freshly compiled and came back
    rebound (0.025 off on OpenVINO); in low-memory mode the LoRA's weights stayed bound to be rebuilt."""
    kw = dict(steps=2, seed=1, sampler="Euler")
    with pipelines.load(PIPE_FOLDER, backend="openvino", low_memory=low_memory) as pipe:
        if first == "checkpoint after a job":
            pipe("a red cat", **kw)
        if first.startswith("checkpoint"):
            pipe.load_weights(D / "custom.safetensors")
        if first == "embedding":
            pipe.add_embedding(D / "tinyemb.safetensors")
        before = pipe("a red cat", **kw)[0]
        pipe.set_loras([(D / "tinylora.safetensors", 0.6)])
        assert pipe("a red cat", **kw)[0].tobytes() != before.tobytes()
        pipe.set_loras([])
        assert pipe("a red cat", **kw)[0].tobytes() == before.tobytes()


@pytest.mark.parametrize("name", ["../pipe-sd15/tinylora", str((D / "tinylora").resolve()), "../../../../../../etc/passwd"])
def test_a_lora_tag_cannot_leave_the_lora_folder(pipe, name):
    """A prompt (a Discord bot's, a server's) named any file on the machine: '../x' and absolute names were joined to
    the LoRA folder and read."""
    pipe.weights.lora_dir = DATA / "sd1"
    with pytest.raises(WeightsError, match="leads out of the LoRA folder") as info:
        pipe(f"a cat <lora:{name}:0.5>", **QUICK)
    assert info.value.where == f"<lora:{name}:...> in the prompt"
    assert not pipe.weights.loras


def test_a_lora_tag_may_name_a_file_in_a_subfolder(pipe, tmp_path):
    import shutil

    (tmp_path / "styles").mkdir()
    shutil.copy(D / "tinylora.safetensors", tmp_path / "styles" / "tiny.safetensors")
    pipe.weights.lora_dir = tmp_path
    assert "tiny: " in str(pipe.generate("a cat <lora:styles/tiny:0.5>", **QUICK).settings[0]["Lora hashes"])


def test_a_lora_file_with_an_upper_case_suffix_is_found(pipe, tmp_path):
    """The server lists X.SAFETENSORS as X (suffixes in any case); the pipeline looked for X.safetensors only."""
    import shutil

    (tmp_path / "styles").mkdir()
    shutil.copy(D / "tinylora.safetensors", tmp_path / "styles" / "Tiny.SAFETENSORS")
    pipe.weights.lora_dir = tmp_path
    assert "Tiny: " in str(pipe.generate("a cat <lora:styles/Tiny:0.5>", **QUICK).settings[0]["Lora hashes"])
    with pytest.raises(WeightsError, match="no LoRA named 'styles/tiny'"):  # the name itself keeps its case
        pipe("a cat <lora:styles/tiny:0.5>", **QUICK)


def test_the_lora_folder_may_be_a_str(pipe):
    """docs/checkpoints.md sets pipe.weights.lora_dir = "loras/": a str was a TypeError at the first tag."""
    pipe.weights.lora_dir = str(D)
    assert "tinylora: " in str(pipe.generate("a cat <lora:tinylora:0.5>", **QUICK).settings[0]["Lora hashes"])
    pipe.weights.lora_dir = 5
    with pytest.raises(InputError, match="pipe.weights.lora_dir must be a folder path, got int 5"):
        pipe("a cat <lora:tinylora:0.5>", **QUICK)


def test_a_checkpoint_that_says_v_on_an_eps_folder_is_sampled_as_v(pipe, refs, tmp_path, caplog):
    """A1111 reads a checkpoint's ``<stem>.yaml`` (``parameterization: "v"``) and samples it as v-prediction, and a
    ``ztsnr`` key as zero terminal SNR; bound onto an eps ONNX folder (``--weights``) it was sampled as eps with a
    warning only. The image is diffusers' of the same weights with its scheduler set so (pipe-sd15/vpred.npz,
    ``scripts/gen_checkpoint_data.py vpred``); a file that says nothing runs as the folder's scheduler again."""
    import logging
    import shutil

    from safetensors.numpy import load_file, save_file

    vpred = np.load(D / "vpred.npz")
    f = tmp_path / "custom_v.safetensors"
    shutil.copy(D / "custom.safetensors", f)
    f.with_suffix(".yaml").write_text('model:\n  params:\n    parameterization: "v"\n')
    with caplog.at_level(logging.INFO, logger="sdrt"):
        pipe.load_weights(f)
    said = [r.getMessage() for r in caplog.records if "sampled as" in r.getMessage()]
    assert len(said) == 1 and "custom_v.safetensors is sampled as v-prediction (custom_v.yaml" in said[0], said
    img = pipe(CASE["prompt"], CASE["negative_prompt"], **KW)[0]
    assert _mean_diff(img, vpred["v"]) < MEAN_TOL
    assert 3 * _mean_diff(img, vpred["v"]) < _mean_diff(img, refs["ckpt"])  # sampled as eps it was diffusers' eps image

    z = tmp_path / "custom_z.safetensors"  # the yaml's v and a ztsnr key (NoobAI-XL's marker)
    save_file({**load_file(f), "ztsnr": np.zeros((0,), np.float16)}, str(z))
    shutil.copy(f.with_suffix(".yaml"), z.with_suffix(".yaml"))
    pipe.load_weights(z)
    img = pipe(CASE["prompt"], CASE["negative_prompt"], **KW)[0]
    assert _mean_diff(img, vpred["v_ztsnr"]) < MEAN_TOL  # (1.3 levels from the v image: the betas rescaled only)
    config = pipe.family.scheduler_config()  # the rescaled schedule itself is checked against diffusers' elsewhere
    assert config["prediction_type"] == "v_prediction" and config["rescale_betas_zero_snr"] is True
    assert pipe.schedule.prediction == "v" and pipe.family.prediction == "v"  # the public view follows the file

    pipe.load_weights(D / "custom.safetensors")  # says nothing: the folder's eps again
    assert pipe.family.scheduler_overrides == {} and pipe.schedule.prediction == "eps"
    img = pipe(CASE["prompt"], CASE["negative_prompt"], **KW)[0]
    assert _mean_diff(img, refs["ckpt"]) < MEAN_TOL


def test_dry_run_plans_the_prediction_the_checkpoint_says(tmp_path, capsys):
    """``sdrt generate --weights FILE --dry-run`` binds no weights, but a checkpoint that says v-prediction (its yaml)
    and zero terminal SNR (a ztsnr key) is sampled so (load_weights): the plan's model sampling line says what the
    run samples as, not the folder's eps."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from sdrt.cli import main

    f = tmp_path / "custom_v.safetensors"
    save_file({**load_file(D / "custom.safetensors"), "ztsnr": np.zeros((0,), np.float16)}, str(f))
    f.with_suffix(".yaml").write_text('model:\n  params:\n    parameterization: "v"\n')
    argv = ["generate", str(PIPE_FOLDER), "a cat", "--steps", "2", "--dry-run", "--backend", "openvino"]
    assert main([*argv, "--weights", str(f)]) == 0
    out = capsys.readouterr().out
    assert "model sampling v," in out, out
    with pipelines.load(PIPE_FOLDER, backend="openvino") as p:
        p.load_weights(f)
        want = p.family.model_sampling(64, 64)
    assert "model sampling v," in out and want.prediction == "v"
    shutil.copy(D / "custom.safetensors", tmp_path / "plain.safetensors")  # says nothing: the folder's eps
    assert main([*argv, "--weights", str(tmp_path / "plain.safetensors")]) == 0
    assert "model sampling eps," in capsys.readouterr().out


def test_clip_skip_on_a_single_file_run_on_its_own_matches_diffusers(tmp_path):
    """A single file on sdrt's weight-free graphs (its weights are the parts' default_weights) at clip skip 2: the
    run plan's dry pass read the final layer norm from the graph, whose weights file is not shipped, and every
    such run failed with "external-data file 'clip_l.weights.safetensors' ... is missing"."""
    import single_file_helpers as h

    graphs = h.stripped(PIPE_FOLDER, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp_path / "g")
    ref = np.load(D / "clipskip.npz")["a1111_clip_skip_2"][0]  # diffusers, clip_skip=1 (A1111's 2)
    with pipelines.load(D / "custom.safetensors", backend="openvino", graph_paths=graphs,
                        tokenizers={"tokenizer": PIPE_FOLDER / "tokenizer"}) as pipe:
        assert pipe.text_encoder.default_weights is not None  # the file's, on the weight-free graph
        img = pipe(CASE["prompt"], CASE["negative_prompt"], clip_skip=2, **KW)[0]
        plain = pipe(CASE["prompt"], CASE["negative_prompt"], **KW)[0]
    assert _mean_diff(img, ref) < MEAN_TOL
    assert _mean_diff(plain, ref) > 30  # clip skip 1 is told apart (0.0 and 36 measured on a Zen 5)


def test_a_single_file_says_which_sides_its_unet_makes(tmp_path):
    """A single file's UNet has no config.json: a side off its latent grid failed in shape inference ("Inferred=13
    Declared=14 ... re-export the model"), and an init image was not fitted to the grid, where the ONNX folder
    said "use 192 or 256" and fitted the picture. The down blocks now come from the file's weights."""
    import single_file_helpers as h
    from PIL import Image

    graphs = h.stripped(PIPE_FOLDER, ["unet", "text_encoder", "vae_decoder", "vae_encoder"], tmp_path / "g")
    with pipelines.load(D / "custom.safetensors", backend="openvino", graph_paths=graphs,
                        tokenizers={"tokenizer": PIPE_FOLDER / "tokenizer"}) as pipe:
        assert pipe.folder.configs["unet"]["block_out_channels"] == [8, 16]  # tiny-sd15's, as its config.json
        assert pipe._unet_halvings() == 0  # its upsampler takes its skip's size (tests/pipelines/test_any_size.py)
        assert pipe._size_multiple() == 8
        # (this tiny export is fixed at 64x64, so an init image is fitted to 64x64 here; the full-size shipped graphs
        # are dynamic: `sdrt generate FILE --height 240` runs at 240)
        picture = Image.new("RGB", (75, 70), (200, 40, 40))
        assert pipe.generate("a cat", steps=2, init_image=picture).images[0].shape == (64, 64, 3)
