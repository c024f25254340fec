"""Engines: what runs a model. `protocol` declares the contract every engine honours; `transformers_engine` runs
Hugging Face checkpoints; `fake` honours the protocol without a model, for orchestration tests.
`vllm_engine` runs a decoder on vLLM (an extra). `make_engine` is the one place that picks an engine
for a role from the config: on `engine: vllm` the vision towers still run on transformers."""

from __future__ import annotations

ROLES = ("small", "large")


def make_engine(config, role: str, *, vision: bool = True, language: bool = True):
    """The configured engine for `role` (small or large), loading only the parts asked for: a vision
    encoder needs no decoder, a model server no vision tower. Checked against the contract
    (`protocol`) for the parts asked for, so a missing method fails at build time, not mid-request."""
    engine = _build_engine(config, role, vision=vision, language=language)
    from tandem.engines.protocol import GenerationEngine, VisionEngine

    for wanted, cls in ((vision, VisionEngine), (language, GenerationEngine)):
        if wanted and not isinstance(engine, cls):
            raise TypeError(f"engine {type(engine).__name__} for '{role}' is not a {cls.__name__}")
    return engine


def _build_engine(config, role: str, *, vision: bool, language: bool):
    limit = config.limits.max_prompt_tokens
    if config.engine == "fake":
        from tandem.engines.fake import FakeEngine, default_rule
        fake = config.fake
        answer = fake.small_answer if role == "small" else "A"
        return FakeEngine(role, default_rule(fake.answer_words, fake.reasoning_words, answer), step_s=fake.step_s,
                          max_prompt_tokens=limit)
    if config.engine == "paced":
        import json
        from pathlib import Path

        from tandem.engines.paced import PacedEngine
        if not config.paced.profile:
            raise ValueError("engine 'paced' needs paced.profile: a stage profile's JSON file")
        profile = json.loads(Path(config.paced.profile).read_text())
        return PacedEngine(role, profile, config.paced.transfer_rate, max_prompt_tokens=limit)
    if config.engine == "vllm" and language:
        if vision:
            raise ValueError("engine 'vllm' runs decoders only: the VisionEncoder encodes with transformers")
        from tandem.engines.vllm_engine import VllmEngine
        return VllmEngine(config.model(role), name=role, max_prompt_tokens=limit, max_images=config.http.max_images)
    from tandem.engines.transformers_engine import TransformersEngine
    return TransformersEngine(config.model(role), name=role, vision=vision, language=language,
                              max_prompt_tokens=limit)
