"""``precision=`` reaches every model a run compiles: the pipeline's parts, the SDXL refiner and the hires fix's
own checkpoint (each loaded from a path by the run) and the hires fix's model upscaler, and the CLI's
``--precision`` (``sdrt generate``, ``sdrt upscale``) is that keyword.

The runs set ``SDRT_PRECISION=bf16`` (another default than the one asked for) and pass ``precision="fp32"``; the
references are diffusers' and spandrel's float32 outputs (the fixtures' own scripts), which a bf16 compile misses
where the CPU computes bf16 (AVX-512-BF16 or AMX); the options each part compiled with are checked on every CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, cases, refs, register

from sdrt import pipelines
from sdrt.cli import main
from sdrt.pipelines import upscaler as U

UPSCALERS = Path(__file__).resolve().parents[1] / "data" / "upscalers"


@pytest.fixture(autouse=True)
def _bf16_default(monkeypatch):
    register("openvino")
    monkeypatch.setenv("SDRT_PRECISION", "bf16")


def _compiled_at(pipe: pipelines.Pipeline) -> set:
    return {part.options.get("precision") for part in pipe._parts.values()}


def test_the_refiner_loaded_from_a_path_compiles_at_the_bases_precision() -> None:
    name = "refiner/Euler a/0.7"
    case = next(c for c in cases("tiny-sdxl-refiner") if c["name"] == name)
    with pipelines.load(DATA / "tiny-sdxl", backend="openvino", precision="fp32") as base:
        gen = base.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                            sampler=case["sampler"], seed=case["seed"], width=case["width"], height=case["height"],
                            batch=case["batch"], refiner=DATA / "tiny-sdxl-refiner",
                            refiner_switch_at=case["switch_at"])
        (refiner,) = base._refiners.values()
        assert _compiled_at(base) == _compiled_at(refiner) == {"fp32"}
        assert_matches_diffusers(gen.images, refs("tiny-sdxl-refiner")[name])


def test_the_hires_checkpoint_loaded_from_a_path_compiles_at_the_first_models_precision() -> None:
    import json

    b = DATA / "tiny-sd15-dyn-b"
    case = next(c for c in json.loads((b / "hires_refs.json").read_text()) if c["name"] == "Lanczos/Euler")
    with pipelines.load(DATA / "tiny-sd15-dyn", backend="openvino", precision="fp32") as first:
        gen = first.generate(case["prompt"], case["negative_prompt"], hires_checkpoint=b, steps=case["steps"],
                             cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
                             height=case["height"], hires_scale=case["hires_scale"], hires_steps=case["hires_steps"],
                             hires_denoise=case["hires_denoise"], hires_upscaler=case["upscaler"])
        second = first._hires_job
        assert second is not None and second is not first
        assert _compiled_at(first) == _compiled_at(second) == {"fp32"}
        assert_matches_diffusers(gen.images, np.load(b / "hires_refs.npz")[case["name"]])


def test_the_hires_model_upscaler_compiles_at_the_pipelines_precision() -> None:
    with pipelines.load(DATA / "tiny-sd15-dyn", backend="openvino", precision="fp32") as pipe:
        up = pipe._model_upscaler(UPSCALERS / "compact_x2.safetensors")
        assert up.options == {"precision": "fp32"}
        np.testing.assert_allclose(up.run(np.load(UPSCALERS / "refs.npz")["image"]),
                                   np.load(UPSCALERS / "refs.npz")["compact_x2"], atol=2e-4, rtol=0)


def test_cli_generate_precision(tmp_path, capsys) -> None:
    out = tmp_path / "a.png"
    assert main(["generate", "a red circle", "--backend", "openvino", "--steps", "2", "--precision", "float32",
                 "--dry-run"]) == 0
    assert "compute: openvino on CPU, fp32 (asked for)" in capsys.readouterr().out
    assert main(["generate", "a red circle", "--backend", "openvino", "--steps", "2", "--dry-run"]) == 0
    assert "compute: openvino on CPU, bf16 ($SDRT_PRECISION)" in capsys.readouterr().out
    assert main(["generate", "a red circle", "--backend", "openvino", "--steps", "2", "--precision", "int8",
                 "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "precision 'int8' is not one this backend accepts" in err and "Where: --precision." in err
    assert not out.exists()
    # the flag's image is the API's, at the precision named
    assert main(["generate", "a red circle", "--backend", "openvino", "--steps", "2", "--seed", "3",
                 "--precision", "fp32", "-o", str(out)]) == 0
    from PIL import Image

    with pipelines.load(pipelines.DEMO_MODEL, backend="openvino", precision="fp32") as pipe:
        assert _compiled_at(pipe) == {"fp32"}
        want = pipe.generate("a red circle", steps=2, seed=3).images[0]
    assert np.array_equal(np.asarray(Image.open(out).convert("RGB")), want)


def test_cli_generate_precision_on_a_float32_only_backend(tmp_path, capsys) -> None:
    register("reference")
    assert main(["generate", "x", "--backend", "reference", "--precision", "bf16", "-o",
                 str(tmp_path / "b.png")]) == 1
    assert capsys.readouterr().err == ("error: the reference backend computes in fp32 only, not 'bf16'. Where: "
                                       "--precision. What to do: pass --precision fp32, leave it out, or pick "
                                       "another --backend.\n")
    assert main(["generate", "x", "--backend", "reference", "--precision", "fp32", "--dry-run"]) == 0
    assert "compute: reference on CPU, fp32 (the device's default)" in capsys.readouterr().out


def test_cli_upscale_precision(tmp_path, capsys) -> None:
    from PIL import Image

    image = tmp_path / "in.png"
    Image.fromarray(np.full((20, 24, 3), 128, np.uint8)).save(image)
    out = tmp_path / "up.png"
    assert main(["upscale", str(image), "-m", str(UPSCALERS / "compact_x2.safetensors"), "--backend", "openvino",
                 "--precision", "int8", "-o", str(out)]) == 1
    assert "Where: --precision." in capsys.readouterr().err and not out.exists()
    assert main(["upscale", str(image), "-m", str(UPSCALERS / "compact_x2.safetensors"), "--backend", "openvino",
                 "--precision", "fp32", "-o", str(out)]) == 0
    want = U.ModelUpscaler(UPSCALERS / "compact_x2.safetensors", backend="openvino",
                           options={"precision": "fp32"}).upscale(np.asarray(Image.open(image).convert("RGB")))
    assert np.array_equal(np.asarray(Image.open(out).convert("RGB")), want)
