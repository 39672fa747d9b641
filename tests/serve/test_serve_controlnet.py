"""ControlNet through the A1111 API, as sd-webui-controlnet exposes it: ``alwayson_scripts.controlnet`` units from
``webuiapi``'s ``ControlNetUnit`` (a client no one here wrote) and from raw HTTP, against a live server serving the
tiny SD 1.5 ControlNet model (tests/data/pipelines/tiny-sd15-controlnet: its own ``controlnet``/``controlnet_2``
parts, and a copy of ``controlnet_2`` in the models folder's ``ControlNet/``). Each picture equals what the Python
API makes for the same unit (whose ControlNet is checked against diffusers in tests/pipelines); the
``/controlnet/*`` routes answer from what the server has."""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

from sdrt import pipelines
from sdrt.pipelines.controlnet import ControlNet, preprocess

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"


@pytest.fixture(scope="module")
def cn_models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cn-models")
    shutil.copytree(DATA, root / "tiny-cn")
    (root / "ControlNet").mkdir()
    shutil.copytree(DATA / "controlnet_2", root / "ControlNet" / "tiny_scribble")
    shutil.copytree(pipelines.DEMO_MODEL, root / "zz-demo")  # a model whose UNet takes no residuals
    lora = Path(__file__).resolve().parents[1] / "data" / "ckpt" / "sd1" / "lora_kohya.safetensors"
    shutil.copy(lora, root / "ControlNet" / "not_a_net.safetensors")  # listed as A1111 lists files; refused on use
    return root


@pytest.fixture(scope="module")
def cn_server(cn_models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=cn_models, backend="openvino")) as url:
        yield url


@pytest.fixture(scope="module")
def pipe(cn_models):
    with pipelines.load(cn_models / "tiny-cn", backend="openvino") as p:
        yield p


def _photo(h: int = 80, w: int = 96) -> np.ndarray:
    """A picture with edges at every angle: a disc and a bar on a gradient."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 0] = (x * 255 // w).astype(np.uint8)
    img[..., 1] = (y * 255 // h).astype(np.uint8)
    disc = (y - h / 2) ** 2 + (x - w / 3) ** 2 < (h / 4) ** 2
    img[disc] = (250, 240, 230)
    img[h // 5: h // 5 + 6, w // 2: w - 8] = (10, 10, 10)
    return img


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _rgb(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def _post(url: str, route: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/sdapi/v1/{route}", json=body, timeout=300)


BASE = dict(prompt=PROMPT, steps=4, width=64, height=64, seed=11, sampler_name="Euler", cfg_scale=7)


def _python(pipe, units: list[ControlNet], **kw) -> np.ndarray:
    args = dict(steps=4, width=64, height=64, seed=11, sampler="Euler", cfg=7)
    args.update(kw)
    return pipe.generate(PROMPT, controlnets=units, **args).images[0]


# ------------------------------------------------------------------ webuiapi's ControlNetUnit
def test_webuiapi_controlnet_unit_gives_the_python_apis_image(cn_server, cn_models, pipe) -> None:
    webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
    host, port = cn_server.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port), sampler="Euler", steps=4)
    assert api.controlnet_version() == 2
    models = api.controlnet_model_list()
    title = next(m for m in models if m.startswith("tiny_scribble ["))
    photo = _photo()
    unit = webuiapi.ControlNetUnit(image=Image.fromarray(photo), module="canny", model=title, weight=0.7,
                                   resize_mode="Just Resize", processor_res=128, threshold_a=80, threshold_b=160,
                                   guidance_start=0.1, guidance_end=0.8)
    # webuiapi puts the units into its txt2img's default alwayson_scripts dict, which it mutates: every later call
    # in this process (other tests too) would send them again, so each call here passes a dict of its own
    r = api.txt2img(prompt=PROMPT, seed=11, width=64, height=64, cfg_scale=7, controlnet_units=[unit],
                    alwayson_scripts={})
    # webuiapi sends its whole unit (mask None, hr_option Both, low_vram, pixel_perfect, control_mode Balanced):
    # nothing in it is left undone or unread
    assert r.info["sdrt_not_honoured"] == [] and r.info["sdrt_ignored_fields"] == []
    # the extension's step window: on while 0.1 <= i / 4 <= 0.8, steps 1, 2 and 3 (diffusers' rule: 1 and 2)
    unit = ControlNet(str(cn_models / "ControlNet" / "tiny_scribble"), photo, 0.7, 0.1, 0.8, "canny", "Just Resize",
                      80, 160, processor_res=128, window="a1111")
    want = _python(pipe, [unit])
    assert np.array_equal(np.asarray(r.image.convert("RGB")), want)
    unit.window = "diffusers"
    assert not np.array_equal(_python(pipe, [unit]), want)
    text = r.info["infotexts"][0]
    assert ('ControlNet 0: "Module: canny, Model: tiny_scribble, Weight: 0.7, Resize Mode: Just Resize, '
            'Processor Res: 128, Threshold A: 80, Threshold B: 160, Guidance Start: 0.1, Guidance End: 0.8, '
            'Pixel Perfect: False, Control Mode: Balanced"') in text
    # the unit changed the picture
    plain = api.txt2img(prompt=PROMPT, seed=11, width=64, height=64, cfg_scale=7, alwayson_scripts={})
    assert np.abs(np.asarray(plain.image.convert("RGB")).astype(int) - want).max() > 8
    detected = api.controlnet_detect([Image.fromarray(photo)], module="canny", processor_res=128, threshold_a=80,
                                     threshold_b=160)
    assert detected.info == "Success"  # webuiapi reads the answer as a generation's: images decoded, info kept
    assert np.array_equal(np.asarray(detected.image.convert("RGB")), preprocess(photo, "canny", 80, 160, 128))


# ------------------------------------------------------------------ raw HTTP
def test_two_units_img2img_and_the_init_image_as_control(cn_server, cn_models, pipe) -> None:
    """img2img: a unit without an image reads the init image (as the extension reads ``p.init_images[0]``); a
    disabled unit is skipped; the model folder's own part is named as its folder names it."""
    init = _photo(64, 64)
    units = [{"enabled": True, "module": "invert", "model": "controlnet", "weight": 0.9, "resize_mode": 1,
              "control_mode": "Balanced"},
             {"enabled": False, "model": "no such net"},
             {"input_image": _b64(_photo()), "module": "threshold", "model": "TINY_SCRIBBLE [0123abcd]",
              "threshold_a": 100, "guidance": 0.5, "resize_mode": "Resize and Fill", "pixel_perfect": True}]
    r = _post(cn_server, "img2img", dict(BASE, init_images=[_b64(init)], denoising_strength=0.6,
                                         alwayson_scripts={"controlnet": {"args": units}}))
    assert r.status_code == 200, r.text
    info = json.loads(r.json()["info"])
    assert info["sdrt_not_honoured"] == [] and info["sdrt_ignored_fields"] == []
    # the extension's step window: guidance 0.5 of the 3 steps A1111's rule runs at 0.6 of 4 is on for i / 3 <= 0.5: two
    want = _python(pipe, [ControlNet("controlnet", init, 0.9, 0.0, 1.0, "invert", "Crop and Resize", window="a1111"),
                          ControlNet(str(cn_models / "ControlNet" / "tiny_scribble"), _photo(), 1.0, 0.0, 0.5,
                                     "threshold", "Resize and Fill", 100, processor_res=512, pixel_perfect=True,
                                     window="a1111")],
                   init_image=init, strength=0.6, strength_rule="a1111")  # serve runs A1111's img2img steps
    assert np.array_equal(_rgb(r.json()["images"][0]), want)
    text = info["infotexts"][0]
    assert 'ControlNet 0: "Module: invert, Model: controlnet, Weight: 0.9,' in text
    # pixel perfect: the 80x96 image fitted into 64x64 has a shorter side of 53 pixels
    assert 'ControlNet 1: "Module: threshold, Model: tiny_scribble, Weight: 1, Resize Mode: Resize and Fill, ' \
           'Processor Res: 53, Threshold A: 100, Guidance Start: 0, Guidance End: 0.5, Pixel Perfect: True' in text


