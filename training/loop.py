"""The training loop: one role from scratch (or on from a checkpoint) through a recipe's phases, on
one process or data-parallel over several (one core each, gradients averaged before each step).
Saves the checkpoint and its `training.json` facts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from tandem import prompts
from tandem.checkpoints import new_tiny, save_checkpoint
from training.batches import Batcher, batch_stream
from training.examples import CORRUPT_P, COUNT_OPTIONS, FORMATS, RANDOM_ACCESS_P, build_task_tokenizer
from training.models import TRAINED_SIZES, batch_vision_attention, cpu_facts, from_checkpoint, init_number_embeddings, init_vision_positions
from training.objectives import COPY_HEAD, COPY_LAYER, COUNT_HEAD, COUNT_LAYER, CountLens, PointerProbe, SAID_KINDS, TRACE_HEADS, answer_loss, trace_attention_loss, weighs
from training.schedule import lr_at, mix_at, phase_of, phase_settings, role_schedule


def train(role: str, out: Path, *, steps: int, lr: float, read_first: float = 0.25, batch_size: int = 32,
          seed: int = 0, tokenizer=None, bf16: bool = False, progress: bool = True,
          mix: dict[str, float] | None = None, reason_tiers: dict[str, float] | None = None,
          direct_tiers: dict[str, float] | None = None,
          finish_mix: dict[str, float] | None = None, finish_share: float | None = None,
          init_from: str | None = None, data_workers: int = 1, phases: list[dict] | None = None,
          schedule_file: str | None = None, procs: int = 1, rank: int = 0, port: int = 0) -> dict | None:
    """Train one role — from scratch, or on from the checkpoint `init_from` (its weights and tokenizer) —
    and save it to out; returns the facts for its model card. `phases` (a recipe) chains phases in one
    run, each with its own steps, peak LR, mix and tiers, a fresh AdamW, its own warm-up and cosine; the
    other settings come from the first phase. Without `phases` the keyword settings make one phase.
    `procs` > 1 trains data-parallel in that many processes (one core each, `rank` 0 this one): each
    takes its share of every batch's rows and the gradients are averaged before each step; rank 0
    saves and returns the facts, the others return None."""
    import torch

    settings = {k: v for k, v in locals().items() if k != "torch"}
    if not phases:
        phases = [dict(steps=steps, lr=lr, read_first=read_first, mix=mix, finish_mix=finish_mix,
                       finish_share=finish_share, reason_tiers=reason_tiers, direct_tiers=direct_tiers)]
    phases = [{**phase_settings(p), **dict(zip(("mix", "finish_mix", "finish_share"),
                                               role_schedule(role, p["mix"], p["finish_mix"], p["finish_share"])))}
              for p in phases]
    first = phases[0]
    if procs < 1 or batch_size % procs:
        raise ValueError(f"a batch of {batch_size} does not split into {procs} equal shares")
    torch.manual_seed(seed)
    model, processor, tokenizer, base = _start_model(role, seed, tokenizer, init_from, first)
    children, store = [], None
    if procs > 1:
        if rank == 0:
            store = host_store(procs)
            port = store.port
            children = start_ranks({**settings, "tokenizer": None if init_from else tokenizer}, port)
        join_ranks(model, rank, procs, port, store)
    batch_vision_attention(model)
    batcher = Batcher(role, tokenizer, processor.image_processor, model.config.image_token_id,
                      seed=seed * 2 + (role == "large"), reason_tiers=first["reason_tiers"],
                      direct_tiers=first["direct_tiers"], shard=(rank, procs))
    model.train()
    start = time.perf_counter()
    losses, items = _run_steps(model, batcher, phases, batch_size, bf16, procs, data_workers,
                               progress=progress and rank == 0, role=role)
    model.eval()
    seconds = time.perf_counter() - start
    if procs > 1:
        _finish_ranks(children)
        if rank:
            return None
    save_checkpoint(out, model, processor, tokenizer)
    facts = run_facts(settings, phases, model, losses, items, seconds)
    if init_from:
        # The checkpoint trained on (its own facts, nested): a card describes both.
        facts["init_from"], facts["base"] = init_from, base
    (Path(out) / "training.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def _start_model(role: str, seed: int, tokenizer, init_from: str | None, first: dict):
    """(model, processor, tokenizer, base facts): the checkpoint to train on, or a new tiny model of the
    role's size with the task tokenizer and its initial embeddings."""
    if init_from:
        return from_checkpoint(init_from)
    tokenizer = tokenizer or build_task_tokenizer(seed)
    model, processor, tokenizer = new_tiny(TRAINED_SIZES[role], tokenizer, seed)
    init_vision_positions(model)
    if first.get("number_init"):
        init_number_embeddings(model, tokenizer)
    return model, processor, tokenizer, None


