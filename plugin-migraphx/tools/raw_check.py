"""Run failed conformance tests on raw MIGraphX, without the plugin: whose failure is it?

    PYTHONPATH=<migraphx build>/lib python plugin-migraphx/tools/raw_check.py summary.json [--target ref]

``summary.json`` is ``sdrt conformance migraphx --json``'s output. For every
failed test, a child process hands the test's own ``model.onnx`` straight to
``migraphx.parse_onnx`` (inputs fixed to the test data's shapes), compiles it
for the target, runs it on the test's inputs and compares with the expected
outputs at the test's tolerance, as onnx's runner does. A test that fails the
same way here is MIGraphX's; one that passes here is the plugin's to fix.
Prints one line per test and a count per verdict.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, sys
from pathlib import Path
import numpy as np, onnx
from onnx import numpy_helper
import migraphx

case, target = Path(sys.argv[1]), sys.argv[2]
meta = json.loads((case / "data.json").read_text())
model = onnx.load(str(case / "model.onnx"))
ds = case / "test_data_set_0"
names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
feeds = {n: numpy_helper.to_array(onnx.load_tensor(str(ds / f"input_{j}.pb"))) for j, n in enumerate(names)}
want = [numpy_helper.to_array(onnx.load_tensor(str(ds / f"output_{j}.pb"))) for j in range(len(model.graph.output))]
try:
    prog = migraphx.parse_onnx(str(case / "model.onnx"), map_input_dims={n: list(a.shape) for n, a in feeds.items()})
except Exception as exc:
    print(json.dumps({"verdict": "parse error", "detail": str(exc).splitlines()[-1][-200:]})); sys.exit()
try:
    prog.compile(migraphx.get_target(target), offload_copy=True)
    got = [np.array(r) for r in prog.run({n: np.require(a, requirements="C") for n, a in feeds.items()})]
except Exception as exc:
    print(json.dumps({"verdict": "compile/run error", "detail": str(exc).splitlines()[-1][-200:]})); sys.exit()
for g, w in zip(got, want):
    if g.size != w.size:
        print(json.dumps({"verdict": "wrong size", "detail": f"{list(g.shape)} vs {list(w.shape)}"})); sys.exit()
    try:
        np.testing.assert_allclose(g.reshape(w.shape).astype(w.dtype), w, rtol=meta["rtol"], atol=meta["atol"])
    except AssertionError as exc:
        print(json.dumps({"verdict": "wrong values", "detail": str(exc).strip().splitlines()[2][:120]})); sys.exit()
print(json.dumps({"verdict": "passes", "detail": ""}))
'''


def main() -> int:
    from sdrt.testing.cases import node_data_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary")
    p.add_argument("--target", default="ref")
    args = p.parse_args()
    data = json.loads(Path(args.summary).read_text())
    suffix = "_" + args.target
    verdicts: collections.Counter[str] = collections.Counter()
    for op, r in sorted(data["ops"].items()):
        for test, _ in r["failures"]:
            case = node_data_dir() / test.removesuffix(suffix)
            if not case.is_dir():
                continue
            try:
                proc = subprocess.run([sys.executable, "-c", CHILD, str(case), args.target], capture_output=True,
                                      text=True, timeout=600)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                out = json.loads(lines[-1]) if lines else {"verdict": f"died (exit {proc.returncode})",
                                                           "detail": proc.stderr.strip()[-200:]}
            except subprocess.TimeoutExpired:
                out = {"verdict": "timeout", "detail": ""}
            verdicts[out["verdict"]] += 1
            print(f"{test} [{op}]: {out['verdict']}: {out['detail']}", flush=True)
    print("\n" + ", ".join(f"{n} {v}" for v, n in verdicts.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
