"""The transformers engine on tiny checkpoints: precomputed features must give exactly what the
model's own pixel path gives, batching must not change results, and limits must hold."""

import pytest
import torch

from tandem import prompts
from tandem.config import ModelConfig
from tandem.errors import BadRequest
from tandem.engines.transformers_engine import TransformersEngine
from tandem.schemas import GenerationRequest, SamplingParams


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
                               SamplingParams(9)),
             GenerationRequest(prompts.direct_prompt("No image", 0, "prompted"), [], SamplingParams(4))]
    together = engine.generate(batch)
    for request, out in zip(batch, together):
        alone = engine.generate([request])[0]
        assert out.token_ids == alone.token_ids and out.batch_size == 3
        assert len(out.token_ids) <= request.sampling.max_tokens
        assert len(out.logprobs) == len(out.token_ids) and all(lp <= 0 for lp in out.logprobs)


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


def test_validate_refuses_prompts_over_the_token_limit(engine, png):
    feats = engine.encode_images([png(0)])
    request = GenerationRequest(prompts.direct_prompt("word " * 50, 1, "prompted"), feats)
    engine.validate(request)  # within the default limit
    engine.max_prompt_tokens = 40
    try:
        with pytest.raises(BadRequest, match="the limit is 40"):
            engine.validate(request)
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
