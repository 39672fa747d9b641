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



@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_ip_adapter_plus_matches_diffusers_on_compiled_backends(backend, tiny_encoder_graph):  # noqa: F811
    """Plus reads the encoder's second output (penultimate hidden states, a picture and a zero picture in one
    batch-2 call): the compiled encoder gives both as the reference backend does."""
    from test_ipadapter_plus import CASES as PLUS_CASES
    from test_ipadapter_plus import PLUS
    from test_ipadapter_plus import XL_CASES as PLUS_XL
    from test_ipadapter_plus import unit as plus_unit

    from sdrt import pipelines

    register(backend)
    for folder, cases, adapter in ((FOLDER, PLUS_CASES, "ip-adapter-plus_tiny.safetensors"),
                                   (DATA / "tiny-sdxl", PLUS_XL, "ip-adapter-plus_tiny_sdxl.safetensors")):
        with pipelines.load(folder, backend=backend) as pipe:
            for case in cases:
                ip = plus_unit(case["scale"], adapter=adapter)
                got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=ip, **kwargs(case)).images
                assert_matches_diffusers(got, PLUS[case["name"]])


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_several_adapters_with_windows_match_diffusers_on_compiled_backends(backend, tiny_encoder_graph):  # noqa: F811
    """Two adapters (a base and a Plus one: 4 and 16 image tokens, two token dimensions of the edited UNet), on two
    pictures or one, with and without step windows, and one adapter with a window, on tiny-sd15 and tiny-sdxl: the
    windows switch the value inputs to zeros between steps, the compiled UNet the same for every step."""
    from test_ipadapter_multi import CASES as MULTI_CASES
    from test_ipadapter_multi import FOLDERS, MULTI, run

    from sdrt import pipelines

    register(backend)
    for family in ("sd15", "sdxl"):
        with pipelines.load(FOLDERS[family], backend=backend) as pipe:
            for case in (c for c in MULTI_CASES if c["family"] == family):
                assert_matches_diffusers(run(pipe, case), MULTI[case["name"]])
                assert pipe.unet.backend == backend


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_vit_bigg_and_full_face_adapters_match_diffusers_on_compiled_backends(backend, monkeypatch):
    """The bigG encoder's graph (a second architecture, bound by its config) compiled on the backend, for SD 1.x and
    SDXL, and Full Face's 17 tokens a picture (the encoder's hidden states, picture and zero picture in one call)."""
    from test_ipadapter_more import FULL_CASES, G_CASES, G_XL_CASES, MORE, TINY
    from test_ipadapter_more import unit as more_unit

    from sdrt import pipelines
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: TINY.get(name) or real(name))
    register(backend)
    ipa = DATA.parent / "ipadapter"
    for folder, cases, adapter, encoder in (
            (FOLDER, G_CASES, "ip-adapter_tiny_vit-G.safetensors", "image_encoder_g"),
            (DATA / "tiny-sdxl", G_XL_CASES, "ip-adapter_tiny_sdxl_vit-G.safetensors", "image_encoder_g"),
            (FOLDER, FULL_CASES[:1], "ip-adapter-full-face_tiny.safetensors", "image_encoder")):
        with pipelines.load(folder, backend=backend) as pipe:
            for case in cases:
                ip = more_unit(case["scale"], adapter, ipa / encoder)
                got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=ip, **kwargs(case)).images
                assert_matches_diffusers(got, MORE[case["name"]])
                assert pipe.unet.backend == backend
                assert [p.backend for p in pipe._ip_encoders.values()] == [backend]


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_a_vit_bigg_and_a_full_face_adapter_together_match_diffusers_on_compiled_backends(backend, monkeypatch):
    """Two encoders of two architectures compiled on the backend in one run, the UNet with 4 + 17 image tokens, with
    and without windows (scripts/gen_ipadapter_mixed_refs.py)."""
    from test_ipadapter_mixed import CASES as MIXED_CASES
    from test_ipadapter_mixed import MIXED, adapters
    from test_ipadapter_mixed import kw as mixed_kw
    from test_ipadapter_more import TINY

    from sdrt import pipelines
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: TINY.get(name) or real(name))
    register(backend)
    with pipelines.load(FOLDER, backend=backend) as pipe:
        for name, case in MIXED_CASES.items():
            got = pipe.generate("a photo of a red cat", "blurry", ip_adapter=adapters(case), **mixed_kw(case)).images
            assert_matches_diffusers(got, MIXED[name])
            assert [p.backend for p in pipe._ip_encoders.values()] == [backend, backend]
