"""Serve's autoscaling in the simulated cluster: each autoscaled pool's controller, as Serve's
default policy (`replica_queue_length_autoscaling_policy`) runs it.

What it models, from Serve's controller, handles and replicas:
- every `min(0.2 * look_back_period_s, metrics_interval_s)` the pool's requests are recorded — those
  running or queued at its replicas plus those queued at its callers' handles;
- every `metrics_interval_s` the records so far are pushed to the controller, which sees no newer;
- every control-loop tick (Serve's 0.1-s sleep between loops plus the loop's own work: the pool's
  `timing.period_s`) the controller averages what it has seen over the last `look_back_period_s`,
  weighted by time, the last record holding until then, and wants `total / target_ongoing_requests`
  replicas, moves that far from the running count times the up- or downscaling factor, and changes
  its target only once it has wanted to move the same way for `upscale_delay_s` /
  `downscale_delay_s`; the target is kept within min/max_replicas;
- the replicas follow a new target at the next tick: each of Serve's control loops updates the
  deployments' replicas before it runs the autoscaling policy, so what one loop decides the next
  starts or stops;
- a new replica takes requests `startup_s` after it was begun (the pool's settings: its weights'
  load time; a check replaying a run gives each new replica its measured one, `startups`); a removed
  one, replicas still starting first, then the newest running, takes no new requests and stops once
  its own are done.
The control loop and each pool's handle began before the load: their first tick and first record fall
at the phases `timing` gives (0 unless a check draws them), on clocks of their own.
Not modelled: scaling to zero, the cluster autoscaler adding nodes (a replica is placed at once).
"""

from __future__ import annotations

import argparse
import math
import random
from collections import deque
from typing import TYPE_CHECKING

from capacity.profile import Autoscaling

if TYPE_CHECKING:
    from capacity.pools import Pool
    from capacity.simulate import Simulation

RECORD_FACTOR = 0.2   # Serve's RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR
_EPS = 1e-6           # Serve's tolerance on a delay's elapsed time
_TIE = 1e-9           # ticks of two clocks this close are one instant (float products of their periods)


def scaled(desired: float, running: int, cfg: Autoscaling) -> int:
    """Serve's `_apply_scaling_factors`: move from `running` towards `desired` by the factor; a
    downscale the factor would round away still takes one replica off."""
    if running == 0:
        return math.ceil(desired)
    delta = desired - running
    out = math.ceil(running + (cfg.up if delta > 0 else cfg.down) * delta)
    if math.ceil(desired) < running and out == running:
        out -= 1
    return out


class Decision:
    """Serve's `_apply_delay_logic`: the target moves once the policy has wanted the same direction
    for the delay, measured from the first tick that wanted it."""

    def __init__(self, cfg: Autoscaling):
        self.cfg, self.direction, self.since = cfg, 0, None

    def __call__(self, desired: int, target: int, now: float) -> int:
        direction = (desired > target) - (desired < target)
        if direction == 0:
            self.direction, self.since = 0, None
            return target
        if direction != self.direction:
            self.direction, self.since = direction, now
        delay = self.cfg.upscale_delay_s if direction > 0 else self.cfg.downscale_delay_s
        if now - self.since + _EPS < delay:
            return target
        self.direction, self.since = 0, None
        return desired if direction > 0 else max(1, desired)


