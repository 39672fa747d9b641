"""T2I-Adapters (sdrt.pipelines.t2iadapter, sdrt.checkpoint.adapterresiduals) against diffusers' adapter pipelines.

Fixtures: tests/data/pipelines/tiny-{sd15,sdxl}-t2ia (scripts/gen_t2ia_refs.py): tiny pipelines whose UNets have the
real block layout, TencentARC-format ``.pth`` adapters (full 1-channel, light), a diffusers ``T2IAdapter`` folder and
its safetensors alone, and ``StableDiffusionAdapterPipeline`` / ``StableDiffusionXLAdapterPipeline`` images.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, register

from sdrt import pipelines
from sdrt.errors import InputError, ModelError
from sdrt.pipelines.controlnet import ControlNet

FOLDERS = ["tiny-sd15-t2ia", "tiny-sdxl-t2ia"]
BACKENDS = ["reference", "openvino", "ggml"]


def _cases(folder: str) -> list[dict]:
    return json.loads((DATA / folder / "refs.json").read_text())


def _load(folder: str, backend: str):
    # float32 on every backend: the references are float32, and the default bf16 of OpenVINO / ggml on CPUs that
    # have it moves these deep tiny UNets by tens of levels with or without an adapter
    return pipelines.load(DATA / folder, backend=backend, **({} if backend == "reference" else {"precision": "fp32"}))


def _run(pipe, folder: str, case: dict, z, **unit) -> np.ndarray:
    u = ControlNet(str(DATA / folder / case["adapter"]), z[case["image"]], case["scale"], case.get("start", 0.0), case["end"],
                  **unit)
    return pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                         sampler=case["sampler"], seed=case["seed"], width=case["width"], height=case["height"],
                         controlnets=[u]).images[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("folder", FOLDERS)
def test_adapter_images_equal_diffusers(folder: str, backend: str) -> None:
    """Each adapter file layout (original .pth full and light, diffusers folder and single safetensors), its
    conditioning scale and (SDXL) ``adapter_conditioning_factor`` as the unit's end: within 1 level of diffusers."""
    register(backend)
    z = np.load(DATA / folder / "refs.npz")
    worst = {}
    with _load(folder, backend) as pipe:
        for case in _cases(folder):
            d = np.abs(_run(pipe, folder, case, z).astype(int) - z[case["name"]][0].astype(int))
            worst[case["name"]] = (int(d.max()), float((d > 0).mean()))
    assert all(m <= 1 for m, _ in worst.values()), worst
    assert all(share < 0.005 for _, share in worst.values()), worst


def test_adapter_scale_window_and_modes_have_teeth() -> None:
    """The scale, the window, the soft injection and the cfg injection each change the image; scale 0 is the plain
    model's image."""
    register("reference")
    folder = "tiny-sd15-t2ia"
    z = np.load(DATA / folder / "refs.npz")
    case = _cases(folder)[0]
    with _load(folder, "reference") as pipe:
        want = z[case["name"]][0].astype(int)
        plain = pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                              sampler=case["sampler"], seed=case["seed"], width=64, height=64).images[0]
        zero = _run(pipe, folder, dict(case, scale=0.0), z)
        assert np.abs(zero.astype(int) - plain).max() <= 1
        assert np.abs(plain.astype(int) - want).max() > 20
        half = _run(pipe, folder, dict(case, start=0.5), z)  # (SDXL's end: the factor 0.25 reference)
        assert np.abs(half.astype(int) - want).max() > 5
        soft = _run(pipe, folder, case, z, control_mode="My prompt is more important")
        assert np.abs(soft.astype(int) - want).max() > 5
        cfg = _run(pipe, folder, case, z, control_mode="ControlNet is more important")
        assert np.abs(cfg.astype(int) - soft).max() > 5


def test_feature_scales_follow_the_extension() -> None:
    from sdrt.pipelines.t2iadapter import feature_scales

    unit = ControlNet("x", None, 0.8)
    assert feature_scales(unit) == [0.8] * 4
    assert feature_scales(unit, hires=True) == [0.8] * 4  # soft in the hires pass only for canny / mlsd
    unit.preprocessor = "canny"
    assert feature_scales(unit, hires=True) == pytest.approx([0.8 * s for s in (0.25, 0.62, 0.825, 1.0)])
    unit.preprocessor, unit.control_mode = "none", "My prompt is more important"
    assert feature_scales(unit) == pytest.approx([0.2, 0.496, 0.66, 0.8])


