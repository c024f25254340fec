"""The simulator's autoscaling checked against the served app on the paced engine, under a step in
load: `python -m capacity.autoscale_check` (~5 min on 2 cores; `--runs N` for more).

The app is serve_config.yaml's on the paced engine (capacity/paced_check.py's profile) with the
SmallReasoner and LargeAnswerer autoscaled as AUTOSCALING says — Serve's own controller, metrics and
replica start-up, short delays so a step shows within minutes (`--metrics-interval-s`: how often each
handle records and pushes a pool's requests, 0.25 s unless given: where those records fall is not
known, and at 1 s that alone moves a decision by a second or two). The load is an open loop in STEPS
(1 req/s, 8 from 30 s, 1 again from 90 s, for 150 s), and the simulator replays its very send times
with the same autoscaling config. Measured in the same run and fed to the simulator: the per-call
hop costs (zero-time twins, as paced_check), and how long each new replica took from the controller
beginning it to RUNNING, which is what `startup_s` stands for: the simulator gives each replica it
starts its own measured time, in order; and the controller's loop period, read from its log. The
loop's and each handle's phase, which no log shows, are drawn per run (`sim_timing`). The simulated
app's own work (the Router's, the hops) shares the machine's cores (`--host-cores`) as the real
app's does, its model work the paced waits.

The real pools' running replicas, targets and start-ups are read from Serve's controller log, which
stamps each change to the ms (capacity/serve_log.py); Serve's REST API is polled every 0.25 s
beside it, and the output says how late the polls saw each change (where no log is found, the
polls stand in for it).

Bars, per run: each autoscaled pool's running replicas, sampled every second from the first send to
the last answer, within ±1 of the simulated count at every sample; p95 of the whole run within
±20 %. Printed beside them: the p95 of each step, the seconds off by more than one replica, the
time slack that would put every second within ±1 (how far apart in time the two scaled, which the
1-s samples cannot tell), when the controller and the simulated one decided to scale up and down
(the controller's target, as logged), the answered requests each held in flight on
average (over each step and the 5 s after each change of rate, where the look-back means cross
their thresholds), each stage call's mean time by step (from the traces' `latency_ms`), the
requests each turned away, and with `--read-controller` the look-back mean the controller was fed
against the simulated one (read from the controller every 0.25 s; not by default, as the reads
are work on the app's own cores). Ends with
one JSON line: {"engine": "paced", "autoscaling": {...}, "figures": [{"run", "load", "metric",
"real", "simulated", "error", "tolerance"}...], "within": true|false}.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import functools
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path

import httpx

from benchmarks.client import ROOT
from benchmarks.metrics import percentile
from capacity.autoscale import RECORD_FACTOR, replicas_at, step_arrivals
from capacity.paced_check import PACED_PROFILE, measure_hops, paced_app, zero_profile
from capacity.profile import CONTROL_LOOP_S, Autoscaling, ControlTiming, Profile, Workload, settings_from_config
from capacity.serve_log import PoolLog, controller_log, parse
from capacity.sim_check import _post, bodies, closed_loop
from capacity.simulate import Simulation
from capacity.stage_profile import stage_calls_ms

POOLS = ("SmallReasoner", "LargeAnswerer")
AUTOSCALING = {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2, "metrics_interval_s": 0.25,
               "look_back_period_s": 5.0, "upscale_delay_s": 3.0, "downscale_delay_s": 10.0}
STEPS = [(0.0, 1.0), (30.0, 8.0), (90.0, 1.0)]
DURATION_S = 150.0
P95_TOLERANCE = 0.20
DASHBOARD = "http://127.0.0.1:8265/api/serve/applications/"


def dashboard_headers() -> dict[str, str]:
    """Ray's token for its dashboard, where token authentication is on (Ray writes it for a new
    cluster): the environment's, else the file Ray keeps it in."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if not token and path.exists():
        token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def serve_deployments(http: httpx.Client, app: str = "tandem") -> dict:
    """The app's deployments as Serve's REST API details them."""
    r = http.get(DASHBOARD, headers=dashboard_headers())
    r.raise_for_status()
    return r.json()["applications"][app]["deployments"]


