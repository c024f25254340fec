"""Tiny checkpoints: the real Qwen3-VL architecture, deterministic, loading back through the same
`from_pretrained` path as real ones, with a processor that can actually take images."""

import hashlib
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, Qwen3VLForConditionalGeneration

from tandem import prompts
from tandem.checkpoints import build_tiny, resolve_model_ref
from tandem.processors import TandemQwen3VLProcessor, load_processor


def _digests(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(Path(path).iterdir())}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny")
    return {(size, seed, n): build_tiny(base / f"{size}-{seed}-{n}", size, seed)
            for size, seed, n in [("small", 0, 0), ("small", 0, 1), ("small", 1, 0), ("large", 0, 0)]}


def test_same_seed_gives_byte_identical_files(built):
    assert _digests(built["small", 0, 0]) == _digests(built["small", 0, 1])


def test_other_seed_gives_other_weights(built):
    a, b = _digests(built["small", 0, 0]), _digests(built["small", 1, 0])
    assert a["model.safetensors"] != b["model.safetensors"]


def test_small_and_large_differ_in_width_and_depth_and_share_a_tokenizer(built):
    small, large = (AutoConfig.from_pretrained(built[s, 0, 0]) for s in ("small", "large"))
    assert small.model_type == large.model_type == "qwen3_vl"
    assert (small.text_config.hidden_size, small.text_config.num_hidden_layers) == (64, 2)
    assert (large.text_config.hidden_size, large.text_config.num_hidden_layers) == (256, 4)
    assert _digests(built["small", 0, 0])["tokenizer.json"] == _digests(built["large", 0, 0])["tokenizer.json"]


def test_reload_offline_gives_identical_weights(built, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = built["small", 0, 0]
    a = AutoModelForImageTextToText.from_pretrained(path)
    b = AutoModelForImageTextToText.from_pretrained(path)
    assert isinstance(a, Qwen3VLForConditionalGeneration)
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name


def test_processor_loads_through_auto_processor_and_is_not_a_bare_tokenizer(built, png):
    path = built["small", 0, 0]
    for processor in (AutoProcessor.from_pretrained(path), load_processor(path)):
        assert isinstance(processor, TandemQwen3VLProcessor)
        assert processor.image_processor is not None
        out = processor(text=[prompts.IMAGE_PLACEHOLDER + "hi"], images=[_pil(png(0))],
                        return_tensors="pt")
        assert "pixel_values" in out and int((out["input_ids"] == processor.image_token_id).sum()) > 1


def _pil(data):
    import io
    from PIL import Image
    return Image.open(io.BytesIO(data))


def test_tokenizer_has_qwen_special_tokens(built):
    tok = load_processor(built["small", 0, 0]).tokenizer
    for t in ("<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|vision_start|>", "<think>", "</think>"):
        assert tok.convert_tokens_to_ids(t) != tok.unk_token_id and len(tok.encode(t)) == 1, t


def test_chat_template_renders_what_prompts_builds(built):
    question = "How many legs?\n" + prompts.SHORT_ANSWER_INSTRUCTION
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    small = load_processor(built["small", 0, 0])
    rendered = small.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert rendered == prompts.direct_prompt("How many legs?", 1, "think_tags")
    thinking = small.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert thinking == prompts.reasoning_prompt("How many legs?", 1, "think_tags")


def test_resolve_builds_once_into_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    first = resolve_model_ref("tiny:small")
    mtime = os.stat(Path(first) / "model.safetensors").st_mtime_ns
    assert resolve_model_ref("tiny:small") == first
    assert os.stat(Path(first) / "model.safetensors").st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [Path(first).name]  # no staging leftovers
    assert resolve_model_ref("Qwen/Qwen3-VL-8B-Instruct") == "Qwen/Qwen3-VL-8B-Instruct"
