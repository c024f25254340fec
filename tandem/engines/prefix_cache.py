"""The KV of finished prompts, kept on the replica that computed them so a request's next stage on
the same model prefills only what is new: a `mutual` transfer prompt begins with the direct
prompt's head (system, image, question), and so does the small model's reasoning prompt.

Entries are keyed by the request they belong to (its id), bounded in bytes, least recently used
first out. A follow-up reuses the longest common prefix of token ids with the entry, provided that
prefix covers every image token (the suffix then needs no visual features) and leaves at least one
new token to compute. Owns no model: the engine hands it tensors and asks it for a match."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: a server on a model-free engine starts without importing torch
    import torch


@dataclass
class PrefixEntry:
    ids: list[int]
    keys: list[torch.Tensor]  # per decoder layer: [1, kv_heads, tokens, head_dim]
    values: list[torch.Tensor]
    positions: torch.Tensor  # [3, tokens]: the rotary positions each token had
    images_end: int  # one past the last image token (0 without images)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixStore:
    """LRU of `PrefixEntry` by request id, within `max_bytes` (0: off)."""

    def __init__(self, max_bytes: int = 0):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, PrefixEntry] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    def configure(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._evict()

    def match(self, key: str, ids: list[int]) -> tuple[PrefixEntry | None, int]:
        """(entry, tokens reusable) for a prompt of `key`'s request; (None, 0) when nothing is."""
        entry = self.entries.get(key) if key and self.max_bytes else None
        if entry is None:
            return None, 0
        n = common_prefix(entry.ids, ids)
        n = min(n, len(ids) - 1)  # at least one token is computed: its logits start the decode
        if n < max(1, entry.images_end):
            self.misses += 1
            return None, 0
        self.hits += 1
        self.entries.move_to_end(key)
        return entry, n

    def put(self, key: str, entry: PrefixEntry) -> None:
        if not key or not self.max_bytes:
            return
        if key in self.entries:
            self.bytes -= self.entries.pop(key).nbytes
        if entry.nbytes > self.max_bytes:
            return
        self.entries[key] = entry
        self.bytes += entry.nbytes
        self._evict()

    def _evict(self) -> None:
        while self.entries and self.bytes > self.max_bytes:
            self.bytes -= self.entries.popitem(last=False)[1].nbytes

    def stats(self) -> dict:
        looked = self.hits + self.misses
        return {"prefix_cache_bytes": self.bytes, "prefix_cache_entries": len(self.entries),
                "prefix_cache_hits": self.hits, "prefix_cache_hit_rate": round(self.hits / looked, 4) if looked else None}
