"""IP-Adapter through the A1111 API, as sd-webui-controlnet takes it: a ControlNet unit whose ``module`` is an
IP-Adapter CLIP module (``ip-adapter_clip_sd15``, ``ip-adapter_clip_h``) and whose ``model`` names the adapter in the
models folder's ``ControlNet/``; its ``weight`` is the scale. The picture equals the Python API's for the same
adapter (which tests/pipelines/test_ipadapter.py checks against diffusers). The image encoder is the tiny one of
tests/data/ipadapter, as ``image_encoder/`` beside the adapter (h94's layout) or in the models folder's
``clip_vision/`` (ComfyUI's), bound onto the tiny graph that stands in for the shipped ViT-H/14 graph."""

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
from sdrt.pipelines import IPAdapter

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data"
IPA = DATA / "ipadapter"
REFS = np.load(IPA / "refs.npz")
BASE = dict(prompt="a photo of a red cat", negative_prompt="blurry", steps=3, width=64, height=64, seed=11,
            sampler_name="Euler", cfg_scale=7)


@pytest.fixture(scope="module")
def tiny_encoder_graph() -> Iterator[None]:
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    with pytest.MonkeyPatch.context() as mp:
        tiny = {"clip_vision_h": IPA / "clip_vision.onnx", "clip_vision_g": IPA / "clip_vision_g.onnx"}
        mp.setattr(graphs, "shipped_graph", lambda n: tiny.get(n) or real(n))
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ipa-models")
    shutil.copytree(DATA / "pipelines" / "tiny-sd15", root / "tiny-sd15")
    (root / "ControlNet").mkdir()
    shutil.copy(IPA / "ip-adapter_tiny.safetensors", root / "ControlNet" / "ip-adapter_sd15.safetensors")
    shutil.copytree(IPA / "image_encoder", root / "ControlNet" / "image_encoder")
    shutil.copy(IPA / "ip-adapter_tiny_sdxl.safetensors", root / "ControlNet" / "ip-adapter_sdxl_vit-h.safetensors")
    shutil.copy(IPA / "ip-adapter-plus_tiny.safetensors", root / "ControlNet" / "ip-adapter-plus_sd15.safetensors")
    # the ViT-bigG/14 adapter: its encoder in ComfyUI's clip_vision/ (the one beside is ViT-H/14)
    shutil.copy(IPA / "ip-adapter_tiny_vit-G.safetensors", root / "ControlNet" / "ip-adapter_sd15_vit-G.safetensors")
    shutil.copy(IPA / "ip-adapter-full-face_tiny.safetensors", root / "ControlNet" / "ip-adapter-full-face_sd15.safetensors")
    (root / "clip_vision").mkdir()
    shutil.copy(IPA / "image_encoder_g" / "model.safetensors",
                root / "clip_vision" / "CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors")
    return root


@pytest.fixture(scope="module")
def server(models, tiny_encoder_graph) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models, backend="reference")) as url:
        yield url


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _post(url: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/sdapi/v1/txt2img", json=body, timeout=300)


def _unit(**kw) -> dict:
    return {"enabled": True, "module": "ip-adapter_clip_sd15", "model": "ip-adapter_sd15 [0123abcd]",
            "image": _b64(REFS["ip_image"]), "weight": 0.6, **kw}


KW = dict(steps=3, width=64, height=64, seed=11, sampler="Euler", cfg=7)  # BASE's settings, in the API's words


def _served(r: requests.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))


def _api(pipe, models: Path, adapter: str | None) -> np.ndarray:
    """The Python API's image of BASE with ControlNet/ADAPTER at 0.6 (None: without an adapter)."""
    ip = None if adapter is None else IPAdapter(models / "ControlNet" / adapter, image=REFS["ip_image"], scale=0.6,
                                               image_encoder=IPA / "image_encoder")
    return pipe.generate(BASE["prompt"], "blurry", ip_adapter=ip, **KW).images[0]


