"""The training loop: a short run learns and saves a loadable checkpoint with its card, alone, chained
in phases, on from a checkpoint and data-parallel."""

import json

import pytest

from training.examples import build_task_tokenizer
from training.loop import train
from training.card import write_card
from tandem import prompts


@pytest.fixture(scope="module")
def tokenizer():
    return build_task_tokenizer(0)


def test_a_short_run_learns_and_saves_a_loadable_checkpoint(tmp_path, tokenizer):
    from transformers import AutoModelForImageTextToText

    facts = train("small", tmp_path / "small", steps=40, lr=3e-3, batch_size=8, tokenizer=tokenizer, progress=False)
    assert facts["loss_last"] < 0.75 * facts["loss_first"], facts
    assert facts["prompt_fingerprint"] == prompts.template_fingerprint()
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "small")
    assert model.config.text_config.hidden_size == 64 and (tmp_path / "small" / "training.json").exists()


def test_training_on_from_a_checkpoint_starts_from_its_weights_and_cards_every_stage(tmp_path, tokenizer):
    """--init-from: the shipped models were trained in stages, each from the one before; a stage must
    start from the previous one's weights and tokenizer, and the card give every stage's command."""
    import torch
    from safetensors.torch import load_file

    from training.card import stage_chain, write_card

    train("small", tmp_path / "a" / "small", steps=6, lr=3e-3, batch_size=4, tokenizer=tokenizer, progress=False)
    facts = train("small", tmp_path / "b" / "small", steps=2, lr=1e-12, batch_size=4, progress=False,
                  init_from=str(tmp_path / "a" / "small"), mix={"reason": 0.5, "lookup": 0.5}, read_first=0.0)
    assert facts["base"]["steps"] == 6 and facts["init_from"] == str(tmp_path / "a" / "small")
    a, b = (load_file(tmp_path / d / "small" / "model.safetensors") for d in "ab")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)  # lr ~0: unchanged
    assert (tmp_path / "a" / "small" / "tokenizer.json").read_text() == (tmp_path / "b" / "small" / "tokenizer.json").read_text()
    # ...and its tokenizer config the same too: not how this copy was loaded (offline, from a path).
    assert (json.loads((tmp_path / "a" / "small" / "tokenizer_config.json").read_text())
            == json.loads((tmp_path / "b" / "small" / "tokenizer_config.json").read_text()))
    train("small", tmp_path / "c" / "small", steps=3, lr=1e-3, batch_size=4, progress=False, read_first=0.0,
          init_from=str(tmp_path / "b" / "small"), mix={"direct": 0.5, "census": 0.5}, direct_tiers={"perceive": 1.0})
    assert [s["steps"] for s in stage_chain(json.loads((tmp_path / "c" / "small" / "training.json").read_text()))] == [6, 2, 3]
    write_card(tmp_path / "c" / "small", None)
    card = (tmp_path / "c" / "small" / "README.md").read_text()
    assert "6 steps x batch 4" in card and "Stage 2, trained on from stage 1's checkpoint: 2 steps" in card
    assert "--init-from BASE --steps 2 --lr 1e-12 --mix reason=0.5,lookup=0.5`" in card
    assert "--init-from BASE --steps 3 --lr 0.001 --mix direct=0.5,census=0.5 --direct-tiers perceive=1.0`" in card


