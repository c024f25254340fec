"""Saved sim_check runs re-simulated under several models of the machine's speed over a load, by the
code on PYTHONPATH: how many runs meet the whole bar (8 of 8 within ±25 %) and how many figures.

A model is `py:E` (everything at the canary's Python unit's slowdown to the power E: sim_check's
`--canary-elasticity E`; E = 0 is the profile's speed), `torch:E` (the same, and the model loops at
the canary's model unit's slowdown as read: `--model-unit torch`), `app-cpu`: each load at its own
measured CPU per request against the profile's for as many in flight (`cpu_vs_profile`), or `sim-cpu`:
each load at its own measured CPU per request against what the simulation charges a request of that
load at the profile's speed (sim_check's `speed_given_cpu`, session 41). The last two take an input
from the load itself, so they are no prediction, only bounds on what a perfect reading of the speed
would give; `app-cpu` is the looser (session 40's): its denominator does not know how the load batched.
A model `fit:UNIT:A:B[:const]` runs all the app's CPU work at exp(A) x (that canary unit's slowdown)^B,
per 2 s window, or (`const`) at the load's mean slowdown throughout, where the unit read none at
exp(A): a predictor fitted on runs 44-93 against the speed each load's own CPU says it ran at (the
fits `sim-cpu` prints).

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/speeds.py 44 109 py:0 py:0.5 py:0.73 py:1 torch:0.73 torch:1 app-cpu
    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/speeds.py 44 115 py:0.73 app-cpu sim-cpu   # speeds-given-cpu.out
    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/speeds.py 94 115 py:0.73 fit:torch:-0.081:0.88 fit:torch:-0.081:0.88:const   # predicted-94-115.out
    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/speeds.py 44 93 py:0.73 fit:torch:-0.081:0.88   # predicted-44-93.out
"""
import contextlib
import io
import json
import math
import statistics
import sys
from pathlib import Path

import benchmarks.sim_check as sc

RUNS = Path(__file__).resolve().parents[2]
FITTED_ON = (44, 93)  # the elasticity (0.73) was fitted on these runs' CPU; the later ones ran after


def figures(rows: list[dict], given_cpu: bool = False) -> int:
    errors = [r["given_cpu_errors"] if given_cpu else (r["throughput_error"], r["p50_error"]) for r in rows]
    return sum(abs(e) <= 0.25 for pair in errors for e in pair)


def resimulated(run: Path, model: str) -> list[dict]:
    profile, saved = (json.loads((run / f).read_text()) for f in ("profile.json", "sim_check.json"))
    points = [{k: pt[k] for k in ("kind", "load", "measured")} for pt in saved["points"]]
    patched = sc.machine_slower
    if model == "sim-cpu":  # the column beside the check
        unit, e = "py", "0.73"
    elif model == "app-cpu":
        ratio = {id(p["measured"]): s["cpu_vs_profile"] for p, s in zip(points, saved["points"])}
        sc.machine_slower = lambda profile_dict, measured, unit="py": [ratio[id(measured)]]
        unit, e = "py", "1"
    elif model.startswith("fit:"):
        _, fit_unit, a, b, *const = model.split(":")

        def predicted(profile_dict, measured, unit="py"):
            w = patched(profile_dict, measured, fit_unit)
            if w and const:
                w = [sum(w) / len(w)]
            return [math.exp(float(a)) * x ** float(b) for x in w] if w else [math.exp(float(a))]
        sc.machine_slower = predicted
        unit, e = "py", "1"
    else:
        unit, _, e = model.partition(":")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return sc.compare(profile, points, sc.run_settings(saved), 60.0, saved["host_cores"], 0.25, unit, float(e))
    finally:
        sc.machine_slower = patched


def runs(lo: int, hi: int) -> list[Path]:
    """The saved runs numbered lo to hi, in order."""
    return sorted((d for d in RUNS.glob("sim-check-*/run*") if lo <= int(d.name[3:]) <= hi),
                  key=lambda d: int(d.name[3:]))


def main(lo: int, hi: int, models: list[str]) -> None:
    got, given_rows = {m: {} for m in models}, []
    for run in runs(lo, hi):
        for m in models:
            rows = resimulated(run, m)
            got[m][int(run.name[3:])] = figures(rows, given_cpu=m == "sim-cpu")
            if m == "sim-cpu":
                given_rows += [dict(r, run=int(run.name[3:])) for r in rows]
        print(run.name, {m: got[m][int(run.name[3:])] for m in models}, flush=True)
    splits = (FITTED_ON, (FITTED_ON[1] + 1, hi), (lo, hi))
    width = max(11, *map(len, models))
    print(f"\n{'model':<{width}}" + "".join(f"{f'runs {a}-{b}':>22}" for a, b in splits))
    for m in models:
        cells = []
        for a, b in splits:
            f = [v for n, v in got[m].items() if a <= n <= b]
            cells.append(f"{sum(x == 8 for x in f)}/{len(f)} ({sum(f)}/{8 * len(f)})")
        print(f"{m:<{width}}" + "".join(f"{c:>22}" for c in cells))
    if given_rows:
        given_cpu_report(given_rows, splits)


def given_cpu_report(rows: list[dict], splits) -> None:
    """At the speed each load's own CPU says it ran: which figures still miss, and how well the
    canary's two units, read beside the app, predict that speed (least squares on the logarithms)."""
    print("\nat its CPU's speed, the figures outside ±25 %:")
    for kind, load in sorted({(r["kind"], r["load"] if r["kind"] == "closed" else 0) for r in rows}):
        these = [r for r in rows if r["kind"] == kind and (kind == "open" or r["load"] == load)]
        for i, what in enumerate(("throughput", "p50")):
            errs = [r["given_cpu_errors"][i] for r in these]
            out = [e for e in errs if abs(e) > 0.25]
            print(f"  {kind} {load or '':<3} {what:<10} {len(out):>2} of {len(errs)}"
                  f"  (median error {statistics.median(errs):+.1%}; of the misses {sum(e > 0 for e in out)} high)")
    print("\nthe speed its CPU says (speed_given_cpu) against the canary's reading, log-log:")
    for unit, key in (("Python unit", "machine_slower"), ("model unit", "machine_slower_torch")):
        for a, b in splits:
            used = [r for r in rows if a <= r["run"] <= b and r.get(key) and r.get("speed_given_cpu")]
            x = [math.log(r[key]) for r in used]
            y = [math.log(r["speed_given_cpu"]) for r in used]
            fit = statistics.linear_regression(x, y)
            resid = statistics.pstdev(yi - fit.intercept - fit.slope * xi for xi, yi in zip(x, y))
            print(f"  {unit:<12} runs {a}-{b}: {len(used)} loads, slope {fit.slope:.2f}, intercept {fit.intercept:+.3f},"
                  f" r {statistics.correlation(x, y):.2f}; spread of the speed {statistics.pstdev(y):.3f},"
                  f" left over {resid:.3f} (logs)")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
