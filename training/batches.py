"""Batches for training: `Batcher` draws items, renders one objective's examples, tokenizes prompt
and target apart and pads them with the positions the auxiliary losses need; `batch_stream` runs it
in a worker process ahead of the step. Owns no model."""

from __future__ import annotations

import io
import random
from PIL import Image
from tasks.grid import grid_item, train_seed
from tandem import prompts
from training.examples import answer_text, computed_numbers, concluded, counted_cells, pointed_cells, question_colour_at, render_example, token_at, traced_copies
from training.objectives import SAID_KINDS, TRACE_HEADS
from training.schedule import MIX


class Batcher:
    """Training batches: one item per row, one objective per batch drawn from the role's mix, so a
    batch of short direct prompts is not padded to the length of transfer prompts (1.5-2x fewer
    tokens a step for the large model)."""

    def __init__(self, role: str, tokenizer, image_processor, image_token_id: int, seed: int,
                 reason_tiers: dict[str, float] | None = None, direct_tiers: dict[str, float] | None = None,
                 shard: tuple[int, int] = (0, 1), item_seed=train_seed):
        self.role, self.tok, self.proc, self.image_token_id = role, tokenizer, image_processor, image_token_id
        self.item_seed = item_seed  # (seed, index) -> the item's seed: training items unless a probe says
        self.tiers = {"reason": reason_tiers, "direct": direct_tiers}
        self.rng = random.Random(seed)
        self.seed, self.next_item = seed, 0
        self.mix = MIX[role]  # batch_stream sets it per step
        self.attend = False  # batch_stream sets it per step: the rows' pointers for `PointerProbe`
        # Sharded (one training process of several, `shard` = (rank, world)): every rank draws each
        # batch's objective from the same stream, and its own rows (its share of the batch's item
        # indices) from a stream of its own, so no rank makes another's rows. Unsharded, both come from
        # one stream, in the order they always did.
        self.rank, self.world = shard
        self.pick = self.rng
        if self.world > 1:
            self.pick, self.rng = random.Random(seed), random.Random(f"{seed}/{self.rank}")

    def example(self, objective: str):
        tier = None
        if tiers := self.tiers.get(objective):
            tier = self.rng.choices(list(tiers), weights=list(tiers.values()))[0]
        item = grid_item(self.item_seed(self.seed, self.next_item), tier=tier)
        self.next_item += 1
        prompt, target = render_example(item, self.role, objective, self.tok, self.rng)
        image = Image.open(io.BytesIO(item.image)).convert("RGB")
        return prompt, target, image, (item, objective)

    def batch(self, size: int) -> dict:
        import torch

        objective = self.pick.choices(list(self.mix), weights=list(self.mix.values()))[0]
        if self.world == 1:
            rows = [self.example(objective) for _ in range(size)]
        else:
            if size % self.world:
                raise ValueError(f"a batch of {size} does not split into {self.world} equal shards")
            first, local = self.next_item, size // self.world
            self.next_item += self.rank * local
            rows = [self.example(objective) for _ in range(local)]
            self.next_item = first + size
        pix = self.proc(images=[r[2] for r in rows], return_tensors="pt")
        grid = pix["image_grid_thw"]
        ids, labels, pointers, counters, copies, readouts, computed, answered = [], [], [], [], [], [], [], []
        traced, copied = {kind: [] for kind in TRACE_HEADS}, {kind: [] for kind in SAID_KINDS}
        for row, ((prompt, target, _, (item, objective)), thw) in enumerate(zip(rows, grid)):
            n = int(thw.prod()) // self.proc.merge_size ** 2
            prompt = prompt.replace(prompts.IMAGE_PAD, prompts.IMAGE_PAD * n)
            asked = self.tok(prompt, return_offsets_mapping=self.attend)
            p = asked["input_ids"]
            encoded = self.tok(target, return_offsets_mapping=self.attend)
            t = encoded["input_ids"]
            cells, side = [i for i, x in enumerate(p) if x == self.image_token_id], len(item.cells)
            if self.attend and len(cells) == side * side:
                # The query is the position that predicts the word's first token; a key, a cell's
                # visual token (row-major, as the processor merges them) or the image's start.
                query = lambda at: len(p) - 1 + token_at(encoded["offset_mapping"], at)  # noqa: E731
                key = lambda r, c: cells[(r - 1) * side + c - 1]  # noqa: E731
                pointers += [(row, query(at), key(r, c)) for at, (r, c) in pointed_cells(item, objective, target)]
                for at, counted in counted_cells(item, objective, target):
                    group, q = len(counters), query(at)
                    number = t[q + 1 - len(p)]  # the token the query predicts: the number's first
                    if objective in ("direct", "transfer"):
                        # A question's count is taken at its colour word, where the colour is the
                        # token itself, and the answer copies it from there (`COPY_LAYER`).
                        colour = token_at(asked["offset_mapping"], question_colour_at(prompt, item))
                        copies.append((row, q, colour))
                        q = colour
                    counters += [(row, q, k, group) for k in [cells[0] - 1] + [key(r, c) for r, c in counted]]
                    readouts.append((row, q, number))
            if self.attend:
                for kind, at, in_prompt, source in (traced_copies(prompt, target)
                                                    + concluded(prompt, target, objective, answer_text(item))):
                    key = (token_at(asked["offset_mapping"], source) if in_prompt
                           else len(p) + token_at(encoded["offset_mapping"], source))
                    q = len(p) - 1 + token_at(encoded["offset_mapping"], at)
                    traced[kind].append((row, q, key))
                    if kind in copied:  # what the copy head fetches is the token the query predicts
                        copied[kind].append((row, q, t[q + 1 - len(p)]))
                computed += [(row, len(p) - 1 + token_at(encoded["offset_mapping"], at)) for at in computed_numbers(target)]
                if objective == "reason":  # the answer after the trace: its first token
                    answered.append((row, len(p) - 1 + token_at(encoded["offset_mapping"],
                                                                target.rindex(answer_text(item)))))
            ids.append(p + t)
            labels.append([-100] * len(p) + t)
        width = max(map(len, ids))
        pad = self.tok.pad_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        return {"input_ids": input_ids,
                "attention_mask": torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
                "labels": torch.tensor([y + [-100] * (width - len(y)) for y in labels]),
                "mm_token_type_ids": (input_ids == self.image_token_id).long(),
                "pixel_values": pix["pixel_values"], "image_grid_thw": grid,
                **({"pointers": torch.tensor(pointers, dtype=torch.long).reshape(-1, 3),
                    "counters": torch.tensor(counters, dtype=torch.long).reshape(-1, 4),
                    "copies": torch.tensor(copies, dtype=torch.long).reshape(-1, 3),
                    "readouts": torch.tensor(readouts, dtype=torch.long).reshape(-1, 3),
                    "computed": torch.tensor(computed, dtype=torch.long).reshape(-1, 2),
                    "answered": torch.tensor(answered, dtype=torch.long).reshape(-1, 2),
                    **{f"{kind}_copies": torch.tensor(found, dtype=torch.long).reshape(-1, 3)
                       for kind, found in traced.items()},
                    **{f"{kind}_readouts": torch.tensor(said, dtype=torch.long).reshape(-1, 3)
                       for kind, said in copied.items()}} if self.attend else {})}


