"""The losses a training step sums: the answer's cross-entropy (with per-token weights) and the
auxiliary attention and readout losses (`PointerProbe`, `CountLens`) at the heads named here."""

from __future__ import annotations



# The counting head: the pointer's layer, the other key/value group; a question's count is taken at
# its colour word and copied to the answer by a head of the last layer. Measured on 1,500 held-out
# count questions after 1,000 count-heavy steps (`training/probes/count_probe.py`): 60 % right so,
# 49 % counting at the answer in this layer, 33-44 % a layer earlier (at the answer or the colour word).
COUNT_LAYER, COUNT_HEAD = 2, 2


COPY_LAYER, COPY_HEAD = 3, 1


# The trace's copies (`traced_copies`, a phase's `trace_attend`): in the pointer's layer, each the other
# head of one key/value group — a word copied from the question beside the pointer (both fetch the word
# said next), a running sum's previous sum beside the counting head; a sum's addend, the token just
# before it, a layer earlier, so that both terms are at the sum's position when layer 2 adds them.
# `trace_readout` reads the copy at this layer's output with `CountLens` (the counting layer, the same).
# A row or column number copied from the question (`place`) is a copy from the question too: same head.
TRACE_HEADS = {"copy": (2, 1), "sum": (2, 3), "addend": (1, 0), "place": (2, 1), "asked": (2, 1),
               "verdict": (2, 3)}


# The kinds a phase's `trace_attend` and `trace_readout` teach unless it names them (`trace_kinds`):
# `place`, `asked` and `verdict` came later, and a schedule written before them trains as it did.
TRACE_KINDS = ("copy", "sum", "addend")


# The kinds that copy a word of the question, whose copied token `trace_readout` teaches the stream to say.
SAID_KINDS = ("copy", "place")


# Kinds whose attention loss is added to the mean of the others instead of averaged into it (`asked`,
# `verdict`).
ADDED_KINDS = ("asked", "verdict")


assert TRACE_HEADS["copy"][0] == COUNT_LAYER


class PointerProbe:
    """Supervised attention (an auxiliary loss, for training only): one head of one decoder layer is
    taught to attend, as a colour word of a caption, a trace or an answer is predicted, to the visual
    token of the cell that word reads (`pointed_cells`). The look-up of a named cell is the large
    model's slowest transition (~1,600-2,000 steps of 32 before a colour
    question is answered above chance); the answers alone teach the pointer by one sparse signal
    through every layer, this one names it at the head. The saved model is a plain Qwen3-VL: the
    probe reads the layer's own projections and adds no weight."""

    def __init__(self, model, layer: int = 2, head: int = 0):
        self.attn = model.model.language_model.layers[layer].self_attn
        self.head, self.seen = head, None
        self.attn.register_forward_pre_hook(self.keep, with_kwargs=True)

    def keep(self, module, args, kwargs):
        self.seen = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0], kwargs["position_embeddings"])

    def loss(self, pointers):
        """Mean negative log attention of the head on each pointer's cell: pointers (N, 3) = (row,
        query position, key position), the query the position that predicts the colour word; or
        (N, 4) with a group id last, the keys of one group to be attended equally (a cross-entropy
        against the uniform share over them), averaged per group."""
        import torch
        from transformers.models.qwen3_vl.modeling_qwen3_vl import rotate_half

        hidden, (cos, sin) = self.seen
        a, hd = self.attn, self.attn.head_dim
        rows, q_at, k_at = pointers[:, :3].unbind(1)
        batch, length = hidden.shape[:2]
        kv = self.head // a.num_key_value_groups
        k = a.k_norm(a.k_proj(hidden).view(batch, length, -1, hd)[:, :, kv])
        k = k * cos + rotate_half(k) * sin
        q = a.q_norm(a.q_proj(hidden[rows, q_at]).view(len(rows), -1, hd)[:, self.head])
        q = q * cos[rows, q_at] + rotate_half(q) * sin[rows, q_at]
        scores = torch.einsum("nd,ntd->nt", q, k[rows]).float() * a.scaling
        future = torch.arange(length)[None] > q_at[:, None]
        logp = scores.masked_fill(future, float("-inf")).log_softmax(-1)
        picked = -logp[torch.arange(len(rows)), k_at]
        if pointers.shape[1] == 3:
            return picked.mean()
        groups = pointers[:, 3]
        size = torch.bincount(groups).float()
        return (picked / size[groups]).sum() / (size > 0).sum()


