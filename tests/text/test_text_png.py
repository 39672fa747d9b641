"""PNG output with A1111's parameters chunk, read back with Pillow (a test dependency; the core does not use it)."""

from __future__ import annotations

import io
import json
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, PngImagePlugin

from sdrt.errors import SdrtError
from sdrt.pipelines.png import PngError, encode_png, format_parameters, read_parameters, read_text_chunks, write_png

SETTINGS = {"Steps": 20, "Sampler": "Euler a", "CFG scale": 7, "Seed": 965400086, "Size": "512x512",
            "Model hash": "45dee52b"}
PROMPT = ("girl with an artist's beret, determined, blue eyes, desert scene, computer monitors, heavy makeup, "
          "by Alphonse Mucha and Charlie Bowater, ((eyeshadow)), (coquettish), detailed, intricate")
NEGATIVE = ("ugly, fat, obese, chubby, (((deformed))), [blurry], bad anatomy, disfigured, poorly drawn face, "
            "mutation, mutated, (extra_limb), (ugly), (poorly drawn hands), messy drawing")


def image(h=37, w=53, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, c) if c else (h, w), dtype=np.uint8)


# -- the text ------------------------------------------------------------------------------------------------------


def test_the_example_of_a1111s_own_docstring():
    # modules/infotext_utils.py, parse_generation_parameters: the text A1111 shows under an image
    expected = (f"{PROMPT}\nNegative prompt: {NEGATIVE}\n"
                "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 965400086, Size: 512x512, Model hash: 45dee52b")
    assert format_parameters(PROMPT, NEGATIVE, SETTINGS) == expected


def test_no_negative_line_when_empty():
    for negative in ("", None):
        assert format_parameters("a cat", negative, {"Steps": 4}) == "a cat\nSteps: 4"


def test_a1111_order_quoting_and_none():
    text = format_parameters("p", "n", {
        "Model": "my: model, v2", "Seed": 1, "Version": "v1.10.1", "Lora hashes": "ink: 1234, x: 5678",
        "Steps": 30, "Schedule type": "Karras", "Sampler": "DPM++ 2M", "CFG scale": 6.5, "Size": "768x512",
        "Clip skip": 2, "Denoising strength": None, "Hires upscale": "\"2\"\nx", "Tiling": "Tiling",
    })
    assert text.splitlines()[2] == (
        'Steps: 30, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 6.5, Seed: 1, Size: 768x512, '
        'Model: "my: model, v2", Clip skip: 2, Tiling, Lora hashes: "ink: 1234, x: 5678", '
        'Hires upscale: "\\"2\\"\\nx", Version: v1.10.1')
    assert len(text.splitlines()) == 3  # the newline in a value is quoted, not written


# A1111's infotext_utils.quote JSON-quotes a value (json.dumps, ensure_ascii=False) when it holds ",", ":" or a
# newline, and only then; its parse_generation_parameters reads a value that starts with '"' as a JSON string and
# any other value up to the next ",". A comma alone must be quoted: unquoted, "Model: dreamshaper_8, pruned" reads
# back as the model "dreamshaper_8" and a stray " pruned".
QUOTING = [
    ("dreamshaper_8, pruned", '"dreamshaper_8, pruned"'),  # a comma alone
    ("sd15:inpaint", '"sd15:inpaint"'),  # a colon alone
    ("two\nlines", '"two\\nlines"'),  # a newline alone
    ("a,b:c\nd", '"a,b:c\\nd"'),
    ("モデル, 猫", '"モデル, 猫"'),  # ensure_ascii=False: written as is, inside the quotes
    ('say "cheese"', 'say "cheese"'),  # A1111 leaves a value holding only quotes bare
    ("dreamshaper_8", "dreamshaper_8"),
]


@pytest.mark.parametrize("value,written", QUOTING)
def test_values_are_json_quoted_exactly_when_a1111_quotes_them(value, written):
    text = format_parameters("p", "", {"Steps": 20, "Model": value, "Seed": 1})
    assert text.splitlines()[-1] == f"Steps: 20, Seed: 1, Model: {written}"


def _read_settings_line(line: str) -> dict[str, str]:
    """The settings line read the way A1111 reads it: ``Key: value`` pairs split by ", "; a value starting with
    a double quote is one JSON string (commas and colons inside it are text), any other runs to the next comma."""
    decoder, out, pos = json.JSONDecoder(), {}, 0
    while pos < len(line):
        colon = line.index(":", pos)
        key, pos = line[pos:colon].strip(), colon + 1
        while line[pos:pos + 1] == " ":
            pos += 1
        if line[pos:pos + 1] == '"':
            value, pos = decoder.raw_decode(line, pos)
        else:
            end = line.find(",", pos)
            end = len(line) if end < 0 else end
            value, pos = line[pos:end], end
        out[key] = value
        pos = line.find(",", pos)
        pos = len(line) if pos < 0 else pos + 1
    return out


