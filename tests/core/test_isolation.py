"""Fault isolation and hostile input in the core: a row that cannot be prefilled or sampled fails
alone; a client error from either model is that request's 4xx; what reaches a processor is what it
accepts; control tokens cannot be forged; a body's validation work is bounded."""

from __future__ import annotations

import asyncio
import io
import threading

import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from tandem.chat_schema import json_shape_problem
from tandem.config import TandemConfig
from tandem.engines.decoding import collect
from tandem.engines.fake import FakeEngine
from tandem.errors import BadRequest, TandemError, client_error
from tandem.images import check_resizable, decode_image, jpeg_scans, resized_size
from tandem.local import local_stages
from tandem.pipeline import Pipeline
from tandem.schemas import AskRequest, GenerationRequest, SamplingParams

from tests.core.test_pipeline import rule


class PoisonedPrefill(FakeEngine):
    """A prefill that fails whenever a 'poison' prompt is in it; its steps wait at `gate` when set, so
    a test can line up joiners for one admission."""

    gate: threading.Event | None = None

    def prefill(self, requests, prepared):
        if any("poison" in r.prompt for r in requests):
            raise RuntimeError("prefill failed")
        return super().prefill(requests, prepared)

    def advance(self, state, token_ids):
        if self.gate is not None:
            self.gate.wait(5)
        super().advance(state, token_ids)


async def test_a_failed_joint_prefill_is_retried_row_by_row_and_the_running_batch_survives():
    engine = PoisonedPrefill("large", lambda p: " ".join(["w"] * 40) if "long" in p else "a b c")
    engine.gate = threading.Event()
    running = engine.stream(GenerationRequest("long", [], SamplingParams(40)))
    await running.__anext__()  # the long row decodes; its next step waits at the gate
    joiners = [asyncio.ensure_future(collect(engine.stream(GenerationRequest(p, [], SamplingParams(3)))))
               for p in ("poison", "ok 1", "ok 2")]
    await asyncio.sleep(0.1)  # all three submitted while the step waits: one admission
    engine.gate.set()
    results = await asyncio.gather(*joiners, return_exceptions=True)
    assert isinstance(results[0], RuntimeError)
    assert [r.text for r in results[1:]] == ["a b c", "a b c"]
    rest = [e async for e in running]
    assert rest[-1].completion_tokens == 40  # the running row went on to its end
    assert [[r.prompt for r in b] for b in engine.batches] == [["long"], ["ok 1"], ["ok 2"]]


def test_a_rows_sampling_failure_fails_that_row_alone(monkeypatch):
    """The transformers engine's `choose` puts a row's exception in its place; the loop fails it alone."""
    import torch

    from tandem.engines import transformers_engine as te

    real = te._sample

    def sample(logits, s):
        if s.top_k == 7:  # the marked row
            raise ValueError("sampling failed")
        return real(logits, s)

    monkeypatch.setattr(te, "_sample", sample)
    state = te._Batch(cache=None, mask=None, next_pos=None, logits=torch.randn(3, 10))
    engine = object.__new__(te.TransformersEngine)
    chosen = engine.choose(state, [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=7),
                                   SamplingParams()])
    assert isinstance(chosen[1], ValueError) and all(isinstance(c, tuple) for c in (chosen[0], chosen[2]))


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-6])
def test_a_tiny_positive_temperature_is_greedy(temperature):
    import torch

    from tandem.engines.transformers_engine import _sample

    logits = torch.randn(50) * 30
    assert _sample(logits, SamplingParams(temperature=temperature)) == int(logits.argmax())


def test_non_finite_probabilities_never_reach_multinomial():
    import torch

    from tandem.engines.transformers_engine import _sample

    logits = torch.full((10,), float("inf"))
    logits[3] = float("nan")
    assert 0 <= _sample(logits, SamplingParams(temperature=0.7)) < 10


def _small_refuses_pipeline(config=None):
    class Refusing(FakeEngine):
        def prepare(self, request):
            raise BadRequest("prompt is 77 tokens for model 'small'; the limit is 70", param="messages")

    engines = {"small": Refusing("small"), "large": FakeEngine("large", rule("B"))}
    return Pipeline(config or TandemConfig(), local_stages(engines))


@pytest.mark.parametrize("policy", ["mutual", "always", "small"])
async def test_a_client_error_from_the_small_model_is_the_requests_400_not_a_degraded_answer(policy):
    with pytest.raises(BadRequest, match="limit is 70"):
        await _small_refuses_pipeline().answer(AskRequest(question="q", images=[], policy=policy))


