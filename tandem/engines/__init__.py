"""Engines: what runs a model. `protocol` says what every engine does; `transformers_engine` runs
Hugging Face checkpoints; `fake` honours the protocol without a model, for orchestration tests."""
