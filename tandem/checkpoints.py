"""Tiny offline Qwen3-VL checkpoints of the real architecture, and resolving model references.

`build_tiny(dir, size, seed)` writes a random-init `Qwen3VLForConditionalGeneration` (from the
family's config classes), a byte-level BPE tokenizer trained in-process with Qwen's special tokens
and a ChatML template with a thinking block, and the Qwen image processor from defaults — all with
`save_pretrained`, so they load back through the same `from_pretrained` path as real checkpoints.
Same seed, same bytes. `resolve_model_ref("tiny:small")` builds one on first use into a cache.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

# Bump when the builder's output changes, so cached checkpoints are rebuilt.
TINY_VERSION = 1
TINY_VOCAB_SIZE = 1024

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
THINK_TOKENS = ["<think>", "</think>"]

# Width and depth per size. head_dim/2 == sum(mrope_section); DeepStack layers < vision depth and
# no more of them than text layers, as in the real models (3 of 27 vision layers).
TINY_SIZES = {
    "small": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, mrope_section=[2, 3, 3]),
                  vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                              deepstack_visual_indexes=[1]),
                  thinking=True),
    "large": dict(text=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=4, head_dim=32, mrope_section=[4, 6, 6]),
                  vision=dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=4,
                              deepstack_visual_indexes=[1, 2, 3]),
                  thinking=False),
}


def chat_template(thinking: bool) -> str:
    """ChatML as Qwen3-VL renders it; a Thinking model opens `<think>` after the assistant header,
    and `enable_thinking=False` closes an empty thought (Qwen3's switch)."""
    open_think = "'<think>\\n'" if thinking else "''"
    return (
        "{%- for message in messages -%}"
        "{{- '<|im_start|>' + message.role + '\\n' -}}"
        "{%- if message.content is string -%}{{- message.content -}}"
        "{%- else -%}{%- for part in message.content -%}"
        "{%- if part.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
        "{%- elif part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
        "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
        "{%- else -%}{{- " + open_think + " -}}{%- endif -%}"
        "{%- endif -%}"
    )


def _corpus(seed: int, n: int = 3000) -> list[str]:
    """Deterministic VQA-flavoured sentences: enough to give the BPE tokenizer real merges."""
    rng = random.Random(seed)
    words = dict(
        colour="red green blue yellow black white orange purple".split(),
        shape="circle square triangle star cat dog car tree house chart bar line".split(),
        number="zero one two three four five six seven eight nine ten 1 2 3 4 5 6 7 8 9 10 42 100".split(),
        verb="is are has shows contains counts points sits".split(),
    )
    templates = [
        "How many {shape}s are in the image? The answer is {number}.",
        "What colour is the {shape}? It is {colour}.",
        "Let me think step by step. The {shape} {verb} {number} {colour} parts, so the answer is {number}.",
        "Question: Is there a {colour} {shape}? Answer: yes.",
        "Options: A. {colour} B. {shape} C. {number} D. none. The answer is B.",
        "First, I look at the {shape}. Then I count {number}. Therefore the final answer is {number}.",
    ]
    return [rng.choice(templates).format(**{k: rng.choice(v) for k, v in words.items()}) for _ in range(n)]


def build_tokenizer(seed: int = 0):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB_SIZE - len(THINK_TOKENS), special_tokens=QWEN_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=32768)
    fast.add_tokens(THINK_TOKENS)  # added, not special: Qwen3 keeps them in decoded text
    return fast


def build_tiny(out_dir: str | os.PathLike, size: str = "small", seed: int = 0) -> Path:
    """Write a tiny random-init Qwen3-VL checkpoint (model, tokenizer, processor) to out_dir."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from tandem.processors import TandemQwen3VLProcessor

    if size not in TINY_SIZES:
        raise ValueError(f"unknown tiny size '{size}'; known: {', '.join(TINY_SIZES)}")
    spec = TINY_SIZES[size]
    tokenizer = build_tokenizer(seed)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    text = dict(spec["text"])
    mrope = text.pop("mrope_section")
    config = Qwen3VLConfig(
        text_config=dict(**text, vocab_size=len(tokenizer), max_position_embeddings=8192,
                         pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0,
                                          "mrope_section": mrope, "mrope_interleaved": True}),
        vision_config=dict(**spec["vision"], patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                           out_hidden_size=text["hidden_size"], num_position_embeddings=256),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    image_processor = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                               size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256})
    processor = TandemQwen3VLProcessor(image_processor, tokenizer, chat_template=chat_template(spec["thinking"]))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    tokenizer.chat_template = processor.chat_template
    tokenizer.save_pretrained(out)
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


def resolve_model_ref(ref: str, seed: int = 0) -> str:
    """A path or hub id `from_pretrained` can take. `tiny:<size>` is built once into the cache,
    atomically, so concurrent replicas never see a half-written checkpoint."""
    if not ref.startswith("tiny:"):
        return ref
    size = ref.split(":", 1)[1]
    target = cache_dir() / f"tiny-{size}-seed{seed}-v{TINY_VERSION}"
    if (target / "config.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build_tiny(staging, size, seed)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race to a complete twin: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)
