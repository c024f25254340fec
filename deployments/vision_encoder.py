"""VisionEncoder: each model's own vision tower, batched across requests, with an LRU cache of
features by (model, image digest), bounded in entries and bytes, so a repeated image is never
encoded twice.

Features are put into Ray's object store and only their references are returned: the router relays
references, and each model server fetches the features it needs straight from the store."""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict, deque

from pydantic import BaseModel, ConfigDict, Field
import ray
from ray import serve

from tandem.config import TandemConfig
from tandem.engines import ROLES, make_engine
from tandem.images import image_digest


class VisionConfig(BaseModel):
    """The vision encoder's `user_config`."""

    model_config = ConfigDict(extra="forbid")
    max_batch_size: int = Field(8, gt=0, description="Most encode calls batched together.")
    batch_wait_timeout_s: float = Field(0.005, ge=0, description="How long a batch waits to fill.")
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
        self.cache = FeatureCache(self.settings.feature_cache_size, self.settings.feature_cache_bytes)
        self.encoded: dict[str, int] = {role: 0 for role in self.towers}
        self.cache_hits = 0
        self.batch_sizes: deque[int] = deque(maxlen=4096)  # the most recent batches: replicas live for weeks

    def reconfigure(self, user_config: dict) -> None:
        self.settings = VisionConfig.model_validate(user_config or {})
        self.cache.configure(self.settings.feature_cache_size, self.settings.feature_cache_bytes)
        self._encode_batch.set_max_batch_size(self.settings.max_batch_size)
        self._encode_batch.set_batch_wait_timeout_s(self.settings.batch_wait_timeout_s)

    async def encode(self, images: list[bytes], model: str) -> list[ray.ObjectRef]:
        """References to each image's features for `model` (a list of ObjectRef[ImageFeatures])."""
        return await self._encode_batch((images, model))

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def _encode_batch(self, calls: list[tuple[list[bytes], str]]) -> list[list[ray.ObjectRef]]:
        self.batch_sizes.append(len(calls))
        digests = [[image_digest(b) for b in images] for images, _ in calls]
        found: dict[tuple[str, str], ray.ObjectRef] = {}
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
                feats = await asyncio.to_thread(self.towers[role].encode_images, list(missing.values()))
                self.encoded[role] += len(feats)
                for digest, feat in zip(missing, feats):
                    found[role, digest] = ray.put(feat)
                    self.cache.put((role, digest), found[role, digest], feature_bytes(feat))
        return [[found[role, d] for d in ds] for (_, role), ds in zip(calls, digests)]

    async def check_health(self) -> None:
        """Serve's periodic probe (raising restarts the replica): each tower's device still computes."""
        for tower in self.towers.values():
            await asyncio.to_thread(tower.check_device)

    def stats(self) -> dict:
        return {"pid": os.getpid(), "encoded": dict(self.encoded), "batch_sizes": list(self.batch_sizes),
                "cache_hits": self.cache_hits,
                "cached": len(self.cache), "cached_bytes": self.cache.bytes, **self.settings.model_dump()}
