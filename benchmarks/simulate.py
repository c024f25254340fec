"""A discrete-event simulation (simpy) of a Tandem cluster, fed by a measured stage profile.

    python -m benchmarks.simulate --profile P.json --rate 200 \\
        --replicas VisionEncoder=1,SmallReasoner=2,LargeAnswerer=3 --duration-s 60
    python -m benchmarks.simulate --profile P.json --concurrency 16 --config serve_config.yaml

What is modelled, as the app does it (DESIGN §13):
- **Router pool**: each request holds a Router slot (`max_ongoing_requests`) for its whole pipeline;
  the Router's own CPU work per request (`router.ms` of the profile: parsing, the trace, the response)
  runs one request at a time on a replica's event loop. With the app's `http.max_in_flight`, a replica
  already answering that many rejects a request at once (a 503 before any work, `tandem/admission.py`).
- **Serve's handle routing** into every pool: a replica is picked by power of two choices among those
  under `max_ongoing_requests`; with none free the call waits in the caller's queue, and past
  `max_queued_requests` (per calling replica, as Serve counts it) the request is rejected with a 503.
- **VisionEncoder**: `@serve.batch` — a batch closes at `max_batch_size` calls or `batch_wait_timeout_s`
  after its oldest call; a mixed batch runs each model's tower on its images (`vision.<role>` curves).
- **SmallReasoner / LargeAnswerer**: the step-level decode loop (`tandem/engines/decoding.py`): rows
  join between steps (a prefill over the joining prompts, `prefill.<role>` by total prompt tokens),
  every step costs `step.<role>` at the running batch size, each row leaves after its own steps; an
  idle loop waits `batch_wait_timeout_s` for a batch to fill.
- **The policy's path mix** (`Workload`): agree vs transfer share, per-stage prompt tokens and decode
  steps. Open-loop Poisson arrivals at any rate, a replay of measured send times, or a closed loop
  of N clients (the last two to check against a load test).

`--host-cores N` models replicas that share N CPU cores (the local CPU app), less the cores the
profile found the machine's other processes (Ray's daemons) kept busy (`others_cores`), as the
OS shares cores among runnable threads — processor sharing (`_Cores`): everything running at once
progresses together, each thread at min(1, N / threads) of a core, recomputed whenever an activity
starts or ends, so the work done per second never exceeds the cores (until 2026-12-04 each activity's
slowdown was fixed when it started, and at concurrency 16 the simulated app got 1.14–1.15 cores'
work done per core: benchmarks/README.md, "Runs 69–"). A model loop is one thread; the
calls' overheads and the Router's work run on the event loops' threads — the client's, the proxy's
and every replica's own (a replica's model work runs on a thread beside its event loop) — which the
due overheads share: twelve at once on six loops are six threads, each overhead at half of one.
Given the machine's own speed over a load against the profile's (`slower`, per `slower_step_s`, as a
canary process beside the app measured it: `benchmarks/machine_speed.py`), every CPU activity on the
shared cores runs that much slower from the step it was measured in — the model loops' work by
`slower_model` where given (the canary's model unit), the rest by `slower` (its Python unit).
A profile measured on a served app also carries each stage call's overhead beyond the model's work
(`calls`: the handle's RPC, the features' fetch, the stream), added before the call reaches its pool,
what its decode loop spends a step beyond the engine's (`served.step_overhead_ms`, added to every
step), and the app's whole CPU per request (`cpu_ms_per_request`, every process): with shared cores, the part
the stages do not account for (Serve's proxy and controller, the Router's handling of calls, the
replicas' own bookkeeping) runs beside each request as load on the cores, off its critical path —
measured alone and, if the profile has it, with 8 requests in flight (`cpu_ms_per_request_busy`):
a request is charged between the two by how many are in flight when it arrives (with 8 in flight,
net of the model loops' work as this simulation batches it there, so the total is the measured one).
On GPU pools leave it unset: each replica owns its device. What is not modelled: the network and object-store transfer of features, the
feature cache, autoscaling (pools are fixed), stop strings ending a row early (steps are counts).

Output: a table and one JSON line — throughput, p50/p95/p99, rejection rate, for an open loop the
requests still unanswered after its drain (`unfinished`: the percentiles are of the answered alone,
and the planner takes no plan that leaves one), and per pool its
utilisation (compute time / replica time), queueing time (submitted → in a batch) and mean batch;
with shared cores also the CPU work it charged per answered request, at the profile's speed
(`cpu_ms_per_request`: against a load's measured figure, how fast the machine ran it). A run shorter
than `STEADY_PATHS` of the slowest path's unloaded latencies says so: its p95 is of a pipeline
still filling its decode batches (the planner simulates that long).
"""

from __future__ import annotations

import argparse
import bisect
import gc
import heapq
import json
import math
import random
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path

import numpy as np
import simpy
import yaml
from simpy.core import BoundClass
# The hot paths read simpy's state as its own code does (`env._now`, `event._value is PENDING`): its `now`
# and `triggered` properties cost a call each, some 20 times a simulated request.
from simpy.events import PENDING

from benchmarks.metrics import percentile

ROOT = Path(__file__).resolve().parents[1]
PROFILE_KIND = "tandem-stage-profile"
POOLS = ("Router", "VisionEncoder", "SmallReasoner", "LargeAnswerer")
GENERATORS = {"small": "SmallReasoner", "large": "LargeAnswerer"}
ROLES = ("small", "large")
# With shared cores: the event loops a request's calls' overheads and the Router's work run on besides
# every replica's own — the load client's and Serve's proxy's — each one thread however many
# requests are due on it (measured CPU that no stage accounts for runs beside the request as an
# activity of its own).
OUTSIDE_LOOPS = 2


