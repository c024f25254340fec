"""The vLLM engine against the transformers engine on the same tiny checkpoints, in fp32: the same
greedy tokens, streaming, stop strings, log-probabilities, abort on close, per-request checks, and
prefix reuse. Runs where vLLM is installed (`bash scripts/test-vllm.sh`); skipped elsewhere."""

from __future__ import annotations

import asyncio
import random

import pytest

pytest.importorskip("vllm")

from tandem.config import ModelConfig, VllmOptions  # noqa: E402
from tandem.engines.transformers_engine import TransformersEngine  # noqa: E402
from tandem.engines.vllm_engine import VllmEngine  # noqa: E402
from tandem.errors import BadRequest  # noqa: E402
from tandem.prompts import IMAGE_PLACEHOLDER  # noqa: E402
from tandem.schemas import GenerationOutput, GenerationRequest, SamplingParams, TokenDelta  # noqa: E402
from tests.conftest import make_png  # noqa: E402

CPU_OPTIONS = VllmOptions(enforce_eager=True, block_size=32, max_model_len=4096, cpu_kv_cache_gib=1)
QUESTIONS = ["What colour is the cell in row 2?", "How many red cells are there?", "Describe the image.",
             "Which option is right? A. 1 B. 2 C. 3 D. 4", "Count the squares, then answer.", "hi"]


def chat(question: str, images: int = 1, prefill: str = "") -> str:
    return (f"<|im_start|>user\n{IMAGE_PLACEHOLDER * images}{question}<|im_end|>\n<|im_start|>assistant\n"
            + prefill)


@pytest.fixture(scope="module")
def pair():
    """(vision + reference decoder on transformers, decoder on vLLM) for tiny:large (32-wide heads)."""
    config = ModelConfig(model="tiny:large", vllm=CPU_OPTIONS)
    reference = TransformersEngine(config, name="large")
    engine = VllmEngine(config, name="large", max_prompt_tokens=2048)
    yield reference, engine
    engine.shutdown()


def requests_with_images(reference, n: int, seed: int = 0, max_tokens: int = 24) -> list[GenerationRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        images = 1 + (i % 3 == 2)
        sizes = [(rng.choice([32, 64, 96, 160]), rng.choice([32, 64, 128])) for _ in range(images)]
        feats = reference.encode_images([make_png(seed * 100 + i * 7 + k, w, h) for k, (w, h) in enumerate(sizes)])
        out.append(GenerationRequest(chat(rng.choice(QUESTIONS), images), feats, SamplingParams(max_tokens=max_tokens)))
    return out


def test_greedy_tokens_equal_the_transformers_engine(pair):
    reference, engine = pair
    batch = requests_with_images(reference, 24)
    want = reference.generate(batch)
    got = engine.generate(batch)
    same = [w.token_ids == g.token_ids for w, g in zip(want, got)]
    differing = [(i, w.token_ids, g.token_ids) for i, (w, g, s) in enumerate(zip(want, got, same)) if not s]
    print(f"greedy equivalence: {sum(same)} of {len(batch)} prompts token for token; differing: {differing}")
    assert sum(same) == len(batch), differing
    for w, g in zip(want, got):
        assert g.prompt_tokens == w.prompt_tokens  # the placeholder expansion counts alike
        assert "".join(g.token_texts) == g.text and len(g.token_texts) == len(g.token_ids)


def test_logprobs_of_the_chosen_tokens_match(pair):
    reference, engine = pair
    batch = requests_with_images(reference, 3, seed=1, max_tokens=8)
    for r in batch:
        r.sampling = SamplingParams(max_tokens=8, logprobs=True)
    for w, g in zip(reference.generate(batch), engine.generate(batch)):
        assert g.token_ids == w.token_ids and len(g.logprobs) == len(g.token_ids)
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-3)


async def test_stream_yields_deltas_that_join_to_the_text_then_the_output(pair):
    reference, engine = pair
    request = requests_with_images(reference, 1, seed=2, max_tokens=16)[0]
    events = [e async for e in engine.stream(request)]
    assert isinstance(events[-1], GenerationOutput)
    deltas = [e.text for e in events[:-1]]
    assert all(isinstance(e, TokenDelta) for e in events[:-1]) and len(deltas) > 1
    assert "".join(deltas) == events[-1].text