def test_an_ip_adapter_unit_gives_the_python_apis_image(server, models) -> None:
    r = _post(server, dict(BASE, alwayson_scripts={"controlnet": {"args": [_unit()]}}))
    got = _served(r)
    with pipelines.load(models / "tiny-sd15", backend="reference") as pipe:
        want = _api(pipe, models, "ip-adapter_sd15.safetensors")
        plain = _api(pipe, models, None)
    assert np.array_equal(got, want)
    assert np.abs(want.astype(int) - plain.astype(int)).max() > 20
    assert r.json()["info"].count("sdrt_not_honoured") <= 1


def test_an_ip_adapter_plus_unit_gives_the_python_apis_image(server, models) -> None:
    """h94's ip-adapter-plus_sd15 in ControlNet/ (the extension's ip-adapter_clip_sd15 module, as for the base one):
    the Resampler's 16 tokens, the Python API's image (tests/pipelines/test_ipadapter_plus.py checks it against
    diffusers)."""
    unit = _unit(model="ip-adapter-plus_sd15 [0123abcd]")
    r = _post(server, dict(BASE, alwayson_scripts={"controlnet": {"args": [unit]}}))
    got = _served(r)
    with pipelines.load(models / "tiny-sd15", backend="reference") as pipe:
        want = _api(pipe, models, "ip-adapter-plus_sd15.safetensors")
        base = _api(pipe, models, "ip-adapter_sd15.safetensors")
    assert np.array_equal(got, want)
    assert np.abs(want.astype(int) - base.astype(int)).max() > 20  # the Plus file, not the base one
    assert "Model: ip-adapter-plus_sd15" in r.json()["info"]


@pytest.mark.parametrize("module", ["ip-adapter_clip_g", "ip-adapter_clip_sdxl", "CLIP-ViT-bigG (IPAdapter)"])
def test_a_vit_bigg_unit_matches_diffusers(server, module) -> None:
    """sd-webui-controlnet's bigG module (and its old name, Forge's) with ip-adapter_sd15_vit-G, the encoder found
    in ComfyUI's clip_vision/ by what the adapter reads: diffusers' load_ip_adapter image
    (scripts/gen_ipadapter_more_refs.py)."""
    import json

    case = json.loads((IPA / "more_refs.json").read_text())[0]
    assert case["name"] == "vitg/sd15/Euler/0.6"
    unit = _unit(module=module, model="ip-adapter_sd15_vit-G", weight=case["scale"])
    body = dict(BASE, prompt=case["prompt"], negative_prompt=case["negative_prompt"], steps=case["steps"],
                cfg_scale=case["cfg"], seed=case["seed"], alwayson_scripts={"controlnet": {"args": [unit]}})
    got = _served(_post(server, body))
    want = np.load(IPA / "more_refs.npz")[case["name"]]
    diff = np.abs(got.astype(int) - want[0].astype(int))  # the diffusers references' bound
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, (diff.max(), (diff > 0).mean())


def test_a_module_naming_the_other_encoder_is_refused(tmp_path) -> None:
    """Full-size headers: ip-adapter_sdxl (reads ViT-bigG/14's image embeds) with the ViT-H module, and the other way."""
    import json
    import struct

    from sdrt.serve.controlnet import _same_encoder
    from sdrt.serve.errors import ApiError

    def adapter(name: str, image_dim: int) -> Path:  # a safetensors header whose data the file system does not store
        shapes = {"image_proj.proj.weight": (4 * 2048, image_dim), "image_proj.proj.bias": (4 * 2048,),
                  "image_proj.norm.weight": (2048,), "image_proj.norm.bias": (2048,),
                  "ip_adapter.1.to_k_ip.weight": (640, 2048), "ip_adapter.1.to_v_ip.weight": (640, 2048)}
        header, off = {}, 0
        for key, shape in shapes.items():
            n = int(np.prod(shape)) * 2
            header[key] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(tmp_path / name, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + off)
        return tmp_path / name

    xl, vith = adapter("ip-adapter_sdxl.safetensors", 1280), adapter("ip-adapter_sdxl_vit-h.safetensors", 1024)
    with pytest.raises(ApiError, match="the module ip-adapter_clip_h runs the ViT-H/14 image encoder and "
                                       "ip-adapter_sdxl.safetensors reads ViT-bigG/14's image embeds; send module "
                                       "ip-adapter_clip_g") as info:
        _same_encoder("ip-adapter_clip_h", xl, "f.module")
    assert info.value.status == 400
    with pytest.raises(ApiError, match="send module ip-adapter_clip_sd15"):
        _same_encoder("ip-adapter_clip_sdxl", vith, "f.module")
    for module, ad in (("ip-adapter_clip_g", xl), ("ip-adapter-auto", xl), ("ip-adapter_clip_sdxl_plus_vith", vith)):
        _same_encoder(module, ad, "f.module")


