"""InstantID (SDXL) against insightface, OpenCV and diffusers on identical files.

``scripts/gen_instantid_refs.py`` ran insightface's ``FaceAnalysis`` on antelopev2 stand-ins (the buffalo_l ones under
``scrfd_10g_bnkps.onnx`` / ``glintr100.onnx``: ``instantid_fixtures.antelopev2``), drew InstantID's keypoint map with
OpenCV, and ran diffusers' ``StableDiffusionXLControlNetPipeline`` on tiny-sdxl with the ControlNet exported as
``tiny-sdxl-controlnet/controlnet`` and a tiny InstantID adapter in InstantX's layout (``instantid_fixtures``,
rebuilt here from its seed, sha256 checked), fed [zeros, the raw embedding] and the ControlNet the projected face
tokens as its ``encoder_hidden_states`` (the community InstantID pipeline's math). The same run with the prompt as
the ControlNet's text is 130+ levels away, so a pipeline feeding the prompt would fail here.
"""

from __future__ import annotations

import json

import faceid_fixtures as ff
import instantid_fixtures as fx
import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.checkpoint.ipadapter import open_ip_adapter
from sdrt.errors import InputError
from sdrt.pipelines import ControlNet, IPAdapter
from sdrt.pipelines.faces import Face, FaceModels, draw_kps, face_of, largest
from sdrt.pipelines.preprocessors import preprocess

