"""The simulator checked against the real app: one run on this machine measures a CPU stage profile,
loads the local app, simulates the same loads from the profile, and compares.

    python -m capacity.sim_check [--quick]
    python -m capacity.sim_check --resimulate results/sim-check-DATE   # a saved run, this model
    python -m capacity.sim_check --fit-elasticity results/sim-check-*   # the canary's elasticity
    python -m capacity.sim_check --engine paced         # where the machine's speed cannot blur it

Starts serve_config.yaml's app (the trained pair, one replica per pool, all on this machine's cores),
then:
1. the stage profile (`capacity.stage_profile`, in this process, threads as a replica has them),
   with the Router's per-request cost and the `mutual` workload measured on the app;
2. `tandem:mutual` on held-out grid items (distinct images: the feature cache, which the simulator
   does not model, stays cold): closed loops at concurrency 1, 4 and 16, then an open loop at
   `--open-fraction` of the throughput measured at 16 (near saturation);
3. the simulator on the same loads (the open loop replaying the send times the app got) — with the
   items' own workload (the paths and stage sizes the concurrency-1 loop's answers reported) — fed by
   that profile and the same config, with the replicas sharing the machine's cores (`--host-cores`,
   default: all of them, less the share the hypervisor gave other guests during that load, less the
   cores Ray's own processes kept busy while the profile loaded the app), running slower than while
   profiling as a canary process beside the app measured, per 2 s, to the power the app's own CPU
   followed it (`CANARY_ELASTICITY`; `capacity/machine_speed.py`:
   this VM's speed moves ~2x within seconds, unseen by steal; it also times a unit of the app's own
   model work, printed beside, which `--resimulate --model-unit torch` applies to the model loops) —
   and, beside it, at the profile's speed;
4. a table: measured vs simulated throughput and p50, and whether each is within `--tolerance`;
   beside them the app's CPU per answered request over each load against the profile's figure for
   as many in flight (the loads of a run that ran at one speed sit together), and the share of the
   machine's CPU time the hypervisor gave to other guests over each load (`steal`; the profile's in
   its `source`), the cores the machine's other processes kept busy over it (`others`), how much
   slower the machine ran over it than while profiling (`machine`), and the errors the simulation at
   the profile's speed would have had (`(model …x)`: the canary's model unit's slowdown); and, last,
   the errors at the speed the load's own CPU says it ran at (`[at its CPU's …x]`: its CPU per answered
   request over what the simulation charges a request of it at the profile's speed) — taken from the
   load itself, so no prediction and not the bar, it tells a model's miss from a speed's.
Each load also records where its 503s came from (`turned_away`: the Router's door, a model
deployment's queue, Serve's proxy). Writes results/sim-check-*/{sim_check.json,profile.json} and
ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import functools
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from benchmarks.client import ROOT, LocalApps, item_body, poisson_sends
from capacity.cpu_per_request import app_processes, cpu_seconds, machine_busy_s, ms_per_request, others_cores
from tasks.grid import grid_items
from capacity.machine_speed import Canary, slower
from benchmarks.metrics import percentile
from capacity.pools import app_cores
from capacity.profile import PoolSettings, Profile, Workload, settings_from_config
from capacity.simulate import simulate
from capacity.stage_profile import Traces


def bodies(n: int, seed: int) -> list[dict]:
    return [item_body(item) for item in grid_items(n, seed=seed)]


def turned_away_by(body: str) -> str:
    """Where a 503 came from, by its body: the Router's door (`http.max_in_flight`, before any work),
    a model deployment's queue (the Router passes its refusal on, after the request's earlier stages
    ran), or Serve's proxy (the Router's own queue: plain text)."""
    if "this server is answering" in body:
        return "door"
    if "a model deployment is at capacity" in body:
        return "model_queue"
    return "proxy" if "Request dropped due to backpressure" in body else "other"


async def _post(http: httpx.AsyncClient, url: str, body: dict, traces: Traces | None = None,
                turned_away: collections.Counter | None = None,
                took: Callable[[dict], None] | None = None) -> tuple[int | str, float, float]:
    start = time.monotonic()
    try:
        r = await http.post(f"{url}/v1/chat/completions", json=body)
        status: int | str = r.status_code
    except httpx.HTTPError as err:
        status = type(err).__name__
    end = time.monotonic()
    if status == 200 and (traces is not None or took is not None):
        trace = r.json()["tandem"]
        if traces is not None:
            traces.add(trace)
        if took is not None:  # this very request's trace: the path it took, its stage calls' times
            took(trace)
    if status == 503 and turned_away is not None:
        turned_away[turned_away_by(r.text)] += 1
    return status, (end - start) * 1000, end


async def closed_loop(url: str, items: list[dict], concurrency: int, duration_s: float) -> dict:
    """`concurrency` clients for `duration_s`; the first 10 % of the time is warm-up, not counted."""
    records, start, counter, traces, away = [], time.monotonic(), iter(range(10**9)), Traces(), collections.Counter()

    async def client(http):
        while time.monotonic() - start < duration_s:
            records.append(await _post(http, url, items[next(counter) % len(items)], traces, away))

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return {**_summary(records, start + 0.1 * duration_s, start + duration_s), "workload": traces.workload(),
            "stage_ms": traces.stage_means(),
            "answered": sum(1 for status, _, _ in records if status == 200), "turned_away": dict(away)}


async def open_loop(url: str, items: list[dict], rate: float, duration_s: float, seed: int) -> dict:
    tasks, start, traces, away = [], time.monotonic(), Traces(), collections.Counter()
    paths: list[str | None] = []  # each send's path, once answered
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1000)) as http:
        async for _ in poisson_sends(rate, seed, duration_s):
            body = items[len(tasks) % len(items)]
            paths.append(None)
            took = functools.partial(lambda i, trace: paths.__setitem__(i, trace["path"]), len(paths) - 1)
            tasks.append(asyncio.ensure_future(_timed(_post(http, url, body, traces, away, took), time.monotonic())))
        records = await asyncio.gather(*tasks)
    # The send times and each one's path, for the simulator to replay: a minute of Poisson arrivals
    # near saturation is a draw (which bursts come when, which of them reason), and the two should be
    # compared on the same one — drawn again in the simulator, the paths alone moved an open loop's
    # simulated p50 by 3-14 % (s.d. over ten draws) at 0.8x its capacity (docs/capacity.md).
    return {**open_loop_summary(records, start, duration_s), "workload": traces.workload(),
            "stage_ms": traces.stage_means(),
            "answered": sum(1 for _, (status, _, _) in records if status == 200), "turned_away": dict(away),
            "offered_rps": round(len(records) / duration_s, 3),
            "arrivals_s": [round(sent - start, 6) for sent, _ in records], "paths": paths}


def open_loop_summary(records: list[tuple[float, tuple[int, float, float]]], start: float, duration_s: float) -> dict:
    """Latency of every request sent after the warm-up, to its end (the client waited for all of
    them): near saturation the latest ones queue longest, and dropping those still open when sending
    stops would censor the tail the queue builds (the simulator counts them the same way).
    Throughput: completions inside the window."""
    warm, stop = start + 0.1 * duration_s, start + duration_s
    kept = [r for sent, r in records if sent >= warm]
    done = sum(1 for _, (s, _, end) in records if s == 200 and warm <= end < stop)
    out = _summary(kept, warm, math.inf)
    out["throughput_rps"] = round(done / (0.9 * duration_s), 3)
    return out


async def _timed(coro, sent: float):
    return sent, await coro


def _summary(records, window_start: float, window_end: float) -> dict:
    ok = [(lat, end) for status, lat, end in records if status == 200]
    counted = [lat for lat, end in ok if window_start <= end < window_end]
    statuses: dict[str, int] = {}
    for status, _, _ in records:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {"throughput_rps": round(len(counted) / (window_end - window_start), 3),
            "mean_ms": round(sum(counted) / len(counted), 1) if counted else math.nan,
            "p50_ms": round(percentile(counted, 50), 1), "p95_ms": round(percentile(counted, 95), 1),
            "requests": len(records), "statuses": statuses}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _brief(m: dict) -> dict:
    return {**{k: v for k, v in m.items() if k not in ("workload", "arrivals_s", "paths", "canary_ms_windows",
                                                      "canary_torch_ms_windows")}, "transfer_rate": m["workload"]["transfer_rate"],
            "degraded": m["workload"]["degraded"]}


class Steal:
    """The share of the machine's CPU time its hypervisor gave to other guests over a span (Linux's
    `steal`): a neighbour's load the app and the profile cannot see, and the simulator cannot know."""

    def __init__(self):
        import psutil

        self._times = psutil.cpu_times
        self.start = self._times()

    def share(self) -> float | None:
        return steal_share(self.start, self._times())


