"""Training the tiny pair: the models must learn exactly the strings the pipeline sends (rendered by
tandem/prompts.py, tokenized the way the engine tokenizes them), and a short run must learn."""

import json
import random
import re

import pytest

from benchmarks.grid import grid_item, grid_items, train_seed
from benchmarks.train_tiny import FORMATS, MIX, build_task_tokenizer, render_example, train, write_card
from tandem import prompts


@pytest.fixture(scope="module")
def tokenizer():
    return build_task_tokenizer(0)


@pytest.mark.parametrize("role", ["small", "large"])
def test_examples_are_the_pipelines_prompts(role, tokenizer):
    """A model trained on other strings than the pipeline's answers noise at serving time."""
    item, fmt, rng = grid_item(train_seed(0, 7), tier="compose"), FORMATS[role], random.Random(0)
    question = item.prompt()
    assert render_example(item, role, "direct", tokenizer, rng)[0] == prompts.direct_prompt(question, 1, fmt)
    prompt, target = render_example(item, role, "reason", tokenizer, rng)
    assert prompt == prompts.reasoning_prompt(question, 1, fmt)
    assert (prompt + target).startswith(prompts.answer_after_reasoning(prompt, item.trace, fmt))
    if "transfer" in MIX[role]:
        prompt, _ = render_example(item, role, "transfer", tokenizer, rng)
        head = prompts.transfer_prompt(question, 1, "", fmt).split(prompts.TRANSFER_HEADER)[0]
        assert prompt.startswith(head) and prompts.TRANSFER_HEADER in prompt


@pytest.mark.parametrize("role", ["small", "large"])
def test_training_tokens_match_what_the_engine_sends(role, tokenizer):
    """The second stage of reasoning sends prompt + reasoning + close as one string: its tokens must be
    a prefix of the training sequence, token for token (a prompt ending in a bare space is not)."""
    rng = random.Random(1)
    for item in grid_items(20, seed=0, split="train"):
        prompt, target = render_example(item, role, "reason", tokenizer, rng)
        trained = tokenizer(prompt)["input_ids"] + tokenizer(target)["input_ids"]
        stage_two = tokenizer(prompts.answer_after_reasoning(prompt, item.trace, FORMATS[role]))["input_ids"]
        assert trained[: len(stage_two)] == stage_two


def test_task_words_are_single_tokens(tokenizer):
    for word in (" red", " purple", " orange", "row", " column", " total", " yellow", " white"):
        assert len(tokenizer(word)["input_ids"]) == 1, word


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

    from benchmarks.train_tiny import stage_chain, write_card

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


def test_value_sums_are_written_as_compose_traces_and_are_right():
    """The lookup objective teaches the compose traces' copying and adding steps: every value must be
    the one the question lists for that colour, every running sum right modulo 10, the format the
    compose traces' own."""
    import re

    from benchmarks.train_tiny import value_sum

    rng = random.Random(3)
    for _ in range(50):
        question, target = value_sum(rng)
        listed = {c: int(v) for c, v in re.findall(r"(\w+) (\d)\b", question.split("these")[0])}
        asked = question.split("colours: ")[1].split(". What")[0].split(", ")
        steps = re.findall(r"(\w+) (\d) \((\d)\)", target)
        assert [c for c, _, _ in steps] == asked and listed["white"] == 0
        total = 0
        for colour, value, running in steps:
            total = (total + listed[colour]) % 10
            assert int(value) == listed[colour] and int(running) == total
        assert target.endswith(f". total {total}.")


def test_row_tallies_copy_the_written_rows_and_count_them_right():
    """The tally objective teaches the count traces' counting step from rows given in the text: the
    rows the target reads must be the ones the question writes, each count recomputed here from the
    written row, the running count and total right."""
    import re

    from benchmarks.grid import grid_item
    from benchmarks.train_tiny import row_tally

    rng = random.Random(4)
    for i in range(50):
        cells = grid_item(i).cells
        question, target = row_tally(cells, rng)
        written = re.findall(r"row \d: ([a-z ]+)\.", question)
        colour = question.split("How many ")[1].split(" cells")[0]
        steps = re.findall(r"row \d: ([a-z ]+); (\w+) (\d) \((\d+)\)", target)
        assert [row for row, *_ in steps] == written == [" ".join(r) for r in cells]
        running = 0
        for row, named, count, total in steps:
            running += row.split().count(colour)
            assert named == colour and int(count) == row.split().count(colour) and int(total) == running
        assert target.endswith(f" total {running}.") and running > 0  # the colour asked about is present


