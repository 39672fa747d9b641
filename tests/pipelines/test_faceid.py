"""IP-Adapter FaceID and FaceID Plus v2 against insightface and diffusers on identical files.

``scripts/gen_faceid_refs.py`` ran insightface's ``FaceAnalysis`` (detection + recognition, ``det_size`` 640) on
stand-ins of ``buffalo_l``'s ``det_10g.onnx`` / ``w600k_r50.onnx`` (``scripts/make_face_standins.py``: their
signatures, seeded weights; ``tests/data/faces/buffalo_l``) and diffusers' ``load_ip_adapter`` with tiny FaceID
adapters in h94's layout (``faceid_fixtures.py``, rebuilt here from their seeds, sha256 checked) fed that embedding
(and for Plus v2 the tiny encoder's hidden states of ``norm_crop``'s 224 crop, ``shortcut`` on).
"""

from __future__ import annotations

import json

import faceid_fixtures as ff
import numpy as np
import pytest
from pipeline_helpers import assert_matches_diffusers, register
from test_ipadapter import DATA, FOLDER, IPA, kwargs, tiny_encoder_graph  # noqa: F401

from sdrt import pipelines
from sdrt.checkpoint.ipadapter import open_ip_adapter
from sdrt.errors import InputError, ModelError
from sdrt.pipelines import IPAdapter
from sdrt.pipelines.cvresize import resample
from sdrt.pipelines.faces import ARCFACE_DST, FaceModels, find_face_models, norm_crop, similarity

FACES = DATA / "faces"
BUFFALO = FACES / "buffalo_l"
REFS = np.load(FACES / "faceid_refs.npz")
META = json.loads((FACES / "faceid_refs.json").read_text())
CASES = META["cases"]
FOLDERS = {"sd15": FOLDER, "sdxl": DATA / "pipelines" / "tiny-sdxl"}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """The tiny FaceID adapters, built again, byte for byte those diffusers read."""
    folder = tmp_path_factory.mktemp("faceid")
    out = {}
    for (base, plus) in ff.NAMES:
        path, digest = ff.write(folder, base, plus)
        assert digest == META["sha256"][path.name]
        out[(base, plus)] = path
    return out


def face_unit(case: dict, adapters: dict, **extra) -> IPAdapter:
    return IPAdapter(adapters[(case["base"], case["plus"])], image=ff.face_picture(), scale=case["scale"],
                     face_models=BUFFALO, image_encoder=IPA / "image_encoder" if case["plus"] else None,
                     s_scale=case.get("s_scale", 1.0), **extra)


def test_detection_is_insightface_scrfd_post_processing():
    """Anchors, distance2bbox / distance2kps, threshold 0.5, NMS 0.4, best first: the 7 faces insightface finds,
    their boxes, scores and points (the picture 320x256, enlarged into the 640x640 canvas's top 640x512)."""
    register("reference")
    models = FaceModels(BUFFALO, backend="reference")
    faces = models.detect(ff.face_picture())
    assert len(faces) == len(REFS["scores"]) == 7
    assert np.abs(np.array([f.score for f in faces]) - REFS["scores"]).max() < 1e-4
    assert np.abs(np.stack([f.bbox for f in faces]) - REFS["bboxes"]).max() < 0.05
    assert np.abs(np.stack([f.kps for f in faces]) - REFS["kps"]).max() < 0.05
    assert models.detect(ff.no_face_picture()) == []


def test_alignment_is_norm_crop_and_the_resize_cv2s():
    kps = REFS["kps"][0]
    assert np.abs(similarity(kps, ARCFACE_DST * 2) - REFS["estimate_norm"]).max() < 1e-4  # skimage's, float32 there
    rgb = ff.face_picture()
    for got, want in ((norm_crop(rgb, kps, 224), REFS["crop224"]),
                      (norm_crop(np.ascontiguousarray(rgb[..., ::-1]), kps, 112), REFS["crop112_bgr"])):
        diff = np.abs(got.astype(int) - want)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.001, (diff.max(), (diff > 0).mean())
    resized = resample(np.ascontiguousarray(rgb[..., ::-1]), 640, 512, "linear")[120:300, 150:390]
    diff = np.abs(resized.astype(int) - REFS["resized"])
    assert diff.max() <= 1 and (diff > 0).mean() < 0.005


