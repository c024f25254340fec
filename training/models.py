"""The trained pair's architecture sizes and the model-side set-up of a training run: initial
position and number embeddings, batched vision attention, loading a checkpoint to train on or probe.
Owns no data and no loss."""

from __future__ import annotations

import json
from pathlib import Path


# The small one is tiny:small's width with a third layer (with two, it read the grid well but could not
# count a row or look a value up: reasoning scored below its own direct answers); the large one is
# sized for this CPU (it only has to be clearly bigger: 2x the width, 4 layers, ~4x the parameters),
# so it gets enough steps in the time budget.
TRAINED_SIZES = {
    "small": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, mrope_section=[2, 3, 3]),
                  vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                              deepstack_visual_indexes=[1]),
                  thinking=True),
    "large": dict(text=dict(hidden_size=96, intermediate_size=288, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=24, mrope_section=[4, 4, 4]),
                  vision=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                              deepstack_visual_indexes=[1]),
                  thinking=False),
}


def init_vision_positions(model) -> None:
    """Give the vision tower's learned position table a 2D sin-cos start (as MAE does), half the
    dimensions for the row and half for the column, at the patch embedding's scale. The default
    init (std 0.02) leaves position ~40x fainter than colour in every visual token, and the decoder
    then takes thousands of steps to learn which cell is where (measured: no better than chance
    after 1,500 steps). Qwen3-VL interpolates this table to the image's patch grid, so a smooth
    table stays smooth there."""
    import torch

    table = model.model.visual.pos_embed.weight
    side, dim = int(table.shape[0] ** 0.5), table.shape[1]
    quarter = dim // 4
    freqs = 1.0 / (10.0 ** (torch.arange(quarter) / quarter))
    axis = torch.arange(side, dtype=torch.float32)[:, None] * freqs[None] * (torch.pi / 2)
    rows = torch.cat([axis.sin(), axis.cos()], 1)  # side x dim/2
    grid = torch.cat([rows[:, None].expand(side, side, -1), rows[None].expand(side, side, -1)], -1)
    with torch.no_grad():
        table.copy_(grid.reshape(side * side, dim) * (2 ** 0.5))


NUMBER_PERIODS = (10, 5, 10 / 3, 2.5, 2, 40)


def init_number_embeddings(model, tokenizer, top: int = 20) -> None:
    """Start every number token from 0 to `top` ("7" and " 7" alike) on circles, in and out: the first
    dimensions of its input embedding and of its output row hold cos and sin of 2πn/T for the periods T
    of `NUMBER_PERIODS` (10 and its harmonics, so that a sum modulo 10 is a rotation, and 40, so that 12
    is not 2), the rest stays random and tells the two spellings apart. The one-run large model's
    traces fetch both terms of a running sum (its heads put 0.98-0.99 of their weight on them) and
    still add them modulo 10 at chance (a third of compose sums right teacher-forced, most of them the
    copied total): a table it has not learned from a random start in fifteen minutes; with this start
    alone the sums stayed at chance too (docs/training.md). Adds no weight: the saved model is a plain
    Qwen3-VL."""
    import torch

    numbers = {}
    for token, index in tokenizer.get_vocab().items():
        text = tokenizer.convert_tokens_to_string([token]).strip()
        if text.isdigit() and int(text) <= top and text == str(int(text)):
            numbers[index] = int(text)
    n = torch.tensor(list(numbers.values()), dtype=torch.float32)[:, None]
    angles = 2 * torch.pi * n / torch.tensor(NUMBER_PERIODS)[None]
    circle = torch.cat([angles.cos(), angles.sin()], 1)  # len(numbers) x 2 * len(periods)
    rows = torch.tensor(list(numbers))
    for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        with torch.no_grad():
            # at the scale of a random row, so neither half drowns the other
            scale = table.std() * (table.shape[1] / circle.shape[1]) ** 0.5
            table[rows, : circle.shape[1]] = circle * scale


def batch_vision_attention(model) -> None:
    """Attention over a batch's images in one call, for training only (the saved weights and the
    serving path are untouched): Qwen3-VL's SDPA path calls attention once per image per block (64 of
    a small model's 67 attention calls a step); training images share one size, so they stack as a
    batch. The same weights bit for bit (a test holds the outputs equal), 3 % off a small model's step
    (0.276 -> 0.269 s, the same batches, steps interleaved in one process). Images of several sizes
    take the loop. Not done: the patch convolution as one matrix product, 7 % more — the same function
    to float rounding only, and the small model's recipe run with it learned no count traces: these
    runs hang on rounding (docs/training.md)."""
    import types

    import torch.nn.functional as F
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    for block in model.model.visual.blocks:
        loop = block.attn.forward

        def attention_forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None,
                              loop=loop, **kwargs):
            lengths = cu_seqlens.diff()
            size = int(lengths[0])
            if bool((lengths != size).any()):
                return loop(hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
            seq = hidden_states.shape[0]
            q, k, v = self.qkv(hidden_states).reshape(seq, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
            q, k = apply_rotary_pos_emb_vision(q, k, *position_embeddings)
            q, k, v = (t.reshape(len(lengths), size, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scaling)
            return self.proj(out.transpose(1, 2).reshape(seq, -1))

        block.attn.forward = types.MethodType(attention_forward, block.attn)


def cpu_facts() -> dict:
    """The CPU a run trained on, as far as float rounding goes: PyTorch's CPU kernels take other code
    paths by instruction set (AVX-512, AMX), and one fp32 run on another CPU ends elsewhere (README,
    reproducing the pair). Linux only; empty elsewhere."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}  # the first processor's
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    import torch

    return {"model": fields.get("model name", ""),
            "isa": sorted(f for f in flags if f.startswith(("avx512f", "amx", "avx2", "fma"))),
            "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability()}


def from_checkpoint(ref: str):
    """(model, processor, tokenizer, facts) of a saved checkpoint, loaded as the engines load it, to
    train on; facts: its training.json, None when it has none."""
    from transformers import AutoModelForImageTextToText

    from tandem.checkpoints import resolve_model_ref
    from tandem.processors import load_processor

    path = Path(resolve_model_ref(ref))
    processor = load_processor(str(path))
    facts = json.loads((path / "training.json").read_text()) if (path / "training.json").exists() else None
    return AutoModelForImageTextToText.from_pretrained(path), processor, processor.tokenizer, facts


def probed_model(ref: str):
    """(model, processor, tokenizer, facts) of a checkpoint to probe: one thread, as a replica runs, in
    eval mode (`training.probes.count_probe`, `training.probes.copy_probe`); facts: its training.json or None."""
    import torch

    torch.set_num_threads(1)
    model, processor, tokenizer, facts = from_checkpoint(ref)
    return model.eval(), processor, tokenizer, facts