def steal_share(start, end) -> float | None:
    """Stolen time over all the time between two `psutil.cpu_times()` readings (guest time is
    already inside user time, so it is not counted twice); None where the OS reports no steal."""
    if not hasattr(end, "steal"):
        return None
    total = sum(getattr(end, f) - getattr(start, f) for f in end._fields if f not in ("guest", "guest_nice"))
    return round((end.steal - start.steal) / total, 3) if total > 0 else None


CANARY_STEP_S = 2.0  # the machine's speed, as the simulator takes it over a load: a mean per 2 s


# The canary's units, by the keys a run records them under: "py" (a Python loop) and "torch" (the
# small model's prefill and decode steps).
_CANARY_KEY = {"py": "canary_ms", "torch": "canary_torch_ms"}
# How far the app's speed follows the canary's Python unit: over a load, the app's CPU per request
# against the profile's moves as the canary's slowdown to the power 0.73, not one for one (the log-log
# slope over 200 loads of saved runs, r = 0.69; `--fit-elasticity` fits it again). Each load is
# simulated at the canary's slowdown to this power. Out of sample no model of the VM's speed read
# beside the app makes the one-run bar reproducible (docs/capacity.md).
CANARY_ELASTICITY = 0.73


def machine_slower(profile_dict: dict, measured: dict, unit: str = "py") -> list[float] | None:
    """How much slower than while profiling the machine ran `unit` over a load, per CANARY_STEP_S;
    None for a run measured without that unit."""
    key = _CANARY_KEY[unit]
    ref, windows = profile_dict["source"].get(key), measured.get(f"{key}_windows")
    return slower(windows, ref) if ref and windows else None


