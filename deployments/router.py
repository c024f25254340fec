"""Router: the HTTP ingress. Reads bytes, lets the core parse and validate them, runs the core
pipeline with the three model deployments' handles as its stages (streamed ones consumed with
`handle.options(stream=True)` and forwarded as SSE deltas at once), and writes the response.
Errors become OpenAI-shaped JSON here, once; metrics and the per-request log line are emitted here."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
import weakref

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from ray.serve.metrics import Counter, Histogram
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tandem import openai_api
from tandem.admission import Admission
from tandem.chat_schema import short
from tandem.auth import check_authorization, load_api_keys
from tandem.config import TandemConfig
from tandem.errors import NotFound, Overloaded, PayloadTooLarge, ReplicaLost, StageTimeout, TandemError
from tandem.pipeline import Pipeline, Stages
from tandem.schemas import GenerationOutput, GenerationRequest, TandemResult, TokenDelta

logger = logging.getLogger("ray.serve")
_INTERNAL = TandemError("internal error while answering; see the server log")
_LATENCY_BOUNDARIES_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000]
_TPOT_BOUNDARIES_MS = [0.5, 1, 2, 5, 10, 20, 30, 50, 75, 100, 200, 500]


_TRIES_ON_LOST_REPLICA = 3
_LOST_REPLICA = "a model replica was lost while answering; retry shortly"


async def _on_a_live_replica(send):
    """Awaits `send()`, and sends again when the replica it reached died before answering (killed,
    its node lost): a handle drops a replica from its choices once a call to it fails, so the next
    try goes to a live one, or waits for the replacement within the stage's deadline. A model call
    is a pure function of its request, so sending it again is safe; a stream that already forwarded
    text is not sent again (the client has seen it), nor is a call that ran out of tries: both are
    a 503 the client may retry."""
    for attempt in range(_TRIES_ON_LOST_REPLICA):
        try:
            return await send()
        except RayActorError as err:
            if attempt == _TRIES_ON_LOST_REPLICA - 1:
                raise ReplicaLost(_LOST_REPLICA, retry_after_s=1) from err
            logger.warning("a model replica was lost (%s); sending the call again", type(err).__name__)
            await asyncio.sleep(0.05 * 2 ** attempt)  # lets the handle hear of the death first


def _generate_stage(handle: DeploymentHandle):
    """A pipeline stage over a model server: unary, or streamed (`stream=True`) when the pipeline
    wants the text as it is decoded. Leaving a stream early cancels it on the replica."""
    async def streamed(request: GenerationRequest, sink) -> GenerationOutput:
        events = handle.options(stream=True).stream.remote(request)
        forwarded = False
        try:
            async for event in events:
                if isinstance(event, TokenDelta):
                    forwarded = True
                    sink(event.text)
                else:
                    return event
        except RayActorError as err:
            if forwarded:  # the client has seen part of this stream: it is not sent again
                raise ReplicaLost(_LOST_REPLICA, retry_after_s=1) from err
            raise
        except BaseException:
            events.cancel()
            raise
        raise RuntimeError("the model server's stream ended without an output")

    async def call(request: GenerationRequest, sink=None) -> GenerationOutput:
        if sink is None:
            return await _on_a_live_replica(lambda: handle.generate.remote(request))
        return await _on_a_live_replica(lambda: streamed(request, sink))
    return call


class Router:
    def __init__(self, vision: DeploymentHandle, small: DeploymentHandle, large: DeploymentHandle,
                 config: TandemConfig):
        self.config = config
        self.api_keys = load_api_keys(config.http)
        self.model_handles = {"VisionEncoder": vision, "SmallReasoner": small, "LargeAnswerer": large}
        self.admission = Admission(config.http.max_in_flight)
        self.pipeline = Pipeline(config, Stages(
            encode=lambda images, role: _on_a_live_replica(lambda: vision.encode.remote(images, role)),
            small=_generate_stage(small), large=_generate_stage(large)))
        self.requests = Counter("tandem_requests", "Answered requests by policy and path.", ("policy", "path"))
        self.errors = Counter("tandem_errors", "Failed requests by HTTP status.", ("status",))
        self.transfers = Counter("tandem_transfers", "Requests whose small-model reasoning was transferred; "
                                 "divide by tandem_requests for the transfer rate.", ("policy",))
        self.transferred_tokens = Counter("tandem_transferred_tokens", "Reasoning tokens transferred.", ("policy",))
        self.stage_latency = Histogram("tandem_stage_latency_ms", "Latency of each pipeline stage.",
                                       _LATENCY_BOUNDARIES_MS, ("stage",))
        # What operators autoscale LLM servers on, per generating stage.
        per_stage = ("stage", "role", "engine", "policy")
        self.stage_ttft = Histogram("tandem_stage_ttft_ms", "Time to a generating stage's first token, from its "
                                    "call reaching the model server.", _LATENCY_BOUNDARIES_MS, per_stage)
        self.stage_tpot = Histogram("tandem_stage_tpot_ms", "Time per output token of a generating stage, after "
                                    "its first.", _TPOT_BOUNDARIES_MS, per_stage)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path[len(request.scope.get("root_path", "")):] or "/"
        try:
            if request.method == "GET" and path == "/healthz":
                return JSONResponse({"status": "ok"})
            if request.method == "GET" and path == "/readyz":
                return await self._ready()
            check_authorization(request.headers.get("authorization"), self.api_keys)
            if request.method == "GET" and path == "/v1/models":
                return JSONResponse(openai_api.models_list(self.config))
            if request.method == "POST" and path == "/v1/chat/completions":
                return await self._chat(request)
            raise NotFound(f"no route for {short(request.method)} {short(path)}")
        except TandemError as err:
            self.errors.inc(tags={"status": str(err.status)})
            headers = {"Retry-After": str(int(err.retry_after_s or 1))} if err.status in (429, 503) else None
            if err.status == 401:
                headers = {"WWW-Authenticate": "Bearer"}
            return JSONResponse(err.to_openai(), status_code=err.status, headers=headers)
        except Exception:  # the edge: a downstream failure is a clean 500, logged once, never a crash
            logger.exception("tandem request failed: %s %s", request.method, path)
            self.errors.inc(tags={"status": "500"})
            return JSONResponse(_INTERNAL.to_openai(), status_code=500)

    async def _ready(self) -> Response:
        """200 once every model deployment answers (replicas loaded and warmed up); 503 before."""
        async def probe(name, h):
            try:
                await asyncio.wait_for(h.stats.remote(), 5)
                return name, True
            except Exception:  # any failure means not ready; the probe reports which
                return name, False
        results = dict(await asyncio.gather(*(probe(n, h) for n, h in self.model_handles.items())))
        ready = all(results.values())
        return JSONResponse({"status": "ready" if ready else "starting", "deployments": results},
                            status_code=200 if ready else 503)

    def stats(self) -> dict:
        return {"pid": os.getpid(), "in_flight": self.admission.in_flight,
                "peak_in_flight": self.admission.peak, "rejected": self.admission.rejected}

    async def _chat(self, request: Request) -> Response:
        body = await self._read_body(request)
        # Admitted after the body arrives (a client sending slowly holds no slot), before any work.
        slot = self.admission.enter()
        streaming = False
        try:
            # Parsing decodes images (and may fetch allow-listed ones): off the event loop.
            chat = await asyncio.to_thread(openai_api.parse_chat_request, body, self.config,
                                           f"chatcmpl-{uuid.uuid4().hex[:24]}")
            if chat.stream:
                events = self._stream(chat, slot)
                # The stream releases its slot when it ends; a stream never started (the client left
                # before its first byte) releases it when the generator is collected.
                weakref.finalize(events, slot.release)
                streaming = True
                return StreamingResponse(events, media_type="text/event-stream")
            result = await self._answer(chat)
            return JSONResponse(openai_api.chat_completion(result, chat))
        finally:
            if not streaming:
                slot.release()

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.http.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"request body is {short(declared)} bytes; the limit is {limit}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
        return bytes(body)

    async def _answer(self, chat, on_delta=None) -> TandemResult:
        try:
            result = await asyncio.wait_for(self.pipeline.answer(chat.ask, on_delta), self.config.http.request_timeout_s)
        except asyncio.TimeoutError:
            raise StageTimeout(f"request exceeded {self.config.http.request_timeout_s} s") from None
        except BackPressureError as err:
            raise Overloaded(f"a model deployment is at capacity: {err}", retry_after_s=1) from None
        self._record(result)
        return result

    async def _stream(self, chat, slot):
        """SSE chunks as the pipeline decodes: reasoning deltas (when asked) and answer deltas the
        moment they arrive, then usage and the trace. A client that disconnects closes this
        generator, which cancels the pipeline and with it the rows decoding downstream. However the
        stream ends, its admission slot is released."""
        try:
            created = int(time.time())
            yield openai_api.stream_start(chat, created)
            queue: asyncio.Queue = asyncio.Queue()
            task = asyncio.ensure_future(self._answer(chat, lambda kind, text: queue.put_nowait((kind, text))))
            task.add_done_callback(lambda _: queue.put_nowait(None))
            answer = openai_api.AnswerStream()
            try:
                while (item := await queue.get()) is not None:
                    kind, text = item
                    piece = answer.feed(text) if kind == "content" else text
                    if piece:
                        yield openai_api.stream_delta(chat, created, kind, piece)
                result = task.result()
            except Exception as err:  # headers are sent: the error travels as the stream's last event
                if not isinstance(err, TandemError):
                    logger.exception("tandem stream failed: %s", chat.ask.request_id)
                err = err if isinstance(err, TandemError) else _INTERNAL
                self.errors.inc(tags={"status": str(err.status)})
                yield f"data: {json.dumps(err.to_openai())}\n\n"
                yield "data: [DONE]\n\n"
                return
            finally:
                if not task.done():
                    task.cancel()
            rest = openai_api.answer_pieces(answer.rest(result.answer))
            for chunk in openai_api.stream_rest(result, chat, created, rest):
                yield chunk
        finally:
            slot.release()

    def _record(self, result: TandemResult) -> None:
        self.requests.inc(tags={"policy": result.policy, "path": result.path})
        if result.transferred_tokens or result.path == "transfer":
            self.transfers.inc(tags={"policy": result.policy})
            self.transferred_tokens.inc(result.transferred_tokens, tags={"policy": result.policy})
        for stage, ms in result.latency_ms.items():
            self.stage_latency.observe(ms, tags={"stage": stage})
        for stage, s in result.stages.items():
            tags = {"stage": stage, "role": stage.split("_", 1)[0], "engine": self.config.engine, "policy": result.policy}
            self.stage_ttft.observe(s["ttft_ms"], tags=tags)
            if s.get("tpot_ms") is not None:
                self.stage_tpot.observe(s["tpot_ms"], tags=tags)
        logger.info(json.dumps({"event": "tandem_request", "request_id": result.request_id, "policy": result.policy,
                                "path": result.path, "latency_ms": round(result.latency_ms.get("total", 0.0), 1),
                                "transferred_tokens": result.transferred_tokens}))
