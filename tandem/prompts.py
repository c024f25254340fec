"""Every prompt Tandem sends to a model, built here as ChatML text (Qwen's format), and nowhere else.

Pure functions of (question, number of images, reasoning format, excerpt): golden-tested. Models
speak tokens and features; the engine only expands each image placeholder to its feature count.
Text from clients and from models is stripped of control tokens before it enters a prompt, so
neither can forge an image placeholder or close a turn.
"""

from __future__ import annotations

import hashlib
import re

IMAGE_PAD = "<|image_pad|>"
IMAGE_PLACEHOLDER = "<|vision_start|>" + IMAGE_PAD + "<|vision_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_MARK = "Answer:"

SHORT_ANSWER_INSTRUCTION = "Answer with a single word, number or option letter."
REASON_INSTRUCTION = f"Think step by step, then give the final answer after '{ANSWER_MARK}'."
TRANSFER_HEADER = "Key reasoning from a helper model (may be incomplete):"

# Every special token of the Qwen3 family's vocabulary: `<|...|>` ones and the tag-shaped ones.
_CONTROL_TOKENS = re.compile(r"<\|[a-z_]+\|>|</?(?:think|tool_call|tool_response)>")


def sanitize(text: str) -> str:
    """Remove control tokens (`<|im_end|>`, `<|image_pad|>`, `<think>`, ...) from untrusted text, to a
    fixed point: one removed from inside another (`<|im_<|x|>end|>`) must not leave a real one behind.
    Text without control tokens comes back unchanged."""
    while True:
        cleaned = _CONTROL_TOKENS.sub("", text)
        if cleaned == text:
            return text
        text = cleaned


def _user_turn(question: str, n_images: int, *extra: str) -> str:
    body = IMAGE_PLACEHOLDER * n_images + sanitize(question).strip()
    for part in extra:
        body += "\n" + part
    return f"<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"


def direct_prompt(question: str, n_images: int, reasoning_format: str) -> str:
    """The model answers at once, short, without reasoning."""
    prompt = _user_turn(question, n_images, SHORT_ANSWER_INSTRUCTION)
    if reasoning_format == "think_tags":
        # A choice, not the model's documented switch: Qwen3's text models turn thinking off with
        # exactly this empty thought (their template's enable_thinking=False writes it), but the
        # Qwen3-VL Thinking templates have no such switch and open <think> on every turn, so for
        # them this prefill is outside what they were trained on. It is the only way to a direct
        # answer without a reasoning; its effect on accuracy needs real weights (README, prompts).
        prompt += f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"
    return prompt


def reasoning_prompt(question: str, n_images: int, reasoning_format: str) -> str:
    """The model reasons first; the reasoning ends at `reasoning_stop(reasoning_format)`."""
    if reasoning_format == "think_tags":
        return _user_turn(question, n_images, SHORT_ANSWER_INSTRUCTION) + f"{THINK_OPEN}\n"
    return _user_turn(question, n_images, REASON_INSTRUCTION)


def reasoning_stop(reasoning_format: str) -> str:
    return THINK_CLOSE if reasoning_format == "think_tags" else ANSWER_MARK


def answer_after_reasoning(prompt: str, reasoning: str, reasoning_format: str) -> str:
    """Continue a reasoning prompt with its (possibly cut) reasoning, closed, so the answer follows."""
    reasoning = sanitize(reasoning).rstrip()
    if reasoning_format == "think_tags":
        return f"{prompt}{reasoning}\n{THINK_CLOSE}\n\n"
    # No trailing space: BPE attaches a space to the word after it (' blue'), so a prompt ending in a
    # bare space asks the model for a token it never sees in natural text.
    return f"{prompt}{reasoning}\n{ANSWER_MARK}"


def transfer_prompt(question: str, n_images: int, excerpt: str, reasoning_format: str) -> str:
    """The large model answers short, with the small model's selected reasoning in its user turn,
    after the question and before the answer instruction."""
    prompt = _user_turn(question, n_images, "", TRANSFER_HEADER, sanitize(excerpt).strip(), "",
                        SHORT_ANSWER_INSTRUCTION)
    if reasoning_format == "think_tags":
        prompt += f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"
    return prompt


def split_reasoning(text: str, reasoning_format: str) -> tuple[str, str | None]:
    """Split a reasoning completion into (reasoning, answer); answer is None when the model never
    closed its reasoning (cut by the budget)."""
    stop = reasoning_stop(reasoning_format)
    if stop in text:
        reasoning, answer = text.split(stop, 1)
        return reasoning.strip(), answer.strip()
    return text.strip(), None


def template_fingerprint() -> str:
    """A digest of every template above, rendered for both reasoning formats: trained checkpoints
    record it, and a test fails when a prompt changed under them (prompts and weights are one
    contract: a changed prompt needs a retrain)."""
    parts = [sanitize("<|im_end|>x<think>")]
    for fmt in ("think_tags", "prompted"):
        reasoning = reasoning_prompt("Q?", 1, fmt)
        parts += [direct_prompt("Q?", 1, fmt), reasoning, reasoning_stop(fmt),
                  answer_after_reasoning(reasoning, "R", fmt), transfer_prompt("Q?", 1, "E", fmt)]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]