class Sampler:
    """A thread running `_run` from the `with` block's start until its end (`_stop` set)."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class ReplicaPoller(Sampler):
    """Serve's view of the app's replicas, every `every_s` from `start` in a thread: per pool the
    running count and the controller's target over time, and each replica's first sighting in each
    state."""

    def __init__(self, start: float, app: str = "tandem", every_s: float = 0.25):
        self.start, self.app, self.every_s = start, app, every_s
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.targets: list[tuple[float, dict[str, int]]] = []  # the controller's decisions, as polled
        self.took: list[float] = []  # each poll's round trip, s
        self.seen: dict[str, dict[str, float]] = collections.defaultdict(dict)  # replica -> state -> first time
        self.pool_of: dict[str, str] = {}
        super().__init__()

    def _run(self) -> None:
        with httpx.Client(timeout=5) as http:
            while not self._stop.is_set():
                asked = time.monotonic() - self.start
                try:
                    deployments = serve_deployments(http, self.app)
                except (httpx.HTTPError, KeyError, ValueError):
                    self._stop.wait(self.every_s)
                    continue
                answered = time.monotonic() - self.start
                # The controller's state is read somewhere between asking and the answer: stamp the
                # middle, and keep the answer's time as the sample's uncertainty.
                now = (asked + answered) / 2
                self.took.append(answered - asked)
                counts = {}
                for pool in POOLS:
                    replicas = deployments[pool]["replicas"]
                    counts[pool] = sum(1 for r in replicas if r["state"] == "RUNNING")
                    for r in replicas:
                        self.seen[r["replica_id"]].setdefault(r["state"], now)
                        self.pool_of[r["replica_id"]] = pool
                self.samples.append((now, counts))
                self.targets.append((now, {pool: deployments[pool]["target_num_replicas"] for pool in POOLS}))
                self._stop.wait(self.every_s)

    def timeline(self, pool: str) -> list[tuple[float, int]]:
        return [(t, c[pool]) for t, c in self.samples]

    def target_timeline(self, pool: str) -> list[tuple[float, int]]:
        return [(t, c[pool]) for t, c in self.targets]

    def startups(self, pool: str) -> list[float | None]:
        """Each replica the pool's target asked for during the load, in order: from the poll that saw
        the target rise to the one that saw it RUNNING (None: it never ran)."""
        targets = self.target_timeline(pool)
        asked = [t for (_, before), (t, n) in zip(targets, targets[1:]) for _ in range(n - before)]
        new = sorted((min(states.values()), rid) for rid, states in self.seen.items()
                     if self.pool_of[rid] == pool and min(states.values()) > self.samples[0][0])
        return [round(self.seen[rid]["RUNNING"] - t, 2) if "RUNNING" in self.seen[rid] else None
                for t, (_, rid) in zip(asked, new)]

    def startup_s(self) -> float | None:
        return median_startup(self)

    def loop_period_s(self) -> float:
        """The polls see no decision's loop apart from the next: Serve's interval."""
        return CONTROL_LOOP_S


def median_startup(seen) -> float | None:
    """The median start-up of the replicas started during the load."""
    took = [s for pool in POOLS for s in seen.startups(pool) if s is not None]
    return round(statistics.median(took), 2) if took else None


class LoggedPools:
    """The pools as Serve's controller logged them over a run (capacity/serve_log.py), with the
    poller's methods: running replicas and targets at each change, to the ms, and each replica's
    start-up from the `Adding` that began it."""

    def __init__(self, path: Path, start_wall: float, end_wall: float, poller: ReplicaPoller, app: str = "tandem"):
        with open(path) as f:
            events = parse(f, app)
        first = poller.samples[0][1]
        self.pools = {p: PoolLog(events, p, start_wall, end_wall, first[p], poller.targets[0][1][p]) for p in POOLS}

    def timeline(self, pool: str) -> list[tuple[float, int]]:
        return self.pools[pool].timeline()

    def target_timeline(self, pool: str) -> list[tuple[float, int]]:
        return self.pools[pool].targets()

    def startups(self, pool: str) -> list[float | None]:
        return self.pools[pool].startups()

    def startup_s(self) -> float | None:
        return median_startup(self)

    def loop_period_s(self) -> float:
        """The controller's loop period over the run (the median gap from a decision to the loop that
        acted on it): Serve's 0.1-s sleep plus the loop's own work on this machine."""
        gaps = [g for p in POOLS for g in self.pools[p].action_gaps()]
        return round(statistics.median(gaps), 3) if gaps else CONTROL_LOOP_S


def sim_timing(seen: ReplicaPoller | LoggedPools, run: int, autoscaling: dict) -> dict[str, ControlTiming]:
    """Each pool's clocks for the simulation: the loop's period as the log measured it (Serve's
    interval where the polls stand in for the log), and the loop's and each handle's phase drawn for
    the run — each began before the load, at an instant the load's start does not set."""
    period = seen.loop_period_s()
    rng = random.Random(run)
    record_s = min(RECORD_FACTOR * autoscaling["look_back_period_s"], autoscaling["metrics_interval_s"])
    control = rng.uniform(0.0, period)
    return {p: ControlTiming(period, round(control, 4), round(rng.uniform(0.0, record_s), 4)) for p in POOLS}


