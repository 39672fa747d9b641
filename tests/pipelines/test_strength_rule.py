"""img2img's strength rule (``strength_rule=``): the steps A1111 runs, against a table its own functions computed.

tests/pipelines/data/a1111_steps.json is written by scripts/gen_a1111_steps_refs.py, which runs A1111's
``setup_img2img_steps`` and the cut ``KDiffusionSampler.sample_img2img`` makes of the sigmas: for each (steps,
strength, img2img_fix_steps) the schedule length, the index of its first sigma and the steps run. The loops here are
the pipeline's own, built as a run builds them; their sigmas must be the full schedule of that length from that index.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend, refs

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines.bounds import MAX_STEPS
from sdrt.pipelines.hires import Hires, second_pass_steps
from sdrt.samplers import get_sigmas

TABLE = json.loads((Path(__file__).parent / "data" / "a1111_steps.json").read_text())
PROMPT = "a red cat"


@pytest.fixture(scope="module")
def sd15():
    pipe = pipelines.load(DATA / "tiny-sd15", backend=fast_backend())
    yield pipe
    pipe.close()


@pytest.fixture(scope="module")
def init() -> np.ndarray:
    return refs("tiny-sd15")["init_image"]


def _rule(row: dict) -> str:
    return "a1111-fix-steps" if row["fix_steps"] else "a1111"


def _settings(init, row, sampler):
    return pipelines.validate(PROMPT, steps=row["steps"], sampler=sampler, init_image=init, strength=row["strength"],
                              strength_rule=_rule(row), width=64, height=64)


def test_k_diffusion_sigmas_are_a1111s(sd15, init) -> None:
    """LMS (a k-diffusion sampler on the folder's sigma table): the sigmas the loop walks are A1111's
    ``sigmas[steps - t_enc - 1:]`` of a schedule of A1111's length, for every row of the table."""
    ms = sd15.family.model_sampling(64, 64)
    checked = 0
    for row in TABLE["img2img"]:
        if row["length"] > MAX_STEPS:  # a stretched schedule above sdrt's bound is refused before any model loads
            with pytest.raises(InputError, match="stretches"):
                _settings(init, row, "LMS")
            continue
        loop = sd15._loop(_settings(init, row, "LMS"), ms, None, 1)
        full = [float(x) for x in get_sigmas("normal", row["length"], ms)]
        assert loop.sigmas == full[row["first"]:], row
        assert loop.steps == row["runs"], row
        checked += 1
    assert checked > 300


def test_diffusers_form_loops_run_a1111s_steps(sd15, init) -> None:
    """Euler, Euler a and DPM++ 2M Karras run in diffusers' own arithmetic: the same cut of their plans."""
    ms = sd15.family.model_sampling(64, 64)
    rows = [r for r in TABLE["img2img"] if r["length"] <= 200]
    for sampler, plan in (("Euler", lambda n: ms.euler_plan(n)), ("Euler a", lambda n: ms.euler_plan(n, ancestral=True)),
                          ("DPM++ 2M Karras", lambda n: ms.dpm_plan(n, karras=True))):
        for row in rows:
            loop = sd15._loop(_settings(init, row, sampler), ms, None, 1)
            full = plan(row["length"])
            assert list(loop.plan.sigmas) == list(full.sigmas[row["first"]:]), (sampler, row)
            assert loop.steps == row["runs"], (sampler, row)


def test_diffusers_rule_is_unchanged_by_default(sd15, init) -> None:
    """The API's default: the last int(steps * strength) steps, as diffusers' img2img pipelines."""
    ms = sd15.family.model_sampling(64, 64)
    for steps, strength in ((10, 0.5), (20, 0.75), (7, 0.3), (20, 1.0)):
        s = pipelines.validate(PROMPT, steps=steps, sampler="LMS", init_image=init, strength=strength, width=64, height=64)
        assert s.strength_rule == "diffusers"
        loop = sd15._loop(s, ms, None, 1)
        assert loop.steps == int(steps * strength)


def test_hires_pass_steps_are_a1111s() -> None:
    """The hires fix's second pass: A1111's setup_img2img_steps with the steps given."""
    for row in TABLE["hires"]:
        hires = Hires(2.0, row["hires_steps"], row["strength"], "Latent")
        length, run = second_pass_steps(hires, row["steps"])
        assert (length, length - run, run) == (row["length"], row["first"], row["runs"]), row


def test_a1111_rule_runs_one_step_where_diffusers_runs_none(init) -> None:
    with pytest.raises(InputError, match="leaves no step to run"):
        pipelines.validate(PROMPT, steps=10, init_image=init, strength=0.05)
    s = pipelines.validate(PROMPT, steps=10, init_image=init, strength=0.05, strength_rule="A1111")
    assert s.strength_rule == "a1111"


def test_one_step_is_said_in_the_singular() -> None:
    """"stretches 1 steps", "0.75 of 1 steps": the count said as a count."""
    from sdrt.pipelines.strength import schedule

    with pytest.raises(InputError, match=r"^strength 1e-05 stretches 1 step to a schedule of 99999 steps, above"):
        schedule(1, 1e-5, "a1111-fix-steps")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"strength_rule": "comfy"}, "unknown strength_rule 'comfy'"),
    ({"strength_rule": 3}, "unknown strength_rule '3'"),
    ({"strength_rule": "a1111", "init_image": None}, "strength_rule applies only with an init image"),
])
def test_bad_rules_are_refused_in_one_line(init, kwargs, message) -> None:
    args = {"init_image": init, **kwargs}
    with pytest.raises(InputError) as exc:
        pipelines.validate(PROMPT, steps=10, **args)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_the_run_follows_the_rule_and_says_so(sd15, init) -> None:
    """A real run: the denoiser calls and the infotext."""
    for rule, calls in (("diffusers", 5), ("a1111", 6), ("a1111-fix-steps", 10)):
        seen: list[int] = []
        gen = sd15.generate(PROMPT, init_image=init, strength=0.5, steps=10, sampler="LMS", seed=1, cfg=1,
                            strength_rule=rule, callback=lambda i, total, x, seen=seen: seen.append(total))
        assert len(seen) == calls and seen[-1] == calls, rule
        assert gen.settings[0]["Strength rule"] == rule


