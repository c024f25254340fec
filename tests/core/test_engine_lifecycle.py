"""What a model server hands its engine at the ends of its life, how an engine's decode loop ends,
and the engine arguments the vLLM engine builds (checked without vLLM installed)."""

from __future__ import annotations

import threading
import time
from unittest import mock

import pytest

from tandem.config import ModelConfig, TandemConfig
from tandem.engines.fake import FakeEngine, default_rule
from tandem.engines.vllm_engine import mm_limits
from tandem.local import LocalTandem
from tandem.schemas import AskRequest, GenerationRequest, SamplingParams


def test_vllm_profiles_the_vision_side_for_the_largest_image_tandem_sends():
    limits = mm_limits(ModelConfig(model="m", max_pixels=262144), max_images=4)
    assert limits == {"image": {"count": 4, "width": 512, "height": 512}, "video": 0}
    odd = mm_limits(ModelConfig(model="m", min_pixels=1024, max_pixels=100_000), max_images=0)["image"]
    assert odd["count"] == 1 and odd["width"] == odd["height"] == 288 and odd["width"] ** 2 <= 100_000


def test_a_stopping_model_server_shuts_its_engine_down_and_a_failure_does_not_stop_the_stop():
    from deployments.model_server import ModelServer

    server = object.__new__(ModelServer)
    server.engine, server.role = mock.Mock(), "large"
    server.__del__()
    server.engine.shutdown.assert_called_once_with()
    server.engine.shutdown.side_effect = RuntimeError("engine already gone")
    server.__del__()  # logged, not raised


def test_shutdown_ends_the_decode_thread_mid_request_and_fails_what_it_held():
    engine = FakeEngine("small", default_rule(500), step_s=0.01)
    got: list = []
    engine.loop.submit(GenerationRequest("long", [], SamplingParams(500), request_id="long"), got.append)
    deadline = time.monotonic() + 10
    while engine.loop.decoded.get("long", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.loop.decoded.get("long", 0) >= 2, "the row never started decoding"
    engine.shutdown()
    assert not engine.loop._thread.is_alive()
    assert len(got) >= 1 and isinstance(got[-1], RuntimeError) and "shut down" in str(got[-1])
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate([GenerationRequest("late", [], SamplingParams(4))])


def test_a_local_tandem_closed_after_its_answer_leaves_no_decode_thread_running():
    def decode_threads():
        return [t for t in threading.enumerate() if t.name.startswith("decode-")]

    before = set(decode_threads())
    config = TandemConfig(engine="fake")
    with LocalTandem(config) as tandem:
        assert tandem.ask(AskRequest(question="What is 2 + 2?", policy="mutual")).answer
        assert set(decode_threads()) - before, "the answer ran on no decode thread"
    assert not set(decode_threads()) - before
