"""The pipeline in one process: engines behind the three stages, called in worker threads.

What `tandem ask` and in-process benchmarks run; each stage streams from its engine's decode loop,
so a cancelled stage stops decoding there too. Under Serve, `deployments/` replaces these stages
with deployment handles; the pipeline is the same.
"""

from __future__ import annotations

import asyncio

from tandem.config import TandemConfig
from tandem.engines import ROLES, make_engine
from tandem.engines.decoding import collect
from tandem.pipeline import Pipeline, Stages
from tandem.schemas import AskRequest, TandemResult


class SplitEngine:
    """A role's vision tower and decoder on two engines (vLLM runs decoders only): encode_images goes
    to the first, everything else to the second."""

    def __init__(self, vision, decoder):
        self.vision, self.decoder = vision, decoder

    def encode_images(self, images):
        return self.vision.encode_images(images)

    def shutdown(self) -> None:
        self.vision.shutdown()
        self.decoder.shutdown()

    def __getattr__(self, name):
        return getattr(self.decoder, name)


def load_engines(config: TandemConfig) -> dict:
    """One engine per role, serving both its vision tower and its decoder; one load per checkpoint
    (on `engine: vllm`, the tower on transformers and the decoder on vLLM)."""
    if config.engine == "vllm":
        return {role: SplitEngine(make_engine(config, role, language=False), make_engine(config, role, vision=False))
                for role in ROLES}
    return {role: make_engine(config, role) for role in ROLES}


def local_stages(engines: dict) -> Stages:
    async def encode(images, role):
        return await asyncio.to_thread(engines[role].encode_images, images)

    def generate_with(engine):
        async def generate(request, sink=None):
            return await collect(engine.stream(request), sink)  # closing the stream cancels the row
        return generate

    return Stages(encode=encode, small=generate_with(engines["small"]), large=generate_with(engines["large"]))


class LocalTandem:
    """The pipeline over in-process engines; `close()` (or `with`) ends their decode threads before the
    process exits, which a thread still mid-step would otherwise abort."""

    def __init__(self, config: TandemConfig, engines: dict | None = None):
        self.engines = engines or load_engines(config)
        self.pipeline = Pipeline(config, local_stages(self.engines))

    def close(self) -> None:
        for engine in self.engines.values():
            engine.shutdown()

    def __enter__(self) -> LocalTandem:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ask(self, request: AskRequest) -> TandemResult:
        return asyncio.run(self.pipeline.answer(request))