@pytest.mark.parametrize("unit, mode", [
    ({"control_mode": 1}, "My prompt is more important"),
    ({"control_mode": "ControlNet is more important"}, "ControlNet is more important"),
    ({"control_mode": "2"}, "ControlNet is more important"),
    # the extension's conversion while it read guess_mode (1.1.108 to 1.1.135): true is "ControlNet is more important"
    ({"guess_mode": True, "control_mode": 0}, "ControlNet is more important"),
    ({"guessmode": True}, "ControlNet is more important"),
])
def test_control_modes_run_as_the_python_api(cn_server, cn_models, pipe, unit, mode) -> None:
    photo = _photo(64, 64)
    scribble = str(cn_models / "ControlNet" / "tiny_scribble")
    body = dict(BASE, alwayson_scripts={"controlnet": {"args": [
        {"image": _b64(photo), "model": "controlnet", "weight": 0.8, **unit},
        {"image": _b64(photo), "model": "tiny_scribble", "module": "invert", "guidance_start": 0.25}]}})
    r = _post(cn_server, "txt2img", body)
    assert r.status_code == 200, r.text
    info = json.loads(r.json()["info"])
    assert info["sdrt_not_honoured"] == [] and info["sdrt_ignored_fields"] == []
    want = _python(pipe, [ControlNet("controlnet", photo, 0.8, control_mode=mode),
                          ControlNet(scribble, photo, 1.0, 0.25, 1.0, "invert")])
    assert np.array_equal(_rgb(r.json()["images"][0]), want)
    balanced = _python(pipe, [ControlNet("controlnet", photo, 0.8),
                              ControlNet(scribble, photo, 1.0, 0.25, 1.0, "invert")])
    assert np.abs(want.astype(int) - balanced).max() > 10  # the mode is not Balanced's picture
    text = info["infotexts"][0]
    assert f"Pixel Perfect: False, Control Mode: {mode}\"" in text and "Control Mode: Balanced\"" in text


def test_what_sdrt_does_not_run_is_named(cn_server) -> None:
    unit = {"image": _b64(_photo(64, 64)), "model": "controlnet", "control_mode": 1, "guess_mode": True,
            "mask": _b64(_photo(64, 64)), "advanced_weighting": [1.0] * 13, "made_up": 1}
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"ControlNet": {"args": [unit]},
                                                                "ADetailer": {"args": [{"ad_model": "face"}]}}))
    assert r.status_code == 200, r.text
    info = json.loads(r.json()["info"])
    notes = "\n".join(info["sdrt_not_honoured"])
    for words in ("alwayson_scripts.ADetailer: this A1111 extension is not part of sdrt",
                  "args[0].guess_mode: true ran as 'ControlNet is more important', as the extension turned guess "
                  "mode into it; alwayson_scripts.ControlNet.args[0].control_mode 'My prompt is more important' was "
                  "not used",
                  "args[0].mask: only inpainting ControlNets read a mask", "args[0].advanced_weighting"):
        assert words in notes
    assert info["sdrt_ignored_fields"] == ["alwayson_scripts.ControlNet.args[0].made_up"]


