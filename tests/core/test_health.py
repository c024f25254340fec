"""Serve's health probe on the model deployments: a replica whose decode thread died or whose device
no longer computes reports unhealthy (Serve then replaces it); a working one passes."""

from __future__ import annotations

import threading

import pytest

from deployments.model_server import ModelServer
from deployments.vision_encoder import VisionEncoder
from tandem.config import TandemConfig
from tandem.schemas import GenerationRequest


class _Small(ModelServer):
    role = "small"


@pytest.fixture(scope="module")
def trained() -> ModelServer:
    return _Small(TandemConfig())  # the shipped trained pair's small model, on CPU


def _server(engine: str, trained=None) -> ModelServer:
    return _Small(TandemConfig(engine="fake")) if engine == "fake" else trained


@pytest.mark.parametrize("engine", ["fake", "transformers"])
async def test_a_working_model_server_is_healthy(engine, trained):
    server = _server(engine, trained)
    await server.check_health()
    out = await server.generate(GenerationRequest("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", []))
    # The model ran: it read the prompt and took a decode step. (What it says to "hi" is up to the
    # weights: the trained small model ends its turn at once, the fake engine answers.)
    assert out.prompt_tokens >= 1 and out.decode_steps >= 1
    await server.check_health()  # the loop's thread now runs, and is alive


async def test_a_dead_decode_thread_is_unhealthy():
    server = _server("fake")
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    server.engine.loop._thread = dead  # as if the loop's thread had died
    with pytest.raises(RuntimeError, match="decode loop's thread is gone"):
        await server.check_health()


async def test_a_device_that_fails_is_unhealthy(monkeypatch, trained):
    server = trained

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr("torch.ones", broken)  # what a lost CUDA context does to every op
    with pytest.raises(RuntimeError, match="illegal memory access"):
        await server.check_health()


async def test_the_vision_encoder_probes_each_tower(monkeypatch):
    encoder = VisionEncoder(TandemConfig())
    await encoder.check_health()
    probed = []
    for role, tower in encoder.towers.items():
        monkeypatch.setattr(tower, "check_device", lambda role=role: probed.append(role))
    await encoder.check_health()
    assert sorted(probed) == ["large", "small"]
