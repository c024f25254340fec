"""Capacity planner: the cheapest replicas per pool that carry a rate within a p95 SLO, by simulation.

    python -m capacity.plan --profile P.json --rate 1000 --p95-ms 2000 --transfer-rate 0.137 \\
        [--config serve_config.gpu.yaml] [--out plan.yaml] [--sanity]

Cost is GPUs, each pool's replicas times its `num_gpus` in the serve config (the Router's replicas
take none; among plans with as many GPUs, fewer Routers win). The search:
1. a lower bound per pool from the work one request brings (each stage's time per request at the
   pool's largest batch, as the profile measures it) times the rate; for the Routers, which hold a
   request for its whole life, enough slots for the rate times an unloaded request's latency;
2. grow: simulate, and while the p95 misses the SLO or more than `--max-rejection` of requests are
   rejected, add replicas to the pool whose calls wait longest (in steps of ~10 %);
3. trim: for each pool, most GPUs per replica first, remove replicas (steps of ~10 %, halved on a
   miss, down to one) while the plan still meets both.
Every simulation uses the same seed and arrivals, so two plans are compared on the same traffic.
The Routers' admission limit (`http.max_in_flight`) is sized with the plan and simulated with it:
a Router replica's share of the rate times the SLO (by Little's law, past that many requests in
flight the mean one waits longer than the SLO, so they are turned away rather than queued), below
the Router's `max_ongoing_requests`; `--keep-admission` plans with the config's limit instead.
Writes a serve-config overlay (`num_replicas` per deployment, the admission limit; `--base` merges
it into a whole config, whose model queues it raises to hold what the limit admits, as `tandem
validate-config` requires — and as the plan was simulated). `--sanity` also simulates the plan with one replica fewer in its busiest GPU
pool (it should miss), plans twice the rate (the GPUs should roughly double) and simulates the plan
for four times as long (it should still meet: a longer run is nearer the p95 a pool settles at).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
from pathlib import Path

import yaml

from capacity.autoscale import parse_steps
from capacity.profile import (GENERATORS, POOLS, PoolSettings, Profile, Workload, add_workload_args, parse_seconds,
                              settings_for, settings_from_config,
                              workload_for)
from capacity.simulate import STEADY_PATHS, default_duration, simulate
from tandem.cli import read_tandem_args
from tandem.config import calls_at_once, load_tandem_config, queue_to_hold


def lower_bound(profile: Profile, workload: Workload, settings: dict[str, PoolSettings], rate: float) -> dict[str, int]:
    """Replicas each pool needs just to keep up with `rate` when every batch is full: the busy time one
    request brings to the pool (its stages' share of a full batch) times the rate, rounded up."""
    busy = {name: 0.0 for name in POOLS}  # ms of one replica's time per request
    busy["Router"] = profile.router_ms
    for _, share, phases in workload.paths:
        for phase in phases:
            for call in phase:
                if call.kind == "vision":
                    b = settings["VisionEncoder"].max_batch_size
                    busy["VisionEncoder"] += share * workload.images * profile.vision[call.role](b) / b
                else:
                    pool = GENERATORS[call.role]
                    b = min(settings[pool].max_batch_size, settings[pool].max_ongoing)
                    busy[pool] += share * (call.steps * profile.step[call.role](b)
                                           + profile.prefill[call.role](b * call.prompt_tokens)) / b
    return {name: max(1, math.ceil(rate * ms / 1000)) for name, ms in busy.items()}


def admission_limit(rate: float, routers: int, p95_ms: float, max_ongoing: int) -> int:
    """http.max_in_flight for a plan: a Router replica's share of the rate times the p95 SLO. More in
    flight than that means the mean request takes longer than the SLO (Little's law): the requests
    past it would miss anyway, and queueing them makes the ones behind miss too. Kept below Serve's
    max_ongoing_requests, or Serve would queue before the Router could turn anything away (the rule
    `tandem validate-config` enforces)."""
    return max(1, min(math.ceil(rate / routers * p95_ms / 1000), max_ongoing - 1))


def router_slots(settings: PoolSettings) -> int:
    """Requests a Router replica holds at once: Serve's limit, or the app's admission limit if lower."""
    return min(settings.max_ongoing, settings.admit) if settings.admit else settings.max_ongoing


def gpus(replicas: dict[str, int], settings: dict[str, PoolSettings]) -> float:
    return sum(n * settings[name].gpus_per_replica for name, n in replicas.items())


class Planner:
    def __init__(self, profile: Profile, workload: Workload, settings: dict[str, PoolSettings], *, p95_ms: float,
                 max_rejection: float = 0.001, duration_s: float = 30.0, seed: int = 0, host_cores=None,
                 size_admission: bool = True, verbose: bool = True, calls: dict[str, int] | None = None):
        self.profile, self.workload, self.settings = profile, workload, settings
        self.calls = calls or calls_at_once(speculative=False)  # per request, on each model deployment
        self.size_admission = size_admission
        self.p95_ms, self.max_rejection = p95_ms, max_rejection
        self.duration_s, self.seed, self.host_cores, self.verbose = duration_s, seed, host_cores, verbose
        self.simulations = 0
        self._seen: dict = {}  # (replicas, rate, duration) -> result: the trim step revisits plans

    def evaluate(self, replicas: dict[str, int], rate: float, duration_s: float | None = None) -> dict:
        duration_s = duration_s or self.duration_s
        key = (tuple(sorted(replicas.items())), rate, duration_s)
        if key in self._seen:
            return self._seen[key]
        self.simulations += 1
        r = self._seen[key] = simulate(self.profile, self.workload, replicas, self.settings_for(replicas, rate), rate=rate,
                                       duration_s=duration_s, seed=self.seed, host_cores=self.host_cores)
        if self.verbose:
            print(f"  {self._label(replicas)}: p95 {r['p95_ms']:.0f} ms, rejected {r['rejection_rate']:.2%}, "
                  f"{r['throughput_rps']} req/s -> {'meets' if self.meets(r) else 'misses'}", flush=True)
        return r

    def settings_for(self, replicas: dict[str, int], rate: float) -> dict[str, PoolSettings]:
        """The pools' settings a plan runs with: the config's, with the Routers' admission limit sized
        for the plan unless the config's is kept."""
        if not self.size_admission:
            return self.settings
        router = self.settings["Router"]
        limit = admission_limit(rate, replicas["Router"], self.p95_ms, router.max_ongoing)
        # The model queues as the written config will have them: holding what the Routers admit.
        return {**self.settings, "Router": dataclasses.replace(router, admit=limit),
                **{n: dataclasses.replace(self.settings[n], max_queued=queue_to_hold(self.settings[n].max_queued, k, limit))
                   for n, k in self.calls.items()}}

    def meets(self, r: dict) -> bool:
        # A request still unanswered after the drain is not in the p95 it would break: none may be.
        return (r["completed"] > 0 and not r.get("unfinished") and r["p95_ms"] <= self.p95_ms
                and r["rejection_rate"] <= self.max_rejection)

    @staticmethod
    def _label(replicas: dict[str, int]) -> str:
        return " ".join(f"{k[:5]}={v}" for k, v in replicas.items())

    def bottleneck(self, result: dict) -> str:
        """The pool to grow: the model pool whose calls wait longest for a batch (or reject), since
        the p95 is made of those waits; the Router only when no model pool waits (its own slots or
        CPU are short — a Router queue behind a slow model pool is that pool's doing)."""
        pools = result["pools"]
        models = [n for n in POOLS if n != "Router"]
        worst = max(models, key=lambda n: (pools[n]["rejected"] > 0, pools[n]["queue_ms_p95"]))
        if pools[worst]["rejected"] == 0 and pools[worst]["queue_ms_p95"] < 0.1 * self.p95_ms and (
                pools["Router"]["rejected"] or pools["Router"]["queue_ms_p95"] >= 0.1 * self.p95_ms):
            return "Router"
        return worst

    def grow(self, replicas: dict[str, int], result: dict, rate: float) -> dict[str, int]:
        """A plan that missed in `result`, grown: its bottleneck pool by ~10 %; the Routers to at least
        the slots Little's law asks of what was measured (the rate times the mean latency, +25 %)."""
        worst = self.bottleneck(result)
        grown = replicas[worst] + max(1, round(replicas[worst] * 0.1))
        if worst == "Router" and result["completed"]:
            need = rate * result["mean_ms"] / 1000 * 1.25 / router_slots(self.settings_for(replicas, rate)["Router"])
            grown = max(grown, math.ceil(need))
        return {**replicas, worst: grown}

    def plan(self, rate: float, max_iterations: int = 60) -> tuple[dict[str, int], dict]:
        replicas = lower_bound(self.profile, self.workload, self.settings, rate)
        # Little's law: the Routers hold every request for its whole latency, at least an unloaded one.
        # (With the admission limit sized, a Router replica holds at least the rate's share times the
        # SLO, which is above an unloaded request's latency; with the config's limit kept, that limit.)
        per_router = self.settings["Router"].max_ongoing if self.size_admission else router_slots(self.settings["Router"])
        slots = rate * self.workload.unloaded_s(self.profile, mean=True) / per_router
        replicas["Router"] = max(replicas["Router"], math.ceil(slots))
        if self.verbose:
            print(f"rate {rate} req/s: lower bound {self._label(replicas)}")
        result = self.evaluate(replicas, rate)
        for _ in range(max_iterations):
            if self.meets(result):
                break
            replicas = self.grow(replicas, result, rate)
            result = self.evaluate(replicas, rate)
        else:
            raise RuntimeError(f"no plan meets p95 {self.p95_ms} ms within {max_iterations} steps; last "
                               f"{self._label(replicas)}: p95 {result['p95_ms']} ms")
        # Trim: dearest replicas first, in steps of ~10 % halved on each miss down to one replica,
        # keeping the SLO: the plan ends where one replica fewer in any pool misses.
        for name in sorted(POOLS, key=lambda n: -self.settings[n].gpus_per_replica):
            step = max(1, replicas[name] // 10)
            while step >= 1 and replicas[name] > 1:
                fewer = {**replicas, name: max(1, replicas[name] - step)}
                r = self.evaluate(fewer, rate)
                if self.meets(r):
                    replicas, result = fewer, r
                else:
                    step //= 2
        return replicas, result


def busiest_gpu_pool(result: dict, settings: dict[str, PoolSettings]) -> str:
    return max((n for n in POOLS if settings[n].gpus_per_replica > 0 and result["replicas"][n] > 1),
               key=lambda n: result["pools"][n]["utilisation"], default="LargeAnswerer")


def overlay(replicas: dict[str, int], base: dict | None = None, max_in_flight: int | None = None) -> dict:
    """The plan as a serve config: `base` with each deployment's replicas (and the Routers' admission
    limit, if given, with the model queues that hold what it admits) fixed, or just the overlay."""
    if base is None:
        app = {"name": "tandem", "deployments": [{"name": n, "num_replicas": replicas[n]} for n in POOLS]}
        if max_in_flight is not None:
            app["args"] = {"http": {"max_in_flight": max_in_flight}}
        return {"applications": [app]}
    config = copy.deepcopy(base)
    app = config["applications"][0]
    for d in app["deployments"]:
        if d["name"] in replicas:
            d.pop("autoscaling_config", None)
            d["num_replicas"] = replicas[d["name"]]
    if max_in_flight is not None:
        app.setdefault("args", {}).setdefault("http", {})["max_in_flight"] = max_in_flight
        calls = calls_at_once(load_tandem_config(app.get("args")).policy.speculative)
        for d in app["deployments"]:
            if d["name"] in calls and "max_queued_requests" in d:
                d["max_queued_requests"] = queue_to_hold(d["max_queued_requests"], calls[d["name"]], max_in_flight)
    return config


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="target arrivals per second (open loop)")
    load.add_argument("--rate-steps", type=parse_steps,
                      help="a traffic curve, e.g. 0:200,600:1000 (from s: req/s): plan autoscaling for it (capacity/plan_curve.py)")
    p.add_argument("--startup-s", type=parse_seconds, default={},
                   help="with --rate-steps: how long a new replica takes to come up, e.g. LargeAnswerer=90")
    p.add_argument("--p95-ms", type=float, required=True, help="the p95 latency SLO")
    p.add_argument("--max-rejection", type=float, default=0.001, help="largest share of 503s allowed")
    p.add_argument("--duration-s", type=float, default=None,
                   help=f"simulated seconds per candidate (default: 30, or {STEADY_PATHS} slowest-path latencies if longer)")
    p.add_argument("--out", help="write the plan as a serve-config overlay (YAML)")
    p.add_argument("--base", help="with --out: merge into this serve config instead (a whole config)")
    p.add_argument("--sanity", action="store_true", help="also: one GPU fewer in the busiest pool; twice the rate; four times as long")
    p.add_argument("--keep-admission", action="store_true",
                   help="plan with the config's http.max_in_flight instead of sizing it for the plan")
    args = p.parse_args(argv)
    profile = Profile.load(args.profile)
    workload = workload_for(args, profile)
    settings = settings_for(args)
    duration = args.duration_s or default_duration(profile, workload)
    print(f"profile {args.profile} ({profile.source.get('device', '?')}); workload: {workload.describe()}")
    planner = Planner(profile, workload, settings, p95_ms=args.p95_ms, max_rejection=args.max_rejection,
                      duration_s=duration, seed=args.seed, host_cores=args.host_cores,
                      size_admission=not args.keep_admission,
                      calls=calls_at_once(load_tandem_config(read_tandem_args(args.config)).policy.speculative))
    try:
        if args.rate_steps:
            return curve_main(args, planner, duration)
        replicas, result = planner.plan(args.rate)
    except RuntimeError as err:  # no plan within the search's steps: say so, not a traceback
        print(f"plan: {err}", file=sys.stderr)
        return 1
    max_in_flight = planner.settings_for(replicas, args.rate)["Router"].admit
    summary = {"benchmark": "plan", "rate_rps": args.rate, "p95_slo_ms": args.p95_ms,
               "transfer_rate": round(sum(s for n, s, _ in workload.paths if n == "transfer"), 4),
               "replicas": replicas, "gpus": gpus(replicas, settings), "max_in_flight": max_in_flight,
               "predicted": {k: result[k] for k in ("throughput_rps", "p50_ms", "p95_ms", "p99_ms", "rejection_rate")}
               | {"utilisation": {n: v["utilisation"] for n, v in result["pools"].items()}},
               "simulations": planner.simulations}
    if args.sanity:
        pool = busiest_gpu_pool(result, settings)
        fewer = {**replicas, pool: replicas[pool] - 1}
        r = planner.evaluate(fewer, args.rate)
        summary["minus_one"] = {"pool": pool, "replicas": fewer, "p95_ms": r["p95_ms"],
                                "rejection_rate": r["rejection_rate"], "meets": planner.meets(r)}
        longer = planner.evaluate(replicas, args.rate, 4 * duration)
        summary["longer"] = {"duration_s": round(4 * duration, 1), "p95_ms": longer["p95_ms"],
                             "rejection_rate": longer["rejection_rate"], "meets": planner.meets(longer)}
        double, _ = planner.plan(2 * args.rate)
        summary["double_rate"] = {"replicas": double, "gpus": gpus(double, settings),
                                  "gpu_ratio": round(gpus(double, settings) / max(summary["gpus"], 1e-9), 2)}
    print(f"\nplan for {args.rate} req/s, p95 <= {args.p95_ms} ms: " + ", ".join(f"{k} {v}" for k, v in replicas.items())
          + f" = {summary['gpus']:g} GPUs; admission limit {max_in_flight or 'none'} a Router; predicted p95 {result['p95_ms']} ms, {result['throughput_rps']} req/s, "
          f"rejected {result['rejection_rate']:.2%}")
    if args.sanity:
        m, d, g = summary["minus_one"], summary["double_rate"], summary["longer"]
        print(f"one fewer {m['pool']}: p95 {m['p95_ms']} ms, rejected {m['rejection_rate']:.2%} -> "
              f"{'still meets (the plan is not tight)' if m['meets'] else 'misses'}; twice the rate: "
              f"{d['gpus']:g} GPUs ({d['gpu_ratio']}x); the plan over {g['duration_s']:.0f} simulated s: p95 "
              f"{g['p95_ms']} ms ({g['p95_ms'] / result['p95_ms'] - 1:+.1%}) -> "
              + ("meets" if g["meets"] else "misses: a plan at its SLO's edge is as exact as its run is long "
                 "(leave the SLO a margin, or plan with a longer --duration-s)"))
    if args.out:
        base = yaml.safe_load(Path(args.base).read_text()) if args.base else None
        Path(args.out).write_text(f"# capacity.plan: {args.rate} req/s, p95 <= {args.p95_ms} ms, transfer rate "
                                  f"{summary['transfer_rate']}, profile {args.profile}\n"
                                  + yaml.safe_dump(overlay(replicas, base, None if args.keep_admission else max_in_flight),
                                                 sort_keys=False))
        print(f"serve config {'(whole)' if base else 'overlay'}: {args.out}")
    print(json.dumps(summary))
    return 0


def curve_main(args, planner: Planner, duration: float) -> int:
    from capacity.plan_curve import curve_overlay, plan_curve

    steps = args.rate_steps
    total = args.duration_s or steps[-1][0] + duration
    delays = settings_from_config(args.config, autoscaling=True)
    plan = plan_curve(planner, steps, total, startup_s=args.startup_s, delays={n: s.autoscaling for n, s in delays.items()})
    r, max_in_flight = plan["result"], planner.settings_for(plan["peak_plan"], plan["peak_rate"])["Router"].admit
    if plan["peak_plan"] != plan["peak_plan_fixed"]:
        print(f"the peak plan for {plan['peak_rate']} req/s ({planner._label(plan['peak_plan_fixed'])}) missed held over "
              f"the curve: grown to {planner._label(plan['peak_plan'])}")
    print(f"\nplan for the curve {steps} over {total:.0f} s, p95 <= {args.p95_ms} ms: "
          + ", ".join(f"{n} {a['min_replicas']}-{a['max_replicas']} target {a['target_ongoing_requests']}"
                      for n, a in plan["autoscaling"].items())
          + f"; Routers {plan['peak_plan']['Router']}, admission limit {max_in_flight}; {plan['gpus_mean']:g} GPUs on "
          f"average against {plan['gpus_peak_fixed']:g} fixed for the peak; predicted p95 {r['p95_ms']} ms, rejected "
          f"{r['rejection_rate']:.2%}" + ("" if args.startup_s else " (replicas simulated ready at once: give --startup-s)"))
    if args.out:
        base = yaml.safe_load(Path(args.base).read_text()) if args.base else None
        Path(args.out).write_text(f"# capacity.plan: the curve {steps}, p95 <= {args.p95_ms} ms, profile {args.profile}\n"
                                  + yaml.safe_dump(curve_overlay(plan, max_in_flight, base), sort_keys=False))
        print(f"serve config {'(whole)' if base else 'overlay'}: {args.out}")
    print(json.dumps({"benchmark": "plan", "rate_steps": steps, "p95_slo_ms": args.p95_ms, "duration_s": total,
                      "autoscaling": plan["autoscaling"], "routers": plan["peak_plan"]["Router"],
                      "peak_plan": plan["peak_plan"], "peak_plan_fixed": plan["peak_plan_fixed"],
                      "max_in_flight": max_in_flight, "gpus_mean": plan["gpus_mean"],
                      "gpus_peak_fixed": plan["gpus_peak_fixed"], "predicted": {k: r[k] for k in ("p50_ms", "p95_ms", "rejection_rate")},
                      "timelines": {n: r["pools"][n]["timeline"] for n in plan["autoscaling"]},
                      "tried": plan["tried"], "simulations": planner.simulations + len(plan["tried"])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