@pytest.mark.parametrize("option", ["Low res only", "High res only", 2])
def test_hr_option_picks_the_hires_fix_passes(cn_server, pipe, option) -> None:
    """A unit's hr_option with enable_hr: the tiny model's size is fixed at 64x64, so the only hires. fix it can run
    is hr_scale 1, a second pass at the first pass's size, which A1111 drops (enable_hr = False): one pass, where
    the extension runs every unit as "Both", so the picture is the plain unit's and no note is made. (The Python
    API keeps its same-size second pass: tests/pipelines/test_controlnet_fidelity.py composes the passes.) A bad
    hr_option is still a 400."""
    unit = {"image": _b64(_photo()), "model": "controlnet", "hr_option": option}
    hires = dict(enable_hr=True, hr_scale=1, hr_upscaler="Lanczos", hr_second_pass_steps=2, denoising_strength=0.5)
    r = _post(cn_server, "txt2img", dict(BASE, **hires, alwayson_scripts={"controlnet": {"args": [unit]}}))
    assert r.status_code == 200, r.text
    assert not json.loads(r.json()["info"]).get("sdrt_not_honoured")
    assert "Hires" not in json.loads(r.json()["info"])["infotexts"][0]

    def made(opt: str, **kw) -> np.ndarray:
        return _python(pipe, [ControlNet("controlnet", _photo(), window="a1111", hr_option=opt)], **kw)

    got = _rgb(r.json()["images"][0])
    assert np.array_equal(got, made("Both"))
    plain = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [unit]}}))
    assert np.array_equal(_rgb(plain.json()["images"][0]), made("Both"))
    bad = _post(cn_server, "txt2img", dict(BASE, **hires, alwayson_scripts={"controlnet": {"args": [
        dict(unit, hr_option="Hires only")]}}))
    assert bad.status_code == 400 and "hr_option must be 0 to 2 or one of Both, Low res only, High res only" in bad.text


def test_no_enabled_unit_is_the_plain_picture(cn_server) -> None:
    plain = _post(cn_server, "txt2img", BASE)
    off = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [
        {"enabled": False, "image": _b64(_photo()), "model": "controlnet"}]}}))
    assert np.array_equal(_rgb(plain.json()["images"][0]), _rgb(off.json()["images"][0]))
    assert "ControlNet" not in json.loads(off.json()["info"])["infotexts"][0]


@pytest.mark.parametrize("unit, status, field, words", [
    ({"model": "nope"}, 400, "model", "no ControlNet model named 'nope'; this server has: not_a_net ["),
    ({"model": "None"}, 400, "model", "names no ControlNet model"),
    ({"model": "controlnet", "image": "!!not base64!!"}, 400, "image", "is not valid base64"),
    ({"model": "controlnet", "image": base64.b64encode(b"not a picture").decode()}, 400, "image",
     "not a readable image"),
    ({"model": "controlnet", "weight": 10.5}, 400, "weight", "weight must be at most 10"),
    ({"model": "controlnet", "weight": -1}, 400, "weight", "weight must be at least 0"),
    ({"model": "controlnet", "guidance_start": 0.8, "guidance_end": 0.2}, 400, "guidance_start", "is after"),
    ({"model": "controlnet", "module": "seg_ofade20k"}, 400, "module", "needs OneFormer"),
    ({"model": "controlnet", "module": "inpaint_only+lama"}, 400, "module", "needs ControlNetLama.pth, found in"),
    ({"model": "controlnet", "module": "ip-adapter_face_id_portrait"}, 400, "module",
     "needs an IP-Adapter variant sdrt does not build"),
    ({"model": "controlnet", "module": "ip-adapter_face_id_plus"}, 400, "model", "is no IP-Adapter file"),
    # an IP-Adapter module reads an adapter file (tests/serve/test_serve_ipadapter.py), not a ControlNet
    ({"model": "controlnet", "module": "ip-adapter_clip_sd15"}, 400, "model", "is no IP-Adapter file"),
    ({"model": "controlnet", "resize_mode": 7}, 400, "resize_mode", "resize_mode must be 0, 1, 2"),
    ({"model": "controlnet", "control_mode": "Loud"}, 400, "control_mode", "control_mode must be 0 to 2 or one of "
     "Balanced, My prompt is more important, ControlNet is more important, got 'Loud'"),
    ({"model": "controlnet", "control_mode": 3}, 400, "control_mode", "control_mode must be 0 to 2"),
    # refused when the map is made (a colour grid of no 64-pixel cell): named as the slider that gave it
    ({"model": "controlnet", "module": "color", "pixel_perfect": True, "resize_mode": "Resize and Fill",
      "image": _b64(np.full((8, 640, 3), 90, np.uint8))}, 400, "pixel_perfect", "has no 64-pixel cell"),
    ({"model": "controlnet", "image": None}, 400, "image", "needs its control image"),
    # a boolean field is named as the request nests it, not by its bare key
    ({"model": "controlnet", "guess_mode": "maybe"}, 422, "guess_mode", "args[0].guess_mode must be true or false"),
    ({"model": "controlnet", "guessmode": 7}, 422, "guessmode", "args[0].guessmode must be true or false"),
    ({"model": "controlnet", "pixel_perfect": "sure"}, 422, "pixel_perfect", "pixel_perfect must be true or false"),
    ({"model": "controlnet", "enabled": "on?"}, 422, "enabled", "args[0].enabled must be true or false"),
])
def test_bad_units(cn_server, unit, status, field, words) -> None:
    unit = {"image": _b64(_photo()), **unit}
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [unit]}}))
    assert r.status_code == status, r.text
    body = r.json()
    assert body["field"] == f"alwayson_scripts.controlnet.args[0].{field}" and words in body["message"]
    assert "\n" not in body["message"]