def test_a_census_counts_every_colour_of_the_grid():
    """The census objective: each colour the image shows, with its count recomputed here from the cells,
    and nothing the grid lacks."""
    from benchmarks.grid import grid_item
    from benchmarks.train_tiny import census

    for i in range(50):
        cells = grid_item(i).cells
        named = dict(part.split() for part in census(cells).rstrip(".").split(", "))
        flat = [c for row in cells for c in row]
        assert named == {c: str(flat.count(c)) for c in set(flat)}


def test_the_mix_reads_first_and_finishes_with_the_finishing_mix():
    from benchmarks.train_tiny import mix_at

    mix, finish = {"reason": 1.0}, {"direct": 1.0}
    seen = [next(iter(mix_at(step, 100, 0.2, mix, finish, 0.25))) for step in range(100)]
    assert seen == ["caption"] * 20 + ["reason"] * 55 + ["direct"] * 25
    assert {next(iter(mix_at(step, 100, 0.2, mix))) for step in range(20, 100)} == {"reason"}  # none by default


def test_the_large_model_finishes_direct_heavy_by_default_and_a_given_mix_runs_to_the_end():
    """The shipped large model's first-stage recipe (benchmarks/LEVERS.md: LF01) is its role's default; the levers'
    recorded `--mix` commands, which had no finish, must still reproduce."""
    from benchmarks.train_tiny import FINISH_MIX, mix_at, role_schedule

    mix, finish, share = role_schedule("large")
    assert mix == MIX["large"] and finish == FINISH_MIX["large"] and share == 0.1
    seen = [mix_at(step, 4000, 0.25, mix, finish, share) for step in range(4000)]
    assert seen[:1000] == [{"caption": 1.0}] * 1000 and seen[1000:3600] == [mix] * 2600
    assert seen[3600:] == [finish] * 400 and finish["direct"] > mix["direct"]
    assert role_schedule("large", {"direct": 1.0})[1] is None
    assert role_schedule("small")[1] is None


def test_a_finishing_share_outside_0_to_1_is_refused(capsys):
    from benchmarks.train_tiny import main

    with pytest.raises(SystemExit):
        main(["--finish-mix", "direct=1", "--finish-share", "1.5", "--steps", "1"])
    assert "a share from 0 to 1" in capsys.readouterr().err


def test_processes_that_cannot_share_a_batch_equally_are_refused_before_training(capsys):
    from benchmarks.train_tiny import main

    for argv in (["--role", "small", "--procs", "3"], ["--role", "large", "--procs", "0"],
                 ["--role", "small", "--procs", "2", "--batch-size", "5"]):
        with pytest.raises(SystemExit):
            main(argv + ["--steps", "1"])
        assert "equal shares" in capsys.readouterr().err


def test_a_mix_names_known_objectives_only():
    import argparse

    from benchmarks.train_tiny import OBJECTIVES, parse_shares

    parse_mix = parse_shares(OBJECTIVES)
    assert parse_mix("direct=0.3, reason=0.5,lookup=0.2") == {"direct": 0.3, "reason": 0.5, "lookup": 0.2}
    with pytest.raises(argparse.ArgumentTypeError, match="known"):
        parse_mix("direct=0.5,thinking=0.5")


def test_reasoning_and_direct_examples_follow_the_tier_mixes_they_are_given():
    from benchmarks.train_tiny import Batcher

    batcher = Batcher("small", None, None, 0, seed=0, reason_tiers={"compose": 1.0}, direct_tiers={"count": 1.0})
    assert all("modulo 10" in batcher.example("reason")[0] for _ in range(20))
    assert all("How many" in batcher.example("direct")[0] for _ in range(20))
    batcher.tiers = {}  # the task's own mix: perceive questions among them
    assert not all("modulo 10" in batcher.example("reason")[0] for _ in range(20))
    assert not all("How many" in batcher.example("direct")[0] for _ in range(20))


def test_the_command_prints_its_help(capsys):
    from benchmarks.train_tiny import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "--reason-tiers" in capsys.readouterr().out


