"""IP-Adapter on the compiled backends: the UNet graph edited for IP attention (``ip_adapter_{k}_key`` / ``_value``
inputs) and the CLIP image encoder run on OpenVINO and ggml as on the reference backend, against the same diffusers
images as tests/pipelines/test_ipadapter.py (``load_ip_adapter`` on tiny-sd15 and tiny-sdxl)."""

from __future__ import annotations

import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, register
from test_ipadapter import CASES, FOLDER, REFS, XL_CASES, kwargs, tiny_encoder_graph, unit  # noqa: F401


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_ip_adapter_matches_diffusers_on_compiled_backends(backend, tiny_encoder_graph):  # noqa: F811
    from sdrt import pipelines

    register(backend)
    for folder, cases, adapter in ((FOLDER, CASES, "ip-adapter_tiny.safetensors"),
                                   (DATA / "tiny-sdxl", XL_CASES, "ip-adapter_tiny_sdxl.safetensors")):
        with pipelines.load(folder, backend=backend) as pipe:
            for case in cases:
                ip = unit(case["scale"], adapter=adapter)
                got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=ip, **kwargs(case)).images
                assert_matches_diffusers(got, REFS[case["name"]])
                assert pipe.unet.backend == backend