@pytest.mark.parametrize("unit, note, infotext", [
    ({"module": "threshold", "threshold_a": 300}, "threshold_a: 300 is outside Binarization Threshold's 0 to 255, so "
     "the default 127 ran", "Threshold A: 127"),
    ({"module": "canny", "processor_res": 4096}, "processor_res: 4096 is outside Preprocessor Resolution's 64 to "
     "2048, so the default 512 ran", "Processor Res: 512"),
    ({"module": "canny", "processor_res": 32, "threshold_a": 0}, "threshold_a: 0 is outside Canny Low Threshold's "
     "1 to 255, so the default 100 ran", "Threshold A: 100"),
    ({"module": "canny", "threshold_a": -1, "threshold_b": -1}, None, "Threshold B: 200"),
    ({"module": "shuffle", "processor_res": 768}, "processor_res: shuffle runs at 512 whatever is sent", "Processor Res: 512"),
    # pixel_perfect's resolution replaces processor_res (the extension sets it after the check): nothing to name
    ({"module": "canny", "processor_res": 4096, "pixel_perfect": True}, None, "Pixel Perfect: True"),
])
def test_out_of_range_sliders_take_the_default(cn_server, unit, note, infotext) -> None:
    """The extension's ``bound_check_params``: a slider value outside the slider's range runs the default (and is
    named: the extension logs it, sdrt says it in ``sdrt_not_honoured``); -1, the API's "unset", silently."""
    unit = {"image": _b64(_photo()), "model": "controlnet", **unit}
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [unit]}}))
    assert r.status_code == 200, r.text[-400:]
    info = json.loads(r.json()["info"])
    notes = [n for n in info["sdrt_not_honoured"] if "args[0]." in n]
    if note is None:
        assert notes == [], notes
    else:
        assert any(note in n for n in notes), notes
    assert infotext in info["infotexts"][0], info["infotexts"][0]



def test_bad_script_shapes(cn_server) -> None:
    for scripts, status in (({"controlnet": {"args": {"model": "x"}}}, 422), ({"controlnet": {"args": [True, "canny"]}}, 422),
                            ([], 422)):
        r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts=scripts))
        assert r.status_code == status, r.text


def test_controlnet_routes(cn_server) -> None:
    get = lambda route: requests.get(f"{cn_server}{route}", timeout=60)  # noqa: E731
    assert get("/controlnet/version").json() == {"version": 2}
    titles = get("/controlnet/model_list?update=true").json()["model_list"]
    assert [t.split(" [")[0] for t in titles] == ["not_a_net", "tiny_scribble", "controlnet", "controlnet_2"]
    assert all(t.endswith("]") and len(t.split(" [")[1]) == 9 for t in titles)  # A1111's 8-digit short hash
    plain = get("/controlnet/module_list").json()
    assert plain["module_list"] == ["none", "canny", "invert", "threshold", "scribble", "tile_resample",
                                    "lineart_standard", "scribble_xdog", "shuffle", "color", "blur_gaussian",
                                    "recolor_luminance", "recolor_intensity", "dw_openpose_full", "openpose", "mlsd",
                                    "normal_bae", "depth_anything", "depth_anything_v2",
                                    "openpose_hand", "openpose_face", "openpose_faceonly", "openpose_full",
                                    "lineart", "lineart_coarse", "lineart_anime", "lineart_anime_denoise",
                                    "depth", "normal_map",
                                    "hed", "hed_safe", "scribble_hed", "pidinet", "pidinet_safe", "pidinet_scribble",
                                    "softedge_teed", "softedge_anyline", "pidinet_sketch", "animal_openpose", "instant_id_face_keypoints", "inpaint", "inpaint_only", "inpaint_only+lama", "tile_colorfix",
                                    "tile_colorfix+sharp", "depth_leres", "depth_leres++", "depth_zoe", "segmentation",
                                    "anime_face_segment", "reference_only",
                                    "reference_adain", "reference_adain+attn", "revision_clipvision",
                                    "revision_ignore_prompt", "clip_vision"]
    assert plain["module_detail"]["canny"]["sliders"][1] == {"name": "Canny Low Threshold", "value": 100, "min": 1,
                                                              "max": 255}
    aliased = get("/controlnet/module_list?alias_names=true").json()
    assert "invert (from white bg & black line)" in aliased["module_list"]
    assert "inpaint_global_harmonious" in aliased["module_list"] and "inpaint_only" in aliased["module_list"]
    assert "t2ia_style_clipvision" in aliased["module_list"] and "clip_vision" not in aliased["module_list"]
    assert get("/controlnet/module_list?alias_names=maybe").status_code == 422
    assert get("/controlnet/settings").json() == {"control_net_unit_count": 8}
    assert get("/sdapi/v1/scripts").json()["txt2img"] == ["controlnet", "forge fluxkontext"]
    old = requests.post(f"{cn_server}/controlnet/txt2img", json={}, timeout=60)
    assert old.status_code == 404 and "alwayson_scripts.controlnet.args" in old.json()["message"]
    assert "GET /controlnet/module_list" in get("/controlnet/control_types").json()["message"]


@pytest.mark.parametrize("module, words", [("dw_openpose_full", "needs DWPose's yolox_l.onnx"),
                                            ("openpose", "needs body_pose_model.pth"),
                                            ("normal_bae", "needs scannet.pt"),
                                            ("segmentation", "needs upernet_global_small.pth"),
                                            ("depth_anything", "needs depth_anything_vitl14.pth"),

                                            ("openpose_full", "needs OpenPose's body_pose_model.pth and "
                                                              "hand_pose_model.pth and facenet.pth")])
def test_pose_modules_without_their_files_say_where_to_put_them_without_server_paths(cn_server, module, words):
    """A pose module whose model files are not under the models folder: a 400 on the module field naming the
    folders looked in as ``<models>`` (the server's own paths stay out of answers, as the request fuzz requires)."""
    photo = np.zeros((64, 64, 3), np.uint8)
    r = requests.post(f"{cn_server}/controlnet/detect", json={"controlnet_module": module,
                                                               "controlnet_input_images": [_b64(photo)]}, timeout=60)
    assert r.status_code == 400, r.text
    body = r.json()
    assert words in body["message"] and "<models>/extensions/sd-webui-controlnet" in body["message"], body
    assert "/tmp" not in body["message"] and "\n" not in body["message"] and body["field"] == "controlnet_module"