def poll_lag(logged: LoggedPools, poller: ReplicaPoller) -> dict:
    """How long after the controller logged each change of a pool's running replicas the 0.25-s poll
    first saw that count: the lag the logged timeline removes (never below zero where the two clocks
    agree)."""
    lags = []
    for pool in POOLS:
        polled, changes = poller.timeline(pool), logged.timeline(pool)
        for i, (t, n) in enumerate(changes[1:], start=1):
            until = changes[i + 1][0] if i + 1 < len(changes) else float("inf")
            if until - t < poller.every_s:  # a count held for less than a poll's period (3 -> 2 -> 1 at once)
                continue
            seen = next((pt for pt, pn in polled if t - 0.5 <= pt < until and pn == n), None)
            if seen is not None:
                lags.append(seen - t)
    return {"mean_s": round(statistics.mean(lags), 3), "min_s": round(min(lags), 3),
            "max_s": round(max(lags), 3)} if lags else {}


def join_ray() -> None:
    """Join the app's local Ray cluster as a driver, once, before any load: joining starts worker
    processes that would perturb a run on 2 cores."""
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=False, logging_level="ERROR")


class ControllerTotals(Sampler):
    """What Serve's controller feeds its policy for each pool — the look-back mean of the requests
    the handles reported — read every `every_s` in a thread through the controller's read-only
    hook for it (`_get_total_num_requests_for_deployment_for_testing`, Serve's tests' own), beside
    the simulated controller's mean at each tick: where a decision's lag comes from."""

    def __init__(self, start: float, app: str = "tandem", every_s: float = 0.25):
        import ray
        from ray.serve._private.common import DeploymentID
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        self.controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        self.ids = {p: DeploymentID(name=p, app_name=app) for p in POOLS}
        self.start, self.every_s = start, every_s
        self.samples: dict[str, list[tuple[float, float]]] = {p: [] for p in POOLS}
        super().__init__()

    def _run(self) -> None:
        import ray

        get = self.controller._get_total_num_requests_for_deployment_for_testing
        while not self._stop.is_set():
            for pool, dep in self.ids.items():
                asked = time.monotonic() - self.start
                try:
                    total = ray.get(get.remote(dep), timeout=5)
                except Exception:  # a late answer is skipped; the readout is not a bar
                    continue
                self.samples[pool].append(((asked + time.monotonic() - self.start) / 2, total))
            self._stop.wait(self.every_s)


def totals_gap(real: list[tuple[float, float]], sim: list[tuple[float, float]]) -> dict[str, float | None]:
    """The controller's look-back mean less the simulated one at the same instants, on average over
    each step and the 5 s after each change of rate."""
    out = {}
    for name, (a, b) in crossing_windows().items():
        gaps = [v - replicas_at(sim, t) for t, v in real if a <= t < b and sim and sim[0][0] <= t]
        out[name] = round(statistics.mean(gaps), 2) if gaps else None
    return out


