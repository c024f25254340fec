"""A discrete-event simulation (simpy) of a Tandem cluster, fed by a measured stage profile.

    python -m capacity.simulate --profile P.json --rate 200 \\
        --replicas VisionEncoder=1,SmallReasoner=2,LargeAnswerer=3 --duration-s 60
    python -m capacity.simulate --profile P.json --concurrency 16 --config serve_config.yaml

It models what the app does: the Router pool and its admission limit, Serve's handle routing (power
of two choices, per-caller queue limits), the VisionEncoder's batcher, the model servers'
step-level decode loop (rows join between steps and leave at their own length), and the policy's path
mix (`Workload`). Arrivals are open-loop Poisson, a replay of measured send times, or a closed loop.
`--host-cores N` runs every replica on N shared CPU cores (processor sharing, `capacity/pools.py`),
as the local CPU app does; GPU pools own their devices. `--autoscale` runs Serve's autoscaling
controller on the pools the config autoscales (capacity/autoscale.py), `--rate-steps` a traffic
curve. docs/capacity.md says what is modelled and what is not (the network, the feature cache).

Output: a table and one JSON line — throughput, p50/p95/p99, rejection rate, requests still
unanswered after an open loop's drain (`unfinished`), and per pool its utilisation, queueing time
and mean batch. A run shorter than `STEADY_PATHS` of the slowest path's unloaded latencies says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import bisect
import random
import time
from array import array

import simpy

from capacity.autoscale import Autoscaler, parse_steps, step_arrivals
from capacity.pools import Cores, Job, Pool, Replica, Request, app_cores
from capacity.report import print_result, summarise
from capacity.profile import (GENERATORS, OUTSIDE_LOOPS, POOLS, Call, PoolSettings, Profile, Workload,
                              add_workload_args, by_in_flight, parse_replicas, parse_seconds, settings_for,
                              workload_for)


class Simulation:
    """One run: `Simulation(profile, workload, replicas, settings).run(rate=R, duration_s=D)`."""

    def __init__(self, profile: Profile, workload: Workload, replicas: dict[str, int],
                 settings: dict[str, PoolSettings], *, host_cores: float | None = None, seed: int = 0,
                 slower: list[float] | None = None, slower_step_s: float = 2.0,
                 slower_model: list[float] | None = None, model_waits: bool = False,
                 _alone_cpu_only: bool = False):
        self.profile, self.workload, self.settings = profile, workload, settings
        # The paced engine's model work is a wait, not CPU: with shared cores, only the app's own work
        # (the Router, the calls' hops) shares them.
        self.model_waits = model_waits
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
        self.env = simpy.Environment()
        self.cores: Cores | None = None  # with shared cores, once the pools are built; own devices: none
        self.coast = True  # own devices: a decode loop's steps between joins and finishes run as one wait
        # An autoscaled pool starts at its initial replicas, and Serve's controller moves it from there.
        replicas = {name: settings[name].autoscaling.initial if settings[name].autoscaling else n
                    for name, n in {**dict.fromkeys(POOLS, 1), **replicas}.items()}
        self.pools = {}
        for name in POOLS:
            s = settings[name]
            # Serve bounds the queue per calling handle (the Routers' count as they start)
            callers = 1 if name == "Router" else replicas["Router"]
            limit = -1 if s.max_queued < 0 else s.max_queued * callers
            self.pools[name] = Pool(self, name, max(1, replicas[name]), s, limit)
        if self.host_cores:
            loops = OUTSIDE_LOOPS + sum(len(p.replicas) for p in self.pools.values())
            self.cores = Cores(self, self.host_cores, loops)
        for pool in self.pools.values():
            for rep in pool.replicas:
                self.spawn(rep)
        self.autoscalers = {name: Autoscaler(self, pool) for name, pool in self.pools.items()
                            if pool.settings.autoscaling}
        for scaler in self.autoscalers.values():
            self.env.process(scaler.run())
        # Each answered request's arrival, latency (s) and path, and when it finished; each rejected
        # one's arrival. Doubles, not float objects: a 10,000 req/s run keeps millions (with the
        # pools' queueing times, 0.2 GB of its 0.34 GB as floats in lists).
        self.arrivals, self.latency_s, self.paths = array("d"), array("d"), []
        self.done_times, self.rejected = array("d"), array("d")
        # Each path's phases as (call, its pool, copies, overhead s) — looked up once, not per call.
        self._choices = [(name, share, tuple(tuple(self._plan(c) for c in phase) for phase in phases))
                         for name, share, phases in workload.paths if share > 0]
        # Per stage: [calls ended, their seconds from send to end] — one entry per stage the paths call.
        self.stage_s: dict[str, list] = {call.stage: [0, 0.0] for _, _, phases in self._choices
                                         for phase in phases for call, *_ in phase}
        self._phases = {name: phases for name, _, phases in self._choices}
        self._cum = []
        total = 0.0
        for _, share, _ in self._choices:
            total += share
            self._cum.append(total)
        self.on_done = None  # closed loop: called with each finished or rejected request
        self.calls: list | None = None  # a list to log every ended call in: (request's arrival s, stage, s)
        self.in_flight = 0
        self._unaccounted = (0.0, 0.0, 1)  # seconds at 1 in flight, at `busy` in flight; busy

    def spawn(self, rep: Replica) -> None:
        """Run a model replica's loop (a Router replica has none: `_route` does its work)."""
        if rep.pool.name != "Router":
            self.env.process((self._vision_loop if rep.pool.name == "VisionEncoder" else self._decode_loop)(rep))

    def _plan(self, call: Call) -> tuple[Call, Pool, int, float]:
        """How a request makes `call`: (the call, the pool it goes to, how many, each one's overhead s)."""
        vision = call.kind == "vision"
        return (call, self.pools["VisionEncoder" if vision else GENERATORS[call.role]],
                self.workload.images if vision else 1, self.profile.call_ms["encode" if vision else "generate"] / 1000)

    # -- requests --------------------------------------------------------------------------------
    def arrive(self, path: str | None = None) -> None:
        """A request arrives: on `path` where a replayed run says which it took, else a drawn one."""
        phases = self._phases.get(path) if path is not None else None
        if phases is not None:
            name = path
        else:
            u = self.rng.random() * self._cum[-1]
            name, _, phases = self._choices[min(bisect.bisect_right(self._cum, u), len(self._choices) - 1)]
        req = Request(self.env.now, name, phases)
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
        # overheads and that share — as this simulation batches them at that count.
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

    def on_assigned(self, pool: Pool, job, replica: Replica) -> None:
        queue = replica.queue
        queue.append(job)
        replica.last_gap, replica.last_job = self.env.now - replica.last_job, self.env.now
        if pool.is_router:  # job is the request itself: the Router's CPU, one request at a time
            if len(queue) == 1:
                self._route(replica)
            return
        wake, full = replica.wake, replica.full
        if wake is not None and not wake.triggered:
            self._wake_early(wake)
        if full is not None and not full.triggered and len(queue) >= pool.max_batch:
            self._wake_early(full)

    def _route(self, replica: Replica) -> None:
        """The Router's own work for the request first in its replica's queue, then the next."""
        req = replica.queue[0]
        replica.pool.queue_s.append(self.env.now - req.arrived)

        def done():
            replica.queue.popleft()
            if replica.queue:
                self._route(replica)
            self._next_phase(req)
        self._cpu(self.profile.router_ms / 1000, "overhead", done, replica)

    def _next_phase(self, req: Request) -> None:
        if req.failed:
            return
        if req.phase == len(req.phases):
            self._finish(req)
            return
        calls = req.phases[req.phase]
        req.phase += 1
        req.pending = 0
        req.phase_started = self.env.now
        for call, pool, copies, overhead in calls:
            for _ in range(copies):
                req.pending += 1
                if overhead:  # the call's RPC and feature fetch come before the replica sees it
                    pool.send()
                    self._cpu(overhead, "overhead", lambda c=call, p=pool: self._arrive_at(req, c, p))
                elif not self._submit(req, call, pool):
                    return

    def _arrive_at(self, req: Request, call: Call, pool: Pool) -> None:
        pool.arrived()
        self._submit(req, call, pool)

    def _submit(self, req: Request, call: Call, pool: Pool) -> bool:
        if req.failed:
            return False
        if not pool.submit(Job(req, call, self.env.now, self.in_flight - 1)):
            self._finish(req, rejected=True)
            return False
        return True

    def _machine(self, model: bool = False) -> float:
        """The machine's slowdown now against the profile's (1: as fast; only with shared cores), for
        a model loop's work or (not `model`) the rest."""
        slower = self.slower_model if model else self.slower
        if not slower:
            return 1.0
        return slower[min(int(self.env.now / self.slower_step_s), len(slower) - 1)]

    def _cpu(self, seconds: float, cls: str, then, replica: Replica | None = None) -> None:
        """`then()` once `seconds` of CPU work (at the profile's speed) has run: on shared cores as
        they share it among everything running (`Cores`, class `cls`), on own devices in that time.
        The time it took counts as `replica`'s compute time, if given."""
        start = self.env.now

        def done(_e=None):
            if replica is not None:
                replica.compute_s += self.env.now - start
            then()
        if self.cores is not None:
            self.cores.run(seconds, cls, done)
        else:
            self.env.timeout(seconds).callbacks.append(done)

    def _job_done(self, job: Job) -> None:
        job.replica.pool.release(job.replica)
        req = job.request
        if req.failed:
            return
        # The call's time as the app's trace measures a stage: from its send (overhead included) to its end.
        timed = self.stage_s[job.call.stage]
        timed[0] += 1
        timed[1] += self.env.now - req.phase_started
        if self.calls is not None:
            self.calls.append((req.arrived, job.call.stage, self.env.now - req.phase_started))
        req.pending -= 1
        if req.pending == 0:
            self._next_phase(req)

    def _finish(self, req: Request, rejected: bool = False) -> None:
        if req.failed:
            return
        req.failed = True  # no more phases either way
        now = self.env.now
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
    def _compute(self, replica: Replica, ms: float):
        """An event that fires once `ms` of the replica's model work has run (`_cpu`)."""
        self.model_ms += ms
        if self.cores is None or self.model_waits:  # that long (one event: a 10,000 req/s run has millions)
            replica.compute_s += ms / 1000
            return self.env.timeout(ms / 1000)
        ran = self.env.event()
        self._cpu(ms / 1000, "model", ran.succeed, replica)
        return ran

    def _idle(self, replica: Replica):
        """An event for the replica's loop to wait on until a job comes; None once it is retired and
        has none: the loop ends there."""
        if replica.retired:
            replica.died = self.env.now
            return None
        replica.wake = self.env.event()
        return replica.wake

    def _fill(self, replica: Replica, wait_s: float, target: int):
        """Wait until the replica's queue holds `target` jobs or its oldest has waited `wait_s`."""
        deadline = replica.queue[0].submitted + wait_s
        if len(replica.queue) >= target or deadline <= self.env.now:
            return None
        replica.full = self.env.event()
        return self._by(replica.full, deadline - self.env.now)

    def _by(self, event, delay: float):
        """`event`, succeeded after `delay` unless something else succeeded it first (`_wake_early`):
        simpy's any_of of it and a timeout, without a Condition per wait."""
        env = self.env

        def fire(_timeout):
            if not event.triggered:
                event.succeed()
        event.alarm = env.timeout(delay)
        event.alarm.callbacks.append(fire)
        return event

    def _wake_early(self, event) -> None:
        """Succeed a replica's wait now; a `_by` timeout it had then finds it triggered and does nothing."""
        event.succeed()

    def _vision_loop(self, rep: Replica):
        """The VisionEncoder's batcher: a batch of every job waiting when the replica comes free."""
        s, pool, queue = rep.pool.settings, rep.pool, rep.queue
        vision, queue_s, job_done = self.profile.vision, rep.pool.queue_s, self._job_done
        while True:
            while not queue:
                idle = self._idle(rep)
                if idle is None:
                    return
                yield idle
            waiting = self._fill(rep, s.batch_wait_s, s.max_batch_size) if rep.worth_waiting(s.batch_wait_s, True) \
                else None
            if waiting is not None:
                yield waiting
                rep.full = None
            now = self.env.now
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

    def _decode_loop(self, rep: Replica):
        s = rep.pool.settings
        role = "small" if rep.pool.name == "SmallReasoner" else "large"
        prefill, step = self.profile.prefill[role], self.profile.step[role]
        rows: dict[int, list[Job]] = {}  # the step at which they finish -> rows
        running, steps = 0, 0
        queue, pool, coast = rep.queue, rep.pool, (self.cores is None or self.model_waits) and self.coast
        env, queue_s, job_done = self.env, pool.queue_s, self._job_done
        max_batch, wait_s = s.max_batch_size, s.batch_wait_s
        while True:
            while not running and not queue:
                idle = self._idle(rep)
                if idle is None:
                    return
                yield idle
            if not running and wait_s and rep.worth_waiting(wait_s):
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
                    done = yield from self._coast(rep, step(running), k, running, not full and not rep.retired)
                    steps += done
                    for job in rows.pop(steps, ()):
                        running -= 1
                        job_done(job)
                    continue
            ms = 0.0
            if queue and not full:
                now, tokens = env.now, 0
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

    def _coast(self, rep: Replica, step_ms: float, k: int, running: int, can_join: bool):
        """Up to `k` decode steps of `step_ms` with `running` rows (own devices): all `k`, or — when
        `can_join` and a job arrives meanwhile — to the end of the step it arrived in (at its very
        end, it joins there). Returns the steps run, charged as that many steps. Its end is the sum
        of its steps as adding them one at a time rounds it (`repeated_sum`): k * d can differ from
        k sums of d in the last bit, which reorders events that were simultaneous and moves every
        later figure as another seed would (enough to move a plan's GPU count by a few per cent)."""
        env, d = self.env, step_ms / 1000
        start = env.now
        end = start + k * d
        if can_join:
            yield self._by(self._idle(rep), end - start)
            rep.wake = None
            done = k
            if env.now < end:  # a job arrived
                done, at = 1, start + d
                while at < env.now:
                    done, at = done + 1, at + d
                yield env.timeout(at - env.now)
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
            if self.env.now >= until:
                return
            self.arrive()

    def _replay(self, arrivals: list[float], until: float, paths: list[str | None] | None):
        for t, path in sorted(zip(arrivals, paths or [None] * len(arrivals)), key=lambda sent: sent[0]):
            if t >= until:
                return
            yield self.env.timeout(max(0.0, t - self.env.now))
            self.arrive(path)

    def run(self, *, rate: float | None = None, concurrency: int | None = None, duration_s: float = 60.0,
            warmup_s: float | None = None, drain_s: float | None = None, arrivals: list[float] | None = None,
            paths: list[str | None] | None = None) -> dict:
        """Open loop at `rate` req/s or a closed loop of `concurrency` clients, for `duration_s`
        simulated seconds; requests arriving in the first `warmup_s` are not counted. An open loop
        then runs `drain_s` more (default: as long again, up to a minute) without arrivals, so the
        last counted requests finish and their latencies count. `arrivals` (seconds from the start)
        replays a measured open loop's own send times instead of drawing Poisson ones, and `paths`
        (beside them; None where unknown, drawn) the path each of those requests took: a check against
        the real app then compares the two on the same bursts of the same requests."""
        if arrivals is not None:
            if rate is not None or concurrency is not None:
                raise ValueError("give arrivals, or rate, or concurrency")
            if paths is not None and len(paths) != len(arrivals):
                raise ValueError(f"{len(paths)} paths for {len(arrivals)} arrivals")
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
            self.env.process(self._replay(arrivals, duration_s, paths))
        elif rate is not None:
            self.env.process(self._open_loop(rate, duration_s))
        else:
            def again():
                if self.env.now < duration_s:
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
        return summarise(self, rate, concurrency, duration_s, warmup, wall_s)


