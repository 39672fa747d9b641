"""The hires fix's own checkpoint (``hires_checkpoint``, A1111's ``hr_checkpoint_name``) against diffusers.

tiny-sd15-dyn runs the first pass and tiny-sd15-dyn-b (the same architecture, every part drawn from other seeds) the
second: its text encoder encodes the (hires) prompts, its VAE encodes the upscaled picture and decodes the result.
The references are diffusers' ``StableDiffusionPipeline`` on A then ``StableDiffusionImg2ImgPipeline`` on B
(scripts/gen_hires_checkpoint_refs.py). Tolerance: test_pipelines_diffusers.py's (max 1 of 255, at most 0.5 % of
values off).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.errors import InputError

A, B = DATA / "tiny-sd15-dyn", DATA / "tiny-sd15-dyn-b"
_PIPES: dict[tuple[str, str], pipelines.Pipeline] = {}


def _pipe(folder, backend: str) -> pipelines.Pipeline:
    if (folder.name, backend) not in _PIPES:
        register(backend)
        _PIPES[folder.name, backend] = pipelines.load(folder, backend=backend)
    return _PIPES[folder.name, backend]


@pytest.fixture(scope="module", autouse=True)
def _close_pipes():
    yield
    for p in _PIPES.values():
        p.close()
    _PIPES.clear()


def _cases() -> list[dict]:
    return json.loads((B / "hires_refs.json").read_text())


def _kwargs(case: dict) -> dict:
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
              height=case["height"], hires_scale=case["hires_scale"], hires_steps=case["hires_steps"],
              hires_denoise=case["hires_denoise"], hires_upscaler=case["upscaler"])
    for key in ("hires_prompt", "hires_negative_prompt"):
        if case[key]:
            kw[key] = case[key]
    return kw


def _params():
    for case in _cases():
        for backend in ("reference", "openvino", "ggml"):
            if backend == "reference" and case["name"] != "Lanczos/Euler":
                continue
            yield pytest.param(case["name"], backend, id=f"{case['name']}:{backend}")


@pytest.mark.parametrize(("name", "backend"), list(_params()))
def test_hires_checkpoint_matches_diffusers(name: str, backend: str) -> None:
    case = next(c for c in _cases() if c["name"] == name)
    first = _pipe(A, backend)
    gen = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=B, **_kwargs(case))
    want = np.load(B / "hires_refs.npz")[name]
    assert_matches_diffusers(gen.images, want)
    info = gen.settings[0]
    hr = first._hires_job
    assert hr is not None and hr is not first and hr.folder.name == "tiny-sd15-dyn-b"
    assert info["Hires checkpoint"] == f"tiny-sd15-dyn-b [{hr.model_hash}]"
    assert info["Model"] == "tiny-sd15-dyn"  # the first pass's model, as A1111 writes it
    keys = list(info)  # A1111's order: right after the denoising strength, before the other hires fields
    assert keys.index("Hires checkpoint") == keys.index("Denoising strength") + 1


def test_a_loaded_pipeline_and_the_same_checkpoint() -> None:
    """A loaded pipeline runs as the path does; the first model's own path runs one model (A1111 reloads nothing),
    and the infotext still names it; "Use same checkpoint" is none."""
    case = next(c for c in _cases() if c["name"] == "Latent/Euler")
    first, second = _pipe(A, "openvino"), _pipe(B, "openvino")
    got = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=second, **_kwargs(case))
    assert_matches_diffusers(got.images, np.load(B / "hires_refs.npz")[case["name"]])
    plain = first.generate(case["prompt"], case["negative_prompt"], **_kwargs(case))
    same = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=A, **_kwargs(case))
    assert np.array_equal(same.images[0], plain.images[0])
    assert same.settings[0]["Hires checkpoint"] == f"tiny-sd15-dyn [{first.model_hash}]"
    assert "Hires checkpoint" not in plain.settings[0]
    unset = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint="Use same checkpoint",
                           **_kwargs(case))
    assert np.array_equal(unset.images[0], plain.images[0]) and "Hires checkpoint" not in unset.settings[0]


def test_the_plan_names_the_second_models_parts() -> None:
    case = next(c for c in _cases() if c["name"] == "Lanczos/Euler")
    plan = _pipe(A, "openvino").plan(case["prompt"], case["negative_prompt"], hires_checkpoint=B, **_kwargs(case))
    names = [p.part for p in plan.parts]
    assert names[:2] == ["text_encoder", "unet"] and "hires.unet" in names and "hires.text_encoder" in names
    shapes = {tuple(dict((k, s) for k, s, _ in sig)["sample"]) for sig, _ in plan.part("hires.unet").signatures}
    assert shapes == {(2, 4, 16, 16)}
    assert {tuple(dict((k, s) for k, s, _ in sig)["sample"]) for sig, _ in plan.part("unet").signatures} == \
        {(2, 4, 8, 8)}
    assert any(n.startswith("hires checkpoint: pass 2 runs") for n in plan.notes)


def test_low_memory_releases_the_first_model_before_the_second_runs() -> None:
    """Low memory: the first model's parts are closed before the second's run (A1111 unloads one to load the other);
    the picture is the same."""
    case = next(c for c in _cases() if c["name"] == "Latent/Euler")
    register("openvino")
    with pipelines.load(A, backend="openvino", low_memory=True) as first:
        seen: list[int] = []

        def callback(step: int, total: int, latents: np.ndarray) -> None:
            if step > case["steps"]:  # the hires pass: the first model holds no session
                seen.append(sum(len(p.sessions) for p in first._parts.values()))

        gen = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=B, callback=callback,
                             **_kwargs(case))
        assert seen and set(seen) == {0}
        assert first._hires_job.low_memory is True  # the second model follows the first's mode
        assert_matches_diffusers(gen.images, np.load(B / "hires_refs.npz")[case["name"]])


def test_a_tight_budget_never_holds_both_models() -> None:
    """Both models do not fit the budget (each alone does): the first model's parts go before the second's pass, and
    the second's go once the picture is decoded (A1111 loads the first model back), so the next image's first pass
    (batch_count) and the next job do not run beside the second model's sessions."""
    from sdrt.pipelines import hiresmodel

    case = next(c for c in _cases() if c["name"] == "Latent/Euler")
    register("openvino")
    with pipelines.load(A, backend="openvino", memory="4MB") as first:
        seen: list[tuple[int, int, int]] = []

        def sessions(p: pipelines.Pipeline) -> int:
            return sum(len(part.sessions) for part in p._parts.values())

        def callback(step: int, total: int, latents: np.ndarray) -> None:
            seen.append((step, sessions(first), sessions(first._hires_job)))

        gen = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=B, callback=callback,
                             batch_count=2, **_kwargs(case))
        second = first._hires_job
        assert hiresmodel.tight(first, second) and not first.is_low_memory and not second.is_low_memory
        assert_matches_diffusers(gen.images[:1], np.load(B / "hires_refs.npz")[case["name"]])
        first_pass = [(a, b) for step, a, b in seen if step <= case["steps"]]
        assert len(first_pass) == 2 * case["steps"] and all(a > 0 and b == 0 for a, b in first_pass), seen
        assert sessions(second) == 0
        from sdrt.errors import Interrupted

        with pytest.raises(Interrupted):  # stopped in the second pass: its model goes as well
            first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=B, **_kwargs(case),
                           callback=lambda step, total, lat: step <= case["steps"])
        assert sessions(second) == 0


