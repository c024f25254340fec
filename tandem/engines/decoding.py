"""Iteration-level batching for engines that decode one step at a time (transformers, fake).

A `DecodeLoop` owns one thread and one running batch. Requests join the batch between two decoding
steps (their prompts prefilled together, then merged into the batch), and each leaves it on its own:
at its `max_tokens`, its stop token or stop string, or when it is cancelled — so a 16-token answer
never waits behind a 1,024-token reasoning, and a client that goes away stops costing decode steps
within one step. Every token is handed to the request's sink as it is decoded (text held back only
while it could still be the start of a stop string), and the last event is the request's
`GenerationOutput`.

The loop's thread is the only one that touches the engine's tokenizer and model: prompts are
tokenized and checked there too, one request at a time, so one bad request fails alone.

What the loop needs from an engine (`StepEngine`): `prepare` (tokenize and validate one request),
`prefill` (a state holding next-token scores for a list of prepared requests), `join`, `keep`
(rows of a state), `choose` (the next token of each row, with its log-probability where asked, or
the exception that row's sampling raised: that row fails alone) and
`advance` (one decoding step on the chosen tokens), `detokenize`, `stop_token_ids`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Protocol

from tandem.engines.generation import next_piece, queued_events
from tandem.engines.prefix_cache import PrefixStore
from tandem.engines.protocol import EngineStats, GenerationEngine
from tandem.schemas import GenerationOutput, GenerationRequest, SamplingParams, TokenDelta

logger = logging.getLogger(__name__)
_KEEP_COUNTS = 4096  # decoded-token counts kept for the most recent requests (stats)


class StepEngine(Protocol):
    stop_token_ids: set[int]

    def prepare(self, request: GenerationRequest) -> Prepared: ...
    def prefill(self, requests: list[GenerationRequest], prepared: list[Prepared]) -> Any: ...
    def join(self, state: Any, other: Any) -> Any: ...
    def keep(self, state: Any, rows: list[int]) -> Any: ...
    def choose(self, state: Any, sampling: list[SamplingParams]) -> list[tuple[int, float | None] | Exception]: ...
    def advance(self, state: Any, token_ids: list[int]) -> None: ...
    def detokenize(self, token_ids: list[int]) -> str: ...
    def finish(self, request: GenerationRequest, output: GenerationOutput) -> None: ...


Sink = Callable[[Any], None]


@dataclass
class Prepared:
    """A request made ready by its engine: its prompt's length in tokens, what prefill needs, and how
    many of its tokens' KV the engine reuses instead of computing (a prefix cache hit)."""

    prompt_tokens: int
    data: Any
    cached_tokens: int = 0