def fit_elasticity(points: list[dict]) -> dict:
    """The least-squares slope of log(the app's CPU per request against the profile's) on log(the
    canary's slowdown) over saved loads (`sim_check.json` points): how far the app's speed follows the
    canary's; with its correlation and the number of loads."""
    used = [pt for pt in points if pt.get("machine_slower") and pt.get("cpu_vs_profile")]
    if len(used) < 3:
        raise ValueError(f"{len(used)} loads with a canary reading and a CPU figure: too few to fit")
    x = [math.log(pt["machine_slower"]) for pt in used]
    y = [math.log(pt["cpu_vs_profile"]) for pt in used]
    return {"elasticity": round(statistics.linear_regression(x, y).slope, 3),
            "r": round(statistics.correlation(x, y), 3), "loads": len(used)}


def mean_slower(profile_dict: dict, measured: dict, unit: str = "py") -> float | None:
    """The same over the whole load: its mean unit time over the profile's."""
    key = _CANARY_KEY[unit]
    ref, mean = profile_dict["source"].get(key), measured.get(key)
    return round(mean / ref, 3) if ref and mean else None


def within(measured: float, simulated: float, tolerance: float) -> tuple[float, bool]:
    err = simulated / measured - 1 if measured else float("nan")
    return round(err, 3), abs(err) <= tolerance


def lightest_closed(points: list[dict]) -> dict:
    return min((pt for pt in points if pt["kind"] == "closed"), key=lambda pt: pt["load"])


def simulation_inputs(profile_dict: dict, points: list[dict]) -> tuple[Profile, Workload]:
    """What a run's loads are simulated from: its profile, and the workload of its lightest closed loop."""
    profile = Profile.from_dict(profile_dict)
    stolen = profile_dict["source"].get("steal") or 0.0
    if stolen:  # its times are wall times: on cores the hypervisor gave that share to others, longer
        # than the work (each load's own steal is taken from its cores in compare, so none counts twice)
        profile = profile.scaled({k: 1 - stolen for k in ("router", "vision", "small", "large")})
    # The items' own workload — the paths and stage sizes of the lightest closed loop's answers, the
    # same items one at a time — for every load: which items transfer is a property of the items (the
    # profile's 60-item sample was off by 4-9 points), while the shedding an overloaded app does
    # (answers without the small model) is an outcome the simulator has to predict, not an input.
    return profile, Workload.from_measured(lightest_closed(points)["measured"]["workload"])