class CountLens:
    """A readout target (an auxiliary loss, for training only): where a count is taken — the counting
    head's query — the residual stream after the counting layer, read through the model's own final
    norm and vocabulary projection, is taught to say the count's number, so that what the copy head
    (the next layer) moves from a question's colour word to its answer is already the number. Adds no
    weight: the saved model is a plain Qwen3-VL."""

    def __init__(self, model, layer: int = COUNT_LAYER):
        self.model, self.seen = model, None
        model.model.language_model.layers[layer].register_forward_hook(self.keep)

    def keep(self, module, args, output):
        self.seen = output[0] if isinstance(output, tuple) else output

    def loss(self, readouts):
        """Cross-entropy of the number's first token at each readout: (N, 3) = (row, position, token)."""
        import torch.nn.functional as F

        rows, at, token = readouts.unbind(1)
        hidden = self.model.model.language_model.norm(self.seen[rows, at])
        return F.cross_entropy(self.model.lm_head(hidden).float(), token)


def sequence_mean_loss(logits, labels):
    """Cross-entropy averaged per sequence, then over the batch: a two-token direct answer weighs as
    much as a fifty-token trace."""
    import torch.nn.functional as F

    logits, labels = logits[:, :-1].float(), labels[:, 1:]
    mask = labels != -100
    loss = F.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none") * mask
    return (loss.sum(1) / mask.sum(1).clamp(min=1)).mean()


def answer_loss(model, batch: dict, labels, weights=None):
    """`sequence_mean_loss` with the vocabulary projection taken only where there is a target: most
    of a sequence is the prompt (the image, the question, the options), so the full logits were mostly
    thrown away. The same loss up to float rounding; measured 9 % (large) and 21 % (small) off a step.
    `weights` (the shape of `labels` less one column, by the position that predicts a token) weighs
    tokens within their sequence's mean, which still divides by the count of target tokens."""
    import torch
    import torch.nn.functional as F

    hidden = model.model(**batch)[0][:, :-1]
    targets = labels[:, 1:]
    mask = targets != -100
    per_token = F.cross_entropy(model.lm_head(hidden[mask]).float(), targets[mask], reduction="none")
    if weights is not None:
        per_token = per_token * weights[mask]
    per_row = torch.zeros(len(labels), dtype=per_token.dtype).index_add_(0, mask.nonzero()[:, 0], per_token)
    return (per_row / mask.sum(1).clamp(min=1)).mean()


def trace_attention_loss(tracers: dict, phase: dict, copies: dict):
    """(mean, added): the attention losses of the kinds of a trace's copies a phase teaches, found in
    a batch — the mean over the kinds, and the sum of `ADDED_KINDS`' own, outside that mean (None when
    a part has none). `tracers` holds a `PointerProbe` per (layer, head) of the phase's `trace_heads`."""
    found = [(kind, rows) for kind, rows in copies.items()
             if kind in phase["trace_kinds"] and rows is not None and len(rows)]
    losses = {kind: tracers[phase["trace_heads"][kind]].loss(rows) for kind, rows in found}
    averaged = [x for kind, x in losses.items() if kind not in ADDED_KINDS]
    added = [x for kind, x in losses.items() if kind in ADDED_KINDS]
    return (sum(averaged) / len(averaged) if averaged else None), (sum(added) if added else None)


def weighs(phase: dict, *losses: str) -> bool:
    """Whether a phase gives any of these auxiliary losses a weight (a phase from the command line
    names none of them)."""
    return any(phase.get(name, 0.0) > 0 for name in losses)
