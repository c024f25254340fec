"""Routing controls: one policy table that config, model ids and the pipeline read; a policy's
parameter in the model name; per-request reasoning and latency budgets, and the budget decision
made from injected stage estimates. Fake engines stand in for models; the pipeline, prompts and
decisions are the real ones."""

import json
import math
import typing

import pytest

from tandem.budget import Estimate, StageEstimates, plan_reasoning
from tandem.config import PolicyConfig, load_tandem_config
from tandem.errors import BadRequest, NotFound
from tandem.openai_api import models_list, parse_chat_request
from tandem.policies import POLICIES, POLICY_NAMES, decide_confidence_mutual
from tandem.prompts import TRANSFER_HEADER

from tests.core.test_pipeline import ask, make, prompts_sent

CFG = load_tandem_config({"limits": {"reasoning_max_tokens": 64}})


def body(model="tandem", **kw) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **kw}).encode()


# --- the table --------------------------------------------------------------------------------------
def test_config_model_ids_and_pipeline_read_one_table():
    assert set(typing.get_args(PolicyConfig.model_fields["default"].annotation)) == set(POLICIES)
    listed = {m["id"]: m["tandem"] for m in models_list(CFG)["data"]}
    assert set(listed) == {"tandem"} | {f"tandem:{p}" for p in POLICY_NAMES}
    assert listed["tandem:confidence"]["parameter"] == {
        "name": "threshold", "min": 0.0, "max": 1.0, "default": 0.5, "example": "tandem:confidence@0.5",
        "description": POLICIES["confidence"].param.description}
    assert "parameter" not in listed["tandem:mutual"]
    for param in (p.param for p in POLICIES.values() if p.param):  # every default lives in PolicyConfig
        assert param.config_field in PolicyConfig.model_fields


@pytest.mark.parametrize("model, policy, param", [
    ("tandem", "mutual", None), ("tandem:confidence", "confidence", None),
    ("tandem:confidence@0.35", "confidence", 0.35), ("tandem:random@0", "random", 0.0),
    ("tandem:random@1.0", "random", 1.0), ("tandem:confidence_mutual@0.2", "confidence_mutual", 0.2)])
def test_a_policy_parameter_rides_in_the_model_name(model, policy, param):
    ask_ = parse_chat_request(body(model), CFG).ask
    assert (ask_.policy, ask_.policy_param) == (policy, param)


@pytest.mark.parametrize("model, error, fragment", [
    ("tandem:confidence@1.5", BadRequest, "threshold must be a number from 0 to 1"),
    ("tandem:confidence@abc", BadRequest, "threshold"), ("tandem:confidence@nan", BadRequest, "threshold"),
    ("tandem:random@-0.1", BadRequest, "random's p must be"),
    ("tandem:mutual@0.3", BadRequest, "takes no parameter"), ("tandem:nope@0.3", NotFound, "does not exist"),
    ("tandem:@0.3", NotFound, "does not exist")])
def test_bad_parameters_are_a_400_naming_them(model, error, fragment):
    with pytest.raises(error, match=fragment) as err:
        parse_chat_request(body(model), CFG)
    assert err.value.param == "model"


@pytest.mark.parametrize("logprob, threshold, path", [(math.log(0.9), 0.35, "large"), (math.log(0.3), 0.35, "transfer"),
                                                      (math.log(0.9), 0.95, "transfer")])
async def test_the_parameter_is_the_one_used_and_echoed(logprob, threshold, path):
    pipeline, _ = make(large_logprob=logprob)
    result = await ask(pipeline, "confidence", policy_param=threshold)
    assert result.path == path
    assert result.trace()["params"] == {"threshold": threshold}
    assert result.decision.inputs["threshold"] == threshold


async def test_without_a_parameter_the_config_default_is_used():
    pipeline, _ = make(load_tandem_config({"policy": {"confidence_threshold": 0.95}}), large_logprob=math.log(0.9))
    result = await ask(pipeline, "confidence")
    assert (result.path, result.trace()["params"]) == ("transfer", {"threshold": 0.95})


# --- confidence_mutual ---------------------------------------------------------------------------------
@pytest.mark.parametrize("small, large, p, transfer, reason", [
    ("A", "B", 0.99, True, "answers disagree"), ("A", "A", 0.99, False, "agree, confident"),
    ("A", "A", 0.1, True, "agree, low confidence")])