def compare(profile_dict: dict, points: list[dict], settings: dict, duration: float, host_cores: float,
            tolerance: float, model_unit: str = "py", elasticity: float = CANARY_ELASTICITY) -> list[dict]:
    """Each measured load simulated from the profile, with its errors; the points, annotated. The app
    runs at the canary Python unit's slowdown to the power `elasticity`, the model loops' work at the
    speed of the canary's `model_unit` where asked and measured (as it read: not fitted). The Python
    unit by default: the model unit's speed for the model loops meets the bar no more often."""
    profile, workload = simulation_inputs(profile_dict, points)
    print(f"workload of the profile's {profile.workload.get('requests', 0)} requests: "
          f"{Workload.from_measured(profile.workload).describe()}")
    replicas = {"Router": 1, "VisionEncoder": 1, "SmallReasoner": 1, "LargeAnswerer": 1}
    print(f"workload of the closed loop at {lightest_closed(points)['load']} (simulated for every load): "
          f"{workload.describe()}")
    rows = []
    for pt in points:
        kw = {"concurrency": pt["load"]} if pt["kind"] == "closed" else \
            {"arrivals": pt["measured"]["arrivals_s"], "paths": pt["measured"].get("paths")}
        # The same length of run as measured: near saturation the queue is still growing at 60 s,
        # so a longer simulated run reports the longer queue of a later moment.
        # The cores the app had during this load: what the hypervisor gave other guests was not
        # there to run on (a machine's measured capacity, like its core count; not the app's figures).
        # Of those, the app's threads share what Ray's own processes left (the profile's figure).
        # And how fast those cores ran, against their speed while profiling: the canary's unit time per 2 s.
        cores = host_cores * (1 - (pt["measured"].get("steal") or 0.0))
        slow = machine_slower(profile_dict, pt["measured"])
        if slow:
            slow = [x ** elasticity for x in slow]
        slow_model = machine_slower(profile_dict, pt["measured"], model_unit) if model_unit != "py" else None
        s = simulate(profile, workload, replicas, settings, duration_s=duration, host_cores=cores, slower=slow,
                     slower_step_s=CANARY_STEP_S, slower_model=slow_model, **kw)
        pt["host_cores"] = round(cores, 3)
        pt["app_cores"] = round(app_cores(cores, profile), 3)
        pt["machine_slower"] = mean_slower(profile_dict, pt["measured"]) if slow else None
        pt["machine_slower_torch"] = mean_slower(profile_dict, pt["measured"], "torch")  # applied or not
        pt["simulated"] = {k: s[k] for k in ("throughput_rps", "p50_ms", "p95_ms", "rejection_rate", "pools")}
        m = pt["measured"]
        if slow:  # beside it, the simulation as if the machine had run at the profile's speed throughout
            s0 = simulate(profile, workload, replicas, settings, duration_s=duration, host_cores=cores, **kw)
            pt["simulated_profile_speed"] = {k: s0[k] for k in ("throughput_rps", "p50_ms")}
            pt["profile_speed_errors"] = [within(m["throughput_rps"], s0["throughput_rps"], tolerance)[0],
                                          within(m["p50_ms"], s0["p50_ms"], tolerance)[0]]
        pt["throughput_error"], t_ok = within(m["throughput_rps"], s["throughput_rps"], tolerance)
        pt["p50_error"], p_ok = within(m["p50_ms"], s["p50_ms"], tolerance)
        pt["within"] = t_ok and p_ok
        # Beside the check, the load at the speed its own CPU says the machine ran it: its CPU per
        # answered request over what the simulation charges a request of it at the profile's speed.
        # An input taken from the load itself, so no prediction and not the bar: it tells a miss of the
        # model (queueing, batching, sharing) from a miss in the machine's speed (docs/capacity.md).
        charged = (s0 if slow else s).get("cpu_ms_per_request")
        if charged and m.get("cpu_ms_per_request"):
            given = m["cpu_ms_per_request"] / charged
            sg = simulate(profile, workload, replicas, settings, duration_s=duration, host_cores=cores,
                          slower=[given], **kw)
            pt["speed_given_cpu"] = round(given, 3)
            pt["simulated_given_cpu"] = {k: sg[k] for k in ("throughput_rps", "p50_ms")}
            pt["given_cpu_errors"] = [within(m["throughput_rps"], sg["throughput_rps"], tolerance)[0],
                                      within(m["p50_ms"], sg["p50_ms"], tolerance)[0]]
        # In flight: the clients for a closed loop; by Little's law for the open one.
        in_flight = pt["load"] if pt["kind"] == "closed" else m["throughput_rps"] * m["mean_ms"] / 1000
        expected = profile.cpu_ms_at(in_flight)
        pt["cpu_vs_profile"] = round(m["cpu_ms_per_request"] / expected, 2) if expected else None
        rows.append(pt)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'load':<16} {'xfer':>5} {'meas rps':>9} {'sim rps':>8} {'err':>7} {'meas p50':>9} {'sim p50':>8} {'err':>7}"
          f"  ok   cpu/req vs profile  steal  others  machine  (errs at profile speed)  [errs at its CPU's speed]")
    for pt in rows:
        m, s = pt["measured"], pt["simulated"]
        label = f"closed c={pt['load']}" if pt["kind"] == "closed" else f"open {m['offered_rps']:.1f}/s"
        print(f"{label:<16} {m['workload']['transfer_rate']:>5.0%} {m['throughput_rps']:>9.2f} {s['throughput_rps']:>8.2f} "
              f"{pt['throughput_error']:>+7.1%} {m['p50_ms']:>9.1f} {s['p50_ms']:>8.1f} {pt['p50_error']:>+7.1%}  "
              f"{'yes' if pt['within'] else 'NO ':<3}  {m['cpu_ms_per_request']:.0f} ms "
              f"({pt['cpu_vs_profile'] or float('nan'):.2f}x)  {_pct(m.get('steal')):>5}  "
              + (f"{m['others_cores']:.2f}" if m.get("others_cores") is not None else "   –")
              + (f"  {pt['machine_slower']:>6.2f}x" if pt.get("machine_slower") else "")
              + (f" (model {pt['machine_slower_torch']:.2f}x)" if pt.get("machine_slower_torch") else "")
              + (f"  ({pt['profile_speed_errors'][0]:+.1%}, {pt['profile_speed_errors'][1]:+.1%})"
                 if pt.get("profile_speed_errors") else "")
              + (f"  [at its CPU's {pt['speed_given_cpu']:.2f}x: {pt['given_cpu_errors'][0]:+.1%}, "
                 f"{pt['given_cpu_errors'][1]:+.1%}]" if pt.get("given_cpu_errors") else ""))