FACES = fx.FACES
REFS = np.load(FACES / "instantid_refs.npz")
META = json.loads((FACES / "instantid_refs.json").read_text())
CASES = META["cases"]
FOLDER = DATA / "tiny-sdxl-controlnet"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny InstantID adapter, built again byte for byte, and the antelopev2 stand-in folder."""
    folder = tmp_path_factory.mktemp("instantid")
    path, digest = fx.write(folder)
    assert digest == META["sha256"][path.name]
    return path, fx.antelopev2(folder)


def units(case: dict, files, **extra) -> dict:
    adapter, antelope = files
    return dict(ip_adapter=IPAdapter(adapter, image=ff.face_picture(), scale=case["scale"], face_models=antelope),
                controlnets=[ControlNet("controlnet", REFS["hint64"], scale=case["cn_scale"], **extra)])


def kwargs(case: dict) -> dict:
    return dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=64, height=64)


def test_the_embedding_is_antelopev2s_raw_one_of_the_largest_face(files):
    register("reference")
    models = FaceModels(files[1], backend="reference", pack="antelopev2")
    face, emb = face_of(models, ff.face_picture(), "image", pick_largest=True, normed=False)
    assert np.abs(face.kps - REFS["kps"]).max() < 0.05
    assert abs(float(np.linalg.norm(emb)) - float(np.linalg.norm(REFS["embedding"]))) < 1e-2  # not normed: ~19.9
    assert np.abs(emb - REFS["embedding"]).max() < 1e-2


def test_largest_is_by_box_area_not_score():
    small = Face(np.array([0, 0, 10, 10], np.float32), 0.99, np.zeros((5, 2), np.float32))
    big = Face(np.array([0, 0, 30, 20], np.float32), 0.6, np.zeros((5, 2), np.float32))
    assert largest([small, big]) is big and largest([big, small]) is big


def test_the_keypoint_map_is_instantids_draw_kps(files):
    got = draw_kps(*REFS["kps_map"].shape[:2], REFS["kps"])
    assert np.array_equal(got, REFS["kps_map"])
    assert np.array_equal(draw_kps(64, 64, REFS["kps"] * np.array([64 / 320, 64 / 256], np.float32)), REFS["hint64"])
    register("reference")
    made = preprocess(ff.face_picture(), "instant_id_face_keypoints", models=files[1], backend="reference")
    assert made.shape == REFS["kps_map"].shape
    assert (made != REFS["kps_map"]).any(-1).mean() < 0.002  # detected points within 0.05 px of insightface's
    with pytest.raises(InputError, match="finds no face"):
        preprocess(ff.no_face_picture(), "instant_id_face_keypoints", models=files[1], backend="reference")


def test_the_projection_is_diffusers_resampler_of_one_face_token(files):
    ad = open_ip_adapter(files[0], base="sdxl", text_width=64)
    assert ad.kind == "instantid" and ad.tokens == 16 and ad.image_dim == 512 and ad.encoder_width is None
    emb = REFS["embedding"][None]
    got = ad.project(np.concatenate([np.zeros_like(emb), emb]))
    assert got.shape == REFS["tokens"].shape and np.abs(got - REFS["tokens"]).max() < 1e-3


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_instantid_matches_diffusers(case, files):
    register("reference")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        got = pipe.generate(case["prompt"], case["negative_prompt"], **units(case, files, face_tokens=True),
                            **kwargs(case)).images
    assert_matches_diffusers(got, REFS[case["name"]])


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_instantid_matches_diffusers_on_compiled_backends(backend, files):
    register(backend)
    case = CASES[0]
    with pipelines.load(FOLDER, backend=backend) as pipe:
        got = pipe.generate(case["prompt"], case["negative_prompt"], **units(case, files, face_tokens=True),
                            **kwargs(case)).images
        assert pipe.unet.backend == backend
    assert_matches_diffusers(got, REFS[case["name"]])


def test_which_nets_read_the_face_tokens():
    img = REFS["hint64"]
    assert ControlNet("models/ControlNet/control_instant_id_sdxl.safetensors", img).reads_face_tokens
    assert ControlNet("InstantID/ControlNetModel/diffusion_pytorch_model.safetensors", img).reads_face_tokens
    assert ControlNet("controlnet", img, preprocessor="instant_id_face_keypoints").reads_face_tokens
    assert not ControlNet("controlnet", img).reads_face_tokens
    assert not ControlNet("/work/wt-instantid/models/tiny-controlnet/controlnet", img).reads_face_tokens  # a folder up
    assert ControlNet("ControlNet/control_instant-id_sdxl", img).reads_face_tokens
    assert not ControlNet("instantid-like/control.safetensors", img, face_tokens=False).reads_face_tokens


def test_a_face_token_net_without_an_instantid_adapter_is_one_error(files):
    register("reference")
    case = CASES[0]
    with pipelines.load(FOLDER, backend="reference") as pipe:
        kw = units(case, files, face_tokens=True)
        with pytest.raises(InputError, match="InstantID's ControlNet") as info:
            pipe.generate("a cat", controlnets=kw["controlnets"], **kwargs(case))
        assert info.value.where == "controlnets[0]"
        with pytest.raises(InputError, match="face_tokens must be"):
            pipe.generate("a cat", controlnets=[ControlNet("controlnet", REFS["hint64"], face_tokens="yes")],
                          **kwargs(case))


def test_generate_cli_runs_instantid_by_the_nets_name(files, tmp_path, capsys):
    """--ip-adapter InstantID's adapter with --face-models (antelopev2 found in the folder given), and a --controlnet
    whose folder names InstantID: it reads the face tokens without a flag; the PNG records the adapter's unit as
    sd-webui-controlnet does (instant_id_face_embedding)."""
    import shutil

    from PIL import Image

    from sdrt.cli import main

    register("reference")
    net = tmp_path / "control_instant_id_sdxl"
    shutil.copytree(FOLDER / "controlnet", net)
    picture, hint, out = tmp_path / "face.png", tmp_path / "kps.png", tmp_path / "out.png"
    Image.fromarray(ff.face_picture()).save(picture)
    Image.fromarray(REFS["hint64"]).save(hint)
    case = CASES[0]
    rc = main(["generate", str(FOLDER), case["prompt"], "--negative", case["negative_prompt"], "--steps",
               str(case["steps"]), "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler", case["sampler"],
               "--width", "64", "--height", "64", "--backend", "reference", "-o", str(out),
               "--ip-adapter", str(files[0]), "--ip-adapter-image", str(picture), "--ip-adapter-scale",
               str(case["scale"]), "--face-models", str(files[1].parent), "--controlnet", str(net),
               "--control-image", str(hint), "--control-scale", str(case["cn_scale"])])
    assert rc == 0, capsys.readouterr().err
    with Image.open(out) as img:
        assert_matches_diffusers([np.asarray(img.convert("RGB"))], REFS[case["name"]])
        text = img.text["parameters"]
    assert "Module: instant_id_face_embedding, Model: ip-adapter_instant_id_tiny_sdxl" in text, text


def test_generate_cli_face_tokens_flag_for_a_net_of_another_name(files, tmp_path, capsys):
    """--control-face-tokens: the model folder's own ControlNet (its name says nothing) reads the face tokens; off, a
    net named InstantID reads the prompt (130+ levels from the reference)."""
    import shutil

    from PIL import Image

    from sdrt.cli import main

    register("reference")
    picture, hint = tmp_path / "face.png", tmp_path / "kps.png"
    Image.fromarray(ff.face_picture()).save(picture)
    Image.fromarray(REFS["hint64"]).save(hint)
    named = tmp_path / "control_instant_id_sdxl"
    shutil.copytree(FOLDER / "controlnet", named)
    case = CASES[0]
    for net, flag, same in ((None, "on", True), (named, "off", False)):
        out = tmp_path / f"{flag}.png"
        rc = main(["generate", str(FOLDER), case["prompt"], "--negative", case["negative_prompt"], "--steps",
                   str(case["steps"]), "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler",
                   case["sampler"], "--width", "64", "--height", "64", "--backend", "reference", "-o", str(out),
                   "--ip-adapter", str(files[0]), "--ip-adapter-image", str(picture), "--ip-adapter-scale",
                   str(case["scale"]), "--face-models", str(files[1]), "--control-image", str(hint),
                   "--control-scale", str(case["cn_scale"]), "--control-face-tokens", flag,
                   *(["--controlnet", str(net)] if net else [])])
        assert rc == 0, capsys.readouterr().err
        with Image.open(out) as img:
            got = np.asarray(img.convert("RGB"))
        diff = int(np.abs(got.astype(int) - REFS[case["name"]][0]).max())
        assert (diff <= 1) if same else (diff > 50), (flag, diff)


def test_a_users_instantid_folder_does_not_make_its_ordinary_nets_face_token_ones():
    """A folder of the user's that says InstantID ("instantid-tests") holding an ordinary ControlNet in a diffusers
    ``controlnet`` folder (or an Optimum one's ``controlnet/model.onnx``): ``controlnet`` is a net's own name there,
    not a generic one to look past, so the net reads the prompt; InstantX's ``ControlNetModel`` is still looked past."""
    img = REFS["hint64"]
    for path in ("instantid-tests/controlnet", "instantid-tests/controlnet/diffusion_pytorch_model.safetensors",
                 "instantid-tests/controlnet/model.onnx", "my-instant_id-sdxl/controlnet"):
        assert not ControlNet(path, img).reads_face_tokens, path
    assert ControlNet("InstantID/ControlNetModel", img).reads_face_tokens
    assert ControlNet("instantid/ControlNetModel/diffusion_pytorch_model.fp16.safetensors", img).reads_face_tokens


def test_the_cli_says_a_face_token_net_without_its_adapter_in_its_flags(tmp_path, capsys):
    """The refusal of a face-token ControlNet with no InstantID adapter names the command line's flags, not the
    API's ``ip_adapter=IPAdapter(...)`` / ``face_tokens=False``."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")
    hint = tmp_path / "kps.png"
    Image.fromarray(REFS["hint64"]).save(hint)
    rc = main(["generate", str(FOLDER), "a cat", "--steps", "1", "--width", "64", "--height", "64", "--backend",
               "reference", "-o", str(tmp_path / "o.png"), "--control-image", str(hint), "--control-face-tokens", "on"])
    err = capsys.readouterr().err
    assert rc != 0 and "InstantID's ControlNet" in err, err
    line = next(x for x in err.splitlines() if x.startswith("error:"))
    assert "--ip-adapter" in line and "--face-models" in line and "--control-face-tokens" in line, line
    assert "IPAdapter(" not in line and "face_tokens" not in line and "ip_adapter" not in line, line


def test_face_tokens_on_a_transformers_controlnet_is_refused():
    """InstantID's ControlNet is SDXL's: ``face_tokens=True`` on an SD3 (or Flux) ControlNet, whose text stream the
    face tokens cannot replace, is one error on the unit, not left aside."""
    from sdrt.checkpoint.controlnet import open_controlnet

    register("reference")
    nets = DATA / "tiny-sd3-controlnet"
    net = open_controlnet(nets / "canny" / "diffusion_pytorch_model.safetensors",
                          graph=nets / "sd35_medium_transformer.onnx")
    with pipelines.load(DATA / "tiny-sd3", backend="reference") as pipe:
        with pytest.raises(InputError, match="face_tokens") as info:
            pipe.generate("a cat", steps=1, width=64, height=64,
                          controlnets=[ControlNet(net, np.zeros((64, 64, 3), np.uint8), face_tokens=True)])
    assert info.value.where == "controlnets[0] face_tokens"


def test_the_pipeline_embeds_the_largest_face_not_the_best_scored(files, monkeypatch):
    """The stand-in detector's boxes are all ~48 px, so its best-scored face is also its largest and the reference run
    cannot tell the two rules apart: here a larger, lower-scored face is added to what it finds, and the InstantID
    adapter's embedding is that face's (the FaceID rule, the first face, would embed another)."""
    from sdrt.pipelines import ipadapter
    from sdrt.pipelines.faces import FaceModels

    real_detect, real_embed = FaceModels.detect, FaceModels.embed
    big: list[Face] = []
    embedded: list[Face] = []

    def detect(self, rgb):
        found = real_detect(self, rgb)
        last = found[-1]
        big[:] = [Face(last.bbox + np.array([-20, -20, 20, 20], np.float32), 0.55, last.kps)]
        return [*found, *big]

    def embed(self, rgb, face, normed=True):
        embedded.append(face)
        return real_embed(self, rgb, face, normed)

    monkeypatch.setattr(FaceModels, "detect", detect)
    monkeypatch.setattr(FaceModels, "embed", embed)
    register("reference")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        ad = open_ip_adapter(files[0], base="sdxl", text_width=64)
        unit = IPAdapter(files[0], image=ff.face_picture(), face_models=files[1])
        ipadapter.face_inputs(pipe, ad, unit, 0, 1)
    assert embedded and embedded[-1] is big[0]


def test_instantid_on_an_sd15_model_is_refused_on_face_tokens_and_otherwise_reads_the_prompt(tmp_path):
    """InstantID is SDXL's: ``face_tokens=True`` on an SD 1.x net is one error on it (not "pass an InstantID adapter",
    which the model would refuse next), and an SD 1.x net whose name says InstantID (or given the keypoint
    preprocessor) reads the prompt, as with ``face_tokens=False``, not an error."""
    import shutil

    register("reference")
    hint = REFS["hint64"]
    folder = DATA / "tiny-sd15-controlnet"
    named = tmp_path / "control_instant_id_sd15"
    shutil.copytree(folder / "controlnet", named)
    kw = dict(steps=1, width=64, height=64, seed=5)
    with pipelines.load(folder, backend="reference") as pipe:
        with pytest.raises(InputError, match="SDXL") as info:
            pipe.generate("a cat", controlnets=[ControlNet("controlnet", hint, face_tokens=True)], **kw)
        assert info.value.where == "controlnets[0] face_tokens" and "ip_adapter" not in str(info.value)
        a = pipe.generate("a cat", controlnets=[ControlNet(named, hint, face_tokens=False)], **kw).images[0]
        b = pipe.generate("a cat", controlnets=[ControlNet(named, hint)], **kw).images[0]
    assert np.array_equal(np.asarray(a), np.asarray(b))