@pytest.mark.parametrize(("extra", "words"), [
    ({"hires_checkpoint": B}, "hires_checkpoint needs hires_scale"),
    ({"hires_scale": 2, "hires_checkpoint": DATA / "nope.safetensors"}, "hires checkpoint .*nope.safetensors.* does "
                                                                        "not exist"),
    ({"hires_scale": 2, "hires_checkpoint": 3}, "hires_checkpoint must be a model path or a pipeline"),
    ({"hires_scale": 2, "hires_checkpoint": B, "refiner": B}, "hires_checkpoint and refiner both"),
])
def test_bad_arguments_are_one_line_naming_hires_checkpoint(extra, words) -> None:
    with pytest.raises(InputError, match=words) as exc:
        pipelines.validate("a cat", **extra)
    assert "\n" not in str(exc.value)


def test_a_missing_checkpoint_lists_those_beside_it() -> None:
    with pytest.raises(InputError, match=r"does not exist.*pipelines has: .*tiny-sd15-dyn-b/, ") as exc:
        pipelines.validate("a cat", hires_scale=2, hires_checkpoint=DATA / "tiny-sd15-dyn-c")
    assert exc.value.where == "hires_checkpoint" and "\n" not in str(exc.value)


@pytest.mark.parametrize(("file", "words"), [
    ("pipe-sd15/tinylora.safetensors", "looks like kohya LoRA"),
    ("pipe-sd15/tinyemb.safetensors", "looks like textual-inversion embedding"),
    ("sd1-ip2p/diffusers/vae/diffusion_pytorch_model.safetensors", "is a 4-channel VAE"),
    ("sd1-ip2p/diffusers/vae", "the model folder lacks"),
])
def test_a_file_that_is_no_model_is_one_line_naming_hires_checkpoint(file: str, words: str) -> None:
    """A LoRA, an embedding or a VAE given as the hires checkpoint: the loader's refusal names hires_checkpoint and
    says to pass a whole model there (not the loader's advice for a first model: "pass this file with vae")."""
    from sdrt.errors import SdrtError

    first = _pipe(A, "openvino")
    with pytest.raises(SdrtError, match=words) as exc:
        first.generate("a cat", steps=2, sampler="Euler", seed=1, width=64, height=64, hires_scale=2, hires_steps=1,
                       hires_checkpoint=DATA.parent / "ckpt" / file)
    said = str(exc.value)
    assert exc.value.where == "hires_checkpoint" and said.startswith("the hires checkpoint ") and "\n" not in said
    assert "pass a whole model as hires_checkpoint" in said and "with vae" not in said and "set_loras" not in said


