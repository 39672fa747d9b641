"""Time of sdrt serve's first request after one file of the loaded model changes on disk: the part it feeds bound
again alone (now), against the whole model loaded again (``--before``: what serve did until the change that binds
parts again, ``Worker._reread`` returning False). Run each way under the bench lock:

    flock /work/bench.lock python scripts/bench_serve_reread.py tests/data/pipelines/tiny-sd15
    flock /work/bench.lock python scripts/bench_serve_reread.py tests/data/pipelines/tiny-sd15 --before
    flock /work/bench.lock python scripts/bench_serve_reread.py /work/models/sd15-full/onnx --size 256 --steps 1 \\
        --vae /work/models/sd15-full/diffusers/vae/diffusion_pytorch_model.safetensors

The model folder is linked file by file (hard links, nothing copied) into a scratch folder beside ``--scratch``; each
change writes a new file and renames it over the link (the original is never written). The changed weights differ
from one run to the next (a delta from the clock), so no run finds the changed part in the compile cache; use a
private ``SDRT_CACHE_DIR`` so that the unchanged parts hit it in both ways alike. Cases: ``vae_decoder`` (the
folder's ``vae_decoder/model.onnx``), ``vae_file`` (the chosen sd_vae file, with ``--vae``), ``embedding``, and
``lora`` (the tiny test LoRA, tiny models only). Prints one line per request and a JSON summary (medians over ``--repeat``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "serve"))
D = ROOT / "tests" / "data" / "ckpt" / "pipe-sd15"


def _link_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=os.link)


def _replace(path: Path, write) -> None:
    """A new file renamed over ``path`` (a hard link to the original is never written through)."""
    tmp = path.with_name(f".{path.name}.new")
    write(tmp)
    os.replace(tmp, path)


def _onnx_bias(src: Path, dst: Path, by: float) -> None:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(src), load_external_data=False)
    bias = [n for n in m.graph.node if n.op_type == "Conv"][-1].input[2]
    for t in m.graph.initializer:
        if t.name == bias:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) + np.float32(by), t.name))
    onnx.save(m, str(dst))


def _st_changed(src: Path, dst: Path, key_end: str, by: float) -> None:
    from sdrt.weights import Weights, stfile

    w = Weights.open(src)
    stfile.write(dst, ((k, (np.asarray(w[k]) + np.asarray(by, w[k].dtype)) if k.endswith(key_end) else w[k])
                       for k in w))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--before", action="store_true", help="load the whole model again on any change (the old way)")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--vae", type=Path, default=None, help="a VAE file of the model's family, for the vae_file case")
    ap.add_argument("--cases", default="vae_decoder,vae_file,embedding,lora")
    ap.add_argument("--scratch", type=Path, default=None, help="a folder on the model's file system (hard links)")
    ap.add_argument("--repeat", type=int, default=3, help="changes per case (medians are reported)")
    args = ap.parse_args()

    import httpx
    from serve_helpers import serve_app

    from sdrt.serve import ServeConfig, create_app
    from sdrt.serve.jobs import Worker
    from sdrt.weights import Weights, stfile

    if args.before:
        Worker._reread = lambda self, *a: False  # type: ignore[method-assign]
    tiny = "tiny" in args.folder.name
    cases = [c for c in args.cases.split(",") if c and (c != "vae_file" or args.vae) and (c != "lora" or tiny)]
    scratch = Path(tempfile.mkdtemp(prefix="sdrt-reread-", dir=args.scratch))
    delta = 0.001 * (1 + int(time.time()) % 997)  # new weights each run: no compile-cache hit for a changed part
    try:
        models, emb_dir, lora_dir = scratch / "models", scratch / "embeddings", scratch / "loras"
        for d in (models / "VAE", emb_dir, lora_dir):
            d.mkdir(parents=True)
        _link_tree(args.folder, models / "m")
        width = None
        te = Weights.open(D / "tinyemb.safetensors") if tiny else None
        emb = emb_dir / "benchemb.safetensors"
        if tiny:
            stfile.write(emb, {k: np.asarray(te[k]) for k in te})
            shutil.copy(D / "tinylora.safetensors", lora_dir / "style.safetensors")
        else:
            width = 768
            rng = np.random.default_rng(0)
            stfile.write(emb, {"emb_params": (rng.standard_normal((2, width)) * 0.02).astype(np.float32)})
        vae_name = None
        if args.vae is not None:
            vae_name = "benchvae.safetensors"
            os.link(args.vae, models / "VAE" / vae_name)
        config = ServeConfig(models=models, embedding_dir=emb_dir, lora_dir=lora_dir, backend="openvino")
        job = {"prompt": "a benchemb cat on a mat", "negative_prompt": "blurry", "steps": args.steps, "cfg_scale": 7.0,
               "sampler_name": "Euler", "seed": 7, "width": args.size, "height": args.size}
        settings = {"sd_model_checkpoint": "m", "sd_vae": vae_name or "Automatic"}
        results: dict[str, list[float]] = {}
        app = create_app(config)
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=3600) as c:
            def request(label: str, prompt: str = job["prompt"]) -> float:
                t0 = time.perf_counter()
                r = c.post("/sdapi/v1/txt2img", json={**job, "prompt": prompt, "override_settings": settings})
                dt = time.perf_counter() - t0
                assert r.status_code == 200, r.text
                base64.b64decode(r.json()["images"][0])
                print(f"{label:<34s} {dt:8.2f} s", flush=True)
                return dt

            results["first (load + compile)"] = [request("first request (load + compile)")]
            results["warm"] = [request("warm request")]
            lora_prompt = job["prompt"] + " <lora:style:1>"
            if "lora" in cases:
                request("warm request with the LoRA", lora_prompt)
            for i, case in ((i, case) for i in range(args.repeat) for case in cases):
                delta += 0.0001 * (i + 1)
                if case == "vae_decoder":
                    target = models / "m" / "vae_decoder" / "model.onnx"
                    _replace(target, lambda p, by=delta: _onnx_bias(args.folder / "vae_decoder" / "model.onnx", p, by))
                    prompt = job["prompt"]
                elif case == "vae_file":
                    target = models / "VAE" / vae_name
                    _replace(target, lambda p, by=delta: _st_changed(args.vae, p, "conv_out.bias", by))
                    prompt = job["prompt"]
                elif case == "embedding":
                    w = Weights.open(emb)
                    arrays = {k: np.asarray(w[k]) * np.float32(1 + delta) for k in w}
                    _replace(emb, lambda p, a=arrays: stfile.write(p, a))
                    prompt = job["prompt"]
                else:
                    target = lora_dir / "style.safetensors"
                    _replace(target, lambda p: _st_changed(D / "tinylora.safetensors", p, "alpha", 0.0))
                    prompt = lora_prompt
                results.setdefault(f"{case}: first after the change", []).append(
                    request(f"{case}: first after the change", prompt))
                results.setdefault(f"{case}: next", []).append(request(f"{case}: next", prompt))
        print(json.dumps({"mode": "before (whole model again)" if args.before else "now (the part alone)",
                          "folder": str(args.folder), "size": args.size, "steps": args.steps,
                          "median seconds": {k: round(float(np.median(v)), 2) for k, v in results.items()},
                          "all": {k: [round(x, 2) for x in v] for k, v in results.items()}}, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