def test_confidence_mutual_decision(small, large, p, transfer, reason):
    d = decide_confidence_mutual(small, large, [math.log(p)], 0.5)
    assert (d.transfer, d.reason) == (transfer, reason)
    assert d.inputs["agree"] == (small == large) and d.inputs["confidence"] == pytest.approx(p)


async def test_confidence_mutual_transfers_an_unsure_agreement():
    pipeline, eng = make(small="A", large="A", large_logprob=math.log(0.2))
    result = await ask(pipeline, "confidence_mutual", policy_param=0.5)
    assert result.path == "transfer" and result.decision.reason == "agree, low confidence"
    sure, _ = make(small="A", large="A", large_logprob=math.log(0.9))
    assert (await ask(sure, "confidence_mutual")).path == "agree"


# --- reasoning budget per request ----------------------------------------------------------------------
def test_reasoning_max_tokens_is_bounded_by_the_config():
    assert parse_chat_request(body(tandem={"reasoning_max_tokens": 16}), CFG).ask.reasoning_max_tokens == 16
    for bad, fragment in ((65, "from 1 to 64"), (0, "from 1 to 64"), (2.5, "must be an integer"),
                          ("16", "must be an integer")):
        with pytest.raises(BadRequest, match=fragment) as err:
            parse_chat_request(body(tandem={"reasoning_max_tokens": bad}), CFG)
        assert err.value.param == "tandem.reasoning_max_tokens"


async def test_reasoning_max_tokens_caps_the_reasoning_sent_downstream():
    pipeline, eng = make(CFG, small="A", large="B", reasoning=" ".join(f"w{i}" for i in range(40)))
    result = await ask(pipeline, "always", reasoning_max_tokens=16)
    assert eng["small"].batches[0][0].sampling.max_tokens == 16
    assert result.tokens["small_reasoning"] <= 16 and result.transferred_tokens <= 16


# --- latency budget per request -------------------------------------------------------------------------
def test_latency_budget_is_checked_at_the_ingress():
    assert parse_chat_request(body(tandem={"latency_budget_ms": 800}), CFG).ask.latency_budget_ms == 800.0
    for bad, fragment in ((0, "above 0"), (-5, "above 0"), (1e9, "at most 120000"), ("fast", "milliseconds")):
        with pytest.raises(BadRequest, match=fragment):
            parse_chat_request(body(tandem={"latency_budget_ms": bad}), CFG)


REASONING = Estimate(fixed_ms=10, per_token_ms=2)
ANSWER = Estimate(fixed_ms=5, per_token_ms=0)


@pytest.mark.parametrize("budget, elapsed, action, tokens", [
    (200, 0, "full", 64),          # 10 + 2 x 64 + 5 = 143 fits
    (100, 0, "shortened", 42),     # (100 - 15) / 2 = 42.5
    (100, 40, "shortened", 22),    # what stage 1 took is spent
    (30, 0, "direct", None),       # (30 - 15) / 2 = 7 < 8
    (10, 0, "direct", None)])
def test_plan_reasoning(budget, elapsed, action, tokens):
    plan = plan_reasoning(budget, elapsed, 64, 8, REASONING, [ANSWER])
    assert (plan.action, plan.reasoning_max_tokens) == (action, tokens)
    if tokens:
        assert plan.predicted_ms <= budget


def test_plan_keeps_a_margin_of_the_paths_jitter():
    jittery = [Estimate(10, 2, dev_ms=3), Estimate(5, 0, dev_ms=4)]  # path deviation 5 ms: margin 10 ms
    plan = plan_reasoning(100, 0, 64, 8, jittery[0], jittery[1:])
    assert (plan.action, plan.reasoning_max_tokens) == ("shortened", 37)  # (100 - 15 - 10) / 2


def test_plan_without_estimates_runs_as_without_a_budget():
    assert plan_reasoning(50, 0, 64, 8, None, [ANSWER]).action == "no_estimate"
    assert plan_reasoning(50, 0, 64, 8, REASONING, [None]).reasoning_max_tokens == 64


