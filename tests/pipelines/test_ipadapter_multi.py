"""Several IP-Adapters a run and each adapter's step window, against diffusers.

``scripts/gen_ipadapter_multi_refs.py`` ran diffusers' ``load_ip_adapter`` with lists (the tiny base adapter and the
tiny Plus adapter of tests/data/ipadapter, one image encoder, a picture each) on tiny-sd15 and tiny-sdxl, and switched
adapters off between steps with ``callback_on_step_end`` (``set_ip_adapter_scale`` 0 outside a window), by the
ControlNet pipelines' rule (``window="diffusers"``) or sd-webui-controlnet's (``window="a1111"``).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from pipeline_helpers import assert_matches_diffusers
from test_ipadapter import DATA, FOLDER, IPA, REFS, tiny_encoder_graph  # noqa: F401

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines import IPAdapter

MULTI = np.load(IPA / "multi_refs.npz")
CASES = json.loads((IPA / "multi_refs.json").read_text())
FOLDERS = {"sd15": FOLDER, "sdxl": DATA / "pipelines" / "tiny-sdxl"}
PICTURES = {"a": REFS["ip_image"], "b": MULTI["picture_b"]}


def adapters(case: dict, encoder: object = IPA / "image_encoder") -> list[IPAdapter]:
    return [IPAdapter(IPA / f, image=PICTURES[pic], scale=scale, image_encoder=encoder, start=start, end=end,
                      window=case["window"]) for f, pic, scale, start, end in case["adapters"]]


def kw(case: dict) -> dict:
    return dict(steps=case["steps"], cfg=case["cfg"], sampler="Euler", seed=case["seed"], width=64, height=64)


def run(pipe, case: dict, **more) -> np.ndarray:
    ip = adapters(case)
    return pipe.generate("a photo of a red cat", "blurry", ip_adapter=ip if len(ip) > 1 else ip[0], **kw(case),
                         **more).images


@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_several_adapters_and_their_windows_match_diffusers(family, tiny_encoder_graph):  # noqa: F811
    with pipelines.load(FOLDERS[family], backend="reference") as pipe:
        for case in (c for c in CASES if c["family"] == family):
            assert_matches_diffusers(run(pipe, case), MULTI[case["name"]])


def test_a_window_changes_no_compiled_graph_and_leaves_the_adapter_out(tiny_encoder_graph):  # noqa: F811
    """The window rides on the value inputs (zeros outside it): one compiled UNet for every window and scale;
    without the window the picture is another (the window did something), and a window that holds no step is the
    plain run's picture."""
    case = next(c for c in CASES if c["name"] == "multi/sd15/window/diffusers")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        windowed = run(pipe, case)
        sessions = dict(pipe.unet.sessions)
        whole = pipe.generate("a photo of a red cat", "blurry", ip_adapter=[
            IPAdapter(a.adapter, a.image, a.scale, a.image_encoder) for a in adapters(case)], **kw(case)).images
        assert dict(pipe.unet.sessions).keys() == sessions.keys()  # nothing compiled again
        never = pipe.generate("a photo of a red cat", "blurry", ip_adapter=[
            IPAdapter(a.adapter, a.image, a.scale, a.image_encoder, start=0.0, end=0.0) for a in adapters(case)],
            **kw(case)).images
        plain = pipe.generate("a photo of a red cat", "blurry", **kw(case)).images
    assert_matches_diffusers(windowed, MULTI[case["name"]])
    assert np.abs(windowed[0].astype(int) - whole[0].astype(int)).max() > 20
    assert np.abs(never[0].astype(int) - plain[0].astype(int)).max() <= 1


def test_the_rules_differ_where_the_sources_do():
    """At 5 steps and end 0.5, sd-webui-controlnet keeps step 2 (2/5 <= 0.5) and diffusers' rule does not."""
    from sdrt.pipelines.controlnet import active

    def steps(window: str) -> list[int]:
        unit = IPAdapter("x.safetensors", image=REFS["ip_image"], start=0.0, end=0.5, window=window)
        return [i for i in range(5) if active(unit, i, 5)]

    assert steps("diffusers") == [0, 1]
    assert steps("a1111") == [0, 1, 2]
    case = next(c for c in CASES if c["name"] == "multi/sd15/window/a1111")
    assert [row[0] > 0 for row in case["scales_per_step"]] == [True, True, True, False, False]