def simulate(profile: Profile, workload: Workload, replicas: dict[str, int], settings: dict[str, PoolSettings],
             *, rate: float | None = None, concurrency: int | None = None, duration_s: float = 60.0,
             host_cores: float | None = None, seed: int = 0, warmup_s: float | None = None,
             arrivals: list[float] | None = None, paths: list[str | None] | None = None,
             slower: list[float] | None = None, slower_step_s: float = 2.0,
             slower_model: list[float] | None = None, model_waits: bool = False) -> dict:
    sim = Simulation(profile, workload, replicas, settings, host_cores=host_cores, seed=seed,
                     slower=slower, slower_step_s=slower_step_s, slower_model=slower_model, model_waits=model_waits)
    return sim.run(rate=rate, concurrency=concurrency, duration_s=duration_s, warmup_s=warmup_s, arrivals=arrivals,
                   paths=paths)


# How long a run must be to read the p95 a cluster settles at, in the slowest path's unloaded
# latencies: a pipeline whose reasoning path takes seconds fills its decode batches, and with them its
# step times, over minutes, so a short run reads its start (docs/capacity.md). The planner simulates
# its candidates this long.
STEADY_PATHS = 20


def default_duration(profile: Profile, workload: Workload) -> float:
    return max(30.0, STEADY_PATHS * workload.unloaded_s(profile))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--rate", type=float, help="open-loop arrivals per second (Poisson)")
    p.add_argument("--concurrency", type=int, help="closed loop: this many clients")
    p.add_argument("--replicas", type=parse_replicas, default={}, help="e.g. VisionEncoder=1,SmallReasoner=2")
    p.add_argument("--rate-steps", type=parse_steps, help="open loop in steps, e.g. 0:2,30:8,90:2 (from s: req/s)")
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--autoscale", action="store_true",
                   help="pools with an autoscaling_config in --config autoscale as Serve would (capacity/autoscale.py)")
    p.add_argument("--startup-s", type=parse_seconds, default={},
                   help="with --autoscale: how long a new replica takes to come up, e.g. LargeAnswerer=40")
    args = p.parse_args(argv)
    if sum(x is not None for x in (args.rate, args.concurrency, args.rate_steps)) != 1:
        p.error("give one of --rate, --concurrency, --rate-steps")
    profile = Profile.load(args.profile)
    workload = workload_for(args, profile)
    print(f"profile {args.profile} ({profile.source.get('device', '?')}); workload: {workload.describe()}")
    arrivals = step_arrivals(args.rate_steps, args.duration_s, args.seed) if args.rate_steps else None
    r = simulate(profile, workload, args.replicas, settings_for(args), rate=args.rate,
                 concurrency=args.concurrency, duration_s=args.duration_s, host_cores=args.host_cores,
                 seed=args.seed, arrivals=arrivals)
    print_result(r)
    steady = default_duration(profile, workload)
    if args.duration_s < steady:
        print(f"(shorter than {STEADY_PATHS} of the slowest path's unloaded latencies, {steady:.0f} s: this run's p95 "
              f"is of a pipeline still filling, and may sit below the one it settles at)")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
