"""Model families (sdrt.pipelines.families), the run plan, the family contract, interruption and threads."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, refs, register

from sdrt import pipelines
from sdrt.errors import InputError, Interrupted, ModelError, WeightsError
from sdrt.pipelines import DEMO_MODEL, ModelFolder
from sdrt.pipelines.families import Family, by_name, detect, registered
from sdrt.pipelines.families import register as register_family
from sdrt.pipelines.scheduling import FolderSchedule, model_sampling
from sdrt.samplers import FlowSchedule, flux_mu

PROMPT = "a photo of a red cat"


@pytest.fixture(scope="module")
def sd15():
    register("reference")
    pipe = pipelines.load(DATA / "tiny-sd15", backend="reference")
    yield pipe
    pipe.close()


@pytest.fixture(scope="module", params=["reference", "openvino", "ggml"])
def sd15_on(request):
    """The tiny SD 1.x pipeline on each installed backend (interruption and threads are promised on all)."""
    register(request.param)
    pipe = pipelines.load(DATA / "tiny-sd15", backend=request.param)
    yield pipe
    pipe.close()


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(DATA / name, dst)
    return dst


# -- families ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("folder", "family"), [("tiny-sd15", "sd1"), ("tiny-sd15-inpaint", "sd1"),
                                                ("tiny-sd2v", "sd2"), ("tiny-sdxl", "sdxl"),
                                                ("tiny-sd2-inpaint", "sd2"), ("tiny-sdxl-inpaint", "sdxl")])
def test_family_from_class_name_and_from_parts_alone(tmp_path: Path, folder: str, family: str) -> None:
    assert ModelFolder.open(DATA / folder).family == family
    bare = _copy(tmp_path, folder)
    (bare / "model_index.json").unlink()  # no _class_name: the parts decide
    f = ModelFolder.open(bare)
    assert f.family == family and f.family_class is by_name(family)


def test_family_declarations() -> None:
    sd1, sd2, sdxl = by_name("sd1"), by_name("sd2"), by_name("sdxl")
    assert [e.part for e in sdxl.encoders] == ["text_encoder", "text_encoder_2"]
    assert sdxl.encoders[1].pooled == "text_embeds" and sdxl.vae_scale == 0.13025 and sd1.vae_scale == 0.18215
    assert (sd1.default_size, sd2.default_size, sdxl.default_size) == (512, 768, 1024)
    assert {"time_ids", "text_embeds"} <= set(sdxl.model_inputs) and "time_ids" not in sd1.model_inputs
    assert all(f.latent_channels == 4 and f.guidance == "cfg" for f in (sd1, sd2, sdxl))


def test_a_new_family_is_one_class_and_a_registration(tmp_path: Path) -> None:
    """A family that reuses SD 1.x's encoders but names its own pipeline class, a VAE shift and flow sampling."""
    base = by_name("sd1")

    class Shifted(base):  # type: ignore[misc, valid-type]
        name = "test-shifted"
        label = "a test family"
        class_names = ("TestShiftedPipeline",)
        vae_shift = 0.25

        def model_sampling(self, width: int, height: int) -> FlowSchedule:
            return FlowSchedule(shift=3.0)

    folder = _copy(tmp_path, "tiny-sd15")
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "TestShiftedPipeline"}))
    before = registered()
    register_family(Shifted)
    try:
        register("reference")
        pipe = pipelines.load(folder, backend="reference")
        assert pipe.family.name == "test-shifted" and pipe.family.scaling == (0.18215, 0.25)
        plan = pipe.plan(PROMPT, steps=3, sampler="Euler", seed=1)
        assert plan.label == "a test family" and plan.model_sampling == "flow (shift 3)"
        image = pipe(PROMPT, steps=3, sampler="Euler", seed=1)[0]
        assert image.shape == (64, 64, 3)
    finally:
        import sdrt.pipelines.families as fams

        fams._FAMILIES.clear()
        fams._FAMILIES.update(before)