def test_estimates_follow_the_measurements_and_their_jitter():
    est = StageEstimates()
    est.observe("small_reasoning", 10 + 2 * 30, tokens=30, per_token_ms=2)
    assert est.get("small_reasoning").ms(50) == pytest.approx(110)
    for latency in (70, 90, 70, 90):  # jitter around the same work: a deviation, same mean
        est.observe("small_reasoning", latency, tokens=30, per_token_ms=2)
    e = est.get("small_reasoning")
    assert 5 < e.dev_ms < 15 and 10 <= e.fixed_ms < 20
    for _ in range(40):  # a slower machine: the per-token rate follows
        est.observe("small_reasoning", 10 + 4 * 30, tokens=30, per_token_ms=4)
    assert est.get("small_reasoning").per_token_ms == pytest.approx(4, rel=0.05)


def injected(pipeline, **stages):
    for name, (fixed, per_token) in stages.items():
        pipeline.estimates.stages[name] = Estimate(fixed, per_token)


ESTIMATES = dict(encode_small=(5, 0), encode_large=(5, 0), small_reasoning=(10, 1), large_transfer=(10, 0),
                 large_direct=(10, 0), small_answer=(5, 0))


@pytest.mark.parametrize("budget, path, action, cap", [
    (10_000, "transfer", "full", 64), (60, "transfer", "shortened", 35), (20, "large", "direct", None)])
async def test_a_latency_budget_shortens_or_skips_the_transfer(budget, path, action, cap):
    pipeline, eng = make(CFG, small="A", large="B", reasoning=" ".join(f"w{i}" for i in range(40)))
    pipeline.clock = lambda: 0.0  # no time passes: the plan is the estimates' arithmetic alone
    injected(pipeline, **ESTIMATES)
    result = await ask(pipeline, "always", latency_budget_ms=budget)
    budget_trace = result.trace()["budget"]
    assert (result.path, budget_trace["action"], budget_trace["reasoning_max_tokens"]) == (path, action, cap)
    assert budget_trace["latency_budget_ms"] == budget and "actual_ms" in budget_trace
    reasoning_calls = [r for b in eng["small"].batches for r in b if r.prompt.endswith("<think>\n")]
    if cap is None:
        assert reasoning_calls == [] and TRANSFER_HEADER not in "".join(prompts_sent(eng["large"]))
    else:
        assert [r.sampling.max_tokens for r in reasoning_calls] == [cap]
        # 60 ms: 5 encode + 10 reasoning + 10 transfer around it, 1 ms a token: 35 fit
        assert budget_trace["predicted_ms"] <= budget


async def test_mutual_under_a_budget_answers_with_stage_one_when_no_reasoning_fits():
    pipeline, eng = make(CFG, small="A", large="B")
    injected(pipeline, **ESTIMATES)
    result = await ask(pipeline, "mutual", latency_budget_ms=20)
    assert (result.path, result.answer, result.trace()["budget"]["action"]) == ("large", "B", "direct")
    assert result.decision.reason == "answers disagree"
    assert len(prompts_sent(eng["large"])) == 1  # the stage-1 answer is the answer: no second call


async def test_the_first_request_on_a_replica_runs_unconstrained_and_teaches_the_estimates():
    pipeline, _ = make(CFG, small="A", large="B")
    first = await ask(pipeline, "always", latency_budget_ms=1)
    assert first.path == "transfer" and first.trace()["budget"]["action"] == "no_estimate"
    assert {"small_reasoning", "large_transfer", "encode_small"} <= set(pipeline.estimates.stages)


async def test_small_policy_under_a_tight_budget_answers_directly():
    pipeline, eng = make(CFG, small="A", large="B")
    injected(pipeline, **ESTIMATES, small_direct=(5, 0))
    pipeline.estimates.stages["small_answer"] = Estimate(5, 0)
    result = await ask(pipeline, "small", latency_budget_ms=15)
    assert result.path == "small_direct" and set(result.tokens) == {"small_direct"}


@pytest.mark.parametrize("field,value", [("confidence_threshold", 1.5), ("random_transfer_p", -0.1)])
def test_a_configured_default_outside_its_policys_bounds_is_refused(field, value):
    from tandem.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        load_tandem_config({"policy": {field: value}})