def test_detect(cn_server) -> None:
    photo = _photo()
    post = lambda body: requests.post(f"{cn_server}/controlnet/detect", json=body, timeout=60)  # noqa: E731
    r = post({"controlnet_module": "threshold", "controlnet_input_images": [_b64(photo), _b64(photo[::-1].copy())],
              "controlnet_threshold_a": 90})
    assert r.status_code == 200 and r.json()["info"] == "Success"
    maps = [_rgb(b) for b in r.json()["images"]]
    assert np.array_equal(maps[0], preprocess(photo, "threshold", 90, None, 512)) and maps[0].shape == (512, 614, 3)
    assert np.array_equal(maps[1], preprocess(photo[::-1].copy(), "threshold", 90, None, 512))
    none = post({"controlnet_module": "none", "controlnet_input_images": [_b64(photo)]}).json()
    assert np.array_equal(_rgb(none["images"][0]), photo)
    for body, status, words in (({"controlnet_module": "canny", "controlnet_input_images": []}, 422, "No image"),
                                ({"controlnet_module": "segmentation_ofade20k", "controlnet_input_images": [_b64(photo)]}, 400,
                                 "not one of sdrt's"),
                                ({"controlnet_module": "canny", "controlnet_input_images": ["@@"]}, 400, "base64")):
        r = post(body)
        assert r.status_code == status and words in r.json()["message"], r.text
    for module, key, value in (("canny", "controlnet_threshold_a", "x"), ("canny", "controlnet_processor_res", "inf")):
        r = post({"controlnet_module": module, "controlnet_input_images": [_b64(photo)], key: value})
        assert r.status_code in (400, 422) and r.json()["field"] == key and r.json()["message"].startswith(key), r.text


def test_a_model_without_controlnet_inputs_and_another_folders_part(cn_server) -> None:
    demo = {"override_settings": {"sd_model_checkpoint": "zz-demo"}}
    r = _post(cn_server, "txt2img", dict(BASE, **demo, alwayson_scripts={"controlnet": {"args": [
        {"image": _b64(_photo()), "model": "tiny_scribble"}]}}))
    assert r.status_code == 400 and "takes no ControlNet residuals" in r.json()["message"], r.text
    r = _post(cn_server, "txt2img", dict(BASE, **demo, alwayson_scripts={"controlnet": {"args": [
        {"image": _b64(_photo()), "model": "controlnet_2 [e3b0c442]"}]}}))
    assert r.status_code == 400 and r.json()["field"] == "alwayson_scripts.controlnet.args[0].model"
    assert "is a part of the model folder tiny-cn and runs with that model only" in r.json()["message"]
    assert _post(cn_server, "txt2img", dict(BASE, **demo)).status_code == 200  # and the model runs without one


def test_a_file_that_is_no_controlnet_is_refused_on_the_units_field(cn_server) -> None:
    """The pipeline's refusal names the unit as the request names it (the disabled unit before it counted), never
    the file's path on the server."""
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [
        {"enabled": False}, {"image": _b64(_photo()), "model": "not_a_net"}]}}))
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == "alwayson_scripts.controlnet.args[1]"
    assert "not_a_net.safetensors is not a ControlNet: it looks like kohya LoRA" in body["message"]


def test_easy_diffusion_controlnet_request(cn_server, cn_models, pipe) -> None:
    """Easy Diffusion 3.5 driving Forge (ui/easydiffusion/backends/webui/impl.py, generate_images() and
    controlnet_filter()): its unit as it builds it, the model named "name [auto1111_hash]", and its /detect call."""
    photo = _photo()
    body = {"force_task_id": "ed-cn-1", "prompt": PROMPT, "negative_prompt": "", "sampler_name": "Euler",
            "scheduler": "simple", "steps": 4, "seed": 11, "cfg_scale": 7, "distilled_cfg_scale": 3.5, "batch_size": 1,
            "width": 64, "height": 64,
            "alwayson_scripts": {"controlnet": {"args": [
                {"image": "data:image/png;base64," + _b64(photo), "weight": 0.8, "module": "canny",
                 "model": "tiny_scribble [e3b0c442]", "resize_mode": "Crop and Resize", "threshold_a": 50,
                 "threshold_b": 130}]}}}
    r = _post(cn_server, "txt2img", body)
    assert r.status_code == 200, r.text
    info = json.loads(r.json()["info"])
    assert info["sdrt_not_honoured"] == [] and info["sdrt_ignored_fields"] == []
    want = _python(pipe, [ControlNet(str(cn_models / "ControlNet" / "tiny_scribble"), photo, 0.8, 0.0, 1.0, "canny",
                                     "Crop and Resize", 50, 130, processor_res=512)], schedule="simple")
    assert np.array_equal(_rgb(r.json()["images"][0]), want)
    detect = requests.post(f"{cn_server}/controlnet/detect", timeout=60, json={
        "controlnet_module": "canny", "controlnet_input_images": [_b64(photo)], "controlnet_processor_res": 512,
        "controlnet_threshold_a": 64, "controlnet_threshold_b": 64})
    assert np.array_equal(_rgb(detect.json()["images"][0]), preprocess(photo, "canny", 64, 64, 512))


def test_a_strip_of_a_control_image_is_refused_not_resized_to_millions_of_pixels(cn_server) -> None:
    """A 2x2000 strip cropped and resized to cover 64x64 would be 64000 pixels long on the way: refused on the unit."""
    strip = np.full((2, 2000, 3), 200, np.uint8)
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [
        {"image": _b64(strip), "model": "controlnet"}]}}))
    assert r.status_code == 400 and r.json()["field"] == "alwayson_scripts.controlnet.args[0]", r.text
    assert "would be 64000 pixels long on the way (the image is 2000x2), above 16384" in r.json()["message"]
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [
        {"image": _b64(strip[:, :100].copy()), "model": "controlnet", "module": "canny", "processor_res": 512}]}}))
    assert r.status_code == 400 and "at processor resolution 512 would be 25600 pixels long" in r.json()["message"]


