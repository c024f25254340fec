"""Transfer decisions and selectors: the knobs that decide cost. A decision that loses its inputs
cannot be audited; a selector over budget silently inflates the large model's prefill."""

import math
import random

import pytest

from tandem.config import SelectorConfig
from tandem.policies import answer_confidence, decide_confidence, decide_mutual, decide_random
from tandem.selectors import ELISION, select_reasoning


def test_mutual_agreement_skips_transfer_and_reports_inputs():
    d = decide_mutual("B", "The answer is B.")
    assert d.transfer is False
    assert d.inputs["agree"] is True
    assert (d.inputs["small_normalized"], d.inputs["large_normalized"]) == ("opt:B", "opt:B")


def test_mutual_disagreement_transfers():
    d = decide_mutual("A", "B")
    assert d.transfer is True and d.inputs["agree"] is False
    assert d.inputs["small_answer"] == "A" and d.inputs["large_answer"] == "B"


@pytest.mark.parametrize("logprobs, threshold, transfer", [
    ([math.log(0.9)] * 3, 0.5, False), ([math.log(0.2)] * 3, 0.5, True), ([], 0.5, True),
    ([math.log(0.5)], 0.5, False),
])
def test_confidence_threshold(logprobs, threshold, transfer):
    d = decide_confidence(logprobs, threshold)
    assert d.transfer is transfer
    assert d.inputs["threshold"] == threshold
    assert d.inputs["confidence"] == pytest.approx(answer_confidence(logprobs))


def test_confidence_is_geometric_mean_probability():
    assert answer_confidence([math.log(0.25), math.log(1.0)]) == pytest.approx(0.5)


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_random_transfer_rate_within_tolerance(p):
    rng = random.Random(1234)
    n = 4000
    rate = sum(decide_random(p, rng).transfer for _ in range(n)) / n
    assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-9


def _tokens(n):
    return [f" t{i}" for i in range(n)]


@pytest.mark.parametrize("n, budget, head_fraction", [(1000, 64, 0.5), (100, 10, 0.0), (100, 10, 1.0),
                                                      (33, 32, 0.3), (5, 64, 0.5), (0, 8, 0.5)])
def test_budget_selector_keeps_at_most_budget_tokens_in_order(n, budget, head_fraction):
    sel = select_reasoning(_tokens(n), SelectorConfig(kind="budget", budget_tokens=budget,
                                                      head_fraction=head_fraction))
    assert sel.token_count == min(n, budget)
    kept = [i for a, b in sel.spans for i in range(a, b)]
    assert kept == sorted(set(kept)) and len(kept) == sel.token_count
    if n > budget and 0 < head_fraction < 1:
        assert sel.spans[0][0] == 0 and sel.spans[-1][1] == n
        assert ELISION in sel.text


def test_budget_selector_head_and_tail_text():
    sel = select_reasoning(_tokens(10), SelectorConfig(kind="budget", budget_tokens=4, head_fraction=0.5))
    assert sel.text == "t0 t1" + ELISION + "t8 t9"


def test_full_selector_keeps_everything():
    sel = select_reasoning(_tokens(500), SelectorConfig(kind="full", budget_tokens=8))
    assert sel.token_count == 500 and sel.text.startswith("t0 t1") and sel.text.endswith("t499")


def test_attention_selector_keeps_the_most_attended_spans_in_reading_order():
    scores = [0.1] * 40
    for i in list(range(8, 12)) + list(range(28, 32)):
        scores[i] = 1.0
    sel = select_reasoning(_tokens(40), SelectorConfig(kind="attention", budget_tokens=8, span_tokens=4), scores)
    assert sel.spans == ((8, 12), (28, 32)) and sel.token_count == 8
    assert sel.text == "t8 t9 t10 t11" + ELISION + "t28 t29 t30 t31"


def test_attention_selector_merges_adjacent_spans_and_respects_budget():
    scores = [0.0] * 20
    scores[4:12] = [1.0] * 8
    sel = select_reasoning(_tokens(20), SelectorConfig(kind="attention", budget_tokens=10, span_tokens=4), scores)
    assert sel.spans == ((4, 12),) and sel.token_count <= 10


def test_attention_selector_needs_a_score_per_token():
    with pytest.raises(ValueError, match="one score per token"):
        select_reasoning(_tokens(50), SelectorConfig(kind="attention", budget_tokens=8), [1.0] * 3)
