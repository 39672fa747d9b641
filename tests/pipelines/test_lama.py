"""``inpaint_only+lama``: LaMa's fill (sdrt.pipelines.lamafill) against the extension's own generator.

References: scripts/ref_lama.py built the extension's ``FFCResNetGenerator`` (annotator/lama, from its config.yaml;
the published file's names and shapes checked equal to sdrt's for ngf 64 and 18 blocks, 51,057,027 parameters),
loaded the small seeded generator lama_helpers writes (ngf 8, 2 FFC blocks, the same names otherwise) and ran the
extension's code around it on two RGBA pictures: 72x100 (enlarged to 256, bicubic) and 264x280 (shrunk, area).
tests/data/lama/refs.npz holds the pictures, the maps and the generator's output on the first 64 rows of the first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lama_helpers import lama_rgba, make_lama, write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import lamafill  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "lama"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "refs.npz")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """sd-webui-controlnet's layout: <models>/extensions/sd-webui-controlnet/annotator/downloads/lama."""
    root = tmp_path_factory.mktemp("lama")
    folder = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "lama"
    folder.mkdir(parents=True)
    write_pth(folder / lamafill.LAMA_FILE, make_lama())
    return root


def _file(models):
    from sdrt.pipelines.annotators import find

    return find("inpaint_only+lama", models, "models")[0]


def _close(made, ref):
    """At most 1 level apart (float32 sums in another order move a value across a truncation step now and then)."""
    assert made.shape == ref.shape and made.dtype == np.uint8
    d = np.abs(made.astype(int) - ref.astype(int))
    assert d.max() <= 1 and (d > 0).mean() <= 0.01, (int(d.max()), float((d > 0).mean()))
    return d


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_fill_equals_the_extension(refs, models, backend):
    register(backend)
    with lamafill.Lama(_file(models), backend=backend) as net:
        for key in ("up", "down"):
            made = lamafill.fill(refs[f"{key}_rgba"], net)
            _close(made, refs[f"{key}_map"])
            assert np.array_equal(made[:, :, 3], refs[f"{key}_rgba"][:, :, 3])
        # the generator itself, on the padded 256x384 feed of the first picture
        img, _ = lamafill._resize_with_pad(refs["up_rgba"], lamafill.LAMA_RES)
        mask = (img[:, :, 3:4].astype(np.float32) / np.float32(255) > 0.5).astype(np.float32)
        color = img[:, :, :3].astype(np.float32) / np.float32(255) * (1 - mask)
        raw = net.predict(np.concatenate([color, mask], axis=2).transpose(2, 0, 1))
        assert np.abs(raw[:, :64] - refs["up_raw"]).max() < 2e-4


def test_wrong_files_are_one_line(tmp_path, models):
    arrays = make_lama()
    broken = dict(arrays)
    broken.pop("model.6.conv2.ffc.convg2g.fu.conv_layer.weight")
    with pytest.raises(ModelError, match=r"is not LaMa's ControlNetLama.pth.*1 of its .* missing.*download "
                                         r"ControlNetLama.pth \(lllyasviel/Annotators") as info:
        lamafill.Lama(write_pth(tmp_path / "a" / lamafill.LAMA_FILE if (tmp_path / "a").mkdir() is None else None,
                                broken))
    assert "\n" not in info.value.what
    other = dict(arrays)
    other["model.1.ffc.convl2l.weight"] = np.zeros((8, 3, 7, 7), np.float32)
    with pytest.raises(ModelError, match=r"model.1.ffc.convl2l.weight is \(8, 3, 7, 7\)"):
        lamafill.Lama(write_pth(tmp_path / "other.pth", other))
    (tmp_path / "trunc.pth").write_bytes(_file(models).read_bytes()[:5000])
    with pytest.raises(ModelError, match="could not be read"):
        lamafill.Lama(tmp_path / "trunc.pth")
    with pytest.raises(InputError, match=r"no ControlNetLama.pth in .*download it \(lllyasviel/Annotators\)"):
        from sdrt.pipelines.annotators import find

        find("inpaint_only+lama", tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else None, "models")


