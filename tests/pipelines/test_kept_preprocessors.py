"""How many compiled model-backed preprocessors stay loaded (``preprocessors.keep_preprocessors``), that one in use
on another thread is never closed, and that a job's memory plan counts the detector and releases it when tight.

The detectors are real (MiDaS at reduced widths, M-LSD and the realistic lineart net at their published sizes,
seeded weights written as ``torch.save`` files by the other tests' helpers) on OpenVINO.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lineart_helpers import make_generator  # noqa: E402
from midas_helpers import SMALL, make_weights  # noqa: E402
from mlsd_helpers import write_file  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError  # noqa: E402
from sdrt.pipelines import preprocessors  # noqa: E402

IMAGE = np.random.default_rng(7).integers(0, 256, (64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from sdrt.pipelines import midasdepth

    root = tmp_path_factory.mktemp("kept")
    out = {"depth_midas": write_pth(root / midasdepth.MIDAS_FILE, make_weights(SMALL)),
           "mlsd": write_file(root / "mlsd"),
           "lineart_realistic": write_pth(root / "sk_model.pth", make_generator())}
    register("openvino")
    return out


@pytest.fixture
def clean():
    """An empty cache with the default bound before and after (other tests keep their detectors)."""
    preprocessors.release()
    before = preprocessors.keep_preprocessors(1)
    yield
    preprocessors.keep_preprocessors(before)
    preprocessors.release()


def _run(name: str, files: dict) -> np.ndarray:
    return preprocessors.preprocess(IMAGE, name, resolution=64, models=files[name], backend="openvino")


def _kept() -> list[str]:
    return [kind for kind, _, _, _ in preprocessors.kept_detectors()]


def test_only_the_last_used_detector_stays_by_default(files, clean):
    """One per backend and device by default: the second kind closes the first once idle, a third the second;
    keep_preprocessors(2) keeps the two most recently used; 0 closes each after its maps."""
    _run("depth_midas", files)
    midas = preprocessors._DWPOSE[next(iter(preprocessors._DWPOSE))]
    assert _kept() == ["midas"] and midas._sessions
    _run("mlsd", files)
    assert _kept() == ["mlsd"] and not midas._sessions  # closed: its compiled graphs went
    preprocessors.keep_preprocessors(2)
    _run("depth_midas", files)
    _run("lineart_realistic", files)
    assert _kept() == ["lineart_realistic", "midas"]  # the third kind closed the oldest idle one (mlsd)
    _run("depth_midas", files)  # used again: the most recent, so mlsd's successor goes next
    _run("mlsd", files)
    assert _kept() == ["mlsd", "midas"]
    preprocessors.keep_preprocessors(0)
    assert _kept() == []
    first = _run("mlsd", files)
    assert _kept() == [] and np.array_equal(_run("mlsd", files), first)


def test_keep_is_checked():
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(InputError, match="keep_preprocessors must be a whole number >= 0"):
            preprocessors.keep_preprocessors(bad)


def test_a_detector_in_use_on_another_thread_is_never_closed(files, clean):
    """serve's /controlnet/detect runs beside a job on the same device: thread A holds MiDaS while thread B runs two
    other kinds (bound 1). A's detector stays open and makes the same map; it goes once A is done."""
    got: dict[str, object] = {}
    inside, go_on = threading.Event(), threading.Event()

    def a() -> None:
        with preprocessors.held():
            det = preprocessors.midas(files["depth_midas"], "openvino")
            got["want"] = det.maps(IMAGE, 0.1)[0]
            inside.set()
            go_on.wait(120)
            got["open"] = bool(det._sessions)  # its compiled graph: still there after B's trims
            got["map"] = det.maps(IMAGE, 0.1)[0]
            got["det"] = det

    def b() -> None:
        _run("mlsd", files)
        _run("lineart_realistic", files)
        got["during"] = preprocessors.kept_detectors()

    ta = threading.Thread(target=a)
    ta.start()
    assert inside.wait(120)
    tb = threading.Thread(target=b)
    tb.start()
    tb.join(300)
    go_on.set()
    ta.join(300)
    # while A used it, B's trim left it (in use) and kept B's last one; mlsd, idle, went
    assert [(k, used) for k, _, _, used in got["during"]] == [("lineart_realistic", False), ("midas", True)]
    assert got["open"] and np.array_equal(got["map"], got["want"])
    assert _kept() == ["lineart_realistic"] and not got["det"]._sessions  # closed once A was done


def test_serve_keep_preprocessors_flag(tmp_path, clean):
    """``sdrt serve --keep-preprocessors N`` sets the bound when the server starts (default 1); below 0: one line."""
    from sdrt.cli import build_parser
    from sdrt.cli.serve import config_from_args
    from sdrt.serve.state import ServerState

    assert config_from_args(build_parser().parse_args(["serve"])).keep_preprocessors == 1
    config = config_from_args(build_parser().parse_args(["serve", "--models", str(tmp_path),
                                                         "--keep-preprocessors", "3"]))
    assert config.keep_preprocessors == 3
    ServerState(config).close()
    assert preprocessors.keep_preprocessors() == 3
    with pytest.raises(InputError, match="--keep-preprocessors -1 is below 0"):
        config_from_args(build_parser().parse_args(["serve", "--keep-preprocessors", "-1"]))


def _unit(path):
    from sdrt.pipelines.controlnet import ControlNet

    return ControlNet("controlnet", IMAGE, preprocessor="depth_midas", processor_res=64, preprocessor_models=path)