def test_adapters_sharing_an_encoder_encode_once_and_the_plan_counts_each_encoder_once(tiny_encoder_graph,  # noqa: F811
                                                                                     tmp_path):
    """Two adapters of one encoder: one image_encoder part, one call holding both pictures and the Plus adapter's
    zero picture; an adapter with another encoder (a copy elsewhere) brings image_encoder_2, which the memory plan
    counts too."""
    case = next(c for c in CASES if c["name"] == "multi/sd15/base+plus")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        rp = pipe.plan("a photo of a red cat", "blurry", ip_adapter=adapters(case), **kw(case))
        encoders = [p for p in rp.parts if p.role == "image_encoder"]
        assert [(p.part, p.calls, p.signatures) for p in encoders] == [
            ("image_encoder", 1, [((("pixel_values", (3, 3, 32, 32), "float32"),), 1)])]
        unet = next(p for p in rp.parts if p.part == "unet")
        feeds = dict((n, s) for n, s, _ in unet.signatures[0][0])
        assert feeds["ip_adapter_1_key"] == (2, 4, 16) and feeds["ip_adapter_1_key_1"] == (2, 16, 16)
        one = rp.memory
        assert [p.part for p in one.parts if p.role == "image_encoder"] == ["image_encoder"]
        shutil.copytree(IPA / "image_encoder", tmp_path / "other_encoder")
        ip = adapters(case)
        ip[1].image_encoder = tmp_path / "other_encoder"
        two = pipe.plan("a photo of a red cat", "blurry", ip_adapter=ip, **kw(case)).memory
        shared = run(pipe, case)
        assert len(pipe.__dict__["_ip_encoders"]) == 1
        got = pipe.generate("a photo of a red cat", "blurry", ip_adapter=ip, **kw(case)).images
        assert len(pipe.__dict__["_ip_encoders"]) == 2  # the copy is compiled and run as an encoder of its own
        run(pipe, case)
        assert len(pipe.__dict__["_ip_encoders"]) == 1  # an encoder no adapter reads any more is closed
    placed = {p.part: p for p in two.parts if p.role == "image_encoder"}
    assert sorted(placed) == ["image_encoder", "image_encoder_2"]
    assert placed["image_encoder"].weight_bytes == placed["image_encoder_2"].weight_bytes > 0
    assert sum(p.weight_bytes for p in two.parts) - sum(p.weight_bytes for p in one.parts) == \
        placed["image_encoder_2"].weight_bytes
    assert_matches_diffusers(shared, MULTI[case["name"]])
    assert_matches_diffusers(got, MULTI[case["name"]])


def test_the_infotext_has_one_controlnet_entry_per_adapter_with_its_window(tiny_encoder_graph):  # noqa: F811
    case = next(c for c in CASES if c["name"] == "multi/sd15/window/a1111")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        gen = pipe.generate("a photo of a red cat", "blurry", ip_adapter=adapters(case), **kw(case))
    from sdrt.pipelines.png import format_parameters

    info = format_parameters(gen.prompt, gen.negative_prompt, gen.settings[0])
    assert ('ControlNet 0: "Module: ip-adapter_clip_sd15, Model: ip-adapter_tiny, Weight: 0.9, Resize Mode: Crop and '
            'Resize, Processor Res: 512, Guidance Start: 0, Guidance End: 0.5, Pixel Perfect: False, Control Mode: '
            'Balanced"') in info, info
    assert ('ControlNet 1: "Module: ip-adapter_clip_sd15, Model: ip-adapter-plus_tiny, Weight: 0.8, Resize Mode: '
            'Crop and Resize, Processor Res: 512, Guidance Start: 0.3, Guidance End: 1,') in info, info


