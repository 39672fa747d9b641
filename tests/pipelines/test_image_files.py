"""Init image and mask files as A1111 reads them, in the Python API, ``sdrt generate`` and serve alike: EXIF
orientation applied, transparency flattened on white, 16-bit grey levels scaled to 8 bits, an RGBA mask with
transparency read from its alpha channel."""

from __future__ import annotations

import numpy as np
import pytest

from sdrt.pipelines.images import mask_gray, to_rgb
from sdrt.serve.b64images import mask_array, rgb_array

Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency (sdrt[images] extra)")


def test_a_16_bit_grey_png_keeps_its_levels(tmp_path) -> None:
    levels = np.arange(0, 65536, 16, dtype=np.uint16).reshape(64, 64)  # a ramp over the whole 16-bit range
    path = tmp_path / "ramp16.png"
    Image.fromarray(levels).save(path)
    want = np.rint(levels / 257).astype(np.uint8)
    with Image.open(path) as img:
        assert img.mode.startswith("I")
        np.testing.assert_array_equal(rgb_array(img), np.repeat(want[..., None], 3, -1))  # serve
        np.testing.assert_array_equal(mask_array(img), want)
    rgb = to_rgb(path)  # was 255 everywhere but the darkest 0.4%: Pillow clips I;16 at 255
    np.testing.assert_array_equal(rgb, np.repeat(want[..., None], 3, -1))
    np.testing.assert_array_equal(mask_gray(path), want)


def test_transparency_is_flattened_on_white_as_serve_and_a1111_do(tmp_path) -> None:
    rgba = np.zeros((16, 16, 4), np.uint8)
    rgba[:8, :, :] = (200, 10, 10, 255)  # opaque red above, fully transparent black below
    rgba[8:12, :, 3] = 128  # half-transparent black
    path = tmp_path / "cutout.png"
    Image.fromarray(rgba, "RGBA").save(path)
    with Image.open(path) as img:
        want = rgb_array(img)
    got = to_rgb(path)  # was black where transparent
    np.testing.assert_array_equal(got, want)
    assert tuple(got[0, 0]) == (200, 10, 10) and tuple(got[15, 0]) == (255, 255, 255)
    assert 126 <= got[9, 0, 0] <= 128
    np.testing.assert_array_equal(to_rgb(Image.fromarray(rgba, "RGBA")), want)


def test_an_exif_rotated_jpeg_is_read_as_viewers_show_it(tmp_path) -> None:
    pixels = np.zeros((40, 80, 3), np.uint8)
    pixels[:, :40] = 255  # stored 80x40, white on the left
    img = Image.fromarray(pixels)
    exif = img.getexif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to view
    path = tmp_path / "phone.jpg"
    img.save(path, exif=exif, quality=95)
    got = to_rgb(path)  # was 80x40, sideways
    assert got.shape == (80, 40, 3)
    assert got[:35].mean() > 200 and got[45:].mean() < 50  # the left half turned to the top
    assert mask_gray(path).shape == (80, 40)


def test_an_rgba_mask_with_transparency_is_its_alpha_and_an_opaque_one_its_grey(tmp_path) -> None:
    rgba = np.zeros((16, 16, 4), np.uint8)
    rgba[:, :8, 3] = 255  # black paint on the left, transparent on the right: repaint the left
    painted = tmp_path / "painted.png"
    Image.fromarray(rgba, "RGBA").save(painted)
    want = np.zeros((16, 16), np.uint8)
    want[:, :8] = 255
    np.testing.assert_array_equal(mask_gray(painted), want)  # was all black: nothing repainted
    opaque = np.zeros((16, 16, 4), np.uint8)
    opaque[..., 3] = 255
    opaque[:, 8:, :3] = 255  # a black-and-white mask saved as RGBA: its grey levels
    want = np.zeros((16, 16), np.uint8)
    want[:, 8:] = 255
    img = Image.fromarray(opaque, "RGBA")
    np.testing.assert_array_equal(mask_gray(img), want)
    np.testing.assert_array_equal(mask_array(img), want)  # serve repainted all of it (its alpha)