def test_the_detectors_resize_of_a_photo_reads_only_the_rows_it_needs():
    """A 12 MP photo shrunk onto the 640 canvas: the resize widened the whole picture to int64 first (8 bytes a
    channel: 426 MB at the peak here, ~850 MB for 24 MP); only the rows read are widened now (~63 MB)."""
    import tracemalloc

    img = np.random.default_rng(3).integers(0, 256, (3000, 4000, 3), dtype=np.uint8)  # 36 MB
    tracemalloc.start()
    try:
        out = resample(img, 640, 480, "linear")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.shape == (480, 640, 3)
    assert peak < 120e6, peak  # was 426 MB; the bytes out are cv2's (test_alignment_is_norm_crop_and_the_resize_cv2s)


def test_the_embedding_is_insightfaces_normed_embedding():
    register("reference")
    models = FaceModels(BUFFALO, backend="reference")
    face = models.detect(ff.face_picture())[0]
    emb = models.embed(ff.face_picture(), face)
    assert emb.shape == (512,) and abs(float(np.linalg.norm(emb)) - 1) < 1e-5
    assert np.abs(emb - REFS["embedding"]).max() < 1e-3


def test_the_buffalo_l_folder_is_found_in_the_tools_layouts(tmp_path):
    """sd-webui-controlnet's folder (annotator/downloads/...), ComfyUI's models folder (insightface/models/...), or
    buffalo_l itself."""
    for i, sub in enumerate(("annotator/downloads/insightface/models/buffalo_l", "insightface/models/buffalo_l")):
        place = tmp_path / str(i)
        (place / sub).mkdir(parents=True)
        for name in ("det_10g.onnx", "w600k_r50.onnx"):
            (place / sub / name).write_bytes((BUFFALO / name).read_bytes())
        assert find_face_models(place) == place / sub
        assert find_face_models(place / sub) == place / sub
    with pytest.raises(InputError, match="holds no det_10g.onnx") as info:
        find_face_models(tmp_path)
    assert info.value.where == "face_models"


def test_one_of_the_files_given_for_the_folder_says_so():
    """--face-models buffalo_l/det_10g.onnx: the message said the file "does not exist"; it is there, a file where
    the folder is wanted, and the fix names that folder."""
    with pytest.raises(InputError) as info:
        find_face_models(BUFFALO / "det_10g.onnx")
    assert "does not exist" not in info.value.what and "is a file" in info.value.what
    assert str(BUFFALO) in info.value.fix and info.value.where == "face_models"


def test_the_projections_are_diffusers_faceid_ones(adapters):
    emb = REFS["embedding"][None]
    for case in CASES:
        sdxl = case["base"] == "sdxl"
        ad = open_ip_adapter(adapters[(case["base"], case["plus"])], base="sdxl" if sdxl else "sd1",
                             text_width=64 if sdxl else 32)
        assert ad.kind == ("faceid_plus" if case["plus"] else "faceid") and ad.tokens == 4 and ad.image_dim == 512
        want = REFS[f"tokens/{case['name']}"]
        if case["plus"]:
            continue  # its hidden states come from the encoder: checked through the pipeline below
        got = ad.project_face(np.concatenate([np.zeros_like(emb), emb]))
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-4


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_faceid_on_onnx_folders_matches_diffusers(case, adapters, tiny_encoder_graph):  # noqa: F811
    with pipelines.load(FOLDERS[case["base"]], backend="reference") as pipe:
        got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=face_unit(case, adapters),
                            **kwargs(case)).images
    assert_matches_diffusers(got, REFS[case["name"]])


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_faceid_matches_diffusers_on_compiled_backends(backend, adapters, tiny_encoder_graph):  # noqa: F811
    """The detector, recognizer, encoder and edited UNet compiled by the backend."""
    register(backend)
    for case in (CASES[0], CASES[1]):
        with pipelines.load(FOLDERS[case["base"]], backend=backend) as pipe:
            got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=face_unit(case, adapters),
                                **kwargs(case)).images
            assert pipe.unet.backend == backend
        assert_matches_diffusers(got, REFS[case["name"]])


