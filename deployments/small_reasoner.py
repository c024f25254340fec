"""SmallReasoner: the small model's decoder (e.g. Qwen3-VL 2B Thinking), on its own pool."""

from deployments.model_server import ModelServer


class SmallReasoner(ModelServer):
    role = "small"
