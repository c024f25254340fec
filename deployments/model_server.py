"""What the two model servers share: an engine behind `@serve.batch`, with the batch size and wait
tunable at run time through `user_config` (Serve calls `reconfigure`; replicas are not restarted)."""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel, ConfigDict, Field
import ray
from ray import serve

from tandem.config import TandemConfig
from tandem.engines import make_engine
from tandem.schemas import GenerationOutput, GenerationRequest


class BatchingConfig(BaseModel):
    """A model server's `user_config`."""

    model_config = ConfigDict(extra="forbid")
    max_batch_size: int = Field(8, gt=0, description="Most requests generated together.")
    batch_wait_timeout_s: float = Field(0.01, ge=0, description="How long a batch waits to fill.")


class ModelServer:
    role = ""

    def __init__(self, config: TandemConfig):
        self.engine = make_engine(config, self.role, vision=False)
        self.engine.warm_up()
        self.batch_sizes: list[int] = []
        self.cancelled = 0
        self.batching = BatchingConfig()

    def reconfigure(self, user_config: dict) -> None:
        self.batching = BatchingConfig.model_validate(user_config or {})
        self._generate_batch.set_max_batch_size(self.batching.max_batch_size)
        self._generate_batch.set_batch_wait_timeout_s(self.batching.batch_wait_timeout_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        self.batch_sizes.append(len(requests))
        # Generation blocks; a worker thread keeps this replica's event loop free to queue the next batch.
        return await asyncio.to_thread(self.engine.generate, requests)

    async def generate(self, request: GenerationRequest) -> GenerationOutput:
        """`request.images` may hold ObjectRefs from the VisionEncoder; they are fetched here, from
        the object store, so features never pass through the router."""
        try:
            if any(isinstance(f, ray.ObjectRef) for f in request.images):
                request.images = list(await asyncio.gather(*request.images))
            self.engine.validate(request)
            return await self._generate_batch(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def stats(self) -> dict:
        return {"role": self.role, "pid": os.getpid(), "batch_sizes": list(self.batch_sizes),
                "cancelled": self.cancelled, **self.batching.model_dump()}
