"""The paced engine: a stage profile's service times spent as waits under the real decode loop, and
the workload's stage sizes and transfer rate, so a served app on it runs at the profile's speed
whatever the machine's CPU."""

from __future__ import annotations

import asyncio

import pytest

from tandem.engines.paced import PacedEngine, stage_of, transfers
from tandem.prompts import direct_prompt, reasoning_prompt, transfer_prompt
from tandem.schemas import GenerationRequest, SamplingParams
from tests.capacity.helpers import profile_dict

STAGES = {"small_direct": {"prompt_tokens": 50, "decode_steps": 2}, "large_direct": {"prompt_tokens": 60, "decode_steps": 3},
          "small_reasoning": {"prompt_tokens": 50, "decode_steps": 12}, "large_transfer": {"prompt_tokens": 90, "decode_steps": 2}}


class Clock:
    """A clock that moves only when the engine sleeps, or when a test says the host spent time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def paced(role: str, rate: float = 0.3, clock: Clock | None = None):
    slept: list[float] = []
    clock = clock or Clock()

    def sleep(s: float) -> None:
        slept.append(s)
        clock.sleep(s)
    prof = {**profile_dict(prefill=(5.0, 9.0)), "workload": {"transfer_rate": rate, "stages": STAGES}}
    return PacedEngine(role, prof, sleep=sleep, clock=clock), slept


def test_each_step_waits_what_the_profile_says_for_its_size():
    engine, slept = paced("large")
    engine.configure(8, 1.0, adaptive_wait=False)  # both rows join one prefill
    prompt = direct_prompt("q?", 0, "prompted")
    out = engine.generate([GenerationRequest(prompt, [], SamplingParams(8), request_id=f"r{i}") for i in range(2)])
    # profile_dict: the large model's prefill 10 ms at 10 tokens, 18 ms at 80, the line beyond; steps
    # 4 ms at 1 row, 8 at 8.
    prefill = engine.prefill_ms(2 * 60)
    assert slept[0] == pytest.approx(prefill / 1000) and prefill == pytest.approx(18.0 + 40 * 8 / 70)
    assert slept[1:] == pytest.approx([engine.step_ms(2) / 1000] * 3)  # 3 steps of 2 rows: large_direct's size
    assert engine.step_ms(2) == pytest.approx(4.0 + 4.0 / 7)
    assert all(o.prompt_tokens == 60 for o in out)
    engine.encode_images([b"a", b"b", b"c"])
    assert slept[-1] == pytest.approx(engine.vision_ms(3) / 1000)


def test_the_loops_own_cpu_between_steps_falls_inside_a_step_not_after_it():
    """A step's measured time on a model server includes the loop's work around it: a step waits only
    what is left of its time since the last one ended, and a prefill (after the loop may have idled)
    its whole time."""
    clock = Clock()
    engine, slept = paced("large", clock=clock)
    step = engine.step_ms(2) / 1000
    engine.prefill([], [])
    clock.now += 0.001  # the loop chose and handed on the prefill's tokens: 1 ms of CPU
    engine.advance([[1, 2], [3, 4]], [0, 0])
    assert slept[-1] == pytest.approx(step - 0.001)
    clock.now += 0.020  # a host so loaded that handing on tokens took longer than a step
    engine.advance([[1], [3]], [0, 0])
    assert slept[-1] == 0.0  # the step then takes that long, and no longer
    clock.now += 5.0  # idle; the next prefill takes its whole time from now
    engine.prefill([], [])
    assert slept[-1] == pytest.approx(engine.prefill_ms(0) / 1000)


def test_stages_are_told_apart_and_decode_the_workloads_steps():
    assert stage_of("small", reasoning_prompt("q", 1, "think_tags")) == "small_reasoning"
    assert stage_of("large", reasoning_prompt("q", 1, "prompted")) == "large_reasoning"
    assert stage_of("large", transfer_prompt("q", 1, "because", "prompted")) == "large_transfer"
    assert stage_of("small", direct_prompt("q", 1, "think_tags")) == "small_direct"
    engine, slept = paced("small")
    engine.generate([GenerationRequest(reasoning_prompt("q", 0, "think_tags"), [], SamplingParams(64))])
    assert len(slept) == 1 + 12


def test_a_mutual_request_transfers_at_the_workloads_rate_the_same_way_on_every_replica():
    ids = [f"chatcmpl-{i}" for i in range(2000)]
    share = sum(transfers(i, 0.3) for i in ids) / len(ids)
    assert share == pytest.approx(0.3, abs=0.03)
    assert [transfers(i, 0.3) for i in ids[:50]] == [transfers(i, 0.3) for i in ids[:50]]


async def test_a_mutual_pipeline_on_paced_engines_takes_its_path_from_the_draw():
    from tandem.config import load_tandem_config
    from tandem.local import local_stages
    from tandem.pipeline import Pipeline
    from tandem.schemas import AskRequest

    engines = {role: paced(role, rate=0.5)[0] for role in ("small", "large")}
    pipeline = Pipeline(load_tandem_config({"engine": "fake"}), local_stages(engines))
    ids = [f"req-{i}" for i in range(12)]
    results = await asyncio.gather(*(pipeline.answer(AskRequest("q?", [], policy="mutual", request_id=i)) for i in ids))
    assert [r.path for r in results] == ["transfer" if transfers(i, 0.5) else "agree" for i in ids]
    assert {"transfer", "agree"} == {r.path for r in results}
