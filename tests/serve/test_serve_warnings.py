"""A warning a job logs in its worker thread names the request's fields, as its errors do: the worker runs each job
inside ``caller_words`` with the request's names (``in_caller_words``, the sdrt command's counterpart)."""

from __future__ import annotations

import logging

import httpx
from serve_helpers import needs_server

pytestmark = needs_server

OK = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 2, "seed": 1, "cfg_scale": 1}


def test_a_jobs_warning_names_the_request_fields(server, caplog, monkeypatch) -> None:
    from sdrt.errors import in_caller_words
    from sdrt.serve import jobs

    run = jobs.generate_until_stopped
    log = logging.getLogger("sdrt.pipelines.pipeline")

    def warning_then_run(*args, **kwargs):  # a pipeline warning that names arguments, as a run logs one
        log.warning("%s", in_caller_words("raise {@strength}, {@cfg} or {@text_encoders}"))
        return run(*args, **kwargs)

    monkeypatch.setattr(jobs, "generate_until_stopped", warning_then_run)
    caplog.set_level(logging.WARNING)
    with httpx.Client(base_url=server, timeout=300) as client:
        r = client.post("/sdapi/v1/txt2img", json=OK)
    assert r.status_code == 200, r.text
    said = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("raise ")]
    assert said == ["raise denoising_strength, cfg_scale or forge_additional_modules"], caplog.text
    assert in_caller_words("{@strength}") == "strength"  # outside a job: the API's words