def test_prefixed_names_load(tmp_path, refs):
    """A state dict saved from the training module (``generator.`` before each name) is the same network."""
    arrays = {"generator." + k: v for k, v in make_lama().items()}
    with lamafill.Lama(write_pth(tmp_path / "prefixed.pth", arrays), backend="openvino") as net:
        _close(lamafill.fill(refs["up_rgba"], net), refs["up_map"])


# ------------------------------------------------------------------------------------------ the unit in a run
def _lama_case():
    import json

    from pipeline_helpers import DATA as PDATA

    folder = PDATA / "tiny-sd15-controlnet"
    return folder, json.loads((folder / "lama.json").read_text())[0], np.load(folder / "lama.npz"), \
        np.load(folder / "inpaint.npz")


def _lama_run(pipe, case, z, models, **over):
    from sdrt.pipelines.controlnet import ControlNet

    unit = ControlNet(case["controlnet"], z["picture"], case["scale"], preprocessor=over.pop("preprocessor",
                                                                                             case["preprocessor"]),
                      control_mask=z["mask"], preprocessor_models=models)
    return pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[unit], steps=case["steps"],
                         cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
                         height=case["height"], **over).images[0]


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_lama_unit_equals_the_extension(models, backend):
    """scripts/gen_lama_controlnet_refs.py: the extension's unit in torch (LaMa's fill, the inpaint_only hint, restore
    and blend on the filled picture, the first noise leaning towards its latent); within 1 level."""
    from sdrt import pipelines

    register(backend)
    folder, case, ref, z = _lama_case()
    options = {} if backend == "reference" else {"precision": "fp32"}
    with pipelines.load(folder, backend=backend, **options) as pipe:
        image = _lama_run(pipe, case, z, models)
    d = np.abs(image.astype(int) - ref["image"][0].astype(int))
    assert d.max() <= 1, int(d.max())


def test_lama_unit_has_teeth(models):
    """Without the noise lean (the first noise as drawn), or inpaint_only's (no fill), the image moves."""
    from pipeline_helpers import fast_backend

    from sdrt import pipelines

    folder, case, ref, z = _lama_case()
    with pipelines.load(folder, backend=fast_backend(), precision="fp32") as pipe:
        only = _lama_run(pipe, case, z, None, preprocessor="inpaint_only")
        lama = _lama_run(pipe, case, z, models)
    assert np.abs(lama.astype(int) - ref["image"][0]).max() <= 1
    assert np.abs(lama.astype(int) - ref["without_lean"][0]).max() >= 3
    assert np.abs(only.astype(int) - ref["image"][0]).max() >= 3


def test_the_plan_counts_lama(models):
    """A job's memory plan counts LaMa as a detector (``preprocessor:inpaint_only+lama``: its tensors as float32,
    the batch norms' step counters included); the plan runs no network (its map: zeros of the size)."""
    from pipeline_helpers import DATA as PDATA

    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet

    register("openvino")
    z = np.load(PDATA / "tiny-sd15-controlnet" / "inpaint.npz")
    unit = ControlNet("controlnet", z["picture"], preprocessor="inpaint_only+lama", control_mask=z["mask"],
                      preprocessor_models=models)
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend="openvino") as pipe:
        plan = pipe.plan("a cat", controlnets=[unit], steps=2, seed=1, width=64, height=64, sampler="Euler").memory
    placed = plan.placement("preprocessor:inpaint_only+lama")
    assert placed is not None and placed.role == "preprocessor"
    assert placed.weight_bytes == 4 * sum(int(np.prod(v.shape)) for v in make_lama().values())


