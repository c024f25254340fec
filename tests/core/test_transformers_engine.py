"""The transformers engine on tiny checkpoints: precomputed features must give exactly what the
model's own pixel path gives, batching (rows joining and leaving a running batch) must not change
results, each row returns at its own length, streams reassemble to the text, cancelled rows stop
decoding, and limits must hold."""

import asyncio
import threading
import time

import pytest
import torch

from tandem import prompts
from tandem.config import ModelConfig
from tandem.errors import BadRequest
from tandem.engines.transformers_engine import TransformersEngine
from tandem.engines.decoding import Prepared
from tandem.engines.fake import FakeEngine
from tandem.schemas import GenerationRequest, SamplingParams, TokenDelta


@pytest.fixture(scope="module")
def engine():
    return TransformersEngine(ModelConfig(model="tiny:large", reasoning_format="prompted"), name="large")


def test_features_equal_pixel_path_greedy_fp32(engine, png):
    image = png(3, 96, 64)
    prompt = prompts.direct_prompt("What is it?", 1, "prompted")
    feats = engine.encode_images([image])
    ours = engine.generate([GenerationRequest(prompt, feats, SamplingParams(max_tokens=12))])[0]

    from tandem.images import decode_image
    size = {"shortest_edge": engine.config.min_pixels, "longest_edge": engine.config.max_pixels}
    inputs = engine.processor(text=[prompt], images=[decode_image(image)], images_kwargs={"size": size},
                              return_tensors="pt")
    with torch.inference_mode():
        ref = engine.model.generate(**inputs, max_new_tokens=12, do_sample=False)
    ref_ids = ref[0, inputs["input_ids"].shape[1]:].tolist()
    assert int(inputs["image_grid_thw"].prod()) // 4 == feats[0].num_tokens
    assert ours.token_ids == [t for t in ref_ids if t not in engine.stop_token_ids][: len(ours.token_ids)]
    assert len(ours.token_ids) == 12 or ours.finish_reason == "stop"


def test_deepstack_features_are_returned(engine, png):
    feats = engine.encode_images([png(0), png(1, 128, 96)])
    assert len(feats[0].deepstack) == len(engine.model.config.vision_config.deepstack_visual_indexes) == 3
    assert feats[1].embeds.shape == (feats[1].num_tokens, engine.model.config.text_config.hidden_size)


def test_left_padded_batch_equals_single_requests(engine, png):
    feats = engine.encode_images([png(0), png(1, 128, 96)])
    batch = [GenerationRequest(prompts.direct_prompt("Q one?", 1, "prompted"), feats[:1], SamplingParams(6)),
             GenerationRequest(prompts.reasoning_prompt("A longer second question?", 2, "prompted"), feats,
                               SamplingParams(9, logprobs=True)),
             GenerationRequest(prompts.direct_prompt("No image", 0, "prompted"), [], SamplingParams(4))]
    together = engine.generate(batch)
    for request, out in zip(batch, together):
        alone = engine.generate([request])[0]
        assert out.token_ids == alone.token_ids and out.batch_size == 3
        assert len(out.token_ids) <= request.sampling.max_tokens
        assert out.decode_steps >= len(out.token_ids)
    assert len(together[1].logprobs) == len(together[1].token_ids) and all(lp <= 0 for lp in together[1].logprobs)
    assert together[0].logprobs == [] and together[2].logprobs == []  # only where asked


def _no_early_stop(engine, prompt, n):
    """A request that decodes exactly n tokens (random-init models rarely stop; ban their stop tokens)."""
    out = engine.generate([GenerationRequest(prompt, [], SamplingParams(n))])[0]
    assert out.finish_reason == "length", "the tiny model stopped early: pick another prompt"
    return GenerationRequest(prompt, [], SamplingParams(n), request_id=f"r{n}")