def test_batches_made_in_a_worker_process_are_the_ones_made_inline(tokenizer):
    """The data worker may only move work, never change it: the same batches, in the same order,
    objectives switching where the schedule says, and the items counted."""
    import torch

    from benchmarks.train_tiny import TRAINED_SIZES, Batcher, batch_stream
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


def test_the_answer_only_loss_is_the_full_logits_loss(tokenizer):
    """answer_loss projects only the target positions onto the vocabulary; it must be the same loss."""
    import torch

    from benchmarks.train_tiny import TRAINED_SIZES, Batcher, answer_loss, sequence_mean_loss
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["small"], tokenizer, 0)
    batcher = Batcher("small", tok, processor.image_processor, model.config.image_token_id, seed=3)
    for objective in ("direct", "reason"):
        batcher.mix = {objective: 1.0}
        batch = batcher.batch(4)
        labels = batch.pop("labels")
        full = sequence_mean_loss(model(**batch).logits, labels)
        assert torch.allclose(answer_loss(model, batch, labels), full, atol=1e-5), objective


def test_batched_vision_attention_is_the_models_attention_bit_for_bit(tokenizer):
    """batch_vision_attention stacks a batch's images into one attention call: the visual tokens and
    the gradients must be the model's own exactly (the shipped small model's command reproduces its
    weights only so), and images of several sizes must still take the model's loop."""
    import torch

    from benchmarks.train_tiny import TRAINED_SIZES, Batcher, batch_vision_attention
    from tandem.checkpoints import new_tiny

    model, processor, tok = new_tiny(TRAINED_SIZES["small"], tokenizer, 0)
    fast, _, _ = new_tiny(TRAINED_SIZES["small"], tokenizer, 0)
    batch_vision_attention(fast)
    batcher = Batcher("small", tok, processor.image_processor, model.config.image_token_id, seed=3)
    batch = batcher.batch(3)
    outputs = []
    for m in (model, fast):
        tokens = torch.cat(m.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"]).pooler_output)
        tokens.square().sum().backward()
        outputs.append((tokens, [p.grad for p in m.model.visual.parameters() if p.grad is not None]))
    assert torch.equal(outputs[0][0], outputs[1][0])
    assert len(outputs[0][1]) == len(outputs[1][1]) > 10
    assert all(torch.equal(a, b) for a, b in zip(outputs[0][1], outputs[1][1]))
    attention, own = fast.model.visual.blocks[0].attn, model.model.visual.blocks[0].attn
    hidden = torch.randn(192, attention.dim)
    angles = torch.randn(len(hidden), attention.head_dim)
    cos_sin = (angles.cos(), angles.sin())
    for bounds in ([0, 64, 128, 192], [0, 100, 192]):  # one size: batched; two: the model's loop
        cu = torch.tensor(bounds)
        assert torch.equal(attention(hidden, cu, cos_sin), own(hidden, cu, cos_sin)), bounds


def test_a_schedule_is_checked_before_training(tmp_path, capsys):
    from benchmarks.train_tiny import load_schedule, main

    good = [{"steps": 3, "lr": 1e-3, "mix": {"caption": 1.0}},
            {"steps": 2, "lr": 5e-4, "mix": {"direct": 1.0}, "direct_tiers": {"count": 1.0}}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(good))
    phases = load_schedule(path)
    assert [p["steps"] for p in phases] == [3, 2] and phases[0]["direct_tiers"] is None
    for bad, message in ((good[:1] + [{"steps": 2, "lr": 1e-3, "mix": {"think": 1.0}}], "unknown objectives"),
                         ([{"steps": 2, "lr": 1e-3, "mix": {"direct": 1.0}, "epochs": 2}], "unknown keys"),
                         ([{"steps": 0, "lr": 1e-3, "mix": {"direct": 1.0}}], "needs steps"),
                         ([{"steps": 2, "lr": 1e-3, "mix": {"direct": 1.0}, "reason_tiers": {"hard": 1}}],
                          "unknown tiers"), ([], "non-empty"),
                         ([{"steps": 2, "lr": 1e-3, "mix": {"direct": 1.0}, "trace_kinds": ["carry"]}], "unknown kinds"),
                         ([{"steps": 2, "lr": 1e-3, "mix": {"direct": 1.0}, "trace_heads": {"sum": 1}}], "not \\[layer")):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            load_schedule(path)
    path.write_text(json.dumps(good))
    with pytest.raises(SystemExit):
        main(["--role", "small", "--schedule", str(path), "--steps", "5"])
    assert "drop --steps" in capsys.readouterr().err


def test_a_phase_moves_a_trace_kind_to_another_head_and_teaches_the_kinds_it_names(tmp_path):
    """A phase's `trace_heads` moves the kinds it names and keeps the others where `TRACE_HEADS` puts
    them; without `trace_kinds` a phase teaches the kinds schedules were written for (no `place`)."""
    from benchmarks.train_tiny import TRACE_HEADS, TRACE_KINDS, load_schedule, trace_heads

    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"steps": 2, "lr": 1e-3, "mix": {"reason": 1.0}, "trace_heads": {"sum": [1, 2]}},
                                {"steps": 2, "lr": 1e-3, "mix": {"reason": 1.0}, "trace_kinds": ["place"]}]))
    moved, kept = load_schedule(path)
    assert moved["trace_heads"] == {**TRACE_HEADS, "sum": (1, 2)} and kept["trace_heads"] == TRACE_HEADS
    assert trace_heads({}) == TRACE_HEADS and "place" not in TRACE_KINDS
    assert moved["trace_kinds"] == TRACE_KINDS and kept["trace_kinds"] == ["place"]


