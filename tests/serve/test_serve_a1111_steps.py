"""A1111's img2img steps through the server: the denoiser calls an img2img request makes, and the sigmas they are
made at, against the table A1111's own functions computed (tests/pipelines/data/a1111_steps.json, written by
scripts/gen_a1111_steps_refs.py), with A1111's ``img2img_fix_steps`` option off, on in override_settings, and on
in the server's options."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
Image = pytest.importorskip("PIL.Image", reason="writing the init image needs Pillow")

TABLE = json.loads((Path(__file__).resolve().parents[1] / "pipelines" / "data" / "a1111_steps.json").read_text())


def _png(size: int = 64) -> str:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture
def calls(monkeypatch):
    """The sigma of every denoiser call the server's img2img runs make (the k-diffusion loop's model wrapped)."""
    from sdrt.pipelines import loops

    seen: list[list[float]] = []
    run = loops.KLoop.run

    def counting(self, model, x, **kw):
        made: list[float] = []
        seen.append(made)
        full = [float(s) for s in self.sigmas]

        class Counted:
            def __call__(self, x, sigma, **k):
                made.append(float(np.asarray(sigma).reshape(-1)[0]))
                return model(x, sigma, **k)

            def __getattr__(self, name):
                return getattr(model, name)

        out = run(self, Counted(), x, **kw)
        made.insert(0, full)  # the sigmas the loop was given, first
        return out

    monkeypatch.setattr(loops.KLoop, "run", counting)
    return seen


def _row(steps: int, strength: float, fix: bool) -> dict:
    return next(r for r in TABLE["img2img"] if (r["steps"], r["strength"], r["fix_steps"]) == (steps, strength, fix))


def _img2img(server: str, **body) -> dict:
    r = httpx.post(f"{server}/sdapi/v1/img2img", json={"prompt": "a red cat", "init_images": [_png()], "steps": 10,
                                                       "denoising_strength": 0.5, "sampler_name": "LMS", "seed": 3,
                                                       "cfg_scale": 1, **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _full_sigmas(server: str, length: int) -> list[float]:
    from sdrt import pipelines
    from sdrt.samplers import get_sigmas

    pipe = pipelines.load(pipelines.DEMO_MODEL, backend="openvino")
    try:
        return [float(s) for s in get_sigmas("normal", length, pipe.family.model_sampling(64, 64))]
    finally:
        pipe.close()


@pytest.mark.parametrize(("steps", "strength", "override", "option"), [
    (10, 0.5, None, None), (10, 0.3, None, None), (7, 0.75, None, None), (10, 1.0, None, None),
    (10, 0.05, None, None),  # diffusers' rule would run none: A1111's runs one
    (10, 0.5, True, None), (7, 0.75, True, None), (10, 0.3, None, True), (10, 0.3, False, True),
])
def test_img2img_runs_a1111s_steps(server, calls, steps, strength, override, option):
    if option is not None:
        httpx.post(f"{server}/sdapi/v1/options", json={"img2img_fix_steps": option}, timeout=60).raise_for_status()
    try:
        body = {"override_settings": {"img2img_fix_steps": override}} if override is not None else {}
        out = _img2img(server, steps=steps, denoising_strength=strength, **body)
    finally:
        if option is not None:
            httpx.post(f"{server}/sdapi/v1/options", json={"img2img_fix_steps": False}, timeout=60).raise_for_status()
    fix = override if override is not None else bool(option)
    row = _row(steps, strength, fix)
    assert calls and all(c == calls[-1] for c in calls)  # the run (and the run plan's dry run before it)
    given, made = calls[-1][0], calls[-1][1:]
    assert len(made) == row["runs"]  # LMS: one denoiser call a step
    full = _full_sigmas(server, row["length"])
    np.testing.assert_allclose(given, full[row["first"]:], rtol=1e-6)
    np.testing.assert_allclose(made, full[row["first"]:-1], rtol=1e-6)
    assert f"Strength rule: {'a1111-fix-steps' if fix else 'a1111'}" in out["info"]


def test_a_bad_fix_steps_value_is_a_422_naming_it(server):
    r = httpx.post(f"{server}/sdapi/v1/img2img", json={"prompt": "x", "init_images": [_png()],
                                                       "override_settings": {"img2img_fix_steps": "sometimes"}},
                   timeout=60)
    assert r.status_code == 422 and "override_settings.img2img_fix_steps must be true or false" in r.text
    r = httpx.post(f"{server}/sdapi/v1/options", json={"img2img_fix_steps": [1]}, timeout=60)
    assert r.status_code == 422 and "img2img_fix_steps must be true or false" in r.text
    assert httpx.get(f"{server}/sdapi/v1/options", timeout=60).json()["img2img_fix_steps"] is False


def test_a_stretched_schedule_past_the_bound_is_a_400(server):
    r = httpx.post(f"{server}/sdapi/v1/img2img", json={"prompt": "x", "init_images": [_png()], "steps": 150,
                                                       "denoising_strength": 0.01,
                                                       "override_settings": {"img2img_fix_steps": True}}, timeout=60)
    assert r.status_code == 400 and "denoising_strength 0.01 stretches 150 steps to a schedule of 15000" in r.text


TIMESTEP_TABLE = json.loads((Path(__file__).resolve().parents[1] / "pipelines" / "data" /
                             "a1111_timestep_steps.json").read_text())


@pytest.mark.parametrize(("sampler", "steps", "strength", "fix"), [
    ("DDIM", 10, 0.5, False), ("DDIM", 20, 0.5, True), ("PLMS", 10, 0.7, False), ("PLMS", 7, 0.75, True),
    ("DDIM", 20, 0.05, False),  # t_enc 1: no step at all, the noised latent is the picture, as in A1111
    ("UniPC", 10, 0.5, False), ("UniPC", 20, 0.75, True),
])
def test_ddim_plms_and_unipc_img2img_run_a1111s_timesteps(server, monkeypatch, sampler, steps, strength, fix):
    """A1111's DDIM, PLMS and UniPC cut img2img their own way (sdrt.pipelines.compvis): the timesteps of the model's
    calls against A1111's own CompVisSampler.sample_img2img (scripts/gen_a1111_timestep_refs.py)."""
    from sdrt.pipelines import compvis

    seen: list[list[int]] = []
    for cls in (compvis.DDIMCut, compvis.PLMSCut, compvis.UniPCCut):
        run = cls.run

        def recording(self, model, x, _run=run, **kw):
            made: list[int] = []
            seen.append(made)
            ms = self.ms

            class Counted:
                def predict(self, x, t, **k):
                    made.append(int(round(t)))
                    return model.predict(x, t, **k)

                def __call__(self, x, sigma, **k):
                    made.append(float(ms.timestep(float(sigma))))
                    return model(x, sigma, **k)

                def __getattr__(self, name):
                    return getattr(model, name)

            return _run(self, Counted(), x, **kw)

        monkeypatch.setattr(cls, "run", recording)
    body = {"override_settings": {"img2img_fix_steps": True}} if fix else {}
    out = _img2img(server, steps=steps, denoising_strength=strength, sampler_name=sampler, **body)
    row = next(r for r in TIMESTEP_TABLE if (r["sampler"], r["steps"], r["strength"], r["fix"], r["hires"]) ==
               (sampler, steps, strength, fix, None))
    assert seen and len(seen[-1]) == len(row["calls"]), (seen, row)
    np.testing.assert_allclose(seen[-1], row["calls"], atol=0.05)
    assert f"Sampler: {sampler}" in out["info"]


def test_unipc_below_its_order_is_a_400(server):
    """A1111's UniPC solver refuses fewer steps than its order (3): 0.1 of 20 steps runs 2."""
    r = httpx.post(f"{server}/sdapi/v1/img2img", json={"prompt": "x", "init_images": [_png()], "steps": 20,
                                                       "denoising_strength": 0.1, "sampler_name": "UniPC"}, timeout=60)
    assert r.status_code == 400 and "fewer than its order (3)" in r.text and r.json()["field"] == "denoising_strength"
