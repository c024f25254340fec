"""Replica affinity for a request's stages: the stage that follows another on the same model goes to
the replica that ran the first, where that request's prompt head is kept (the transformers engine's
prefix store, vLLM's prefix cache). Serve's own extension point: a `RequestRouter`, configured per
model deployment with `request_router_config` (Ray Serve's request routers are an alpha API; Ray Serve
LLM's `PrefixCacheAffinityRouter` is built the same way).

Each calling handle (one per Router replica, which makes every call of a request) remembers which
replica ran each request id, bounded. A follow-up goes there unless that replica is gone, or its
known queue is past `max_queued_for_affinity`; then, and for a request id it has not seen, Serve's
default choice (power of two choices) decides. Never an error: affinity only ranks replicas first."""

from __future__ import annotations

from collections import OrderedDict
from typing import List, Optional

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve._private.request_router.common import PendingRequest
from ray.serve._private.request_router.replica_wrapper import RunningReplica

from tandem.schemas import GenerationRequest

REMEMBERED = 4096  # request ids remembered per handle: a request's stages follow each other within seconds


def request_key(pending: Optional[PendingRequest]) -> str:
    """The request id of a model server call (`generate` or `stream`, one GenerationRequest)."""
    if pending is None:
        return ""
    for arg in [*pending.args, *pending.kwargs.values()]:
        if isinstance(arg, GenerationRequest):
            return arg.request_id
    return ""


class StageAffinityRouter(PowerOfTwoChoicesRequestRouter):
    def initialize_state(self, max_queued_for_affinity: int = 8, **kwargs) -> None:
        super().initialize_state(**kwargs)
        self.max_queued_for_affinity = max_queued_for_affinity
        self.affinity: OrderedDict[str, object] = OrderedDict()  # request id -> replica id

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        default = await super().choose_replicas(candidate_replicas, pending_request)
        replica_id = self.affinity.get(request_key(pending_request))
        if replica_id is None:
            return default
        chosen = next((r for r in candidate_replicas if r.replica_id == replica_id), None)
        queued = self.replica_queue_len_cache.get(replica_id) if chosen is not None else None
        if chosen is None or (queued is not None and queued > self.max_queued_for_affinity):
            return default  # gone, or too busy to wait for: the default choice
        rest = [[r for r in rank if r is not chosen] for rank in default]
        return [[chosen], *[rank for rank in rest if rank]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        key = request_key(pending_request)
        if key:
            self.affinity[key] = replica_id
            self.affinity.move_to_end(key)
            while len(self.affinity) > REMEMBERED:
                self.affinity.popitem(last=False)
