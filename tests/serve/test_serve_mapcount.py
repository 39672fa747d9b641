"""A long-running server warns before its memory maps reach the kernel's vm.max_map_count (OpenVINO keeps 100-200
maps per model compiled and released: docs/openvino.md, "Memory maps in a long-running process")."""

from __future__ import annotations

import logging
import sys

import pytest
from serve_helpers import live_server, needs_server

pytestmark = [needs_server, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                               reason="memory maps are counted from Linux's /proc")]
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency of the server")


def test_usage_is_the_process_maps_and_the_kernel_limit() -> None:
    from sdrt.serve import mapcount

    with open("/proc/sys/vm/max_map_count") as f:
        limit = int(f.read())
    with open("/proc/self/maps") as f:
        before = len(f.readlines())
    count, seen_limit = mapcount.usage()
    assert seen_limit == limit
    assert abs(count - before) < 50  # the same process a moment later: a few maps come and go


def test_a_server_past_the_share_warns_once_after_a_job(models_dir, monkeypatch, caplog) -> None:
    from sdrt.serve import ServeConfig, mapcount

    assert not mapcount.check()  # a test process is far below the limit
    monkeypatch.setattr(mapcount, "WARN_SHARE", 0.0)  # every process is past 0% of it
    monkeypatch.setattr(mapcount, "_warned", False)
    body = {"prompt": "a red circle", "seed": 5, "steps": 1, "width": 64, "height": 64}
    with caplog.at_level(logging.WARNING, logger="sdrt.serve"), \
            live_server(ServeConfig(models=models_dir, backend="reference")) as url, \
            httpx.Client(base_url=url, timeout=300) as c:
        for _ in range(2):
            assert c.post("/sdapi/v1/txt2img", json=body).status_code == 200
    warned = [r.getMessage() for r in caplog.records if "vm.max_map_count" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "sysctl -w vm.max_map_count=" in warned[0] and "restart the server" in warned[0]