@pytest.mark.parametrize("value, where, words", [
    ([IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"]), 5], "ip_adapter[1]",
     "ip_adapter[1] must be an IPAdapter"),
    (IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"], start=0.6, end=0.4), "ip_adapter_start",
     "starts at 0.6, after its end 0.4"),
    (IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"], end=1.5), "ip_adapter_end",
     "end must be a number from 0 to 1"),
    ([IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"]),
      IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"], scale="x")], "ip_adapter[1] scale",
     "scale must be a number"),
    (IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"], window="comfy"), "ip_adapter",
     "is not a step window rule"),
])
def test_bad_adapters_are_refused_naming_which(value, where, words):
    from sdrt.pipelines.ipadapter import parse

    with pytest.raises(InputError, match=words.replace("[", r"\[").replace("]", r"\]")) as info:
        parse(value)
    assert info.value.where == where


def test_one_adapter_tuple_and_lists_of_them_are_read():
    from sdrt.pipelines.ipadapter import parse

    one = parse((IPA / "ip-adapter_tiny.safetensors", REFS["ip_image"], 0.5))
    assert len(one) == 1 and one[0].scale == 0.5
    two = parse([(IPA / "ip-adapter_tiny.safetensors", REFS["ip_image"]),
                 IPAdapter(IPA / "ip-adapter-plus_tiny.safetensors", image=REFS["ip_image"], end=0.5)])
    assert [u.end for u in two] == [1.0, 0.5]
    assert parse([]) == [] and parse(None) == []


def test_generate_cli_takes_several_adapters_and_windows(tiny_encoder_graph, tmp_path, capsys):  # noqa: F811
    from PIL import Image

    from sdrt.cli import main

    case = next(c for c in CASES if c["name"] == "multi/sd15/window/diffusers")
    flags = []
    for f, pic, scale, start, end in case["adapters"]:
        path = tmp_path / f"{pic}.png"
        Image.fromarray(PICTURES[pic]).save(path)
        flags += ["--ip-adapter", str(IPA / f), "--ip-adapter-image", str(path), "--ip-adapter-scale", str(scale),
                  "--ip-adapter-start", str(start), "--ip-adapter-end", str(end)]
    out = tmp_path / "out.png"
    rc = main(["generate", str(FOLDER), "a photo of a red cat", "--negative", "blurry", "--steps", str(case["steps"]),
               "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler", "Euler", "--width", "64",
               "--height", "64", "--backend", "reference", "-o", str(out), "--image-encoder",
               str(IPA / "image_encoder"), *flags])
    assert rc == 0, capsys.readouterr().err
    with Image.open(out) as img:
        assert_matches_diffusers([np.asarray(img.convert("RGB"))], MULTI[case["name"]])
        text = img.text["parameters"]
    assert "Guidance Start: 0.5, Guidance End: 1" in text and "ControlNet 1:" in text, text


@pytest.mark.parametrize("flags, words", [
    (["--ip-adapter", "A", "--ip-adapter", "A", "--ip-adapter-image", "PICTURE", "--ip-adapter-image", "PICTURE",
      "--ip-adapter-image", "PICTURE"], "3 --ip-adapter-image for 2 --ip-adapter"),
    (["--ip-adapter", "A", "--ip-adapter", "A", "--ip-adapter-image", "PICTURE"], "1 --ip-adapter-image for 2"),
    (["--ip-adapter", "A", "--ip-adapter", "A", "--ip-adapter-image", "PICTURE", "--ip-adapter-image", "PICTURE",
      "--ip-adapter-scale", "0.5", "--ip-adapter-scale", "0.5", "--ip-adapter-scale", "0.5"],
     "3 --ip-adapter-scale values for 2 --ip-adapter"),
    (["--ip-adapter", "A", "--ip-adapter-image", "PICTURE", "--ip-adapter-start", "0.7", "--ip-adapter-end", "0.2"],
     "--ip-adapter-start"),
    (["--ip-adapter", "A", "--ip-adapter", "A", "--ip-adapter-image", "PICTURE", "--ip-adapter-image", "PICTURE",
      "--ip-adapter-end", "1", "--ip-adapter-end", "2"], "the 2nd --ip-adapter-end"),
    (["--ip-adapter-end", "0.5"], "--ip-adapter-end without --ip-adapter"),
    # flags given once are every adapter's: the error says so, not "the 1st --ip-adapter-start" (none was given so;
    # until 2026-12-01 it did)
    (["--ip-adapter", "A", "--ip-adapter", "A", "--ip-adapter-image", "PICTURE", "--ip-adapter-image", "PICTURE",
      "--ip-adapter-start", "0.7", "--ip-adapter-end", "0.2"],
     "Where: --ip-adapter-start (given once: every adapter's)"),
])
def test_generate_cli_ip_adapter_counts_are_checked_in_flags(tiny_encoder_graph, tmp_path, capsys, flags,  # noqa: F811
                                                            words):
    from PIL import Image

    from sdrt.cli import main

    picture = tmp_path / "face.png"
    Image.fromarray(REFS["ip_image"]).save(picture)
    sub = {"PICTURE": str(picture), "A": str(IPA / "ip-adapter_tiny.safetensors")}
    rc = main(["generate", str(FOLDER), "a cat", "--steps", "1", "--backend", "reference", "-o",
               str(tmp_path / "o.png"), *[sub.get(f, f) for f in flags]])
    err = capsys.readouterr().err
    assert rc != 0
    assert words in err, err
    assert "Traceback" not in err and len([line for line in err.splitlines() if line.startswith("error")]) == 1, err


def test_the_shipped_sdxl_unet_graph_takes_three_adapters_with_their_own_token_counts():
    """The full-size SDXL UNet graph (70 cross-attention layers, initializers named): three adapters give each
    layer three key/value input pairs, the first named as for one adapter, the others suffixed, each adapter with
    its own token dimension (a base adapter's 4 beside a Plus one's 16), and 11 nodes a layer per further adapter."""
    import onnx

    from sdrt.checkpoint import shipped_graph
    from sdrt.checkpoint.ipattention import ip_attention_graph, layer_widths

    model = onnx.load(str(shipped_graph("sdxl_unet")), load_external_data=False)
    before = len(model.graph.node)
    ip_attention_graph(model, lambda width: -1, "sdxl_unet", adapters=3)
    widths = layer_widths(model)
    assert len(widths) == 70
    dims = {}
    for i in model.graph.input:
        if i.name.startswith("ip_adapter_"):
            dims[i.name] = i.type.tensor_type.shape.dim[1].dim_param
    assert len(dims) == 70 * 2 * 3
    assert {dims["ip_adapter_1_key"], dims["ip_adapter_1_value_1"], dims["ip_adapter_139_key_2"]} == {
        "ip_tokens", "ip_tokens_1", "ip_tokens_2"}
    assert len(model.graph.node) == before + (16 + 2 * 11) * 70


def test_the_hires_fix_with_its_own_prompt_keeps_the_adapters(tiny_encoder_graph):  # noqa: F811
    """The second pass of a hires fix with its own prompt (A1111's hr_prompt: conditioning of its own) reads the
    adapters' image inputs too; it was given the text alone, and the UNet with IP attention lacked its inputs."""
    ips = [IPAdapter(IPA / "ip-adapter_tiny_sdxl.safetensors", image=REFS["ip_image"], scale=0.7,
                     image_encoder=IPA / "image_encoder"),
           IPAdapter(IPA / "ip-adapter-plus_tiny_sdxl.safetensors", image=MULTI["picture_b"], scale=0.8,
                     image_encoder=IPA / "image_encoder", start=0.5)]
    hires = dict(steps=2, sampler="Euler", seed=1, width=64, height=64, hires_scale=1.5, hires_steps=2,
                 hires_denoise=0.6, hires_prompt="a blue cat")
    with pipelines.load(DATA / "pipelines" / "tiny-sdxl-dyn", backend="reference") as pipe:
        rp = pipe.plan("a red cat", "blurry", ip_adapter=ips, **hires)
        unet = next(p for p in rp.parts if p.part == "unet")
        assert len(unet.signatures) == 2
        for sig, _ in unet.signatures:
            feeds = dict((n, s) for n, s, _ in sig)
            assert feeds["ip_adapter_1_key"][:2] == (2, 4) and feeds["ip_adapter_1_key_1"][:2] == (2, 16), feeds
        got = pipe.generate("a red cat", "blurry", ip_adapter=ips, **hires).images[0]
        plain = pipe.generate("a red cat", "blurry", **hires).images[0]
    assert got.shape == (96, 96, 3) and np.abs(got.astype(int) - plain.astype(int)).max() > 20


def test_a_refused_adapter_or_encoder_of_several_is_named_in_the_fix_too(tiny_encoder_graph, tmp_path):  # noqa: F811
    """The second of two adapters made for another model, or given an encoder that is none: the message's "what to
    do" names that adapter's own argument (``ip_adapter[1]``, which the CLI and serve say in their words), not the
    single adapter's ``ip_adapter`` / ``image_encoder``; until 2026-12-01 serve answered "pass ip_adapter ..."."""
    from sdrt.errors import ModelError

    good = IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"], image_encoder=IPA / "image_encoder")
    xl = IPAdapter(IPA / "ip-adapter_tiny_sdxl.safetensors", image=REFS["ip_image"], image_encoder=IPA / "image_encoder")
    (tmp_path / "empty").mkdir()
    no_encoder = IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"], image_encoder=tmp_path / "empty")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        for second, where in ((xl, "ip_adapter[1]"), (no_encoder, "ip_adapter[1] image_encoder")):
            with pytest.raises(ModelError) as info:
                pipe.generate("a cat", ip_adapter=[good, second], steps=1, width=64, height=64)
            assert info.value.where == where
            assert f"pass {where} " in info.value.fix, info.value.fix
            assert "{@" not in info.value.fix, info.value.fix


@pytest.mark.parametrize("low_memory", [False, True])
def test_an_image_encoder_written_anew_at_its_path_is_read_anew(tiny_encoder_graph, tmp_path, low_memory):  # noqa: F811
    """The next job names the same encoder folder, whose model.safetensors was written over with other weights in
    between: the adapter reads the new encoder's embeds, as a fresh pipeline does. Until 2026-12-01 the pipeline
    kept the encoder part by its graph and folder, with the first file's weights (released in low-memory mode, it
    then read the first header over the new file's bytes)."""
    from sdrt.weights import Weights

    enc = tmp_path / "image_encoder"
    shutil.copytree(IPA / "image_encoder", enc)
    w = Weights.open(IPA / "image_encoder" / "model.safetensors")
    other = {k: np.asarray(w.get_array(k)) for k in w.shapes()}
    other["visual_projection.weight"] = other["visual_projection.weight"][::-1].copy()  # other embeds, same shapes
    ip = IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"], scale=1.0, image_encoder=enc)
    kw = dict(steps=2, sampler="Euler", seed=5, width=64, height=64)
    with pipelines.load(FOLDER, backend="reference", low_memory=low_memory) as pipe:
        first = pipe.generate("a cat", ip_adapter=ip, **kw).images[0]
        Weights.from_arrays(other).save(tmp_path / "new.safetensors")
        shutil.copy(tmp_path / "new.safetensors", enc / "model.safetensors")  # written over in place
        second = pipe.generate("a cat", ip_adapter=ip, **kw).images[0]
    with pipelines.load(FOLDER, backend="reference", low_memory=low_memory) as pipe:
        want = pipe.generate("a cat", ip_adapter=ip, **kw).images[0]
    assert np.abs(first.astype(int) - want.astype(int)).max() > 0  # the two encoders differ
    assert np.array_equal(second, want)


def test_generate_help_says_the_picture_flag_is_one_per_adapter(capsys):
    """The help's IP-Adapter group says what the count check does: --ip-adapter-image once per adapter (given once
    for two adapters it is refused), the other flags once or once per adapter. Until 2026-12-01 it said a flag given
    once was every adapter's, which --ip-adapter-image is not."""
    from sdrt.cli import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one --ip-adapter-image per adapter" in text, text
    assert "a flag given once is every adapter's" not in text