def batch_stream(batcher: Batcher, steps: int, batch_size: int, schedule, workers: int):
    """The run's batches in step order (`schedule(step)` -> (mix, tiers[, attend])), each with the count of items
    drawn so far, made `workers` (0 or 1)
    processes away: with one, the next batches are drawn, rendered and tokenized on the second core while
    the first trains. One producer in step order draws the same random stream as the loop did inline, so
    the weights are the same bit for bit (checked on a whole large-model run), and the training process's
    own torch random state is not touched (the loader seeds its worker from a generator of its own).
    Measured: a batch costs ~50 ms to make against ~210-280 ms to train on, yet 200 large-model steps took
    56.3 s with the worker against 57.9 s inline — the step itself is the large model's time."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            for step in range(steps):
                # the tiers (and the pointers' use) change by phase, as the mix does
                batcher.mix, batcher.tiers, *attend = schedule(step)
                batcher.attend = bool(attend and attend[0])
                yield batcher.batch(batch_size), batcher.next_item

    if workers not in (0, 1):
        raise ValueError("one producer keeps the batches in step order: workers is 0 or 1")
    return DataLoader(Stream(), batch_size=None, num_workers=workers, generator=torch.Generator(),
                      **({"prefetch_factor": 4, "multiprocessing_context": "fork"} if workers else {}))