# --- the profile ------------------------------------------------------------------------------------
class Curve:
    """Milliseconds as a function of one size, piecewise linear through measured points; past either
    end, the nearest segment's line (never below the smallest measured time)."""

    def __init__(self, points: list[tuple[float, float]]):
        if not points:
            raise ValueError("a curve needs at least one measured point")
        pts = sorted(points)
        self.xs, self.ys = [float(x) for x, _ in pts], [float(y) for _, y in pts]
        self.floor = min(self.ys)
        self._at: dict[float, float] = {}  # a simulation asks for the same few sizes millions of times

    def __call__(self, x: float) -> float:
        y = self._at.get(x)
        if y is None:
            y = self._at[x] = self._interpolate(x)
        return y

    def _interpolate(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        y = y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return max(self.floor, y)


def generator_curves(gen: dict, step_overhead_ms: float = 0.0) -> tuple[Curve, Curve]:
    """A generator's (prefill, step) curves from a profile's `generators.<role>` entry: a join's
    prefill by the joining rows' total prompt tokens, a step by the rows running (plus what a served
    step costs beyond the engine's, if given)."""
    return (Curve([(p["batch"] * p["prompt_tokens"], p["ms"]) for p in gen["prefill"]]),
            Curve([(p["batch"], p["ms"] + step_overhead_ms) for p in gen["step"]]))


def repeated_sum(start: float, d: float, k: int) -> float:
    """`start` plus `d`, `k` times over, each sum rounded as floating point rounds it — to the bit what
    a loop of `k` additions gives (not start + k * d), in a few operations a binade: while the sums stay
    in one binade [2^(e-1), 2^e), every one adds `d` rounded to that binade's spacing."""
    end = start
    if k <= 8:  # a few additions cost less than finding the binade
        for _ in range(k):
            end += d
        return end
    while k > 0:
        if not (end > 0.0 and d > 0.0):
            end += d
            k -= 1
            continue
        ulp = math.ulp(end)
        top = math.ldexp(1.0, math.frexp(end)[1])  # the binade's end: end < top
        q = d / ulp  # exact: ulp is a power of two
        whole = math.floor(q)
        if q - whole == 0.5:  # a tie, rounded to even: the increment alternates, so one at a time
            for _ in range(k):
                end += d
            return end
        inc = (whole + (q - whole > 0.5)) * ulp
        if inc == 0.0:  # d is under half the spacing: no sum moves, nor will any later one
            return end
        # The additions whose exact sums stay well under the top (a margin for the estimate's rounding):
        # each adds exactly `inc`, and their total is exact too (a multiple of ulp under top).
        bulk = min(k, int((top - end - d) / inc) - 2)
        if bulk > 0:
            end += bulk * inc
            k -= bulk
        # The few additions left under the top and the one that may cross it, as they round: one at
        # a time (one each, with the binade found again between them, took half this function's time).
        for _ in range(min(k, 4)):
            end += d
            k -= 1
    return end


def by_in_flight(alone: float, busy: float, count: int, in_flight: float) -> float:
    """A per-request cost measured with one request in flight (`alone`) and with `count` (`busy`), at
    `in_flight`: linear between the two counts, flat beyond them."""
    if count <= 1:
        return alone
    return alone + (busy - alone) * min(1.0, max(0.0, (in_flight - 1) / (count - 1)))


@dataclass
class Profile:
    """Per-stage service times (ms) of one deployment of the models: what `benchmarks.stage_profile`
    writes (CPU, tiny models; or a GPU at real sizes)."""

    router_ms: float
    vision: dict[str, Curve]    # role -> ms for a batch of n images
    prefill: dict[str, Curve]   # role -> ms for one join, by the joining rows' total prompt tokens
    step: dict[str, Curve]      # role -> ms for one decode step of n rows
    workload: dict = field(default_factory=dict)  # the path mix measured with the profile, if any
    source: dict = field(default_factory=dict)
    # What each stage call costs beyond its model's work (the handle's RPC, fetching features from
    # the object store, the stream's messages): measured on a served app, 0 where unknown.
    call_ms: dict = field(default_factory=lambda: {"encode": 0.0, "generate": 0.0})
    # Every process's CPU per request on a served app (Router, replicas, proxy, controller, client):
    # with shared cores, what the stages above do not account for is charged as parallel load.
    cpu_ms_per_request: float = 0.0
    # The same with more requests in flight, (in flight, ms), if measured: batching and the processes'
    # per-iteration loops spread part of one request's cost over the others in flight.
    cpu_busy: tuple[int, float] | None = None
    # What a served decode step costs beyond the engine's (the replica's event loop and its per-token
    # stream messages share the decode loop's process), ms per role; folded into `step` at every
    # batch size, as one loop iteration's cost.
    step_overhead_ms: dict = field(default_factory=dict)
    # The cores the machine's other processes (Ray's daemons) kept busy while the app was loaded:
    # with shared cores, not there for the app's threads.
    others_cores: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        if d.get("kind") != PROFILE_KIND:
            raise ValueError(f"not a stage profile (kind {d.get('kind')!r}, expected {PROFILE_KIND!r})")
        gens = d["generators"]
        served = {r: float(v) for r, v in d.get("served", {}).get("step_overhead_ms", {}).items()}
        curves = {r: generator_curves(gens[r], served.get(r, 0.0)) for r in ROLES}
        return cls(router_ms=float(d["router"]["ms"]),
                   vision={r: Curve([(p["images"], p["ms"]) for p in d["vision"][r]]) for r in ROLES},
                   prefill={r: curves[r][0] for r in ROLES}, step={r: curves[r][1] for r in ROLES},
                   step_overhead_ms=served,
                   workload=d.get("workload", {}), source=d.get("source", {}),
                   call_ms={"encode": 0.0, "generate": 0.0, **d.get("calls", {})},
                   cpu_ms_per_request=float(sum(d.get("cpu_ms_per_request", {}).values())),
                   cpu_busy=(int(d["cpu_ms_per_request_busy"]["concurrency"]),
                             float(sum(d["cpu_ms_per_request_busy"]["ms"].values())))
                   if d.get("cpu_ms_per_request_busy") else None,
                   others_cores=float(d.get("cpu_ms_per_request_busy", {}).get("others_cores", 0.0)))

    def cpu_ms_at(self, in_flight: float) -> float | None:
        """The app's CPU per request with `in_flight` requests at once, as the simulator charges it;
        None where no CPU was measured (a GPU profile)."""
        if not self.cpu_ms_per_request:
            return None
        busy, count = (self.cpu_busy[1], self.cpu_busy[0]) if self.cpu_busy else (self.cpu_ms_per_request, 1)
        return by_in_flight(self.cpu_ms_per_request, busy, count, in_flight)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def scaled(self, factors: dict[str, float]) -> Profile:
        """Every time of a stage multiplied by its factor (keys: router, vision, small, large)."""
        def scale(c: Curve, f: float) -> Curve:
            return Curve([(x, y * f) for x, y in zip(c.xs, c.ys)])
        return Profile(router_ms=self.router_ms * factors.get("router", 1.0),
                       vision={r: scale(c, factors.get("vision", 1.0)) for r, c in self.vision.items()},
                       prefill={r: scale(c, factors.get(r, 1.0)) for r, c in self.prefill.items()},
                       step={r: scale(c, factors.get(r, 1.0)) for r, c in self.step.items()},
                       workload=self.workload, source={**self.source, "scaled": factors},
                       call_ms={k: v * factors.get("router", 1.0) for k, v in self.call_ms.items()},
                       cpu_ms_per_request=self.cpu_ms_per_request, cpu_busy=self.cpu_busy,
                       step_overhead_ms=self.step_overhead_ms, others_cores=self.others_cores)


# --- the workload -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One stage call: `role`'s vision tower (steps 0) or its language model."""

    kind: str            # "vision" | "generate"
    role: str            # "small" | "large"
    prompt_tokens: int = 0
    steps: int = 0


Phase = tuple[Call, ...]  # calls that run concurrently; the next phase starts when all are done


# The stages of `mutual`, what each costs by default (decode steps = tokens + the stop token), and
# the phase each runs in: vision, then both direct answers; on disagreement the small model's
# reasoning, then the large model's answer from the transferred excerpt.
MUTUAL_STAGES = {"small_direct": {"prompt_tokens": 40, "decode_steps": 3},
                 "large_direct": {"prompt_tokens": 40, "decode_steps": 3},
                 "small_reasoning": {"prompt_tokens": 40, "decode_steps": 40},
                 "large_transfer": {"prompt_tokens": 100, "decode_steps": 3}}


@dataclass
class Workload:
    """Paths a request can take, with their shares. Token figures are decode steps per stage, as the
    trace's `stages` reports them."""

    paths: list[tuple[str, float, tuple[Phase, ...]]]
    images: int = 1

    @classmethod
    def mutual(cls, transfer_rate: float, stages: dict[str, dict] | None = None, *, images: int = 1) -> Workload:
        """The `mutual` policy (`stages` overrides MUTUAL_STAGES' prompt tokens and decode steps)."""
        if not 0 <= transfer_rate <= 1:
            raise ValueError(f"transfer rate {transfer_rate} is outside 0..1")
        st = {k: {**v, **(stages or {}).get(k, {})} for k, v in MUTUAL_STAGES.items()}

        def gen(name: str) -> Call:
            return Call("generate", name.split("_")[0], max(1, round(st[name]["prompt_tokens"])),
                        max(1, round(st[name]["decode_steps"])))
        head = ((Call("vision", "small"), Call("vision", "large")),) if images else ()
        stage1 = head + ((gen("small_direct"), gen("large_direct")),)
        stage2 = ((gen("small_reasoning"),), (gen("large_transfer"),))
        return cls([("agree", 1 - transfer_rate, stage1), ("transfer", transfer_rate, stage1 + stage2)], images)

    @classmethod
    def from_measured(cls, measured: dict, transfer_rate: float | None = None) -> Workload:
        """`mutual` with what a profile measured on the app (its `workload` section), if anything."""
        rate = measured.get("transfer_rate", 0.5) if transfer_rate is None else transfer_rate
        return cls.mutual(rate, measured.get("stages"), images=measured.get("images", 1))

    @staticmethod
    def call_ms(profile: Profile, c: Call, images: int = 1) -> float:
        """One call alone: its overhead, then its model's work at batch 1 (a vision call: `images`
        images in one batch)."""
        if c.kind == "vision":
            return profile.call_ms["encode"] + profile.vision[c.role](images)
        return profile.call_ms["generate"] + profile.prefill[c.role](c.prompt_tokens) + c.steps * profile.step[c.role](1)

    def unloaded_s(self, profile: Profile, mean: bool = False) -> float:
        """The slowest path's latency with nothing else running (no batch waits): how deep the
        pipeline is; `mean`: the paths' latencies weighted by their shares instead."""
        paths = [(share, profile.router_ms + sum(max(self.call_ms(profile, c, self.images) for c in phase)
                                                 for phase in phases))
                 for _, share, phases in self.paths if share > 0]
        if mean:
            return sum(share * ms for share, ms in paths) / sum(share for share, _ in paths) / 1000
        return max(ms for _, ms in paths) / 1000

    def describe(self) -> str:
        return "; ".join(f"{name} {share:.0%}: " + " -> ".join(
            "+".join(f"{c.role[0]}{'V' if c.kind == 'vision' else f'{c.steps}s'}" for c in ph) for ph in phases)
            for name, share, phases in self.paths)


# --- the cluster's settings ---------------------------------------------------------------------------
@dataclass
class PoolSettings:
    max_ongoing: int = 32
    max_queued: int = -1          # per calling replica; -1: unbounded (Serve's default)
    max_batch_size: int = 8
    batch_wait_s: float = 0.01
    gpus_per_replica: float = 0.0
    admit: int | None = None      # Router: the app's http.max_in_flight, requests a replica answers at once


def settings_from_config(path: str | Path) -> dict[str, PoolSettings]:
    """Each deployment's limits and batching as a serve config file sets them."""
    cfg = yaml.safe_load(Path(path).read_text())
    app = cfg["applications"][0]
    deployments = {d["name"]: d for d in app.get("deployments", [])}
    admit = ((app.get("args") or {}).get("http") or {}).get("max_in_flight")
    out = {}
    for name in POOLS:
        d = deployments.get(name, {})
        user = d.get("user_config") or {}
        out[name] = PoolSettings(max_ongoing=int(d.get("max_ongoing_requests", 5)),
                                 max_queued=int(d.get("max_queued_requests", -1)),
                                 max_batch_size=int(user.get("max_batch_size", 8)),
                                 batch_wait_s=float(user.get("batch_wait_timeout_s", 0.01 if name != "VisionEncoder"
                                                                                     else 0.005)),
                                 gpus_per_replica=float((d.get("ray_actor_options") or {}).get("num_gpus", 0)),
                                 admit=int(admit) if name == "Router" and admit else None)
    return out


# --- the simulation ---------------------------------------------------------------------------------
class _Environment(simpy.Environment):
    """simpy's environment with timeouts that can be called off. A decode loop coasting to its next
    row's finish is woken early by most arrivals, and the timeout it set stays in the queue as a no-op
    until its time: at 10,000 req/s, 95 % of a queue of ~50,000 events, every push and pop paying for
    them. Called-off events are dropped in bulk once they are half the queue; the queue is ordered by
    (time, priority, id), so what remains runs in the very order it would have."""

    DROP_AT = 1024  # called-off events, at least, before a drop (and half the queue)

    def __init__(self):
        super().__init__()
        # simpy binds its event classes (`timeout`, `event`, ...) to an environment once, but only
        # those in the namespace of the instance's own class: in a subclass, every `env.timeout`
        # made a bound method anew (1.5 % of a 10,000 req/s run's time, py-spy).
        for name, obj in vars(simpy.Environment).items():
            if type(obj) is BoundClass:
                setattr(self, name, getattr(self, name))
        # Called-off events by id, held here so that no new event takes an id of one the queue popped
        # (as a no-op) before the next drop.
        self._off: dict[int, simpy.Event] = {}

    def succeed_next(self, event: simpy.Event) -> None:
        """Succeed `event` and, if nothing else is due now (the queue's next event is later), process
        it at once: simpy would pop it next, at this very time, so everything runs in the same order
        — without its trip through the queue. Else as `event.succeed()`."""
        queue = self._queue
        if queue and queue[0][0] <= self._now:
            event.succeed()
            return
        event._ok, event._value = True, None
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)

    def call_off(self, event: simpy.Event) -> None:
        """`event`, scheduled and not yet processed, will do nothing: drop it from the queue."""
        event.callbacks = []  # a no-op if popped before the next drop
        off = self._off
        off[id(event)] = event
        if len(off) >= self.DROP_AT and 2 * len(off) > len(self._queue):
            self._queue = [e for e in self._queue if id(e[3]) not in off]
            heapq.heapify(self._queue)
            off.clear()


