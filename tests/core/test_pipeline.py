"""Orchestration with fake engines: which path each policy takes, what each stage was sent, that
images are encoded once per model, and that independent stages overlap. Fakes stand in for models
only; the pipeline, prompts, selector and decisions are the real ones."""

import asyncio

import pytest

from tandem.config import TandemConfig, load_tandem_config
from tandem.engines.fake import FakeEngine
from tandem.errors import FeaturesLost, NotFound
from tandem.local import local_stages
from tandem.pipeline import SMALL_FAILED, Pipeline, Stages
from tandem.prompts import TRANSFER_HEADER
from tandem.schemas import AskRequest, GenerationOutput

from tests.conftest import make_png


def rule(direct_answer, reasoning="I see four legs so four"):
    def answer(prompt):
        if prompt.endswith("<think>\n") or "Think step by step" in prompt:
            return reasoning
        return direct_answer
    return answer


def make(config=None, small="A", large="A", large_logprob=-0.1, **small_kw):
    engines = {"small": FakeEngine("small", rule(small, **small_kw)),
               "large": FakeEngine("large", rule(large), logprob=large_logprob)}
    return Pipeline(config or TandemConfig(), local_stages(engines)), engines


def prompts_sent(engine):
    return [r.prompt for batch in engine.batches for r in batch]


IMAGES = [make_png(0), make_png(1)]


async def ask(pipeline, policy, images=IMAGES, **kw):
    return await pipeline.answer(AskRequest(question="How many legs?", images=images, policy=policy, **kw))


async def test_mutual_agreement_returns_large_answer_without_transfer():
    pipeline, eng = make(small="B", large="The answer is B.")
    result = await ask(pipeline, "mutual")
    assert (result.path, result.answer, result.agreement) == ("agree", "The answer is B.", True)
    assert len(prompts_sent(eng["small"])) == 1 and len(prompts_sent(eng["large"])) == 1
    assert result.transferred_tokens == 0 and set(result.tokens) == {"small_direct", "large_direct"}


async def test_mutual_disagreement_transfers_small_reasoning_into_large_prompt():
    pipeline, eng = make(small="A", large="B", reasoning="legs are four so D")
    result = await ask(pipeline, "mutual")
    assert (result.path, result.agreement) == ("transfer", False)
    small_prompts, large_prompts = prompts_sent(eng["small"]), prompts_sent(eng["large"])
    assert len(small_prompts) == 2 and small_prompts[1].endswith("<think>\n")  # direct, then reasoning
    assert len(large_prompts) == 2
    assert TRANSFER_HEADER in large_prompts[1] and "legs are four so D" in large_prompts[1]
    assert TRANSFER_HEADER not in large_prompts[0]
    assert result.transferred_tokens == 5
    assert set(result.tokens) == {"small_direct", "large_direct", "small_reasoning", "large_transfer"}


async def test_each_image_encoded_once_per_model_even_when_large_runs_twice():
    pipeline, eng = make(small="A", large="B")
    result = await ask(pipeline, "mutual")
    assert result.path == "transfer"
    assert eng["small"].encoded == eng["large"].encoded == [e for e in _digests(IMAGES)]
    assert result.images_encoded == {"small": 2, "large": 2}
    # and the features sent with every call are those of the model called
    for role in ("small", "large"):
        for batch in eng[role].batches:
            assert [f.model for f in batch[0].images] == [role, role]


def _digests(images):
    from tandem.images import image_digest
    return [image_digest(b) for b in images]


@pytest.mark.parametrize("policy, path, small_calls, large_calls", [
    ("large", "large", 0, 1), ("small", "small", 2, 0), ("large_reasoning", "large_reasoning", 0, 2),
    ("always", "transfer", 1, 1),
])
async def test_fixed_policies_take_their_path(policy, path, small_calls, large_calls):
    pipeline, eng = make(small="A", large="B")
    result = await ask(pipeline, policy)
    assert result.path == path and result.policy == policy
    assert len(prompts_sent(eng["small"])) == small_calls and len(prompts_sent(eng["large"])) == large_calls
    encoded = {role: len(eng[role].encoded) for role in eng}
    assert encoded == {"small": 2 * (small_calls > 0), "large": 2 * (large_calls > 0)}


