"""Memory and time of a ``sdrt serve`` process whose client switches the VAE back and forth (docs/serve.md).

Starts ``python -m sdrt serve --models DIR`` as a child process, then, ``--switches`` times, sets ``sd_vae`` to the
first VAE and generates, then to the second and generates (A1111's ``POST /sdapi/v1/options`` and ``txt2img``, as
webuiapi and Open WebUI send them). The child's resident memory (``VmRSS``) is sampled every 50 ms; after each job
the script records its RSS (steady: the server idle, its pipelines warm), the job's wall time and the SHA-256 of the
image's pixels, and at the end the child's ``VmHWM`` (its peak). ``--pythonpath`` runs the server from another
checkout (``git archive`` of an older commit), so one script measures the code before and after a change; the
image hashes then show both made the same pixels. No torch; nothing beyond the standard library and sdrt.

    flock /work/bench.lock python scripts/serve_vae_switch_bench.py --models /tmp/models --vae a.safetensors \\
        --vae b.safetensors --switches 3 --out vae-switch.jsonl
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def _status(pid: int, key: str) -> int:
    """A /proc/PID/status field in bytes (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _call(url: str, body: dict | None = None, timeout: float = 3600) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def _pixels_sha(b64: str) -> str:
    """SHA-256 of the decoded pixels (the PNG's text chunk differs between versions; the pixels must not)."""
    import io

    import numpy as np
    from PIL import Image

    return hashlib.sha256(np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")).tobytes()
                          ).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--vae", action="append", required=True, help="two file names of the models folder's VAE/")
    ap.add_argument("--switches", type=int, default=3, help="back-and-forth pairs (2 x this many jobs)")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--backend", default="openvino")
    ap.add_argument("--keep-models", type=int, default=2)
    ap.add_argument("--pythonpath", default=None, help="run the server from this PYTHONPATH (another checkout)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    log = tempfile.NamedTemporaryFile("w+", prefix="sdrt-serve-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "sdrt", "serve", "--models", args.models, "--backend", args.backend,
           "--port", str(port), "--keep-models", str(args.keep_models)]
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _status(server.pid, "VmRSS"))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    result: dict = {"label": args.label, "pythonpath": args.pythonpath, "size": args.size, "steps": args.steps,
                    "keep_models": args.keep_models, "load_avg_start": os.getloadavg()[0], "jobs": []}
    try:
        deadline = time.time() + 120
        while True:
            try:
                _call(base + "/internal/ping", timeout=5)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError(f"the server did not start; see {log.name}") from None
                time.sleep(0.2)
        sampler.start()
        result["rss_started"] = _status(server.pid, "VmRSS")
        job = {"prompt": "a red fox in the snow", "negative_prompt": "blurry", "steps": args.steps, "cfg_scale": 7,
               "sampler_name": "Euler", "seed": 1, "width": args.size, "height": args.size}
        for k in range(2 * args.switches):
            vae = args.vae[k % 2]
            t0 = time.perf_counter()
            _call(base + "/sdapi/v1/options", {"sd_vae": vae})
            r = _call(base + "/sdapi/v1/txt2img", job)
            seconds = time.perf_counter() - t0
            time.sleep(1.0)  # idle: what the process keeps between jobs
            status = _call(base + "/sdrt/status")
            result["jobs"].append({"vae": vae, "seconds": round(seconds, 1),
                                   "rss_after": _status(server.pid, "VmRSS"), "peak_so_far": peak[0],
                                   "pixels": _pixels_sha(r["images"][0]),
                                   "models_loaded": status["workers"][0]["models_loaded"]})
            print(json.dumps(result["jobs"][-1]), flush=True)
        result["vmhwm"] = _status(server.pid, "VmHWM")
        result["peak_sampled"] = peak[0]
        result["load_avg_end"] = os.getloadavg()[0]
    finally:
        stop.set()
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    gib = 2 ** 30
    result["summary"] = {"peak_GiB": round(max(result.get("vmhwm", 0), peak[0]) / gib, 2),
                         "steady_GiB": [round(j["rss_after"] / gib, 2) for j in result["jobs"]],
                         "seconds": [j["seconds"] for j in result["jobs"]]}
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