def _finish_ranks(children: list) -> None:
    import torch.distributed as dist

    dist.destroy_process_group()
    for process in children:
        process.join()
        if process.exitcode:
            raise RuntimeError(f"a training process exited with {process.exitcode}")


class _Heads:
    """The auxiliary losses' probes a run's phases need (None where no phase weighs them), and the
    running values of each loss for the progress bar."""

    def __init__(self, model, phases: list[dict]):
        self.probe = PointerProbe(model) if any(weighs(p, "attend", "count_attend") for p in phases) else None
        self.counter = PointerProbe(model, layer=COUNT_LAYER, head=COUNT_HEAD) if self.probe else None
        self.copier = PointerProbe(model, layer=COPY_LAYER, head=COPY_HEAD) if self.probe else None
        self.tracers = {(layer, head): PointerProbe(model, layer=layer, head=head)
                        for p in phases if weighs(p, "trace_attend") for layer, head in p["trace_heads"].values()}
        self.lens = CountLens(model) if any(weighs(p, "count_readout", "trace_readout") for p in phases) else None
        self.shown = {"pointer": [], "count": [], "readout": [], "trace": [], "said": []}


def _run_steps(model, batcher, phases: list[dict], batch_size: int, bf16: bool, procs: int, data_workers: int,
               *, progress: bool, role: str) -> tuple[list[float], int]:
    """Every step of every phase: (the loss of each step, the items drawn)."""
    import torch
    from tqdm import tqdm

    heads, losses, items, total = _Heads(model, phases), [], 0, sum(p["steps"] for p in phases)

    def plan(step: int) -> tuple[dict, dict, bool]:
        phase, at = phase_of(phases, step)
        p = phases[phase]
        return (mix_at(at, p["steps"], p["read_first"], p["mix"], p["finish_mix"], p["finish_share"]),
                {"reason": p["reason_tiers"], "direct": p["direct_tiers"]},
                weighs(p, "attend", "count_attend", "trace_attend", "trace_readout") or p["computed_weight"] != 1
                or p["answer_weight"] != 1)

    stream = batch_stream(batcher, total, batch_size, workers=data_workers, schedule=plan)
    bar = tqdm(stream, total=total, desc=f"train {role}", disable=not progress, mininterval=2)
    for step, (batch, items) in enumerate(bar):
        phase, at = phase_of(phases, step)
        p = phases[phase]
        if at == 0:  # each phase a fresh AdamW
            optim = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=(0.9, 0.98), weight_decay=0.01)
        for group in optim.param_groups:
            group["lr"] = lr_at(at, p["steps"], p["lr"], warmup=max(1, p["steps"] // 20))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = _step_loss(model, batch, p, heads)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        if procs > 1:
            loss = average_gradients(model, loss, procs)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(loss.item())
        if step % 10 == 0:
            shown = {"loss": losses, **heads.shown}
            bar.set_postfix(**{name: f"{sum(xs[-10:]) / len(xs[-10:]):.3f}" for name, xs in shown.items() if xs})
    return losses, items


def _token_weights(batch: dict, labels, p: dict):
    """Per-token loss weights: the numbers a trace computes and the answer after a trace, weighed as the
    phase says; None when every token weighs 1."""
    import torch

    computed, answered = batch.pop("computed", None), batch.pop("answered", None)
    weights = None
    for key, where in (("computed_weight", computed), ("answer_weight", answered)):
        if p[key] != 1 and where is not None and len(where):
            weights = torch.ones(labels[:, 1:].shape) if weights is None else weights
            weights[where[:, 0], where[:, 1]] = p[key]
    return weights


def _step_loss(model, batch: dict, p: dict, heads: _Heads):
    """One step's loss: the answer's cross-entropy plus each auxiliary loss the phase weighs."""
    import torch

    labels, pointers, counters = batch.pop("labels"), batch.pop("pointers", None), batch.pop("counters", None)
    copies, readouts = batch.pop("copies", None), batch.pop("readouts", None)
    weights = _token_weights(batch, labels, p)
    trace_copies = {kind: batch.pop(f"{kind}_copies", None) for kind in TRACE_HEADS}
    said_copies = {kind: batch.pop(f"{kind}_readouts", None) for kind in SAID_KINDS}
    # a phase's readout says the kinds it teaches, in SAID_KINDS' order
    copy_readouts = [r for kind, r in said_copies.items() if kind in p["trace_kinds"] and r is not None]
    copy_readouts = torch.cat(copy_readouts) if copy_readouts else None
    loss, shown = answer_loss(model, batch, labels, weights), heads.shown
    if not weighs(p, "attend", "count_attend"):
        pointers = counters = copies = None  # a phase that points only at the trace's copies
    if pointers is not None and len(pointers):
        aux = heads.probe.loss(pointers)
        shown["pointer"].append(aux.item())
        loss = loss + p["attend"] * aux
    if counters is not None and len(counters):
        aux = heads.counter.loss(counters)
        shown["count"].append(aux.item())
        loss = loss + p.get("count_attend", p["attend"]) * aux
    if copies is not None and len(copies):
        loss = loss + p.get("count_attend", p["attend"]) * heads.copier.loss(copies)
    if weighs(p, "trace_attend"):
        mean, added = trace_attention_loss(heads.tracers, p, trace_copies)
        if mean is not None:
            shown["trace"].append(mean.item())
            loss = loss + p["trace_attend"] * mean
        if added is not None:
            loss = loss + p["trace_attend"] * added
    if weighs(p, "trace_readout") and copy_readouts is not None and len(copy_readouts):
        aux = heads.lens.loss(copy_readouts)
        shown["said"].append(aux.item())
        loss = loss + p["trace_readout"] * aux
    if heads.lens is not None and weighs(p, "count_readout") and readouts is not None and len(readouts):
        aux = heads.lens.loss(readouts)
        shown["readout"].append(aux.item())
        loss = loss + p["count_readout"] * aux
    return loss


def run_facts(settings: dict, phases: list[dict], model, losses: list[float], items: int, seconds: float) -> dict:
    """The facts of a finished run for its `training.json` and model card: its settings, the machine,
    the size, and the mean loss over the first and the last 50 steps (a fifth of a shorter run), per
    phase too."""
    import torch
    import transformers

    first, role, batch_size = phases[0], settings["role"], settings["batch_size"]
    window = max(1, min(50, first["steps"] // 5))
    optional = {}
    for key in ("attend", "count_attend", "count_readout", "trace_attend", "trace_readout", "number_init"):
        if key == "count_attend":
            if first.get("count_attend", first.get("attend")) != first.get("attend"):
                optional[key] = first[key]
        elif first.get(key):
            optional[key] = True if key == "number_init" else first[key]
    optional.update({key: first[key] for key in ("computed_weight", "answer_weight") if first[key] != 1})
    facts = {"role": role, "reasoning_format": FORMATS[role], "steps": first["steps"], "batch_size": batch_size,
             "examples": first["steps"] * batch_size, "items": items, "lr": first["lr"], "seed": settings["seed"],
             "bf16_autocast": settings["bf16"], "threads": torch.get_num_threads(),
             "data_workers": settings["data_workers"],
             **({"procs": settings["procs"]} if settings["procs"] > 1 else {}),
             "train_seconds": round(seconds, 1), "cpu": cpu_facts(), "transformers": transformers.__version__,
             "parameters": sum(p.numel() for p in model.parameters()),
             "sizes": {k: v for k, v in TRAINED_SIZES[role].items() if k != "thinking"},
             "read_first": first["read_first"], "mix": first["mix"],
             "reason_tiers": first["reason_tiers"],  # None: the task's own mix
             **({"direct_tiers": first["direct_tiers"]} if first["direct_tiers"] else {}),
             "finish_mix": first["finish_mix"], "finish_share": first["finish_share"] if first["finish_mix"] else None,
             "random_access_p": RANDOM_ACCESS_P,
             "corrupt_hint_p": CORRUPT_P if "transfer" in first["mix"] else None,
             **optional,
             "loss_first": round(sum(losses[:window]) / window, 4),
             "loss_last": round(sum(losses[-window:]) / window, 4),
             "prompt_fingerprint": prompts.template_fingerprint(),
             "count_options": COUNT_OPTIONS}
    if len(phases) > 1:
        total = sum(p["steps"] for p in phases)
        ends = [sum(p["steps"] for p in phases[:i + 1]) for i in range(len(phases))]
        facts.update(steps=total, examples=total * batch_size, schedule=settings["schedule_file"], phases=[
            {**p, "loss_first": round(sum(losses[e - p["steps"]:e - p["steps"] + 50]) / min(50, p["steps"]), 4),
             "loss_last": round(sum(losses[max(e - 50, e - p["steps"]):e]) / min(50, p["steps"]), 4)}
            for p, e in zip(phases, ends)])
    return facts


def host_store(world: int):
    """Rank 0's rendezvous store for a data-parallel run of `world` ranks, listening on a port the OS
    picks and holding it from then on (`.port`): a port found free and bound later can be taken in
    between — a CI run lost one so, EADDRINUSE, with Ray's processes starting beside it."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(minutes=10),
                         wait_for_workers=False)


def store_at(port: int, world: int):
    """A client of the rendezvous store `host_store` holds at `port`."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(minutes=10))


def start_ranks(settings: dict, port: int) -> list:
    """Ranks 1.. of a data-parallel run, each a spawned process running `train` with these settings
    and the threads of this one, meeting on rank 0's store at `port`."""
    import torch
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    children = []
    for rank in range(1, settings["procs"]):
        process = context.Process(target=_rank_main, args=({**settings, "rank": rank, "port": port},
                                                          torch.get_num_threads()))
        process.start()
        children.append(process)
    return children


def _rank_main(settings: dict, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    train(**settings)


def join_ranks(model, rank: int, world: int, port: int, store=None) -> None:
    """Meet the other ranks on rank 0's store — `store` on rank 0, which hosts it (`host_store`),
    the one at `port` on the others — and start from rank 0's weights (the same seed made the same
    ones; this makes sure)."""
    from datetime import timedelta

    import torch.distributed as dist

    if store is None:  # rank 0 hosts it; the others join it as clients (both sides pass the store)
        store = store_at(port, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(minutes=10))
    for p in model.parameters():
        dist.broadcast(p.data, 0)


def average_gradients(model, loss, world: int):
    """Every rank's gradients (and loss) averaged in one all-reduce: each rank's loss is the mean over
    its equal share of the batch's rows, so the average is the whole batch's loss and gradient."""
    import torch
    import torch.distributed as dist

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
    dist.all_reduce(flat)
    flat /= world
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()
    return flat[-1]
