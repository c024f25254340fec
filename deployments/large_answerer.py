"""LargeAnswerer: the large model's decoder (e.g. Qwen3-VL 8B Instruct), on its own pool."""

from deployments.model_server import ModelServer


class LargeAnswerer(ModelServer):
    role = "large"