# ------------------------------------------------------------------ files
def test_full_size_architectures_are_recognised() -> None:
    """The full-size adapters' keys and shapes (written by the script from diffusers' T2IAdapter, in TencentARC's and
    diffusers' names) give the layout of the real files."""
    from sdrt.pipelines.t2iadapter import AdapterNet, is_adapter

    made = json.loads((DATA / "tiny-sd15-t2ia" / "full_size.json").read_text())
    assert len(made) == 8
    for name, spec in made.items():
        shapes = {k: tuple(v) for k, v in spec["keys"].items()}
        assert is_adapter(list(shapes)), name
        lay = AdapterNet.layout_of(shapes, name)
        assert (lay.kind, lay.in_channels, list(lay.channels)) == (spec["kind"], spec["in_channels"],
                                                                    spec["channels"]), name
        assert lay.channels == (320, 640, 1280, 1280)
        bad = dict(shapes)
        key = next(k for k in bad if k.endswith("block1.weight"))
        bad[key] = (1, 1, 3, 3)
        with pytest.raises(ModelError, match="not a T2I-Adapter's"):
            AdapterNet.layout_of(bad, name)
        del bad[key]
        with pytest.raises(ModelError, match="is not a T2I-Adapter"):
            AdapterNet.layout_of(bad, name)


def test_adapter_files_are_told_from_controlnets() -> None:
    from sdrt.pipelines.t2iadapter import adapter_file

    assert adapter_file(str(DATA / "tiny-sd15-t2ia" / "t2iadapter_canny_tiny.pth")) is not None
    assert adapter_file(DATA / "tiny-sdxl-t2ia" / "t2i-adapter-tiny-sdxl") is not None
    assert adapter_file(str(DATA / "tiny-sd15-controlnet" / "controlnet")) is None
    assert adapter_file("controlnet") is None


def test_truncated_and_wrong_files_are_one_line(tmp_path: Path) -> None:
    from sdrt.pipelines.t2iadapter import open_adapter

    src = DATA / "tiny-sdxl-t2ia" / "t2i-adapter_diffusers_xl_tiny.safetensors"
    cut = tmp_path / "t2i-adapter_cut.safetensors"
    cut.write_bytes(src.read_bytes()[:5000])
    with pytest.raises(ModelError) as e:
        open_adapter(cut)
    assert "\n" not in str(e.value) and "t2i-adapter_cut.safetensors" in str(e.value)
    with pytest.raises(ModelError, match="holds no diffusion_pytorch_model"):
        open_adapter(tmp_path)
    # as a unit's net: named by the unit, before the model's UNet is asked for ControlNet inputs it lacks
    cut_pth = tmp_path / "t2iadapter_cut.pth"
    cut_pth.write_bytes((DATA / "tiny-sd15-t2ia" / "t2iadapter_canny_tiny.pth").read_bytes()[:30000])
    register("reference")
    with _load("tiny-sd15-t2ia", "reference") as pipe, pytest.raises(ModelError) as e:
        pipe.generate("a cat", steps=2, width=64, height=64,
                      controlnets=[ControlNet(str(cut_pth), np.zeros((64, 64, 3), np.uint8))])
    assert str(e.value).startswith(f"{cut_pth} could not be read") and "controlnets[0]" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("folder", "adapter", "said"), [
    ("tiny-sd15-t2ia", "tiny-sdxl-t2ia/t2i-adapter-tiny-sdxl", "is an SDXL T2I-Adapter, and the model is"),
    ("tiny-sdxl-t2ia", "tiny-sd15-t2ia/t2iadapter_canny_tiny.pth", "is an SD 1.x T2I-Adapter, and the model is"),
])
def test_an_adapter_for_another_base_is_refused(folder: str, adapter: str, said: str) -> None:
    register("reference")
    with _load(folder, "reference") as pipe, pytest.raises(InputError, match=said) as e:
        pipe.generate("a cat", steps=2, width=64, height=64,
                      controlnets=[ControlNet(str(DATA / adapter), np.zeros((64, 64, 3), np.uint8))])
    assert "controlnets[0]" in str(e.value) and "\n" not in str(e.value)


