"""The shipped trained pair (tandem/trained/): loads like any checkpoint, was trained on today's
prompt templates, and answers held-out grid items well above chance through Tandem's own pipeline.
A prompt edit without a retrain, or a broken checkpoint, fails here instead of in a user's demo."""

import json

import pytest

from tasks.grid import grid_items
from benchmarks.strategies import is_correct
from tandem import prompts
from tandem.checkpoints import TRAINED_DIR, TRAINED_ROLES, resolve_model_ref
from tandem.config import TandemConfig
from tandem.schemas import AskRequest

# Chance on this slice is about 29 % (A-D questions, two-option yes/no ones). The floors sit ten
# points or more below what the pair measured on 400 held-out items (model cards: small 97.5 %,
# always 96.0 %, large 75.7 %), so they catch a broken or a much worse pair, not noise.
FLOORS = {"small": 0.85, "always": 0.85, "large": 0.65}


@pytest.mark.parametrize("role", TRAINED_ROLES)
def test_trained_on_todays_prompts(role):
    """Prompts and weights are one contract: a changed template needs a retrain."""
    facts = json.loads((TRAINED_DIR / role / "training.json").read_text())
    assert facts["prompt_fingerprint"] == prompts.template_fingerprint(), \
        "tandem/prompts.py changed since the pair was trained: run python -m training.train"


def test_unknown_trained_role_is_refused():
    with pytest.raises(ValueError, match="trained:small, trained:large"):
        resolve_model_ref("trained:medium")


@pytest.mark.parametrize("role", TRAINED_ROLES)
def test_checkpoint_is_small_and_carded(role):
    folder = TRAINED_DIR / role
    assert resolve_model_ref(f"trained:{role}") == str(folder)
    assert sum(f.stat().st_size for f in folder.iterdir()) < 20 * 2**20
    card = (folder / "README.md").read_text()
    assert "## Accuracy" in card and prompts.template_fingerprint() in card


@pytest.fixture(scope="module")
def tandem():
    from tandem.local import LocalTandem

    return LocalTandem(TandemConfig())


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(FLOORS))
def test_accuracy_floor_on_held_out_items(tandem, policy):
    items = grid_items(100, seed=0, split="eval")
    results = [tandem.ask(AskRequest(question=it.prompt(), images=[it.image], policy=policy)) for it in items]
    acc = sum(is_correct(r.answer, it) for r, it in zip(results, items)) / len(items)
    assert acc >= FLOORS[policy], f"{policy}: {acc:.0%} on 100 held-out items"
    assert {r.path for r in results} == {"large": {"large"}, "small": {"small"}, "always": {"transfer"}}[policy]


def test_the_training_script_still_builds_each_shipped_tokenizer_or_the_card_says_where():
    """A change to the task's text stream changes the tokenizer (and every batch) the script makes:
    a checkpoint trained before such a change must say at which commit it reproduces. (The small
    model's card does: 8877ead changed the stream without a retrain, and nothing caught it.)"""
    from training.examples import build_task_tokenizer
    from training.card import stage_chain

    built = json.loads(build_task_tokenizer(0).backend_tokenizer.to_str())["model"]
    for role in TRAINED_ROLES:
        facts = json.loads((TRAINED_DIR / role / "training.json").read_text())
        facts = stage_chain(facts)[0]  # trained in stages: the tokenizer is the first stage's
        shipped = json.loads((TRAINED_DIR / role / "tokenizer.json").read_text())["model"]
        if facts.get("code_commit"):
            assert facts["code_commit"] in (TRAINED_DIR / role / "README.md").read_text()
        else:
            assert shipped == built, f"{role}: the script no longer builds this tokenizer; retrain or pin the commit"