KW = dict(steps=2, seed=1, width=64, height=64, sampler="Euler")


def test_the_plan_counts_the_detector(files, clean, tmp_path, capsys):
    """A job with a model-backed preprocessor plans its detector as an extra part (``preprocessor:midas``: the
    file's tensors as float32); ``--dry-run`` prints it beside the ControlNet."""
    from PIL import Image
    from pipeline_helpers import DATA

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines.budget import DETECTOR_FOOTPRINT
    from sdrt.weights import Weights

    want = sum(4 * int(np.prod(s)) for s in Weights.open(files["depth_midas"]).shapes().values())
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend="openvino") as pipe:
        plan = pipe.plan("a room", controlnets=[_unit(files["depth_midas"])], **KW).memory
    placed = plan.placement("preprocessor:midas")
    assert placed is not None and placed.role == "preprocessor" and placed.weight_bytes == want
    assert plan.footprints["preprocessor:midas"] == DETECTOR_FOOTPRINT
    assert placed.peak_bytes >= plan.base_bytes + DETECTOR_FOOTPRINT * want
    png = tmp_path / "room.png"
    Image.fromarray(IMAGE).save(png)
    assert main(["generate", str(DATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--backend", "openvino",
                 "--control-image", str(png), "--control-preprocessor", "depth_midas",
                 "--control-preprocessor-models", str(files["depth_midas"]), "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "preprocessor:midas" in out.out + out.err and "preprocessor" in out.out + out.err


def test_a_tight_budget_closes_the_detector_before_the_unet(files, clean):
    """With room the detector stays kept after the job; under a budget below every part resident the plan releases
    it, and it is closed once the maps are made (before the denoiser runs): nothing is kept after the job, and the
    image is the same."""
    from pipeline_helpers import DATA

    from sdrt import pipelines

    seen: list[list[str]] = []
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend="openvino") as pipe:
        roomy = pipe.generate("a room", controlnets=[_unit(files["depth_midas"])], **KW)
        plan = pipe.memory_plan()
        assert _kept() == ["midas"] and plan.placement("preprocessor:midas").placement == "resident"
    # half of what the job needs above the process: the detector (the largest part) cannot stay. The budget is set
    # over this pipeline's own base (the process's RSS as its plan first measures it): in a long test process the
    # RSS moves between two loads by more than this tiny model's parts, either way
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend="openvino", memory=plan.peak_bytes) as pipe:
        pipe.memory = int(pipe.memory_plan().base_bytes + (plan.peak_bytes - plan.base_bytes) / 2)
        tight = pipe.generate("a room", controlnets=[_unit(files["depth_midas"])],
                              callback=lambda *a: seen.append(_kept()), **KW)
        assert pipe.memory_plan().placement("preprocessor:midas").placement == "released"
    assert seen and all(k == [] for k in seen), seen  # closed before the first step
    assert _kept() == [] and np.array_equal(roomy.images[0], tight.images[0])


@pytest.fixture(scope="module")
def big_midas(tmp_path_factory):
    """MiDaS at a ViT width of 512 (169 MiB of float32 weights): big enough for the RSS to show it."""
    from sdrt.pipelines import midasdepth

    return write_pth(tmp_path_factory.mktemp("bigmidas") / midasdepth.MIDAS_FILE,
                     make_weights(dict(SMALL, embed=512, mlp=2048)))


def test_the_released_detector_leaves_the_unets_rss(big_midas):
    """Measured in a process of its own (tests/pipelines/kept_rss_probe.py): while the UNet runs, the process holds
    less by at least the detector's weights when the tight budget released it."""
    import json
    import subprocess

    probe = Path(__file__).resolve().parent / "kept_rss_probe.py"
    got = {}
    for mode in ("roomy", "tight"):
        run = subprocess.run([sys.executable, str(probe), str(big_midas), mode], capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        got[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    roomy, tight = got["roomy"], got["tight"]
    assert roomy["placed"] == "resident" and roomy["kept"] == ["midas"], roomy
    assert tight["placed"] == "released" and tight["kept"] == [], tight
    assert tight["unet_rss"] < roomy["unet_rss"] - roomy["detector_bytes"], got


def test_a_t2i_adapter_units_detector_is_planned_and_released_in_low_memory(files, clean):
    """A T2I-Adapter unit's model-backed preprocessor is planned as a ControlNet unit's is, and in low-memory mode
    it is closed once the map is made, before the first step; the image is the one with the detector kept."""
    from pipeline_helpers import DATA

    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet

    folder = DATA / "tiny-sd15-t2ia"
    unit = dict(preprocessor="depth_midas", processor_res=64, preprocessor_models=files["depth_midas"])
    adapter = str(folder / "t2iadapter_canny_tiny.pth")
    seen: list[list[str]] = []
    with pipelines.load(folder, backend="openvino") as pipe:
        plan = pipe.plan("a room", controlnets=[ControlNet(adapter, IMAGE, **unit)], **KW).memory
        assert plan.placement("preprocessor:midas") is not None
        roomy = pipe.generate("a room", controlnets=[ControlNet(adapter, IMAGE, **unit)], **KW)
        assert _kept() == ["midas"]
    with pipelines.load(folder, backend="openvino", low_memory=True) as pipe:
        low = pipe.generate("a room", controlnets=[ControlNet(adapter, IMAGE, **unit)],
                            callback=lambda *a: seen.append(_kept()), **KW)
    assert seen and all(k == [] for k in seen), seen  # closed before the first step
    assert np.array_equal(roomy.images[0], low.images[0])