def test_guess_mode_is_refused_for_an_adapter() -> None:
    """The pipeline's guess_mode puts every unit in guess mode: with an adapter unit it is refused, and the fix names
    the unit's own guess_mode, which a ControlNet unit beside the adapter takes."""
    register("reference")
    with _load("tiny-sd15-t2ia", "reference") as pipe, pytest.raises(InputError, match="guess_mode") as e:
        pipe.generate("a cat", steps=2, width=64, height=64, guess_mode=True, controlnets=[
            ControlNet(str(DATA / "tiny-sd15-t2ia" / "t2iadapter_canny_tiny.pth"), np.zeros((64, 64, 3), np.uint8))])
    assert "controlnets[0] is a T2I-Adapter" in str(e.value) and "ControlNet units' own guess_mode" in str(e.value)
    with _load("tiny-sd15-t2ia", "reference") as pipe, pytest.raises(InputError) as e:  # the unit's own
        pipe.generate("a cat", steps=2, width=64, height=64, controlnets=[
            ControlNet(str(DATA / "tiny-sd15-t2ia" / "t2iadapter_canny_tiny.pth"), np.zeros((64, 64, 3), np.uint8),
                       guess_mode=True)])
    assert "Where: controlnets[0] guess_mode" in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------ the graph edit
@pytest.mark.parametrize(("graph", "layout", "skips"), [
    ("sd1_unet", "sd", 12), ("sd1_unet_controlnet", "sd", 12), ("sd2_unet", "sd", 12), ("sdxl_unet", "sdxl", 9),
    ("sdxl_unet_controlnet", "sdxl", 9)])
def test_shipped_unet_graphs_take_the_features(graph: str, layout: str, skips: int) -> None:
    """sdrt's own single-file UNet graphs (and their ControlNet twins, whose skips go through the residual Adds) are
    edited by structure: four inputs, each added once, every former reader of the skip reading the sum."""
    import onnx

    from sdrt.checkpoint.adapterresiduals import adapter_graph, skip_tensors
    from sdrt.checkpoint.graphs import shipped_graph

    model = onnx.load(str(shipped_graph(graph)), load_external_data=False)
    found, _, _ = skip_tensors(model, graph)
    assert len(found) == skips and len(set(found)) == skips
    adapter_graph(model, layout, graph)
    names = [f"t2i_adapter_residual_{k}" for k in range(4)]
    assert [i.name for i in model.graph.input][-4:] == names
    adds = [n for n in model.graph.node if any(x in names for x in n.input)]
    assert len(adds) == 4 and all(n.op_type == "Add" for n in adds)
    seen = set()
    for n in model.graph.node:  # topological order kept
        assert all(x in seen or x in {i.name for i in model.graph.input} or x == "" or
                   x in {t.name for t in model.graph.initializer} for x in n.input), n.name
        seen.update(n.output)


def test_a_unet_of_another_layout_is_refused() -> None:
    import onnx

    from sdrt.checkpoint.adapterresiduals import adapter_graph
    from sdrt.checkpoint.graphs import shipped_graph

    model = onnx.load(str(shipped_graph("sdxl_refiner_unet")), load_external_data=False)
    with pytest.raises(ModelError, match="reads 12 skip connections, and a SDXL UNet has 9"):
        adapter_graph(model, "sdxl", "refiner")


# ------------------------------------------------------------------ CLI
def test_cli_controlnet_flag_takes_an_adapter(tmp_path: Path, capsys) -> None:
    from sdrt.cli import main
    from sdrt.pipelines.png import read_parameters, write_png

    backend = "reference"  # (the CLI has no precision flag: OpenVINO's default bf16 would move this deep tiny UNet)
    register(backend)
    folder = "tiny-sdxl-t2ia"
    z = np.load(DATA / folder / "refs.npz")
    case = next(c for c in _cases(folder) if c["name"] == "xl/factor 0.25")
    png = tmp_path / "colors.png"
    write_png(png, z[case["image"]])
    out = tmp_path / "t2ia.png"
    args = ["generate", str(DATA / folder), case["prompt"], "--negative", case["negative_prompt"], "--steps", "8",
            "--sampler", "Euler", "--seed", str(case["seed"]), "--backend", backend, "-o", str(out),
            "--control-image", str(png), "--controlnet", str(DATA / folder / case["adapter"]),
            "--control-scale", str(case["scale"]), "--control-end", str(case["end"])]
    assert main(args) == 0, capsys.readouterr().err
    pil = pytest.importorskip("PIL.Image")
    with pil.open(out) as img:
        pixels = np.asarray(img.convert("RGB"))
    assert np.abs(pixels.astype(int) - z[case["name"]][0]).max() <= 1
    text = read_parameters(out)
    assert 'ControlNet 0: "Module: none, Model: t2i-adapter_diffusers_xl_tiny, Weight: 0.9,' in text


