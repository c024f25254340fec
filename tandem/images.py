"""Decoding client image bytes into RGB images, safely: format allow-list, byte and pixel limits
checked before the pixels are decoded (decompression bombs never expand), truncation detected."""

from __future__ import annotations

import hashlib
import io
import math
import warnings

from PIL import Image

from tandem.errors import BadRequest, PayloadTooLarge

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def decode_image(data: bytes, *, max_bytes: int = 10 * 2**20, max_pixels: int = 4096 * 4096,
                 max_jpeg_scans: int = 32) -> Image.Image:
    """The image as RGB, or a 4xx in our own words (a library's message can carry paths or reprs):
    size, pixel count and a JPEG's scans are checked before any pixel is decoded."""
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"image is {len(data)} bytes; the limit is {max_bytes}")
    if data[:2] == b"\xff\xd8" and jpeg_scans(data) > max_jpeg_scans:
        # Each scan of a progressive JPEG is a pass over the whole image: thousands of them in a small
        # file cost seconds of CPU per decode.
        raise BadRequest(f"JPEG image has more than {max_jpeg_scans} scans")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
            width, height = img.size
            if width * height > max_pixels:
                raise PayloadTooLarge(f"image is {width}x{height} pixels; the limit is {max_pixels} pixels")
            img.load()
    except PayloadTooLarge:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise PayloadTooLarge(f"image is over {max_pixels} pixels (refused as a decompression bomb)") from None
    except Exception:  # PIL raises many types for corrupt input; all mean the same to a client
        raise BadRequest(f"image could not be decoded (formats accepted: {', '.join(ALLOWED_FORMATS)})") from None
    if width < 1 or height < 1:
        raise BadRequest("image has no pixels")
    return img.convert("RGB")


def jpeg_scans(data: bytes) -> int:
    """Start-of-scan markers in a JPEG file. Inside entropy-coded data a 0xFF byte is always followed
    by 0x00 or a restart marker, so every 0xFFDA is a real marker (or one in an embedded thumbnail,
    which only counts against the image)."""
    return data.count(b"\xff\xda")


# Qwen3-VL's processor (Qwen2-VL's `smart_resize`) rounds each side to a multiple of 32 pixels (16-px
# patches merged 2 x 2) and refuses a side over 200 times the other.
RESIZE_FACTOR = 32
MAX_ASPECT_RATIO = 200


def resized_size(width: int, height: int, min_pixels: int, max_pixels: int,
                 factor: int = RESIZE_FACTOR) -> tuple[int, int]:
    """(width, height) the processor resizes an image to: `smart_resize`'s arithmetic, here so the
    ingress can check an image against it without loading a processor."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def check_resizable(width: int, height: int, bounds: list[tuple[int, int]]) -> None:
    """Refuse, before any model work, an image a model's processor would refuse or resize past its
    pixel budget: each (min_pixels, max_pixels) in `bounds` is one model's."""
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT_RATIO:
        raise BadRequest(f"image is {width}x{height}: one side is over {MAX_ASPECT_RATIO} times the other")
    for min_pixels, max_pixels in bounds:
        w, h = resized_size(width, height, min_pixels, max_pixels)
        if w * h > max_pixels:
            raise BadRequest(f"image is {width}x{height}: too elongated to fit the model's budget of "
                             f"{max_pixels} pixels (it would be resized to {w}x{h})")


def image_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
