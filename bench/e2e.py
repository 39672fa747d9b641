"""End-to-end: a full-size SD 1.5 model, sdrt against OpenVINO GenAI, stable-diffusion.cpp and diffusers.

    python -m bench.e2e --model /work/models/sd15-full                  # 512x512, 4 Euler steps, 2 rounds
    python -m bench.e2e --model DIR --size 256 --rounds 1 --contenders sdrt-openvino,genai
    python -m bench.e2e --model DIR --unet-rss                          # one UNet run: sdrt vs raw ORT / OpenVINO

The model folder is what ``scripts/make_sd15_full.py`` writes: ``onnx/`` (Optimum's layout; sdrt and, converted
to IR once, OpenVINO GenAI), ``diffusers/`` (torch) and ``sd15-full.safetensors`` (an LDM single file, for
stable-diffusion.cpp). Every contender generates the same prompt with a negative prompt, CFG 7, 4 Euler steps,
seed 1, in a fresh process; the contenders alternate over the rounds (each round runs all of them, in rotated
order). The first round of an sdrt contender starts from an empty compile cache, later rounds from the cache
the first one filled (``--cold``: every round from an empty one). Printed per contender: load, first image, warm
image (the fastest of the ``--warm`` images made after the first, 2 by default), time per step (median of that
image's steps), peak RSS (``VmHWM``), the time to the first image from an empty cache (``cold_first_s``: load +
first image, the fastest such round; a peer without a compile cache starts every round so), and each one's ratio
to the best; for sdrt, peak RSS per stage (load, compile, encode, denoise, decode: the high-water mark
reset at each stage's start; ``store``: the compile-cache entries written after the first job, waited for
after the warm images, whose time ``store_s`` is no image's); and ``cache_gib``, the size of an sdrt contender's
compile cache after each round (the full-size model's ONNX parts hold 3.97 GiB).

Before the rounds, sdrt's modules and the bench's are byte-compiled (``compileall``) as ``pip install`` compiles an
installed package's: an editable install under ``PYTHONDONTWRITEBYTECODE`` (a development checkout) would
otherwise compile sdrt's source again in every process (0.3-0.5 s of each load + first image), where each peer's
installed modules load from their bytecode.

A contender whose package is missing is left out with the reason: ``genai`` and ``sdcpp`` run in the Python
named by ``--peer-python`` (a venv with ``openvino-genai``, ``openvino-tokenizers``, ``transformers`` and
``stable-diffusion-cpp-python``), ``diffusers`` in ``--torch-python`` (torch + diffusers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a photograph of an astronaut riding a horse on the moon, detailed, sharp focus"
NEGATIVE = "blurry, lowres, watermark, text"
CFG, SEED = 7.0, 1


# ---------------------------------------------------------------- memory
def hwm_reset() -> None:
    """Reset this process's peak RSS (Linux: ``clear_refs`` 5), so the next ``hwm()`` is a stage's own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def hwm() -> int:
    return _status("VmHWM")


def rss() -> int:
    return _status("VmRSS")