def summary_line(rows: list[dict], profile_dict: dict, tolerance: float, **extra) -> str:
    return json.dumps({"benchmark": "sim_check", **extra, "tolerance": tolerance,
                       "all_within": all(r["within"] for r in rows),
                       # not the bar (see compare): each load at the speed its own CPU says it ran at
                       "all_within_given_cpu": all(all(abs(e) <= tolerance for e in r["given_cpu_errors"])
                                                   for r in rows) if all(r.get("given_cpu_errors") for r in rows) else None,
                       "points": [{"kind": r["kind"], "load": r["load"],
                                   "offered_rps": r["measured"].get("offered_rps"),
                                   "transfer_rate": r["measured"]["workload"]["transfer_rate"],
                                   "degraded": r["measured"]["workload"]["degraded"],
                                   "measured_rps": r["measured"]["throughput_rps"],
                                   "simulated_rps": r["simulated"]["throughput_rps"],
                                   "measured_p50_ms": r["measured"]["p50_ms"], "simulated_p50_ms": r["simulated"]["p50_ms"],
                                   "turned_away": r["measured"].get("turned_away"),
                                   "cpu_vs_profile": r["cpu_vs_profile"], "steal": r["measured"].get("steal"),
                                   "others_cores": r["measured"].get("others_cores"), "app_cores": r.get("app_cores"),
                                   "machine_slower": r.get("machine_slower"),
                                   "machine_slower_torch": r.get("machine_slower_torch"),
                                   "profile_speed_errors": r.get("profile_speed_errors"),
                                   "speed_given_cpu": r.get("speed_given_cpu"),
                                   "given_cpu_errors": r.get("given_cpu_errors"),
                                   "within": r["within"]} for r in rows],
                       "profile_steal": profile_dict["source"].get("steal"),
                       "profile_canary_ms": profile_dict["source"].get("canary_ms"),
                       "profile_canary_torch_ms": profile_dict["source"].get("canary_torch_ms"),
                       "profile_others_cores": profile_dict.get("cpu_ms_per_request_busy", {}).get("others_cores")})


