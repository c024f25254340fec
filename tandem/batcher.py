"""Batching of async calls for one worker (the VisionEncoder's towers): a batch is every call waiting
when the worker comes free, up to `max_batch_size`, once the oldest of them has waited `wait_s` for
company (or the batch is full). Under load, the batch grows with the queue that built up while the
last one ran, and nothing waits more.

Serve's `@serve.batch` does not do this: it forms the next batch while one runs, each from the calls
of one timeout's window after its first, and queues it behind the running one (max_concurrent_batches
1) — so a worker slower than the gap between calls runs batches of one or two, however long the
queue. On a tower whose batch of 8 costs little more than a batch of 1, that throws the batching
away exactly when it is needed."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any


class Batcher:
    """`await batcher(item)` -> that item's result from `run(items)`, which returns one result per
    item in order (an exception in place of a result is returned as it is, not raised: the caller
    decides). If `run` raises, every call of that batch raises it."""

    def __init__(self, run: Callable[[list], Awaitable[list]], max_batch_size: int, wait_s: float):
        self.run, self.max_batch_size, self.wait_s = run, max_batch_size, wait_s
        self._waiting: collections.deque[tuple[Any, asyncio.Future, float]] = collections.deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def __call__(self, item):
        if self._worker is None or self._worker.done():  # started on the caller's event loop
            self._arrived = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._work())
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append((item, future, loop.time()))
        self._arrived.set()
        return await future

    async def _work(self) -> None:
        while True:
            while not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            await self._fill()
            batch = []
            while self._waiting and len(batch) < self.max_batch_size:
                item, future, _ = self._waiting.popleft()
                if not future.done():  # its caller gave up while it waited
                    batch.append((item, future))
            if batch:
                await self._run(batch)

    async def _fill(self) -> None:
        """Wait until `max_batch_size` calls are waiting or the oldest has waited `wait_s`."""
        loop = asyncio.get_running_loop()
        deadline = self._waiting[0][2] + self.wait_s
        while len(self._waiting) < self.max_batch_size and (left := deadline - loop.time()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                return

    async def _run(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        try:
            results = await self.run([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} calls returned {len(results)} results")
        except Exception as err:  # the batch's calls fail; the worker goes on
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future), result in zip(batch, results):
            if not future.done():
                future.set_result(result)
