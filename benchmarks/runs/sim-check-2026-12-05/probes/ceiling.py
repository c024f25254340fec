"""How often any reading of the machine's speed taken beside the app could bring a saved run's open loop
within the bar: each load's speed as its own CPU says it ran (sim_check's `speed_given_cpu`) set
against the canary's two units, the residual per kind of load, and the open loop's window of speeds
that are within (tolerance.out, from tolerance.py) hit by predictors fitted on runs 44-93 and by an
ideal one: unbiased for the open loop, with the model unit's scatter there.

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/ceiling.py 44 115   # ceiling.out
"""
import math
import re
import statistics
import sys
from pathlib import Path

import benchmarks.sim_check as sc
from speeds import resimulated, runs  # this folder, on the path as the script's own

HERE = Path(__file__).resolve().parent
FITTED_ON = (44, 93)
SLACK = 0.01  # tolerance.py steps the speed by 0.02: a window's edges are known to half a step


def loads(lo: int, hi: int) -> list[dict]:
    """Every load of runs lo-hi as the check re-simulates it: the speed its CPU says, the canary's units."""
    return [{"run": int(run.name[3:]), "kind": "open" if r["kind"] == "open" else f"c={r['load']}",
             "g": r["speed_given_cpu"], "py": r["machine_slower"], "torch": r["machine_slower_torch"],
             "given_ok": [abs(e) <= 0.25 for e in r["given_cpu_errors"]]}
            for run in runs(lo, hi) for r in resimulated(run, f"py:{sc.CANARY_ELASTICITY}")]


def windows() -> dict[int, tuple[float, float]]:
    """Each run's open loop: the speeds (absolute, not multiples) within the bar."""
    out = {}
    for line in (HERE / "tolerance.out").read_text().splitlines():
        m = re.match(r"run(\d+)\s+speed ([\d.]+)\s+\S+\s+([\d.]+)-([\d.]+)", line)
        if m:
            g, a, b = map(float, m.group(2, 3, 4))
            out[int(m.group(1))] = (g * (a - SLACK), g * (b + SLACK))
    return out


def phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def main(lo: int, hi: int) -> None:
    rows = [r for r in loads(lo, hi) if r["g"]]
    spans = (FITTED_ON, (FITTED_ON[1] + 1, hi))
    fits = {}
    print("log(speed its CPU says) against log(the unit's slowdown), fitted on runs %d-%d over every load;" % FITTED_ON)
    print("the residual's mean and sd per kind of load:")
    for unit in ("py", "torch"):
        fit_rows = [r for r in rows if r[unit] and FITTED_ON[0] <= r["run"] <= FITTED_ON[1]]
        f = statistics.linear_regression([math.log(r[unit]) for r in fit_rows], [math.log(r["g"]) for r in fit_rows])
        fits[unit] = f
        print(f"  {unit:<5} slope {f.slope:.2f}, intercept {f.intercept:+.3f}")
        for kind in ("c=1", "c=4", "c=16", "open"):
            cells = []
            for a, b in spans:
                res = [math.log(r["g"]) - f.intercept - f.slope * math.log(r[unit])
                       for r in rows if r["kind"] == kind and r[unit] and a <= r["run"] <= b]
                cells.append(f"runs {a}-{b}: {statistics.mean(res):+.3f} sd {statistics.pstdev(res):.3f} (n {len(res)})")
            print(f"    {kind:<5} " + "   ".join(cells))

    win = windows()
    opens = {r["run"]: r for r in rows if r["kind"] == "open" and r["run"] in win}

    def hits(predict, a, b) -> str:
        got = [(win[n][0] <= p <= win[n][1]) for n, r in opens.items() if a <= n <= b and (p := predict(r))]
        return f"{sum(got)}/{len(got)}"

    fu, ft = fits["py"], fits["torch"]
    fit_open = [math.log(r["g"]) - ft.intercept - ft.slope * math.log(r["torch"])
                for n, r in opens.items() if r["torch"] and FITTED_ON[0] <= n <= FITTED_ON[1]]
    bias = statistics.mean(fit_open)
    predictors = {
        "shipped: Python unit ^0.73": lambda r: r["py"] ** sc.CANARY_ELASTICITY if r["py"] else 1.0,
        "Python unit, fitted": lambda r: math.exp(fu.intercept) * r["py"] ** fu.slope if r["py"] else None,
        "model unit, fitted": lambda r: math.exp(ft.intercept) * r["torch"] ** ft.slope if r["torch"] else None,
        f"model unit, fitted, open loop's offset {bias:+.3f}":
            lambda r: math.exp(ft.intercept + bias) * r["torch"] ** ft.slope if r["torch"] else None,
    }
    print("\nthe open loop's window of speeds within the bar, hit by a load-mean prediction:")
    for name, p in predictors.items():
        print(f"  {name:<48} " + "   ".join(f"runs {a}-{b}: {hits(p, a, b):>6}" for a, b in spans))
    # An ideal reading: centred on the speed the CPU says, with the model unit's scatter over open loops.
    sd = statistics.pstdev(fit_open)
    # The rest of the bar at each load's own CPU's speed: the closed loops' figures and the open loop's
    # throughput (which holds over the whole window of tolerance.py's speeds where its p50 does).
    rest = {n: all(all(r["given_ok"]) for r in rows if r["run"] == n and r["kind"] != "open")
            and r_open["given_ok"][0] for n, r_open in opens.items()}
    print(f"\nan unbiased reading with log sd s, its chance to land in each run's window, summed over runs {lo}-{hi};"
          f"\nand the whole bar's (the chance where the other seven figures are within at the CPU's speed, {sum(rest.values())} runs):")
    for s in (0.02, 0.04, sd, 0.08, 0.10):
        share = {n: phi(math.log(win[n][1] / r["g"]) / s) - phi(math.log(win[n][0] / r["g"]) / s) for n, r in opens.items()}
        print(f"  s {s:.3f}{' (the model unit over the open loops)' if s == sd else '':<38}: open loop {sum(share.values()):.1f}"
              f" of {len(share)}, whole bar {sum(v for n, v in share.items() if rest[n]):.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