def test_a_family_without_a_denoiser_is_refused() -> None:
    class Broken(Family):
        name = "broken"
        parts = {"text_encoder": "text"}

    with pytest.raises(ModelError, match="no denoiser part"):
        register_family(Broken)


def test_detect_prefers_the_subclass_that_fits() -> None:
    sd2 = DATA / "tiny-sd2v"
    configs = {"text_encoder": json.loads((sd2 / "text_encoder" / "config.json").read_text())} \
        if (sd2 / "text_encoder" / "config.json").is_file() else {}
    parts = {"text_encoder", "unet", "vae_decoder"}
    assert detect({"_class_name": "StableDiffusionPipeline"}, parts, configs, sd2) is by_name("sd2")


@pytest.mark.parametrize("class_name", ["ORTFluxPipeline", "ORTFluxFillPipeline", "FluxKontextPipeline"])
def test_a_flux_folder_missing_its_t5_is_told_so_not_taken_for_chroma(tmp_path, class_name) -> None:
    """A Flux ONNX folder whose T5 (text_encoder_2, the part whose export most often fails: over 2 GB) is missing has
    Chroma's parts (transformer + text_encoder): Chroma, a subclass of Flux, won over the folder's own Flux class
    name, and the error was "the model folder's tokenizer has no tokenizer.json or spiece.model (T5)" about the CLIP
    tokenizer. The folder's class names it Flux, and the missing part is named."""
    from sdrt.errors import ModelNotFoundError

    src = DATA / "tiny-flux-dev"
    for p in src.iterdir():
        if p.name not in ("text_encoder_2", "model_index.json"):
            (tmp_path / p.name).symlink_to(p)
    index = json.loads((src / "model_index.json").read_text())
    (tmp_path / "model_index.json").write_text(json.dumps({**index, "_class_name": class_name}))
    assert detect({"_class_name": class_name}, {"transformer", "text_encoder", "vae_decoder"}, {}, tmp_path) \
        is by_name("flux")
    with pytest.raises(ModelNotFoundError, match=r"the model folder lacks text_encoder_2 \(not a complete"):
        pipelines.load(tmp_path, backend="reference")


# -- model sampling by the scheduler's class name ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["EulerDiscreteScheduler", "DPMSolverMultistepScheduler", "DDIMScheduler",
                                  "PNDMScheduler", "EulerAncestralDiscreteScheduler", "UniPCMultistepScheduler"])
def test_ddpm_schedulers_give_the_folder_schedule(name: str) -> None:
    config = {**json.loads((DATA / "tiny-sd15" / "scheduler" / "scheduler_config.json").read_text()),
              "_class_name": name}
    ms = model_sampling(config)
    assert isinstance(ms, FolderSchedule) and ms.prediction == "eps"


def test_flow_match_scheduler_gives_a_shifted_flow_schedule() -> None:
    ms = model_sampling({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0, "num_train_timesteps": 1000})
    assert isinstance(ms, FlowSchedule) and ms.shift == 3.0 and ms.timestep(0.5) == 500.0
    dyn = model_sampling({"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": True,
                          "base_shift": 0.5, "max_shift": 1.15}, width=1024, height=1024, multiplier=1.0)
    assert dyn.mu == pytest.approx(flux_mu(1024, 1024)) and dyn.timestep(0.5) == 0.5


def test_unknown_scheduler_is_named() -> None:
    with pytest.raises(ModelError, match="the scheduler 'WobblyScheduler' is not supported"):
        model_sampling({"_class_name": "WobblyScheduler"})


def test_k_loop_start_and_renoise_follow_the_model_sampling() -> None:
    from sdrt.pipelines.loops import KLoop
    from sdrt.samplers import euler

    noise, image = np.ones((1, 4, 2, 2), np.float32), np.full((1, 4, 2, 2), 2.0, np.float32)
    flow = KLoop(FlowSchedule(shift=3.0), [0.8, 0.4, 0.0], euler, {}, seed=1, generator=None)
    assert np.allclose(flow.start(noise, image), 0.8 * noise + 0.2 * image)  # (1 - sigma) x0 + sigma noise
    assert np.allclose(flow.start(noise), 0.8 * noise)
    ve = KLoop(FolderSchedule.from_config({}), [14.6, 1.0, 0.0], euler, {}, seed=1, generator=None)
    assert np.allclose(ve.add_noise(image, noise, 1), image + noise)  # x0 + sigma noise