class Autoscaler:
    """One pool's controller: started by the simulation for a pool whose settings autoscale."""

    def __init__(self, sim: Simulation, pool: Pool):
        self.sim, self.pool = sim, pool
        self.cfg: Autoscaling = pool.settings.autoscaling
        self.target = len(pool.replicas)
        self.starting: list = []  # tickets of replicas on their way up, oldest first
        self.asked = 0  # replicas the target has asked for so far (which of `startups` the next takes)
        self.decide = Decision(self.cfg)
        self.records: deque = deque()  # (time, requests), pushed or not
        self.pushed_at = -math.inf
        self.timeline = [(0.0, len(pool.replicas))]  # (time, running replicas) at every change
        self.targets = [(0.0, self.target)]
        self.totals: list[tuple[float, float]] = []  # (tick, the look-back mean the policy was fed)

    def requests(self) -> int:
        """What Serve's handles report for the pool: each call from its send to its answer (its hop
        included), running on a replica or queued in the handle for one."""
        pool = self.pool
        return sum(r.ongoing for r in pool.replicas) + len(pool.waiting) + pool.sending

    def run(self):
        """Records and pushes on the handle's clock, control ticks on the controller's, as the pool's
        `timing` sets their phases and the loop's period; at the same instant, in that order."""
        cfg, env, timing = self.cfg, self.sim.env, self.pool.settings.timing
        record_s = min(RECORD_FACTOR * cfg.look_back_period_s, cfg.metrics_interval_s)
        # (first, period) of the records, the pushes and the control ticks
        clocks = ((timing.handle_phase_s, record_s), (timing.handle_phase_s + cfg.metrics_interval_s,
                                                      cfg.metrics_interval_s), (timing.control_phase_s, timing.period_s))
        done = [0, 0, 0]
        while True:
            due = [first + n * period for (first, period), n in zip(clocks, done)]
            now = min(due)
            if now > env.now:
                yield env.timeout(now - env.now)
            if due[0] <= now + _TIE:
                self.records.append((now, self.requests()))
                done[0] += 1
            if due[1] <= now + _TIE:
                self.pushed_at = now
                done[1] += 1
            if due[2] <= now + _TIE:
                self.apply()
                self.control(now)
                done[2] += 1

    def seen(self, now: float) -> float | None:
        """What the controller averages: the pushed records as a step function (each holds until the
        next; the last until now), its time-weighted mean over the look-back window; None before
        the first push."""
        records, start = self.records, now - self.cfg.look_back_period_s
        while len(records) > 1 and records[1][0] <= start:  # the record holding at the window's start stays
            records.popleft()
        area, begin, prev = 0.0, None, None
        for t, v in records:
            if t > self.pushed_at:
                break
            if prev is not None:
                area += prev[1] * (t - max(prev[0], start))
            else:
                begin = max(t, start)
            prev = (t, v)
        if prev is None:
            return None
        area += prev[1] * (now - max(prev[0], start))
        return area / (now - begin) if now > begin else float(prev[1])

    def control(self, now: float) -> None:
        total = self.seen(now)
        if total is None:
            return
        self.totals.append((now, total))
        cfg, running = self.cfg, len(self.pool.replicas)
        desired = scaled(total / cfg.target_ongoing_requests, running, cfg)
        target = min(cfg.max_replicas, max(cfg.min_replicas, self.decide(desired, self.target, now)))
        if target != self.target:
            self.target = target
            self.targets.append((now, target))

    def apply(self) -> None:
        """Start or stop replicas until the pool's running and starting ones make the target."""
        target, settings = self.target, self.pool.settings
        while len(self.pool.replicas) + len(self.starting) < target:
            ticket = [False]  # set: the target fell before this replica came up
            self.starting.append(ticket)
            replay = settings.startups
            startup_s = replay[self.asked] if self.asked < len(replay) else settings.startup_s
            self.asked += 1
            self.sim.env.process(self._start(ticket, startup_s))
        while len(self.pool.replicas) + len(self.starting) > target:
            if self.starting:
                self.starting.pop()[0] = True
            else:
                self.pool.retire(self.pool.replicas[-1])
                self._changed()

    def _start(self, ticket: list, startup_s: float):
        yield self.sim.env.timeout(startup_s)
        if ticket[0]:
            return
        self.starting.remove(ticket)
        self.sim.spawn(self.pool.add_replica())
        self._changed()

    def _changed(self) -> None:
        self.timeline.append((self.sim.env.now, len(self.pool.replicas)))


def mean_replicas(sim: Simulation, pool: Pool) -> float:
    """A fixed pool's replicas; an autoscaled one's over the run so far, by time."""
    if pool.name not in sim.autoscalers or not sim.env.now:
        return len(pool.replicas)
    return pool.replica_seconds(sim.env.now) / sim.env.now


def scaling_summary(sim: Simulation, name: str) -> dict:
    """An autoscaled pool's mean replicas, and its running replicas and targets at every change."""
    scaler = sim.autoscalers.get(name)
    if scaler is None:
        return {}
    return {"replicas_mean": round(mean_replicas(sim, scaler.pool), 3),
            "timeline": [(round(t, 3), n) for t, n in scaler.timeline],
            "targets": [(round(t, 3), n) for t, n in scaler.targets]}


def replicas_at(timeline: list[tuple[float, int]], t: float) -> int:
    """The running replicas a timeline of changes had at time `t`."""
    count = timeline[0][1]
    for at, n in timeline:
        if at > t:
            break
        count = n
    return count


def parse_steps(text: str) -> list[tuple[float, float]]:
    """`"0:2,30:8,90:2"`: 2 req/s from the start, 8 from 30 s, 2 again from 90 s."""
    try:
        steps = sorted((float(t), float(r)) for t, r in (part.split(":") for part in text.split(",") if part.strip()))
    except ValueError:
        steps = []
    if not steps or steps[0][0] != 0 or any(r < 0 for _, r in steps):
        raise argparse.ArgumentTypeError(f"bad steps {text!r}: expected <from s>:<req/s>,... starting at 0")
    return steps


def step_arrivals(steps: list[tuple[float, float]], duration_s: float, seed: int) -> list[float]:
    """Poisson send times (s from the start) at each step's rate until the next step, up to `duration_s`."""
    rng, out = random.Random(seed), []
    for i, (start, rate) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else duration_s
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= min(end, duration_s):
                break
            out.append(t)
    return out