# ------------------------------------------------------------------ the extension's other model-free modules
def test_the_model_free_modules_as_the_extension_lists_and_runs_them(cn_server, cn_models, pipe) -> None:
    """module_list / module_detail as the extension's preprocessor_sliders_config gives them, /detect by name or
    UI alias (the slider defaults for -1), a txt2img unit equal to the Python API's, and reference_only refused."""
    get = lambda route: requests.get(f"{cn_server}{route}", timeout=60).json()  # noqa: E731
    aliased = get("/controlnet/module_list?alias_names=true")
    assert {"lineart_standard (from white bg & black line)", "t2ia_color_grid"} <= set(aliased["module_list"])
    detail = get("/controlnet/module_list")["module_detail"]
    assert detail["tile_resample"]["sliders"] == [None, {"name": "Down Sampling Rate", "value": 1.0, "min": 1.0,
                                                         "max": 8.0, "step": 0.01}]
    assert detail["scribble_xdog"]["sliders"][1] == {"name": "XDoG Threshold", "min": 1, "max": 64, "value": 32}
    assert detail["blur_gaussian"]["sliders"][1] == {"name": "Sigma", "min": 0.01, "max": 64.0, "value": 9.0}
    assert detail["recolor_intensity"]["sliders"][1]["name"] == "Gamma Correction"
    assert detail["lineart_standard"]["sliders"] == [] and detail["shuffle"]["sliders"] == []
    photo = _photo()
    post = lambda body: requests.post(f"{cn_server}/controlnet/detect", timeout=60,  # noqa: E731
                                      json={"controlnet_input_images": [_b64(photo)], **body})
    for body, want in (
            ({"controlnet_module": "lineart_standard (from white bg & black line)"},
             preprocess(photo, "lineart_standard", None, None, 512)),
            ({"controlnet_module": "tile_resample", "controlnet_threshold_a": 2}, preprocess(photo, "tile_resample", 2)),
            ({"controlnet_module": "recolor_luminance", "controlnet_threshold_a": -1},
             preprocess(photo, "recolor_luminance", 1.0)),
            ({"controlnet_module": "scribble_xdog", "controlnet_processor_res": 128, "controlnet_threshold_a": 20},
             preprocess(photo, "scribble_xdog", 20, None, 128)),
            ({"controlnet_module": "t2ia_color_grid"}, preprocess(photo, "color", None, None, 512)),
            ({"controlnet_module": "blur_gaussian"}, preprocess(photo, "blur_gaussian", 9.0, None, 512))):
        r = post(body)
        assert r.status_code == 200, r.text
        assert np.array_equal(_rgb(r.json()["images"][0]), want), body
    assert _rgb(post({"controlnet_module": "shuffle"}).json()["images"][0]).shape == (512, 614, 3)
    # outside a slider's range, the default (the extension's bound_check_params): webuiapi's detect sends 64s
    for body, want in (({"controlnet_module": "blur_gaussian", "controlnet_threshold_a": 0},
                        preprocess(photo, "blur_gaussian", 9.0, None, 512)),
                       ({"controlnet_module": "recolor_intensity", "controlnet_threshold_a": 64},
                        preprocess(photo, "recolor_intensity", 1.0)),
                       ({"controlnet_module": "tile_resample", "controlnet_threshold_a": 500},
                        preprocess(photo, "tile_resample", 1.0))):
        r = post(body)
        assert r.status_code == 200 and np.array_equal(_rgb(r.json()["images"][0]), want), body
    for body, status, field, words in (
            ({"controlnet_module": "inpaint_only+lama"}, 422, "controlnet_masks", "requires `controlnet_masks`"),
            ({"controlnet_module": "inpaint_only+lama", "controlnet_masks": [_b64(photo)]}, 400, "controlnet_module",
             "needs ControlNetLama.pth, found in")):
        r = post(body)
        assert r.status_code == status and r.json()["field"] == field and words in r.json()["message"], r.text
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [
        {"image": _b64(photo), "model": "controlnet", "module": "shuffle"},
        {"image": _b64(photo), "model": "controlnet_2", "module": "tile_resample", "threshold_a": 2, "weight": 0.5}]}}))
    assert r.status_code == 200, r.text
    text = json.loads(r.json()["info"])["infotexts"][0]
    assert 'ControlNet 1: "Module: tile_resample, Model: controlnet_2, Weight: 0.5,' in text and "Threshold A: 2," in text
    want = _python(pipe, [ControlNet("controlnet", photo, preprocessor="shuffle", processor_res=512, window="a1111"),
                          ControlNet("controlnet_2", photo, 0.5, preprocessor="tile_resample", low=2, window="a1111")])
    assert np.array_equal(_rgb(r.json()["images"][0]), want)


def test_tile_colorfix_units_run_the_colour_fix(cn_server, pipe) -> None:
    """tile_colorfix / +sharp: the extension's sliders in module_detail, /detect's map the picture as it is, a
    txt2img unit the Python API's image (threshold_a the Variation, threshold_b the Sharpness, -1 their defaults) and
    infotext; a Variation that is no whole number is a 400 naming threshold_a."""
    detail = requests.get(f"{cn_server}/controlnet/module_list", timeout=60).json()["module_detail"]
    assert detail["tile_colorfix"]["sliders"] == [None, {"name": "Variation", "value": 8.0, "min": 3.0, "max": 32.0,
                                                         "step": 1.0}]
    assert detail["tile_colorfix+sharp"]["sliders"][2] == {"name": "Sharpness", "value": 1.0, "min": 0.0, "max": 2.0,
                                                           "step": 0.01}
    photo = _photo()
    r = requests.post(f"{cn_server}/controlnet/detect", timeout=60, json={
        "controlnet_module": "tile_colorfix", "controlnet_input_images": [_b64(photo)]})
    assert r.status_code == 200 and np.array_equal(_rgb(r.json()["images"][0]), photo), r.text
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [
        {"image": _b64(photo), "model": "controlnet", "module": "tile_colorfix+sharp", "threshold_a": 3,
         "threshold_b": -1, "weight": 0.8}]}}))
    assert r.status_code == 200, r.text
    text = json.loads(r.json()["info"])["infotexts"][0]
    assert 'ControlNet 0: "Module: tile_colorfix+sharp, Model: controlnet, Weight: 0.8,' in text, text
    assert "Threshold A: 3, Threshold B: 1," in text, text
    want = _python(pipe, [ControlNet("controlnet", photo, 0.8, preprocessor="tile_colorfix+sharp", low=3, high=1,
                                     window="a1111")])
    assert np.array_equal(_rgb(r.json()["images"][0]), want)
    plain = _python(pipe, [ControlNet("controlnet", photo, 0.8, window="a1111")])
    assert np.abs(want.astype(int) - plain).max() > 10  # the colour fix ran
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [
        {"image": _b64(photo), "model": "controlnet", "module": "tile_colorfix", "threshold_a": 8.5}]}}))
    assert r.status_code == 400 and r.json()["field"] == "alwayson_scripts.controlnet.args[0].threshold_a", r.text
    assert "whole number" in r.json()["message"], r.text