def test_a_picture_without_a_face_is_one_error_on_the_picture(adapters, tiny_encoder_graph):  # noqa: F811
    case = CASES[0]
    unit = face_unit(case, adapters)
    unit.image = ff.no_face_picture()
    with pipelines.load(FOLDER, backend="reference") as pipe:
        with pytest.raises(InputError, match="finds no face") as info:
            pipe.generate("a cat", ip_adapter=unit, **kwargs(case))
    assert info.value.where == "ip_adapter_image"


@pytest.mark.parametrize("shape", [(1, 700, 3), (700, 1, 3), (2, 1500)])
def test_a_picture_too_thin_for_the_detector_finds_no_face(shape):
    """A side that the 640x640 canvas shrinks to no pixel (aspect over 640:1): no face, as nothing is there to see;
    insightface's cv2.resize to a zero side raised, and sdrt divided by zero."""
    from sdrt.pipelines.faces import face_of

    register("reference")
    models = FaceModels(BUFFALO, backend="reference")
    rgb = np.full(shape, 200, np.uint8)
    rgb = np.repeat(rgb[..., None], 3, axis=2) if rgb.ndim == 2 else rgb
    assert models.detect(rgb) == []
    with pytest.raises(InputError, match="finds no face") as info:
        face_of(models, rgb, "ip_adapter_image")
    assert info.value.where == "ip_adapter_image"


def test_faceid_without_face_models_says_which_argument(adapters, tiny_encoder_graph):  # noqa: F811
    case = CASES[0]
    unit = face_unit(case, adapters)
    unit.face_models = None
    with pipelines.load(FOLDER, backend="reference") as pipe:
        with pytest.raises(InputError, match="reads a face embedding") as info:
            pipe.generate("a cat", ip_adapter=unit, **kwargs(case))
        assert info.value.where == "face_models"
        unit.face_models = IPA  # a folder without the two files
        with pytest.raises(InputError, match="holds no det_10g.onnx") as info:
            pipe.generate("a cat", ip_adapter=unit, **kwargs(case))
        assert info.value.where == "face_models"


def test_the_plan_records_the_face_graphs(adapters, tiny_encoder_graph):  # noqa: F811
    case = CASES[1]
    with pipelines.load(FOLDER, backend="reference") as pipe:
        rp = pipe.plan(case["prompt"], case["negative_prompt"], ip_adapter=face_unit(case, adapters), **kwargs(case))
    names = [p.part for p in rp.parts]
    assert "face_detector" in names and "face_recognizer" in names and "image_encoder" in names