def test_a_second_model_of_another_latent_space_is_refused() -> None:
    """SDXL's latents are not SD 1.x's: with a latent upscaler the second pass would read the wrong latents (A1111
    does not check); with an image upscaler its VAE encodes the picture again, so it runs."""
    first = _pipe(A, "openvino")
    kw = dict(steps=2, sampler="Euler", seed=1, width=64, height=64, hires_scale=2, hires_steps=1)
    with pytest.raises(InputError, match=r"hires checkpoint \(tiny-sdxl-dyn\) is SDXL and this model SD 1.x.*"
                                         "SDXL latents are not SD 1.x/2.x latents") as exc:
        first.generate("a cat", hires_checkpoint=DATA / "tiny-sdxl-dyn", **kw)
    assert exc.value.where == "hires_checkpoint"
    gen = first.generate("a cat", hires_checkpoint=DATA / "tiny-sdxl-dyn", hires_upscaler="Lanczos", **kw)
    assert gen.images[0].shape == (128, 128, 3)
    assert gen.settings[0]["Hires checkpoint"].startswith("tiny-sdxl-dyn [")
    from sdrt.pipelines.preview import project

    shown: list[bool] = []

    def callback(step: int, total: int, latents: np.ndarray) -> None:  # the second pass's previews are SDXL's
        if step > 2:
            shown.append(np.array_equal(first.preview(), project(first._current, "sdxl")))

    first.generate("a cat", hires_checkpoint=DATA / "tiny-sdxl-dyn", hires_upscaler="Lanczos", callback=callback, **kw)
    assert shown == [True]
    shown.clear()  # a TAESD decoder for SD 1.x latents is not run on the SDXL pass's: the projection is shown there
    first.generate("a cat", hires_checkpoint=DATA / "tiny-sdxl-dyn", hires_upscaler="Lanczos", callback=callback,
                   preview=DATA.parent / "preview" / "tiny-taesd" / "vae_decoder" / "model.onnx", **kw)
    assert shown == [True]
    for folder, words in (("tiny-sd15-inpaint", "is an inpainting model"),
                          ("tiny-sd2v", r"makes 64x64 images only .* the second pass is 128x128")):
        with pytest.raises(InputError, match=words):
            first.generate("a cat", hires_checkpoint=DATA / folder, hires_upscaler="Lanczos", **kw)