def test_an_added_kind_stays_out_of_the_other_kinds_mean():
    """`trace_attention_loss`: the kinds a phase teaches are averaged, the kinds it does not name are
    left out, and `asked` (an any-question's colour) and `verdict` are added beside the mean, so naming
    them leaves every other kind's weight as it was."""
    import torch

    from benchmarks.train_tiny import TRACE_HEADS, trace_attention_loss

    class Probe:  # a head whose loss per kind is a known number: the copies' count times its weight
        def __init__(self, weight):
            self.weight = weight

        def loss(self, rows):
            return torch.tensor(float(len(rows)) * self.weight)

    heads = {"copy": (0, 0), "sum": (0, 1), "addend": (1, 0), "place": (1, 1), "asked": (2, 0), "verdict": (2, 1)}
    tracers = {(0, 0): Probe(1.0), (0, 1): Probe(10.0), (1, 0): Probe(100.0), (1, 1): Probe(1000.0),
               (2, 0): Probe(5.0), (2, 1): Probe(0.5)}
    rows = lambda n: torch.zeros(n, 3, dtype=torch.long)  # noqa: E731
    copies = {"copy": rows(2), "sum": rows(1), "addend": rows(0), "place": None, "asked": rows(3), "verdict": rows(4)}
    assert set(copies) == set(TRACE_HEADS)
    before = {"trace_kinds": ["copy", "sum", "addend", "place"], "trace_heads": heads}
    named = {**before, "trace_kinds": before["trace_kinds"] + ["asked"]}
    mean, added = trace_attention_loss(tracers, before, copies)
    assert mean.item() == (2.0 + 10.0) / 2 and added is None  # no copies of addend or place: not in the mean
    mean, added = trace_attention_loss(tracers, named, copies)
    assert mean.item() == (2.0 + 10.0) / 2 and added.item() == 15.0
    mean, added = trace_attention_loss(tracers, {**named, "trace_kinds": ["asked"]}, copies)
    assert mean is None and added.item() == 15.0
    mean, added = trace_attention_loss(tracers, {**named, "trace_kinds": named["trace_kinds"] + ["verdict"]}, copies)
    assert mean.item() == (2.0 + 10.0) / 2 and added.item() == 15.0 + 2.0