def run_settings(saved: dict) -> dict[str, PoolSettings]:
    """The pools' settings a saved run measured the app with (recorded in it), or today's serve
    config for a run that lacks them."""
    if "settings" in saved:
        return {name: PoolSettings(**d) for name, d in saved["settings"].items()}
    return settings_from_config(ROOT / "serve_config.yaml")


def resimulate(run_dir: Path, duration: float, tolerance: float, others_cores: float | None = None,
               model_unit: str = "py", elasticity: float = CANARY_ELASTICITY) -> int:
    """A saved run's measured loads simulated again from its saved profile, by this code: a change to
    the model is judged on the runs already measured, the app's figures fixed. `others_cores`: for a
    profile measured before it recorded what Ray's own processes kept busy, a figure to assume."""
    profile_dict = json.loads((run_dir / "profile.json").read_text())
    busy = profile_dict.get("cpu_ms_per_request_busy")
    assumed = others_cores is not None and busy is not None and "others_cores" not in busy
    if assumed:
        busy["others_cores"] = others_cores
        print(f"assumed: the machine's other processes kept {others_cores} cores busy (not in this profile)")
    saved = json.loads((run_dir / "sim_check.json").read_text())
    points = [{k: pt[k] for k in ("kind", "load", "measured")} for pt in saved["points"]]
    rows = compare(profile_dict, points, run_settings(saved), duration, saved["host_cores"], tolerance, model_unit,
                   elasticity)
    print_table(rows)
    print(summary_line(rows, profile_dict, tolerance, resimulated=str(run_dir), model_unit=model_unit,
                       canary_elasticity=elasticity,
                       **({"assumed_others_cores": others_cores} if assumed else {})))
    return 0


def _cpu_reader(processes, canary, steal):
    """A function that runs one load and adds what the machine did meanwhile: every process's CPU per
    answered request (beside the profile's figure for as many in flight, it says whether the machine
    ran the load at the profile's speed), the canary's readings, the hypervisor's steal and the cores
    Ray's own processes kept busy."""
    import psutil

    def with_cpu(load_coro) -> dict:
        # One reading of the machine's CPU times at each end gives both its steal and its busy time.
        before, machine, began = cpu_seconds(processes), psutil.cpu_times(), time.monotonic()
        m = asyncio.run(load_coro)
        after, machine_after, ended = cpu_seconds(processes), psutil.cpu_times(), time.monotonic()
        m["canary_ms"] = canary.mean_ms(began, ended)
        m["canary_ms_windows"] = canary.window_means(began, ended, CANARY_STEP_S)
        m["canary_torch_ms"] = canary.mean_ms(began, ended, "torch")
        m["canary_torch_ms_windows"] = canary.window_means(began, ended, CANARY_STEP_S, "torch")
        m["steal"] = steal_share(machine, machine_after)
        m["others_cores"] = others_cores(machine_busy_s(machine), machine_busy_s(machine_after), before, after,
                                         ended - began)
        m["cpu_ms_per_request"] = round(sum(after[k] - before[k] for k in before) / max(1, m["answered"]) * 1000, 1)
        # By process too (client, proxy, controller, each deployment): which grows with a load's shape.
        m["cpu_ms_by_process"] = ms_per_request(before, after, max(1, m["answered"]))
        return m
    return with_cpu


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["cpu", "paced"], default="cpu",
                   help="cpu: the trained pair on this machine's CPU (the default); paced: the app on the paced "
                        "engine, a profile's times as waits (capacity/paced_check.py, its own options)")
    p.add_argument("--quick", action="store_true", help="shorter loads and the quick profile grid")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--duration-s", type=float, default=60.0, help="per load point")
    p.add_argument("--open-fraction", type=float, default=0.9,
                   help="open-loop rate as a share of the throughput measured at the highest concurrency")
    p.add_argument("--host-cores", type=float, default=os.cpu_count())
    p.add_argument("--tolerance", type=float, default=0.25)
    p.add_argument("--out", default=str(ROOT / "results"))
    p.add_argument("--resimulate", metavar="DIR", type=Path,
                   help="no app: simulate a saved run's loads (DIR: results/sim-check-*) again with this code")
    p.add_argument("--others-cores", type=float,
                   help="with --resimulate, for a profile without it: the cores Ray's own processes kept busy")
    p.add_argument("--model-unit", choices=sorted(_CANARY_KEY), default="py",
                   help="with --resimulate: the canary unit whose speed the model loops' work takes (where measured)")
    p.add_argument("--canary-elasticity", type=float, default=CANARY_ELASTICITY,
                   help="the power of the canary's slowdown the app runs at (1: one for one)")
    p.add_argument("--fit-elasticity", metavar="DIR", type=Path, nargs="+",
                   help="no app: fit the canary's elasticity over saved runs' loads (DIRs: results/sim-check-*)")
    return p