# ------------------------------------------------------------------ t2ia_sketch_pidi
def test_sketch_map_is_pidinets_edge_above_a_half(tmp_path: Path) -> None:
    """The extension's ``t2ia_sketch_pidi`` (``apply_pidinet(apply_fliter=True)``): 255 where PiDiNet's edge is above
    0.5, else 0; against torch's edge of the same padded input (tests/data/softedge, scripts/ref_softedge.py)."""
    from softedge_helpers import write_pidi

    from sdrt.pipelines import hedmaps, pidimaps, preprocessors

    register("reference")
    refs = np.load(DATA.parent / "softedge" / "refs.npz")
    x = refs["input/40"]
    size = refs["map/softedge_pidinet/40"].shape
    with pidimaps.PiDiNet(write_pidi(tmp_path / "pidinet"), backend="reference") as net:
        made = hedmaps.detect(x, net, "sketch", size)
    want = np.where(refs["pidi_edge/40"] > 0.5, 255, 0).astype(np.uint8)[:size[0], :size[1]]
    assert set(np.unique(made)) <= {0, 255} and 0.02 < (want > 0).mean() < 0.98
    assert (made[:, :, 0] != want).mean() <= 0.002
    assert preprocessors.SOFTEDGE["t2ia_sketch_pidi"] == ("pidinet", "sketch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_features_at_odd_level_sizes_equal_diffusers(backend: str) -> None:
    """At 80 x 48 the levels halve to odd sizes, where the adapters' average pools round up (PyTorch's
    ``ceil_mode=True``, dividing by the pixels inside): each feature equals diffusers' to float32 rounding."""
    from sdrt.pipelines.t2iadapter import open_adapter

    register(backend)
    z = np.load(DATA / "tiny-sd15-t2ia" / "odd_features.npz")
    x = z["input"]
    for name, path in (("t2iadapter_canny_tiny.pth", "tiny-sd15-t2ia/t2iadapter_canny_tiny.pth"),
                       ("t2iadapter_color_tiny.pth", "tiny-sd15-t2ia/t2iadapter_color_tiny.pth"),
                       ("xl", "tiny-sdxl-t2ia/t2i-adapter-tiny-sdxl")):
        with open_adapter(DATA / path, backend=backend) as net:
            feats = net.features(x)
        for k, f in enumerate(feats):
            want = z[f"{name}/{k}"]
            assert f.shape == want.shape, (name, k, f.shape, want.shape)
            np.testing.assert_allclose(f, want, atol=2e-4 * max(1.0, float(np.abs(want).max())), err_msg=f"{name} {k}")


def test_the_style_adapter_is_refused_in_one_line(tmp_path: Path) -> None:
    """``t2iadapter_style_sd14v1.pth`` (CLIP vision tokens, not a control map) given with another preprocessor than
    ``t2ia_style_clipvision`` is told apart and refused, naming the preprocessor it runs with
    (sdrt.pipelines.styleadapter)."""
    from safetensors.numpy import save_file

    f = tmp_path / "t2iadapter_style_sd14v1.safetensors"
    save_file({"style_embedding": np.zeros((1, 8, 16), np.float32), "proj": np.zeros((16, 8), np.float32),
               "ln_pre.weight": np.ones(16, np.float32)}, str(f))
    register("reference")
    with _load("tiny-sd15-t2ia", "reference") as pipe, pytest.raises(ModelError) as e:
        pipe.generate("a cat", steps=2, width=64, height=64,
                      controlnets=[ControlNet(str(f), np.zeros((64, 64, 3), np.uint8))])
    assert "is the style T2I-Adapter" in str(e.value) and "controlnets[0]" in str(e.value)
    assert "t2ia_style_clipvision" in str(e.value) and "does not run" not in str(e.value)
    assert "\n" not in str(e.value)


def test_sdxl_adapter_in_the_original_names_gives_the_same_features(tmp_path: Path) -> None:
    """TencentARC's SDXL adapters as the extension reads them (``body.{level * 2 + j}``, ``in_conv`` on each level's
    first resnet) give the features of the same weights in diffusers' names (checked against diffusers above)."""
    from safetensors.numpy import load_file, save_file

    from sdrt.pipelines.t2iadapter import open_adapter

    register("reference")
    src = DATA / "tiny-sdxl-t2ia" / "t2i-adapter_diffusers_xl_tiny.safetensors"
    renamed = {}
    for k, v in load_file(str(src)).items():
        p = k.split(".")
        if p[1] == "conv_in":
            renamed[".".join(p[1:])] = v
        elif p[3] == "resnets":
            renamed[f"body.{int(p[2]) * 2 + int(p[4])}.{'.'.join(p[5:])}"] = v
        else:
            renamed[f"body.{int(p[2]) * 2}.{'.'.join(p[3:])}"] = v
    f = tmp_path / "t2i-adapter_xl_tiny.safetensors"
    save_file(renamed, str(f))
    x = np.random.default_rng(1).random((1, 3, 64, 96)).astype(np.float32)
    with open_adapter(src, backend="reference") as a, open_adapter(f, backend="reference") as b:
        assert b.layout == a.layout and a.layout.kind == "full_xl"
        for fa, fb in zip(a.features(x), b.features(x)):
            np.testing.assert_array_equal(fa, fb)


def test_low_memory_releases_the_adapter_once_its_features_are_made() -> None:
    """In low-memory mode only the running part is loaded: the adapter's compiled graph is closed once it has made
    its features (before the denoising), and the next run compiles it again; otherwise it is kept between runs."""
    register("reference")
    folder = "tiny-sd15-t2ia"
    z = np.load(DATA / folder / "refs.npz")
    case = _cases(folder)[0]
    for low, held in ((True, 0), (False, 1)):
        with pipelines.load(DATA / folder, backend="reference", low_memory=low) as pipe:
            image = _run(pipe, folder, case, z)
            nets = list(pipe.__dict__.get("_t2i_nets", {}).values())
            assert len(nets) == 1 and len(nets[0]._sessions) == held, (low, len(nets[0]._sessions))
            assert np.abs(image.astype(int) - z[case["name"]][0]).max() <= 1


def test_several_adapter_units_add_their_weighted_features() -> None:
    """diffusers' ``MultiAdapter`` (and the extension's ``total_t2i_adapter_embedding``) add each adapter's features
    times its weight: the same adapter as two units at 0.4 and 0.6 gives the one unit at 1.0 (diffusers' image),
    and a second, different adapter changes the image."""
    register("reference")
    folder = "tiny-sd15-t2ia"
    z = np.load(DATA / folder / "refs.npz")
    case = _cases(folder)[0]
    path = str(DATA / folder / case["adapter"])
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
              height=case["height"])
    with _load(folder, "reference") as pipe:
        two = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[
            ControlNet(path, z[case["image"]], 0.4), ControlNet(path, z[case["image"]], 0.6)], **kw).images[0]
        assert np.abs(two.astype(int) - z[case["name"]][0]).max() <= 1
        light = str(DATA / folder / "t2iadapter_color_tiny.pth")
        both = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[
            ControlNet(path, z[case["image"]], 1.0), ControlNet(light, z["colors"], 1.0)], **kw).images[0]
        assert np.abs(both.astype(int) - z[case["name"]][0]).max() > 5