class _Request:
    __slots__ = ("arrived", "phases", "phase", "pending", "failed", "replica", "path", "in_flight")

    def __init__(self, arrived: float, path: str, phases):
        self.arrived, self.path, self.phases = arrived, path, phases
        self.phase, self.pending, self.failed, self.replica = 0, 0, False, None  # replica: its Router
        self.in_flight = False  # counted among the requests in flight (the Router took it)


class _Job:
    """One call in a pool: the unit that is queued, batched and completed."""
    __slots__ = ("request", "call", "submitted", "left", "replica")

    def __init__(self, request: _Request, call: Call, now: float):
        self.request, self.call, self.submitted, self.left, self.replica = request, call, now, call.steps, None


class _Replica:
    __slots__ = ("pool", "index", "ongoing", "queue", "wake", "full", "compute_s")

    def __init__(self, pool: _Pool, index: int):
        self.pool, self.index = pool, index
        self.ongoing, self.queue, self.wake, self.full = 0, deque(), None, None
        self.compute_s = 0.0


class _Pool:
    def __init__(self, sim: Simulation, name: str, n: int, settings: PoolSettings, queue_limit: int):
        self.sim, self.name, self.settings = sim, name, settings
        self.replicas = [_Replica(self, i) for i in range(n)]
        self.waiting: deque = deque()  # the callers' queue: jobs no replica has room for yet
        self.queue_limit = queue_limit
        # Looked up for every call (millions): the settings the pool keeps for the run.
        self.is_router, self.limit, self.admit = name == "Router", settings.max_ongoing, settings.admit
        self.max_batch = settings.max_batch_size
        self.bits, self.bits_less = n.bit_length(), (n - 1).bit_length()  # the random draws' widths
        # Every job's queueing time (s), as doubles: millions at 10,000 req/s (`Simulation.arrivals`).
        self.queue_s = array("d")
        self.rejected = 0
        self.batches = self.batched = 0  # batches run and jobs in them (decoders: steps and rows)

    def pick(self) -> _Replica | None:
        """Serve's power of two choices: the less loaded of two random replicas, if either has room;
        else any replica with room (the least loaded); None when all are full."""
        limit, reps = self.limit, self.replicas
        if len(reps) > 2:
            a, b = self._two()
            best = a if a.ongoing <= b.ongoing else b
            if best.ongoing < limit:
                return best
        free = [r for r in reps if r.ongoing < limit]
        return min(free, key=lambda r: r.ongoing) if free else None

    def _two(self) -> tuple[_Replica, _Replica]:
        """Two distinct replicas at random, the very draws `rng.sample(replicas, 2)` makes (CPython's
        algorithm, so a seed's figures stand) without its generality's cost: a sixth of a 10,000 req/s
        simulation's time went to it."""
        reps, bits, k = self.replicas, self.sim.rng.getrandbits, self.bits
        n = len(reps)
        i = bits(k)
        while i >= n:
            i = bits(k)
        if n <= 21:  # sample's pool method: a draw below n - 1, the drawn slot holding the last replica
            m, k = n - 1, self.bits_less
            j = bits(k)
            while j >= m:
                j = bits(k)
            return reps[i], reps[m if j == i else j]
        j = bits(k)
        while j >= n or j == i:
            j = bits(k)
        return reps[i], reps[j]

    def submit(self, job) -> bool:
        replica = self.pick()
        if replica is None:
            if 0 <= self.queue_limit <= len(self.waiting):
                self.rejected += 1
                return False
            self.waiting.append(job)
            return True
        if self.admit is not None and replica.ongoing >= self.admit:
            self.rejected += 1  # the Router's admission limit: turned away before any work
            return False
        self.assign(job, replica)
        return True

    def assign(self, job, replica: _Replica) -> None:
        replica.ongoing += 1
        job.replica = replica
        self.sim.on_assigned(self, job, replica)

    def release(self, replica: _Replica) -> None:
        replica.ongoing -= 1
        if self.waiting:
            self.assign(self.waiting.popleft(), replica)


