"""VisionEncoder: each model's own vision tower, batched across requests, with an LRU cache of
features by (model, image digest), bounded in entries and bytes, so a repeated image is never
encoded twice.

Features are put into Ray's object store and only their references are returned: the router relays
references, and each model server fetches the features it needs straight from the store."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict, deque
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
import ray

from tandem.batcher import Batcher
from tandem.config import TandemConfig
from tandem.engines import ROLES, make_engine
from tandem.errors import TandemError
from tandem.images import image_digest

logger = logging.getLogger("ray.serve")


class VisionConfig(BaseModel):
    """The vision encoder's `user_config`."""

    model_config = ConfigDict(extra="forbid")
    max_batch_size: int = Field(8, gt=0, description="Most encode calls batched together.")
    batch_wait_timeout_s: float = Field(0.005, ge=0, description="How long a batch may wait to fill.")
    batch_wait_mode: Literal["adaptive", "always"] = Field(
        "adaptive", description="adaptive: a batch waits to fill only while calls arrive closer together than the "
                                "wait (a lone call is encoded at once); always: every batch waits.")
    feature_cache_size: int = Field(256, ge=0, description="Images whose features are kept, per replica.")
    feature_cache_bytes: int = Field(256 * 2**20, ge=0,
                                     description="Most bytes of features kept, per replica (they are pinned in "
                                                 "Ray's object store: at real sizes one image is MiBs).")


class FeatureCache:
    """LRU of feature references by (model, image digest), bounded in entries and in bytes."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.entries: OrderedDict[tuple[str, str], tuple[object, int]] = OrderedDict()
        self.max_entries, self.max_bytes, self.bytes = max_entries, max_bytes, 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key):
        if key not in self.entries:
            return None
        self.entries.move_to_end(key)
        return self.entries[key][0]

    def put(self, key, value, nbytes: int) -> None:
        if key in self.entries:
            self.bytes -= self.entries.pop(key)[1]
        if nbytes > self.max_bytes or self.max_entries == 0:
            return  # larger than the whole cache: not kept
        self.entries[key] = (value, nbytes)
        self.bytes += nbytes
        self._evict()

    def configure(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._evict()

    def _evict(self) -> None:
        while self.entries and (len(self.entries) > self.max_entries or self.bytes > self.max_bytes):
            self.bytes -= self.entries.popitem(last=False)[1][1]


def feature_bytes(feat) -> int:
    """Bytes of one image's features: the merged embeddings and every DeepStack level (tensors; the
    fake engine's stand-ins count as nothing)."""
    return sum(t.numel() * t.element_size() for t in [feat.embeds, *feat.deepstack] if hasattr(t, "element_size"))


class VisionEncoder:
    def __init__(self, config: TandemConfig):
        self.towers = {role: make_engine(config, role, language=False) for role in ROLES}
        for tower in self.towers.values():
            tower.warm_up()
        self.settings = VisionConfig()
        self._last_call = 0.0
        self.cache = FeatureCache(self.settings.feature_cache_size, self.settings.feature_cache_bytes)
        self.encoded: dict[str, int] = {role: 0 for role in self.towers}
        self.cache_hits = 0
        self.batch_sizes: deque[int] = deque(maxlen=4096)  # the most recent batches: replicas live for weeks
        # Not Serve's @serve.batch: it forms each batch from one timeout's window of calls while the
        # last one runs, so under load it runs batches of one or two (tandem/batcher.py).
        self._batches = Batcher(self._encode_batch, self.settings.max_batch_size, self.settings.batch_wait_timeout_s)

    def reconfigure(self, user_config: dict) -> None:
        self.settings = VisionConfig.model_validate(user_config or {})
        self.cache.configure(self.settings.feature_cache_size, self.settings.feature_cache_bytes)
        self._batches.max_batch_size = self.settings.max_batch_size
        self._batches.wait_s = self.settings.batch_wait_timeout_s

    async def encode(self, images: list[bytes], model: str) -> list[ray.ObjectRef]:
        """References to each image's features for `model` (a list of ObjectRef[ImageFeatures]). A
        call whose image fails to encode raises alone: the batch it shared answers the others."""
        self._adapt_wait()
        result = await self._batches((images, model))
        if isinstance(result, BaseException):
            raise result
        return result

    async def _encode_batch(self, calls: list[tuple[list[bytes], str]]) -> list:
        """One result per call: its references, or the exception one of its images raised (a batch
        whose function raises fails every caller in it, so nothing raises here)."""
        self.batch_sizes.append(len(calls))
        digests = [[image_digest(b) for b in images] for images, _ in calls]
        found: dict[tuple[str, str], object] = {}
        for role in {role for _, role in calls}:
            wanted = {d: b for (images, r), ds in zip(calls, digests) if r == role for d, b in zip(ds, images)}
            missing = {}
            for digest, data in wanted.items():
                ref = self.cache.get((role, digest))
                if ref is not None:
                    found[role, digest] = ref
                    self.cache_hits += 1
                else:
                    missing[digest] = data
            if missing:
                found.update(await self._encode_missing(role, missing))
        results = []
        for (_, role), ds in zip(calls, digests):
            failed = next((found[role, d] for d in ds if isinstance(found[role, d], BaseException)), None)
            results.append(failed if failed is not None else [found[role, d] for d in ds])
        return results

    async def _encode_missing(self, role: str, missing: dict[str, bytes]) -> dict:
        """{(role, digest): reference or exception}: the images encoded together, or one by one when
        that fails, so an image the tower refuses fails only the calls that sent it."""
        try:
            feats = await asyncio.to_thread(self.towers[role].encode_images, list(missing.values()))
        except Exception as err:
            if len(missing) == 1:
                return {(role, digest): _encode_error(err) for digest in missing}
            out = {}
            for digest, data in missing.items():
                out.update(await self._encode_missing(role, {digest: data}))
            return out
        out = {}
        self.encoded[role] += len(feats)
        for digest, feat in zip(missing, feats):
            out[role, digest] = ray.put(feat)
            self.cache.put((role, digest), out[role, digest], feature_bytes(feat))
        return out

    def _adapt_wait(self) -> None:
        """Under `adaptive`, the batch waits only while calls arrive closer together than the wait:
        at an idle replica a call is encoded at once instead of waiting for company that is not coming."""
        now = time.monotonic()
        gap, self._last_call = now - self._last_call, now
        wanted = self.settings.batch_wait_timeout_s
        if self.settings.batch_wait_mode == "adaptive" and gap >= wanted:
            wanted = 0.0
        self._batches.wait_s = wanted

    async def check_health(self) -> None:
        """Serve's periodic probe (raising restarts the replica): each tower's device still computes."""
        for tower in self.towers.values():
            await asyncio.to_thread(tower.check_device)

    def stats(self) -> dict:
        return {"pid": os.getpid(), "encoded": dict(self.encoded), "batch_sizes": list(self.batch_sizes),
                "cache_hits": self.cache_hits,
                "cached": len(self.cache), "cached_bytes": self.cache.bytes, **self.settings.model_dump()}


def _encode_error(err: Exception) -> Exception:
    """What a caller gets for an image its tower refused: the client's error as it is (a BadRequest),
    anything else as a plain error without the library's message (logged here)."""
    if isinstance(err, TandemError):
        return err
    logger.warning("vision tower failed on one image: %s: %s", type(err).__name__, err)
    return TandemError("the image could not be encoded")