def test_each_row_returns_at_its_own_length_while_the_batch_goes_on(engine):
    short = _no_early_stop(engine, prompts.direct_prompt("Short one?", 0, "prompted"), 8)
    long = _no_early_stop(engine, prompts.direct_prompt("Long one?", 0, "prompted"), 128)
    done = {}

    def sink_for(name):
        def sink(event):
            if hasattr(event, "finish_reason"):
                done[name] = (time.perf_counter(), event)
        return sink

    engine.loop.submit(long, sink_for("long"))
    engine.loop.submit(short, sink_for("short"))
    deadline = time.monotonic() + 60
    while len(done) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    (t_short, o_short), (t_long, o_long) = done["short"], done["long"]
    assert len(o_short.token_ids) == 8 and len(o_long.token_ids) == 128
    assert t_short < t_long and o_short.decode_steps == 8 and o_long.decode_steps == 128
    assert o_short.decode_ms < o_long.decode_ms / 4


def test_a_request_joining_a_running_batch_decodes_as_it_would_alone(engine, png):
    feats = engine.encode_images([png(4)])
    running = GenerationRequest(prompts.direct_prompt("A long running question?", 0, "prompted"), [],
                                SamplingParams(60))
    joiner = GenerationRequest(prompts.reasoning_prompt("Joins later with an image?", 1, "prompted"), feats,
                               SamplingParams(12))
    alone = engine.generate([joiner])[0]
    started, results = threading.Event(), {}

    def first(event):
        started.set()
        if hasattr(event, "finish_reason"):
            results["running"] = event

    engine.loop.submit(running, first)
    started.wait(30)  # the running batch has decoded a token: the joiner is prefilled apart, then merged
    results["joiner"] = engine.generate([joiner])[0]
    assert results["joiner"].token_ids == alone.token_ids
    assert results["joiner"].batch_size == 2


def test_streamed_deltas_reassemble_to_the_text_and_hold_back_a_stop_string(engine):
    request = GenerationRequest(prompts.direct_prompt("Stream me?", 0, "prompted"), [], SamplingParams(24))
    full = engine.generate([request])[0]
    stop = full.text[5:8]

    async def collect(req):
        pieces, out = [], None
        async for event in engine.stream(req):
            if hasattr(event, "finish_reason"):
                out = event
            else:
                pieces.append(event.text)
        return pieces, out

    pieces, out = asyncio.run(collect(request))
    assert "".join(pieces) == out.text == full.text and len(pieces) > 1
    pieces, out = asyncio.run(collect(GenerationRequest(request.prompt, [], SamplingParams(24, stop=(stop,)))))
    assert "".join(pieces) == out.text and stop not in out.text and out.finish_reason == "stop"


def test_closing_a_stream_stops_decoding_that_row(engine):
    request = _no_early_stop(engine, prompts.direct_prompt("Cancel me?", 0, "prompted"), 200)
    request = GenerationRequest(request.prompt, [], request.sampling, request_id="cancel-me")

    async def read_two():
        stream = engine.stream(request)
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(read_two())
    time.sleep(0.5)
    assert engine.loop.decoded["cancel-me"] <= 5


def test_stop_string_cuts_the_text(engine, png):
    request = GenerationRequest(prompts.direct_prompt("Q?", 0, "prompted"), [], SamplingParams(20))
    full = engine.generate([request])[0]
    assert len(full.text) > 4
    stop = full.text[2:4]
    cut = engine.generate([GenerationRequest(request.prompt, [], SamplingParams(20, stop=(stop,)))])[0]
    assert stop not in cut.text and full.text.startswith(cut.text) and cut.finish_reason == "stop"
    assert "".join(cut.token_texts) == cut.text and len(cut.token_ids) == len(cut.token_texts)


def test_features_of_another_model_are_refused(engine, png):
    feats = engine.encode_images([png(0)])
    feats[0].model = "small"
    with pytest.raises(BadRequest, match="features from model 'small'"):
        engine.generate([GenerationRequest(prompts.direct_prompt("Q", 1, "prompted"), feats)])