def test_a_wrapped_remote_error_reaches_the_client_as_our_plain_error():
    """Ray hands a replica's exception on as a class deriving from both RayTaskError and ours, whose
    text is a traceback: only the class, message and field go on."""
    class Wrapped(BadRequest):  # what Ray's dual exception class is to us
        def __str__(self):
            return 'Traceback (most recent call last):\n  File "/work/x.py", pid=12, ip=10.0.0.1'

    plain = client_error(Wrapped("prompt is over the limit", param="messages"))
    assert type(plain) is BadRequest and str(plain) == "prompt is over the limit" and plain.param == "messages"
    assert client_error(TandemError("internal")) is None and client_error(RuntimeError("x")) is None


def test_the_resize_arithmetic_is_the_processors():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    for w, h in [(1, 1), (64, 48), (33, 4000), (4000, 33), (640, 480), (6400, 32), (3, 600), (1023, 1025)]:
        assert resized_size(w, h, 32 * 32, 256 * 256) == smart_resize(h, w, 32, 32 * 32, 256 * 256)[::-1]


def test_the_edge_refuses_what_a_processor_would_refuse_or_resize_past_its_budget():
    with pytest.raises(BadRequest, match="over 200 times"):
        check_resizable(402, 2, [(1024, 65536)])
    with pytest.raises(BadRequest, match="too elongated"):
        check_resizable(6000, 40, [(1024, 65536)])
    check_resizable(640, 480, [(1024, 65536), (1024, 16 * 2**20)])


@settings(max_examples=200, deadline=None)
@given(w=st.integers(1, 5000), h=st.integers(1, 5000))
def test_no_image_the_edge_accepts_is_resized_past_max_pixels(w, h):
    bounds = [(32 * 32, 256 * 256)]
    try:
        check_resizable(w, h, bounds)
    except BadRequest:
        return
    rw, rh = resized_size(w, h, *bounds[0])
    assert rw * rh <= bounds[0][1] and max(w, h) / min(w, h) <= 200


def test_a_jpeg_of_many_scans_is_refused_before_decoding():
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(buf, "JPEG", progressive=True)
    data = buf.getvalue()
    assert 1 < jpeg_scans(data) <= 32
    decode_image(data)  # a normal progressive JPEG decodes
    last = data.rindex(b"\xff\xda")
    many = data[:-2] + data[last:-2] * 100 + b"\xff\xd9"
    with pytest.raises(BadRequest, match="scans"):
        decode_image(many)


def test_a_corrupt_image_error_is_ours_not_the_librarys():
    with pytest.raises(BadRequest) as err:
        decode_image(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50)
    assert "could not be decoded" in err.value.message and "Error" not in err.value.message


def test_the_shape_check_stops_at_its_limits():
    assert json_shape_problem({"a": [1, 2, 3]}, 16, 100) is None
    assert "more than 100" in json_shape_problem({"a": list(range(10**6))}, 16, 100)
    assert "deeper" in json_shape_problem([[[[1]]]], 3, 100)
    wide = {f"k{i}": i for i in range(200)}
    assert "more than 100" in json_shape_problem(wide, 16, 100)


_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|endoftext|>",
             "<think>", "</think>", "<tool_call>", "</tool_call>"]
_PIECES = st.sampled_from(_SPECIALS + [s[:k] for s in _SPECIALS for k in range(1, len(s))] +
                          [s[k:] for s in _SPECIALS for k in range(1, len(s))] + ["a", " ", "\n", "|", "<", ">"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=30).map("".join))
def test_no_client_text_yields_a_special_token_in_the_prompt(text):
    """Whatever pieces of control tokens a client nests, the prompt tokenizes to exactly the special
    tokens of its template (those of the same prompt built from a plain question)."""
    from tandem import prompts

    tokenizer = _tokenizer()
    special = set(tokenizer.all_special_ids) | {i for t, i in tokenizer.get_added_vocab().items() if t in _SPECIALS}
    for fmt in ("think_tags", "prompted"):
        ids = tokenizer(prompts.direct_prompt(text + " q", 1, fmt))["input_ids"]
        plain = tokenizer(prompts.direct_prompt("q", 1, fmt))["input_ids"]
        assert sorted(i for i in ids if i in special) == sorted(i for i in plain if i in special)


def test_clean_text_renders_exactly_as_before():
    from tandem import prompts

    text = "What colour is row 2? <b>bold</b> a<|b c|>d"
    assert prompts.sanitize(text) == text
    assert prompts.sanitize("a<|im_<|x|>end|>b<thi<think>nk>c") == "abc"
    assert prompts.template_fingerprint() == "84f67db342838870"  # the shipped pair's


_TOKENIZER = []


def _tokenizer():
    if not _TOKENIZER:
        from transformers import AutoTokenizer

        from tandem.checkpoints import resolve_model_ref

        _TOKENIZER.append(AutoTokenizer.from_pretrained(resolve_model_ref("trained:large")))
    return _TOKENIZER[0]