async def test_large_reasoning_continues_its_own_reasoning():
    pipeline, eng = make(small="A", large="B")
    await ask(pipeline, "large_reasoning")
    first, second = prompts_sent(eng["large"])
    assert "Think step by step" in first and second.startswith(first) and second.endswith("\nAnswer:")


@pytest.mark.parametrize("logprob, path", [(-0.01, "large"), (-5.0, "transfer")])
async def test_confidence_paths(logprob, path):
    pipeline, eng = make(large_logprob=logprob)
    result = await ask(pipeline, "confidence")
    assert result.path == path
    assert result.decision.inputs["threshold"] == 0.5
    assert len(eng["small"].encoded) == (2 if path == "transfer" else 0)  # small encoded only when needed


@pytest.mark.parametrize("p, path", [(0.0, "large"), (1.0, "transfer")])
async def test_random_policy_extremes(p, path):
    pipeline, _ = make(load_tandem_config({"policy": {"random_transfer_p": p}}))
    assert (await ask(pipeline, "random")).path == path


async def test_budget_selector_bounds_transferred_tokens():
    cfg = load_tandem_config({"selector": {"kind": "budget", "budget_tokens": 6}})
    pipeline, eng = make(cfg, small="A", large="B", reasoning=" ".join(f"w{i}" for i in range(40)))
    result = await ask(pipeline, "always")
    assert result.transferred_tokens == 6
    transfer_prompt = prompts_sent(eng["large"])[0]
    assert "w0 w1 w2" in transfer_prompt and "w37 w38 w39" in transfer_prompt and "w20" not in transfer_prompt


async def test_max_tokens_reaches_the_answer_stage_only():
    cfg = load_tandem_config({"limits": {"reasoning_max_tokens": 50}})
    pipeline, eng = make(cfg, small="A", large="B")
    await ask(pipeline, "always", max_tokens=3)
    assert eng["small"].batches[0][0].sampling.max_tokens == 50
    assert eng["large"].batches[0][0].sampling.max_tokens == 3


async def test_no_images_means_no_encoding():
    pipeline, eng = make()
    result = await ask(pipeline, "mutual", images=[])
    assert eng["small"].encoded == [] and result.images_encoded == {}
    assert "<|image_pad|>" not in prompts_sent(eng["large"])[0]


async def test_unknown_policy_is_not_found():
    pipeline, _ = make()
    with pytest.raises(NotFound, match="unknown policy 'best'"):
        await ask(pipeline, "best")


def _gated_stages(log, gate_roles=("small", "large")):
    """Stages whose direct calls only finish once both have started: sequential calls would hang."""
    started = {r: asyncio.Event() for r in gate_roles}

    async def encode(images, role):
        log.append(("encode", role))
        return FakeEngine(role).encode_images(images, role)

    def generate_for(role):
        async def generate(request, sink=None):
            reasoning = request.prompt.endswith("<think>\n")
            log.append((role, "reasoning" if reasoning else "direct"))
            if reasoning:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    log.append((role, "cancelled"))
                    raise
            else:
                started[role].set()
                await asyncio.wait_for(started["large" if role == "small" else "small"].wait(), 2)
            return GenerationOutput("A", [1], ["A"], [-0.1], 10, 1, "stop", 1.0, 1.0)
        return generate

    return Stages(encode=encode, small=generate_for("small"), large=generate_for("large"))


