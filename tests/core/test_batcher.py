"""The VisionEncoder's batcher (tandem/batcher.py): what each batch holds, when it waits, and how a
failure or a caller that gives up stays with its own calls."""

from __future__ import annotations

import asyncio
import time

import pytest

from tandem.batcher import Batcher


class Worker:
    """A batch function that records each batch and, while `gate` is shut, holds it running."""

    def __init__(self):
        self.batches: list[list] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def run(self, items: list) -> list:
        self.batches.append(list(items))
        await self.gate.wait()
        return [ValueError(f"bad {i}") if i == "bad" else i * 10 for i in items]


async def _running(worker: Worker, n: int) -> None:
    while len(worker.batches) < n:
        await asyncio.sleep(0.001)


async def test_a_batch_takes_every_call_that_queued_while_the_last_one_ran():
    """Serve's @serve.batch would run the ten calls that came during the first batch as batches of
    one (each formed from its own timeout's window); here they wait for the worker and go together."""
    worker = Worker()
    batcher = Batcher(worker.run, max_batch_size=8, wait_s=0.0)
    worker.gate.clear()
    first = asyncio.ensure_future(batcher(1))
    await _running(worker, 1)
    rest = [asyncio.ensure_future(batcher(i)) for i in range(2, 12)]
    await asyncio.sleep(0.01)
    assert worker.batches == [[1]]  # one batch at a time
    worker.gate.set()
    assert await first == 10 and await asyncio.gather(*rest) == [i * 10 for i in range(2, 12)]
    assert worker.batches == [[1], list(range(2, 10)), [10, 11]]


async def test_an_idle_worker_waits_for_company_and_a_full_batch_does_not_wait():
    worker = Worker()
    batcher = Batcher(worker.run, max_batch_size=3, wait_s=0.5)
    a = asyncio.ensure_future(batcher(1))
    await asyncio.sleep(0.02)
    assert worker.batches == []  # waiting for company
    assert await asyncio.gather(a, batcher(2)) == [10, 20]
    assert worker.batches == [[1, 2]]
    start = time.monotonic()
    assert await asyncio.gather(*(batcher(i) for i in (3, 4, 5))) == [30, 40, 50]
    assert time.monotonic() - start < 0.4 and worker.batches[-1] == [3, 4, 5]


async def test_a_calls_own_failure_is_its_result_and_a_failed_batch_fails_only_its_calls():
    worker = Worker()
    batcher = Batcher(worker.run, max_batch_size=8, wait_s=0.0)
    results = await asyncio.gather(batcher(1), batcher("bad"), batcher(3))
    assert results[0] == 10 and isinstance(results[1], ValueError) and results[2] == 30

    async def broken(items):
        raise RuntimeError("tower down")
    batcher.run = broken
    with pytest.raises(RuntimeError, match="tower down"):
        await batcher(4)
    batcher.run = worker.run  # the worker went on
    assert await batcher(5) == 50


async def test_a_call_whose_caller_gave_up_is_left_out_of_its_batch():
    worker = Worker()
    batcher = Batcher(worker.run, max_batch_size=8, wait_s=0.0)
    worker.gate.clear()
    first = asyncio.ensure_future(batcher(1))
    await _running(worker, 1)
    gone, kept = asyncio.ensure_future(batcher(2)), asyncio.ensure_future(batcher(3))
    await asyncio.sleep(0.01)
    gone.cancel()
    worker.gate.set()
    assert await first == 10 and await kept == 30
    assert worker.batches == [[1], [3]]