def _full_size(tmp_path, plus: bool, sdxl: bool, portrait: bool = False):
    """A zero-filled file with the published adapter's keys and shapes (h94/IP-Adapter-FaceID's)."""
    from safetensors.numpy import save_file

    cross = 2048 if sdxl else 768
    tokens = 16 if portrait else 4
    sd = {"image_proj.proj.0.weight": (1024, 512), "image_proj.proj.0.bias": (1024,),
          "image_proj.proj.2.weight": (tokens * cross, 1024), "image_proj.proj.2.bias": (tokens * cross,),
          "image_proj.norm.weight": (cross,), "image_proj.norm.bias": (cross,)}
    if plus:
        p = "image_proj.perceiver_resampler"
        sd.update({f"{p}.proj_in.weight": (cross, 1280), f"{p}.proj_in.bias": (cross,),
                   f"{p}.proj_out.weight": (cross, cross), f"{p}.proj_out.bias": (cross,),
                   f"{p}.norm_out.weight": (cross,), f"{p}.norm_out.bias": (cross,)})
        for n in range(4):
            a, f = f"{p}.layers.{n}.0", f"{p}.layers.{n}.1"
            sd.update({f"{a}.norm1.weight": (cross,), f"{a}.norm1.bias": (cross,), f"{a}.norm2.weight": (cross,),
                       f"{a}.norm2.bias": (cross,), f"{a}.to_q.weight": (cross, cross),
                       f"{a}.to_kv.weight": (2 * cross, cross), f"{a}.to_out.weight": (cross, cross),
                       f"{f}.0.weight": (cross,), f"{f}.0.bias": (cross,), f"{f}.1.weight": (4 * cross, cross),
                       f"{f}.3.weight": (cross, 4 * cross)})
    widths = ([640] * 4 + [1280] * 40 + [1280] * 20 + [640] * 6) if sdxl else (
        [320] * 2 + [640] * 2 + [1280] * 2 + [1280] * 3 + [640] * 3 + [320] * 3 + [1280])
    for i, width in enumerate(widths):
        k = 2 * i + 1
        sd[f"ip_adapter.{k}.to_k_ip.weight"] = sd[f"ip_adapter.{k}.to_v_ip.weight"] = (width, cross)
        if not portrait:
            sd[f"ip_adapter.{k}.to_q_lora.down.weight"] = (128, width)
    path = tmp_path / f"full_{plus}_{sdxl}_{portrait}.safetensors"
    save_file({k: np.zeros(v, np.float16) for k, v in sd.items()}, str(path))
    return path


@pytest.mark.parametrize("plus", [False, True])
@pytest.mark.parametrize("sdxl", [False, True])
def test_the_published_adapters_shapes_open(tmp_path, plus, sdxl):
    ad = open_ip_adapter(_full_size(tmp_path, plus, sdxl), base="sdxl" if sdxl else "sd1",
                         text_width=2048 if sdxl else 768)
    assert (ad.kind, ad.tokens, ad.image_dim, ad.cross) == ("faceid_plus" if plus else "faceid", 4, 512,
                                                            2048 if sdxl else 768)
    assert ad.encoder_width == (1280 if plus else None)
    assert len(ad.layers) == (70 if sdxl else 16)


def test_faceid_portrait_is_refused_by_name(tmp_path):
    with pytest.raises(ModelError, match="FaceID Portrait"):
        open_ip_adapter(_full_size(tmp_path, False, False, portrait=True))


def test_generate_cli_face_flags_match_diffusers(adapters, tiny_encoder_graph, tmp_path, capsys):  # noqa: F811
    """--face-models and --ip-adapter-s-scale beside the IP-Adapter flags; the PNG records the unit as
    sd-webui-controlnet does (its ip-adapter_face_id_plus module)."""
    from PIL import Image

    from sdrt.cli import main

    picture = tmp_path / "face.png"
    Image.fromarray(ff.face_picture()).save(picture)
    case, out = CASES[2], tmp_path / "out.png"
    rc = main(["generate", str(FOLDER), case["prompt"], "--negative", case["negative_prompt"], "--steps",
               str(case["steps"]), "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler", case["sampler"],
               "--width", "64", "--height", "64", "--backend", "reference", "-o", str(out),
               "--ip-adapter", str(adapters[("sd15", True)]), "--ip-adapter-image", str(picture),
               "--ip-adapter-scale", str(case["scale"]), "--image-encoder", str(IPA / "image_encoder"),
               "--face-models", str(BUFFALO), "--ip-adapter-s-scale", str(case["s_scale"])])
    assert rc == 0, capsys.readouterr().err
    with Image.open(out) as img:
        assert_matches_diffusers([np.asarray(img.convert("RGB"))], REFS[case["name"]])
        text = img.text["parameters"]
    assert 'ControlNet 0: "Module: ip-adapter_face_id_plus, Model: ip-adapter-faceid-plusv2_tiny_sd15' in text, text


