"""Saved sim_check runs re-simulated under several models of the machine's speed over a load, by the
code on PYTHONPATH: how many runs meet the whole bar (8 of 8 within ±25 %) and how many figures.

A model is `py:E` (everything at the canary's Python unit's slowdown to the power E: sim_check's
`--canary-elasticity E`; E = 0 is the profile's speed), `torch:E` (the same, and the model loops at
the canary's model unit's slowdown as read: `--model-unit torch`), or `app-cpu`: each load at its own
measured CPU per request against the profile's (`cpu_vs_profile`) — an input taken from the load
itself, so not a prediction, only a bound on what a perfect reading of that kind would give.

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/speeds.py 44 109 py:0 py:0.5 py:0.73 py:1 torch:0.73 torch:1 app-cpu
"""
import contextlib
import io
import json
import sys
from pathlib import Path

import benchmarks.sim_check as sc

RUNS = Path(__file__).resolve().parents[2]
FITTED_ON = (44, 93)  # the elasticity (0.73) was fitted on these runs' CPU; the later ones ran after


def figures(rows: list[dict]) -> int:
    return sum(abs(r["throughput_error"]) <= 0.25 for r in rows) + sum(abs(r["p50_error"]) <= 0.25 for r in rows)


def resimulated(run: Path, model: str) -> list[dict]:
    profile, saved = (json.loads((run / f).read_text()) for f in ("profile.json", "sim_check.json"))
    points = [{k: pt[k] for k in ("kind", "load", "measured")} for pt in saved["points"]]
    unit, _, e = model.partition(":")
    patched = sc.machine_slower
    if model == "app-cpu":
        ratio = {id(p["measured"]): s["cpu_vs_profile"] for p, s in zip(points, saved["points"])}
        sc.machine_slower = lambda profile_dict, measured, unit="py": [ratio[id(measured)]]
        unit, e = "py", "1"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return sc.compare(profile, points, sc.run_settings(saved), 60.0, saved["host_cores"], 0.25, unit, float(e))
    finally:
        sc.machine_slower = patched


def main(lo: int, hi: int, models: list[str]) -> None:
    runs = sorted((d for d in RUNS.glob("sim-check-*/run*") if lo <= int(d.name[3:]) <= hi),
                  key=lambda d: int(d.name[3:]))
    got = {m: {} for m in models}
    for run in runs:
        for m in models:
            got[m][int(run.name[3:])] = figures(resimulated(run, m))
        print(run.name, {m: got[m][int(run.name[3:])] for m in models}, flush=True)
    splits = (FITTED_ON, (FITTED_ON[1] + 1, hi), (lo, hi))
    print(f"\n{'model':<11}" + "".join(f"{f'runs {a}-{b}':>22}" for a, b in splits))
    for m in models:
        cells = []
        for a, b in splits:
            f = [v for n, v in got[m].items() if a <= n <= b]
            cells.append(f"{sum(x == 8 for x in f)}/{len(f)} ({sum(f)}/{8 * len(f)})")
        print(f"{m:<11}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
