"""Tiny offline Qwen3-VL checkpoints of the real architecture, and resolving model references.

`build_tiny(dir, size, seed)` writes a random-init `Qwen3VLForConditionalGeneration` (from the
family's config classes), a byte-level BPE tokenizer trained in-process with Qwen's special tokens
and a ChatML template with a thinking block, and the Qwen image processor from defaults — all with
`save_pretrained`, so they load back through the same `from_pretrained` path as real checkpoints.
Same seed, same bytes. `resolve_model_ref("tiny:small")` builds one on first use into a cache;
`trained:small` / `trained:large` name the pair trained on the grid task, committed in `tandem/trained/`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

# Bump when the builder's output changes, so cached checkpoints are rebuilt.
TINY_VERSION = 3  # 3: video processor config written (vLLM's Qwen3-VL processor needs one)
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
# vLLM's CPU attention takes heads of 32, 64, 80, ... 512 only: `small` with 32-wide heads (the same
# width and depth otherwise) is the small role on engine: vllm (serve_config.vllm-cpu.yaml, tests/vllm).
TINY_SIZES["small-h32"] = dict(TINY_SIZES["small"], text=dict(TINY_SIZES["small"]["text"], head_dim=32,
                                                              mrope_section=[4, 6, 6]))


# Published Qwen3-VL dimensions: the text model is the Qwen3 dense model of that size; the vision
# tower is 24 layers x 1024 for 2B/4B and 27 x 1152 for 8B/32B, DeepStack taps three of its layers.
# `random:<name>` builds one with random weights: latency at real size with nothing downloaded.
_VISION_2B_4B = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                     deepstack_visual_indexes=[5, 11, 17])
_VISION_8B_32B = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                      deepstack_visual_indexes=[8, 16, 24])
REAL_SIZES = {
    "qwen3-vl-2b": dict(text=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                  num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
                        vision=_VISION_2B_4B, thinking=True),
    "qwen3-vl-4b": dict(text=dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                  num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
                        vision=_VISION_2B_4B, thinking=False),
    "qwen3-vl-8b": dict(text=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                  num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
                        vision=_VISION_8B_32B, thinking=False),
    "qwen3-vl-32b": dict(text=dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                                   num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
                         vision=_VISION_8B_32B, thinking=False),
}


def real_size_config(name: str, token_ids: dict | None = None):
    """A Qwen3VLConfig with a real model's dimensions (vocabulary 151936, head_dim 128, mRoPE 24/20/20)."""
    from transformers import Qwen3VLConfig

    spec = REAL_SIZES[name]
    ids = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
           "vision_end_token_id": 151653, **(token_ids or {})}
    text = dict(spec["text"])
    return Qwen3VLConfig(
        text_config=dict(**text, vocab_size=151936, head_dim=128, max_position_embeddings=262144,
                         rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0,
                                          "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
        vision_config=dict(**spec["vision"], patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                           out_hidden_size=text["hidden_size"], num_position_embeddings=2304),
        tie_word_embeddings=text["tie_word_embeddings"], **ids)


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


def build_tokenizer(seed: int = 0, corpus: list[str] | None = None):
    """A byte-level BPE tokenizer with Qwen's special tokens, trained on `corpus` (default: generic
    VQA-flavoured sentences). Any text still tokenizes, byte by byte where no merge applies."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB_SIZE - len(THINK_TOKENS), special_tokens=QWEN_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus if corpus is not None else _corpus(seed), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=32768)
    fast.add_tokens(THINK_TOKENS)  # added, not special: Qwen3 keeps them in decoded text
    return fast


def build_tiny(out_dir: str | os.PathLike, size: str = "small", seed: int = 0) -> Path:
    """Write a random-init Qwen3-VL checkpoint (model, tokenizer, processor) to out_dir: a tiny one
    (`small`, `large`) or one at a real model's size (a REAL_SIZES name; built on the GPU in bf16
    when one is present, since a real-size model in fp32 on a CPU takes minutes)."""
    if size not in TINY_SIZES and size not in REAL_SIZES:
        raise ValueError(f"unknown size '{size}'; known: {', '.join([*TINY_SIZES, *REAL_SIZES])}")
    tokenizer = build_tokenizer(seed)
    if size in REAL_SIZES:
        ids = _token_ids(tokenizer)
        config = real_size_config(size, {
            "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]})
        parts = _assemble(seed, config, tokenizer, REAL_SIZES[size]["thinking"], pixels=(256 * 256, 1024 * 1024),
                          real=True)
    else:
        parts = new_tiny(TINY_SIZES[size], tokenizer, seed)
    return save_checkpoint(out_dir, *parts)


def _token_ids(tokenizer) -> dict:
    return {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}


def new_tiny(spec: dict, tokenizer, seed: int = 0):
    """(model, processor, tokenizer): a random-init tiny Qwen3-VL of `spec` (a TINY_SIZES-shaped dict)
    around `tokenizer`, for the builder above and for training (training/train.py)."""
    from transformers import Qwen3VLConfig

    ids = _token_ids(tokenizer)
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
    return _assemble(seed, config, tokenizer, spec["thinking"], pixels=(32 * 32, 256 * 256))


def _assemble(seed: int, config, tokenizer, thinking: bool, pixels: tuple[int, int], real: bool = False):
    import torch
    from transformers import Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from tandem.processors import TandemQwen3VLProcessor

    ids = _token_ids(tokenizer)
    torch.manual_seed(seed)
    on_gpu = real and torch.cuda.is_available()
    with torch.device("cuda" if on_gpu else "cpu"):
        model = Qwen3VLForConditionalGeneration._from_config(
            config, dtype=torch.bfloat16 if on_gpu else torch.float32).eval()
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    image_processor = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                               size={"shortest_edge": pixels[0], "longest_edge": pixels[1]})
    processor = TandemQwen3VLProcessor(image_processor, tokenizer, chat_template=chat_template(thinking))
    return model, processor, tokenizer


def save_checkpoint(out_dir, model, processor, tokenizer) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    tokenizer.chat_template = processor.chat_template
    tokenizer.save_pretrained(out)
    # A tokenizer that was itself loaded (training on from a checkpoint) echoes how it was loaded
    # into its config; that describes the copy, not the tokenizer, and would pin offline loading.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    stale = {"is_local", "local_files_only"} & set(config)
    if stale:
        for key in stale:
            del config[key]
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    write_video_processor_config(out, processor.image_processor)
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


# The pair trained on the grid task (training/train.py), shipped inside the package.
TRAINED_DIR = Path(__file__).resolve().parent / "trained"
TRAINED_ROLES = ("small", "large")


def resolve_model_ref(ref: str, seed: int = 0) -> str:
    """A path or hub id `from_pretrained` can take. `trained:<small|large>` is the committed trained
    pair. `tiny:<size>` (and `random:<real size>`) is built once into the cache, atomically, so
    concurrent replicas never see a half-written checkpoint."""
    if ref.startswith("trained:"):
        role = ref.split(":", 1)[1]
        if role not in TRAINED_ROLES:
            raise ValueError(f"unknown trained model '{ref}'; known: trained:small, trained:large")
        return str(TRAINED_DIR / role)
    if not ref.startswith(("tiny:", "random:")):
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


def write_video_processor_config(out_dir, image_processor) -> None:
    """The `video_preprocessor_config.json` a real Qwen3-VL checkpoint carries: Qwen3VLVideoProcessor's
    defaults at the checkpoint's patch geometry. Tandem answers images only and never loads it (it
    needs torchvision); vLLM's Qwen3-VL input processor does, on every checkpoint it serves."""
    import json

    config = {"video_processor_type": "Qwen3VLVideoProcessor", "do_convert_rgb": True, "do_normalize": True,
              "do_rescale": True, "do_resize": True, "do_sample_frames": True, "fps": 2,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "max_frames": 768,
              "min_frames": 4, "max_video_tokens": 768, "resample": 3, "rescale_factor": 1 / 255,
              "return_metadata": False, "size": {"longest_edge": 786432, "shortest_edge": 131072},
              "patch_size": image_processor.patch_size, "merge_size": image_processor.merge_size,
              "temporal_patch_size": image_processor.temporal_patch_size}
    (Path(out_dir) / "video_preprocessor_config.json").write_text(json.dumps(config, indent=2) + "\n")