def test_a_flux_second_pass_after_sd15_is_refused() -> None:
    first = _pipe(A, "openvino")
    with pytest.raises(InputError, match=r"hires checkpoint \(tiny-flux-schnell\) is .*a flow model's second pass"
                                         "|hires checkpoint \\(tiny-flux-schnell\\) is .*latents differ") as exc:
        first.generate("a cat", steps=2, seed=1, width=64, height=64, hires_scale=2,
                       hires_checkpoint=DATA / "tiny-flux-schnell")
    assert exc.value.where == "hires_checkpoint" and "\n" not in str(exc.value)


def test_cli_hires_checkpoint(tmp_path, capsys) -> None:
    """``sdrt generate --hires-checkpoint``: the picture is the API's, the PNG says ``Hires checkpoint`` and A1111's
    /png-info reading gives it back; a missing file or a model of other latents is one line naming the flag."""
    from sdrt.cli import main
    from sdrt.pipelines.png import read_parameters
    from sdrt.serve.responses import parse_infotext

    register("openvino")
    case = next(c for c in _cases() if c["name"] == "Lanczos/Euler")
    out = tmp_path / "x.png"
    assert main(["generate", str(A), case["prompt"], "--negative", case["negative_prompt"], "--steps",
                 str(case["steps"]), "--cfg", "7", "--sampler", "Euler", "--seed", str(case["seed"]), "--width", "64",
                 "--height", "64", "--hires-scale", "2", "--hires-steps", "4", "--hires-denoise", "0.5",
                 "--hires-upscaler", "Lanczos", "--hires-checkpoint", str(B), "--backend", "openvino",
                 "-o", str(out)]) == 0
    from PIL import Image

    assert_matches_diffusers([np.asarray(Image.open(out).convert("RGB"))], np.load(B / "hires_refs.npz")[case["name"]])
    back = parse_infotext(read_parameters(out))
    assert back["Hires checkpoint"].startswith("tiny-sd15-dyn-b [") and back["Model"] == "tiny-sd15-dyn"
    capsys.readouterr()
    for extra, said in ((["--hires-checkpoint", str(tmp_path / "none.safetensors")], "does not exist"),
                        (["--hires-checkpoint", str(DATA / "tiny-sdxl-dyn")], "SDXL latents are not SD 1.x/2.x")):
        rc = main(["generate", str(A), "a cat", "--steps", "2", "--width", "64", "--height", "64", "--hires-scale", "2",
                   "--backend", "openvino", "-o", str(tmp_path / "y.png"), *extra])
        err = capsys.readouterr().err
        assert rc != 0 and said in err and "--hires-checkpoint" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) <= 2, err


def test_a_prompt_lora_applies_to_the_second_model_too() -> None:
    """A1111 activates the hires prompt's extra networks on the reloaded checkpoint: a <lora:...> tag changes the
    second model's pass as well (found in the first model's LoRA folder), and the next run without it un-applies it."""
    lora_dir = DATA.parent / "ckpt" / "pipe-sd15"
    case = next(c for c in _cases() if c["name"] == "Latent/Euler")
    register("openvino")
    with pipelines.load(A, backend="openvino") as first, pipelines.load(B, backend="openvino") as second:
        plain = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=second, **_kwargs(case))
        first.weights.lora_dir = lora_dir
        tagged = first.generate(case["prompt"] + " <lora:tinylora:0.7>", case["negative_prompt"],
                                hires_checkpoint=second, **_kwargs(case))
        assert [a.name for a in second.weights.loras] == ["tinylora"]
        alone = first.generate(case["prompt"] + " <lora:tinylora:0.7>", case["negative_prompt"], **_kwargs(case))
        # the first pass is the same in both: the second model's LoRA is what differs from the untagged picture
        assert not np.array_equal(tagged.images[0], plain.images[0])
        assert not np.array_equal(tagged.images[0], alone.images[0])
        again = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=second, **_kwargs(case))
        assert not second.weights.loras and np.array_equal(again.images[0], plain.images[0])