def app_cores(host_cores: float, profile: Profile) -> float:
    """The cores the app's threads share: the host's, less what its other processes kept busy."""
    return max(0.5, host_cores - profile.others_cores)


class _Cores:
    """Shared cores as processor sharing: every CPU activity on them runs at once, each at its share,
    recomputed whenever one starts or ends or the machine's measured speed changes — so the work they
    get done per second never exceeds the cores. Three classes of activity: a model loop's work
    (`model`, one thread each), CPU that runs beside a request as an activity of its own (`other`,
    one thread each), and call overheads with the Router's work (`overhead`), which share the event
    loops' threads (`loops`: the client's, the proxy's, every replica's): n of them due at once take
    min(n, loops) threads, each loops/n of one where n is more.
    With T threads wanting the cores' C, each thread runs at min(1, C/T) of a core, divided by the
    machine's slowdown then (the model unit's for `model`). Per class, `served` is the work one of its
    activities has got done since the start: an activity started at s with w to do ends when the
    class's `served` reaches s + w."""

    CLASSES = ("model", "other", "overhead")

    def __init__(self, sim: Simulation, cores: float, loops: int):
        self.sim, self.env, self.cores, self.loops = sim, sim.env, cores, loops
        self.served = dict.fromkeys(self.CLASSES, 0.0)
        self.due: dict[str, list] = {c: [] for c in self.CLASSES}  # heaps of (served at the end, seq, done)
        self.rate = dict.fromkeys(self.CLASSES, 0.0)
        self.last, self._seq, self._timer = 0.0, 0, 0
        self.work_s = 0.0  # all the work charged, at the profile's speed

    def count(self, cls: str) -> int:
        return len(self.due[cls])

    def rates(self) -> dict[str, float]:
        """Each class's rate now: work seconds an activity of it gets done per second."""
        n_over = self.count("overhead")
        threads = self.count("model") + self.count("other") + min(n_over, self.loops)
        share = min(1.0, self.cores / threads) if threads else 1.0
        machine, machine_model = self.sim._machine(), self.sim._machine(model=True)
        return {"model": share / machine_model, "other": share / machine,
                "overhead": share * min(n_over, self.loops) / n_over / machine if n_over else share / machine}

    def run(self, work_s: float, cls: str, done) -> None:
        """`done()` once `work_s` seconds of this machine's work at the profile's speed has run."""
        self._advance()
        self._seq += 1
        self.work_s += work_s
        heapq.heappush(self.due[cls], (self.served[cls] + work_s, self._seq, done))
        self._schedule()

    def _advance(self) -> None:
        dt = self.env._now - self.last
        if dt > 0:
            for c in self.CLASSES:
                self.served[c] += dt * self.rate[c]
        self.last = self.env._now

    def _schedule(self) -> None:
        self.rate = self.rates()
        wait = math.inf
        for c in self.CLASSES:
            if self.due[c]:
                wait = min(wait, max(0.0, self.due[c][0][0] - self.served[c]) / self.rate[c])
        sim = self.sim
        if wait < math.inf:  # the machine's speed changes at the next step, if either unit has one
            step = int(self.env._now / sim.slower_step_s) + 1
            if step < max(len(sim.slower), len(sim.slower_model)):
                wait = min(wait, max(0.0, step * sim.slower_step_s - self.env._now))
        if wait == math.inf:
            return
        self._timer += 1
        timer = self._timer
        self.env.timeout(wait).callbacks.append(lambda _e: self._wake(timer))

    def _wake(self, timer: int) -> None:
        if timer != self._timer:  # superseded by a later start or end
            return
        self._advance()
        finished = []
        for c in self.CLASSES:
            heap = self.due[c]
            while heap and heap[0][0] <= self.served[c] + 1e-12:
                finished.append(heapq.heappop(heap)[2])
        self._schedule()
        for done in finished:
            done()


