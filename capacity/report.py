"""What a simulated run reports (`capacity.simulate`): its throughput and latency percentiles, how
many requests were turned away or left unanswered, and per pool its replicas, utilisation, queueing
and batching (an autoscaled pool also its replicas over time); and the table that prints them."""

from __future__ import annotations

import math
from itertools import compress
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.metrics import percentile
from capacity.autoscale import mean_replicas, scaling_summary

if TYPE_CHECKING:
    from capacity.simulate import Simulation


def summarise(self: Simulation, rate, concurrency, duration_s: float, warmup: float, wall_s: float) -> dict:
    """A run's figures (`Simulation.summary`)."""
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
        busy = sum(r.compute_s for r in (*pool.replicas, *pool.retired))
        q = np.frombuffer(pool.queue_s, dtype=float) * 1000
        replica_s = pool.replica_seconds(self.env.now)
        pools[name] = {"replicas": len(pool.replicas), **scaling_summary(self, name),
                       "utilisation": round(busy / replica_s, 3) if replica_s else 0,
                       "held_mean": round(pool.held_mean(self.env.now), 3),
                       "queue_ms_mean": round(float(np.mean(q)), 2) if len(q) else 0.0,
                       "queue_ms_p95": round(percentile(q, 95), 2) if len(q) else 0.0, "rejected": pool.rejected,
                       "mean_batch": round(pool.batched / pool.batches, 2) if pool.batches else None}
    gpus = sum(mean_replicas(self, p) * p.settings.gpus_per_replica for p in self.pools.values())
    # On shared cores: the CPU work charged per answered request, at the profile's speed, over the
    # whole run (those still in flight at its end counted half done) — what a load's measured CPU
    # per request is to be set against, to read how fast the machine ran it (capacity/sim_check.py).
    cpu = ({"cpu_ms_per_request": round(1000 * self.cores.work_s / max(1.0, len(self.latency_s) + self.in_flight / 2), 3)}
           if self.cores is not None else {})
    return {"benchmark": "simulate", "rate_rps": rate, "concurrency": concurrency, "duration_s": duration_s,
            "replicas": {n: len(p.replicas) for n, p in self.pools.items()}, "gpus": gpus,
            "throughput_rps": round(done / window, 2) if window > 0 else math.nan,
            "mean_ms": round(float(np.mean(lat)), 2) if len(lat) else math.nan, "p50_ms": round(percentile(lat, 50), 2), "p95_ms": round(percentile(lat, 95), 2),
            "p99_ms": round(percentile(lat, 99), 2), "completed": len(lat), "rejected": rejected,
            "unfinished": unfinished,
            "rejection_rate": round(rejected / arrived, 4) if arrived else 0.0,
            "paths": paths, "pools": pools, **cpu,
            "stage_ms": {stage: round(1000 * s / n, 1) for stage, (n, s) in sorted(self.stage_s.items()) if stage and n},
            "wall_s": round(wall_s, 2)}


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
    for name, p in r["pools"].items():
        if "timeline" in p:
            print(f"{name} autoscaled, {p['replicas_mean']} replicas on average; running replicas from "
                  + ", ".join(f"{t:g} s: {n}" for t, n in p["timeline"]))
