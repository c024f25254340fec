"""The VisionEncoder's feature cache: least recently used first out, bounded in entries and in bytes
(at real sizes one image's features are MiBs pinned in the object store)."""

import torch

from deployments.vision_encoder import FeatureCache, feature_bytes
from tandem.schemas import ImageFeatures


def test_bounded_in_bytes_least_recently_used_first_out():
    cache = FeatureCache(max_entries=100, max_bytes=30)
    for key in "abc":
        cache.put(key, key.upper(), 10)
    assert cache.bytes == 30 and len(cache) == 3
    assert cache.get("a") == "A"          # a is now the most recently used
    cache.put("d", "D", 10)               # 40 bytes > 30: b, the least recently used, goes
    assert cache.get("b") is None and [cache.get(k) for k in "acd"] == ["A", "C", "D"]
    assert cache.bytes == 30
    cache.put("huge", "H", 31)            # bigger than the whole cache: not kept, nothing evicted
    assert cache.get("huge") is None and len(cache) == 3


def test_bounded_in_entries_and_reconfigurable():
    cache = FeatureCache(max_entries=2, max_bytes=10**9)
    for key in "abc":
        cache.put(key, key, 1)
    assert cache.get("a") is None and len(cache) == 2
    cache.configure(max_entries=10, max_bytes=1)  # a smaller byte bound at run time evicts at once
    assert len(cache) == 1 and cache.bytes == 1 and cache.get("c") == "c"
    cache.put("c", "c2", 1)                       # replacing an entry does not count it twice
    assert cache.bytes == 1 and cache.get("c") == "c2"
    cache.configure(max_entries=0, max_bytes=10)
    cache.put("x", "x", 1)
    assert len(cache) == 0


def test_feature_bytes_counts_every_deepstack_level():
    feat = ImageFeatures(model="large", embeds=torch.zeros(256, 4096, dtype=torch.bfloat16),
                         deepstack=[torch.zeros(256, 4096, dtype=torch.bfloat16)] * 3, grid_thw=(1, 32, 32),
                         merge_size=2)
    assert feature_bytes(feat) == 8 * 2**20  # the 8B at 512 x 512: 256 tokens x 4096 x 4 levels x 2 bytes