class Simulation:
    """One run: `Simulation(profile, workload, replicas, settings).run(rate=R, duration_s=D)`."""

    def __init__(self, profile: Profile, workload: Workload, replicas: dict[str, int],
                 settings: dict[str, PoolSettings], *, host_cores: float | None = None, seed: int = 0,
                 slower: list[float] | None = None, slower_step_s: float = 2.0,
                 slower_model: list[float] | None = None, _alone_cpu_only: bool = False):
        self.profile, self.workload, self.settings = profile, workload, settings
        self.given_host_cores = host_cores
        self.host_cores = app_cores(host_cores, profile) if host_cores else host_cores
        self._alone_cpu_only = _alone_cpu_only  # a probe run: every request charged the alone figure
        self.model_ms = 0.0  # the model loops' work charged so far, before contention and machine speed
        # With shared cores: how much slower than when the profile was measured the machine ran,
        # per `slower_step_s` from the start (the last holds on), as its canary measured it.
        # The model loops' work by the model unit's speed where measured (torch's kernels and a Python
        # loop do not slow alike), the rest — event loops, Serve's processes — by the Python unit's.
        self.slower, self.slower_step_s = list(slower or []), slower_step_s
        self.slower_model = list(slower_model) if slower_model else self.slower
        self.rng = random.Random(seed)
        self.env = _Environment()
        self.cores: _Cores | None = None  # with shared cores, once the pools are built; own devices: none
        self.coast = True  # own devices: a decode loop's steps between joins and finishes run as one wait
        n_routers = replicas.get("Router", 1)
        self.pools = {}
        for name in POOLS:
            s = settings[name]
            callers = 1 if name == "Router" else n_routers  # Serve bounds the queue per calling handle
            limit = -1 if s.max_queued < 0 else s.max_queued * callers
            self.pools[name] = _Pool(self, name, max(1, replicas.get(name, 1)), s, limit)
        if self.host_cores:
            loops = OUTSIDE_LOOPS + sum(len(p.replicas) for p in self.pools.values())
            self.cores = _Cores(self, self.host_cores, loops)
        for pool in self.pools.values():
            if pool.name == "Router":
                continue
            loop = self._vision_loop if pool.name == "VisionEncoder" else self._decode_loop
            for rep in pool.replicas:
                self.env.process(loop(rep))
        # Each answered request's arrival, latency (s) and path, and when it finished; each rejected
        # one's arrival. Doubles, not float objects: a 10,000 req/s run keeps millions (with the
        # pools' queueing times, 0.2 GB of its 0.34 GB as floats in lists).
        self.arrivals, self.latency_s, self.paths = array("d"), array("d"), []
        self.done_times, self.rejected = array("d"), array("d")
        # Each path's phases as (call, its pool, copies, overhead s) — looked up once, not per call.
        self._choices = [(name, share, tuple(tuple(self._plan(c) for c in phase) for phase in phases))
                         for name, share, phases in workload.paths if share > 0]
        self._cum = []
        total = 0.0
        for _, share, _ in self._choices:
            total += share
            self._cum.append(total)
        self.on_done = None  # closed loop: called with each finished or rejected request
        self.in_flight = 0
        self._unaccounted = (0.0, 0.0, 1)  # seconds at 1 in flight, at `busy` in flight; busy

    def _plan(self, call: Call) -> tuple[Call, _Pool, int, float]:
        """How a request makes `call`: (the call, the pool it goes to, how many, each one's overhead s)."""
        vision = call.kind == "vision"
        return (call, self.pools["VisionEncoder" if vision else GENERATORS[call.role]],
                self.workload.images if vision else 1, self.profile.call_ms["encode" if vision else "generate"] / 1000)

    # -- requests --------------------------------------------------------------------------------
    def arrive(self) -> None:
        u = self.rng.random() * self._cum[-1]
        name, _, phases = self._choices[min(bisect.bisect_right(self._cum, u), len(self._choices) - 1)]
        req = _Request(self.env._now, name, phases)
        if not self.pools["Router"].submit(req):
            self._finish(req, rejected=True)
            return
        self.in_flight += 1
        req.in_flight = True
        if self.cores is None:  # own devices: no CPU is charged beside the stages
            return
        extra = self._unaccounted_at(self.in_flight)
        if extra:  # the rest of the request's measured CPU, beside its critical path
            self._cpu(extra, "other", lambda: None)

    def _unaccounted_cpu_s(self) -> tuple[float, float, int]:
        """With shared cores and a measured CPU per request: that CPU less what the simulation charges
        a request (the Router, call overheads and model work, per path share) — with one request in
        flight (model work at batch 1), and with the profile's busier count if it measured one (model
        work as batched there)."""
        p = self.profile
        if not (self.host_cores and p.cpu_ms_per_request):
            return 0.0, 0.0, 1
        w = self.workload
        overheads, model_alone = p.router_ms, 0.0
        for _, share, phases in w.paths:
            for c in (c for phase in phases for c in phase):
                n = share * (w.images if c.kind == "vision" else 1)
                overhead = p.call_ms["encode" if c.kind == "vision" else "generate"]
                overheads += n * overhead
                model_alone += n * (w.call_ms(p, c) - overhead)
        alone = max(0.0, p.cpu_ms_per_request - overheads - model_alone) / 1000
        if not p.cpu_busy or p.cpu_busy[0] <= 1 or self._alone_cpu_only:
            return alone, alone, 1
        # With `count` in flight the model loops batch, and a request's share of their work is less
        # than its work alone: what the stages do not account for there is the measured CPU less the
        # overheads and that share — as this simulation batches them at that count (taking the alone
        # work off instead, it charged run 53's app 106 ms a request at 16 in flight against 126 measured).
        count, busy_ms = p.cpu_busy
        return alone, max(0.0, busy_ms - overheads - self._model_ms_per_request(count)) / 1000, count

    def _model_ms_per_request(self, concurrency: int) -> float:
        """The model loops' work per request this simulation charges with `concurrency` requests in
        flight: a closed loop of the measurement's shape (one replica a pool, these settings and
        cores, each request charged its alone CPU beside), 30 simulated seconds."""
        probe = Simulation(self.profile, self.workload, {}, self.settings, host_cores=self.given_host_cores,
                           _alone_cpu_only=True)
        probe.run(concurrency=concurrency, duration_s=30.0, warmup_s=0.0)
        # The requests still in flight at the end did about half their work.
        return probe.model_ms / max(1.0, len(probe.latency_s) + probe.in_flight / 2)

    def _unaccounted_at(self, in_flight: int) -> float:
        """The unaccounted CPU of a request that arrives with `in_flight` requests in the app (itself
        included)."""
        return by_in_flight(*self._unaccounted, in_flight)

    def on_assigned(self, pool: _Pool, job, replica: _Replica) -> None:
        queue = replica.queue
        queue.append(job)
        if pool.is_router:  # job is the request itself: the Router's CPU, one request at a time
            if len(queue) == 1:
                self._route(replica)
            return
        wake, full = replica.wake, replica.full
        if wake is not None and wake._value is PENDING:
            self._wake_early(wake)
        if full is not None and full._value is PENDING and len(queue) >= pool.max_batch:
            self._wake_early(full)

    def _route(self, replica: _Replica) -> None:
        """The Router's own work for the request first in its replica's queue, then the next."""
        req = replica.queue[0]
        replica.pool.queue_s.append(self.env._now - req.arrived)

        def done():
            replica.queue.popleft()
            if replica.queue:
                self._route(replica)
            self._next_phase(req)
        self._cpu(self.profile.router_ms / 1000, "overhead", done, replica)

    def _next_phase(self, req: _Request) -> None:
        if req.failed:
            return
        if req.phase == len(req.phases):
            self._finish(req)
            return
        calls = req.phases[req.phase]
        req.phase += 1
        req.pending = 0
        for call, pool, copies, overhead in calls:
            for _ in range(copies):
                req.pending += 1
                if overhead:  # the call's RPC and feature fetch come before the replica sees it
                    self._cpu(overhead, "overhead", lambda c=call, p=pool: self._submit(req, c, p))
                elif not self._submit(req, call, pool):
                    return

    def _submit(self, req: _Request, call: Call, pool: _Pool) -> bool:
        if req.failed:
            return False
        if not pool.submit(_Job(req, call, self.env._now)):
            self._finish(req, rejected=True)
            return False
        return True

    def _machine(self, model: bool = False) -> float:
        """The machine's slowdown now against the profile's (1: as fast; only with shared cores), for
        a model loop's work or (not `model`) the rest."""
        slower = self.slower_model if model else self.slower
        if not slower:
            return 1.0
        return slower[min(int(self.env._now / self.slower_step_s), len(slower) - 1)]

    def _cpu(self, seconds: float, cls: str, then, replica: _Replica | None = None) -> None:
        """`then()` once `seconds` of CPU work (at the profile's speed) has run: on shared cores as
        they share it among everything running (`_Cores`, class `cls`), on own devices in that time.
        The time it took counts as `replica`'s compute time, if given."""
        start = self.env._now

        def done(_e=None):
            if replica is not None:
                replica.compute_s += self.env._now - start
            then()
        if self.cores is not None:
            self.cores.run(seconds, cls, done)
        else:
            self.env.timeout(seconds).callbacks.append(done)

    def _job_done(self, job: _Job) -> None:
        job.replica.pool.release(job.replica)
        req = job.request
        if req.failed:
            return
        req.pending -= 1
        if req.pending == 0:
            self._next_phase(req)

    def _finish(self, req: _Request, rejected: bool = False) -> None:
        if req.failed:
            return
        req.failed = True  # no more phases either way
        now = self.env._now
        if rejected:
            self.rejected.append(req.arrived)
        else:
            self.arrivals.append(req.arrived)
            self.latency_s.append(now - req.arrived)
            self.paths.append(req.path)
            self.done_times.append(now)
        if req.in_flight:
            self.in_flight -= 1
        if req.replica is not None:
            self.pools["Router"].release(req.replica)
        if self.on_done:
            self.on_done()

    # -- compute ---------------------------------------------------------------------------------
    def _compute(self, replica: _Replica, ms: float):
        """An event that fires once `ms` of the replica's model work has run (`_cpu`)."""
        self.model_ms += ms
        if self.cores is None:  # own devices: that long (one event: a 10,000 req/s run has millions)
            replica.compute_s += ms / 1000
            return self.env.timeout(ms / 1000)
        ran = self.env.event()
        self._cpu(ms / 1000, "model", ran.succeed, replica)
        return ran

    def _idle(self, replica: _Replica):
        replica.wake = self.env.event()
        return replica.wake

    def _fill(self, replica: _Replica, wait_s: float, target: int):
        """Wait until the replica's queue holds `target` jobs or its oldest has waited `wait_s`."""
        deadline = replica.queue[0].submitted + wait_s
        if len(replica.queue) >= target or deadline <= self.env._now:
            return None
        replica.full = self.env.event()
        return self._by(replica.full, deadline - self.env._now)

    def _by(self, event, delay: float):
        """`event`, succeeded after `delay` unless something else succeeded it first: simpy's any_of
        of it and a timeout, without a Condition's cost (a 10,000 req/s run waits this way a million
        times). The timeout is `event.alarm`, called off if `_wake_early` succeeds the event first."""
        env = self.env

        def fire(_timeout):
            if event._value is PENDING:
                env.succeed_next(event)
        event.alarm = env.timeout(delay)
        event.alarm.callbacks.append(fire)
        return event

    def _wake_early(self, event) -> None:
        """Succeed a replica's wait now; a `_by` timeout it had is now a no-op, so it is called off
        (which also breaks the cycle event -> alarm -> fire -> event)."""
        event.succeed()
        alarm = getattr(event, "alarm", None)  # an idle wait (`_idle` alone) has none
        if alarm is not None:
            self.env.call_off(alarm)

    def _vision_loop(self, rep: _Replica):
        s, pool, queue = rep.pool.settings, rep.pool, rep.queue
        vision, queue_s, job_done = self.profile.vision, rep.pool.queue_s, self._job_done
        while True:
            while not queue:
                yield self._idle(rep)
            waiting = self._fill(rep, s.batch_wait_s, s.max_batch_size)
            if waiting is not None:
                yield waiting
                rep.full = None
            now = self.env._now
            batch, counts = [], {}
            for _ in range(min(s.max_batch_size, len(queue))):
                job = queue.popleft()
                batch.append(job)
                queue_s.append(now - job.submitted)
                role = job.call.role
                counts[role] = counts.get(role, 0) + 1
            pool.batches += 1
            pool.batched += len(batch)
            ms = 0
            for role, n in counts.items():  # as `sum` adds them: from int 0, in the roles' order
                ms += vision[role](n)
            yield self._compute(rep, ms)
            for job in batch:
                job_done(job)

    def _decode_loop(self, rep: _Replica):
        s = rep.pool.settings
        role = "small" if rep.pool.name == "SmallReasoner" else "large"
        prefill, step = self.profile.prefill[role], self.profile.step[role]
        rows: dict[int, list[_Job]] = {}  # the step at which they finish -> rows
        running, steps = 0, 0
        queue, pool, coast = rep.queue, rep.pool, self.cores is None and self.coast
        env, queue_s, job_done = self.env, pool.queue_s, self._job_done
        max_batch, wait_s = s.max_batch_size, s.batch_wait_s
        while True:
            while not running and not queue:
                yield self._idle(rep)
            if not running and wait_s:
                waiting = self._fill(rep, wait_s, max_batch)
                if waiting is not None:
                    yield waiting
                    rep.full = None
            full = running >= max_batch
            if coast and running and (full or not queue):
                # Own devices, no job to join: the steps until the next row finishes all take
                # step(running), so they run as one wait — cut short at the end of the step a job
                # arrives in, if it has room to join. A 10,000 req/s run is otherwise millions of steps.
                k = min(rows) - steps
                if k > 1:
                    done = yield from self._coast(rep, step(running), k, running, not full)
                    steps += done
                    for job in rows.pop(steps, ()):
                        running -= 1
                        job_done(job)
                    continue
            ms = 0.0
            if queue and not full:
                now, tokens = env._now, 0
                for _ in range(min(max_batch - running, len(queue))):
                    job = queue.popleft()
                    queue_s.append(now - job.submitted)
                    at = steps + (job.left if job.left > 1 else 1)
                    joining = rows.get(at)
                    if joining is None:
                        rows[at] = [job]
                    else:
                        joining.append(job)
                    tokens += job.call.prompt_tokens
                    running += 1
                ms += prefill(tokens)
            ms += step(running)
            pool.batches += 1
            pool.batched += running
            yield self._compute(rep, ms)
            steps += 1
            for job in rows.pop(steps, ()):
                running -= 1
                job_done(job)

    def _coast(self, rep: _Replica, step_ms: float, k: int, running: int, can_join: bool):
        """Up to `k` decode steps of `step_ms` with `running` rows (own devices): all `k`, or — when
        `can_join` and a job arrives meanwhile — to the end of the step it arrived in (at its very
        end, it joins there). Returns the steps run, charged as that many steps. Its end is the sum
        of its steps as adding them one at a time rounds it (`repeated_sum`): k * d can differ from
        k sums of d in the last bit, which reorders events that were simultaneous and moves every
        later figure as another seed would (the worked example's plan came out 262.5 GPUs against
        256.5 that way)."""
        env, d = self.env, step_ms / 1000
        start = env._now
        end = repeated_sum(start, d, k)
        if can_join:
            yield self._by(self._idle(rep), end - start)
            rep.wake = None
            done = k
            if env._now < end:  # a job arrived
                done, at = 1, start + d
                while at < env._now:
                    done, at = done + 1, at + d
                yield env.timeout(at - env._now)
        else:
            yield env.timeout(end - start)
            done = k
        self.model_ms += done * step_ms
        rep.compute_s += done * d
        rep.pool.batches += done
        rep.pool.batched += done * running
        return done

    # -- running -----------------------------------------------------------------------------------
    def _open_loop(self, rate: float, until: float):
        exp = self.rng.expovariate
        while True:
            yield self.env.timeout(exp(rate))
            if self.env._now >= until:
                return
            self.arrive()

    def _replay(self, arrivals: list[float], until: float):
        for t in sorted(arrivals):
            if t >= until:
                return
            yield self.env.timeout(max(0.0, t - self.env._now))
            self.arrive()

    def run(self, *, rate: float | None = None, concurrency: int | None = None, duration_s: float = 60.0,
            warmup_s: float | None = None, drain_s: float | None = None, arrivals: list[float] | None = None) -> dict:
        """Open loop at `rate` req/s or a closed loop of `concurrency` clients, for `duration_s`
        simulated seconds; requests arriving in the first `warmup_s` are not counted. An open loop
        then runs `drain_s` more (default: as long again, up to a minute) without arrivals, so the
        last counted requests finish and their latencies count. `arrivals` (seconds from the start)
        replays a measured open loop's own send times instead of drawing Poisson ones: a check against
        the real app then compares the two on the same bursts."""
        if arrivals is not None:
            if rate is not None or concurrency is not None:
                raise ValueError("give arrivals, or rate, or concurrency")
            rate = len([t for t in arrivals if 0 <= t < duration_s]) / duration_s
        elif (rate is None) == (concurrency is None):
            raise ValueError("give either rate or concurrency")
        self._unaccounted = self._unaccounted_cpu_s()
        # Default warm-up: a tenth of the run, or three of the slowest path's unloaded latencies if
        # that is longer (slots held by long reasoning fill for that long), at most half the run.
        deep = 3 * self.workload.unloaded_s(self.profile)
        warmup = min(max(duration_s * 0.1, deep), duration_s / 2) if warmup_s is None else warmup_s
        started = time.perf_counter()
        if arrivals is not None:
            self.env.process(self._replay(arrivals, duration_s))
        elif rate is not None:
            self.env.process(self._open_loop(rate, duration_s))
        else:
            def again():
                if self.env._now < duration_s:
                    self.arrive()
            self.on_done = again
            for _ in range(concurrency):
                self.arrive()
        drain = min(duration_s, 60.0) if drain_s is None else drain_s
        # A run makes no reference cycles (a test holds it to that), so the cyclic collector has
        # nothing to find and would only walk the live events and loops, again and again: off while
        # it runs.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.env.run(until=duration_s + (drain if rate is not None else 0.0))
        finally:
            if collecting:
                gc.enable()
        return self.summary(rate, concurrency, duration_s, warmup, time.perf_counter() - started)

    @property
    def latencies(self) -> list[tuple[float, float, str]]:
        """(arrival, latency s, path) of every answered request, in the order they finished."""
        return list(zip(self.arrivals, self.latency_s, self.paths))

    def summary(self, rate, concurrency, duration_s: float, warmup: float, wall_s: float) -> dict:
        arrived_at = np.frombuffer(self.arrivals, dtype=float)
        counted = (warmup <= arrived_at) & (arrived_at < duration_s)
        lat = np.frombuffer(self.latency_s, dtype=float)[counted] * 1000
        # Throughput: completions per second once the pipeline is full. A pipeline seconds deep (a
        # long reasoning path) fills for seconds after the warm-up: the window starts a p99 latency
        # later (at most half-way), or completions of slow paths would be missing from it.
        start = min(warmup + (percentile(lat, 99) / 1000 if len(lat) else 0.0), duration_s / 2)
        window = duration_s - start
        done_at = np.frombuffer(self.done_times, dtype=float)
        rejected_at = np.frombuffer(self.rejected, dtype=float)
        done = int(np.count_nonzero((start <= done_at) & (done_at < duration_s)))
        rejected = int(np.count_nonzero((warmup <= rejected_at) & (rejected_at < duration_s)))
        # An open loop's requests still in flight after its drain: neither answered nor turned away, so
        # its percentiles (of the answered alone) understate an overloaded app — counted, and among
        # the arrivals the rejection rate is a share of. A closed loop ends with its clients' last
        # requests in flight by design.
        unfinished = self.in_flight if rate is not None else None
        arrived = len(lat) + rejected + (unfinished or 0)
        paths: dict[str, int] = {}
        for p in compress(self.paths, counted.tolist()):
            paths[p] = paths.get(p, 0) + 1
        pools = {}
        for name, pool in self.pools.items():
            busy = sum(r.compute_s for r in pool.replicas)
            q = np.frombuffer(pool.queue_s, dtype=float) * 1000
            pools[name] = {"replicas": len(pool.replicas),
                           "utilisation": round(busy / (len(pool.replicas) * self.env._now), 3) if self.env._now else 0,
                           "queue_ms_mean": round(_mean_in_order(q), 2) if len(q) else 0.0,
                           "queue_ms_p95": round(percentile(q, 95), 2) if len(q) else 0.0, "rejected": pool.rejected,
                           "mean_batch": round(pool.batched / pool.batches, 2) if pool.batches else None}
        gpus = sum(len(p.replicas) * p.settings.gpus_per_replica for p in self.pools.values())
        # On shared cores: the CPU work charged per answered request, at the profile's speed, over the
        # whole run (those still in flight at its end counted half done) — what a load's measured CPU
        # per request is to be set against, to read how fast the machine ran it (benchmarks/sim_check.py).
        cpu = ({"cpu_ms_per_request": round(1000 * self.cores.work_s / max(1.0, len(self.latency_s) + self.in_flight / 2), 3)}
               if self.cores is not None else {})
        return {"benchmark": "simulate", "rate_rps": rate, "concurrency": concurrency, "duration_s": duration_s,
                "replicas": {n: len(p.replicas) for n, p in self.pools.items()}, "gpus": gpus,
                "throughput_rps": round(done / window, 2) if window > 0 else math.nan,
                "mean_ms": round(_mean_in_order(lat), 2) if len(lat) else math.nan, "p50_ms": round(percentile(lat, 50), 2), "p95_ms": round(percentile(lat, 95), 2),
                "p99_ms": round(percentile(lat, 99), 2), "completed": len(lat), "rejected": rejected,
                "unfinished": unfinished,
                "rejection_rate": round(rejected / arrived, 4) if arrived else 0.0,
                "paths": paths, "pools": pools, **cpu, "wall_s": round(wall_s, 2)}