def test_a_stop_string_cuts_the_text_and_the_token_lists(pair):
    reference, engine = pair
    request = requests_with_images(reference, 1, seed=3, max_tokens=24)[0]
    full = engine.generate([request])[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), full
    request.sampling = SamplingParams(max_tokens=24, stop=(stop,))
    out = engine.generate([request])[0]
    assert out.finish_reason == "stop" and out.text == full[:full.index(stop)]
    assert "".join(out.token_texts) == out.text and len(out.token_texts) == len(out.token_ids)


async def test_closing_the_stream_aborts_the_request_in_vllm(pair):
    reference, engine = pair
    request = requests_with_images(reference, 1, seed=4, max_tokens=3000)[0]
    request.request_id = "abort-me"
    stream = engine.stream(request)
    async for event in stream:
        if isinstance(event, TokenDelta) and engine.decoded_tokens("abort-me") >= 3:
            break
    await stream.aclose()
    for _ in range(50):
        if engine.unfinished() == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.unfinished() == 0
    decoded = engine.decoded_tokens("abort-me")
    await asyncio.sleep(0.5)
    assert engine.decoded_tokens("abort-me") == decoded < 3000
    assert engine.stats().cancelled >= 1


def test_bad_requests_fail_alone_with_a_400(pair):
    reference, engine = pair
    good = requests_with_images(reference, 1, seed=5, max_tokens=4)[0]
    with pytest.raises(BadRequest, match="image placeholders"):
        engine.generate([GenerationRequest(chat("q", images=2), good.images)])
    with pytest.raises(BadRequest, match="the limit is 2048"):
        engine.generate([GenerationRequest(chat("word " * 3000), good.images)])
    assert engine.generate([good])[0].completion_tokens == 4


def test_the_transfer_prompt_reuses_the_direct_prompts_cached_head(pair):
    reference, engine = pair
    feats = reference.encode_images([make_png(9, 256, 256)])
    direct = GenerationRequest(chat("Which option is right? A. 1 B. 2 C. 3 D. 4"), feats, SamplingParams(max_tokens=4))
    first = engine.generate([direct])[0]
    transfer = GenerationRequest(direct.prompt.replace("<|im_end|>", " Hint: row 2 holds 3 red cells.<|im_end|>"),
                                 feats, SamplingParams(max_tokens=4))
    second = engine.generate([transfer])[0]
    image_tokens = feats[0].num_tokens
    print(f"prefix reuse: image {image_tokens} tokens; first call cached {first.cached_tokens}, "
          f"transfer cached {second.cached_tokens} of {second.prompt_tokens}")
    assert image_tokens == 64
    assert second.cached_tokens >= image_tokens


def test_requests_submitted_together_are_prefilled_together(pair):
    reference, engine = pair
    seen = len(engine.stats().prefill_sizes)
    engine.generate(requests_with_images(reference, 6, seed=6, max_tokens=3))
    sizes = engine.stats().prefill_sizes[seen:]
    assert sum(sizes) == 6 and max(sizes) > 1, sizes


def test_in_process_tandem_on_vllm_answers_with_the_towers_on_transformers(png):
    """`tandem ask --config serve_config.vllm-cpu.yaml`'s path: each role's tower on transformers,
    its decoder on vLLM; a mutual request of the random pair transfers."""
    from pathlib import Path

    import yaml

    from tandem.config import load_tandem_config
    from tandem.local import LocalTandem
    from tandem.schemas import AskRequest

    root = Path(__file__).resolve().parents[2]
    args = yaml.safe_load((root / "serve_config.vllm-cpu.yaml").read_text())["applications"][0]["args"]
    tandem = LocalTandem(load_tandem_config(args))
    try:
        result = tandem.ask(AskRequest("What is shown?", [png(3)], policy="mutual"))
        assert result.path == "transfer" and result.images_encoded == {"small": 1, "large": 1}
        transfer = result.stages["large_transfer"]
        assert result.tokens["large_transfer"] > 0 and 0 <= transfer["cached_tokens"] <= transfer["prompt_tokens"]
    finally:
        tandem.close()


def test_shutdown_ends_vllms_engine_processes():
    """What a model server's replica does as Serve stops it: vLLM's engine core process goes too."""
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    engine = VllmEngine(ModelConfig(model="tiny:large", vllm=CPU_OPTIONS), name="large", max_prompt_tokens=512)
    started = {p.pid for p in multiprocessing.active_children()} - before
    engine.shutdown()
    left = {p.pid for p in multiprocessing.active_children()} & started
    assert not left and not engine._thread.is_alive()