@pytest.mark.parametrize(("module", "key", "value", "words"), [
    ("tile_resample", "controlnet_threshold_a", 8, "leaves nothing of a 6x5 image"),
])
def test_detect_a_slider_the_picture_cannot_take_is_a_400_naming_it(cn_server, module, key, value, words) -> None:
    """A slider value in range that the picture cannot take (a down sampling rate leaving no pixel of it, a colour
    grid with no cell) is the preprocessor's refusal: a 400 naming the slider's field, not a 500."""
    photo = _photo()[:5, :6].copy()
    r = requests.post(f"{cn_server}/controlnet/detect", json={
        "controlnet_module": module, "controlnet_input_images": [_b64(photo)], key: value}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == key and r.json()["message"].startswith(key) and words in r.json()["message"], r.text


FIDELITY = np.load(Path(__file__).resolve().parents[1] / "data" / "control" / "cn_fidelity_refs.npz")


def test_webuiapi_only_masked_unit_sees_the_area_repainted(cn_server, cn_models, pipe) -> None:
    """img2img with inpaint_full_res and a canny unit (webuiapi's client): the unit's image is cut to the area
    repainted before its preprocessor, as sd-webui-controlnet's inpaint_crop_input_image (on by default) does. The
    picture equals the Python API's run fed the extension's own map for that cut-out (scripts/gen_cn_fidelity_refs.py:
    Pillow and OpenCV as A1111 and the extension call them); ``inpaint_crop_input_image: false`` (raw HTTP) feeds
    the whole image's map, as the Python API's ``inpaint_crop=False``."""
    webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
    host, port = cn_server.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port), sampler="Euler", steps=4)
    title = next(m for m in api.controlnet_model_list() if m.startswith("tiny_scribble ["))
    picture, mask, control = FIDELITY["picture"], FIDELITY["mask"], FIDELITY["control"]
    unit = webuiapi.ControlNetUnit(image=Image.fromarray(control), module="canny", model=title, threshold_a=50,
                                   threshold_b=150, pixel_perfect=True, resize_mode="Crop and Resize")
    r = api.img2img(images=[Image.fromarray(picture)], mask_image=Image.fromarray(mask), mask_blur=0,
                    inpainting_fill=1, inpaint_full_res=True, inpaint_full_res_padding=8, denoising_strength=0.75,
                    prompt=PROMPT, seed=11, width=64, height=64, cfg_scale=7, controlnet_units=[unit],
                    alwayson_scripts={})  # webuiapi mutates its default dict: a dict of this call's own
    assert r.info["sdrt_not_honoured"] == [], r.info
    got = np.asarray(r.image.convert("RGB"))
    assert got.shape == (80, 96, 3) and "Inpaint area: Only masked" in r.info["infotexts"][0]
    net = str(cn_models / "ControlNet" / "tiny_scribble")
    area = dict(init_image=picture, mask=mask, inpaint_area="only masked", inpaint_padding=8, strength=0.75,
                strength_rule="a1111")  # serve runs A1111's img2img steps
    extensions = ControlNet(net, FIDELITY["crop/Crop and Resize/map"], resize="Crop and Resize", window="a1111",
                            inpaint_crop=False)  # the extension's map of the cut-out, fed as it is
    assert np.array_equal(got, _python(pipe, [extensions], **area))
    body = dict(BASE, init_images=[_b64(picture)], mask=_b64(mask), mask_blur=0, inpainting_fill=1,
                inpaint_full_res=True, inpaint_full_res_padding=8, denoising_strength=0.75,
                alwayson_scripts={"controlnet": {"args": [
                    {"image": _b64(control), "module": "canny", "model": title, "threshold_a": 50, "threshold_b": 150,
                     "pixel_perfect": True, "resize_mode": "Crop and Resize", "inpaint_crop_input_image": False}]}})
    r = _post(cn_server, "img2img", body)
    assert r.status_code == 200, r.text
    whole = _rgb(r.json()["images"][0])
    uncut = ControlNet(net, control, 1.0, 0.0, 1.0, "canny", "Crop and Resize", 50, 150, pixel_perfect=True,
                       window="a1111", inpaint_crop=False)
    assert np.array_equal(whole, _python(pipe, [uncut], **area))
    assert int(np.abs(whole.astype(int) - got).max()) > 10


@pytest.mark.parametrize("module", ["tile_resample", "lineart_standard", "scribble_xdog", "shuffle", "color",
                                    "blur_gaussian", "recolor_luminance", "recolor_intensity"])
