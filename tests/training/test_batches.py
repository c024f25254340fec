"""Batches: tiers and objectives as asked, the same batches from a worker process as inline, shards
disjoint, and the per-token weights a phase asks for."""

import random
import re

import pytest

from tasks.grid import grid_item, train_seed
from training.examples import build_task_tokenizer
from training.schedule import MIX


@pytest.fixture(scope="module")
def tokenizer():
    return build_task_tokenizer(0)


def test_reasoning_and_direct_examples_follow_the_tier_mixes_they_are_given():
    from training.batches import Batcher

    batcher = Batcher("small", None, None, 0, seed=0, reason_tiers={"compose": 1.0}, direct_tiers={"count": 1.0})
    assert all("modulo 10" in batcher.example("reason")[0] for _ in range(20))
    assert all("How many" in batcher.example("direct")[0] for _ in range(20))
    batcher.tiers = {}  # the task's own mix: perceive questions among them
    assert not all("modulo 10" in batcher.example("reason")[0] for _ in range(20))
    assert not all("How many" in batcher.example("direct")[0] for _ in range(20))


def test_batches_made_in_a_worker_process_are_the_ones_made_inline(tokenizer):
    """The data worker may only move work, never change it: the same batches, in the same order,
    objectives switching where the schedule says, and the items counted."""
    import torch

    from training.models import TRAINED_SIZES

    from training.batches import Batcher, batch_stream
    from tandem.checkpoints import new_tiny

    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)

    def batches(workers):
        batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=1)
        schedule = lambda step: ({"caption": 1.0} if step < 2 else MIX["large"], {})  # noqa: E731
        return list(batch_stream(batcher, 6, 3, schedule, workers=workers))

    inline, worker = batches(0), batches(1)
    assert [n for _, n in inline] == [n for _, n in worker] == [3, 6, 9, 12, 15, 18]
    for (a, _), (b, _) in zip(inline, worker):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="workers is 0 or 1"):
        batch_stream(None, 1, 1, None, workers=2)


def test_shards_take_disjoint_rows_of_each_batch_with_the_batchs_one_objective(tokenizer, monkeypatch):
    """Data-parallel ranks must train on one batch between them: the same objective, each its own
    share of the batch's item indices, none twice; and one unsharded process its old stream."""
    from training.models import TRAINED_SIZES
    from training.batches import Batcher
    from tandem.checkpoints import new_tiny

    model, processor, tok = new_tiny(TRAINED_SIZES["small"], tokenizer, 0)
    drawn = []
    real = Batcher.example

    def example(self, objective):
        drawn.append((self.rank, objective, self.next_item))
        return real(self, objective)

    monkeypatch.setattr(Batcher, "example", example)
    ranks = [Batcher("small", tok, processor.image_processor, model.config.image_token_id, seed=3, shard=(r, 2))
             for r in range(2)]
    for b in ranks:
        b.mix = {"direct": 0.5, "reason": 0.3, "caption": 0.2}
    for _ in range(6):
        for b in ranks:
            assert b.batch(4)["input_ids"].shape[0] == 2
    assert [b.next_item for b in ranks] == [24, 24]
    by_rank = [[(o, i) for r, o, i in drawn if r == rank] for rank in range(2)]
    assert sorted(i for rows in by_rank for _, i in rows) == list(range(24))
    for step in range(6):  # rank 0 rows 4k, 4k+1; rank 1 rows 4k+2, 4k+3; one objective per batch
        rows = by_rank[0][2 * step:2 * step + 2] + by_rank[1][2 * step:2 * step + 2]
        assert [i for _, i in rows] == [4 * step + k for k in range(4)]
        assert len({o for o, _ in rows}) == 1
    assert len({o for o, _ in by_rank[0]}) > 1  # the objectives do change from batch to batch
    with pytest.raises(ValueError, match="equal shards"):
        ranks[0].batch(3)


def test_computed_numbers_are_the_sums_and_row_counts_and_weigh_as_a_phase_says(tokenizer):
    """Each weighted position predicts a number the target computes — a running sum, the total, a count
    trace's row count — recomputed here from the text; a weight of 1 is the plain loss, and a weight w
    scales exactly those tokens' losses within their sequence's mean."""
    import torch
    import torch.nn.functional as F

    from training.models import TRAINED_SIZES

    from training.batches import Batcher

    from training.objectives import answer_loss
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=6,
                      reason_tiers={"count": 0.5, "compose": 0.5})
    batcher.attend = True
    for mix in ({"reason": 1.0}, {"lookup": 1.0}, {"tally": 1.0}, {"direct": 1.0}):
        batcher.mix = mix
        batch = batcher.batch(2)
        labels, computed = batch.pop("labels"), batch.pop("computed")
        for key in [k for k in batch if k.endswith(("copies", "readouts", "pointers", "counters"))]:
            batch.pop(key)
        for row in range(2):
            text = tok.decode(labels[row][labels[row] != -100])
            expected = []
            for line in re.finditer(r"; \w+ (\d+) \((\d+)\)", text):  # a count trace's row: its count, its sum
                expected += [int(line.group(1)), int(line.group(2))]
            if not expected:
                expected = [int(n) for n in re.findall(r"\((\d+)\)", text)]
            if expected:
                expected.append(int(re.search(r"total (\d+)", text).group(1)))
            said = [int(tok.decode(labels[row, q + 1])) for r, q in computed.tolist() if r == row]
            assert said == expected, (mix, text)
        if mix == {"direct": 1.0}:
            assert len(computed) == 0
            continue
        weights = torch.ones(labels[:, 1:].shape)
        weights[computed[:, 0], computed[:, 1]] = 3.0
        logits = model(**batch).logits[:, :-1].float()
        targets = labels[:, 1:]
        per_token = F.cross_entropy(logits.transpose(1, 2), targets.clamp(min=0), reduction="none")
        mask = (targets != -100).float()
        expected = ((per_token * mask * weights).sum(1) / mask.sum(1)).mean()
        assert torch.allclose(answer_loss(model, batch, labels, weights), expected, atol=1e-5)
        assert torch.allclose(answer_loss(model, batch, labels, torch.ones_like(weights)),
                              answer_loss(model, batch, labels), atol=1e-6)
        assert not torch.allclose(answer_loss(model, batch, labels, weights), answer_loss(model, batch, labels))