@pytest.mark.parametrize("unit, field, words", [
    (_unit(module="ip-adapter_face_id"), "module", "it is no FaceID adapter"),
    (_unit(module="ip-adapter_face_id_portrait"), "module", "IP-Adapter variant sdrt does not build"),
    (_unit(model="nothing_here"), "model", "no ControlNet model named"),
    (_unit(model="ip-adapter_sdxl_vit-h"), "model", "and the model is SD 1.x"),
    (_unit(image=None), "image", "needs its picture"),
    (_unit(weight=11), "weight", "at most 10"),
    (_unit(guidance_start=0.8, guidance_end=0.2), "guidance_start", "is after"),
    (_unit(guidance_end=1.5), "guidance_end", "at most 1"),
])
def test_bad_ip_adapter_units(server, unit, field, words) -> None:
    r = _post(server, dict(BASE, alwayson_scripts={"controlnet": {"args": [unit]}}))
    assert r.status_code == 400, r.text
    body = r.json()
    assert words in body["message"], body
    assert body.get("field") in (f"alwayson_scripts.controlnet.args[0].{field}", None), body
    assert "\n" not in body["message"]


def test_a_bad_second_ip_unit_is_named_in_the_requests_words(server) -> None:
    """Two IP units, the second's adapter made for SDXL: the answer names that unit's model field, in the message's
    "what to do" too; until 2026-12-01 it said "pass ip_adapter an IP-Adapter made for the model"."""
    units = [_unit(), _unit(model="ip-adapter_sdxl_vit-h")]
    r = _post(server, dict(BASE, alwayson_scripts={"controlnet": {"args": units}}))
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == "alwayson_scripts.controlnet.args[1].model", body
    assert "pass alwayson_scripts.controlnet.args[1].model an IP-Adapter made for" in body["message"], body
    assert "ip_adapter" not in body["message"].replace("ip-adapter", ""), body


def test_the_image_encoder_is_found_beside_the_adapter_or_in_comfyuis_clip_vision(tmp_path) -> None:
    from types import SimpleNamespace

    from sdrt.serve.controlnet import _image_encoder
    from sdrt.serve.errors import ApiError

    (tmp_path / "ControlNet").mkdir()
    adapter = shutil.copy(IPA / "ip-adapter_tiny.safetensors", tmp_path / "ControlNet" / "ip-adapter_sd15.safetensors")
    registry = SimpleNamespace(models_dir=tmp_path)  # the registry's one attribute this reads
    with pytest.raises(ApiError, match="no image encoder for the IP-Adapter: put h94/IP-Adapter's") as info:
        _image_encoder(Path(adapter), registry, "f")
    assert info.value.status == 400
    (tmp_path / "clip_vision").mkdir()
    for name, enc in (("CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors", "image_encoder_g"),
                      ("CLIP-ViT-H-14-laion2B-s32B-b79K.safetensors", "image_encoder")):
        shutil.copy(IPA / enc / "model.safetensors", tmp_path / "clip_vision" / name)
    vitg = shutil.copy(IPA / "ip-adapter_tiny_vit-G.safetensors", tmp_path / "ControlNet" / "ip-adapter_sd15_vit-G.safetensors")
    assert _image_encoder(Path(adapter), registry, "f").name == "CLIP-ViT-H-14-laion2B-s32B-b79K.safetensors"
    assert _image_encoder(Path(vitg), registry, "f").name == "CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors"
    shutil.copytree(IPA / "image_encoder", tmp_path / "ControlNet" / "image_encoder")
    assert _image_encoder(Path(adapter), registry, "f") == tmp_path / "ControlNet" / "image_encoder"
    # the ViT-H/14 folder beside it gives 24-wide embeds and the bigG adapter reads 20-wide: clip_vision/'s bigG
    assert _image_encoder(Path(vitg), registry, "f").name == "CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors"
    # ComfyUI's other bigG name, alone with the ViT-H one
    (tmp_path / "clip_vision" / "CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors").rename(
        tmp_path / "clip_vision" / "clip_vision_g.safetensors")
    assert _image_encoder(Path(vitg), registry, "f").name == "clip_vision_g.safetensors"


