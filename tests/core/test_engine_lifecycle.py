"""What a model server hands its engine at the ends of its life, and the engine arguments the vLLM
engine builds (checked without vLLM installed)."""

from __future__ import annotations

from unittest import mock

from tandem.config import ModelConfig
from tandem.engines.vllm_engine import mm_limits


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