def test_number_tokens_start_on_circles_where_a_sum_modulo_10_is_a_rotation(tokenizer):
    """`init_number_embeddings`: both spellings of a number share the circle dimensions, in the input
    and the output tables; on the period-10 circle, turning a's point by b's angle lands on (a + b) mod
    10's; other tokens and the remaining dimensions keep their random start."""
    import torch

    from benchmarks.train_tiny import NUMBER_PERIODS, TRAINED_SIZES, init_number_embeddings
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, _, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    before = [t.weight.detach().clone() for t in (model.get_input_embeddings(), model.get_output_embeddings())]
    init_number_embeddings(model, tok)
    width = 2 * len(NUMBER_PERIODS)
    word = tok.convert_tokens_to_ids(tok.tokenize(" red"))[0]
    for table, old in zip((model.get_input_embeddings().weight, model.get_output_embeddings().weight), before):
        digit = {text: table[tok.convert_tokens_to_ids(tok.tokenize(text))[0]].detach() for text in
                 [str(d) for d in range(10)] + [f" {d}" for d in range(10)]}
        for d in range(10):
            assert torch.allclose(digit[str(d)][:width], digit[f" {d}"][:width])
            assert not torch.allclose(digit[str(d)][width:], digit[f" {d}"][width:])  # spellings still differ
        point = lambda d: torch.complex(digit[str(d)][0], digit[str(d)][len(NUMBER_PERIODS)])  # noqa: E731
        for a in range(10):
            for b in range(10):
                turned = point(a) * point(b) / abs(point(b))
                assert torch.allclose(turned, point((a + b) % 10), atol=1e-6)
        assert torch.equal(table[word], old[word])


def test_a_chained_run_switches_mix_and_tiers_by_phase_and_cards_every_phase(tmp_path, tokenizer):
    """--schedule: one run from scratch whose phases are what stages were; each phase's batches follow its
    own mix and tiers, and the card and the reproduce command name the schedule (and the batch size,
    where it is not the role's default: without it the command trained another model)."""
    from benchmarks.train_tiny import TRAINED_SIZES, Batcher, batch_stream, phase_of, stage_command, write_card
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
    assert stage_command("small", facts, False) == (f"python -m benchmarks.train_tiny --role small "
                                                    f"--threads {facts['threads']} --batch-size 4 --schedule S.json")


def test_shards_take_disjoint_rows_of_each_batch_with_the_batchs_one_objective(tokenizer, monkeypatch):
    """Data-parallel ranks must train on one batch between them: the same objective, each its own
    share of the batch's item indices, none twice; and one unsharded process its old stream."""
    from benchmarks.train_tiny import TRAINED_SIZES, Batcher
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


def test_averaged_gradients_are_the_whole_batchs_gradient(tmp_path):
    """Two ranks, each on half the rows, average to the gradient (and loss) of all the rows at once."""
    import multiprocessing

    import torch

    from benchmarks.train_tiny import average_gradients, host_store, store_at

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


def test_pointers_name_the_cell_each_colour_word_reads():
    """The supervised attention points a colour word at the cell it reads: wrong cells would teach
    the look-up wrong. Every colour word of a caption, a trace and a colour question's answer."""
    from benchmarks.train_tiny import pointed_cells

    rng = random.Random(0)
    seen = {}
    for i in range(30):
        item = grid_item(train_seed(0, i), tier=("perceive", "count", "compose")[i % 3])
        for objective in ("direct", "reason", "caption"):
            _, target = render_example(item, "large", objective, None, rng)
            points = pointed_cells(item, objective, target)
            for at, (r, c) in points:
                assert target[at:].startswith(item.cells[r - 1][c - 1]), (target, at, r, c)
            seen[objective, item.kind] = seen.get((objective, item.kind), 0) + len(points)
    assert seen["caption", "count"] > 0 and seen["reason", "count"] > 0 and seen["reason", "row_sum"] > 0
    assert seen["direct", "colour_at"] > 0 and seen["direct", "count"] == 0 and seen["direct", "row_sum"] == 0


def test_counted_cells_are_the_cells_each_number_counts():
    from benchmarks.train_tiny import census, counted_cells

    rng = random.Random(1)
    checked = 0
    for i in range(30):
        item = grid_item(train_seed(0, i), tier="count")
        for objective in ("direct", "reason", "census"):
            target = census(item.cells) if objective == "census" else render_example(item, "large", objective, None, rng)[1]
            for at, cells in counted_cells(item, objective, target):
                number = target[at:].split()[0].split("<")[0].rstrip(".,;")
                if item.kind == "any" and objective == "direct":
                    assert number == ("yes" if cells else "no")
                else:
                    assert int(number) == len(cells), (target, at)
                assert len({item.cells[r - 1][c - 1] for r, c in cells}) <= 1
                checked += 1
    assert checked > 60