def test_only_the_jobs_adapters_stay_compiled(tmp_path: Path) -> None:
    """The adapters a job uses are kept for the next job; one the job does not use (another file, or the same path
    written anew) is closed and let go, as the IP-Adapters' image encoders are: a server cycling through adapter
    files holds one set at a time."""
    import shutil

    register("reference")
    folder = "tiny-sd15-t2ia"
    img = np.zeros((64, 64, 3), np.uint8)
    canny = tmp_path / "t2iadapter_canny_tiny.pth"
    shutil.copy(DATA / folder / "t2iadapter_canny_tiny.pth", canny)
    light = str(DATA / folder / "t2iadapter_color_tiny.pth")
    with _load(folder, "reference") as pipe:
        pipe.generate("a cat", steps=1, width=64, height=64, controlnets=[ControlNet(str(canny), img)])
        first = list(pipe.__dict__["_t2i_nets"].values())
        pipe.generate("a cat", steps=1, width=64, height=64, controlnets=[ControlNet(str(canny), img)])
        assert list(pipe.__dict__["_t2i_nets"].values()) == first and len(first[0]._sessions) == 1  # kept
        pipe.generate("a cat", steps=1, width=64, height=64, controlnets=[ControlNet(light, img)])
        nets = list(pipe.__dict__["_t2i_nets"].values())
        assert len(nets) == 1 and nets[0] is not first[0] and not first[0]._sessions
        canny.write_bytes(canny.read_bytes())  # the same path written anew: a new net, the old one closed
        pipe.generate("a cat", steps=1, width=64, height=64, controlnets=[ControlNet(str(canny), img),
                                                                          ControlNet(light, img)])
        assert len(pipe.__dict__["_t2i_nets"]) == 2
        pipe.generate("a cat", steps=1, width=64, height=64)  # no adapter: none held
        assert not pipe.__dict__["_t2i_nets"] and not nets[0]._sessions