def main(argv=None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--engine" in argv:  # the app on the paced engine: capacity/paced_check.py, its own options
        i = argv.index("--engine")
        engine = argv[i + 1] if i + 1 < len(argv) else ""
        if engine not in ("paced", "cpu"):
            raise SystemExit(f"--engine: paced or cpu, not {engine!r}")
        del argv[i:i + 2]
        if engine == "paced":
            from capacity.paced_check import main as paced_main
            return paced_main(argv)
    args = build_parser().parse_args(argv)
    if args.fit_elasticity:
        points = [pt for d in args.fit_elasticity for pt in json.loads((d / "sim_check.json").read_text())["points"]]
        print(json.dumps({"benchmark": "sim_check", "fit_elasticity": fit_elasticity(points),
                          "runs": len(args.fit_elasticity)}))
        return 0
    if args.resimulate:
        return resimulate(args.resimulate, 20.0 if args.quick else args.duration_s, args.tolerance, args.others_cores,
                          args.model_unit, args.canary_elasticity)
    return check_live(args)


def check_live(args) -> int:
    """Profile the local app, run each load against it with the canary beside it, and compare."""
    from capacity.stage_profile import FULL, QUICK, build_profile, print_profile
    from tandem.cli import read_tandem_args
    from tandem.config import load_tandem_config

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)  # as a replica has it (Ray: one thread for a num_cpus <= 1 actor)
    config_path = ROOT / "serve_config.yaml"
    config = load_tandem_config(read_tandem_args(str(config_path)))
    settings = settings_from_config(config_path)
    duration = 20.0 if args.quick else args.duration_s
    items = bodies(400, seed=11)
    points = []
    with LocalApps() as app, Canary(checkpoint=str(ROOT / "tandem" / "trained" / "small")) as canary:
        print(f"sim_check: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; app {app.url}")
        steal, profiling = Steal(), time.monotonic()
        profile_dict = build_profile(config, QUICK if args.quick else FULL, url=app.url,
                                     app_requests=20 if args.quick else 60,
                                     busy_requests=20 if args.quick else 200,
                                     vision_wait_s=settings["VisionEncoder"].batch_wait_s)
        profile_dict["source"]["steal"] = steal.share()
        profiled = time.monotonic()
        profile_dict["source"]["canary_ms"] = canary.mean_ms(profiling, profiled)
        profile_dict["source"]["canary_torch_ms"] = canary.mean_ms(profiling, profiled, "torch")
        print_profile(profile_dict)
        print(f"CPU time stolen by the hypervisor while profiling: {profile_dict['source']['steal']}; "
              f"the canary's units took {profile_dict['source']['canary_ms']} ms (Python), "
              f"{profile_dict['source']['canary_torch_ms']} ms (model)")
        with_cpu = _cpu_reader(app_processes(), canary, steal)

        loads = [("closed", int(c)) for c in args.concurrency.split(",")]
        for kind, load in loads:
            m = with_cpu(closed_loop(app.url, items, load, duration))
            points.append({"kind": kind, "load": load, "measured": m})
            print(f"measured closed c={load}: {_brief(m)}", flush=True)
        rate = round(args.open_fraction * points[-1]["measured"]["throughput_rps"], 2)
        m = with_cpu(open_loop(app.url, items, rate, duration, seed=3))
        points.append({"kind": "open", "load": rate, "measured": m})
        print(f"measured open {rate} req/s: {_brief(m)}", flush=True)

    rows = compare(profile_dict, points, settings, duration, args.host_cores, args.tolerance,
                   elasticity=args.canary_elasticity)
    print_table(rows)
    out = Path(args.out) / f"sim-check-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(profile_dict, indent=1))
    (out / "sim_check.json").write_text(json.dumps({"points": rows, "host_cores": args.host_cores,
                                                    "canary_elasticity": args.canary_elasticity,
                                                    "settings": {n: dataclasses.asdict(s) for n, s in settings.items()}},
                                                   indent=1))
    print(f"results: {out}")
    print(summary_line(rows, profile_dict, args.tolerance, canary_elasticity=args.canary_elasticity))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