async def test_mutual_stage_one_runs_both_models_concurrently_and_cancels_speculation_on_agreement():
    log = []
    cfg = load_tandem_config({"policy": {"speculative": True}})
    result = await Pipeline(cfg, _gated_stages(log)).answer(
        AskRequest(question="Q?", images=IMAGES, policy="mutual"))
    await asyncio.sleep(0.05)  # let the cancellation reach the stage
    assert result.path == "agree" and result.decision.inputs["speculative"] is True
    assert ("small", "reasoning") in log and ("small", "cancelled") in log
    assert log.count(("encode", "small")) == 1 and log.count(("encode", "large")) == 1


class Failing(FakeEngine):
    def prepare(self, request):
        raise RuntimeError("replica died")


def make_failing_small(config=None):
    engines = {"small": Failing("small"), "large": FakeEngine("large", rule("B"))}
    return Pipeline(config or TandemConfig(), local_stages(engines)), engines


@pytest.mark.parametrize("policy", ["mutual", "always", "small", "confidence"])
async def test_small_failure_degrades_to_the_large_model(policy):
    cfg = load_tandem_config({"policy": {"confidence_threshold": 1.0}})  # confidence always transfers
    pipeline, eng = make_failing_small(cfg)
    result = await ask(pipeline, policy)
    assert (result.path, result.degraded, result.answer) == ("large", True, "B")
    assert result.decision.reason == SMALL_FAILED  # fixed: a failure's text can carry a replica's traceback
    assert result.trace()["degraded"] is True
    assert len(prompts_sent(eng["large"])) == 1  # mutual reuses its stage-1 large answer


async def test_small_failure_fails_the_request_when_configured():
    pipeline, _ = make_failing_small(load_tandem_config({"policy": {"on_small_failure": "fail"}}))
    with pytest.raises(RuntimeError, match="replica died"):
        await ask(pipeline, "mutual")


async def test_large_failure_is_not_masked():
    engines = {"small": FakeEngine("small", rule("A")), "large": Failing("large")}
    with pytest.raises(RuntimeError, match="replica died"):
        await ask(Pipeline(TandemConfig(), local_stages(engines)), "mutual")


async def test_a_slow_stage_times_out_naming_the_stage():
    from tandem.errors import StageTimeout
    cfg = load_tandem_config({"limits": {"stage_timeout_s": 0.05}, "policy": {"on_small_failure": "fail"}})
    engines = {"small": FakeEngine("small", rule("A")), "large": FakeEngine("large", rule("B"), delay_s=0.5)}
    with pytest.raises(StageTimeout, match="stage 'large_direct' exceeded") as err:
        # No image: on a loaded machine encoding alone can outlast a 50 ms deadline and be named instead.
        await ask(Pipeline(cfg, local_stages(engines)), "large", images=[])
    assert err.value.status == 504


async def test_a_slow_small_stage_degrades_under_its_deadline():
    cfg = load_tandem_config({"limits": {"stage_timeout_s": 0.1}})
    engines = {"small": FakeEngine("small", rule("A"), delay_s=1.0), "large": FakeEngine("large", rule("B"))}
    result = await ask(Pipeline(cfg, local_stages(engines)), "mutual")
    assert result.degraded and result.decision.reason == SMALL_FAILED


async def test_attention_selector_transfers_what_the_small_answer_attended_to():
    cfg = load_tandem_config({"selector": {"kind": "attention", "budget_tokens": 4, "span_tokens": 2}})
    reasoning = "look at the image count 3 and 4 so maybe the end"
    pipeline, eng = make(cfg, small="A", large="B", reasoning=reasoning)
    result = await ask(pipeline, "always")
    answer_request = eng["small"].batches[1][0]
    assert answer_request.attend_to == reasoning and answer_request.prompt.endswith("</think>\n\n")
    excerpt = prompts_sent(eng["large"])[0]
    assert "count 3" in excerpt and "and 4" in excerpt and "look at" not in excerpt
    assert result.transferred_tokens == 4 and "small_answer" in result.tokens


