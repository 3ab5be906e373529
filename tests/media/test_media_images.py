"""MediaLoader on images from data: URLs and local files: decoding, limits, cache keys."""

from __future__ import annotations

import base64
import io
import os

import pytest
from media_helpers import data_url, image, image_bytes, loader, prompt
from PIL import Image

from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.http.model_names import ServedNames
from vllm_mlx_trio.http.openai.requests import parse_chat
from vllm_mlx_trio.media.images import fitted_size
from vllm_mlx_trio.messages import ImagePart

FIRST = "messages[1].content[1]"


def refused(load, *args) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        load(*args)
    return caught.value


def test_a_base64_png_loads_as_rgb_with_its_place_and_a_pixel_key():
    loaded = loader().load_prompt_media(prompt(image(data_url(image_bytes((8, 6))))))
    assert len(loaded) == 1
    assert loaded[0].where == FIRST
    assert loaded[0].image.mode == "RGB" and loaded[0].image.size == (8, 6)
    assert loaded[0].image.getpixel((0, 0)) == (200, 30, 40)
    assert len(loaded[0].cache_key) == 64


def test_media_comes_back_in_prompt_order_with_each_place():
    red, blue = data_url(image_bytes(color=(255, 0, 0))), data_url(image_bytes(color=(0, 0, 255)))
    loaded = loader().load_prompt_media(prompt(image(red), image(blue)))
    assert [m.where for m in loaded] == [FIRST, "messages[1].content[2]"]
    assert [m.image.getpixel((0, 0)) for m in loaded] == [(255, 0, 0), (0, 0, 255)]


def test_the_key_is_the_pixels_not_the_encoding():
    """The same pixels as PNG and as BMP share a key; other pixels do not."""
    png = loader().load_prompt_media(prompt(image(data_url(image_bytes(fmt="PNG")))))[0]
    bmp = loader().load_prompt_media(prompt(image(data_url(image_bytes(fmt="BMP"), "image/bmp"))))[0]
    other = loader().load_prompt_media(prompt(image(data_url(image_bytes(color=(1, 2, 3))))))[0]
    assert png.cache_key == bmp.cache_key != other.cache_key


def test_the_key_changes_with_max_image_pixels():
    """A different pixel limit may give the model different tokens: a different key."""
    ref = data_url(image_bytes((8, 6)))
    small = loader(max_image_pixels=48).load_prompt_media(prompt(image(ref)))[0]
    large = loader(max_image_pixels=1000).load_prompt_media(prompt(image(ref)))[0]
    assert small.image.size == large.image.size == (8, 6)
    assert small.cache_key != large.cache_key


@pytest.mark.parametrize(
    "ref, words",
    [
        ("data:image/png;base64,!!notbase64!!", "not valid base64"),
        ("data:image/png;base64,aGVsbG8", "not valid base64"),  # padding missing
        ("data:image/png;base64,aGVs bG8=", "not valid base64"),  # whitespace inside
        ("data:image/png," + "abcd", "data:image/<type>;base64"),
        ("data:text/plain;base64,aGVsbG8=", "which is not image/*"),
        ("data:image/png;base64,", "holds no image"),
    ],
)
def test_bad_data_urls_are_400s_naming_the_part(ref, words):
    error = refused(loader().load_prompt_media, prompt(image(ref)))
    assert error.param == FIRST and error.message.startswith(FIRST)
    assert words in error.message


def test_a_text_file_posing_as_an_image_is_refused():
    error = refused(loader().load_prompt_media, prompt(image(data_url(b"just some text\n" * 10))))
    assert error.param == FIRST and "not a valid image" in error.message


def test_a_truncated_png_is_refused():
    error = refused(loader().load_prompt_media, prompt(image(data_url(image_bytes((64, 64))[:60]))))
    assert "not a valid image" in error.message


def test_a_png_declared_as_jpeg_is_decoded_by_its_content():
    """Documented choice: the declared type must be an image type; the bytes decide the format."""
    loaded = loader().load_prompt_media(prompt(image(data_url(image_bytes(), "image/jpeg"))))
    assert loaded[0].image.getpixel((0, 0)) == (200, 30, 40)