def test_an_rgba_array_is_read_as_the_same_picture_as_a_pillow_image() -> None:
    rgba = np.zeros((4, 64, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = np.arange(0, 256, 4, dtype=np.uint8)  # every level of transparency
    from_array = to_rgb(rgba)  # dropped the alpha: the colour under it, black where transparent
    from_pillow = to_rgb(Image.fromarray(rgba, "RGBA"))
    assert np.abs(from_array.astype(int) - from_pillow).max() <= 1
    assert tuple(from_array[0, 0]) == (255, 255, 255)


def test_serve_reads_an_exif_rotated_jpeg_upright_as_a1111s_api_does(tmp_path) -> None:
    """A1111's decode_base64_to_image reads with images.read, whose fix_image applies the EXIF orientation."""
    import io

    from sdrt.serve.b64images import open_image

    img = Image.new("RGB", (80, 40), (255, 255, 255))
    exif = img.getexif()
    exif[0x0112] = 8  # rotate 90 degrees counter-clockwise to view
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif)
    assert open_image(buf.getvalue(), "init_images[0]", 10**6).size == (40, 80)  # was 80x40


def test_a_32_bit_integer_picture_of_8_bit_levels_keeps_them_and_of_16_bit_levels_is_scaled() -> None:
    eight = np.arange(256, dtype=np.int32).reshape(16, 16)
    assert Image.fromarray(eight).mode == "I"
    np.testing.assert_array_equal(to_rgb(Image.fromarray(eight))[..., 0], eight.astype(np.uint8))
    sixteen = eight * 257
    np.testing.assert_array_equal(to_rgb(Image.fromarray(sixteen))[..., 0], eight.astype(np.uint8))


def test_a_float_grey_tiff_of_unit_levels_is_read_in_0_to_255(tmp_path) -> None:
    path = tmp_path / "grey.tiff"
    Image.fromarray(np.full((16, 16), 0.5, np.float32), "F").save(path)
    assert tuple(to_rgb(path)[0, 0]) == (128, 128, 128)  # was black: Pillow's convert truncates 0.5 to 0
    assert mask_gray(path)[0, 0] == 128


def _png_header_only(path, width: int, height: int) -> None:
    """A PNG whose header says ``width x height`` and whose pixel data stops at once (a decompression-bomb-like
    file: a few bytes that claim a huge picture)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 10))
                     + chunk(b"IEND", b""))


def test_an_unreadable_picture_is_refused_by_validate_before_any_model_loads(tmp_path) -> None:
    """A 0-byte, a truncated and a huge-header file were found only once the model had loaded (the file's
    existence was all ``validate`` checked); a truncated one was told to "use a PNG or JPEG file" it was."""
    import warnings

    from sdrt import pipelines
    from sdrt.errors import InputError

    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    whole = tmp_path / "whole.png"
    Image.fromarray(np.full((64, 64, 3), 200, np.uint8)).save(whole)
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole.read_bytes()[:60])
    huge = tmp_path / "huge.png"
    _png_header_only(huge, 100_000, 100_000)
    big = tmp_path / "big.png"
    _png_header_only(big, 12_000, 12_000)  # 144 million pixels: Pillow's warning, then the missing data
    cases = [(empty, "init_image", "cannot identify image file", "use a PNG or JPEG file"),
             (cut, "init_image", "truncated", "the file is incomplete: save or download it again"),
             (huge, "init_image", "too large to read", "use a smaller picture"),
             (big, "init_image", "truncated", "the file is incomplete"),
             (cut, "mask", "truncated", "the file is incomplete")]
    for path, arg, what, fix in cases:
        kwargs = {"init_image": whole, "mask": path} if arg == "mask" else {"init_image": path}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Pillow's DecompressionBombWarning was two more lines on stderr
            with pytest.raises(InputError, match=what) as err:
                pipelines.validate("a cat", **kwargs)
        assert fix in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_serve_refuses_a_huge_header_in_one_line_and_no_pillow_warning(tmp_path) -> None:
    """A 10000x10000 header (100 million pixels) logged Pillow's DecompressionBombWarning, two lines in the server's
    log, before the server's own pixel limit refused it."""
    import warnings

    from sdrt.serve.b64images import open_image
    from sdrt.serve.errors import ApiError

    path = tmp_path / "big.png"
    _png_header_only(path, 10_000, 10_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ApiError, match=r"init_images\[0\] is 10000x10000, above this server's limit"):
            open_image(path.read_bytes(), "init_images[0]", 2048 * 2048 * 4)
