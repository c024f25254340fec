"""Decoding client image bytes into RGB images, safely: format allow-list, byte and pixel limits
checked before the pixels are decoded (decompression bombs never expand), truncation detected."""

from __future__ import annotations

import hashlib
import io
import warnings

from PIL import Image

from tandem.errors import BadRequest, PayloadTooLarge

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def decode_image(data: bytes, *, max_bytes: int = 10 * 2**20, max_pixels: int = 4096 * 4096) -> Image.Image:
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"image is {len(data)} bytes; the limit is {max_bytes}")
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
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise PayloadTooLarge(f"image rejected as a decompression bomb: {err}") from None
    except Exception as err:  # PIL raises many types for corrupt input; all mean the same to a client
        raise BadRequest(f"image could not be decoded: {type(err).__name__}: {err}") from None
    if width < 1 or height < 1:
        raise BadRequest("image has no pixels")
    return img.convert("RGB")


def image_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