def test_an_svg_or_other_unsupported_format_is_refused():
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>'
    error = refused(loader().load_prompt_media, prompt(image(data_url(svg, "image/svg+xml"))))
    assert "not a valid image" in error.message
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "TIFF")
    tiff = data_url(buffer.getvalue(), "image/tiff")
    assert "not a valid image" in refused(loader().load_prompt_media, prompt(image(tiff))).message


def test_oversize_bytes_are_refused_before_decoding():
    data = image_bytes((64, 64))
    error = refused(loader(max_image_bytes=len(data) - 1).load_prompt_media, prompt(image(data_url(data))))
    assert "limit" in error.message and error.param == FIRST
    assert loader(max_image_bytes=len(data)).load_prompt_media(prompt(image(data_url(data))))


def test_oversize_pixels_are_scaled_down_with_the_aspect_kept():
    loaded = loader(max_image_pixels=50 * 50).load_prompt_media(prompt(image(data_url(image_bytes((400, 100))))))
    width, height = loaded[0].image.size
    assert width * height <= 50 * 50
    assert (width, height) == (100, 25)


def test_a_decompression_bomb_is_refused_by_its_header():
    """A 4000x4000 PNG of one colour is small in bytes: refused by its declared pixels."""
    bomb = image_bytes((4000, 4000), color=(0, 0, 0))
    assert len(bomb) < 100_000
    error = refused(loader(max_decoded_pixels=1_000_000).load_prompt_media, prompt(image(data_url(bomb))))
    assert "4000x4000" in error.message


def test_exif_orientation_is_applied():
    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.new("RGB", (20, 10), (9, 9, 9)).save(buffer, "JPEG", exif=exif)
    loaded = loader().load_prompt_media(prompt(image(data_url(buffer.getvalue(), "image/jpeg"))))
    assert loaded[0].image.size == (10, 20)


def test_rgba_and_palette_images_come_back_rgb():
    for mode in ("RGBA", "P", "L"):
        buffer = io.BytesIO()
        Image.new(mode, (4, 4)).save(buffer, "PNG")
        assert loader().load_prompt_media(prompt(image(data_url(buffer.getvalue()))))[0].image.mode == "RGB"


def test_too_many_images_names_the_first_part_over_the_limit():
    ref = data_url(image_bytes())
    error = refused(loader(max_images_per_request=2).load_prompt_media, prompt(image(ref), image(ref), image(ref)))
    assert error.param == "messages[1].content[3]"
    assert len(loader(max_images_per_request=3).load_prompt_media(prompt(image(ref), image(ref), image(ref)))) == 3


def test_no_media_gives_nothing():
    assert loader().load_prompt_media(prompt()) == ()


def test_unsupported_sources_are_refused():
    for ref in ("ftp://example.com/a.png", "relative/a.png", "gopher://x", "javascript:alert(1)"):
        error = refused(loader().load_prompt_media, prompt(image(ref)))
        assert "unsupported image source" in error.message and error.param == FIRST


def test_url_fetch_can_be_turned_off():
    error = refused(loader(allow_url_fetch=False).load_prompt_media, prompt(image("https://example.com/a.png")))
    assert "allow_url_fetch" in error.message


# -- local files --------------------------------------------------------------------------


@pytest.fixture
def media_dir(tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "a.png").write_bytes(image_bytes())
    (tmp_path / "secret.png").write_bytes(image_bytes(color=(1, 1, 1)))
    return allowed


def test_a_file_inside_an_allowed_dir_loads(media_dir):
    load = loader(allowed_local_dirs=[str(media_dir)]).load_prompt_media
    assert load(prompt(image(str(media_dir / "a.png"))))[0].image.getpixel((0, 0)) == (200, 30, 40)
    assert load(prompt(image(f"file://{media_dir / 'a.png'}")))[0].image.size == (8, 6)


def test_local_paths_are_refused_without_allowed_dirs(media_dir):
    error = refused(loader().load_prompt_media, prompt(image(str(media_dir / "a.png"))))
    assert "allowed_local_dirs" in error.message


