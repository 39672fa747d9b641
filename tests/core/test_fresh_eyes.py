"""Defects a new user met in a fresh-eyes pass over the CLI and the API (each test failed before its fix)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdrt.cli import main
from sdrt.pipelines.png import PngError, write_png
from sdrt.pipelines.save import save_image

DATA = Path(__file__).resolve().parents[1] / "data"
UPSCALER = DATA / "upscalers" / "compact_x4.safetensors"


# -- WebP holds at most 16383 pixels a side: Pillow's ValueError was a traceback, after the whole run ----------
def test_upscale_to_a_webp_too_large_is_refused_before_the_run(tmp_path, capsys):
    image = tmp_path / "thin.png"
    write_png(image, np.zeros((4100, 1, 3), np.uint8))  # x4: 4x16400
    out = tmp_path / "up.webp"
    assert main(["upscale", str(image), "-m", str(UPSCALER), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "WebP" in err and "16383" in err and "4x16400" in err and "--output" in err
    assert not out.exists()


def test_generate_to_a_webp_too_large_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from sdrt import pipelines

    monkeypatch.setattr(pipelines, "load", lambda *a, **k: pytest.fail("the model loaded"))
    out = tmp_path / "wide.webp"
    args = ["generate", "a fox", "--width", "8192", "--height", "64", "--hires-scale", "2", "-o", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "16384x128" in err and ".png" in err
    assert not out.exists()


def test_save_image_says_the_webp_limit_in_one_line(tmp_path):
    with pytest.raises(PngError, match="at most 16383 pixels a side"):
        save_image(tmp_path / "x.webp", np.zeros((1, 16384, 3), np.uint8))
    assert not (tmp_path / "x.webp").exists()


# -- <lora:name:te:unet> and unet=: the UNet's weight was dropped (the UNet ran at the text encoder's) ----------
LORA = DATA / "ckpt" / "pipe-sd15" / "tinylora.safetensors"


def test_a_lora_tags_unet_weight_is_the_unets(tmp_path, registry):
    """A1111's ``<lora:x:TE:UNET>`` (and ``unet=``): each part at its own weight. The reference: the file's text
    encoder layers alone, and its UNet layers alone, as two LoRA files, each at weight 1."""
    from safetensors.numpy import load_file, save_file

    from sdrt import pipelines
    from sdrt.text import extract_lora_tags

    assert extract_lora_tags("a <lora:x:0.5:0.2> b <lora:y:unet=0.3> <lora:z:0.7>")[1] == [
        ("x", 0.5, 0.2), ("y", 1.0, 0.3), ("z", 0.7, 0.7)]
    tensors = load_file(str(LORA))
    save_file({k: v for k, v in tensors.items() if k.startswith("lora_te_")}, str(tmp_path / "te.safetensors"))
    save_file({k: v for k, v in tensors.items() if k.startswith("lora_unet_")}, str(tmp_path / "un.safetensors"))
    (tmp_path / "tinylora.safetensors").write_bytes(LORA.read_bytes())
    pipe = pipelines.load(DATA / "pipelines" / "tiny-sd15", backend="reference")
    pipe.weights.lora_dir = tmp_path

    def image(prompt):
        return pipe.generate(prompt, steps=2, seed=1, sampler="Euler").images[0].astype(int)

    try:
        te_alone, unet_alone = image("a fox <lora:te:1>"), image("a fox <lora:un:1>")
        assert np.abs(te_alone - unet_alone).max() > 20  # the two halves make different pictures
        assert np.abs(image("a fox <lora:tinylora:1:0>") - te_alone).max() <= 1
        assert np.abs(image("a fox <lora:tinylora:0:1>") - unet_alone).max() <= 1
        assert np.abs(image("a fox <lora:tinylora:te=0:unet=1>") - unet_alone).max() <= 1
    finally:
        pipe.close()


# -- <hypernet:x:1> stayed in the prompt as text (A1111 removes every extra-network tag); <lyco:> was ignored ------
def test_other_extra_network_tags_are_removed_and_said(registry):
    from sdrt import pipelines
    from sdrt.errors import SdrtError
    from sdrt.serve.a1111 import _prompt_syntax
    from sdrt.text.attention import unsupported_syntax

    assert any("<hypernet:foo:1>" in line and "removed" in line for line in unsupported_syntax("a <hypernet:foo:1>"))
    assert any("hypernet" in note for note in _prompt_syntax("a <hypernet:foo:1>", "prompt"))
    assert unsupported_syntax("a <lora:ink:1>") == [] and _prompt_syntax("a <lora:ink:1>", "prompt") == []
    pipe = pipelines.load(DATA / "pipelines" / "tiny-sd15", backend="reference")
    try:
        tagged = pipe.generate("a fox <hypernet:foo:1>", "ugly <hypernet:bar:0.5>", steps=1, seed=1)
        plain = pipe.generate("a fox ", "ugly ", steps=1, seed=1)
        assert np.array_equal(tagged.images[0], plain.images[0])
        assert tagged.prompt == "a fox <hypernet:foo:1>"  # the infotext keeps the prompt as typed
        with pytest.raises(SdrtError, match="no LoRA folder"):  # A1111's old name of <lora:>, read as text before
            pipe.generate("a fox <lyco:tinylora:1>", steps=1, seed=1)
    finally:
        pipe.close()


# -- a <lora:> tag with no --lora-dir: refused after the model loaded, in the API's words (pipe.weights.lora_dir) ---
@pytest.mark.parametrize("args, where", [(["a fox <lora:ink:1>"], "Where: PROMPT."),
                                         (["a fox", "--negative", "<lora:ink:0.5>"], "Where: --negative.")])
def test_a_lora_tag_without_lora_dir_is_refused_before_the_model_loads(capsys, monkeypatch, args, where):
    from sdrt import pipelines

    monkeypatch.setattr(pipelines, "load", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(["generate", *args, "-o", "never.png"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and where in err and "--lora-dir" in err and "pipe.weights" not in err


# -- Flux: --cfg above 1 with no negative prompt ran one pass (diffusers' rule) with no word; the PNG said CFG 3 -----
def test_a_flux_cfg_that_runs_no_pass_is_said(registry, caplog):
    from sdrt import pipelines

    pipe = pipelines.load(DATA / "pipelines" / "tiny-flux-dev", backend="reference")
    try:
        caplog.clear()
        pipe.generate("a fox", steps=1, seed=1, cfg=3, width=64, height=64)
        said = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
        assert len(said) == 1 and "cfg 3" in said[0] and "negative_prompt" in said[0]
        caplog.clear()
        pipe.generate("a fox", "blurry", steps=1, seed=1, cfg=3, width=64, height=64)  # the CFG pass runs
        pipe.generate("a fox", steps=1, seed=1, width=64, height=64)  # cfg 1: nothing to say
        assert not [r for r in caplog.records if "is not used" in r.getMessage()]
    finally:
        pipe.close()


# -- a compile cache hit skipped the weights check: a file that fits nothing of the graph ran the graph's own -------
def test_weights_that_do_not_fit_are_refused_on_a_cache_hit_too(tmp_path, monkeypatch):
    from test_cache import _Counting, _matmul_graph

    from sdrt.errors import WeightsError
    from sdrt.weights import Weights

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    c = _Counting()
    graph = _matmul_graph(np.ones(16))
    assert c.backend.compile(graph, None, c.device).value == 16 and c.compiles == 1  # the graph's own, cached
    other = Weights.from_arrays({"body.0.weight": np.ones((3, 3), np.float32)})  # names nothing of the graph
    with pytest.raises(WeightsError, match="1 missing .*1 unexpected"):
        c.backend.compile(graph, other, c.device, cache=False)  # refused when compiled fresh
    with pytest.raises(WeightsError, match="1 missing .*1 unexpected"):
        c.backend.compile(graph, other, c.device)  # and on the hit (it loaded the graph's own entry)
    assert c.loads == 0
    fits = Weights.from_arrays({"w": np.full((4, 4), 2, np.float32)})
    assert c.backend.compile(graph, fits, c.device).value == 32  # weights that fit: as before


# -- sdrt plan --backend reference said "unknown backend" of a backend `sdrt info` lists ---------------------------
def test_plan_says_why_it_cannot_plan_the_reference_backend(capsys):
    assert main(["plan", str(DATA / "pipelines" / "tiny-sd15"), "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no cost model for the reference backend" in err and "unknown" not in err


# -- an SD 1.x-named file of other shapes: "does not fit this model: it looks like SD 1.x" (it is SD 1.x), three
# times over, cut at 2000 characters mid-name --------------------------------------------------------------------
def test_a_file_with_a_familys_names_and_other_shapes_says_so_once(registry):
    from sdrt import pipelines
    from sdrt.errors import WeightsError

    with pytest.raises(WeightsError) as info:
        pipelines.load(DATA / "ckpt" / "sd1" / "ldm.safetensors", backend="reference")  # the tests' tiny SD 1.x
    what = info.value.what
    assert what.startswith("ldm.safetensors has SD 1.x's tensor names, but does not fit the SD 1.x architecture")
    assert "it looks like" not in what and "this model" not in what and len(what) < 1500
    assert "conv_in.weight [320, 4, 3, 3]" in what and what.endswith("; ...")
    assert "export of its own" in info.value.fix


# -- SDXL's clip skip 2 read the third-to-last layer: A1111 (which leaves SDXL at the penultimate) and Forge
# (minimal_clip_skip 2) read the penultimate for 1 and 2, so a Pony/Illustrious "Clip skip: 2" changed the picture ---
def test_sdxl_clip_skip_counts_from_the_end_as_a1111_and_forge_do(registry):
    from sdrt import pipelines

    pipe = pipelines.load(DATA / "pipelines" / "tiny-sdxl", backend="reference")
    try:
        enc = pipe.prompts.encoders[1]  # CLIP-G (CLIP-L reads the same way)
        images = {n: pipe.generate("a fox", steps=1, seed=1, clip_skip=n).images[0] for n in (1, 2, 3)}
        assert np.array_equal(images[1], images[2])  # both the penultimate layer, the family's own
        assert not np.array_equal(images[2], images[3])
        assert enc._output_for(2) == enc._output_for(1) == (enc._layers()[-2], False)
        assert enc._output_for(3) == (enc._layers()[-3], False)
    finally:
        pipe.close()


# -- read_parameters on the JPEG sdrt generate -o x.jpg wrote: "not a PNG ... give a .png file" --------------------
def test_read_parameters_on_a_jpeg_points_to_its_exif_reader(tmp_path):
    pytest.importorskip("PIL")
    from sdrt.pipelines.png import read_parameters
    from sdrt.pipelines.save import read_user_comment

    out = save_image(tmp_path / "x.jpg", np.zeros((8, 8, 3), np.uint8), "a fox\nSteps: 1")
    with pytest.raises(PngError) as info:
        read_parameters(out)
    assert "a JPEG image" in info.value.what and "read_user_comment" in info.value.fix
    assert read_user_comment(out) == "a fox\nSteps: 1"


# -- --backend OpenVINO: "no backend named 'OpenVINO' ... install the plugin that provides it" of an installed one --
def test_a_backend_name_in_another_case_is_told_its_spelling(registry, capsys):
    import sdrt
    from sdrt.errors import UnknownBackendError

    model = DATA / "pipelines" / "tiny-sd15" / "vae_decoder" / "model.onnx"
    with pytest.raises(UnknownBackendError) as info:
        sdrt.load(model, backend="Reference")
    assert "lower case" in info.value.what and str(info.value).endswith("What to do: pass backend='reference'.")
    assert main(["generate", "a fox", "--backend", "REFERENCE", "-o", "never.png"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --backend 'reference'" in err and "sdrt install" not in err


# -- a prompt past T5's max_sequence_length was cut with no word (diffusers warns) ---------------------------------
def test_a_prompt_t5_cuts_is_said_once(registry, caplog):
    from sdrt import pipelines

    pipe = pipelines.load(DATA / "pipelines" / "tiny-flux-schnell", backend="reference")
    try:
        caplog.clear()
        for _ in range(2):
            pipe.generate("a red fox in the snow (test_fresh_eyes)", steps=1, seed=1, width=64, height=64,
                          max_sequence_length=4)
        cut = [r.getMessage() for r in caplog.records if "T5 tokens" in r.getMessage()]
        assert len(cut) == 1 and "T5 reads 4 (max_sequence_length)" in cut[0] and "cut" in cut[0]
        caplog.clear()
        pipe.generate("a fox", steps=1, seed=1, width=64, height=64, max_sequence_length=32)
        assert not [r for r in caplog.records if "T5 tokens" in r.getMessage()]
    finally:
        pipe.close()


@pytest.mark.parametrize("env,says", [(None, "$SDRT_UPSCALERS is not set"),
                                      ("nope", "$SDRT_UPSCALERS ({}) holds no .safetensors/.pth model upscaler"),
                                      ("upscalers", "model upscalers in $SDRT_UPSCALERS: ")])
def test_an_upscaler_name_not_found_says_what_sdrt_upscalers_holds(tmp_path, capsys, monkeypatch, env, says):
    """``sdrt upscale -m RealESRGAN_x2plus`` said "no upscaler model 'RealESRGAN_x2plus'" whether $SDRT_UPSCALERS was
    unset, named a missing folder or held other models."""
    image = tmp_path / "in.png"
    write_png(image, np.zeros((8, 8, 3), np.uint8))
    folder = {None: None, "nope": str(tmp_path / "nope"), "upscalers": str(DATA / "upscalers")}[env]
    if folder is None:
        monkeypatch.delenv("SDRT_UPSCALERS", raising=False)
    else:
        monkeypatch.setenv("SDRT_UPSCALERS", folder)
    assert main(["upscale", str(image), "-m", "RealESRGAN_x2plus", "-o", str(tmp_path / "out.png")]) == 1
    err = capsys.readouterr().err
    assert "no upscaler model 'RealESRGAN_x2plus'" in err and says.format(folder) in err, err
