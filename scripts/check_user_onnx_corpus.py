"""Run sdrt's graph commands on the corpus scripts/make_user_onnx_corpus.py writes and list what looks wrong.

    python scripts/check_user_onnx_corpus.py CORPUS [--only NAME,...] [--commands plan,run,...] [--backends ggml,openvino]

For each entry: ``sdrt plan`` (text and --json), ``sdrt run`` on random inputs (each backend, against onnxruntime
on the same inputs), ``sdrt strip``, ``sdrt quantize``, ``sdrt compile``. A finding is a traceback, an error that
is not one line, a non-zero exit without an ``error:`` line, a file written that was not asked for, a plan with
negative / NaN / inf figures or a missing key, or outputs that differ from onnxruntime's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

DT = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
      "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(int8)": np.int8,
      "tensor(uint8)": np.uint8}


def sdrt(*args: str, cwd: str | None = None, timeout: int = 600) -> tuple[int, str, str]:
    env = dict(os.environ, SDRT_CACHE_DIR=os.environ.get("SDRT_CACHE_DIR", tempfile.mkdtemp(prefix="sdrt-cache-")))
    try:
        p = subprocess.run([sys.executable, "-m", "sdrt", *args], capture_output=True, text=True, timeout=timeout,
                           cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        return 124, "", "TIMEOUT"
    return p.returncode, p.stdout, p.stderr


def snapshot(folder: Path) -> set[str]:
    return {str(p) for p in folder.rglob("*")}


def judge(label: str, rc: int, out: str, err: str, findings: list[str], ok_codes=(0, 1)) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("note:", "WARNING", "INFO"))]
    if "Traceback" in err or rc not in ok_codes:
        findings.append(f"{label}: rc={rc} traceback/crash: {err.strip().splitlines()[-1:] if err.strip() else ''}")
    elif rc == 1:
        errs = [ln for ln in lines if ln.startswith("error:")]
        if len(errs) != 1:
            findings.append(f"{label}: rc=1 without exactly one error line: {lines[-3:]}")


def numbers_sane(obj, path="") -> list[str]:
    bad = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad += numbers_sane(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            bad += numbers_sane(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        if not math.isfinite(obj) or obj < 0:
            bad.append(f"{path}={obj}")
    return bad


def check_plan(name: str, path: Path, findings: list[str], report: dict) -> None:
    parent = path.parent if path.is_file() else path
    before = snapshot(parent)
    rc, out, err = sdrt("plan", str(path))
    judge(f"{name} plan", rc, out, err, findings)
    rc2, out2, err2 = sdrt("plan", str(path), "--json")
    judge(f"{name} plan --json", rc2, out2, err2, findings)
    report["plan"] = {"rc": rc, "err": err.strip()[-300:], "out": out[-1500:]}
    if rc2 == 0:
        try:
            plan = json.loads(out2)
        except ValueError:
            findings.append(f"{name} plan --json: not JSON")
            return
        for k in ("parts", "predicted_ms_per_image", "fits", "plan"):
            if k not in plan:
                findings.append(f"{name} plan --json: no {k!r}")
        for part in plan.get("parts", []):
            for k in ("name", "calls", "predicted_ms_per_call", "predicted_peak_bytes"):
                if k not in part:
                    findings.append(f"{name} plan --json: part without {k!r}")
        if path.is_file() and len(plan.get("parts", [])) != 1:
            findings.append(f"{name} plan --json: a single file plans {len(plan.get('parts', []))} parts")
        bad = numbers_sane(plan)
        if bad:
            findings.append(f"{name} plan --json: bad numbers {bad[:5]}")
        report["plan_json"] = plan
    if snapshot(parent) != before:
        findings.append(f"{name} plan: wrote {sorted(snapshot(parent) - before)[:3]}")


def _dim(name: str) -> int:
    """A size for a dynamic dim: 3 channels, 32 pixels (the tiny classifiers' own size), else 2."""
    name = name.lower()
    return 3 if "channel" in name else 32 if ("height" in name or "width" in name) else 2


def random_feeds(model_path: Path) -> dict | None:
    import onnxruntime as ort

    try:
        s = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any failure is a finding to report
        return {"__ort_error__": str(exc).splitlines()[0][:200]}
    rng = np.random.default_rng(0)
    feeds = {}
    for i in s.get_inputs():
        if i.type not in DT:
            return {"__ort_error__": f"input type {i.type}"}
        shape = [d if isinstance(d, int) and d >= 0 else _dim(str(d)) for d in (i.shape or [])]
        if np.prod(shape, dtype=np.float64) > 1e8:
            return {"__ort_error__": f"input {i.name} of {shape} is too large to feed"}
        dt = DT[i.type]
        if np.issubdtype(dt, np.integer):  # token ids under any vocabulary; masks and token types 0/1
            high = 2 if "mask" in i.name or "type" in i.name else 10
            feeds[i.name] = rng.integers(0, high, shape).astype(dt)
        elif dt == np.bool_:
            feeds[i.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
    try:
        ref = s.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - any failure is a finding to report
        return {"__ort_error__": "run: " + str(exc).splitlines()[0][:200]}
    return {"feeds": feeds, "ref": dict(zip([o.name for o in s.get_outputs()], ref))}


def check_run(name: str, path: Path, backends: list[str], findings: list[str], report: dict) -> None:
    if not path.is_file():
        return
    got = random_feeds(path)
    tmp = Path(tempfile.mkdtemp(prefix="sdrt-run-"))
    specs = []
    if got and "feeds" in got:
        for i, (k, v) in enumerate(got["feeds"].items()):
            np.save(tmp / f"in{i}.npy", v)
            specs += ["-i", f"{k}={tmp / f'in{i}.npy'}"]
    report["ort"] = got.get("__ort_error__", "ok") if got else "none"
    parent = path.parent
    for b in backends:
        before = snapshot(parent)
        outp = tmp / f"out-{b}.npz"
        rc, out, err = sdrt("run", str(path), *specs, "-o", str(outp), "--backend", b, "--precision", "fp32")
        judge(f"{name} run {b}", rc, out, err, findings)
        report[f"run_{b}"] = {"rc": rc, "err": err.strip()[-400:]}
        if snapshot(parent) != before:
            findings.append(f"{name} run {b}: wrote {sorted(snapshot(parent) - before)[:3]}")
        if rc == 0 and got and "ref" in got:
            res = np.load(outp)
            for k, r in got["ref"].items():
                if k not in res:
                    findings.append(f"{name} run {b}: no output {k!r}")
                    continue
                a = res[k]
                if a.shape != r.shape:
                    findings.append(f"{name} run {b}: {k} shape {a.shape} vs ort {r.shape}")
                    continue
                if a.dtype != r.dtype:
                    findings.append(f"{name} run {b}: {k} dtype {a.dtype} vs ort {r.dtype}")
                if r.dtype.kind == "f":
                    rr, aa = r.astype(np.float64), a.astype(np.float64)
                    err_ = np.max(np.abs(rr - aa) / (np.abs(rr).max() + 1e-6)) if r.size else 0.0
                    tol = 2e-2 if r.dtype == np.float16 or "q" in name else 1e-4
                    report[f"run_{b}"]["err_rel"] = float(err_)
                    if not np.isfinite(err_) or err_ > tol:
                        findings.append(f"{name} run {b}: {k} rel err {err_:.3g} against onnxruntime")
                elif not np.array_equal(a, r):
                    findings.append(f"{name} run {b}: {k} differs from onnxruntime")
        elif rc == 0 and got and "__ort_error__" in got:
            findings.append(f"{name} run {b}: sdrt ran what onnxruntime refused ({got['__ort_error__']})")


def check_tools(name: str, path: Path, findings: list[str], report: dict) -> None:
    if not path.is_file():
        targets = [("strip", [str(path)]), ("quantize", [str(path)]), ("compile", [str(path)])]
    else:
        targets = [("strip", [str(path)]), ("quantize", [str(path), "--to", "int8"]),
                   ("compile", [str(path), "--backend", "openvino"])]
    tmp = Path(tempfile.mkdtemp(prefix="sdrt-tools-"))
    parent = path.parent if path.is_file() else path
    for cmd, args in targets:
        before = snapshot(parent)
        outp = tmp / f"{cmd}.out"
        extra = ["-o", str(outp)]
        if cmd == "strip":
            extra = ["-o", str(tmp / "stripped.onnx")]
        elif cmd == "quantize":
            extra = ["-o", str(tmp / "q.onnx")]
        elif cmd == "compile":
            extra = ["-o", str(tmp / "c.blob")]
        rc, out, err = sdrt(cmd, *args, *extra)
        judge(f"{name} {cmd}", rc, out, err, findings, ok_codes=(0, 1, 2))
        report[cmd] = {"rc": rc, "err": err.strip()[-300:]}
        if snapshot(parent) != before:
            findings.append(f"{name} {cmd}: wrote {sorted(snapshot(parent) - before)[:3]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--start", default="", help="skip the entries before this one")
    ap.add_argument("--commands", default="plan,run,tools")
    ap.add_argument("--backends", default="ggml,openvino")
    ap.add_argument("--report", type=Path, default=None)
    a = ap.parse_args()
    manifest = json.loads((a.corpus / "manifest.json").read_text())
    only = set(a.only.split(",")) - {""}
    cmds = set(a.commands.split(","))
    findings: list[str] = []
    reports = {}
    for name, entry in manifest.items():
        if only and name not in only:
            continue
        if a.start and name != a.start and not reports and not findings and a.start in manifest:
            continue
        path = Path(entry["path"])
        rep: dict = {}
        n0 = len(findings)
        if "plan" in cmds:
            check_plan(name, path, findings, rep)
        if "run" in cmds:
            check_run(name, path, a.backends.split(","), findings, rep)
        if "tools" in cmds:
            check_tools(name, path, findings, rep)
        reports[name] = rep
        print(f"{name}: {len(findings) - n0} findings", flush=True)
        for f in findings[n0:]:
            print("   ", f, flush=True)
    if a.report:
        a.report.write_text(json.dumps(reports, indent=1, default=str))
    print(f"\n{len(findings)} findings")


if __name__ == "__main__":
    main()