@pytest.mark.parametrize("temperature", [None, 0.3])
async def test_reasoning_samples_as_its_model_says_unless_the_request_sets_a_temperature(temperature):
    pipeline, eng = make(small="A", large="B")
    await ask(pipeline, "mutual", temperature=temperature)
    sent = {r.prompt: r.sampling for e in eng.values() for batch in e.batches for r in batch}
    reasoning = [s for p, s in sent.items() if p.endswith("<think>\n")]
    answers = [s for p, s in sent.items() if not p.endswith("<think>\n")]
    assert reasoning and answers
    if temperature is None:  # answers greedy; the reasoning defers to the checkpoint's generation_config
        assert all(s.model_defaults and s.temperature == 0 for s in reasoning)
        assert all(not s.model_defaults and s.temperature == 0 for s in answers)
    else:  # the request's temperature, on every stage
        assert all(not s.model_defaults and s.temperature == 0.3 for s in reasoning + answers)


def _losing(stages: Stages, role: str, times: int) -> tuple[Stages, list]:
    """`role`'s stage fails `times` times as a model server does when the features' owner is gone."""
    calls = []
    inner = getattr(stages, role)

    async def generate(request, sink=None):
        calls.append(request.images)
        if len(calls) <= times:
            raise FeaturesLost("image features are lost (OwnerDiedError)")
        return await inner(request, sink)
    return Stages(encode=stages.encode, **{r: generate if r == role else getattr(stages, r) for r in ("small", "large")}), calls


async def test_lost_features_are_encoded_again_once_and_the_stage_retried():
    pipeline, eng = make(small="A", large="A")
    pipeline.stages, calls = _losing(pipeline.stages, "large", times=1)
    result = await ask(pipeline, "large")
    assert result.answer == "A" and len(calls) == 2
    assert result.images_encoded["large"] == 2 * len(IMAGES)  # encoded again for the retry
    assert calls[0] is not calls[1]                           # the retry carries the new features


async def test_features_lost_twice_fail_the_request_with_a_503():
    pipeline, _ = make(small="A", large="A")
    pipeline.stages, calls = _losing(pipeline.stages, "large", times=2)
    with pytest.raises(FeaturesLost) as err:
        await ask(pipeline, "large")
    assert err.value.status == 503 and len(calls) == 2


def _counting(stages: Stages, peaks: dict) -> Stages:
    """The stages, each call held a moment (so calls that can overlap do), counting the most calls
    one request has out on each model deployment at once."""
    out = {"VisionEncoder": 0, "SmallReasoner": 0, "LargeAnswerer": 0}

    def counted(name, call):
        async def run(*args, **kw):
            out[name] += 1
            peaks[name] = max(peaks.get(name, 0), out[name])
            try:
                await asyncio.sleep(0.01)
                return await call(*args, **kw)
            finally:
                out[name] -= 1
        return run

    return Stages(encode=counted("VisionEncoder", stages.encode), small=counted("SmallReasoner", stages.small),
                  large=counted("LargeAnswerer", stages.large))


@pytest.mark.parametrize("speculative", [False, True])
async def test_no_policy_has_more_calls_out_at_once_than_the_model_queues_are_sized_for(speculative):
    """`tandem validate-config` sizes each model deployment's queue by `calls_at_once` per admitted
    request; every policy, on either path, stays within it — and mutual reaches it."""
    from tandem.config import POLICY_NAMES, calls_at_once

    limits = calls_at_once(speculative)
    cfg = load_tandem_config({"policy": {"speculative": speculative, "confidence_threshold": 1.0}})
    for policy in POLICY_NAMES:
        for small, large in (("A", "A"), ("A", "B")):  # agree, disagree
            _, eng = make(cfg, small=small, large=large)
            peaks: dict = {}
            await Pipeline(cfg, _counting(local_stages(eng), peaks)).answer(
                AskRequest(question="How many legs?", images=IMAGES, policy=policy))
            assert all(peaks.get(name, 0) <= n for name, n in limits.items()), (policy, small, large, peaks)
            if policy == "mutual":
                assert peaks["VisionEncoder"] == 2 and peaks["SmallReasoner"] == limits["SmallReasoner"]
