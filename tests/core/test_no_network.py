"""Nothing opens a network connection unless asked: importing every installed plugin and generating
with each installed backend, in a child process whose audit hook records (and blocks) every DNS
look-up, socket connect and urllib request.

The child runs with a fresh HOME and without CI variables, where OpenVINO's telemetry would send
its event (no opt-out file in ``~/intel``, not in CI): the last test turns sdrt's block off
(``SDRT_OPENVINO_TELEMETRY=1``) and sees the hook catch the event, so the hook is known to work.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

HOOK = textwrap.dedent("""
    import json, os, sys
    LOG = os.environ["SDRT_TEST_NET_LOG"]
    EVENTS = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
              "urllib.Request", "http.client.connect")
    def hook(event, args):
        if event in EVENTS:
            with open(LOG, "a") as f:
                f.write(json.dumps([event, repr(args)[:200]]) + "\\n")
            raise PermissionError(f"network blocked by the test: {event}")
    sys.addaudithook(hook)
    from sdrt.cli import main
    raise SystemExit(main(sys.argv[1:]))
""")

BACKENDS = [b for b, module in (("reference", "sdrt_reference"), ("openvino", "openvino"), ("ggml", "sdrt_ggml"))
            if importlib.util.find_spec(module) is not None]


def run_blocked(tmp_path, args, **env_extra):
    """``sdrt ARGS`` in a child with the network audit hook; (exit code, stderr, recorded events)."""
    log = tmp_path / "net.log"
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    drop = ("CI", "TF_BUILD", "JENKINS_URL", "SDRT_OPENVINO_TELEMETRY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(SDRT_TEST_NET_LOG=str(log), HOME=str(home), SDRT_LOAD_ENTRY_POINTS="1",
               SDRT_CACHE_DIR=str(tmp_path / "cache"), **env_extra)
    proc = subprocess.run([sys.executable, "-c", HOOK, *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, proc.stderr, events


def test_importing_every_installed_plugin_opens_no_connection(tmp_path):
    """``sdrt info`` imports every plugin (trt, coreml, migraphx too, where installed) and lists devices."""
    code, err, events = run_blocked(tmp_path, ["info"])
    assert code == 0, err
    assert events == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_generating_on_each_installed_backend_opens_no_connection(tmp_path, backend):
    out = tmp_path / "out.png"
    code, err, events = run_blocked(tmp_path, ["generate", "a red circle on a blue background", "--steps", "2",
                                               "--seed", "1", "--backend", backend, "-o", str(out)])
    assert code == 0, err
    assert f"backend {backend} on " in err
    assert out.is_file() and events == []
    assert not (tmp_path / "home" / "intel").exists()  # OpenVINO's telemetry writes its client id there


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None
                    or importlib.util.find_spec("openvino_telemetry") is None,
                    reason="needs openvino with openvino-telemetry installed (sdrt-openvino brings both)")
def test_the_hook_catches_openvino_telemetry_when_sdrt_leaves_it_on(tmp_path):
    code, err, events = run_blocked(tmp_path, ["generate", "a red circle", "--steps", "1", "--backend", "openvino",
                                               "-o", str(tmp_path / "out.png")], SDRT_OPENVINO_TELEMETRY="1")
    assert code == 0, err
    assert any("google-analytics" in args for _, args in events), events