async def scheduled_loop(url: str, items: list[dict], sends: list[float]) -> dict:
    """Each request sent at its time in `sends` (s from the start); every answer's (send s, latency ms)."""
    start, tasks = time.monotonic(), []

    away = collections.Counter()
    paths: list[str | None] = [None] * len(sends)  # each send's path, once answered
    stages: list[dict | None] = [None] * len(sends)  # and its stage calls' ms

    def took(i: int, trace: dict) -> None:
        paths[i] = trace["path"]
        stages[i] = stage_calls_ms(trace)

    async def one(http, body, i, due):
        await asyncio.sleep(max(0.0, start + due - time.monotonic()))
        sent = time.monotonic() - start
        status, latency_ms, end = await _post(http, url, body, turned_away=away, took=functools.partial(took, i))
        return sent, status, latency_ms, end - start

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1000)) as http:
        tasks = [one(http, items[i % len(items)], i, due) for i, due in enumerate(sends)]
        records = await asyncio.gather(*tasks)
    ok = [(sent, lat) for sent, status, lat, _ in records if status == 200]
    calls = [(sent, stage, ms) for (sent, *_), st in zip(records, stages) for stage, ms in (st or {}).items()]
    return {"sent": [round(s, 6) for s, *_ in records], "paths": paths, "latencies": ok, "calls": calls,
            "errors": dict(collections.Counter(str(status) for _, status, *_ in records if status != 200)),
            "turned_away": dict(away),
            "last_end_s": max(end for *_, end in records)}


def step_windows() -> dict[str, tuple[float, float]]:
    """Each step of the load, named by its rate and start: (start s, end s)."""
    return {f"{rate:g}/s from {start:g} s": (start, STEPS[i + 1][0] if i + 1 < len(STEPS) else DURATION_S)
            for i, (start, rate) in enumerate(STEPS)}


def crossing_windows() -> dict[str, tuple[float, float]]:
    """Each step, and the 5 s after each change of rate, where a pool's look-back mean crosses its
    thresholds."""
    return {**step_windows(), **{f"{start:g}-{start + 5:g} s": (start, start + 5.0) for start, _ in STEPS[1:]}}


def p95_by_step(latencies: list[tuple[float, float]]) -> dict[str, float]:
    """The p95 of the whole run and of each step's requests (by send time), from (send s, latency ms)."""
    out = {"all": round(percentile([ms for _, ms in latencies], 95), 1)}
    for name, (start, end) in step_windows().items():
        lats = [ms for sent, ms in latencies if start <= sent < end]
        out[name] = round(percentile(lats, 95), 1) if lats else None
    return out


def in_flight(latencies: list[tuple[float, float]]) -> dict[str, float]:
    """Answered requests in flight on average, from (send s, latency ms): over each step, and over the
    5 s after each change of rate, where a pool's look-back mean crosses its thresholds."""
    return {name: round(sum(max(0.0, min(b, sent + ms / 1000) - max(a, sent)) for sent, ms in latencies) / (b - a), 3)
            for name, (a, b) in crossing_windows().items()}


def stage_ms_by_step(calls: list[tuple[float, str, float]]) -> dict[str, dict[str, float]]:
    """Each stage call's mean ms over the requests sent in each step, from (send s, stage, ms)."""
    out = {}
    for name, (a, b) in step_windows().items():
        times = collections.defaultdict(list)
        for sent, stage, ms in calls:
            if a <= sent < b:
                times[stage].append(ms)
        out[name] = {stage: round(statistics.mean(v), 1) for stage, v in sorted(times.items())}
    return out


def simulated(profile: dict, sends: list[float], startup_s: float, transfer_rate: float,
              paths: list[str | None] | None = None, startups: dict[str, list] | None = None,
              autoscaling: dict = AUTOSCALING, host_cores: float | None = None,
              timing: dict[str, ControlTiming] | None = None) -> tuple[dict, list, list]:
    """The simulated run on the same sends (each on its path where known), each pool's new replicas
    starting in their measured times (`startup_s` where unknown), the app's own work sharing
    `host_cores` (the paced model work a wait): its summary, (send s, latency ms) pairs and (send s,
    stage, ms) of every stage call."""
    settings = settings_from_config(ROOT / "serve_config.yaml")
    for pool in POOLS:
        replay = tuple(startup_s if s is None else s for s in (startups or {}).get(pool, []))
        settings[pool] = dataclasses.replace(settings[pool], autoscaling=Autoscaling.from_config(autoscaling),
                                             startup_s=startup_s, startups=replay,
                                             timing=(timing or {}).get(pool, ControlTiming()))
    workload = Workload.mutual(transfer_rate, profile["workload"]["stages"])
    sim = Simulation(Profile.from_dict(profile), workload, {}, settings, host_cores=host_cores or None,
                     model_waits=True)
    sim.calls = []
    r = sim.run(duration_s=DURATION_S, warmup_s=0.0, arrivals=sends, paths=paths)
    for pool in POOLS:
        r["pools"][pool]["totals"] = sim.autoscalers[pool].totals
    return (r, [(arrived, latency_s * 1000) for arrived, latency_s, _ in sim.latencies],
            [(arrived, stage, s * 1000) for arrived, stage, s in sim.calls])