def test_traced_copies_point_each_copy_at_its_source():
    """A compose step's value points at the question's value for that colour, a count trace's counted
    colour at the question's colour (an any-question's as its own kind, `asked`), a running sum at the
    sum it adds to and at what it adds (the value or the row's count just before it), the total at the last sum, a row or column number at the
    question's (a colour question's, a compose question's row, a cell reading's k-th cell);
    recomputed here from the grid and the question, so a pointer at a wrong word would fail."""
    from benchmarks.grid import line_of
    from benchmarks.train_tiny import cell_reading, row_tally, traced_copies, value_sum

    rng = random.Random(2)
    seen = {"copy": 0, "sum": 0, "place": 0, "compose traces": 0, "count traces": 0, "colour traces": 0,
            "any traces": 0}
    number = lambda text, at: int(re.match(r"\d+", text[at:]).group())  # noqa: E731
    word = lambda text, at: re.match(r"\w+", text[at:]).group()  # noqa: E731
    axis = lambda text, at: re.search(r"(row|column) $", text[:at]).group(1)  # noqa: E731
    for i in range(36):
        item = grid_item(train_seed(0, i), tier=("count", "compose", "perceive")[i % 3])
        trace = render_example(item, "large", "reason", None, rng)
        reading = cell_reading(item.cells, rng)
        for prompt, target in (trace, value_sum(rng), row_tally(item.cells, rng), reading):
            copies = traced_copies(prompt, target)
            copied = [(at, src) for kind, at, in_prompt, src in copies if kind == "copy" and in_prompt]
            sums = [(at, src) for kind, at, in_prompt, src in copies if kind == "sum" and not in_prompt]
            addends = [(at, src) for kind, at, in_prompt, src in copies if kind == "addend" and not in_prompt]
            places = [(at, src) for kind, at, in_prompt, src in copies if kind == "place" and in_prompt]
            asked = [(at, src) for kind, at, in_prompt, src in copies if kind == "asked" and in_prompt]
            assert len(copied) + len(sums) + len(addends) + len(places) + len(asked) == len(copies)
            if item.kind == "any" and target == trace[1]:  # traced as a count, its colour its own kind
                assert [word(prompt, src) for _, src in asked] == [item.target] * len(item.cells) and not copied
                assert all(word(target, at) == item.target for at, _ in asked)
                seen["any traces"] += 1
            else:
                assert not asked
            for at, src in places:  # a row's number read from the question's row, a column's from its column
                assert number(target, at) == number(prompt, src) and axis(target, at) == axis(prompt, src)
            if target == reading[1]:  # the eight cells, each row and column from the k-th asked
                rows, columns = zip(*[(int(r), int(c)) for r, c in re.findall(r"row (\d+), column (\d+)", prompt)])
                assert [number(target, at) for at, _ in places] == [*rows, *columns] and len(places) == 16
            if item.kind == "colour_at" and target == trace[1]:
                assert sorted(number(target, at) for at, _ in places) == sorted(item.target)
                assert [axis(target, at) for at, _ in places] == ["row", "column"]
                seen["colour traces"] += 1
            if item.kind == "row_sum" and target == trace[1]:
                assert [number(target, at) for at, _ in places] == [item.target[0]]
            seen["place"] += len(places)
            # every running sum (the first too) reads what it adds: the number just before it
            assert [at for at, _ in addends] == [m.start(1) for m in re.finditer(r"\((\d+)\)", target)]
            if item.kind == "row_sum" and target == trace[1]:
                read = line_of(item.cells, item.kind, item.target[0])
                assert [number(prompt, src) for _, src in copied] == [dict(item.target[1])[c] for c in read]
                running = [sum(dict(item.target[1])[c] for c in read[:k + 1]) % 10 for k in range(len(read))]
                assert [number(target, at) for at, _ in sums] == running[1:] + running[-1:]
                assert [number(target, src) for _, src in sums] == running
                assert [number(target, src) for _, src in addends] == [dict(item.target[1])[c] for c in read]
                seen["compose traces"] += 1
            if item.kind == "count" and target == trace[1]:
                assert [word(prompt, src) for _, src in copied] == [item.target] * len(item.cells)
                per_row = [row.count(item.target) for row in item.cells]
                running = [sum(per_row[:k + 1]) for k in range(len(per_row))]
                assert [number(target, at) for at, _ in sums] == running[1:] + running[-1:]
                assert [number(target, src) for _, src in sums] == running
                assert [number(target, src) for _, src in addends] == per_row
                seen["count traces"] += 1
            for at, src in copied:  # the word written is the word read
                assert word(target, at) == word(prompt, src)
            for at, src in sums + addends:
                assert src < at
            seen["copy"] += len(copied)
            seen["sum"] += len(sums)
    assert seen["copy"] > 100 and seen["sum"] > 100 and seen["compose traces"] > 5 and seen["count traces"] > 5
    assert seen["colour traces"] > 3 and seen["any traces"] > 0 and seen["place"] > 36 * 16