def test_the_first_models_embeddings_work_on_the_second() -> None:
    """A1111 loads its embeddings folder for whichever checkpoint is loaded: a trigger word of an embedding added to
    the first model is that embedding on a hires checkpoint given as a path too, not plain text there."""
    emb = DATA.parent / "ckpt" / "pipe-sd15" / "tinyemb.safetensors"
    case = next(c for c in _cases() if c["name"] == "Latent/Euler")
    register("openvino")
    with pipelines.load(A, backend="openvino") as first, pipelines.load(B, backend="openvino") as second:
        first.add_embedding(emb)
        got = first.generate("a tinyemb cat", case["negative_prompt"], hires_checkpoint=B, **_kwargs(case))
        assert [e.name for e in first._hires_job.weights.embeddings] == ["tinyemb"]
        second.add_embedding(emb)  # the second model with the embedding, as the caller would load it
        want = first.generate("a tinyemb cat", case["negative_prompt"], hires_checkpoint=second, **_kwargs(case))
        assert np.array_equal(got.images[0], want.images[0])


def test_the_memory_plan_counts_the_second_model_in_the_hires_pass() -> None:
    """The plan's hires pass holds the second model's parts beside the first model's resident ones; when both do not
    fit (a tight budget), beside the process alone, as the first model's parts go before the second's load."""
    case = next(c for c in _cases() if c["name"] == "Lanczos/Euler")
    register("reference")
    with pipelines.load(A, backend="reference") as first, pipelines.load(B, backend="reference") as second:
        plan = first.plan(case["prompt"], case["negative_prompt"], hires_checkpoint=second, **_kwargs(case))
        hm = plan.hires_memory
        assert hm is not None and plan.hires_first_released is False
        assert {p.part for p in hm.parts} >= {"text_encoder", "unet", "vae_decoder"}
        resident = sum(p.weight_bytes * plan.memory.footprint for p in plan.memory.parts if p.placement == "resident")
        assert hm.base_bytes == int(plan.memory.base_bytes + resident)
        assert hm.peak_bytes > plan.memory.peak_bytes  # both models' parts at once
        text = plan.format()
        assert "hires checkpoint memory: budget" in text and "stay loaded beside it in the hires pass" in text
    with pipelines.load(A, backend="reference", memory="4MB") as first:
        plan = first.plan(case["prompt"], case["negative_prompt"], hires_checkpoint=B, **_kwargs(case))
        assert plan.hires_first_released is True and plan.hires_memory.base_bytes == plan.memory.base_bytes
        assert "released before the hires pass loads this one" in plan.format()


def test_a_pipeline_run_as_the_hires_checkpoint_is_held_for_the_job() -> None:
    """A loaded pipeline passed as hires_checkpoint is locked for the job, as the first one is: another thread's
    job on it waits until the job ends (it would otherwise rebind its LoRAs or run its parts in the middle)."""
    import threading

    case = next(c for c in _cases() if c["name"] == "Lanczos/Euler")
    register("reference")
    with pipelines.load(A, backend="reference") as first, pipelines.load(B, backend="reference") as second:
        done = threading.Event()
        seen: list[bool] = []
        other = threading.Thread(target=lambda: (second.generate("a dog", steps=1, width=32, height=32), done.set()))

        def callback(step: int, total: int, latents: np.ndarray) -> None:
            if step == 1:
                other.start()
                seen.append(done.wait(3.0))  # the other thread's job on the hires checkpoint: waiting

        first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=second, callback=callback,
                       **_kwargs(case))
        other.join(60)
        assert seen == [False] and done.is_set()
        assert second._owner is None and not second._lock.locked()