def slack_s(real: list[tuple[float, int]], sim: list[tuple[float, int]], seconds: range) -> float:
    """How far in time the two timelines are apart, whatever the sampling: the least δ such that at
    every second t the real count is within ±1 of the simulated count at some time in [t-δ, t+δ]."""
    spans = [(t, sim[i + 1][0] if i + 1 < len(sim) else float("inf"), n) for i, (t, n) in enumerate(sim)]
    worst = 0.0
    for t in seconds:
        real_n = replicas_at(real, t)
        worst = max(worst, min(max(0.0, a - t, t - b) for a, b, n in spans if abs(n - real_n) <= 1))
    return round(worst, 2)


def decided(targets: list[tuple[float, int]], after: float, up: bool) -> float | None:
    """When a target timeline (samples or changes) first moved up (or down) after `after` s."""
    for (_, before), (t, n) in zip(targets, targets[1:]):
        if t > after and (n > before if up else n < before):
            return round(t, 2)
    return None


def decisions(run: int, pool: str, real: list, sim: list) -> list[dict]:
    """When the controller and the simulated one decided to scale up after the step up, and down after
    the step down: where the replica counts' lag comes from."""
    rows = []
    for metric, after, up in (("scale-up decided (s)", STEPS[1][0], True), ("scale-down decided (s)", STEPS[2][0], False)):
        r, s = decided(real, after, up), decided(sim, after, up)
        rows.append({"run": run, "load": pool, "metric": metric, "real": r, "simulated": s,
                     "error": round(s - r, 2) if r is not None and s is not None else None,
                     "tolerance": None, "within": None})
    return rows


def figures(run: int, seen: ReplicaPoller | LoggedPools, measured: dict, sim: dict, sim_latencies: list) -> list[dict]:
    rows, horizon = [], int(measured["last_end_s"])
    for pool in POOLS:
        real_tl, sim_tl = seen.timeline(pool), sim["pools"][pool]["timeline"]
        diffs = [replicas_at(sim_tl, t) - replicas_at(real_tl, t) for t in range(0, horizon + 1)]
        at = max(range(len(diffs)), key=lambda t: abs(diffs[t]))
        rows.append({"run": run, "load": pool, "metric": "replicas (worst second)", "real": replicas_at(real_tl, at),
                     "simulated": replicas_at(sim_tl, at), "error": diffs[at], "tolerance": 1, "at_s": at,
                     "seconds_off": sum(1 for d in diffs if abs(d) > 1), "seconds": len(diffs),
                     "slack_s": slack_s(real_tl, sim_tl, range(0, horizon + 1)),
                     "within": abs(diffs[at]) <= 1})
        rows += decisions(run, pool, seen.target_timeline(pool), sim["pools"][pool]["targets"])
    real_p95 = p95_by_step(measured["latencies"])
    sim_p95 = p95_by_step(sim_latencies)
    for step in real_p95:
        real, s = real_p95[step], sim_p95[step]
        error = round(s / real - 1, 4) if real and s is not None else None
        bar = step == "all"
        rows.append({"run": run, "load": f"step {step}" if not bar else "whole run", "metric": "p95_ms", "real": real,
                     "simulated": s, "error": error, "tolerance": P95_TOLERANCE if bar else None,
                     "within": (error is not None and abs(error) <= P95_TOLERANCE) if bar else None})
    real_held, sim_held = in_flight(measured["latencies"]), in_flight(sim_latencies)
    for window, real in real_held.items():
        rows.append({"run": run, "load": f"in flight {window}", "metric": "requests (mean)", "real": real,
                     "simulated": sim_held[window], "error": round(sim_held[window] - real, 3), "tolerance": None,
                     "within": None})
    return rows