class Stages:
    """Peak RSS per stage: the max of the high-water marks of the stage's spans."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def span(self, name: str, fn: Any, *a: Any, **kw: Any) -> Any:
        hwm_reset()
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            self.peak[name] = max(self.peak.get(name, 0), hwm())
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


IMAGES = Path(tempfile.gettempdir()) / "sdrt-e2e-images"
#: warm images per process (``--warm``); the fastest one is the warm image, its median step the time per step
WARM = 2


def warm_images(gen: Any, stamps: list[float], n: int) -> tuple[float, float, list[float]]:
    """Generate ``n`` warm images; return the fastest one's seconds, its median step, and every one's seconds.

    The best of several, like the rounds, so that one image slowed by another job on a shared machine does not
    decide a contender's warm figure (one image of four 0.44 s steps next to one of 0.95 s steps was seen in one
    process on this machine)."""
    best, best_step, every = float("inf"), float("nan"), []
    for _ in range(max(1, n)):
        t0 = time.perf_counter()
        gen()
        seconds = time.perf_counter() - t0
        every.append(seconds)
        if seconds < best:
            best = seconds
            best_step = statistics.median(b - a for a, b in zip(stamps, stamps[1:])) if len(stamps) > 1 \
                else float("nan")
    return best, best_step, every


def first_and_warm(name: str, size: int, gen: Any, stamps: list[float], warm: int, pick: Any = lambda r: r
                   ) -> dict[str, Any]:
    """Time the first image and the warm ones (``warm_images``); the first, as ``pick`` takes it from what ``gen``
    returns, is saved under ``name`` (``save_image``)."""
    t0 = time.perf_counter()
    first = pick(gen())
    first_s = time.perf_counter() - t0
    warm_s, step_s, warm_all = warm_images(gen, stamps, warm)
    save_image(name, size, first)
    return {"first_s": first_s, "warm_s": warm_s, "step_s": step_s, "warm_all": warm_all}


def save_image(name: str, size: int, image: Any) -> None:
    """Each contender's first image as ``IMAGES/<name>-<size>.npy`` (uint8, H x W x 3), for the PSNR of one precision
    against another by hand; ``bench.precision_quality`` makes the image-quality table itself."""
    import numpy as np

    IMAGES.mkdir(exist_ok=True)
    np.save(IMAGES / f"{name}-{size}.npy", np.asarray(image, dtype=np.uint8))


# ---------------------------------------------------------------- contenders (each runs in its own process)
def run_sdrt(model: Path, backend: str, precision: str | None, size: int, steps: int, warm: int = WARM
             ) -> dict[str, Any]:
    from sdrt import pipelines
    from sdrt.pipelines import parts

    stages = Stages()
    stage_of = {"text_encoder": "encode", "unet": "denoise", "vae_decoder": "decode"}
    session, run = parts.Part.session, parts.Part.run

    def wrapped_session(self: Any, shapes: Any, outputs: Any = ()) -> Any:
        before = len(self.sessions)
        hwm_reset()
        t0 = time.perf_counter()
        out = session(self, shapes, outputs)
        if len(self.sessions) > before:  # compiled now
            stages.peak["compile"] = max(stages.peak.get("compile", 0), hwm())
            stages.seconds["compile"] = stages.seconds.get("compile", 0.0) + time.perf_counter() - t0
        return out

    def wrapped_run(self: Any, feeds: Any, outputs: Any = ()) -> Any:
        return stages.span(stage_of.get(self.name, self.name), run, self, feeds, outputs)

    parts.Part.session, parts.Part.run = wrapped_session, wrapped_run  # type: ignore[method-assign]
    opts: dict[str, Any] = {} if precision is None else {"precision": precision}
    opts.update(json.loads(os.environ.get("SDRT_E2E_OPTIONS", "{}")))  # e.g. {"cache": false}
    t0 = time.perf_counter()
    pipe = stages.span("load", pipelines.load, model / "onnx", backend=backend, **opts)
    load_s = time.perf_counter() - t0
    stamps: list[float] = []

    def gen() -> Any:
        stamps.clear()
        return pipe.generate(PROMPT, NEGATIVE, steps=steps, cfg=CFG, sampler="Euler", seed=SEED, width=size,
                             height=size, callback=lambda *_: stamps.append(time.perf_counter()))

    out = first_and_warm(f"sdrt-{backend}@{precision or 'default'}", size, gen, stamps, warm,
                         lambda r: r.images[0])
    from sdrt.cache import wait_for_stores

    # compile-cache entries written after the first job (sdrt.cache.deferred): their time is not an image's,
    # their memory is the process's peak
    stages.span("store", wait_for_stores)
    return {"load_s": load_s, **out, "store_s": stages.seconds["store"], "stages": stages.peak,
            "stage_seconds": stages.seconds}


def run_diffusers(model: Path, size: int, steps: int, warm: int = WARM) -> dict[str, Any]:
    sys.modules["torchvision"] = None  # type: ignore[assignment]
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    pipe = StableDiffusionPipeline.from_pretrained(str(model / "diffusers"), safety_checker=None,
                                                   requires_safety_checker=False)
    pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - t0
    stamps: list[float] = []

    def gen() -> Any:
        stamps.clear()
        with torch.inference_mode():
            return pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=steps, guidance_scale=CFG, width=size,
                 height=size, generator=torch.Generator("cpu").manual_seed(SEED),
                 callback_on_step_end=lambda p, i, t, kw: stamps.append(time.perf_counter()) or kw).images[0]

    return {"load_s": load_s, **first_and_warm("diffusers", size, gen, stamps, warm)}


def genai_folder(model: Path) -> Path:
    """OpenVINO GenAI's layout, converted once from the same ONNX (IR per part, OpenVINO tokenizers)."""
    import openvino as ov

    out = model / "genai"
    if (out / "model_index.json").is_file():
        return out
    tmp = model / "genai.tmp"
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    for part in ("text_encoder", "unet", "vae_decoder", "vae_encoder"):
        (tmp / part).mkdir(parents=True)
        m = ov.convert_model(str(model / "onnx" / part / "model.onnx"))
        if part in ("text_encoder", "unet"):  # GenAI feeds int64 ids and timesteps; the export takes int32/float
            m = _int64_ids(m, "input_ids" if part == "text_encoder" else "timestep")
        ov.save_model(m, str(tmp / part / "openvino_model.xml"), compress_to_fp16=False)
        shutil.copy(model / "diffusers" / (part if part in ("text_encoder", "unet") else "vae") / "config.json",
                    tmp / part / "config.json")
    from openvino_tokenizers import convert_tokenizer
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(str(model / "onnx" / "tokenizer"))
    ov_tok = convert_tokenizer(tok, with_detokenizer=False)
    (tmp / "tokenizer").mkdir()
    ov.save_model(ov_tok, str(tmp / "tokenizer" / "openvino_tokenizer.xml"))
    for f in (model / "onnx" / "tokenizer").iterdir():
        shutil.copy(f, tmp / "tokenizer" / f.name)
    shutil.copytree(model / "onnx" / "scheduler", tmp / "scheduler")
    index = json.loads((model / "diffusers" / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionPipeline"  # the name GenAI dispatches on
    index["vae_decoder"] = ["optimum", "OVModelVaeDecoder"]
    index["vae_encoder"] = ["optimum", "OVModelVaeEncoder"]
    (tmp / "model_index.json").write_text(json.dumps(index, indent=2))
    tmp.rename(out)
    return out


def _int64_ids(m: Any, name: str) -> Any:
    import openvino as ov
    from openvino.preprocess import PrePostProcessor

    ppp = PrePostProcessor(m)
    ppp.input(name).tensor().set_element_type(ov.Type.i64)
    return ppp.build()


def run_genai(model: Path, size: int, steps: int, precision: str | None, warm: int = WARM) -> dict[str, Any]:
    import openvino_genai as og

    folder = genai_folder(model)
    props = {} if precision is None else {"INFERENCE_PRECISION_HINT": precision}
    t0 = time.perf_counter()
    pipe = og.Text2ImagePipeline(str(folder), "CPU", **props)
    sched = og.Scheduler.from_config(str(folder / "scheduler" / "scheduler_config.json"),
                                     og.Scheduler.Type.EULER_DISCRETE)
    pipe.set_scheduler(sched)
    load_s = time.perf_counter() - t0
    stamps: list[float] = []

    def gen() -> Any:
        stamps.clear()
        return pipe.generate(PROMPT, negative_prompt=NEGATIVE, width=size, height=size, num_inference_steps=steps,
                      guidance_scale=CFG, rng_seed=SEED,
                      callback=lambda step, n, latent: stamps.append(time.perf_counter()) and False)

    return {"load_s": load_s,
            **first_and_warm(f"genai@{precision or 'default'}", size, gen, stamps, warm, lambda r: r.data[0])}


def run_sdcpp(model: Path, size: int, steps: int, warm: int = WARM) -> dict[str, Any]:
    from stable_diffusion_cpp import StableDiffusion

    t0 = time.perf_counter()
    sd = StableDiffusion(model_path=str(model / "sd15-full.safetensors"), n_threads=os.cpu_count() or 1,
                         verbose=False)
    load_s = time.perf_counter() - t0
    stamps: list[float] = []

    def gen() -> Any:
        stamps.clear()
        kw = dict(prompt=PROMPT, negative_prompt=NEGATIVE, cfg_scale=CFG, width=size, height=size,
                  sample_steps=steps, seed=SEED, sample_method="euler",
                  progress_callback=lambda step, n, t: stamps.append(time.perf_counter()))
        return (sd.generate_image if hasattr(sd, "generate_image") else sd.txt_to_img)(**kw)[0]

    return {"load_s": load_s, **first_and_warm("sdcpp", size, gen, stamps, warm)}


# ---------------------------------------------------------------- a single UNet run
def unet_feeds(size: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    lat = size // 8
    return {"sample": rng.standard_normal((2, 4, lat, lat), dtype=np.float32),
            "timestep": np.array([999.0, 999.0], np.float32),
            "encoder_hidden_states": rng.standard_normal((2, 77, 768), dtype=np.float32)}


def run_unet(model: Path, who: str, size: int, precision: str) -> dict[str, Any]:
    path = model / "onnx" / "unet" / "model.onnx"
    feeds = unet_feeds(size)
    stages = Stages()
    t0 = time.perf_counter()
    if who == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = stages.span("compile", ort.InferenceSession, str(path), so, providers=["CPUExecutionProvider"])
        stages.span("run", sess.run, None, feeds)
    elif who == "openvino-raw":
        import openvino as ov

        core = ov.Core()
        m = stages.span("load", core.read_model, str(path))
        m.reshape({k: list(v.shape) for k, v in feeds.items()})
        hint = {"fp32": "f32", "bf16": "bf16"}[precision]
        c = stages.span("compile", core.compile_model, m, "CPU", {"INFERENCE_PRECISION_HINT": hint})
        del m
        req = c.create_infer_request()
        stages.span("run", req.infer, feeds)
    else:
        import sdrt

        backend = who.removeprefix("sdrt-")
        opts: dict[str, Any] = {"precision": precision, "cache": False}
        if backend == "ggml":
            opts = {"shapes": {k: v.shape for k, v in feeds.items()}} if precision == "fp32" else None
            if opts is None:
                return {"skipped": "sdrt-ggml runs float32 only"}
        from sdrt.graph import Graph

        g = stages.span("load", Graph.load, str(path))
        sess = stages.span("compile", sdrt.load, g, backend=backend, **opts)
        stages.span("run", sess.run, feeds)
    return {"seconds": time.perf_counter() - t0, "stages": stages.peak, "peak": max(stages.peak.values())}


# ---------------------------------------------------------------- the parent: rounds, table
def child(args: argparse.Namespace) -> None:
    name, _, precision = args.one.partition("@")
    p = precision or None
    if args.unet_rss:
        out = run_unet(args.model, name, args.size, precision or "fp32")
    elif name.startswith("sdrt-"):
        out = run_sdrt(args.model, name.removeprefix("sdrt-"), p, args.size, args.steps, args.warm)
    elif name == "diffusers":
        out = run_diffusers(args.model, args.size, args.steps, args.warm)
    elif name == "genai-prepare":
        genai_folder(args.model)
        out = {}
    elif name == "genai":
        out = run_genai(args.model, args.size, args.steps, p, args.warm)
    elif name == "sdcpp":
        out = run_sdcpp(args.model, args.size, args.steps, args.warm)
    else:
        raise SystemExit(f"unknown contender {name}")
    out["peak_rss"] = hwm() if "stages" not in out else max([hwm(), *out["stages"].values()])
    print("RESULT " + json.dumps(out), flush=True)


#: about how much memory a contender peaks at on the full-size model (measured here), so that a shared machine is
#: not pushed into its OOM killer
NEED_GIB = {"sdrt-ggml": 16.0, "sdrt-openvino": 9.0, "genai": 9.0, "diffusers": 6.0, "sdcpp": 5.0,
            "onnxruntime": 8.0, "openvino-raw": 7.0}


def available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def _python_for(name: str, args: argparse.Namespace) -> str | None:
    if name in ("genai", "sdcpp"):
        return args.peer_python if args.peer_python and Path(args.peer_python).exists() else None
    if name == "diffusers":
        return args.torch_python if args.torch_python and Path(args.torch_python).exists() else None
    return sys.executable


def byte_compile(pythons: set[str]) -> None:
    """Write the bytecode of sdrt's packages (wherever each Python imports them from) and the bench's own, as
    ``pip install`` does for an installed package (see the module doc)."""
    code = ("import compileall, importlib.util, sys\n"
            "roots = [sys.argv[1]]\n"
            "for name in ('sdrt', 'sdrt_openvino', 'sdrt_ggml'):\n"
            "    spec = importlib.util.find_spec(name)\n"
            "    if spec is not None and spec.submodule_search_locations:\n"
            "        roots += list(spec.submodule_search_locations)\n"
            "for root in roots:\n"
            "    compileall.compile_dir(root, quiet=1)\n")
    for py in sorted(pythons):
        subprocess.run([py, "-c", code, str(ROOT / "bench")], cwd=ROOT, check=False,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))


def default_contenders(unet: bool) -> list[str]:
    from sdrt.plugins import get_registry

    reg = get_registry()
    out = []
    for name, be in sorted(reg.backends.items()):
        if name == "reference":
            continue
        try:
            devs = be.devices()
        except Exception:  # noqa: BLE001 - no device here
            continue
        if not devs:
            continue
        default = be.precision_for(devs[0])
        out += [f"sdrt-{name}"] + ([f"sdrt-{name}@fp32"] if default != "fp32" else [])
    if unet:
        return [c if "@" in c else f"{c}@{'bf16' if 'openvino' in c else 'fp32'}" for c in out] + [
            "onnxruntime@fp32", "openvino-raw@fp32", "openvino-raw@bf16"]
    return out + ["genai", "genai@f32", "sdcpp", "diffusers"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("SDRT_E2E_MODEL", "/work/models/sd15-full")))
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--contenders", default="")
    ap.add_argument("--peer-python", default=os.environ.get("SDRT_E2E_PEER_PYTHON", ""))
    ap.add_argument("--torch-python", default=os.environ.get("SDRT_E2E_TORCH_PYTHON", ""))
    ap.add_argument("--warm", type=int, default=WARM, help="warm images per process; the fastest counts (default 2)")
    ap.add_argument("--unet-rss", action="store_true")
    ap.add_argument("--ignore-memory", action="store_true", help="run contenders even when free memory looks short")
    ap.add_argument("--cold", action="store_true", help="start sdrt from an empty compile cache in every round")
    ap.add_argument("--json", type=Path, default=Path("bench-e2e.json"))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        child(args)
        return 0
    if not (args.model / "onnx" / "model_index.json").is_file():
        raise SystemExit(f"no model at {args.model}: build it with /work/refvenv/bin/python scripts/make_sd15_full.py")
    names = args.contenders.split(",") if args.contenders else default_contenders(args.unet_rss)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    cache = Path(tempfile.mkdtemp(prefix="sdrt-e2e-cache-"))
    peer = _python_for("genai", args)
    if peer and any(n.startswith("genai") for n in names) and not (args.model / "genai").is_dir():
        print("converting the ONNX parts to OpenVINO IR for GenAI (once, not timed)", flush=True)
        subprocess.run([peer, "-m", "bench.e2e", "--one", "genai-prepare", "--model", str(args.model)], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False)
    byte_compile({py for n in names if (py := _python_for(n.partition("@")[0], args)) is not None})
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            py = _python_for(name.partition("@")[0], args)
            if py is None:
                results[name].append({"skipped": "no Python with its packages (--peer-python / --torch-python)"})
                continue
            need = NEED_GIB.get(name.partition("@")[0], 8.0) * (1 if args.size >= 512 or args.unet_rss else 0.9)
            if available_gib() < need and not args.ignore_memory:
                time.sleep(30)  # other jobs on a shared machine: wait once, then leave this one out
                if available_gib() < need:
                    results[name].append({"skipped": f"{available_gib():.1f} GiB available, about {need:.0f} "
                                                     "needed (--ignore-memory runs it anyway)"})
                    print(f"round {r} {name}: skipped, not enough free memory", flush=True)
                    continue
            cmd = [py, "-m", "bench.e2e", "--one", name, "--model", str(args.model), "--size", str(args.size),
                   "--steps", str(args.steps), "--warm", str(args.warm)] + (["--unet-rss"] if args.unet_rss else [])
            if args.cold:
                import shutil

                shutil.rmtree(cache / name, ignore_errors=True)
            cold = not (cache / name).exists()  # nothing compiled yet (a peer without a cache: every round)
            env = dict(os.environ, SDRT_CACHE_DIR=str(cache / name), SDRT_LOAD_ENTRY_POINTS="1",
                       PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
            env.pop("SDRT_PRECISION", None)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            out = json.loads(line[7:]) if line else {"error": (proc.stderr or proc.stdout).strip()[-400:]}
            out["round"], out["wall_s"], out["cold"] = r, time.perf_counter() - t0, cold or not name.startswith("sdrt")
            if name.startswith("sdrt") and (cache / name).is_dir():  # the compile cache after this round, in GiB
                out["cache_gib"] = sum(p.stat().st_size for p in (cache / name).rglob("*") if p.is_file()) / 2**30
            results[name].append(out)
            shown = [f"{k} {v:.1f}" for k, v in out.items() if isinstance(v, float)]
            if isinstance(out.get("peak_rss"), int):  # a run stopped early keeps its memory figure in the log too
                shown.append(f"peak_rss {out['peak_rss'] / 2**30:.2f} GiB")
            print(f"round {r} {name}: " + (", ".join(shown) if "error" not in out else f"error {out['error']}"),
                  flush=True)
    import shutil

    shutil.rmtree(cache, ignore_errors=True)  # compiled blobs: gigabytes per contender
    args.json.write_text(json.dumps({"size": args.size, "steps": args.steps, "load": os.getloadavg(),
                                     "results": results}, indent=1))
    table(results, args.unet_rss)
    return 0


def table(results: dict[str, list[dict[str, Any]]], unet: bool) -> None:
    gib = 2.0 ** 30
    cols = ["peak_rss"] if unet else ["load_s", "first_s", "warm_s", "step_s", "peak_rss"]
    best: dict[str, float] = {}
    summary: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        ok = [r for r in runs if "error" not in r and "skipped" not in r]
        if not ok:
            reason = (runs[0].get("error") or runs[0].get("skipped")) if runs else "not run"
            print(f"{name:22s} {str(reason)[:150]}")
            continue
        summary[name] = {c: min(r[c] for r in ok if c in r) for c in cols}
        cold = [r["load_s"] + r["first_s"] for r in ok if r.get("cold", r is ok[0]) and "first_s" in r]
        if not unet and cold:
            summary[name]["cold_first_s"] = min(cold)
        for c, v in summary[name].items():
            best[c] = min(best.get(c, float("inf")), v)
    head = f"{'contender':22s}" + "".join(f"{c:>18s}" for c in (cols + ([] if unet else ["cold_first_s"])))
    print(head)
    for name, row in summary.items():
        cells = []
        for c, v in row.items():
            shown = f"{v / gib:.2f} GiB" if c == "peak_rss" else f"{v:.1f} s"
            cells.append(f"{shown} ({v / best[c]:.2f}x)" if best[c] else shown)
        print(f"{name:22s}" + "".join(f"{c:>18s}" for c in cells))
        stages = next((r.get("stages") for r in results[name] if r.get("stages")), None)
        if stages:
            print(" " * 24 + "  ".join(f"{k} {v / gib:.2f}" for k, v in stages.items()) + " GiB")


if __name__ == "__main__":
    raise SystemExit(main())
