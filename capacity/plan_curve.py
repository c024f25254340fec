"""The planner for a traffic curve: each GPU pool's min/max replicas and autoscaling target, by
simulating the curve with Serve's autoscaling (capacity/autoscale.py):

    python -m capacity.plan --profile P.json --rate-steps 0:200,600:1000,1800:300 --p95-ms 2000 \\
        [--startup-s SmallReasoner=60,LargeAnswerer=90] [--base serve_config.gpu.yaml --out plan.yaml]

1. max_replicas: the fixed plan (capacity/plan.py's search) for the curve's peak rate; min_replicas:
   the fixed plan for its lowest non-zero rate.
2. target_ongoing_requests: the requests a replica of the peak plan holds on average there (what the
   pool settles at when it carries the peak with max_replicas), times a factor; the whole curve is
   simulated with factors 1, 0.8, 0.6, 0.4, 0.25 — a lower target scales up sooner and holds more
   replicas — and the first that meets the SLO over the whole curve (p95, rejections, nothing left
   unanswered) is the plan.
3. If none does (a step steeper than the upscale delay and a replica's start-up let the pool follow),
   min_replicas rises a third of the way to max_replicas at a time, and 2. is tried again.
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


def plan_curve(planner: Planner, steps: list[tuple[float, float]], duration_s: float, *, startup_s: dict[str, float],
               delays: dict[str, Autoscaling | None]) -> dict:
    """The cheapest min/max/target found for `steps` (from s, req/s) over `duration_s`; see the module."""
    rates = [r for _, r in steps]
    peak_rate, low_rate = max(rates), min((r for r in rates if r > 0), default=max(rates))
    peak, peak_result = planner.plan(peak_rate)
    low, _ = planner.plan(low_rate) if low_rate < peak_rate else (peak, peak_result)
    pools = scaling_pools(planner.settings)
    per_replica = {n: peak_result["pools"][n]["held_mean"] / peak[n] for n in pools}
    sends = step_arrivals(steps, duration_s, planner.seed)
    mins = {n: min(low[n], peak[n]) for n in pools}
    tried = []
    while True:
        for factor in FACTORS:
            configs = {n: dataclasses.replace(delays.get(n) or Autoscaling(), min_replicas=mins[n], max_replicas=peak[n],
                                              initial_replicas=None,
                                              target_ongoing_requests=round(max(0.25, per_replica[n] * factor), 2))
                       for n in pools}
            settings = curve_settings(planner, peak, peak_rate, configs, startup_s)
            r = simulate(planner.profile, planner.workload, peak, settings, duration_s=duration_s, arrivals=sends,
                         seed=planner.seed, host_cores=planner.host_cores)
            meets = planner.meets(r)
            tried.append({"min": dict(mins), "factor": factor, "p95_ms": r["p95_ms"], "gpus_mean": round(r["gpus"], 2),
                          "rejection_rate": r["rejection_rate"], "meets": meets})
            if planner.verbose:
                print(f"  min {planner._label(mins)} target x{factor}: p95 {r['p95_ms']:.0f} ms, rejected "
                      f"{r['rejection_rate']:.2%}, {r['gpus']:.1f} GPUs on average -> {'meets' if meets else 'misses'}",
                      flush=True)
            if meets:
                return {"peak_rate": peak_rate, "low_rate": low_rate, "peak_plan": peak, "low_plan": low,
                        "autoscaling": {n: {"min_replicas": c.min_replicas, "max_replicas": c.max_replicas,
                                            "target_ongoing_requests": c.target_ongoing_requests} for n, c in configs.items()},
                        "configs": configs, "result": r, "gpus_mean": round(r["gpus"], 2),
                        "gpus_peak_fixed": gpus(peak, planner.settings), "tried": tried}
        if all(mins[n] >= peak[n] for n in pools):
            raise RuntimeError(f"no autoscaling meets p95 {planner.p95_ms} ms over the curve, not even at the peak plan")
        mins = {n: min(peak[n], mins[n] + max(1, math.ceil((peak[n] - low[n]) / 3))) for n in pools}


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