def test_the_cli_takes_the_rule_and_writes_it(tmp_path, capsys) -> None:
    Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency")
    from pipeline_helpers import register

    from sdrt.cli import main

    register("reference")
    init, out = tmp_path / "init.png", tmp_path / "out.png"
    Image.fromarray(refs("tiny-sd15")["init_image"]).save(init)
    assert main(["generate", str(DATA / "tiny-sd15"), "a cat", "--init-image", str(init), "--strength", "0.1",
                 "--steps", "3", "--seed", "1", "--cfg", "1", "--strength-rule", "a1111", "--backend", "reference",
                 "-o", str(out)]) == 0  # diffusers' rule would run no step of 3 at 0.1
    capsys.readouterr()
    with Image.open(out) as img:
        text = img.text["parameters"]
        assert "Denoising strength: 0.1" in text and text.endswith(", Strength rule: a1111")
    assert main(["generate", "/no/such/folder", "a cat", "--init-image", str(init), "--strength-rule", "webui",
                 "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert "unknown --strength-rule 'webui'. Where: --strength-rule." in err and err.count("\n") == 1, err


@pytest.mark.parametrize("tiny", [1e-320, 5e-324])
def test_a_subnormal_strength_under_fixed_steps_is_refused_in_one_line(init, tiny) -> None:
    """steps / strength overflows to inf for a subnormal strength: int() of it raised a bare OverflowError, for
    strength under a1111-fix-steps and for hires_denoise (whose second pass runs the same rule)."""
    with pytest.raises(InputError, match="stretches 2 steps to a schedule of countless steps") as exc:
        pipelines.validate(PROMPT, steps=2, init_image=init, strength=tiny, strength_rule="a1111-fix-steps")
    assert exc.value.where == "strength"
    with pytest.raises(InputError, match="stretches 2 steps to a schedule of countless steps") as exc:
        pipelines.validate(PROMPT, steps=2, hires_scale=2, hires_denoise=tiny)
    assert exc.value.where == "hires_denoise"


def test_a_stretched_schedule_refusal_names_the_steps_argument(init, capsys, tmp_path) -> None:
    """The refusal of a schedule stretched past the bound said "or lower the steps": it names the argument that
    sets them in the caller's words (steps, --steps; hires_steps / --hires-steps for the hires fix's second pass,
    hr_second_pass_steps and denoising_strength in serve)."""
    from PIL import Image

    from sdrt.cli import main
    from sdrt.serve.errors import from_pipeline

    with pytest.raises(InputError) as exc:
        pipelines.validate(PROMPT, steps=2, init_image=init, strength=1e-5, strength_rule="a1111-fix-steps")
    assert str(exc.value).endswith("What to do: raise strength to at least 0.0002, or lower steps."), exc.value
    with pytest.raises(InputError) as exc:
        pipelines.validate(PROMPT, steps=2, hires_scale=2, hires_denoise=1e-5)
    assert str(exc.value).endswith("or pass a lower hires_steps (or lower steps, which it runs)."), exc.value
    said = from_pipeline(exc.value).message
    assert said.startswith("denoising_strength 1e-05") and "pass a lower hr_second_pass_steps" in said, said
    with pytest.raises(InputError) as exc:
        pipelines.validate(PROMPT, steps=2, hires_scale=2, hires_denoise=1e-5, hires_steps=3)
    assert str(exc.value).endswith("raise hires_denoise to at least 0.0003, or lower hires_steps."), exc.value
    Image.fromarray(init).save(tmp_path / "init.png")
    for extra, words in ((["--init-image", str(tmp_path / "init.png"), "--strength", "1e-5", "--strength-rule",
                           "a1111-fix-steps"], "raise --strength to at least 0.0002, or lower --steps."),
                         (["--hires-scale", "2", "--hires-denoise", "1e-5", "--hires-steps", "3"],
                          "raise --hires-denoise to at least 0.0003, or lower --hires-steps.")):
        assert main(["generate", "/no/such/folder", "a cat", "--steps", "2", "--backend", "reference", *extra]) == 1
        err = capsys.readouterr().err
        assert err.rstrip().endswith(words) and err.count("\n") == 1, err