# -- the run plan --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("sampler", "steps", "cfg"), [("Euler", 4, 7.0), ("Heun", 4, 7.0), ("DPM2 a", 3, 1.0),
                                                       ("DPM++ 2M Karras", 5, 7.0), ("DDIM", 3, 5.0)])
def test_plan_counts_what_generate_runs(sampler: str, steps: int, cfg: float) -> None:
    register("reference")
    pipe = pipelines.load(DATA / "tiny-sdxl", backend="reference")
    plan = pipe.plan(PROMPT, "blurry", steps=steps, sampler=sampler, cfg=cfg, seed=1, batch=2)
    assert not pipe.unet.sessions and pipe.unet._graph is None  # the plan compiled and loaded nothing
    seen: dict[str, list] = {}
    for name, part in pipe.parts.items():
        run = part.run

        def counting(feeds, outputs=(), _run=run, _name=name):
            seen.setdefault(_name, []).append({k: (tuple(np.shape(v)), str(np.asarray(v).dtype))
                                               for k, v in feeds.items()})
            return _run(feeds, outputs)

        part.run = counting  # our own Part, not a vendor library: counts the calls the real run makes
    pipe(PROMPT, "blurry", steps=steps, sampler=sampler, cfg=cfg, seed=1, batch=2)
    for p in plan.parts:
        assert p.calls == len(seen[p.part]), p.part
    assert {p.part for p in plan.parts} == set(seen)
    unet = plan.part("unet")
    rows = 4 if cfg != 1.0 else 2
    assert unet is not None and unet.rows == rows and plan.per_image("unet") == unet.calls * rows / 2
    sig = dict((k, (s, d)) for k, s, d in unet.signatures[0][0])
    assert sig["sample"] == ((rows, 4, 8, 8), "float32") and sig["time_ids"] == ((rows, 6), "float32")
    pipe.close()


def test_plan_for_img2img_and_inpainting(sd15) -> None:
    init, mask = refs("tiny-sd15")["init_image"], refs("tiny-sd15")["mask"]
    plan = sd15.plan(PROMPT, steps=4, sampler="Euler", init_image=init, strength=0.5, seed=1)
    assert plan.mode == "img2img" and plan.steps == 2 and plan.part("vae_encoder").calls == 1
    plan = sd15.plan(PROMPT, steps=4, sampler="Euler", init_image=init, mask=mask, seed=1)
    assert plan.mode == "inpaint" and plan.part("vae_encoder").calls == 2  # the image and the masked image
    assert [p.part for p in plan.parts] == ["text_encoder", "vae_encoder", "unet", "vae_decoder"]


def test_plan_says_cfg_once_without_guidance(sd15) -> None:
    # `sdrt generate tiny-flux-schnell ... --dry-run` printed "guidance none (cfg 1) (cfg 1)"
    lines = sd15.plan(PROMPT, steps=2, cfg=1, seed=1).format().splitlines()
    assert lines[1].endswith("guidance none (cfg 1)"), lines[1]


def test_plan_checks_settings_like_generate(sd15) -> None:
    with pytest.raises(InputError, match="unknown argument 'stpes'"):
        sd15.plan(PROMPT, stpes=3)
    with pytest.raises(InputError, match="64x64 images only"):
        sd15.plan(PROMPT, width=128)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("prompt", ["a (red:1.1) cat", "a (red cat", "[blurry]"])