@pytest.mark.parametrize("value", [v for v, _ in QUOTING])
def test_every_value_round_trips_through_the_png(tmp_path, value):
    settings = {"Steps": 20, "Sampler": "DPM++ 2M", "CFG scale": 7, "Seed": 42, "Size": "64x48", "Model": value,
                "Lora hashes": "ink, v2: 1234", "Clip skip": 2}
    text = format_parameters("a cat, sitting", "blurry, dark", settings)
    write_png(tmp_path / "x.png", image(), text)
    got = read_parameters(tmp_path / "x.png")
    assert got == text
    prompt, negative, line = got.split("\n")
    assert (prompt, negative) == ("a cat, sitting", "Negative prompt: blurry, dark")
    assert _read_settings_line(line) == {k: str(v) for k, v in settings.items()}


def test_text_is_stripped_like_a1111():
    assert format_parameters("  a cat \n", "", {}) == "a cat"
    assert format_parameters("", "", {"Steps": 1}) == "Steps: 1"
    assert format_parameters("猫", "nsfw", {"Model": "モデル"}) == "猫\nNegative prompt: nsfw\nModel: モデル"


# -- writing and reading back with Pillow -------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [3, 0, 1, 2, 4])
def test_pillow_reads_pixels_and_parameters(tmp_path, channels):
    pixels = image(c=channels)
    text = format_parameters(PROMPT, NEGATIVE, SETTINGS)
    path = write_png(tmp_path / "out.png", pixels, text, extra={"Software": "sdrt"})
    assert path == tmp_path / "out.png"
    with Image.open(path) as im:
        im.verify()  # chunk CRCs and structure
    with Image.open(path) as im:
        assert im.info["parameters"] == text and im.info["Software"] == "sdrt"
        got = np.asarray(im)
    assert np.array_equal(got, pixels[:, :, 0] if channels == 1 else pixels)
    assert read_parameters(path) == text


def test_generated_png_chunk_equals_the_expected_text(tmp_path):
    """The issue's "must show": a PNG whose parameters chunk, read back with Pillow, equals the expected text."""
    expected = ("a red fox in the snow, (detailed fur:1.2)\nNegative prompt: blurry\n"
                "Steps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: 42, Size: 64x48, "
                "Model hash: 0123abcd, Model: tiny-sd")
    settings = {"Steps": 20, "Sampler": "DPM++ 2M", "Schedule type": "Karras", "CFG scale": 7, "Seed": 42,
                "Size": "64x48", "Model hash": "0123abcd", "Model": "tiny-sd"}
    text = format_parameters("a red fox in the snow, (detailed fur:1.2)", "blurry", settings)
    write_png(tmp_path / "fox.png", image(48, 64), text)
    with Image.open(tmp_path / "fox.png") as im:
        assert im.text["parameters"] == expected


def test_latin1_is_text_other_is_itxt():
    latin = encode_png(image(), "café, naïve")
    wide = encode_png(image(), "猫 🐱")
    assert b"tEXtparameters\0caf\xe9" in latin and b"iTXt" not in latin
    assert b"iTXtparameters\0\0\0\0\0" + "猫 🐱".encode() in wide and b"tEXt" not in wide
    for data, text in ((latin, "café, naïve"), (wide, "猫 🐱")):
        with Image.open(io.BytesIO(data)) as im:
            assert im.info["parameters"] == text
        assert read_parameters(data) == text


def test_text_comes_before_the_image_data():
    data = encode_png(image(), "p")
    assert data.index(b"tEXt") < data.index(b"IDAT")


def test_file_objects(tmp_path):
    buffer = io.BytesIO()
    assert write_png(buffer, image(), "p") is None
    assert read_parameters(io.BytesIO(buffer.getvalue())) == "p"
    with open(tmp_path / "f.png", "wb") as f:
        assert write_png(f, image(), "q") == tmp_path / "f.png"
    assert read_parameters(str(tmp_path / "f.png")) == "q"


@pytest.mark.parametrize("zip_", [False, True])
def test_reads_what_pillow_writes(tmp_path, zip_):
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a, b: c\nSteps: 1", zip=zip_)
    info.add_itxt("other", "猫", zip=zip_)
    Image.fromarray(image()).save(tmp_path / "p.png", pnginfo=info)
    assert read_text_chunks(tmp_path / "p.png") == {"parameters": "a, b: c\nSteps: 1", "other": "猫"}