def test_two_jobs_running_each_others_pipeline_are_refused_not_stuck() -> None:
    """Job 1 on the first pipeline waits for the second (its hires checkpoint) while job 2 on the second waits for
    the first: the second to see it is refused in one line naming hires_checkpoint, and the other then runs."""
    import threading
    import time

    from sdrt.pipelines import hiresmodel

    register("reference")
    with pipelines.load(A, backend="reference") as first, pipelines.load(B, backend="reference") as second:
        started, got = threading.Event(), {}

        def job2() -> None:
            with second._job("generate()"):
                started.set()
                try:
                    hiresmodel.hold(second, first)
                    got["job2"] = "held"
                finally:
                    hiresmodel.release(second)

        with first._job("generate()"):
            other = threading.Thread(target=job2)
            other.start()
            assert started.wait(10)
            time.sleep(0.3)  # job 2 now waits for the first pipeline
            with pytest.raises(InputError, match="each job would wait for the other") as err:
                hiresmodel.hold(first, second)
            assert err.value.where == "hires_checkpoint" and "\n" not in str(err.value)
        other.join(30)
        assert got == {"job2": "held"} and not first._lock.locked() and not second._lock.locked()


def test_three_jobs_in_a_ring_of_hires_checkpoints_are_refused_not_stuck() -> None:
    """Job k on pipeline k runs pipeline k+1 as its hires checkpoint, the last the first's: each waits for the next
    forever unless one is refused; the check followed only two jobs, so a ring of three hung."""
    import threading

    from sdrt.pipelines import hiresmodel

    register("reference")
    pipes = [pipelines.load(A, backend="reference"), pipelines.load(B, backend="reference"),
             pipelines.load(A, backend="reference")]
    assert len({id(p) for p in pipes}) == 3
    holding = threading.Barrier(3)
    got: dict[int, object] = {}

    def job(k: int) -> None:
        me, nxt = pipes[k], pipes[(k + 1) % 3]
        with me._job("generate()"):
            holding.wait(10)  # each job holds its own pipeline before it asks for the next
            try:
                hiresmodel.hold(me, nxt)
                got[k] = "held"
            except InputError as exc:
                got[k] = exc
            finally:
                hiresmodel.release(me)

    threads = [threading.Thread(target=job, args=(k,), daemon=True) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "the three jobs wait for each other forever"
    refused = [v for v in got.values() if isinstance(v, InputError)]
    assert len(refused) == 1 and sorted(v for v in got.values() if v == "held") == ["held", "held"], got
    assert refused[0].where == "hires_checkpoint" and "\n" not in str(refused[0])
    for p in pipes:
        assert not p._lock.locked()
        p.close()


def test_the_hires_pass_runs_the_second_models_parts_as_its_plan_places_them() -> None:
    """The plan's hires section (RunPlan.hires_memory) is what the run does: a part it places released is released
    once used (the run followed the first model's plan only, so the second's parts all stayed loaded whatever the
    plan printed); a path loaded as the hires checkpoint plans under the first pipeline's memory=, as it runs."""
    case = next(c for c in _cases() if c["name"] == "Lanczos/Euler")
    register("reference")
    with pipelines.load(A, backend="reference") as first, \
            pipelines.load(B, backend="reference", memory="4MB") as second:
        plan = first.plan(case["prompt"], case["negative_prompt"], hires_checkpoint=second, **_kwargs(case))
        placed = {p.part: p.placement for p in plan.hires_memory.parts}
        assert placed["unet"] == "released" and placed["text_encoder"] == "released"
        first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=second, **_kwargs(case))
        assert not second._parts["unet"].sessions and not second._parts["text_encoder"].sessions
    with pipelines.load(A, backend="reference", memory="4MB") as first:
        plan = first.plan(case["prompt"], case["negative_prompt"], hires_checkpoint=B, **_kwargs(case))
        assert "budget 3.8 MiB (memory=)" in plan.format().split("hires checkpoint memory")[1].splitlines()[0]
        first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=B, **_kwargs(case))
        second = first._hires_job
        assert second.memory == first.memory
        assert not second._parts["unet"].sessions and not second._parts["text_encoder"].sessions