def test_plan_of_a_weighted_prompt_warns_nothing(sd15, prompt: str) -> None:
    """The plan's stand-in text encoder gives zeros: the emphasis mean rescale must not divide 0 by 0 (a
    RuntimeWarning on every dry run, and NaN conditioning)."""
    plan = sd15.plan(prompt, steps=2, sampler="Euler", seed=1)
    assert plan.part("text_encoder") is not None


def test_cli_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path, capsys) -> None:
    from sdrt.cli import main

    register("reference")
    out = tmp_path / "x.png"
    for folder, parts in (("tiny-sd15", ["text_encoder", "unet", "vae_decoder"]),
                          ("tiny-sdxl", ["text_encoder", "text_encoder_2", "unet", "vae_decoder"])):
        rc = main(["generate", str(DATA / folder), "a cat", "--steps", "3", "--dry-run", "--backend", "reference",
                   "-o", str(out)])
        text = capsys.readouterr().out
        assert rc == 0 and not out.exists()
        assert [line.split()[0] for line in text.splitlines() if line.startswith("  ") and "call(s)" in line] == parts
        assert "unet (denoiser): 3 call(s), 6 row(s) per image" in text


# -- the family contract and the pipeline-side cases of issue 31 ----------------------------------------------------
def test_a_vae_decoder_in_unet_is_named(tmp_path: Path) -> None:
    register("reference")
    folder = _copy(tmp_path, "tiny-sd15")
    shutil.copy(folder / "vae_decoder" / "model.onnx", folder / "unet" / "model.onnx")
    pipe = pipelines.load(folder, backend="reference")
    with pytest.raises(ModelError, match="the unet part is not a UNet for SD 1.x: it looks like a VAE decoder"):
        pipe(PROMPT, steps=1)
    with pytest.raises(ModelError, match="looks like a VAE decoder"):
        pipe.plan(PROMPT, steps=1)


def test_a_text_encoder_in_vae_decoder_is_named(tmp_path: Path) -> None:
    register("reference")
    folder = _copy(tmp_path, "tiny-sd15")
    shutil.copy(folder / "text_encoder" / "model.onnx", folder / "vae_decoder" / "model.onnx")
    with pytest.raises(ModelError, match="the vae_decoder part is not a VAE decoder for SD 1.x: it looks like a text encoder"):
        pipelines.load(folder, backend="reference")(PROMPT, steps=1)


def test_callback_that_is_not_callable_fails_before_running(sd15) -> None:
    sd15.unet.close()
    with pytest.raises(InputError, match="callback must be a function") as info:
        sd15(PROMPT, steps=1, callback=5)
    assert info.value.where == "callback" and not sd15.unet.sessions


def test_load_none_and_unknown_arguments_name_the_argument(sd15) -> None:
    register("reference")
    with pytest.raises(InputError, match="model must be a path, got NoneType") as e:
        pipelines.load(None, backend="reference")  # type: ignore[arg-type]
    assert e.value.where == "model"  # load's argument (it said "folder", ModelFolder.open's)
    with pytest.raises(InputError, match="unknown argument 'stpes'.*did you mean steps"):
        sd15(PROMPT, stpes=3)


def test_an_sdxl_embedding_on_sd1_is_refused_naming_both(sd15) -> None:
    emb = DATA.parent / "ckpt" / "sdxl" / "emb.safetensors"
    with pytest.raises(WeightsError, match=r"clip_l \[2, 32\], clip_g \[2, 48\], and this SD 1.x model has only "
                                           "clip_l"):
        sd15.add_embedding(emb)


def test_too_long_negative_prompt_is_called_the_negative_prompt() -> None:
    register("reference")
    demo = pipelines.load(DEMO_MODEL, backend="reference")
    with pytest.raises(InputError, match=r"the negative prompt needs \d chunks of 75 tokens and this model takes 75 "
                                         "tokens at most") as info:
        demo(PROMPT, ", ".join(["a red cat on a wooden table"] * 14), steps=1)
    assert info.value.where == "negative_prompt"
    with pytest.raises(InputError, match=r"the prompt needs \d chunks") as info:
        demo(", ".join(["a red cat on a wooden table"] * 14), steps=1)
    assert info.value.where == "prompt"


