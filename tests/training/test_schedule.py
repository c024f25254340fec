"""Recipes and the command line: mixes by step, phases checked before the first step, flags refused early."""

import json

import pytest

from training.examples import build_task_tokenizer
from training.schedule import MIX


@pytest.fixture(scope="module")
def tokenizer():
    return build_task_tokenizer(0)


def test_the_mix_reads_first_and_finishes_with_the_finishing_mix():
    from training.schedule import mix_at

    mix, finish = {"reason": 1.0}, {"direct": 1.0}
    seen = [next(iter(mix_at(step, 100, 0.2, mix, finish, 0.25))) for step in range(100)]
    assert seen == ["caption"] * 20 + ["reason"] * 55 + ["direct"] * 25
    assert {next(iter(mix_at(step, 100, 0.2, mix))) for step in range(20, 100)} == {"reason"}  # none by default


def test_the_large_model_finishes_direct_heavy_by_default_and_a_given_mix_runs_to_the_end():
    """Without a recipe the large model finishes direct-heavy (its role's default); an explicit `--mix`
    runs to the end, with no finish."""
    from training.schedule import FINISH_MIX, mix_at, role_schedule

    mix, finish, share = role_schedule("large")
    assert mix == MIX["large"] and finish == FINISH_MIX["large"] and share == 0.1
    seen = [mix_at(step, 4000, 0.25, mix, finish, share) for step in range(4000)]
    assert seen[:1000] == [{"caption": 1.0}] * 1000 and seen[1000:3600] == [mix] * 2600
    assert seen[3600:] == [finish] * 400 and finish["direct"] > mix["direct"]
    assert role_schedule("large", {"direct": 1.0})[1] is None
    assert role_schedule("small")[1] is None


def test_a_finishing_share_outside_0_to_1_is_refused(capsys):
    from training.train import main

    with pytest.raises(SystemExit):
        main(["--finish-mix", "direct=1", "--finish-share", "1.5", "--steps", "1"])
    assert "a share from 0 to 1" in capsys.readouterr().err


def test_processes_that_cannot_share_a_batch_equally_are_refused_before_training(capsys):
    from training.train import main

    for argv in (["--role", "small", "--procs", "3"], ["--role", "large", "--procs", "0"],
                 ["--role", "small", "--procs", "2", "--batch-size", "5"]):
        with pytest.raises(SystemExit):
            main(argv + ["--steps", "1"])
        assert "equal shares" in capsys.readouterr().err


def test_a_mix_names_known_objectives_only():
    import argparse

    from training.schedule import OBJECTIVES

    from training.train import parse_shares

    parse_mix = parse_shares(OBJECTIVES)
    assert parse_mix("direct=0.3, reason=0.5,lookup=0.2") == {"direct": 0.3, "reason": 0.5, "lookup": 0.2}
    with pytest.raises(argparse.ArgumentTypeError, match="known"):
        parse_mix("direct=0.5,thinking=0.5")


def test_the_command_prints_its_help(capsys):
    from training.train import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "--reason-tiers" in capsys.readouterr().out


def test_a_schedule_is_checked_before_training(tmp_path, capsys):
    from training.schedule import load_schedule
    from training.train import main

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
    from training.objectives import TRACE_HEADS, TRACE_KINDS
    from training.schedule import load_schedule, trace_heads

    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"steps": 2, "lr": 1e-3, "mix": {"reason": 1.0}, "trace_heads": {"sum": [1, 2]}},
                                {"steps": 2, "lr": 1e-3, "mix": {"reason": 1.0}, "trace_kinds": ["place"]}]))
    moved, kept = load_schedule(path)
    assert moved["trace_heads"] == {**TRACE_HEADS, "sum": (1, 2)} and kept["trace_heads"] == TRACE_HEADS
    assert trace_heads({}) == TRACE_HEADS and "place" not in TRACE_KINDS
    assert moved["trace_kinds"] == TRACE_KINDS and kept["trace_kinds"] == ["place"]