def _mean_in_order(values: np.ndarray) -> float:
    """The mean of a run's millions of figures as Python's `sum` (3.11) adds them, one after another
    (numpy's `sum` adds pairwise: other last bits)."""
    return float(np.cumsum(values)[-1]) / len(values)


def simulate(profile: Profile, workload: Workload, replicas: dict[str, int], settings: dict[str, PoolSettings],
             *, rate: float | None = None, concurrency: int | None = None, duration_s: float = 60.0,
             host_cores: float | None = None, seed: int = 0, warmup_s: float | None = None,
             arrivals: list[float] | None = None, slower: list[float] | None = None,
             slower_step_s: float = 2.0, slower_model: list[float] | None = None) -> dict:
    sim = Simulation(profile, workload, replicas, settings, host_cores=host_cores, seed=seed,
                     slower=slower, slower_step_s=slower_step_s, slower_model=slower_model)
    return sim.run(rate=rate, concurrency=concurrency, duration_s=duration_s, warmup_s=warmup_s, arrivals=arrivals)


# How long a run must be to read the p95 a cluster settles at, in the slowest path's unloaded
# latencies: a pipeline whose reasoning path takes seconds fills its decode batches, and with them its
# step times, over minutes, so a short run reads its start. The worked example's plan of 2026-12-01
# (cluster/README.md) simulated for 60 s had a p95 of 19.96 s, for 120 s 20.90, 300 s 21.23, 600 s
# 21.34, and over later windows 21.6-22.1 s; the plan made at 20 paths (262 s there), 20.07 s over
# four times as long (+0.4 %). The planner simulates its candidates this long.
STEADY_PATHS = 20


