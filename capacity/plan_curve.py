"""The planner for a traffic curve: each GPU pool's min/max replicas and autoscaling target, by
simulating the curve with Serve's autoscaling (capacity/autoscale.py):

    python -m capacity.plan --profile P.json --rate-steps 0:200,600:1000,1800:300 --p95-ms 2000 \\
        [--startup-s SmallReasoner=60,LargeAnswerer=90] [--base serve_config.gpu.yaml --out plan.yaml]

1. max_replicas: the fixed plan (capacity/plan.py's search) for the curve's peak rate, simulated held
   over the whole curve (min = max) and grown by the planner's rule until it meets the SLO there: a
   plan sized on a shorter run can miss over a curve that holds its peak longer. min_replicas: the
   fixed plan for the curve's lowest non-zero rate.
2. target_ongoing_requests: the requests a replica of the peak plan holds on average there (what the
   pool settles at when it carries the peak with max_replicas), times a factor; the whole curve is
   simulated with factors 1, 0.8, 0.6, 0.4, 0.25 — a lower target scales up sooner and holds more
   replicas — and the first that meets the SLO over the whole curve (p95, rejections, nothing left
   unanswered) is the plan.
3. If none does (a step steeper than the upscale delay and a replica's start-up let the pool follow),
   min_replicas rises a third of the way to max_replicas at a time, and 2. is tried again; at
   max_replicas it is the held plan of 1.
The Routers keep the peak plan's replicas and admission limit. Each pool's delays and metric windows
are its `autoscaling_config`'s in --config (Serve's defaults where it has none); a new replica takes
`--startup-s` (default 0: say how long your model takes to load). Reports the curve's mean GPUs
beside the peak plan's fixed count.
"""

from __future__ import annotations

import copy
import dataclasses
import math

from capacity.autoscale import step_arrivals
from capacity.plan import Planner, gpus
from capacity.profile import POOLS, Autoscaling, PoolSettings
from capacity.simulate import simulate

FACTORS = (1.0, 0.8, 0.6, 0.4, 0.25)


def scaling_pools(settings: dict[str, PoolSettings]) -> list[str]:
    return [n for n in POOLS if settings[n].gpus_per_replica > 0]


def curve_settings(planner: Planner, peak: dict[str, int], peak_rate: float, configs: dict[str, Autoscaling],
                   startup_s: dict[str, float]) -> dict[str, PoolSettings]:
    """The peak plan's settings (admission limit, queues), each GPU pool autoscaled by `configs`."""
    settings = planner.settings_for(peak, peak_rate)
    return {**settings, **{n: dataclasses.replace(settings[n], autoscaling=cfg, startup_s=startup_s.get(n, 0.0))
                           for n, cfg in configs.items()}}


class CurveRuns:
    """The curve simulated with one choice of floors, ceilings and target factor, each run recorded."""

    def __init__(self, planner: Planner, sends: list[float], duration_s: float, per_replica: dict[str, float],
                 delays: dict[str, Autoscaling | None], startup_s: dict[str, float], peak_rate: float):
        self.planner, self.sends, self.duration_s, self.per_replica = planner, sends, duration_s, per_replica
        self.delays, self.startup_s, self.peak_rate = delays, startup_s, peak_rate
        self.tried: list[dict] = []

    def __call__(self, mins: dict[str, int], peak: dict[str, int], factor: float) -> tuple[dict, dict]:
        planner = self.planner
        configs = {n: dataclasses.replace(self.delays.get(n) or Autoscaling(), min_replicas=mins[n],
                                          max_replicas=peak[n], initial_replicas=None,
                                          target_ongoing_requests=round(max(0.25, self.per_replica[n] * factor), 2))
                   for n in mins}
        settings = curve_settings(planner, peak, self.peak_rate, configs, self.startup_s)
        r = simulate(planner.profile, planner.workload, peak, settings, duration_s=self.duration_s, arrivals=self.sends,
                     seed=planner.seed, host_cores=planner.host_cores)
        meets = planner.meets(r)
        self.tried.append({"min": dict(mins), "max": dict(peak), "factor": factor, "p95_ms": r["p95_ms"],
                           "gpus_mean": round(r["gpus"], 2), "rejection_rate": r["rejection_rate"], "meets": meets})
        if planner.verbose:
            print(f"  min {planner._label(mins)} max {planner._label(peak)} target x{factor}: p95 {r['p95_ms']:.0f} ms, "
                  f"rejected {r['rejection_rate']:.2%}, {r['gpus']:.1f} GPUs on average -> {'meets' if meets else 'misses'}",
                  flush=True)
        return configs, r


