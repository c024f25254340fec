"""Shared test set-up: offline Hugging Face, one tiny-checkpoint cache for the whole run, and small
PNG images made in memory."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TANDEM_CACHE", str(Path(__file__).resolve().parent.parent / ".tandem-cache"))


def make_png(seed: int = 0, width: int = 64, height: int = 48) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="session")
def png():
    return make_png


def pytest_collection_modifyitems(items):
    """Every test that starts Ray and Serve takes more than 10 s with its cluster: `slow` too, so
    `-m "not slow"` is the quick run."""
    for item in items:
        if item.get_closest_marker("serve"):
            item.add_marker(pytest.mark.slow)