def test_a_path_outside_the_allowed_dirs_is_refused(media_dir):
    load = loader(allowed_local_dirs=[str(media_dir)]).load_prompt_media
    for path in (str(media_dir.parent / "secret.png"), f"{media_dir}/../secret.png", "/etc/passwd"):
        assert "outside the allowed directories" in refused(load, prompt(image(path))).message
    sibling = media_dir.parent / "allowed-not"  # a prefix of the name is not inside
    sibling.mkdir()
    (sibling / "b.png").write_bytes(image_bytes())
    assert "outside" in refused(load, prompt(image(str(sibling / "b.png")))).message


def test_a_symlink_out_of_the_allowed_dir_is_refused(media_dir):
    os.symlink(media_dir.parent / "secret.png", media_dir / "link.png")
    os.symlink(media_dir.parent, media_dir / "up")
    load = loader(allowed_local_dirs=[str(media_dir)]).load_prompt_media
    assert "outside" in refused(load, prompt(image(str(media_dir / "link.png")))).message
    assert "outside" in refused(load, prompt(image(str(media_dir / "up" / "secret.png")))).message


def test_a_fifo_or_directory_is_refused_without_blocking(media_dir):
    os.mkfifo(media_dir / "pipe.png")
    load = loader(allowed_local_dirs=[str(media_dir)]).load_prompt_media
    assert "not a regular file" in refused(load, prompt(image(str(media_dir / "pipe.png")))).message
    assert "not a regular file" in refused(load, prompt(image(str(media_dir)))).message


def test_an_oversize_local_file_is_refused(media_dir):
    size = (media_dir / "a.png").stat().st_size
    error = refused(
        loader(allowed_local_dirs=[str(media_dir)], max_image_bytes=size - 1).load_prompt_media,
        prompt(image(str(media_dir / "a.png"))),
    )
    assert "limit" in error.message


def test_a_missing_local_file_is_a_400(media_dir):
    load = loader(allowed_local_dirs=[str(media_dir)]).load_prompt_media
    assert "cannot be opened" in refused(load, prompt(image(str(media_dir / "nope.png")))).message


def test_preprocessing_seconds_are_reported():
    loaded = loader().load_prompt_media(prompt(image(data_url(image_bytes()))))
    assert loaded[0].seconds > 0


def test_base64_module_matches_what_clients_send():
    """A client's standard base64 (with padding) is what the strict decoder accepts."""
    data = image_bytes((3, 3))
    ref = "data:image/png;base64," + base64.standard_b64encode(data).decode("ascii")
    assert loader().load_prompt_media(prompt(image(ref)))[0].image.size == (3, 3)


def test_a_large_jpeg_comes_out_at_the_fitted_size():
    """Decoded at a reduced DCT scale first (draft), then scaled to exactly the fitted size."""
    data = image_bytes((4000, 3000), fmt="JPEG")
    for max_pixels in (1000 * 750, 700 * 525, 3999 * 2999):
        loaded = loader(max_image_pixels=max_pixels).load_prompt_media(prompt(image(data_url(data, "image/jpeg"))))
        assert loaded[0].image.size == fitted_size(4000, 3000, max_pixels)
        assert loaded[0].image.getpixel((10, 10)) == pytest.approx((200, 30, 40), abs=3)


def test_detail_low_caps_the_image_at_512x512_pixels_and_keys_it_apart():
    ref = data_url(image_bytes((1000, 800)))
    low = loader().load_prompt_media(prompt(ImagePart(ref=ref, content_hash="", detail="low")))[0]
    auto = loader().load_prompt_media(prompt(ImagePart(ref=ref, content_hash="", detail="auto")))[0]
    assert low.image.size == fitted_size(1000, 800, 512 * 512) and auto.image.size == (1000, 800)
    assert low.cache_key != auto.cache_key


def test_detail_reaches_the_image_part_from_a_chat_body():
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": data_url(image_bytes()), "detail": "low"}}],
            }
        ],
    }
    (part,) = parse_chat(body, model_names=ServedNames(("m",)), max_n=1).prompt.messages[0].content
    assert isinstance(part, ImagePart) and part.detail == "low"