def test_the_answer_after_a_trace_is_the_position_answer_weight_weighs(tokenizer, tmp_path):
    """`answered`: in a reasoning batch, one position a row, the one that predicts the answer's first
    token right after "Answer:" (read back from the target's text); none in other objectives; a
    phase's answer_weight must be a number > 0 and is 1 unless given."""
    from training.examples import EOS
    from training.models import TRAINED_SIZES
    from training.batches import Batcher
    from training.schedule import load_schedule
    from tandem.checkpoints import new_tiny
    from tandem.prompts import ANSWER_MARK

    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=7)
    batcher.attend = True
    for mix in ({"reason": 1.0}, {"direct": 1.0}, {"transfer": 1.0}, {"lookup": 1.0}):
        batcher.mix = mix
        batch = batcher.batch(3)
        labels, answered = batch["labels"], batch["answered"]
        if mix != {"reason": 1.0}:
            assert len(answered) == 0
            continue
        assert answered[:, 0].tolist() == [0, 1, 2]
        for row, q in answered.tolist():
            target = tok.decode(labels[row][labels[row] != -100])
            answer = target.rsplit(ANSWER_MARK, 1)[1].removesuffix(EOS)
            assert tok.decode(labels[row, :q + 1][labels[row, :q + 1] != -100]).endswith(ANSWER_MARK)
            assert tok.decode(labels[row, q + 1:][labels[row, q + 1:] != -100]) == answer + EOS
    path = tmp_path / "s.json"
    path.write_text('[{"steps": 2, "lr": 0.001, "mix": {"reason": 1.0}, "answer_weight": 0}]')
    with pytest.raises(ValueError, match="answer_weight"):
        load_schedule(path)
    path.write_text('[{"steps": 2, "lr": 0.001, "mix": {"reason": 1.0}, "answer_weight": 3}]')
    assert load_schedule(path)[0]["answer_weight"] == 3 and load_schedule(path)[0]["computed_weight"] == 1.0


def test_a_verdict_points_the_answer_at_the_conclusion_it_copies(tokenizer):
    """`verdict`: after a hint or the model's own trace whose total (or colour) is the answer, the
    answer's first token is taught to look at that total — in the prompt for a transfer, earlier in
    the target after a trace; a corrupted hint whose total is not the answer, an any-question (whose
    "yes" is not written in its trace) and the other objectives teach none."""
    from tasks.grid import corrupt_trace
    from training.examples import CONCLUSION, answer_text, concluded
    from training.models import TRAINED_SIZES
    from training.batches import Batcher
    from tandem.checkpoints import new_tiny

    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=5)
    batcher.attend = True
    seen = {"transfer": 0, "reason": 0}
    for mix in ({"transfer": 1.0}, {"reason": 1.0}, {"direct": 1.0}, {"lookup": 1.0}):
        batcher.mix = mix
        for _ in range(4):
            batch = batcher.batch(4)
            labels, ids, found = batch["labels"], batch["input_ids"], batch["verdict_copies"].tolist()
            if mix.keys() - {"transfer", "reason"}:
                assert found == []
                continue
            seen[next(iter(mix))] += len(found)
            for row, q, k in found:
                word = tok.decode(labels[row, q + 1]).strip()  # the answer's first token
                upto = tok.decode(ids[row, :k + 1])
                assert upto.endswith(f"total {word}") or upto.endswith(f": {word}")
                assert (labels[row, k] == -100) == ("transfer" in mix)  # a hint's in the prompt, a trace's not
                if "reason" in mix:
                    assert tok.decode(labels[row, :q + 1][labels[row, :q + 1] != -100]).endswith("Answer:")
    assert seen["transfer"] > 0 and seen["reason"] > 0
    for seed in range(40):  # by construction, on the text
        item = grid_item(train_seed(0, seed))
        answer, hint = answer_text(item), f"Hint: {item.trace}"
        found = concluded(hint, answer, "transfer", answer)
        assert (len(found) == 1) == (item.kind != "any")
        if found:
            assert hint[found[0][3]:].startswith(answer + ".") and found[0][1:3] == (0, True)
        wrong = corrupt_trace(item, random.Random(seed))[0]
        last = [w for w in CONCLUSION.findall(wrong)[-1] if w]
        if last != [answer]:  # a misread that changed the conclusion: the answer is not a copy of it
            assert concluded(f"Hint: {wrong}", answer, "transfer", answer) == []
        assert concluded("", item.trace, "direct", answer) == []