def print_run(run: int, rows: list[dict], startups: dict[str, list], hops: dict,
              timing: dict[str, ControlTiming]) -> None:
    print(f"run {run}: each new replica's start-up (target rise -> RUNNING, s) {startups}; hops per call {hops['calls']}")
    t = next(iter(timing.values()))
    print(f"  the controller's loop every {t.period_s} s (from its log); simulated phases: the loop's "
          f"{t.control_phase_s} s, the handles' {', '.join(f'{p} {x.handle_phase_s} s' for p, x in timing.items())}")
    for r in rows:
        mark = "" if r["within"] is None else ("ok" if r["within"] else "MISS")
        if r["error"] is None:
            err = "-"
        elif r["metric"].endswith("(s)"):
            err = f"{r['error']:+.2f} s"
        elif r["metric"] == "requests (mean)":
            err = f"{r['error']:+.2f}"
        else:
            err = f"{r['error']:+d}" if isinstance(r["error"], int) else f"{r['error']:+.1%}"
        off = (f"  ({r['seconds_off']} of {r['seconds']} s off by more than 1, worst at {r['at_s']} s; "
               f"within ±1 at every second given {r['slack_s']} s of slack in time)"
               if "seconds_off" in r else "")
        print(f"  {r['load']:<24} {r['metric']:<24} real {r['real']!s:>8}  simulated {r['simulated']!s:>8}  {err:>7} {mark}{off}")


def print_stages(stage_ms: dict[str, dict]) -> None:
    """Each stage call's mean ms real/simulated, by the step its requests were sent in: which pool's
    calls run longer where the two hold different numbers of requests."""
    print("  stage calls, mean ms real/simulated, by the step their requests were sent in:")
    for step, real in stage_ms["real"].items():
        sim = stage_ms["simulated"].get(step, {})
        both = [f"{name} {ms:.0f}/{sim[name]:.0f}" for name, ms in real.items() if name in sim]
        if both:
            print(f"    {step:<14} " + ", ".join(both))


def run_once(run: int, app, items: list[dict], profile: dict, hops: dict,
             autoscaling: dict = AUTOSCALING, read_controller: bool = False,
             host_cores: float | None = None) -> tuple[list[dict], dict]:
    sends = step_arrivals(STEPS, DURATION_S, seed=run)
    start, start_wall = time.monotonic(), time.time()
    reading = ControllerTotals(start) if read_controller else contextlib.nullcontext()
    with ReplicaPoller(start) as poller, reading as totals:
        measured = asyncio.run(scheduled_loop(app.url, items, sends))
        time.sleep(2.0)
    log = controller_log()
    seen = LoggedPools(log, start_wall, time.time(), poller) if log else poller
    lag = poll_lag(seen, poller) if log else {}
    startup, startups = seen.startup_s() or 0.0, {p: seen.startups(p) for p in POOLS}
    timing = sim_timing(seen, run, autoscaling)
    sim, sim_latencies, sim_calls = simulated(profile, measured["sent"], startup,
                                              PACED_PROFILE["workload"]["transfer_rate"], measured["paths"], startups,
                                              autoscaling, host_cores, timing)
    rows = figures(run, seen, measured, sim, sim_latencies)
    print_run(run, rows, startups, hops, timing)
    stage_ms = {"real": stage_ms_by_step(measured["calls"]), "simulated": stage_ms_by_step(sim_calls)}
    print_stages(stage_ms)
    poll = {"median_s": round(statistics.median(poller.took), 3), "max_s": round(max(poller.took), 3)} if poller.took else {}
    print(f"  Serve's REST API answered each poll in {poll.get('median_s')} s (median), {poll.get('max_s')} s at most")
    gap = {p: totals_gap(totals.samples[p], sim["pools"][p]["totals"]) for p in POOLS} if totals else {}
    if gap:
        print(f"  the look-back mean the controller was fed less the simulated one, by window: {gap}")
    print(f"  replicas from {log or 'the polls (no controller log found)'}; the polls saw each change "
          f"{lag.get('mean_s')} s after the log on average ({lag.get('min_s')}..{lag.get('max_s')} s)")
    print(f"  failed: real {measured['errors'] or 0} (503s turned away by {measured['turned_away'] or '-'}); "
          f"simulated {sim['rejected']} turned away, {sim['pools']['Router']['rejected']} of them at the Router's door")
    return rows, {"run": run, "sent": measured["sent"], "paths": measured["paths"], "host_cores": host_cores,
                  "timing": {p: dataclasses.asdict(t) for p, t in timing.items()},
                  "startup_s": startup, "startups": startups, "hops": hops, "errors": measured["errors"],
                  "turned_away": measured["turned_away"], "simulated_rejected": sim["rejected"], "poll": poll,
                  "replicas_from": str(log) if log else "polls", "poll_lag": lag,
                  "controller_totals": totals.samples if totals else {}, "totals_gap": gap,
                  "real_timeline": {p: seen.timeline(p) for p in POOLS},
                  "real_targets": {p: seen.target_timeline(p) for p in POOLS},
                  "polled_timeline": {p: poller.timeline(p) for p in POOLS},
                  "polled_targets": {p: poller.target_timeline(p) for p in POOLS},
                  "simulated": {p: sim["pools"][p] for p in POOLS},
                  "real_latencies": measured["latencies"], "simulated_latencies": sim_latencies, "stage_ms": stage_ms}