def _any_size_copy(tmp_path: Path) -> Path:
    """The tiny SD 1.x folder with its UNet's and VAE's image dimensions made symbolic (the graphs are convolutional
    and read their sizes at run time), so that a hires pass at twice the size runs."""
    import shutil

    import onnx

    out = tmp_path / "tiny-sd15-t2ia-any"
    shutil.copytree(DATA / "tiny-sd15-t2ia", out)
    for part in ("unet", "vae_decoder", "vae_encoder"):
        path = out / part / "model.onnx"
        model = onnx.load(str(path), load_external_data=False)
        for vi in [*model.graph.input, *model.graph.output]:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == 4:
                dims[2].dim_param, dims[3].dim_param = "H", "W"
        del model.graph.value_info[:]
        onnx.save(model, str(path))
    return out


def test_the_hires_pass_makes_features_at_its_size_and_reads_hr_option(tmp_path: Path) -> None:
    """The hires fix's second pass (128x128 after 64x64) feeds features made from the map at its own size; a unit
    for the high-res pass only moves the image, and one for the low-res pass only is not fed there."""
    register("reference")
    z = np.load(DATA / "tiny-sd15-t2ia" / "refs.npz")
    path = str(DATA / "tiny-sd15-t2ia" / "t2iadapter_canny_tiny.pth")
    kw = dict(steps=4, seed=3, width=64, height=64, sampler="Euler", hires_scale=2.0, hires_steps=8,
              hires_denoise=0.9)
    with pipelines.load(_any_size_copy(tmp_path), backend="reference") as pipe:
        def run(*units):
            return pipe.generate("a cat", "ugly", controlnets=list(units), **kw).images[0].astype(int)

        none = run()
        assert none.shape == (128, 128, 3)
        high = run(ControlNet(path, z["edges"], hr_option="High res only"))
        both = run(ControlNet(path, z["edges"]))
        low = run(ControlNet(path, z["edges"], hr_option="Low res only"))
    assert np.abs(high - none).max() > 5 and np.abs(both - low).max() > 5


def test_an_adapter_given_as_the_model_says_where_it_goes(capsys) -> None:
    """A T2I-Adapter file given as the model (the CLI's MODEL, serve's models folder) is named with where it goes
    (--controlnet), not as a file 'which sdrt does not run'."""
    from sdrt.cli import main
    from sdrt.pipelines.singlefile import missing_parts

    register("reference")
    f = DATA / "tiny-sdxl-t2ia" / "t2i-adapter_diffusers_xl_tiny.safetensors"
    assert main(["generate", str(f), "a cat", "--backend", "reference"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a T2I-Adapter" in err and "--controlnet FILE" in err, err
    assert "which sdrt does not run" not in err, err
    why = missing_parts(f)
    assert why is not None and "is a T2I-Adapter" in why and "which sdrt does not run" not in why, why
    from sdrt.pipelines.singlefile import check_part_file

    with pytest.raises(ModelError) as e:  # given as a VAE file
        check_part_file(f, "vae", "sdxl", "SDXL")
    assert "is a T2I-Adapter" in e.value.what and e.value.what.endswith("not a VAE"), e.value.what
