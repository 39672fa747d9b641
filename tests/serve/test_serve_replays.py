"""Request bodies that Easy Diffusion, Open WebUI and SillyTavern send (their shapes copied into
tests/serve/data/*.json, each file naming its source), replayed against a live server; each
response is read the way that client reads it, and the PNGs with sd-parsers. Run with ``-s`` to
see every call and what came back."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
import uuid

import pytest
from serve_helpers import DATA, live_server, needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
sd_parsers = pytest.importorskip("sd_parsers", reason="sd-parsers is a test dependency: pip install sd-parsers")
Image = pytest.importorskip("PIL.Image", reason="reading the PNGs needs Pillow")

AUTH = ("st-user", "st-pass")
TOKEN = "sk-sdrt-test-token"


def _png_b64(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _fill(value, subs):
    if isinstance(value, str) and value in subs:
        return subs[value]
    if isinstance(value, dict):
        return {k: _fill(v, subs) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, subs) for v in value]
    return value


def _summary(r) -> str:
    try:
        data = r.json()
    except ValueError:
        return r.text[:120]
    if isinstance(data, dict):
        shown = {k: (f"<{len(v)} images>" if k in ("images", "data") and isinstance(v, list) else v)
                 for k, v in data.items() if k not in ("info",)}
        if "info" in data:
            shown["info.infotexts"] = json.loads(data["info"])["infotexts"]
        return json.dumps(shown)[:300]
    return json.dumps(data)[:300]


def _parse_png(b64: str):
    if b64.startswith("data:"):
        b64 = b64.split(",", 1)[1]
    return sd_parsers.ParserManager().parse(Image.open(io.BytesIO(base64.b64decode(b64))))


def _replay(client, name: str, subs: dict, headers: dict | None = None) -> list:
    spec = json.loads((DATA / name).read_text())
    assert spec["source"]
    out = []
    for step in spec["steps"]:
        body = _fill(step.get("body"), {**subs, "$TASK_ID": str(uuid.uuid4())})
        if step.get("body") == "$OPTIONS_WITH_MODEL_B":  # set_image_model(): the options it read, model changed
            body = dict(client.get("/sdapi/v1/options", headers=headers).json(),
                        sd_model_checkpoint=subs["$MODEL_B_TITLE"])
        polls: list = []
        stop = threading.Event()
        if step.get("progress_task"):

            def poll(task=body["force_task_id"], stop=stop, polls=polls):  # image_progress_thread()
                while not stop.is_set():
                    p = client.post("/internal/progress", json={"id_task": task, "live_preview": True,
                                                                 "id_live_preview": -1}).json()
                    polls.append(p)
                    if p["completed"]:
                        break
                    time.sleep(0.005)

            t = threading.Thread(target=poll)
            t.start()
        r = client.request(step["method"], step["path"], json=body, headers=headers)
        if step.get("progress_task"):
            t.join(timeout=30)
            stop.set()
        print(f"[{spec['client']}] {step['what']}: {step['method']} {step['path']} -> {r.status_code} {_summary(r)}")
        assert r.status_code == 200, (step["what"], r.text)
        out.append((step, r, polls))
    return out


def test_easy_diffusion(server) -> None:
    init = Image.new("RGB", (64, 64), (20, 40, 200))
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    subs = {"$INIT_IMAGE": _png_b64(init), "$MASK": _png_b64(mask)}
    with httpx.Client(base_url=server, timeout=60) as client:
        results = _replay(client, "easydiffusion.json", subs)
        options = results[2][1].json()
        assert options["show_progress_every_n_steps"] == 3 and options["forge_additional_modules"] == []
        for step, r, polls in results:
            if step["path"] in ("/sdapi/v1/txt2img", "/sdapi/v1/img2img"):
                res = r.json()
                task = json.loads(res["info"])["sdrt_task_id"]
                infotexts = json.loads(res["info"])["infotexts"]  # what ED prints
                assert len(infotexts) == len(res["images"]) == 1
                assert polls and polls[-1]["completed"] is True
                info = _parse_png(res["images"][0])
                assert info.samplers[0].model.name == "demo-b"
                assert info.samplers[0].name == step["body"]["sampler_name"]
                assert task == json.loads(r.request.content)["force_task_id"]  # the id ED polled
                if step["path"].endswith("img2img"):
                    assert info.metadata["Denoising strength"] == "0.8"
                    not_honoured = json.loads(res["info"])["sdrt_not_honoured"]
                    assert not_honoured == []  # inpaint_full_res is 0, inpainting_fill 1: all honoured
        # set it back for the other tests
        client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "demo-a"})


@pytest.fixture(scope="module")
def auth_server(models_dir):
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models_dir, backend="openvino", auth=(AUTH,), tokens=(TOKEN,))) as url:
        yield url


def test_open_webui(auth_server) -> None:
    basic = "Basic " + base64.b64encode(":".join(AUTH).encode()).decode()  # get_automatic1111_api_auth()
    with httpx.Client(base_url=auth_server, timeout=60) as client:
        models = client.get("/sdapi/v1/sd-models", headers={"authorization": basic}).json()
        subs = {"$OPTIONS_WITH_MODEL_B": "$OPTIONS_WITH_MODEL_B", "$MODEL_B_TITLE": models[1]["title"]}
        a1111 = [s for s in json.loads((DATA / "open_webui.json").read_text())["steps"] if s["path"].startswith("/sd")]
        results = []
        for step in a1111:
            body = _fill(step.get("body"), subs)
            if body == "$OPTIONS_WITH_MODEL_B":
                body = dict(client.get("/sdapi/v1/options", headers={"authorization": basic}).json(),
                            sd_model_checkpoint=subs["$MODEL_B_TITLE"])
            r = client.request(step["method"], step["path"], json=body, headers={"authorization": basic})
            print(f"[Open WebUI] {step['what']}: {step['method']} {step['path']} -> {r.status_code} {_summary(r)}")
            assert r.status_code == 200, r.text
            results.append(r)
        assert [{"id": m["title"], "name": m["model_name"]} for m in results[1].json()][1]["name"] == "demo-b"
        res = results[3].json()
        assert len(res["images"]) == 2 and res["info"]
        for b64 in res["images"]:
            base64.b64decode(b64)  # get_image_data(): no comma -> plain base64 PNG
            assert _parse_png(b64).samplers[0].model.name == "demo-b"
        openai = [s for s in json.loads((DATA / "open_webui.json").read_text())["steps"] if s["path"].startswith("/v1")]
        r = client.post(openai[0]["path"], json=openai[0]["body"], headers={"Authorization": f"Bearer {TOKEN}"})
        print(f"[Open WebUI] {openai[0]['what']}: POST {openai[0]['path']} -> {r.status_code} {_summary(r)}")
        assert r.status_code == 200
        item = r.json()["data"][0]
        assert "url" not in item and _parse_png(item["b64_json"]).samplers[0].model.name == "demo-a"
        # without credentials: refused
        assert client.get("/sdapi/v1/options").status_code == 401
        client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "demo-a"}, headers={"authorization": basic})


def test_sillytavern(auth_server) -> None:
    with httpx.Client(base_url=auth_server, timeout=60, auth=AUTH) as client:
        title_b = client.get("/sdapi/v1/sd-models").json()[1]["title"]
        subs = {"$MODEL_B_TITLE": title_b, "$BASE_URL": auth_server, "$AUTH": ":".join(AUTH)}
        results = _replay(client, "sillytavern.json", subs)
        by_what = {step["what"]: r.json() for step, r, _ in results}
        assert [x["name"] for x in by_what["/upscalers"]] == ["None", "Lanczos", "Nearest"]
        assert "Latent" in [x["name"] for x in by_what["/upscalers (latent)"]]  # SillyTavern's hr_upscaler menu
        assert isinstance(by_what["/vaes (A1111)"], list)
        assert {"DDIM", "DPM fast", "DPM adaptive", "PLMS"} <= {x["name"] for x in by_what["/samplers"]}
        assert {"name": "DPM fast", "aliases": ["dpm_fast"], "options": {"scheduler": "normal"}} in by_what["/samplers"]
        assert "karras" in [x["name"] for x in by_what["/schedulers"]]
        assert [x["title"] for x in by_what["/models"]][1] == title_b
        wait = by_what["/set-model: wait for the load"]
        assert wait["progress"] == 0.0 and wait["state"]["job_count"] == 0
        assert "forge_preset" not in by_what["/generate: is it Forge?"]
        gen = by_what["/generate (generateAutoImage)"]
        info = _parse_png(gen["images"][0])  # SillyTavern keeps data.images[0] as a PNG
        assert info.samplers[0].name == "DDIM" and info.samplers[0].model.name == "demo-b"
        # hires. fix off, face restoration off: nothing to report; url/auth are ignored as unknown fields, and named
        assert json.loads(gen["info"])["sdrt_not_honoured"] == []
        assert json.loads(gen["info"])["sdrt_ignored_fields"] == ["auth", "url"]
        assert "auth" not in gen["parameters"] and "url" not in gen["parameters"]  # never echoed back
        openai = by_what["generateOpenAiImage() (an OpenAI-compatible endpoint)"]
        assert _parse_png(openai["data"][0]["b64_json"]).metadata["Size"] == "64x64"
        client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "demo-a"})
