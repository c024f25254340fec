"""A request pays only for new work: the transformers engine keeps a finished prompt's KV for the
request's next stage on the same model and prefills only the suffix (greedy outputs identical with
reuse on and off), within a byte bound; and an idle decode loop starts a lone request at once."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from tandem.config import ModelConfig
from tandem.engines.decoding import DecodeLoop
from tandem.engines.fake import FakeEngine
from tandem.engines.prefix_cache import PrefixEntry, PrefixStore, common_prefix
from tandem.prompts import direct_prompt, transfer_prompt
from tandem.schemas import GenerationRequest, SamplingParams

from tests.conftest import make_png


def entry(ids, images_end=0, width=4) -> PrefixEntry:
    n = len(ids)
    return PrefixEntry(ids=list(ids), keys=[torch.zeros(1, 1, n, width)], values=[torch.zeros(1, 1, n, width)],
                       positions=torch.arange(n).expand(3, -1), images_end=images_end)


def test_a_match_is_the_longest_common_prefix_covering_the_images_and_leaving_a_token():
    store = PrefixStore(max_bytes=10**6)
    store.put("r1", entry([1, 2, 3, 4, 5], images_end=2))
    assert store.match("r1", [1, 2, 3, 9, 9])[1] == 3
    assert store.match("r1", [1, 2, 3, 4, 5])[1] == 4  # one token is always computed
    assert store.match("r1", [1, 7, 7])[0] is None  # the prefix would end inside the image
    assert store.match("other", [1, 2, 3])[0] is None
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_the_store_keeps_within_its_bytes_least_recently_used_first_out():
    one = entry(range(10)).nbytes
    store = PrefixStore(max_bytes=2 * one)
    for key in ("a", "b"):
        store.put(key, entry(range(10)))
    store.match("a", list(range(10)) + [1])  # a is used: b is the older
    store.put("c", entry(range(10)))
    assert list(store.entries) == ["a", "c"] and store.bytes == 2 * one
    store.configure(0)
    assert not store.entries and store.match("a", [0, 1])[0] is None


@pytest.fixture(scope="module")
def engine():
    from tandem.engines.transformers_engine import TransformersEngine

    built = TransformersEngine(ModelConfig(model="tiny:large"), name="large")
    yield built


def _counting(engine, monkeypatch) -> list[int]:
    """Tokens the model is run over in each call of the decoder: counted where it is called."""
    counted, real = [], engine._decode

    def decode(ids, *args, **kwargs):
        counted.append(int(ids.shape[0] * ids.shape[1]))
        return real(ids, *args, **kwargs)
    monkeypatch.setattr(engine, "_decode", decode)
    return counted


def test_a_follow_up_stage_prefills_only_its_suffix_and_decodes_the_same(engine, monkeypatch):
    feats = engine.encode_images([make_png(5, 96, 64)])
    question = "How many red cells are in row 2?"
    outputs, prefilled = {}, {}
    for reuse in (False, True):
        direct = GenerationRequest(direct_prompt(question, 1, "prompted"), feats, SamplingParams(max_tokens=3),
                                   request_id=f"req-{reuse}")
        follow = GenerationRequest(transfer_prompt(question, 1, "row 2: red red blue. total 2.", "prompted"), feats,
                                   SamplingParams(max_tokens=6), request_id=f"req-{reuse}")
        engine.configure(8, 0.0, prefix_cache_bytes=(64 * 2**20 if reuse else 0))
        engine.generate([direct])
        with monkeypatch.context() as m:
            counted = _counting(engine, m)
            outputs[reuse] = engine.generate([follow])[0]
        prefilled[reuse] = counted[0]
    plain, reused = outputs[False], outputs[True]
    assert plain.cached_tokens == 0 and prefilled[False] == plain.prompt_tokens
    assert reused.token_ids == plain.token_ids  # greedy: the same tokens with reuse on and off
    assert reused.cached_tokens > feats[0].num_tokens  # the image and the question's head came from the cache
    assert prefilled[True] == reused.prompt_tokens - reused.cached_tokens  # only the suffix went through the model
    assert engine.stats().prefix_cache["prefix_cache_hits"] >= 1


def test_a_lone_request_at_an_idle_loop_starts_at_once_unless_told_to_wait():
    engine = FakeEngine("large", lambda p: "a")
    loop = DecodeLoop(engine)
    for adaptive, at_least, at_most in ((True, 0.0, 0.15), (False, 0.3, 5.0)):
        loop.configure(8, 0.3, adaptive)
        time.sleep(0.35)  # the last request is long gone: nothing arrives within the wait
        start = time.perf_counter()
        loop.generate([GenerationRequest("q", [], SamplingParams(2))])
        assert at_least <= time.perf_counter() - start <= at_most


def test_requests_arriving_within_the_wait_are_still_batched():
    engine = FakeEngine("large", lambda p: "a b")
    loop = DecodeLoop(engine)
    loop.configure(8, 0.2, True)
    loop.generate([GenerationRequest("first", [], SamplingParams(2))])
    loop.generate([GenerationRequest(f"q{i}", [], SamplingParams(2)) for i in range(4)])  # close behind it
    assert max(len(b) for b in engine.batches) >= 2


def test_a_lone_stage_waits_for_a_batch_only_when_its_sender_has_company():
    """The Router says how many other requests it is answering: their stages are on their way, so an
    idle loop waits for them; a stage sent alone starts at once."""
    engine = FakeEngine("large", lambda p: "a")
    loop = DecodeLoop(engine)
    loop.configure(8, 0.3, True)
    for company, at_least, at_most in ((0, 0.0, 0.15), (3, 0.3, 5.0)):
        time.sleep(0.35)  # nothing arrived within the wait: only `company` can make the loop wait
        start = time.perf_counter()
        loop.generate([GenerationRequest("q", [], SamplingParams(2), company=company)])
        assert at_least <= time.perf_counter() - start <= at_most


async def test_the_pipeline_tells_each_stage_how_many_other_requests_it_is_answering():
    from tandem.config import load_tandem_config
    from tandem.local import local_stages
    from tandem.pipeline import Pipeline
    from tandem.schemas import AskRequest

    engines = {role: FakeEngine(role, step_s=0.01) for role in ("small", "large")}
    pipeline = Pipeline(load_tandem_config({"engine": "fake"}), local_stages(engines))
    await asyncio.gather(*(pipeline.answer(AskRequest(f"q{i}", [], policy="large")) for i in range(3)))
    await pipeline.answer(AskRequest("alone", [], policy="large"))
    seen = [("alone" in r.prompt, r.company) for batch in engines["large"].batches for r in batch]
    assert [company for alone, company in seen if alone] == [0] and pipeline.in_flight == 0
    assert [company for alone, company in seen if not alone] == [2, 2, 2]  # each saw the other two
