"""The engine contract, declared once: what the Serve deployments and the in-process pipeline call on
an engine, and nothing else. `VisionEngine` encodes images with one model's own vision tower;
`GenerationEngine` streams or completes requests among whatever else it is decoding, and exposes its
run-time batching knobs, liveness and counters. `make_engine` checks every engine it builds against
these classes, and a conformance test drives each engine (fake, transformers, vLLM) through the same
cases. How an engine batches inside is its own business (`decoding.DecodeLoop` for the step engines,
vLLM's scheduler for vLLM)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import AsyncIterator

from tandem.schemas import GenerationOutput, GenerationRequest, ImageFeatures, TokenDelta


class VisionEngine(ABC):
    @abstractmethod
    def warm_up(self) -> None:
        """Run once before serving, so no client pays a cold start."""

    @abstractmethod
    def check_device(self) -> None:
        """Raise if the device this engine runs on no longer computes (the replica's health probe)."""

    @abstractmethod
    def encode_images(self, images: list[bytes]) -> list[ImageFeatures]:
        """Features of each image (bytes already validated), in order."""


@dataclass
class EngineStats:
    """What a model server reports of its engine: how many requests each admission (prefill) took
    together, most recent last, and how many requests were cancelled while decoding."""

    prefill_sizes: list[int] = field(default_factory=list)
    cancelled: int = 0
    prefix_cache: dict = field(default_factory=dict)  # bytes, entries, hits and hit rate, where kept


class GenerationEngine(ABC):
    @abstractmethod
    def warm_up(self) -> None:
        """Run once before serving, so no client pays a cold start."""

    @abstractmethod
    def check_device(self) -> None:
        """Raise if the device this engine runs on no longer computes (the replica's health probe)."""

    @abstractmethod
    def check_alive(self) -> None:
        """Raise if the engine can no longer take requests (its decoding thread or process is gone):
        cheap, called on every health probe."""

    @abstractmethod
    def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | GenerationOutput]:
        """Text deltas as decoded, then the output. The request decodes among whatever else the
        engine is running and finishes on its own; closing the iterator early stops its decoding.
        A request that can't run (prompt over the token limit, placeholders and features that
        differ) raises BadRequest here, alone: one bad request never fails the others."""

    @abstractmethod
    def generate(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        """Blocking: one output per request, in order. Requests may differ in sampling parameters."""

    @abstractmethod
    def configure(self, max_batch_size: int, batch_wait_s: float, *, adaptive_wait: bool = True,
                  prefix_cache_bytes: int = 0) -> None:
        """Run-time knobs (a model server's `user_config`): batching, and the bytes of prompt KV kept
        for a request's next stage. An engine that schedules its own batches and caches its own
        prefixes (vLLM) documents that it ignores them."""

    @abstractmethod
    def stats(self) -> EngineStats:
        """Counters since start (bounded: the most recent admissions only)."""

    def shutdown(self) -> None:
        """Release what the engine holds — its decode loop's thread, vLLM's engine processes and their
        GPU memory — when the replica stops or the process is about to exit. Nothing by default."""

    @abstractmethod
    def decoded_tokens(self, request_id: str) -> int:
        """Decoding steps run for a request id (every stage of it; 0 if unknown or forgotten)."""