def held_peak(runs: CurveRuns, peak: dict[str, int], pools: list[str], max_growth: int = 30) -> tuple:
    """The peak plan grown until, held all along (min = max), it meets the SLO over the whole curve: a
    plan sized on a shorter run can miss over a curve that holds its peak longer (decode batches fill
    over minutes), and max_replicas must carry the peak for as long as the curve does. Returns the
    plan and its run (configs, result)."""
    planner = runs.planner
    for _ in range(max_growth):
        configs, r = runs({n: peak[n] for n in pools}, peak, FACTORS[0])
        if planner.meets(r):
            return peak, configs, r
        peak = planner.grow(peak, r, runs.peak_rate)
    raise RuntimeError(f"no plan meets p95 {planner.p95_ms} ms over the curve, even held at its peak, within "
                       f"{max_growth} steps; last {planner._label(peak)}: p95 {r['p95_ms']} ms")


def plan_curve(planner: Planner, steps: list[tuple[float, float]], duration_s: float, *, startup_s: dict[str, float],
               delays: dict[str, Autoscaling | None]) -> dict:
    """The cheapest min/max/target found for `steps` (from s, req/s) over `duration_s`; see the module."""
    rates = [r for _, r in steps]
    peak_rate, low_rate = max(rates), min((r for r in rates if r > 0), default=max(rates))
    fixed, peak_result = planner.plan(peak_rate)
    low, _ = planner.plan(low_rate) if low_rate < peak_rate else (fixed, peak_result)
    pools = scaling_pools(planner.settings)
    per_replica = {n: peak_result["pools"][n]["held_mean"] / fixed[n] for n in pools}
    runs = CurveRuns(planner, step_arrivals(steps, duration_s, planner.seed), duration_s, per_replica, delays,
                     startup_s, peak_rate)
    peak, configs, r = held_peak(runs, fixed, pools)
    mins = {n: min(low[n], peak[n]) for n in pools}
    while any(mins[n] < peak[n] for n in pools):  # at the ceiling the held run above is the plan
        found = next(((c, res) for c, res in (runs(mins, peak, f) for f in FACTORS) if planner.meets(res)), None)
        if found:
            configs, r = found
            break
        mins = {n: min(peak[n], mins[n] + max(1, math.ceil((peak[n] - low[n]) / 3))) for n in pools}
    return {"peak_rate": peak_rate, "low_rate": low_rate, "peak_plan": peak, "peak_plan_fixed": fixed, "low_plan": low,
            "autoscaling": {n: {"min_replicas": c.min_replicas, "max_replicas": c.max_replicas,
                                "target_ongoing_requests": c.target_ongoing_requests} for n, c in configs.items()},
            "configs": configs, "result": r, "gpus_mean": round(r["gpus"], 2),
            "gpus_peak_fixed": gpus(peak, planner.settings), "tried": runs.tried}


def curve_overlay(plan: dict, max_in_flight: int | None, base: dict | None = None) -> dict:
    """The plan as a serve config: each GPU pool's autoscaling_config (its other fields kept from
    `base`), the Routers' replicas and admission limit; `base` merged, or just the overlay."""
    from capacity.plan import overlay

    config = overlay(plan["peak_plan"], copy.deepcopy(base) if base else None, max_in_flight)
    kept = {d["name"]: d.get("autoscaling_config") or {} for d in (base or {"applications": [{}]})["applications"][0].get("deployments", [])}
    for d in config["applications"][0]["deployments"]:
        if d["name"] in plan["autoscaling"]:
            d.pop("num_replicas", None)
            d["autoscaling_config"] = {k: v for k, v in kept.get(d["name"], {}).items() if k != "initial_replicas"} \
                | plan["autoscaling"][d["name"]]
    return config