def test_webuiapi_detect_with_its_default_sliders(cn_server, module) -> None:
    """webuiapi's controlnet_detect sends processor_res 512 and threshold_a/_b 64 whatever the module: the extension
    (1.1.447 on) takes 64 where the slider reaches it and the slider's default where not (tile_resample's rate, the
    recolor gamma), so sdrt does too, each map the Python API's."""
    webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
    host, port = cn_server.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port))
    photo = _photo()
    detected = api.controlnet_detect([Image.fromarray(photo)], module=module)
    assert detected.info == "Success"
    if module != "shuffle":  # a new random map each call, as the extension's detect
        from sdrt.serve.controlnet import SLIDERS

        sliders = SLIDERS[module]
        slider = sliders[1] if len(sliders) > 1 else None
        a = None if slider is None else 64 if slider["min"] <= 64 <= slider["max"] else slider["value"]
        res = 512 if module in ("lineart_standard", "shuffle") or (sliders and sliders[0] is not None) else None
        want = preprocess(photo, module, a, None, res)
        assert np.array_equal(np.asarray(detected.image.convert("RGB")), want)


def test_reference_only_unit_without_a_model_runs_as_the_python_api(cn_server, pipe) -> None:
    """The extension's reference units (``model: "None"``, Style Fidelity as threshold_a) are the Python API's
    ``ControlNet(None, picture, preprocessor="reference_only")`` (``reference_adain+attn``) with the extension's
    window; listed model-free with their slider."""
    photo = _photo(64, 64)
    unit = {"image": _b64(photo), "module": "reference_only", "model": "None", "weight": 0.8, "threshold_a": 0.3,
            "guidance_end": 0.8, "control_mode": 0}
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [unit]}}))
    assert r.status_code == 200, r.text
    info = json.loads(r.json()["info"])
    assert info["sdrt_not_honoured"] == [] and info["sdrt_ignored_fields"] == []
    want = _python(pipe, [ControlNet(None, photo, 0.8, 0.0, 0.8, "reference_only", low=0.3, window="a1111")])
    assert np.array_equal(_rgb(r.json()["images"][0]), want)
    assert 'ControlNet 0: "Module: reference_only, Model: None, Weight: 0.8, Resize Mode: Crop and Resize, ' \
           'Processor Res: 64, Threshold A: 0.3, Guidance Start: 0, Guidance End: 0.8' in info["infotexts"][0]
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [
        dict(unit, model="tiny_scribble", threshold_a=-1)]}}))  # -1: the slider's default, 0.5
    assert r.status_code == 200, r.text
    info = json.loads(r.json()["info"])
    assert "uses no ControlNet model; 'tiny_scribble' was not used" in info["sdrt_not_honoured"][0]
    assert "Threshold A: 0.5" in info["infotexts"][0]
    detect = requests.post(f"{cn_server}/controlnet/detect", json={"controlnet_module": "reference_only",
                                                                   "controlnet_input_images": [_b64(photo)]},
                           timeout=60)  # the extension's identity: the picture as it is
    assert detect.status_code == 200 and np.array_equal(_rgb(detect.json()["images"][0]), photo), detect.text
    detail = requests.get(f"{cn_server}/controlnet/module_list", timeout=60).json()["module_detail"]
    assert detail["reference_only"] == {"model_free": True, "sliders": [None, {
        "name": "Style Fidelity (only for Balanced mode)", "value": 0.5, "min": 0.0, "max": 1.0, "step": 0.01}]}
    assert detail["canny"]["model_free"] is False
    adain = dict(unit, module="reference_adain+attn", weight=1.5)
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [adain]}}))
    want = _python(pipe, [ControlNet(None, photo, 1.5, 0.0, 0.8, "reference_adain+attn", low=0.3, window="a1111")])
    assert r.status_code == 200 and np.array_equal(_rgb(r.json()["images"][0]), want), r.text
    # a style fidelity outside the slider's 0 to 1: the default 0.5, as the extension's bound_check_params
    r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [dict(adain, threshold_a=2)]}}))
    want = _python(pipe, [ControlNet(None, photo, 1.5, 0.0, 0.8, "reference_adain+attn", low=0.5, window="a1111")])
    assert r.status_code == 200 and np.array_equal(_rgb(r.json()["images"][0]), want), r.text[-300:]
    assert "threshold_a: 2 is outside Style Fidelity (only for Balanced mode)'s 0 to 1" in r.json()["info"]


def test_a_shuffle_unit_is_seeded_once_a_job_from_the_requests_seed_and_subseed(cn_server, pipe) -> None:
    """sd-webui-controlnet seeds numpy once a job (``set_numpy_seed``, before the preprocessor runs) with
    ``seed + subseed`` as the request sent them (a subseed of -1: the seed again, whatever the strength): every
    n_iter batch gets that one shuffle map. serve seeded each n_iter batch from its own first seed (seed + k), a
    subseed sent with strength 0 was dropped and a -1 subseed with a variation strength counted as the drawn one."""
    from sdrt.pipelines.shufflemap import numpy_seed

    photo = _photo()
    unit = {"image": _b64(photo), "model": "controlnet", "module": "shuffle"}

    def want(seed: int, map_seed: int, **kw) -> np.ndarray:
        return _python(pipe, [ControlNet("controlnet", photo, preprocessor="shuffle", processor_res=512,
                                         window="a1111", seed=map_seed)], seed=seed, **kw)

    def run(**kw) -> list[np.ndarray]:
        r = _post(cn_server, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [unit]}}, **kw))
        assert r.status_code == 200, r.text
        return [_rgb(b) for b in r.json()["images"]], json.loads(r.json()["info"])

    images, _ = run(n_iter=2)
    assert np.array_equal(images[1], want(12, numpy_seed(11)))  # the job's map (11 + 11), not batch 2's (12 + 12)
    assert np.array_equal(run(subseed=9)[0][0], want(11, numpy_seed(11, 9)))
    images, info = run(subseed=-1, subseed_strength=0.5)  # the drawn subseed varies the noise, not the map
    drawn = info["all_subseeds"][0]
    assert np.array_equal(images[0], want(11, numpy_seed(11), subseed=drawn, subseed_strength=0.5))
