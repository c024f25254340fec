"""Every engine honours the one engine contract (`tandem/engines/protocol.py`) through the same cases:
the fake and transformers engines here, vLLM's where it is installed (`bash scripts/test-vllm.sh`).
The model servers call nothing else, so an engine that passes these serves."""

from __future__ import annotations

import asyncio

import pytest

from tandem.config import ModelConfig
from tandem.engines.decoding import collect
from tandem.engines.protocol import EngineStats, GenerationEngine, VisionEngine
from tandem.errors import BadRequest
from tandem.schemas import GenerationOutput, GenerationRequest, SamplingParams, TokenDelta

LIMIT = 256  # max prompt tokens every engine is built with


def _fake():
    from tandem.engines.fake import FakeEngine

    return FakeEngine("small", step_s=0.002, max_prompt_tokens=LIMIT)


def _transformers():
    from tandem.engines.transformers_engine import TransformersEngine

    return TransformersEngine(ModelConfig(model="tiny:small"), name="small", max_prompt_tokens=LIMIT)


def _vllm():
    pytest.importorskip("vllm")
    from tandem.config import VllmOptions
    from tandem.engines.vllm_engine import VllmEngine

    options = VllmOptions(enforce_eager=True, block_size=32, max_model_len=1024, cpu_kv_cache_gib=1)
    return VllmEngine(ModelConfig(model="tiny:large", vllm=options), name="large", max_prompt_tokens=LIMIT)


@pytest.fixture(scope="module", params=["fake", "transformers", "vllm"])
def engine(request):
    built = {"fake": _fake, "transformers": _transformers, "vllm": _vllm}[request.param]()
    built.warm_up()
    yield built
    if hasattr(built, "shutdown"):
        built.shutdown()


def ask(text: str, max_tokens: int, request_id: str = "") -> GenerationRequest:
    return GenerationRequest(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", [],
                             SamplingParams(max_tokens=max_tokens, temperature=0.0), request_id=request_id)


def test_the_engine_is_a_generation_engine_and_its_probes_pass(engine):
    """A model server calls only the contract's methods: each is there and the probes pass on a live engine."""
    assert isinstance(engine, GenerationEngine)
    engine.check_alive()
    engine.check_device()
    engine.configure(4, 0.0)
    assert isinstance(engine.stats(), EngineStats)


def test_generate_answers_each_request_in_order_within_its_max_tokens(engine):
    outs = engine.generate([ask("one", 3), ask("two", 1), ask("three", 5)])
    assert [type(o) for o in outs] == [GenerationOutput] * 3
    assert [o.completion_tokens <= m for o, m in zip(outs, (3, 1, 5))] == [True] * 3
    assert all(o.completion_tokens >= 1 and o.prompt_tokens >= 1 for o in outs)


async def test_streamed_deltas_make_the_output_text(engine):
    """What a client streams is what it would have been answered whole."""
    events = [e async for e in engine.stream(ask("stream", 6))]
    *deltas, out = events
    assert isinstance(out, GenerationOutput) and all(isinstance(d, TokenDelta) for d in deltas)
    assert "".join(d.text for d in deltas) == out.text
    assert out.text == engine.generate([ask("stream", 6)])[0].text  # greedy: the same either way


async def test_a_bad_request_fails_alone_with_a_400(engine):
    """A prompt over the limit raises BadRequest for its own stream; one beside it still answers."""
    good = asyncio.ensure_future(collect(engine.stream(ask("fine", 4))))
    with pytest.raises(BadRequest):
        await collect(engine.stream(ask("word " * (LIMIT * 4), 4)))
    assert (await good).completion_tokens >= 1


async def test_decoded_tokens_are_counted_per_request_and_stop_when_the_stream_closes(engine):
    assert engine.decoded_tokens("never-seen") == 0
    out = await collect(engine.stream(ask("count me", 4, request_id="counted")))
    assert engine.decoded_tokens("counted") >= out.completion_tokens - 1 >= 0
    stream = engine.stream(ask("long " * 3, 200, request_id="closed"))
    async for event in stream:
        if isinstance(event, TokenDelta):
            break
    await stream.aclose()
    await asyncio.sleep(0.2)
    stopped = engine.decoded_tokens("closed")
    await asyncio.sleep(0.3)
    assert engine.decoded_tokens("closed") == stopped < 200


def test_make_engine_checks_the_contract_for_the_parts_it_builds():
    """A vision encoder gets a VisionEngine, a model server a GenerationEngine; an engine missing a
    method of the contract cannot be built at all."""
    from tandem.config import load_tandem_config
    from tandem.engines import make_engine

    config = load_tandem_config({"engine": "fake"})
    assert isinstance(make_engine(config, "small", language=False), VisionEngine)
    assert isinstance(make_engine(config, "large", vision=False), GenerationEngine)

    class Partial(GenerationEngine):
        def warm_up(self) -> None: ...

    with pytest.raises(TypeError):
        Partial()
