"""Random-init presets must have the real models' shapes, or latency 'at real size' measures
something else. Counted on the meta device: no memory, no weights."""

import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration

from benchmarks.latency_profile import crossover
from tandem.checkpoints import real_size_config

# Published totals: Qwen3-VL 8B's model card says 8.77B; the others are the public checkpoints' sizes.
PUBLISHED_B = {"qwen3-vl-2b": 2.13, "qwen3-vl-4b": 4.44, "qwen3-vl-8b": 8.77, "qwen3-vl-32b": 33.4}


@pytest.mark.parametrize("name, billions", sorted(PUBLISHED_B.items()))
def test_preset_parameter_counts_match_the_published_models(name, billions):
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration._from_config(real_size_config(name))
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, rel=0.01)


def test_crossover_from_a_linear_small_model():
    small = {"model": "s", "e2e": [{"output_tokens": n, "ms": 10 + 2 * n} for n in (1, 8, 32, 128)]}
    large = {"model": "l", "e2e": [{"output_tokens": n, "ms": 50 + 5 * n} for n in (1, 8, 32, 128)]}
    c = crossover(large, small, 8)
    assert c["large_ms"] == 90 and c["small_ms_per_token"] == pytest.approx(2.0)
    assert c["crossover_small_tokens"] == pytest.approx(40.0)  # 10 + 2 * 40 == 90
