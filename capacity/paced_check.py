"""The simulator checked against the served app on the paced engine, where the machine's speed cannot
blur the comparison: `python -m capacity.sim_check --engine paced` (or this module).

    python -m capacity.sim_check --engine paced             # 3 runs, ~12 min on 2 cores
    python -m capacity.sim_check --engine paced --quick     # 1 run, shorter loads

The app is serve_config.yaml's with `engine: paced`: every deployment, handle, queue, batch loop and
stream is real, and each model step takes the time PACED_PROFILE gives it, as a wait. Two more
copies of it answer on a profile of zero times (one never transferring, one always): their
latencies at concurrency 1 are the cost of Serve's own hops, from which the per-call overheads the
simulator charges are taken (`calls`), measured in the same run; in the simulation that work shares
the machine's cores (`--host-cores`) as the real app's does, and the model work is the paced waits.
Then, per run: closed loops at 1, 4 and 16 and an open loop at `--open-fraction` of the throughput
measured at 16, each simulated with the same profile, settings and (for the open loop) arrival
times. Bars: throughput and p50 within ±15 %, p95 within ±20 %, in every run. Prints a table per run, each stage call's mean time
real and simulated under it (where a miss comes from) with the VisionEncoder's calls per batch
(read from its replica's `stats()`: the check joins the app's Ray cluster as a driver for that),
and ends with one JSON line:
{"engine": "paced", "figures": [{"run", "load", "metric", "real", "simulated", "error", "tolerance"}...],
"within": true|false}.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import time
from pathlib import Path

from benchmarks.client import ROOT, LocalApps
from capacity.profile import PROFILE_KIND, Profile, Workload, settings_from_config
from capacity.simulate import simulate
from capacity.sim_check import bodies, closed_loop, open_loop

TOLERANCE = {"throughput_rps": 0.15, "p50_ms": 0.15, "p95_ms": 0.20}
STAGES = {"small_direct": {"prompt_tokens": 60, "decode_steps": 2},
          "large_direct": {"prompt_tokens": 60, "decode_steps": 2},
          "small_reasoning": {"prompt_tokens": 60, "decode_steps": 16},
          "large_transfer": {"prompt_tokens": 160, "decode_steps": 2}}


def _generator(prefill_ms: tuple[float, float], step_ms: tuple[float, float, float]) -> dict:
    return {"prefill": [{"batch": 1, "prompt_tokens": 60, "ms": prefill_ms[0]},
                        {"batch": 8, "prompt_tokens": 60, "ms": prefill_ms[1]}],
            "step": [{"batch": 1, "ms": step_ms[0]}, {"batch": 8, "ms": step_ms[1]}, {"batch": 16, "ms": step_ms[2]}]}


# Service times of a GPU's shape (a step costs little more with more rows), slow enough that the app's
# own CPU per request (parsing, hops, streaming) stays a small share of this machine's at the loads.
PACED_PROFILE = {
    "kind": PROFILE_KIND, "version": 1, "router": {"ms": 1.0},
    "source": {"paced": "service times by definition (capacity/paced_check.py), spent as waits"},
    "vision": {role: [{"images": 1, "ms": 40.0}, {"images": 8, "ms": 96.0}] for role in ("small", "large")},
    "generators": {"small": _generator((60.0, 160.0), (80.0, 104.0, 128.0)),
                   "large": _generator((100.0, 240.0), (120.0, 152.0, 184.0))},
    "workload": {"policy": "mutual", "images": 1, "transfer_rate": 0.3, "stages": STAGES},
}


def zero_profile(profile: dict) -> dict:
    """The same shape at zero times: a copy of the app on it costs only Serve's hops."""
    out = copy.deepcopy(profile)
    for curve in (*out["vision"].values(), *[c for g in out["generators"].values() for c in g.values()]):
        for point in curve:
            point["ms"] = 0.0
    return out


def hop_costs(agree_p50: float, transfer_p50: float, router_ms: float) -> dict:
    """Per-call overheads from the zero-time copies at concurrency 1: a transferring request makes two
    more generate calls (the reasoning, then the transfer) than one that agrees; what is left of an
    agreeing one past the Router and one generate call is its encode call."""
    generate = max(0.0, (transfer_p50 - agree_p50) / 2)
    return {"encode": round(max(0.0, agree_p50 - router_ms - generate), 3), "generate": round(generate, 3)}