def default_duration(profile: Profile, workload: Workload) -> float:
    return max(30.0, STEADY_PATHS * workload.unloaded_s(profile))


def parse_replicas(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, n = part.partition("=")
        if name not in POOLS or not n.isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(f"bad replica count {part!r}: expected <{'|'.join(POOLS)}>=<n >= 1>")
        out[name] = int(n)
    return out


def print_result(r: dict) -> None:
    load = f"{r['rate_rps']} req/s open loop" if r["rate_rps"] is not None else f"concurrency {r['concurrency']}"
    print(f"{load}, {r['duration_s']:.0f} simulated s ({r['wall_s']} s wall): throughput {r['throughput_rps']} req/s, "
          f"p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms, p99 {r['p99_ms']} ms, rejected {r['rejection_rate']:.2%}")
    if r.get("unfinished"):
        print(f"{r['unfinished']} requests still in flight after the drain: the percentiles are of the "
              f"{r['completed']} answered alone, and understate an app this overloaded")
    print(f"{'pool':<14} {'replicas':>8} {'util':>6} {'queue_mean_ms':>14} {'queue_p95_ms':>13} {'mean_batch':>11}")
    for name, p in r["pools"].items():
        print(f"{name:<14} {p['replicas']:>8} {p['utilisation']:>6.2f} {p['queue_ms_mean']:>14.1f} "
              f"{p['queue_ms_p95']:>13.1f} {p['mean_batch'] if p['mean_batch'] is not None else '-':>11}")


def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="a stage profile JSON (benchmarks.stage_profile)")
    p.add_argument("--config", default=str(ROOT / "serve_config.gpu.yaml"),
                   help="serve config whose limits and batching the pools take (default: the GPU config)")
    p.add_argument("--transfer-rate", type=float, default=None,
                   help="share of requests that transfer (default: the profile's measured share)")
    p.add_argument("--max-batch-size", type=parse_replicas, default={},
                   help="override the config's max_batch_size per pool, e.g. SmallReasoner=64")
    p.add_argument("--host-cores", type=float, default=None, help="replicas share this many CPU cores (local app)")
    p.add_argument("--seed", type=int, default=0)