def settle(poller_app: str = "tandem", timeout_s: float = 120.0) -> None:
    """Wait until both autoscaled pools are back at one running replica (after a previous run)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5) as http:
        while time.monotonic() < deadline:
            deps = serve_deployments(http, poller_app)
            if all(len(deps[p]["replicas"]) == 1 and deps[p]["replicas"][0]["state"] == "RUNNING" for p in POOLS):
                return
            time.sleep(1.0)
    raise TimeoutError("the autoscaled pools did not come back to one replica")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1, help="step loads, one after another on the same app")
    p.add_argument("--metrics-interval-s", type=float, default=AUTOSCALING["metrics_interval_s"],
                   help="the pools' metrics_interval_s: how often each handle records and pushes their requests")
    p.add_argument("--read-controller", action="store_true",
                   help="also read the look-back mean Serve's controller was fed, every 0.25 s (joins the cluster "
                        "as a driver; its reads are work on the app's cores, so the bars are measured without them)")
    p.add_argument("--host-cores", type=float, default=os.cpu_count(),
                   help="the cores the simulated app's own work (Router, hops) shares; 0: each its own")
    p.add_argument("--out", default=str(ROOT / "results"))
    args = p.parse_args(argv)
    autoscaling = {**AUTOSCALING, "metrics_interval_s": args.metrics_interval_s}
    out = Path(args.out) / f"autoscale-check-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(PACED_PROFILE, indent=1))
    (out / "zero.json").write_text(json.dumps(zero_profile(PACED_PROFILE), indent=1))
    print(f"autoscale_check: {args.runs} run(s) of an open loop in steps {STEPS} for {DURATION_S:.0f} s; "
          f"{', '.join(POOLS)} autoscaled with {autoscaling}")
    items, rows, runs = bodies(64, seed=0), [], []
    with paced_app(out / "profile.json", out / "zero.json", autoscaled=dict.fromkeys(POOLS, autoscaling)) as app:
        if args.read_controller:
            join_ray()
        asyncio.run(closed_loop(app.url, items, 1, 3.0))  # warm-up, below the target
        for run in range(1, args.runs + 1):
            hops = measure_hops(app.url, items, 10.0)
            settle()
            time.sleep(autoscaling["look_back_period_s"] + autoscaling["metrics_interval_s"])
            run_rows, detail = run_once(run, app, items, {**PACED_PROFILE, "calls": hops["calls"]}, hops, autoscaling,
                                        args.read_controller, args.host_cores)
            rows += run_rows
            runs.append(detail)
        if args.read_controller:
            import ray

            ray.shutdown()  # before the app's cluster goes
    (out / "autoscale_check.json").write_text(json.dumps({"runs": runs, "figures": rows}, indent=1, default=str))
    print(f"results: {out}")
    bars = [r for r in rows if r["within"] is not None]
    print(json.dumps({"engine": "paced", "autoscaling": autoscaling,
                      "figures": [{k: r[k] for k in ("run", "load", "metric", "real", "simulated", "error", "tolerance")}
                                  for r in bars], "within": all(r["within"] for r in bars)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