@dataclass(eq=False)
class Row:
    request: GenerationRequest
    sink: Sink
    submitted: float = field(default_factory=time.perf_counter)
    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # characters of `text` already handed to the sink
    committed: int = 0  # tokens of `ids` whose text is in `text`
    prompt_tokens: int = 0
    cached_tokens: int = 0
    steps: int = 0
    batch_size: int = 0
    started: float | None = None
    first_token: float | None = None
    cancelled: bool = False
    done: bool = False

    def deliver(self, event: Any) -> None:
        """Hand an event to the consumer; one that is gone (its event loop closed) cancels the row."""
        try:
            self.sink(event)
        except Exception:
            self.cancelled = True


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could still begin a stop string."""
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return hold


async def collect(events: AsyncIterator[TokenDelta | GenerationOutput],
                  sink: Callable[[str], None] | None = None) -> GenerationOutput:
    """A stream's output, handing each delta's text to `sink`; the stream is closed however this
    ends, so a cancelled caller stops the decoding behind it."""
    try:
        async for event in events:
            if isinstance(event, GenerationOutput):
                return event
            if sink:
                sink(event.text)
    finally:
        await events.aclose()
    raise RuntimeError("the stream ended without an output")


class DecodeLoop:
    def __init__(self, engine: StepEngine, *, max_batch_size: int = 8, batch_wait_s: float = 0.0,
                 name: str = "decode"):
        self.engine, self.name = engine, name
        self.max_batch_size, self.batch_wait_s = max_batch_size, batch_wait_s
        self.adaptive_wait = True
        self._last_submit, self._last_gap = 0.0, float("inf")
        self._cv = threading.Condition()
        self._pending: collections.deque[Row] = collections.deque()
        self._thread: threading.Thread | None = None
        self._closed = False
        # Requests admitted together, per admission (the most recent ones: a replica lives for weeks).
        self.prefill_sizes: collections.deque[int] = collections.deque(maxlen=_KEEP_COUNTS)
        self.decoded: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.cancelled = 0

    def configure(self, max_batch_size: int, batch_wait_s: float, adaptive_wait: bool = True) -> None:
        """`adaptive_wait`: an idle loop waits `batch_wait_s` for a batch only while requests arrive
        closer together than that or come with company (`GenerationRequest.company`); a lone request
        starts at once: rows join a running batch between steps anyway. Off, an idle loop always waits
        (tests that need requests batched together)."""
        with self._cv:
            self.max_batch_size, self.batch_wait_s, self.adaptive_wait = max_batch_size, batch_wait_s, adaptive_wait

    def close(self, timeout_s: float = 10.0) -> None:
        """End the loop's thread, failing the rows still pending or running. Called as the engine shuts
        down: a daemon thread still inside a forward pass when the interpreter exits can abort the
        process ("terminate called without an active exception") after its answer was printed."""
        with self._cv:
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def check(self) -> None:
        """Raise if the loop's thread has died: every request submitted now would wait for ever."""
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError(f"{self.name}: the decode loop's thread is gone")

    # --- the three ways in --------------------------------------------------------------------
    def submit(self, request: GenerationRequest, sink: Sink) -> Row:
        row = Row(request, sink)
        with self._cv:
            if self._closed:
                raise RuntimeError(f"{self.name}: the decode loop is closed")
            now = time.monotonic()
            self._last_gap, self._last_submit = now - self._last_submit, now
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._pending.append(row)
            self._cv.notify()
        return row

    def cancel(self, row: Row) -> None:
        """Leave the batch at the next step; the row's sink gets nothing more."""
        with self._cv:
            if not row.done:
                row.cancelled = True
                self._cv.notify()

    def generate(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        """Blocking: one output per request, in order (the first failure is raised)."""
        results: list[Any] = [None] * len(batch)
        left = threading.Semaphore(0)

        def sink_for(i):
            def sink(event):
                if isinstance(event, (GenerationOutput, BaseException)):
                    results[i] = event
                    left.release()
            return sink

        for i, request in enumerate(batch):
            self.submit(request, sink_for(i))
        for _ in batch:
            left.acquire()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | GenerationOutput]:
        """Deltas as they are decoded, then the output. Closing the iterator early cancels the row."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        row = self.submit(request, lambda event: loop.call_soon_threadsafe(queue.put_nowait, event))
        try:
            async for event in queued_events(queue):
                yield event
        finally:
            self.cancel(row)

    # --- the loop -------------------------------------------------------------------------------
    def _run(self) -> None:
        state, rows = None, []
        while True:
            new = self._admit(len(rows))
            if self._closed:
                gone = RuntimeError(f"{self.name}: the engine shut down")
                for row in rows + new:
                    if row.cancelled:
                        self._finish(row, "cancelled")
                    elif not row.done:
                        self._fail(row, gone)
                return
            try:
                state, rows = self._drop_cancelled(state, rows)
                if new:
                    state, rows = self._prefill(state, rows, new)
                if rows:
                    self.engine.advance(state, [r.ids[-1] for r in rows])
                    state, rows = self._choose(state, rows)
            except Exception as err:  # an engine failure fails the rows it touched, never the loop
                logger.exception("%s: decoding step failed", self.name)
                for row in rows + new:
                    if not row.done:
                        self._fail(row, err)
                state, rows = None, []

    def _admit(self, running: int) -> list[Row]:
        with self._cv:
            while not running and not self._pending and not self._closed:
                self._cv.wait()
            if self._closed:
                new, self._pending = list(self._pending), collections.deque()
                return new
            # A batch is worth waiting for while requests come closer together than the wait, or while
            # the sender says it is answering others (their next stages are on their way).
            arriving = self._last_gap < self.batch_wait_s or any(r.request.company for r in self._pending)
            if not running and self.batch_wait_s and (arriving or not self.adaptive_wait):  # let a batch fill
                deadline = time.monotonic() + self.batch_wait_s
                while len(self._pending) < self.max_batch_size and (left := deadline - time.monotonic()) > 0:
                    self._cv.wait(left)
            new = []
            while self._pending and running + len(new) < self.max_batch_size:
                row = self._pending.popleft()
                if row.cancelled:
                    self._finish(row, "cancelled")
                else:
                    new.append(row)
            return new

    def _drop_cancelled(self, state, rows):
        if not any(r.cancelled for r in rows):
            return state, rows
        keep = [i for i, r in enumerate(rows) if not r.cancelled]
        for r in rows:
            if r.cancelled:
                self._finish(r, "cancelled")
        return (self.engine.keep(state, keep) if keep else None), [rows[i] for i in keep]

    def _prefill(self, state, rows, new):
        prepared, admitted = [], []
        for row in new:
            try:
                prepared.append(self.engine.prepare(row.request))
                admitted.append(row)
            except Exception as err:  # a bad request fails alone
                self._fail(row, err)
        if not admitted:
            return state, rows
        now = time.perf_counter()
        for row in admitted:
            row.started = now
        self.prefill_sizes.append(len(admitted))
        fresh, admitted, prepared = self._prefill_rows(admitted, prepared)
        if fresh is None:
            return state, rows
        for row, p in zip(admitted, prepared):
            row.prompt_tokens, row.cached_tokens = p.prompt_tokens, p.cached_tokens
        # Their first tokens now, from the prefill's scores: a row that ends there never joins.
        fresh, admitted = self._choose(fresh, admitted)
        if not admitted:
            return state, rows
        return (self.engine.join(state, fresh) if state is not None else fresh), rows + admitted

    def _prefill_rows(self, admitted: list[Row], prepared: list[Prepared]):
        """(state, rows, prepared) of the joining rows. A joint prefill that fails is retried row by
        row, so a row that cannot be prefilled fails alone and the others join; the running batch is
        never touched by a joining row's failure."""
        try:
            return self.engine.prefill([r.request for r in admitted], prepared), admitted, prepared
        except Exception as err:
            if len(admitted) == 1:
                self._fail(admitted[0], err)
                return None, [], []
        state, kept, kept_prepared = None, [], []
        for row, p in zip(admitted, prepared):
            try:
                one = self.engine.prefill([row.request], [p])
            except Exception as err:
                logger.warning("%s: prefill failed for one row: %s", self.name, type(err).__name__)
                self._fail(row, err)
                continue
            state = self.engine.join(state, one) if state is not None else one
            kept.append(row)
            kept_prepared.append(p)
        return state, kept, kept_prepared

    def _choose(self, state, rows):
        """Each row's next token from the scores the last forward pass left in `state` (the joining
        rows' prefill, or the batch's decoding step), chosen as soon as that pass ends: every token is
        handed on, and every finished row leaves, before the loop spends time on anything else — a
        row's last token never waits for the prefill of rows joining after it. Returns the state and
        rows still decoding."""
        choices = self.engine.choose(state, [r.request.sampling for r in rows])
        now = time.perf_counter()
        for row, choice in zip(rows, choices):
            if isinstance(choice, BaseException):  # this row's sampling failed: it fails alone
                self._fail(row, choice)
                continue
            token, logprob = choice
            row.steps += 1
            row.batch_size = max(row.batch_size, len(rows))
            row.first_token = row.first_token or now
            self._count(row)
            if token in self.engine.stop_token_ids:
                self._finish(row, "stop")
                continue
            row.ids.append(token)
            if row.request.sampling.logprobs and logprob is not None:
                row.logprobs.append(logprob)
            row.texts.append(self._new_text(row))
            stops = row.request.sampling.stop
            if stops and any(s in row.text for s in stops):
                self._cut_at_stop(row)
                self._finish(row, "stop")
            elif len(row.ids) >= row.request.sampling.max_tokens:
                self._finish(row, "length")
            else:
                self._send(row, len(row.text) - held_back(row.text, stops))
        keep = [i for i, r in enumerate(rows) if not r.done]
        if len(keep) < len(rows):
            state = self.engine.keep(state, keep) if keep else None
            rows = [rows[i] for i in keep]
        return state, rows

    # --- row bookkeeping ------------------------------------------------------------------------
    def _new_text(self, row: Row) -> str:
        """The text this token completes (`next_piece`), "" while it completes none."""
        last = len(row.ids) >= row.request.sampling.max_tokens
        piece = next_piece(self.engine.detokenize, row.ids, row.committed, last)
        if piece is None:
            return ""
        row.text, row.committed = row.text + piece, len(row.ids)
        return piece

    def _count(self, row: Row) -> None:
        rid = row.request.request_id
        if rid:
            self.decoded[rid] = self.decoded.get(rid, 0) + 1
            self.decoded.move_to_end(rid)
            while len(self.decoded) > _KEEP_COUNTS:
                self.decoded.popitem(last=False)

    @staticmethod
    def _cut_at_stop(row: Row) -> None:
        """Text ends where the first stop string begins; the token lists end with the token holding
        that point (its text trimmed), so the texts still join to the text."""
        pos = min(row.text.index(s) for s in row.request.sampling.stop if s in row.text)
        length, kept = 0, 0
        while kept < len(row.texts) and length + len(row.texts[kept]) <= pos:
            length += len(row.texts[kept])
            kept += 1
        if length < pos:  # the stop begins inside this token
            row.texts[kept] = row.texts[kept][: pos - length]
            kept += 1
        row.ids, row.texts, row.logprobs = row.ids[:kept], row.texts[:kept], row.logprobs[:kept]
        row.text = row.text[:pos]

    def _send(self, row: Row, upto: int) -> None:
        if upto > row.sent:
            piece, row.sent = row.text[row.sent:upto], upto
            row.deliver(TokenDelta(piece))

    def _finish(self, row: Row, reason: str) -> None:
        row.done = True
        if reason == "cancelled":
            self.cancelled += 1
            return
        now = time.perf_counter()
        started = row.started or now
        out = GenerationOutput(
            text=row.text, token_ids=row.ids, token_texts=row.texts, logprobs=row.logprobs,
            prompt_tokens=row.prompt_tokens, cached_tokens=row.cached_tokens, completion_tokens=len(row.ids),
            finish_reason=reason,
            latency_ms=(now - row.submitted) * 1000, ttft_ms=((row.first_token or now) - row.submitted) * 1000,
            batch_size=row.batch_size, decode_steps=row.steps, decode_ms=(now - started) * 1000,
            queue_ms=(started - row.submitted) * 1000)
        try:
            self.engine.finish(row.request, out)
        except Exception as err:
            self._fail(row, err)
            return
        self._send(row, len(row.text))
        row.deliver(out)

    def _fail(self, row: Row, err: BaseException) -> None:
        row.done = True
        row.deliver(err)


class LoopEngine(GenerationEngine):
    """A `GenerationEngine` whose requests decode in a `DecodeLoop` over its own step methods
    (`StepEngine`): the fake and the transformers engines. Subclasses set `self.loop`."""

    loop: DecodeLoop
    prefix: PrefixStore | None = None  # an engine that keeps prompt heads for follow-up stages

    def generate(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        return self.loop.generate(batch)

    def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | GenerationOutput]:
        return self.loop.stream(request)

    def configure(self, max_batch_size: int, batch_wait_s: float, *, adaptive_wait: bool = True,
                  prefix_cache_bytes: int = 0) -> None:
        self.loop.configure(max_batch_size, batch_wait_s, adaptive_wait)
        if self.prefix is not None:
            self.prefix.configure(prefix_cache_bytes)

    def check_alive(self) -> None:
        self.loop.check()

    def shutdown(self) -> None:
        self.loop.close()

    def stats(self) -> EngineStats:
        return EngineStats(prefill_sizes=list(self.loop.prefill_sizes), cancelled=self.loop.cancelled,
                           prefix_cache=self.prefix.stats() if self.prefix is not None else {})

    def decoded_tokens(self, request_id: str) -> int:
        return self.loop.decoded.get(request_id, 0)