@pytest.mark.parametrize("flags, words", [
    (["--ip-adapter-image", "NOFACE"], "pass --ip-adapter-image a picture with a face"),
    (["--ip-adapter-image", "FACE"], "pass --face-models InsightFace's buffalo_l folder"),
    (["--ip-adapter-image", "FACE", "--face-models", str(IPA)], "pass --face-models InsightFace's buffalo_l folder"),
])
def test_generate_cli_face_errors_speak_in_flags(adapters, tiny_encoder_graph, tmp_path, capsys, flags,  # noqa: F811
                                                 words):
    from PIL import Image

    from sdrt.cli import main

    Image.fromarray(ff.face_picture()).save(tmp_path / "face.png")
    Image.fromarray(ff.no_face_picture()).save(tmp_path / "noface.png")
    if "NOFACE" in flags:
        flags = [*flags, "--face-models", str(BUFFALO)]
    flags = [str(tmp_path / "face.png") if f == "FACE" else str(tmp_path / "noface.png") if f == "NOFACE" else f
             for f in flags]
    rc = main(["generate", str(FOLDER), "a cat", "--steps", "1", "--backend", "reference", "-o",
               str(tmp_path / "o.png"), "--width", "64", "--height", "64", "--ip-adapter",
               str(adapters[("sd15", False)]), *flags])
    err = capsys.readouterr().err
    assert rc != 0
    assert words in err, err
    assert "Traceback" not in err and len([line for line in err.splitlines() if line.startswith("error:")]) == 1, err


def test_low_memory_releases_the_face_graphs(adapters, tiny_encoder_graph):  # noqa: F811
    """With low_memory the detector and recognizer are closed once the face is encoded (as the image encoder is),
    and the image is the same; they stay compiled otherwise."""
    case = CASES[0]
    with pipelines.load(FOLDER, backend="reference", low_memory=True) as pipe:
        got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=face_unit(case, adapters),
                            **kwargs(case)).images
        models = next(iter(pipe.__dict__["_face_models"].values()))
        assert not models.detector.sessions and not models.recognizer.sessions
    assert_matches_diffusers(got, REFS[case["name"]])
    with pipelines.load(FOLDER, backend="reference") as pipe:
        pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=face_unit(case, adapters), **kwargs(case))
        models = next(iter(pipe.__dict__["_face_models"].values()))
        assert models.detector.sessions and models.recognizer.sessions


def _a_bigger_worse_face(monkeypatch) -> tuple[list, list]:
    """The stand-in detector's faces are all ~48 px and its best scored is also its largest (REFS), so the two
    rules cannot be told apart on it: a larger, lower-scored face is added after what it finds. Returns (that face
    in a list once detected, the faces embedded)."""
    from sdrt.pipelines.faces import Face

    real_detect, real_embed = FaceModels.detect, FaceModels.embed
    big: list = []
    embedded: list = []

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
    return big, embedded


@pytest.mark.parametrize("largest", [None, False, True])
def test_faceid_embeds_the_best_scored_face_unless_asked_for_the_largest(adapters, monkeypatch, largest):
    """The API follows h94's model cards and diffusers' FaceID examples (``faces[0]``, InsightFace's best scored);
    ``largest_face=True`` takes sd-webui-controlnet's ``pick_largest_face`` rule (what sdrt serve sends)."""
    from sdrt.pipelines import ipadapter

    big, embedded = _a_bigger_worse_face(monkeypatch)
    register("reference")
    case = next(c for c in CASES if not c["plus"] and c["base"] == "sd15")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        ad = open_ip_adapter(adapters[("sd15", False)], base="sd1", text_width=32)
        ipadapter.face_inputs(pipe, ad, face_unit(case, adapters, largest_face=largest), 0, 1)
    if largest:
        assert embedded[-1] is big[0]
    else:
        assert embedded[-1] is not big[0] and abs(embedded[-1].score - REFS["scores"][0]) < 1e-4


def test_largest_face_must_be_a_bool(adapters):
    from sdrt.pipelines.ipadapter import parse

    with pytest.raises(InputError, match="largest_face must be True, False or None"):
        parse(face_unit(CASES[0], adapters, largest_face="yes"))
