"""Fuzz every picture input, on the command line and in the Python API, with odd and broken files (tests/fuzz/
pictures.py: truncated, corrupt, empty, text named .png, 16-bit, palette, LA, CMYK, I;16, 1-bit, float, animated
GIF/APNG/WebP, EXIF-rotated, 1x1 and 1xN, a decompression bomb's header) and with random edits of good ones.

A picture of a kind sdrt reads (pictures.KINDS "used") is used: the run goes on, or is refused for a reason that is
not the file (a mask of another size than the init image, a 1x1 picture to take the run's size from). One that it
cannot read is refused in one line that names the flag (the argument in the API) and the file. A mutated file
either way; never a traceback, never another exception. How each kind is read: docs/pipelines.md, "Pictures".
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pictures
import pytest
from cli_fuzz import sdrt
from gw_fuzz import EXAMPLES, SETTINGS, mutated
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sdrt.errors import SdrtError

DATA = Path(__file__).resolve().parents[1] / "data"
PIPES = DATA / "pipelines"
IPA = DATA / "ipadapter"
UPSCALER = DATA / "upscalers" / "compact_x4.safetensors"
FOLDER = Path(tempfile.mkdtemp(prefix="sdrt-fuzz-pictures-"))
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)
GOOD = pictures.make("png", FOLDER)
PICTURE_SETTINGS = settings(SETTINGS, max_examples=max(EXAMPLES // 4, 10))

RUN = ["--steps", "1", "--backend", "reference", "-o", str(FOLDER / "out.png")]
#: each picture input of the command line: (its flag, the command line around the picture ``P``)
SLOTS = {
    "init": ("--init-image", ["generate", "a fox", "--init-image", "P", "--strength", "1", *RUN]),
    "mask": ("--mask", ["generate", "a fox", "--init-image", str(GOOD), "--mask", "P", *RUN]),
    "control": ("--control-image", ["generate", str(PIPES / "tiny-sd15-controlnet"), "a fox", "--control-image", "P",
                                    *RUN]),
    "control-canny": ("--control-image", ["generate", str(PIPES / "tiny-sd15-controlnet"), "a fox", "--control-image",
                                          "P", "--control-preprocessor", "canny", *RUN]),
    "ip-adapter": ("--ip-adapter-image", ["generate", str(PIPES / "tiny-sd15"), "a fox", "--ip-adapter",
                                          str(IPA / "ip-adapter_tiny.safetensors"), "--ip-adapter-image", "P",
                                          "--image-encoder", str(IPA / "image_encoder"), *RUN]),
    "ip2p": ("--init-image", ["generate", str(PIPES / "tiny-sd15-ip2p"), "a fox", "--init-image", "P", *RUN]),
    "reference": ("--reference", ["generate", "a fox", "--reference", "P", *RUN]),
    "upscale": ("IMAGE", ["upscale", "P", "-m", str(UPSCALER), "-o", str(FOLDER / "up.png"), "--backend",
                          "reference", "--tile", "0"]),
}
#: refusals of a readable picture that are about its size, not its file
SIZE_WORDS = ("is 1x", "x1:", "too small", "the mask is", "at least 16x16", "FLUX.1 Kontext", "Kontext")
#: file-reading refusals
READ_WORDS = ("cannot read", "too large to read", "does not exist", "not an image file")


@pytest.fixture
def ip_encoder(monkeypatch):
    """sdrt's shipped ViT-H/14 graph replaced by the tiny test encoder's (as tests/pipelines/test_ipadapter.py)."""
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: IPA / "clip_vision.onnx" if name == "clip_vision_h"
                        else real(name))


@st.composite
def picture_files(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """(kind, bytes, suffix): a named kind, or a good picture with random edits ("mutated")."""
    if draw(st.booleans()):
        kind = draw(st.sampled_from(sorted(pictures.KINDS)))
        data = pictures.GOOD.get(kind, pictures.BAD.get(kind))
        return kind, data, "." + kind.rsplit(".", 1)[-1] if "." in kind else "." + kind
    data = draw(mutated(draw(st.sampled_from(pictures.SEEDS))))
    return "mutated", data, draw(st.sampled_from([".png", ".jpg", ".webp", ".gif"]))


@PICTURE_SETTINGS
@given(slot=st.sampled_from(sorted(SLOTS)), picture=picture_files())
def test_fuzz_picture_inputs_on_the_command_line(registry, ip_encoder, slot, picture):
    kind, data, suffix = picture
    path = FOLDER / f"in{suffix}"
    path.write_bytes(data)
    flag, template = SLOTS[slot]
    args = [str(path) if a == "P" else a for a in template]
    rc, err = sdrt(args)
    assert path.read_bytes() == data, f"sdrt {args!r} changed its input"
    line = next((x for x in err.splitlines() if x.startswith("error:")), "")
    expected = pictures.KINDS.get(kind)
    event(f"{slot} {kind if kind == 'mutated' else expected}: exit {rc}")
    if expected == "refused" or any(w in line for w in READ_WORDS):
        assert rc == 1, f"{slot}: {kind} was not refused:\n{err}"
        assert f"Where: {flag} {path}" in line, f"{slot}: {kind}'s refusal does not name {flag} and the file:\n{line}"
    elif expected == "used":
        assert rc == 0 or any(w in line for w in SIZE_WORDS), f"{slot}: {kind} was not used:\n{err}"


def _api_values(kind: str, data: bytes, path: Path) -> list[object]:
    """The picture as an app passes it: the path (str and Path), and the Pillow image when Pillow opens it."""
    from PIL import Image

    values: list[object] = [str(path), path]
    try:
        img = Image.open(path)
        values.append(img)
    except Exception:  # noqa: BLE001 (Pillow's own refusal of the file: then no Pillow image to pass)
        pass
    return values


@pytest.fixture(scope="module")
def demo():
    """The demo model on the reference backend (one load for every example)."""
    import sdrt_reference
    from sdrt import pipelines, plugins

    plugins.reset_registry()
    plugins.get_registry().register_plugin(sdrt_reference, "reference", distribution="sdrt-reference")
    with pipelines.load(pipelines.DEMO_MODEL, backend="reference") as pipe:
        yield pipe
    plugins.reset_registry()


ARRAYS = st.one_of(
    st.sampled_from([np.zeros((16, 16, 3), np.uint8), np.zeros((0, 16, 3), np.uint8), np.zeros((1, 1), np.uint8),
                     np.zeros((16, 16, 2), np.uint8), np.zeros((3, 16, 16), np.uint8), np.zeros((1, 16, 16, 3)),
                     np.full((16, 16, 3), np.nan), np.full((16, 16, 3), np.inf, np.float32),
                     np.full((16, 16), 2.0, np.float16), np.ones((16, 16), bool), np.full((16, 16, 4), 300, np.int64),
                     np.zeros((16, 16, 3), np.complex64), np.zeros((16, 16, 3), object), np.array(5), np.array("x"),
                     np.zeros((16, 16, 3), np.uint16), np.full((16, 16, 1), -1, np.int8)]),
    st.just([[1, 2], [3]]), st.just(3.5), st.just(None), st.just(b""), st.just(""), st.just({}),
)


@pytest.fixture(scope="module")
def nets():
    """tiny-sd15-controlnet and tiny-sd15 (for the IP-Adapter, whose encoder graph the test's is) on the reference
    backend, one load each for every example."""
    import sdrt_reference
    from sdrt import pipelines, plugins
    from sdrt.checkpoint import graphs

    plugins.reset_registry()
    plugins.get_registry().register_plugin(sdrt_reference, "reference", distribution="sdrt-reference")
    real = graphs.shipped_graph
    graphs.shipped_graph = lambda name: IPA / "clip_vision.onnx" if name == "clip_vision_h" else real(name)
    try:
        with pipelines.load(PIPES / "tiny-sd15-controlnet", backend="reference") as control, \
                pipelines.load(PIPES / "tiny-sd15", backend="reference") as plain:
            yield control, plain
    finally:
        graphs.shipped_graph = real
        plugins.reset_registry()


def _api_run(arg: str, value: object, demo, nets) -> None:
    """One generate() (or validate(), for a FLUX.1 Kontext reference) with ``value`` as the picture ``arg``."""
    from sdrt import pipelines
    from sdrt.pipelines import IPAdapter

    run = {"steps": 1, "width": 64, "height": 64}
    if arg == "init_image":
        demo.generate("a fox", init_image=value, strength=1.0, **run)
    elif arg == "mask":
        demo.generate("a fox", init_image=np.full((16, 16, 3), 99, np.uint8), mask=value, **run)
    elif arg == "controlnets":
        nets[0].generate("a fox", controlnets=[("controlnet", value)], **run)
    elif arg == "ip_adapter":
        nets[1].generate("a fox", ip_adapter=IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=value,
                                                       image_encoder=IPA / "image_encoder"), **run)
    else:
        pipelines.validate("a fox", reference_images=[value])


@PICTURE_SETTINGS
@given(data=st.data())
def test_fuzz_picture_inputs_in_the_api(demo, nets, data):
    arg = data.draw(st.sampled_from(["init_image", "mask", "controlnets", "ip_adapter", "reference_images"]),
                    label="argument")
    if data.draw(st.booleans()):
        kind, raw, suffix = data.draw(picture_files(), label="file")
        path = FOLDER / f"api{suffix}"
        path.write_bytes(raw)
        values = _api_values(kind, raw, path)
        if arg == "reference_images":  # validate alone (no Kontext model here): it reads paths, not Pillow images
            values = values[:2]
        value = data.draw(st.sampled_from(values), label="as")
    else:
        kind, raw, path = "array", b"", None
        value = data.draw(ARRAYS, label="array")
    try:
        _api_run(arg, value, demo, nets)
        event(f"{arg} {kind}: used")
        assert pictures.KINDS.get(kind) != "refused", f"{arg}: {kind} was used"
    except SdrtError as exc:
        text = str(exc)
        event(f"{arg} {kind}: refused")
        assert "\n" not in text and "Where:" in text and "What to do:" in text, text
        assert pictures.KINDS.get(kind) != "used" or any(w in text for w in SIZE_WORDS), f"{arg}: {kind}: {text}"
        if path is not None and isinstance(value, (str, Path)) and any(w in text for w in READ_WORDS):
            named = {"controlnets": "controlnets[0]", "ip_adapter": "ip_adapter_image"}.get(arg, arg)
            assert f"Where: {named} {path}" in text, text
    if path is not None:
        assert path.read_bytes() == raw
