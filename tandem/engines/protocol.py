"""The two roles an engine plays. Vision: encode images with one model's own vision tower.
Generation: complete a batch of prompts given precomputed image features. Nothing else."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tandem.schemas import GenerationOutput, GenerationRequest, ImageFeatures


@runtime_checkable
class VisionEngine(Protocol):
    def warm_up(self) -> None:
        """Run once before serving, so no client pays a cold start."""

    def encode_images(self, images: list[bytes], model: str) -> list[ImageFeatures]:
        """Features of each image (bytes already validated) for the named model, in order."""


@runtime_checkable
class GenerationEngine(Protocol):
    def warm_up(self) -> None:
        """Run once before serving, so no client pays a cold start."""

    def validate(self, request: GenerationRequest) -> None:
        """Raise BadRequest if this request can't run (prompt over the token limit, placeholders
        and features that differ): checked alone, so one bad request never fails a whole batch."""

    def generate(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        """One output per request, in order. Requests may differ in sampling parameters."""


class VisionEngines:
    """A VisionEngine over several models' towers, keyed by model name (role)."""

    def __init__(self, towers: dict):
        self.towers = towers

    def encode_images(self, images: list[bytes], model: str) -> list[ImageFeatures]:
        if model not in self.towers:
            raise KeyError(f"no vision tower for model '{model}'; have {sorted(self.towers)}")
        return self.towers[model].encode_images(images)