def test_the_pointer_probe_reads_the_heads_own_attention(tokenizer):
    """PointerProbe recomputes one head's attention from the layer's projections: its loss must be
    minus the log of the weight the model's own (eager) attention gives the pointed key."""
    import torch

    from benchmarks.grid import PALETTE
    from benchmarks.train_tiny import TRAINED_SIZES, Batcher, PointerProbe
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    model.set_attn_implementation("eager")
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=3,
                      direct_tiers={"count": 1.0})
    batcher.attend, batcher.mix = True, {"caption": 1.0}
    pointers = PointerProbe(model, layer=2, head=0)
    counters = PointerProbe(model, layer=2, head=2)
    copiers = PointerProbe(model, layer=3, head=1)
    for mix in ({"caption": 1.0}, {"direct": 1.0}):
        batcher.mix = mix
        batch = batcher.batch(3)
        labels = batch.pop("labels")
        pointed, counted, copied = batch.pop("pointers"), batch.pop("counters"), batch.pop("copies")
        batch.pop("readouts")
        attentions = model(**batch, output_attentions=True).attentions
        for probe, points, layer, head in ((pointers, pointed, 2, 0), (counters, counted, 2, 2), (copiers, copied, 3, 1)):
            for point in points[:5]:
                row, q, k = point[:3].tolist()
                weight = attentions[layer][row, head, q, k]
                assert torch.allclose(probe.loss(point[None, :3]), -weight.log(), atol=1e-4)
    assert len(pointed) == 0 and len(counted) > 0  # direct count questions: counters only
    image = batch["input_ids"][0] == model.config.image_token_id
    assert bool(image[counted[counted[:, 0] == 0][1:, 2]].all())  # counted keys: image tokens after the start
    # A question's count is taken at its colour word, and the answer's position copies it from there.
    assert len(copied) == 3
    for row, answer, colour in copied.tolist():
        assert answer == int((labels[row] != -100).nonzero()[0]) - 1  # predicts the answer's first token
        word = tok.decode(batch["input_ids"][row, colour]).strip()
        assert word in PALETTE and batch["input_ids"][row, :colour].tolist().count(model.config.image_token_id) == 16
        assert set(counted[counted[:, 0] == row][:, 1].tolist()) == {colour}