def test_the_demo_models_size_limit_in_pixels() -> None:
    register("reference")
    demo = pipelines.load(DEMO_MODEL, backend="reference")
    with pytest.raises(InputError, match=r"this model makes 64x64 images only .* 16384x64 was asked") as info:
        demo(PROMPT, steps=1, width=16384, height=64)  # the most any generation takes (bounds.MAX_SIDE)
    assert info.value.where == "width" and "pin" not in str(info.value)


def test_a_tiny_init_image_is_called_too_small(sd15) -> None:
    """With no size to fit it to (a size given fits any picture: test_init_fit)."""
    with pytest.raises(InputError, match=r"the init image is 3x3: its width \(3 pixels\) is too small to take the "
                                         r"run's size from") as err:
        sd15(PROMPT, steps=4, init_image=np.zeros((3, 3, 3), np.uint8))
    assert err.value.where == "init_image" and "pass width and height to fit it to a size" in str(err.value)


@pytest.mark.parametrize("prompt", ["a (red:" + "1" + "0" * 40 + ") cat", "(" * 3000 + "red"])
@pytest.mark.parametrize("which", ["prompt", "negative_prompt"])
def test_overflowing_emphasis_is_refused_at_parsing(sd15, prompt: str, which: str) -> None:
    args = (prompt, "") if which == "prompt" else (PROMPT, prompt)
    with pytest.raises(InputError, match="the emphasis weight .* of 'red' is out of range") as info:
        sd15(*args, steps=1, cfg=7.0)
    assert info.value.where == which


# -- interruption and threads --------------------------------------------------------------------------------------
def test_a_callback_returning_false_stops_the_run(sd15_on) -> None:
    seen = []
    with pytest.raises(Interrupted, match="stopped the generation after step 2 of 4") as info:
        sd15_on(PROMPT, steps=4, seed=1, callback=lambda i, n, x: seen.append(i) or i < 2)
    assert seen == [1, 2] and (info.value.step, info.value.total) == (2, 4)
    assert sd15_on(PROMPT, steps=2, seed=1, callback=lambda *a: None)[0].shape == (64, 64, 3)  # True/None go on


def test_interrupt_from_another_thread_stops_at_the_next_step(sd15_on) -> None:
    steps = []

    def callback(i: int, n: int, x: np.ndarray) -> None:
        steps.append(i)
        if i == 1:
            t = threading.Thread(target=sd15_on.interrupt)
            t.start()
            t.join()

    with pytest.raises(Interrupted, match="interrupted after step 1 of 5") as info:
        sd15_on(PROMPT, steps=5, seed=1, sampler="Euler", callback=callback)
    assert steps == [1] and info.value.step == 1
    sd15_on.interrupt()  # no job runs: does nothing, and the next job is not affected
    assert len(sd15_on(PROMPT, steps=2, seed=1)) == 1


def test_a_stopped_run_gives_its_partial_images_when_asked(sd15_on) -> None:
    """``Interrupted.partial()``, as A1111 answers an interrupt: the finished runs' images, then the stopped batch
    decoded from its last step's denoised estimate. Euler's last step lands on that estimate (sigma 0), so a
    stop after the last step decodes the finished image; a stop after step 1 decodes a different one."""
    full = sd15_on.generate(PROMPT, steps=3, seed=5, sampler="Euler", batch=2, batch_count=2)
    with pytest.raises(Interrupted) as info:  # stopped after the last step of the second run
        sd15_on.generate(PROMPT, steps=3, seed=5, sampler="Euler", batch=2, batch_count=2,
                         callback=lambda i, n, x, seen=[]: seen.append(i) or len(seen) < 6)
    part = info.value.partial()
    assert part.seeds == full.seeds and len(part.images) == 4 and part.settings == full.settings
    for a, b in zip(part.images[:2], full.images[:2]):
        assert np.array_equal(a, b)  # the finished run, as it was
    for a, b in zip(part.images[2:], full.images[2:]):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1  # the last step's estimate is the image
    with pytest.raises(Interrupted) as info:
        sd15_on.generate(PROMPT, steps=3, seed=5, sampler="Euler", batch=2, callback=lambda *a: False)
    early = info.value.partial()
    assert len(early.images) == 2 and early.seeds == full.seeds[:2] and early.images[0].shape == (64, 64, 3)
    assert np.abs(early.images[0].astype(int) - full.images[0].astype(int)).max() > 1
    assert info.value.partial().images[0].tobytes() == early.images[0].tobytes()  # asked again: the same
    assert np.array_equal(sd15_on.generate(PROMPT, steps=3, seed=5, sampler="Euler", batch=2).images[0],
                          full.images[0])  # and the pipeline goes on as before