def test_no_parameters_is_none(tmp_path):
    Image.fromarray(image()).save(tmp_path / "plain.png")
    assert read_parameters(tmp_path / "plain.png") is None
    assert read_parameters(encode_png(image())) is None


def test_large_image_compresses(tmp_path):
    y, x = np.mgrid[0:512, 0:512]
    smooth = np.stack([x // 2, y // 2, (x + y) // 4], axis=-1).astype(np.uint8)
    data = encode_png(smooth, "p")
    assert len(data) < smooth.nbytes / 20
    with Image.open(io.BytesIO(data)) as im:
        assert np.array_equal(np.asarray(im), smooth)


# -- errors ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pixels", "message"),
    [
        (np.zeros((4, 4, 3), np.float32), "dtype float32, not uint8"),
        (np.zeros((1, 4, 4, 3), np.uint8), "shape"),
        (np.zeros((4, 4, 5), np.uint8), "shape"),
        (np.zeros((0, 4, 3), np.uint8), "shape"),
        (np.zeros(4, np.uint8), "shape"),
    ],
)
def test_bad_images(tmp_path, pixels, message):
    with pytest.raises(PngError, match=message) as info:
        write_png(tmp_path / "x.png", pixels, "p")
    assert isinstance(info.value, SdrtError) and "What to do" in str(info.value)
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("key", ["", "x" * 80, "a\0b", " lead", "猫"])
def test_bad_text_keys(key):
    with pytest.raises(PngError, match="key"):
        encode_png(image(), None, extra={key: "v"})


def test_unwritable_path(tmp_path):
    with pytest.raises(PngError, match="the output folder does not exist"):
        write_png(tmp_path / "no-such-folder" / "x.png", image(), "p")


def test_unreadable_inputs(tmp_path):
    with pytest.raises(PngError, match="cannot read the file"):
        read_parameters(tmp_path / "missing.png")
    (tmp_path / "x.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a png")
    with pytest.raises(PngError, match="not a PNG"):
        read_parameters(tmp_path / "x.jpg")
    data = encode_png(image(), "p")
    with pytest.raises(PngError, match="truncated"):
        read_parameters(data[: data.index(b"IDAT") + 10])


def test_broken_text_chunks_are_skipped():
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    sig = b"\x89PNG\r\n\x1a\n"
    broken = [chunk(b"zTXt", b"parameters\0\0not zlib"), chunk(b"iTXt", b"parameters\0\1\0\0\0junk"),
              chunk(b"iTXt", b"parameters\0\0"), chunk(b"tEXt", b"no separator")]
    data = sig + b"".join(broken) + chunk(b"tEXt", b"parameters\0ok") + chunk(b"IEND", b"")
    assert read_parameters(data) == "ok"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_corrupted_files_never_crash(data):
    png = bytearray(encode_png(image(8, 8), "a, b: c", extra={"k": "猫"}))
    for _ in range(data.draw(st.integers(1, 6))):
        png[data.draw(st.integers(0, len(png) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(png)))
    try:
        read_text_chunks(bytes(png[:cut]))
    except PngError:
        pass


def test_a_written_png_has_the_users_usual_file_mode(tmp_path):
    import os

    mask = os.umask(0o022)
    try:
        path = write_png(tmp_path / "out.png", np.zeros((8, 8, 3), np.uint8), "a cat")
    finally:
        os.umask(mask)
    assert (path.stat().st_mode & 0o777) == 0o644  # not mkstemp's private 0600


def test_text_chunks_are_inflated_within_one_budget() -> None:
    """Each zTXt chunk was inflated up to 16 MB with no bound on their sum (a 200 KB file read as 192 MB, a 32 MB
    one as ~30 GB): the text of one PNG is read up to 16 MB in all, a repeated key is not inflated again."""
    from sdrt.pipelines.png import PngError, encode_png, read_text_chunks

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    png = encode_png(np.zeros((8, 8, 3), np.uint8))
    bomb = zlib.compress(b"a" * (16 * 2**20), 9)
    many = b"".join(chunk(b"zTXt", f"k{i}".encode() + b"\0\0" + bomb) for i in range(3))
    with pytest.raises(PngError, match="over 16 MB of text"):
        read_text_chunks(png[:33] + many + png[33:])
    repeated = chunk(b"tEXt", b"parameters\0a cat") + chunk(b"zTXt", b"parameters\0\0" + bomb) * 3
    assert read_text_chunks(png[:33] + repeated + png[33:]) == {"parameters": "a cat"}
