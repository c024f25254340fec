"""The two roles an engine plays. Vision: encode images with one model's own vision tower.
Generation: stream one request's text as it is decoded (the streaming engine interface every
generation engine implements), or complete a batch. Nothing else."""

from __future__ import annotations

from typing import AsyncIterator, Protocol, runtime_checkable

from tandem.schemas import GenerationOutput, GenerationRequest, ImageFeatures, TokenDelta


@runtime_checkable
class VisionEngine(Protocol):
    def warm_up(self) -> None:
        """Run once before serving, so no client pays a cold start."""

    def check_device(self) -> None:
        """Raise if the device this engine runs on no longer computes (the replica's health probe)."""

    def encode_images(self, images: list[bytes], model: str) -> list[ImageFeatures]:
        """Features of each image (bytes already validated) for the named model, in order."""


@runtime_checkable
class GenerationEngine(Protocol):
    def warm_up(self) -> None:
        """Run once before serving, so no client pays a cold start."""

    def check_device(self) -> None:
        """Raise if the device this engine runs on no longer computes (the replica's health probe)."""

    def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | GenerationOutput]:
        """Text deltas as decoded, then the output. The request decodes among whatever else the
        engine is running and finishes on its own; closing the iterator early stops its decoding.
        A request that can't run (prompt over the token limit, placeholders and features that
        differ) raises BadRequest here, alone: one bad request never fails the others."""

    def generate(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        """Blocking: one output per request, in order. Requests may differ in sampling parameters."""


class VisionEngines:
    """A VisionEngine over several models' towers, keyed by model name (role)."""

    def __init__(self, towers: dict):
        self.towers = towers

    def encode_images(self, images: list[bytes], model: str) -> list[ImageFeatures]:
        if model not in self.towers:
            raise KeyError(f"no vision tower for model '{model}'; have {sorted(self.towers)}")
        return self.towers[model].encode_images(images)