def test_a_run_stopped_before_its_first_step_has_no_partial(sd15_on, monkeypatch) -> None:
    """``partial()`` is None when nothing was made (an interrupt that lands before the first step)."""
    prepare = sd15_on._prepare

    def interrupted_while_preparing(*args):
        sd15_on.interrupt()  # the job runs (its prompt is being read): the stop lands before step 1
        return prepare(*args)

    monkeypatch.setattr(sd15_on, "_prepare", interrupted_while_preparing)
    with pytest.raises(Interrupted) as info:
        sd15_on.generate(PROMPT, steps=2, seed=5, sampler="Euler")
    assert info.value.step == 0 and info.value.partial() is None


def test_one_job_at_a_time_from_two_threads(sd15_on) -> None:
    want = {seed: sd15_on(PROMPT, steps=2, seed=seed, sampler="Euler a")[0] for seed in (1, 2)}
    got: dict[int, np.ndarray] = {}
    inside = []
    lock_seen = []

    def job(seed: int) -> None:
        def callback(i: int, n: int, x: np.ndarray) -> None:
            inside.append(seed)
            lock_seen.append(sd15_on._lock.locked())

        got[seed] = sd15_on(PROMPT, steps=2, seed=seed, sampler="Euler a", callback=callback)[0]

    threads = [threading.Thread(target=job, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(got[s], want[s]) for s in (1, 2))
    assert inside in ([1, 1, 2, 2], [2, 2, 1, 1]) and all(lock_seen)  # the jobs did not interleave



def test_a_callback_calling_back_into_its_pipeline_is_refused_not_hung(sd15_on) -> None:
    """generate, plan, set_loras and close wait for the running job; from that job's own step callback they waited
    for themselves, forever."""
    said: list[object] = []

    def callback(i: int, n: int, x: np.ndarray) -> bool:
        for call in (lambda: sd15_on(PROMPT, steps=1), lambda: sd15_on.plan(PROMPT), lambda: sd15_on.set_loras([]),
                     sd15_on.close):
            try:
                call()
            except InputError as exc:
                said.append((exc.where, exc.what.split(" was called")[0]))
            else:
                said.append("returned")
        return False

    def job() -> None:
        with pytest.raises(Interrupted, match="the step callback stopped"):
            sd15_on(PROMPT, steps=3, seed=1, callback=callback)

    t = threading.Thread(target=job, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "a call from the step callback hung"
    assert said == [("callback", "generate()"), ("callback", "plan()"), ("callback", "set_loras()"),
                    ("callback", "close()")]
    assert sd15_on(PROMPT, steps=1, seed=1)[0].shape == (64, 64, 3)  # the pipeline goes on


def test_weights_and_close_wait_for_the_running_job(sd15_on) -> None:
    """set_loras from another thread while a job ran changed the weights between two of its steps; close closed the
    sessions under it. Now set_loras waits for the job, and close interrupts it and waits."""
    lora = DATA.parent / "ckpt" / "pipe-sd15" / "tinylora.safetensors"
    want = sd15_on(PROMPT, steps=3, seed=1, sampler="Euler")[0]
    order: list[str] = []
    started = threading.Event()

    def callback(i: int, n: int, x: np.ndarray) -> None:
        started.set()
        time.sleep(0.2)  # set_loras is called meanwhile
        order.append(f"step {i}")

    got = {}
    t = threading.Thread(target=lambda: got.update(img=sd15_on(PROMPT, steps=3, seed=1, sampler="Euler",
                                                                 callback=callback)[0]))
    t.start()
    started.wait(60)
    sd15_on.set_loras([(lora, 0.8)])
    order.append("set_loras")
    t.join()
    sd15_on.set_loras([])
    assert order == ["step 1", "step 2", "step 3", "set_loras"] and got["img"].tobytes() == want.tobytes()
    started.clear()
    failed: list[BaseException] = []

    def job() -> None:
        try:
            sd15_on(PROMPT, steps=50, seed=1, callback=lambda i, n, x: started.set() or time.sleep(0.01))
        except BaseException as exc:  # noqa: BLE001 - what the job ended with
            failed.append(exc)

    t = threading.Thread(target=job)
    t.start()
    started.wait(60)
    sd15_on.close()
    assert not sd15_on._running  # the job ended before close went on
    t.join()
    assert len(failed) == 1 and isinstance(failed[0], Interrupted)
    assert sd15_on(PROMPT, steps=3, seed=1, sampler="Euler")[0].tobytes() == want.tobytes()  # compiles again


def test_interrupt_from_a_signal_handler_does_not_deadlock() -> None:
    """A SIGINT handler calling pipe.interrupt() runs on the main thread, between two bytecodes: maybe while that
    thread holds the pipeline's state lock, at a job's start or end. The lock was not re-entrant: a deadlock."""
    register("reference")
    pipe = pipelines.load(DATA / "tiny-sd15", backend="reference")

    def main_thread() -> None:
        with pipe._state:  # generate() is setting _running here when the signal arrives
            pipe.interrupt()  # the handler

    t = threading.Thread(target=main_thread, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "interrupt() deadlocked on the state lock its own thread held"
    assert pipe(PROMPT, steps=1, seed=1)[0].shape == (64, 64, 3)
    pipe.close()

# -- the denoiser the loop calls (sdrt.samplers) -------------------------------------------------------------------
def test_batched_cfg_equals_two_passes_and_hooks_add_inputs(sd15) -> None:
    from sdrt.samplers import CFGDenoiser, Denoiser

    ms = sd15.family.model_sampling(64, 64)
    cond, uncond = sd15._conditioning(pipelines.validate(PROMPT, "blurry"))
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32) * 5
    seen = []
    model = Denoiser(sd15.unet, ms, output_name="out_sample", hooks=[lambda feeds: seen.append(sorted(feeds)) or {}])
    one = CFGDenoiser(model, {"encoder_hidden_states": cond.hidden}, {"encoder_hidden_states": uncond.hidden}, 6.0,
                      batched=True)
    two = CFGDenoiser(model, cond.hidden, uncond.hidden, 6.0)
    a, b = one(x, 5.0), two(x, 5.0)
    assert np.abs(a - b).max() < 1e-4 * np.abs(b).max() and one.calls == two.calls == 2
    assert seen[0] == ["encoder_hidden_states", "sample", "timestep"] and len(seen) == 3  # one call, then two
    raw = one.predict(ms.scale_input(x, 5.0), float(ms.timestep(5.0)))
    assert np.allclose(ms.denoised(x, 5.0, raw), a)


def test_settings_checked_once_are_used_as_they_are(sd15) -> None:
    s = pipelines.validate(PROMPT, "blurry", steps=2, seed=4, sampler="Euler a")
    gen = sd15.generate(s)
    assert np.array_equal(gen.images[0], sd15(PROMPT, "blurry", steps=2, seed=4, sampler="Euler a")[0])
    assert s.width is None and gen.prompt == PROMPT  # the caller's Settings are not changed
    assert sd15.plan(s).part("unet").calls == 2
    with pytest.raises(InputError, match="settings and keyword arguments were both given"):
        sd15.generate(s, steps=3)