MULTI = np.load(IPA / "multi_refs.npz")
MULTI_CASES = {c["name"]: c for c in json.loads((IPA / "multi_refs.json").read_text())}


def test_several_ip_units_run_together_each_in_its_window_as_the_extension(server, models) -> None:
    """Two IP-Adapter units (the base adapter on one picture, the Plus one on another), each with its
    guidance_start / guidance_end: diffusers' image of the two adapters switched on and off by sd-webui-controlnet's
    rule (start <= i / n <= end; scripts/gen_ipadapter_multi_refs.py), the Python API's with window="a1111", one
    "ControlNet N" infotext entry per unit with its window, and no note about the window."""
    case = MULTI_CASES["multi/sd15/window/a1111"]
    pictures = {"a": REFS["ip_image"], "b": MULTI["picture_b"]}
    files = {"ip-adapter_tiny.safetensors": "ip-adapter_sd15", "ip-adapter-plus_tiny.safetensors": "ip-adapter-plus_sd15"}
    units = [_unit(model=f"{files[f]} [0123abcd]", image=_b64(pictures[pic]), weight=scale, guidance_start=start,
                   guidance_end=end) for f, pic, scale, start, end in case["adapters"]]
    body = dict(BASE, steps=case["steps"], seed=case["seed"], cfg_scale=case["cfg"],
                alwayson_scripts={"controlnet": {"args": [units[0], {"enabled": False}, units[1]]}})
    r = _post(server, body)
    got = _served(r)
    diff = np.abs(got.astype(int) - MULTI[case["name"]][0].astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, (diff.max(), (diff > 0).mean())
    ips = [IPAdapter(models / "ControlNet" / f"{files[f]}.safetensors", image=pictures[pic], scale=scale,
                     image_encoder=IPA / "image_encoder", start=start, end=end, window="a1111")
           for f, pic, scale, start, end in case["adapters"]]
    with pipelines.load(models / "tiny-sd15", backend="reference") as pipe:
        want = pipe.generate(BASE["prompt"], "blurry", ip_adapter=ips, **dict(KW, steps=case["steps"],
                                                                              seed=case["seed"])).images[0]
    assert np.array_equal(got, want)
    info = r.json()["info"]
    assert "ControlNet 0: \\\"Module: ip-adapter_clip_sd15, Model: ip-adapter_sd15, Weight: 0.9, " in info, info
    assert "Guidance Start: 0.3, Guidance End: 1" in info and "ControlNet 1: " in info, info
    assert "window" not in info


def test_a_vit_bigg_unit_and_a_full_face_unit_run_together_in_their_windows(server, models) -> None:
    """A ViT-bigG/14 unit (ip-adapter_clip_g, its encoder in clip_vision/) up to half the steps and a Full Face unit
    (ip-adapter_clip_h, the ViT-H/14 encoder beside it) from 0.3: two encoders in one request, diffusers' image of
    the two adapters by the extension's window rule (scripts/gen_ipadapter_mixed_refs.py) within 1 level, and the
    Python API's with window="a1111" exactly."""
    case = next(c for c in json.loads((IPA / "mixed_refs.json").read_text())
                if c["name"] == "mixed/sd15/vitg+fullface/window/a1111")
    pictures = {"a": REFS["ip_image"], "b": MULTI["picture_b"]}
    served = {"ip-adapter_tiny_vit-G.safetensors": ("ip-adapter_clip_g", "ip-adapter_sd15_vit-G",
                                                    models / "clip_vision" / "CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors"),
              "ip-adapter-full-face_tiny.safetensors": ("ip-adapter_clip_h", "ip-adapter-full-face_sd15",
                                                        models / "ControlNet" / "image_encoder")}
    units = [_unit(module=served[f][0], model=served[f][1], image=_b64(pictures[pic]), weight=scale,
                   guidance_start=start, guidance_end=end) for f, pic, scale, start, end in case["adapters"]]
    body = dict(BASE, steps=case["steps"], seed=case["seed"], cfg_scale=case["cfg"],
                alwayson_scripts={"controlnet": {"args": units}})
    r = _post(server, body)
    got = _served(r)
    diff = np.abs(got.astype(int) - np.load(IPA / "mixed_refs.npz")[case["name"]][0].astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, (diff.max(), (diff > 0).mean())
    ips = [IPAdapter(models / "ControlNet" / f"{served[f][1]}.safetensors", image=pictures[pic], scale=scale,
                     image_encoder=served[f][2], start=start, end=end, window="a1111")
           for f, pic, scale, start, end in case["adapters"]]
    with pipelines.load(models / "tiny-sd15", backend="reference") as pipe:
        want = pipe.generate(BASE["prompt"], "blurry", ip_adapter=ips, **dict(KW, steps=case["steps"],
                                                                              seed=case["seed"])).images[0]
    assert np.array_equal(got, want)
    info = r.json()["info"]
    assert "Model: ip-adapter_sd15_vit-G, Weight: 0.8" in info and "Guidance Start: 0, Guidance End: 0.5" in info, info
    assert "ControlNet 1: \\\"Module: ip-adapter_clip_sd15, Model: ip-adapter-full-face_sd15, Weight: 0.6" in info, info


def test_the_controlnet_script_is_the_last_key_naming_it_for_ip_units_too(server) -> None:
    """Two keys of alwayson_scripts naming the ControlNet script ("ControlNet", "controlnet"): the units of the
    last run (A1111 writes each key's args in turn), for ControlNet and IP-Adapter units alike, and the earlier key
    is named as not used. The IP units were read from the first key before, the ControlNet ones from the last."""
    first = _unit(model="ip-adapter-plus_sd15 [0123abcd]")
    r = _post(server, dict(BASE, steps=1, alwayson_scripts={"ControlNet": {"args": [first]},
                                                           "controlnet": {"args": [_unit()]}}))
    assert r.status_code == 200, r.text
    info = r.json()["info"]
    assert "Model: ip-adapter_sd15," in info and "ip-adapter-plus_sd15" not in info, info
    assert "alwayson_scripts.ControlNet: another key names the ControlNet script after it" in info, info


@pytest.fixture(scope="module")
def cn_server(tmp_path_factory, tiny_encoder_graph) -> Iterator[tuple[str, Path]]:
    """A server of tiny-sd15-controlnet (its own nets) with the adapters and their encoder in ControlNet/."""
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("ipa-cn-models")
    shutil.copytree(DATA / "pipelines" / "tiny-sd15-controlnet", root / "tiny-cn")
    (root / "ControlNet").mkdir()
    shutil.copy(IPA / "ip-adapter_tiny.safetensors", root / "ControlNet" / "ip-adapter_sd15.safetensors")
    shutil.copy(IPA / "ip-adapter-plus_tiny.safetensors", root / "ControlNet" / "ip-adapter-plus_sd15.safetensors")
    shutil.copytree(IPA / "image_encoder", root / "ControlNet" / "image_encoder")
    with live_server(ServeConfig(models=root, backend="reference")) as url:
        yield url, root


def test_controlnet_and_ip_units_mix(cn_server) -> None:
    """A ControlNet unit and IP-Adapter units in one request: with one IP unit, diffusers' image of
    StableDiffusionControlNetPipeline with the adapter loaded (tests/data/ipadapter/refs.npz); with the ControlNet
    unit between two IP units with windows, the Python API's image of the same units (the IP ones by the extension's
    window rule), and the infotext numbers the ControlNet unit first, then the IP units."""
    url, root = cn_server
    from sdrt.pipelines import ControlNet

    case = next(c for c in json.loads((IPA / "refs.json").read_text()) if c["name"] == "controlnet+ip/Euler/0.6")
    edges = np.load(DATA / "pipelines" / "tiny-sd15-controlnet" / "refs.npz")["edges"]
    net = {"enabled": True, "module": "none", "model": "controlnet", "image": _b64(edges),
           "weight": case["control_scale"]}
    body = dict(BASE, steps=case["steps"], seed=case["seed"], cfg_scale=case["cfg"])
    got = _served(_post(url, dict(body, alwayson_scripts={"controlnet": {"args": [net, _unit(weight=case["scale"])]}})))
    diff = np.abs(got.astype(int) - REFS[case["name"]][0].astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, (diff.max(), (diff > 0).mean())
    units = [_unit(weight=0.9, guidance_end=0.5), net,
             _unit(model="ip-adapter-plus_sd15", image=_b64(MULTI["picture_b"]), weight=0.8, guidance_start=0.3)]
    r = _post(url, dict(body, steps=5, alwayson_scripts={"controlnet": {"args": units}}))
    got = _served(r)
    ips = [IPAdapter(root / "ControlNet" / "ip-adapter_sd15.safetensors", image=REFS["ip_image"], scale=0.9, end=0.5,
                     image_encoder=IPA / "image_encoder", window="a1111"),
           IPAdapter(root / "ControlNet" / "ip-adapter-plus_sd15.safetensors", image=MULTI["picture_b"], scale=0.8,
                     start=0.3, image_encoder=IPA / "image_encoder", window="a1111")]
    with pipelines.load(root / "tiny-cn", backend="reference") as pipe:
        kw = dict(KW, steps=5, seed=case["seed"], cfg=case["cfg"])
        want = pipe.generate(BASE["prompt"], "blurry", ip_adapter=ips, controlnets=[
            ControlNet("controlnet", edges, case["control_scale"], window="a1111")], **kw).images[0]
        only_net = pipe.generate(BASE["prompt"], "blurry", controlnets=[
            ControlNet("controlnet", edges, case["control_scale"], window="a1111")], **kw).images[0]
    assert np.array_equal(got, want)
    assert np.abs(got.astype(int) - only_net.astype(int)).max() > 20
    info = r.json()["info"]
    assert "ControlNet 0: \\\"Module: none, Model: controlnet" in info, info
    assert "ControlNet 1: \\\"Module: ip-adapter_clip_sd15, Model: ip-adapter_sd15, Weight: 0.9" in info, info
    assert "ControlNet 2: \\\"Module: ip-adapter_clip_sd15, Model: ip-adapter-plus_sd15, Weight: 0.8" in info, info


@pytest.fixture(scope="module")
def flux_server(tmp_path_factory, tiny_encoder_graph) -> Iterator[str]:
    """A server of tiny-flux-dev (a family without IP-Adapter) with an SD 1.x adapter and its encoder in ControlNet/."""
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("ipa-flux-models")
    shutil.copytree(DATA / "pipelines" / "tiny-flux-dev", root / "tiny-flux-dev")
    (root / "ControlNet").mkdir()
    shutil.copy(IPA / "ip-adapter_tiny.safetensors", root / "ControlNet" / "ip-adapter_sd15.safetensors")
    shutil.copytree(IPA / "image_encoder", root / "ControlNet" / "image_encoder")
    with live_server(ServeConfig(models=root, backend="reference")) as url:
        yield url


@pytest.mark.parametrize("n", [1, 2])
def test_ip_units_on_a_model_without_ip_adapter_are_refused_in_the_requests_words(flux_server, n) -> None:
    """One or two IP units on Flux.1: a 400 naming the first unit's model field, in the field and the message.
    Until 2026-12-01 two units were refused on the field "ip_adapter" ("leave ip_adapter out"), the Python API's
    argument, which no request has."""
    body = {k: v for k, v in BASE.items() if k != "cfg_scale"}
    r = _post(flux_server, dict(body, alwayson_scripts={"controlnet": {"args": [_unit()] * n}}))
    assert r.status_code == 400, r.text
    got = r.json()
    assert "IP-Adapter is not supported for Flux.1" in got["message"], got
    assert got["field"] == "alwayson_scripts.controlnet.args[0].model", got
    assert "ip_adapter" not in got["message"].replace("ip-adapter", ""), got