def settings_for(args) -> dict[str, PoolSettings]:
    settings = settings_from_config(args.config)
    for name, n in args.max_batch_size.items():
        settings[name].max_batch_size = n
    return settings


def workload_for(args, profile: Profile) -> Workload:
    return Workload.from_measured(profile.workload, args.transfer_rate)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--rate", type=float, help="open-loop arrivals per second (Poisson)")
    p.add_argument("--concurrency", type=int, help="closed loop: this many clients")
    p.add_argument("--replicas", type=parse_replicas, default={}, help="e.g. VisionEncoder=1,SmallReasoner=2")
    p.add_argument("--duration-s", type=float, default=60.0)
    args = p.parse_args(argv)
    if (args.rate is None) == (args.concurrency is None):
        p.error("give --rate or --concurrency")
    profile = Profile.load(args.profile)
    workload = workload_for(args, profile)
    print(f"profile {args.profile} ({profile.source.get('device', '?')}); workload: {workload.describe()}")
    r = simulate(profile, workload, args.replicas, settings_for(args), rate=args.rate,
                 concurrency=args.concurrency, duration_s=args.duration_s, host_cores=args.host_cores,
                 seed=args.seed)
    print_result(r)
    steady = default_duration(profile, workload)
    if args.duration_s < steady:
        print(f"(shorter than {STEADY_PATHS} of the slowest path's unloaded latencies, {steady:.0f} s: this run's p95 "
              f"is of a pipeline still filling, and may sit below the one it settles at)")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