def paced_app(profile_path: Path, zero_path: Path, autoscaled: dict[str, dict] | None = None):
    """serve_config.yaml's app on the paced engine, with the zero-time twins; `autoscaled` (deployment
    -> autoscaling_config) autoscales those deployments of the app (not of its twins)."""
    def edit(app: dict) -> None:
        app["args"].update(engine="paced", paced={"profile": str(profile_path)})
        for dep in app["deployments"]:  # the simulator has no feature cache: every image is encoded
            if dep["name"] == "VisionEncoder":
                dep.setdefault("user_config", {})["feature_cache_size"] = 0

    def zero(rate: float):
        def twin(app: dict) -> None:
            app["args"].update(paced={"profile": str(zero_path), "transfer_rate": rate})
            for dep in app["deployments"]:
                if dep.pop("autoscaling_config", None):
                    dep["num_replicas"] = 1
        return twin

    def main_app(app: dict) -> None:
        edit(app)
        for dep in app["deployments"]:
            if dep["name"] in (autoscaled or {}):
                dep.pop("num_replicas", None)
                dep["autoscaling_config"] = dict(autoscaled[dep["name"]])
    return LocalApps(edit=main_app, twins={"zero": zero(0.0), "zero-transfer": zero(1.0)})


def measure_hops(url: str, items: list[dict], duration_s: float) -> dict:
    agree = asyncio.run(closed_loop(f"{url}/zero", items, 1, duration_s))
    transfer = asyncio.run(closed_loop(f"{url}/zero-transfer", items, 1, duration_s))
    return {"agree_p50_ms": agree["p50_ms"], "transfer_p50_ms": transfer["p50_ms"],
            "calls": hop_costs(agree["p50_ms"], transfer["p50_ms"], PACED_PROFILE["router"]["ms"])}


class VisionBatches:
    """The served VisionEncoder's batches, for the calls-per-batch each load ran at. Joins the app's
    local Ray cluster as a driver only to read the replica's `stats()`; `since()` gives the mean
    batch since the last call."""

    def __init__(self, app: str = "tandem"):
        import ray
        from ray import serve

        ray.init(address="auto", log_to_driver=False, logging_level="ERROR")
        self.handle = serve.get_deployment_handle("VisionEncoder", app_name=app)
        self.seen = len(self._sizes())

    def _sizes(self) -> list[int]:
        return self.handle.stats.remote().result()["batch_sizes"]

    def since(self) -> float | None:
        sizes = self._sizes()
        new, self.seen = sizes[self.seen:], len(sizes)
        return round(sum(new) / len(new), 2) if new else None

    def close(self) -> None:
        import ray

        ray.shutdown()


def run_loads(url: str, items: list[dict], duration_s: float, open_fraction: float, seed: int,
              batches: VisionBatches) -> list[dict]:
    """Each load, measured, with the VisionEncoder's mean batch over it (`since()` read after each)."""
    points = []
    batches.since()  # not the warm-up's or the last run's batches
    for c in (1, 4, 16):
        measured = asyncio.run(closed_loop(url, items, c, duration_s))
        points.append({"load": f"closed c={c}", "concurrency": c, "measured": {**measured, "vision_batch": batches.since()}})
    rate = open_fraction * points[-1]["measured"]["throughput_rps"]
    measured = asyncio.run(open_loop(url, items, rate, duration_s, seed))
    points.append({"load": f"open {rate:.1f}/s", "rate": rate, "measured": {**measured, "vision_batch": batches.since()}})
    return points


SIM_LONGER = 5  # a closed loop simulated this many times as long: the simulation's own path draws
# average out, and a closed loop's steady state does not depend on the run's length


def simulated(profile: dict, point: dict, settings: dict, duration_s: float, host_cores: float | None = None) -> dict:
    """The load simulated with the app's own work (the Router, the calls' hops) sharing `host_cores`
    and the model work a wait, as on the paced engine."""
    m = point["measured"]
    share = m["workload"].get("transfer_rate", profile["workload"]["transfer_rate"])
    workload = Workload.mutual(share, profile["workload"]["stages"])
    replicas = {"Router": 1, "VisionEncoder": 1, "SmallReasoner": 1, "LargeAnswerer": 1}
    shared = {"host_cores": host_cores or None, "model_waits": True}
    if "concurrency" in point:
        return simulate(Profile.from_dict(profile), workload, replicas, settings, concurrency=point["concurrency"],
                        duration_s=SIM_LONGER * duration_s, warmup_s=0.1 * duration_s, **shared)
    return simulate(Profile.from_dict(profile), workload, replicas, settings, duration_s=duration_s,
                    warmup_s=0.1 * duration_s, arrivals=m["arrivals_s"], paths=m.get("paths"), **shared)