def test_a_chained_run_switches_mix_and_tiers_by_phase_and_cards_every_phase(tmp_path, tokenizer):
    """--schedule: one run from scratch whose phases are what stages were; each phase's batches follow its
    own mix and tiers, and the card and the reproduce command name the schedule (and the batch size,
    where it is not the role's default: without it the command trained another model)."""
    from training.models import TRAINED_SIZES
    from training.batches import Batcher, batch_stream
    from training.schedule import phase_of
    from training.card import stage_command, write_card
    from tandem.checkpoints import new_tiny

    phases = [{"steps": 6, "lr": 3e-3, "read_first": 0.5, "mix": {"direct": 1.0}, "finish_mix": None,
               "finish_share": None, "reason_tiers": None, "direct_tiers": None},
              {"steps": 4, "lr": 1e-3, "read_first": 0.0, "mix": {"direct": 1.0}, "finish_mix": None,
               "finish_share": None, "reason_tiers": None, "direct_tiers": {"count": 1.0}}]
    assert [phase_of(phases, s) for s in (0, 5, 6, 9)] == [(0, 0), (0, 5), (1, 0), (1, 3)]
    with pytest.raises(IndexError):
        phase_of(phases, 10)
    model, processor, tok = new_tiny(TRAINED_SIZES["small"], tokenizer, 0)
    batcher = Batcher("small", tok, processor.image_processor, model.config.image_token_id, seed=1)
    plan = lambda step: ({"direct": 1.0}, {"direct": {"count": 1.0}} if step >= 2 else {})  # noqa: E731
    texts = [tok.decode(b["input_ids"][0]) for b, _ in batch_stream(batcher, 4, 2, plan, workers=0)]
    assert "How many" in texts[2] and "How many" in texts[3]

    facts = train("small", tmp_path / "small", steps=1, lr=1.0, batch_size=4, tokenizer=tokenizer, progress=False,
                  phases=phases, schedule_file="S.json")
    assert facts["steps"] == 10 and facts["examples"] == 40 and len(facts["phases"]) == 2
    assert all(p["loss_first"] > 0 for p in facts["phases"])
    write_card(tmp_path / "small", None)
    card = (tmp_path / "small" / "README.md").read_text()
    assert "One run in 2 phases (`--schedule S.json`)" in card and "Phase 2: 4 steps, peak LR 0.001" in card
    assert "direct-answer tiers: count 100%" in card
    assert stage_command("small", facts, False) == (f"python -m training.train --role small "
                                                    f"--threads {facts['threads']} --batch-size 4 --schedule S.json")


def test_averaged_gradients_are_the_whole_batchs_gradient(tmp_path):
    """Two ranks, each on half the rows, average to the gradient (and loss) of all the rows at once."""
    import multiprocessing

    import torch

    from training.loop import average_gradients, host_store, store_at

    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randn(8, 1)

    def loss_of(model, rows):
        return ((model(x[rows]) - y[rows]) ** 2).mean()

    store = host_store(2)  # this process holds the store (kept referenced); both ranks meet on it as clients
    port = store.port

    def rank_main(rank):
        import torch.distributed as dist

        dist.init_process_group("gloo", store=store_at(port, 2), rank=rank, world_size=2)
        torch.manual_seed(1)
        model = torch.nn.Linear(5, 1)
        loss = loss_of(model, slice(4 * rank, 4 * rank + 4))
        loss.backward()
        loss = average_gradients(model, loss, 2)
        torch.save({"loss": loss, "grads": [p.grad for p in model.parameters()]}, tmp_path / f"{rank}.pt")
        dist.destroy_process_group()

    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=rank_main, args=(r,)) for r in range(2)]
    for r in ranks:
        r.start()
    for r in ranks:
        r.join(60)
        assert r.exitcode == 0
    torch.manual_seed(1)
    model = torch.nn.Linear(5, 1)
    whole = loss_of(model, slice(0, 8))
    whole.backward()
    for rank in range(2):
        got = torch.load(tmp_path / f"{rank}.pt")
        assert torch.allclose(got["loss"], whole.detach(), atol=1e-6)
        for g, p in zip(got["grads"], model.parameters()):
            assert torch.allclose(g, p.grad, atol=1e-6)


@pytest.mark.slow
def test_a_two_process_run_learns_and_says_so(tmp_path, tokenizer):
    """The data-parallel path end to end: a spawned second rank, the gradients averaged, rank 0
    saving a loadable checkpoint whose facts record the processes."""
    from transformers import AutoModelForImageTextToText

    facts = train("small", tmp_path / "small", steps=40, lr=3e-3, batch_size=8, tokenizer=tokenizer, progress=False,
                  data_workers=0, procs=2)
    assert facts["procs"] == 2 and facts["loss_last"] < 0.75 * facts["loss_first"], facts
    AutoModelForImageTextToText.from_pretrained(tmp_path / "small")
    write_card(tmp_path / "small", None)  # the card's command reproduces the run: it names the processes
    card = (tmp_path / "small" / "README.md").read_text()
    assert "--procs 2" in card and "each of 2 data-parallel processes" in card
    with pytest.raises(ValueError, match="equal shares"):
        train("small", tmp_path / "odd", steps=1, lr=1e-3, batch_size=3, tokenizer=tokenizer, procs=2)