def test_lama_on_the_command_line(models, tmp_path, capsys):
    """--control-preprocessor inpaint_only+lama with --control-preprocessor-models gives the Python API's image; the
    wrong file is one line naming it."""
    from PIL import Image
    from pipeline_helpers import fast_backend

    from sdrt.cli import main

    folder, case, ref, z = _lama_case()
    pic, mask, out = tmp_path / "pic.png", tmp_path / "mask.png", tmp_path / "out.png"
    Image.fromarray(z["picture"]).save(pic)
    Image.fromarray(z["mask"]).save(mask)
    backend = fast_backend()
    args = ["generate", str(folder), case["prompt"], "-n", case["negative_prompt"], "--steps", str(case["steps"]),
            "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler", "Euler", "--width", "64",
            "--height", "64", "--backend", backend, "--control-image", str(pic), "--control-mask", str(mask),
            "--control-preprocessor", "inpaint_only+lama", "-o", str(out)]
    assert main([*args, "--control-preprocessor-models", str(models)]) == 0, capsys.readouterr().err
    from sdrt import pipelines

    with pipelines.load(folder, backend=backend) as pipe:
        want = _lama_run(pipe, case, z, models)
    assert np.array_equal(np.asarray(Image.open(out).convert("RGB")), want)
    capsys.readouterr()
    (tmp_path / "ControlNetLama.pth").write_bytes(b"not a model")
    assert main([*args, "--control-preprocessor-models", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]  # (after the run's "backend ..." line)
    assert len(lines) == 1 and "ControlNetLama.pth" in lines[0] and "--control-preprocessor-models" in lines[0], err


def test_lama_keeps_its_restore_in_a_run_with_a_mask():
    """The extension falls back to ``inpaint`` for ``inpaint_only`` alone when the run has its own mask;
    ``inpaint_only+lama`` keeps its restore and blend there."""
    from types import SimpleNamespace

    from sdrt.pipelines.controlnet import ControlNet
    from sdrt.pipelines.extras import ToolboxMixin

    for mask, pre, want in ((None, "inpaint_only", True), (np.zeros((8, 8)), "inpaint_only", False),
                            (np.zeros((8, 8)), "inpaint_only+lama", True), (None, "inpaint_only+lama", True),
                            (None, "inpaint", False)):
        unit = ControlNet("controlnet", np.zeros((8, 8, 3), np.uint8), preprocessor=pre)
        ToolboxMixin._inpaint_unit(SimpleNamespace(), SimpleNamespace(mask=mask, init_image=None), unit, 0)
        assert unit.restores is want, (pre, mask is not None)


def _strip_unit(models):
    from sdrt.pipelines.controlnet import ControlNet

    unit = ControlNet("controlnet", np.zeros((2, 200, 3), np.uint8), preprocessor="inpaint_only+lama",
                      control_mask=np.full((2, 200), 255, np.uint8), preprocessor_models=models)
    unit.pose_backend = "openvino"
    return unit


def test_a_strip_lama_cannot_read_is_one_line_naming_the_unit(models):
    """LaMa reads a picture at 256 on its shorter side whatever the processor resolution: a 100:1 strip would be
    25600 long. Refused in one line naming the unit (not sdrt's internals, not the processor resolution it does not
    read), in a run plan too (no network runs there)."""
    from sdrt.pipelines import controlnet as cn
    from sdrt.pipelines.controlmaps import ControlImageError

    register("openvino")
    for planning in (False, True):
        token = cn.PLANNING.set(planning)
        try:
            with pytest.raises(ControlImageError, match=r"LaMa's input .* 25600 pixels long .*200x2") as info:
                cn.detect(_strip_unit(models), 64, 64, "controlnets[0]")
        finally:
            cn.PLANNING.reset(token)
        assert info.value.where == "controlnets[0]" and "processor resolution" not in info.value.fix
        assert "\n" not in str(info.value)
    # at 64:1 it runs
    unit = _strip_unit(models)
    unit.image, unit.control_mask = np.zeros((4, 256, 3), np.uint8), np.full((4, 256), 255, np.uint8)
    assert cn.detect(unit, 64, 64, "controlnets[0]").shape == (4, 256, 4)


def test_outpainting_in_a_hires_run_fills_at_the_hires_size(models):
    """With the hires fix the extension fits a Resize and Fill picture to the second pass's size before LaMa
    (get_control's outpaint fix at hr_y x hr_x): the map is made there, the first pass gets it fitted down and the
    second pass it as made (not the first pass's map enlarged: a blurred picture under the restore and the blend)."""
    from types import SimpleNamespace

    from sdrt.pipelines import controlnet as cn
    from sdrt.pipelines.extras import ToolboxMixin
    from sdrt.pipelines.hires import Hires
    from sdrt.pipelines.inpaintcn import resize_map, rgba
    from sdrt.pipelines.preprocessors import lama_fill

    register("openvino")
    a = lama_rgba(40, 100)
    unit = cn.ControlNet("controlnet", a[:, :, :3].copy(), preprocessor="inpaint_only+lama", resize="Resize and Fill",
                         control_mask=a[:, :, 3].copy(), preprocessor_models=models)
    unit.pose_backend = "openvino"
    s = SimpleNamespace(mask=None, init_image=None, mode="txt2img", width=64, height=48,
                        toolbox=SimpleNamespace(hires=Hires(2.0, 0, 0.5, "Latent")))
    ToolboxMixin._inpaint_unit(SimpleNamespace(), s, unit, 0)
    assert unit.detected is not None and unit.detected.shape == (96, 128, 4)
    fitted = resize_map(rgba(a[:, :, :3], a[:, :, 3]), 128, 96, "Resize and Fill")
    assert np.array_equal(unit.detected, lama_fill(fitted, _file(models), "openvino"))
    first = cn.prepare_image(unit, 64, 48, "controlnets[0]")
    assert np.array_equal(first, resize_map(unit.detected, 64, 48, "Resize and Fill"))
    second = cn.prepare_image(unit, 128, 96, "controlnets[0]")
    assert np.array_equal(second[:, :, :3], unit.detected[:, :, :3])
    # without the hires fix (or in img2img) the map is made at the pass's size, when the pass first asks for it
    for s in (SimpleNamespace(mask=None, init_image=None, mode="txt2img", width=64, height=48,
                              toolbox=SimpleNamespace(hires=None)),
              SimpleNamespace(mask=None, init_image=None, mode="img2img", width=64, height=48,
                              toolbox=SimpleNamespace(hires=Hires(2.0, 0, 0.5, "Latent")))):
        unit.detected = None
        ToolboxMixin._inpaint_unit(SimpleNamespace(), s, unit, 0)
        assert unit.detected is None


def test_reference_units_draw_unleaned_from_the_run_stream():
    """A reference unit beside an inpaint_only+lama unit: its noise is the run's stream as without the lama unit
    (the extension's reference noise is not p.rng's), not another seed's."""
    from sdrt.pipelines import refattn
    from sdrt.pipelines.inpaintcn import LeanNoise
    from sdrt.samplers import TorchGenerator

    lean = LeanNoise(TorchGenerator(7), np.ones((1, 4, 8, 8), np.float32), np.linspace(0.99, 0.01, 1000))
    got = refattn.noise_source(None, lean).randn((2, 4, 8, 8))
    assert np.array_equal(got, TorchGenerator(7).randn((2, 4, 8, 8)))


def test_the_leaning_source_copies():
    """A LeanNoise copies as the sources it wraps do (its attribute forwarding answered copy's look-ups with a
    KeyError)."""
    import copy

    from sdrt.pipelines.inpaintcn import LeanNoise, lean_noise
    from sdrt.samplers import TorchGenerator

    latent, acp = np.ones((1, 4, 8, 8), np.float32), np.linspace(0.99, 0.01, 1000)
    for twin in (copy.copy, copy.deepcopy):
        lean = twin(LeanNoise(TorchGenerator(7), latent, acp))
        assert np.array_equal(lean.randn((1, 4, 8, 8)), lean_noise(TorchGenerator(7).randn((1, 4, 8, 8)), latent, acp))


def test_latent_noise_masked_content_is_the_seeds_draw_unleaned(models, monkeypatch):
    """A1111's "latent noise" masked content is ``create_random_tensors`` of the seeds, drawn apart from ``p.rng``:
    the extension's lean (HackedImageRNG) is not on it. The run's first noise leans; the start's noise does not."""
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.pipelines import inpaintcn, maskedcontent
    from sdrt.pipelines.controlnet import ControlNet

    drawn, given = [], []
    randn, start_latents = inpaintcn.LeanNoise.randn, maskedcontent.start_latents

    def spy_randn(self, shape):
        out = randn(self, shape)
        drawn.append((self.raw.copy(), out.copy()))
        return out

    def spy_start(mode, image_latents, noise, mask):
        given.append(np.array(noise))
        return start_latents(mode, image_latents, noise, mask)

    monkeypatch.setattr(inpaintcn.LeanNoise, "randn", spy_randn)
    monkeypatch.setattr(maskedcontent, "start_latents", spy_start)
    folder, case, _, z = _lama_case()
    unit = ControlNet(case["controlnet"], None, case["scale"], preprocessor="inpaint_only+lama",
                      preprocessor_models=models)
    with pipelines.load(folder, backend=fast_backend(), precision="fp32") as pipe:
        pipe.generate(case["prompt"], controlnets=[unit], steps=2, sampler="Euler", seed=3, width=64, height=64,
                      init_image=z["picture"], mask=z["mask"], strength=0.75, masked_content="latent noise")
    assert drawn and given  # (the job's memory plan runs dry first: its start is given[0])
    raw, leaned = drawn[0]
    assert not np.allclose(raw, leaned)
    assert np.array_equal(given[-1], raw)


def test_the_lean_is_the_job_first_batch_only(models):
    """The extension wraps ``p.rng`` before the job's first batch only (``noise_modifier`` is cleared there): a job's
    later batches draw as usual, and so does a unit told ``lean_noise=False`` (serve's later ``n_iter`` runs)."""
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet

    folder, case, ref, z = _lama_case()

    def unit(lean=True):
        u = ControlNet(case["controlnet"], z["picture"], case["scale"], preprocessor=case["preprocessor"],
                       control_mask=z["mask"], preprocessor_models=models)
        u.lean_noise = lean
        return u

    run = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], width=case["width"],
               height=case["height"])
    with pipelines.load(folder, backend=fast_backend(), precision="fp32") as pipe:
        both = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[unit()], seed=case["seed"],
                             batch_count=2, **run).images
        second = case["seed"] + 1
        leaned = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[unit()], seed=second,
                               **run).images[0]
        plain = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[unit(False)], seed=second,
                              **run).images[0]
        first_plain = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[unit(False)],
                                    seed=case["seed"], **run).images[0]
    assert np.abs(both[0].astype(int) - ref["image"][0]).max() <= 1
    assert np.array_equal(both[1], plain)
    assert np.abs(leaned.astype(int) - plain.astype(int)).max() >= 3
    assert np.abs(first_plain.astype(int) - ref["without_lean"][0]).max() <= 1
    with pytest.raises(InputError, match=r"controlnets\[0\] lean_noise must be True or False, got 'no'"):
        from sdrt.pipelines.controlnet import parse_units

        parse_units([unit("no")])


def test_a_big_picture_fill_stays_small(models):
    """LaMa reads 256 on the shorter side; around it the fill works at the picture's own size (the resize back and
    the blend). Numpy's peak stays near 23 bytes a pixel of a 3-megapixel photo (the float blend over the whole
    picture was 49, with the int64 rows of OpenCV's linear enlargement 78; a 24-megapixel photo took 1.7 GB)."""
    import tracemalloc

    register("openvino")
    h, w = 1500, 2000
    a = np.full((h, w, 4), 120, np.uint8)
    a[:, :, 3] = 0
    a[h // 3:h // 2, w // 3:w // 2, 3] = 255
    a[h // 2:h // 2 + 40, :, 3] = 128
    with lamafill.Lama(_file(models), backend="openvino") as net:
        lamafill.fill(a[:300, :400].copy(), net)  # compiled outside the measure
        tracemalloc.start()
        try:
            made = lamafill.fill(a, net)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert made.shape == (h, w, 4) and np.array_equal(made[:, :, 3], a[:, :, 3])
    assert np.array_equal(made[:h // 3, :, :3], a[:h // 3, :, :3])  # unmasked: the picture as it was
    assert peak < 32 * h * w, peak / (h * w)
