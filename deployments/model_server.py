"""What the two model servers share: an engine whose decode loop batches every request this replica
holds (requests join and leave the running batch between steps), with the batch size and the idle
wait tunable at run time through `user_config` (Serve calls `reconfigure`; replicas are not
restarted). `generate` answers whole; `stream` yields text deltas as they are decoded, then the
output (call it with `handle.options(stream=True)`). Either way, a caller that goes away — a client
disconnecting, a stage deadline, mutual's speculative reasoning cancelled on agreement — takes its
row out of the batch at the next step."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import AsyncIterator, Literal

from pydantic import BaseModel, ConfigDict, Field
import ray
from ray.serve.metrics import Gauge

from tandem.config import TandemConfig
from tandem.engines import make_engine
from tandem.engines.decoding import collect
from tandem.errors import FeaturesLost
from tandem.schemas import GenerationOutput, GenerationRequest, TokenDelta

logger = logging.getLogger(__name__)


class BatchingConfig(BaseModel):
    """A model server's `user_config`."""

    model_config = ConfigDict(extra="forbid")
    max_batch_size: int = Field(8, gt=0, description="Most requests decoded together.")
    batch_wait_timeout_s: float = Field(0.01, ge=0, description="How long an idle server may wait for a batch to fill.")
    batch_wait_mode: Literal["adaptive", "always"] = Field(
        "adaptive", description="adaptive: an idle server waits only while requests arrive closer together than "
                                "the wait (a lone request starts at once); always: it always waits.")
    prefix_cache_bytes: int = Field(64 * 2**20, ge=0, description="Prompt KV kept for a request's next stage on "
                                                                  "this model (0: off; vLLM keeps its own).")


class ModelServer:
    role = ""

    def __init__(self, config: TandemConfig):
        self.engine = make_engine(config, self.role, vision=False)
        self.engine.warm_up()
        self.batching = BatchingConfig()
        self.replica = _replica_name()
        self.prefix_bytes = Gauge("tandem_prefix_cache_bytes", "Bytes of prompt KV kept for requests' next stages.",
                                  ("role",))
        self.prefix_hit_rate = Gauge("tandem_prefix_cache_hit_rate", "Share of follow-up stages that reused their "
                                     "request's kept prompt head.", ("role",))
        self.reconfigure({})

    def __del__(self):
        """Serve calls this as it stops the replica (after its drain): vLLM's engine processes go with it."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # stopping anyway: a failed shutdown must not keep the replica
                logger.exception("%s: engine shutdown failed", self.role)

    def reconfigure(self, user_config: dict) -> None:
        self.batching = BatchingConfig.model_validate(user_config or {})
        b = self.batching
        self.engine.configure(b.max_batch_size, b.batch_wait_timeout_s, adaptive_wait=b.batch_wait_mode == "adaptive",
                              prefix_cache_bytes=b.prefix_cache_bytes)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | GenerationOutput]:
        """`request.images` may hold ObjectRefs from the VisionEncoder; they are fetched here, from
        the object store, so features never pass through the router."""
        if any(isinstance(f, ray.ObjectRef) for f in request.images):
            try:
                request.images = list(await asyncio.gather(*request.images))
            except ray.exceptions.ObjectLostError as err:  # OwnerDiedError among them: the encoder is gone
                raise FeaturesLost(f"image features for model '{self.role}' are lost ({type(err).__name__}); "
                                   "their VisionEncoder replica is gone") from None
        events = self.engine.stream(request)
        try:
            async for event in events:
                if isinstance(event, GenerationOutput):
                    event.replica = self.replica
                yield event
        finally:  # cancelled or closed early: the row leaves the batch
            await events.aclose()
            self._report_prefix_cache()

    def _report_prefix_cache(self) -> None:
        cache = self.engine.stats().prefix_cache
        if cache:
            tags = {"role": self.role}
            self.prefix_bytes.set(cache["prefix_cache_bytes"], tags=tags)
            if cache["prefix_cache_hit_rate"] is not None:
                self.prefix_hit_rate.set(cache["prefix_cache_hit_rate"], tags=tags)

    async def generate(self, request: GenerationRequest) -> GenerationOutput:
        return await collect(self.stream(request))

    async def check_health(self) -> None:
        """Serve's periodic probe (raising restarts the replica): the decode loop's thread is alive and
        the device still computes. Off the event loop: on a GPU the probe waits behind a step."""
        self.engine.check_alive()
        await asyncio.to_thread(self.engine.check_device)

    def stats(self) -> dict:
        stats = self.engine.stats()
        return {"role": self.role, "pid": os.getpid(), "batch_sizes": stats.prefill_sizes,
                "cancelled": stats.cancelled, **stats.prefix_cache, **self.batching.model_dump()}

    def decoded_tokens(self, request_id: str) -> int:
        """Decoding steps this replica ran for a request (every stage of it): what cancellation saves."""
        return self.engine.decoded_tokens(request_id)


def _replica_name() -> str:
    """This replica's unique id under Serve (the trace shows which replica ran each stage); the pid
    outside Serve."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not inside a Serve replica (unit tests, in-process use)
        return f"pid-{os.getpid()}"