def test_trace_copy_heads_are_taught_at_the_copied_tokens(tokenizer):
    """In a batch, each copy's query predicts the very token its key holds (the question's value,
    colour, row or column), each sum's keys are the earlier sum's token and the addend just before it; the probes on
    TRACE_HEADS read those heads' own (eager) attention, and the copies' readouts name the copied token."""
    import torch

    from benchmarks.train_tiny import TRACE_HEADS, TRAINED_SIZES, Batcher, PointerProbe
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    model.set_attn_implementation("eager")
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=4,
                      reason_tiers={"count": 0.5, "compose": 0.5})
    batcher.attend = True
    probes = {kind: PointerProbe(model, layer=layer, head=head) for kind, (layer, head) in TRACE_HEADS.items()}
    for mix, tiers in (({"reason": 1.0}, None), ({"lookup": 1.0}, None), ({"reason": 1.0}, {"perceive": 1.0})):
        batcher.mix, batcher.tiers["reason"] = mix, tiers or batcher.tiers["reason"]
        batch = batcher.batch(2)
        labels = batch.pop("labels")
        found = {kind: batch.pop(f"{kind}_copies") for kind in TRACE_HEADS}
        for key in ("pointers", "counters", "copies", "readouts"):
            batch.pop(key)
        for kind in ("copy", "place"):
            said = batch.pop(f"{kind}_readouts")
            assert said.tolist() == [[row, q, int(batch["input_ids"][row, k])] for row, q, k in found[kind].tolist()]
        if tiers:  # colour traces: a row and a column each (an "is there" trace copies none)
            assert len(found["place"]) >= 2 and len(found["place"]) % 2 == 0
        else:
            assert len(found["copy"]) >= 8 and len(found["sum"]) >= 8
        for row, q, k in found["copy"].tolist() + found["place"].tolist() + found["asked"].tolist():
            assert labels[row, q + 1] == batch["input_ids"][row, k] and labels[row, k] == -100  # from the prompt
        assert [k for _, _, k in found["addend"].tolist()] == [q - 1 for _, q, _ in found["addend"].tolist()]
        for row, q, k in found["sum"].tolist():
            assert k < q and labels[row, k] != -100  # an earlier word of the target
            assert tok.decode(batch["input_ids"][row, k]).strip().isdigit()
            assert tok.decode(labels[row, q + 1]).strip().isdigit()
        attentions = model(**batch, output_attentions=True).attentions
        for kind, (layer, head) in TRACE_HEADS.items():
            for point in found[kind][:6]:
                row, q, k = point.tolist()
                weight = attentions[layer][row, head, q, k]
                assert torch.allclose(probes[kind].loss(point[None]), -weight.log(), atol=1e-4)


def test_count_readouts_say_each_count_where_it_is_taken(tokenizer):
    """CountLens teaches the residual stream after the counting layer, where a count is taken, to
    say the count's number: a question's at its colour word (where the copy head reads), a census
    entry's at its colour word (the position that predicts the number). Its loss must be the
    cross-entropy of that layer's output read through the model's own final norm and vocabulary."""
    import torch
    import torch.nn.functional as F

    from benchmarks.train_tiny import COUNT_LAYER, TRAINED_SIZES, Batcher, CountLens
    from tandem.checkpoints import new_tiny

    torch.manual_seed(0)
    model, processor, tok = new_tiny(TRAINED_SIZES["large"], tokenizer, 0)
    batcher = Batcher("large", tok, processor.image_processor, model.config.image_token_id, seed=5,
                      direct_tiers={"count": 1.0})
    batcher.attend = True
    lens = CountLens(model)
    for mix in ({"direct": 1.0}, {"census": 1.0}):
        batcher.mix = mix
        batch = batcher.batch(3)
        labels, readouts, counted, copied = (batch.pop(k) for k in ("labels", "readouts", "counters", "copies"))
        batch.pop("pointers")
        hidden = model.model(**batch, output_hidden_states=True).hidden_states[COUNT_LAYER + 1]
        assert len(readouts) > 0
        # One readout per count, at the counting head's query, its token the number the target says there.
        assert sorted(map(tuple, readouts[:, :2].tolist())) == sorted(set(map(tuple, counted[:, :2].tolist())))
        for row, at, token in readouts.tolist():
            if mix == {"direct": 1.0}:
                assert at == [c for r, _, c in copied.tolist() if r == row][0]  # the question's colour word
                assert token == labels[row][labels[row] != -100][0]  # the answer's number
            else:
                assert token == labels[row, at + 1]  # the census's number after its colour word
            assert tok.decode([token]).strip().isdigit()
        expected = F.cross_entropy(model.lm_head(model.model.language_model.norm(hidden[readouts[:, 0], readouts[:, 1]])),
                                   readouts[:, 2])
        assert torch.allclose(lens.loss(readouts), expected, atol=1e-5)


def test_computed_numbers_are_the_sums_and_row_counts_and_weigh_as_a_phase_says(tokenizer):
    """Each weighted position predicts a number the target computes — a running sum, the total, a count
    trace's row count — recomputed here from the text; a weight of 1 is the plain loss, and a weight w
    scales exactly those tokens' losses within their sequence's mean."""
    import torch
    import torch.nn.functional as F

    from benchmarks.train_tiny import TRAINED_SIZES, Batcher, answer_loss
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
    from benchmarks.train_tiny import EOS, TRAINED_SIZES, Batcher, load_schedule
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
    from benchmarks.grid import corrupt_trace
    from benchmarks.train_tiny import CONCLUSION, TRAINED_SIZES, Batcher, answer_text, concluded
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