def test_a_prompt_over_the_token_limit_fails_alone(engine, png):
    feats = engine.encode_images([png(0)])
    request = GenerationRequest(prompts.direct_prompt("word " * 50, 1, "prompted"), feats, SamplingParams(2))
    engine.generate([request])  # within the default limit
    ok = GenerationRequest(prompts.direct_prompt("Hi", 0, "prompted"), [], SamplingParams(2))
    limit = engine.prepare(ok).prompt_tokens
    engine.max_prompt_tokens = limit
    try:
        results = {}

        def sink_for(name):
            def sink(event):
                if not isinstance(event, TokenDelta):
                    results[name] = event
            return sink

        ok = GenerationRequest(prompts.direct_prompt("Hi", 0, "prompted"), [], SamplingParams(2))
        engine.loop.submit(request, sink_for("long"))
        engine.loop.submit(ok, sink_for("ok"))
        deadline = time.monotonic() + 30
        while len(results) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert isinstance(results["long"], BadRequest) and f"the limit is {limit}" in str(results["long"])
        assert results["ok"].completion_tokens >= 1
    finally:
        engine.max_prompt_tokens = 4096


def test_trust_remote_code_stays_off_unless_configured(monkeypatch):
    """Code shipped inside a checkpoint must not run because a config forgot to say no."""
    import tandem.engines.transformers_engine as te

    seen = []

    def record(path, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        raise RuntimeError("stop after recording")

    monkeypatch.setattr(te.AutoModelForImageTextToText, "from_pretrained", record)
    for config, expected in ((ModelConfig(model="tiny:small"), False),
                             (ModelConfig(model="tiny:small", trust_remote_code=True), True)):
        with pytest.raises(RuntimeError, match="stop after recording"):
            TransformersEngine(config, name="small")
        assert seen[-1] is expected


def test_attention_scores_cover_the_reasoning_segment(png):
    small = TransformersEngine(ModelConfig(model="tiny:small"), name="small")
    feats = small.encode_images([png(0)])
    reasoning = "I count the legs: one, two, three, four"
    prompt = prompts.answer_after_reasoning(prompts.reasoning_prompt("How many legs?", 1, "think_tags"), reasoning,
                                            "think_tags")
    out = small.generate([GenerationRequest(prompt, feats, SamplingParams(4), attend_to=reasoning)])[0]
    assert "".join(out.span_token_texts) == reasoning
    assert len(out.span_scores) == len(out.span_token_texts) and all(s >= 0 for s in out.span_scores)
    assert max(out.span_scores) > min(out.span_scores)
    plain = small.generate([GenerationRequest(prompt, feats, SamplingParams(4))])[0]
    assert plain.token_ids == out.token_ids and plain.span_scores == []  # scoring never changes the answer


class _Scripted(FakeEngine):
    """The decode loop over the real tokenizer, the model replaced by a script of token ids."""

    stop_token_ids = {-1}

    def __init__(self, tokenizer, script):
        super().__init__("large")
        self.tokenizer, self.script = tokenizer, script

    def prepare(self, request):
        return Prepared(1, list(self.script))

    def prefill(self, requests, prepared):
        return [list(p.data) + [-1] for p in prepared]

    def detokenize(self, token_ids):
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_text_is_the_whole_sequence_decoded_not_token_by_token(engine):
    """Byte-level BPE splits characters across tokens ("°", "é", CJK): per-token decoding turns each
    piece into U+FFFD. The loop's text, token texts and stream are the whole sequence decoded, a
    character sent once its last byte has arrived."""
    text = "Il fait 21 °C à Zürich, 温度は高い."
    ids = engine.tokenizer(text)["input_ids"]
    per_token = "".join(engine.tokenizer.decode([t]) for t in ids)
    assert "\ufffd" in per_token  # the tokenizer does split these characters
    scripted = _Scripted(engine.tokenizer, ids)
    request = GenerationRequest("p", [], SamplingParams(len(ids) + 5))

    async def collect():
        pieces = []
        async for event in scripted.stream(request):
            if isinstance(event, TokenDelta):
                pieces.append(event.text)
            else:
                return pieces, event

    pieces, out = asyncio.run(collect())
    assert out.text == text and "".join(pieces) == text and "".join(out.token_texts) == text
    assert all("\ufffd" not in p for p in pieces) and len(out.token_texts) == len(ids)


def test_each_deployment_loads_only_its_part_with_the_checkpoints_weights():
    """The VisionEncoder's load reads the tower alone, a model server's the decoder alone (never built
    and dropped: benchmarks/load_memory.py measures the memory this saves), each tensor as saved."""
    from transformers import AutoModelForImageTextToText

    from tandem.checkpoints import resolve_model_ref
    from tandem.config import ModelConfig
    from tandem.engines.transformers_engine import load_parts

    config = ModelConfig(model="trained:large", reasoning_format="prompted")
    path = resolve_model_ref(config.model)
    whole = AutoModelForImageTextToText.from_pretrained(path).state_dict()
    tower = load_parts(path, config, language=False)
    decoder = load_parts(path, config, vision=False)
    assert tower.model.language_model is None and tower.lm_head is None
    assert decoder.model.visual is None
    t, d = tower.state_dict(), decoder.state_dict()
    assert t and all(k.startswith("model.visual.") for k in t)
    assert d and not any(k.startswith("model.visual.") for k in d)
    assert set(t) | set(d) == set(whole)
    assert all(torch.equal(whole[k], v) for k, v in {**t, **d}.items())


def test_reasoning_takes_the_checkpoints_sampling_and_sampling_honours_top_k_and_top_p():
    from tandem.engines.generation import model_sampling
    from tandem.engines.transformers_engine import _sample

    engine = TransformersEngine(ModelConfig(model="trained:small"), name="small", vision=False)
    assert engine.reasoning_sampling == {"temperature": 0.0, "top_p": 1.0, "top_k": 0}  # its config says nothing
    gen = engine.model.generation_config
    gen.do_sample, gen.temperature, gen.top_p, gen.top_k = True, 0.6, 0.95, 20  # as Qwen3's thinking models ship
    engine.reasoning_sampling = model_sampling(gen)
    asked = GenerationRequest("hi", [], SamplingParams(max_tokens=4, model_defaults=True))
    engine.prepare(asked)
    assert (asked.sampling.temperature, asked.sampling.top_p, asked.sampling.top_k) == (0.6, 0.95, 20)
    assert not asked.sampling.model_defaults
    plain = GenerationRequest("hi", [], SamplingParams(max_tokens=4, temperature=0.2))
    engine.prepare(plain)
    assert (plain.sampling.temperature, plain.sampling.top_k) == (0.2, 0)  # the request's own, untouched

    torch.manual_seed(0)
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    assert {_sample(logits, SamplingParams(temperature=5.0, top_k=1)) for _ in range(50)} == {1}
    assert {_sample(logits, SamplingParams(temperature=5.0, top_p=0.01)) for _ in range(50)} == {1}
    assert {_sample(logits, SamplingParams(temperature=5.0, top_k=2)) for _ in range(200)} == {1, 2}
    assert len({_sample(logits, SamplingParams(temperature=5.0)) for _ in range(400)}) == 4


def test_weights_go_straight_to_their_gpu(monkeypatch):
    """On a GPU, from_pretrained places each tensor as it reads it (device_map), so no whole copy of
    the part is ever held in host memory first; on CPU nothing is mapped."""
    from transformers import Qwen3VLForConditionalGeneration

    from tandem.checkpoints import resolve_model_ref
    from tandem.engines.transformers_engine import device_placement, load_parts

    assert device_placement("cpu") == {}
    assert device_placement("cuda:1") == {"device_map": "cuda:1"} and device_placement("auto") == {"device_map": "auto"}
    seen = {}

    def record(cls, path, **kwargs):
        seen.update(kwargs, cls=cls)
        raise RuntimeError("stop before loading")
    monkeypatch.setattr(Qwen3VLForConditionalGeneration, "from_pretrained", classmethod(record))
    config = ModelConfig(model="trained:small", device="cuda:1", dtype="bfloat16")
    with pytest.raises(RuntimeError, match="stop before loading"):
        load_parts(resolve_model_ref(config.model), config, vision=False, **device_placement(config.device))
    assert seen["device_map"] == "cuda:1" and seen["dtype"] == torch.bfloat16
    assert issubclass(seen["cls"], Qwen3VLForConditionalGeneration)  # the decoder-only class