def figures(run: int, points: list[dict]) -> list[dict]:
    out = []
    for p in points:
        for metric, tol in TOLERANCE.items():
            real, sim = p["measured"][metric], p["simulated"][metric]
            error = sim / real - 1 if real else float("inf")
            out.append({"run": run, "load": p["load"], "metric": metric, "real": real, "simulated": round(sim, 3),
                        "error": round(error, 4), "tolerance": tol, "within": abs(error) <= tol})
    return out


def print_run(run: int, rows: list[dict]) -> None:
    print(f"run {run}: {'load':<16} {'metric':<15} {'real':>9} {'simulated':>10} {'error':>7}")
    for r in rows:
        print(f"       {r['load']:<16} {r['metric']:<15} {r['real']:>9} {r['simulated']:>10} "
              f"{r['error']:>+7.1%} {'ok' if r['within'] else 'MISS'} (±{r['tolerance']:.0%})")


def print_stages(points: list[dict]) -> None:
    """Each stage call's mean time, real (the traces' `latency_ms`) / simulated, per load: where a
    miss comes from, stage by stage."""
    print("       stage calls, mean ms real/simulated:")
    for p in points:
        real, sim = p["measured"].get("stage_ms", {}), p["simulated"].get("stage_ms", {})
        vision = p["simulated"]["pools"]["VisionEncoder"]["mean_batch"]
        print(f"       {p['load']:<16} " + ", ".join(f"{name} {real[name]:.0f}/{sim[name]:.0f}"
                                                    for name in real if name in sim)
              + f"; VisionEncoder calls per batch {p['measured'].get('vision_batch')}/{vision}")


def run_all(url: str, items: list[dict], settings: dict, args, batches: VisionBatches) -> tuple[list, list]:
    """Every run: the hops measured on the zero-time copies, then each load real and simulated."""
    rows, runs = [], []
    for run in range(1, args.runs + 1):
        hops = measure_hops(url, items, min(args.duration_s, 15.0))
        profile = {**PACED_PROFILE, "calls": hops["calls"]}
        points = run_loads(url, items, args.duration_s, args.open_fraction, seed=run, batches=batches)
        for point in points:
            point["simulated"] = simulated(profile, point, settings, args.duration_s, args.host_cores)
        run_rows = figures(run, points)
        print(f"hops (zero-time copies, c=1): agree {hops['agree_p50_ms']} ms, transfer "
              f"{hops['transfer_p50_ms']} ms -> per call {hops['calls']}")
        print_run(run, run_rows)
        print_stages(points)
        rows += run_rows
        runs.append({"run": run, "hops": hops, "points": [{k: v for k, v in pt.items()} for pt in points]})
    return rows, runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="consecutive runs, each every load")
    p.add_argument("--duration-s", type=float, default=40.0, help="per load point")
    p.add_argument("--open-fraction", type=float, default=0.8)
    p.add_argument("--quick", action="store_true", help="1 run of 12 s loads")
    p.add_argument("--host-cores", type=float, default=os.cpu_count(),
                   help="the cores the simulated app's own work (Router, hops) shares; 0: each its own")
    p.add_argument("--out", default=str(ROOT / "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.duration_s = 1, 12.0
    out = Path(args.out) / f"sim-check-paced-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(PACED_PROFILE, indent=1))
    (out / "zero.json").write_text(json.dumps(zero_profile(PACED_PROFILE), indent=1))
    print(f"sim_check --engine paced: {args.runs} run(s) of closed loops at 1, 4, 16 and an open loop at "
          f"{args.open_fraction}x the c=16 throughput, {args.duration_s:.0f} s each; serve_config.yaml on the paced "
          f"engine ({out / 'profile.json'}), one replica a pool")
    items, settings = bodies(64, seed=0), settings_from_config(ROOT / "serve_config.yaml")
    with paced_app(out / "profile.json", out / "zero.json") as app:
        asyncio.run(closed_loop(app.url, items, 4, 5.0))  # warm-up
        batches = VisionBatches()
        try:
            rows, runs = run_all(app.url, items, settings, args, batches)
        finally:
            batches.close()
    (out / "sim_check.json").write_text(json.dumps({"runs": runs, "figures": rows}, indent=1, default=str))
    print(f"results: {out}")
    print(json.dumps({"engine": "paced", "figures": [{k: r[k] for k in ("run", "load", "metric", "real", "simulated",
                                                                         "error", "tolerance")} for r in rows],
                      "within": all(r["within"] for r in rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
