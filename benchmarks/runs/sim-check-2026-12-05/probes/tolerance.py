"""How well the machine's speed must be known for a saved run's open loop to come out within the bar:
the open loop re-simulated at multiples 0.80-1.20 of the speed its own CPU says it ran at (sim_check's
`speed_given_cpu`), each multiple marked `#` where its throughput and p50 are both within ±25 %.

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/tolerance.py 44 115
"""
import contextlib
import io
import json
import statistics
import sys

import benchmarks.sim_check as sc
from benchmarks.simulate import simulate
from speeds import runs  # this folder, on the path as the script's own
MULTIPLES = [round(0.80 + 0.02 * i, 2) for i in range(21)]


def main(lo: int, hi: int) -> None:
    widths = []
    for run in runs(lo, hi):
        profile_dict, saved = (json.loads((run / f).read_text()) for f in ("profile.json", "sim_check.json"))
        profile, workload = sc.simulation_inputs(profile_dict, saved["points"])
        m = next(p for p in saved["points"] if p["kind"] == "open")["measured"]
        cores = saved["host_cores"] * (1 - (m.get("steal") or 0.0))

        def at(speed: float | None) -> dict:
            with contextlib.redirect_stdout(io.StringIO()):
                return simulate(profile, workload, {}, sc.run_settings(saved), duration_s=60.0, host_cores=cores,
                                arrivals=m["arrivals_s"], slower=[speed] if speed else None,
                                slower_step_s=sc.CANARY_STEP_S)
        speed = m["cpu_ms_per_request"] / at(None)["cpu_ms_per_request"]
        inside = []
        for k in MULTIPLES:
            s = at(speed * k)
            if abs(s["throughput_rps"] / m["throughput_rps"] - 1) <= 0.25 and abs(s["p50_ms"] / m["p50_ms"] - 1) <= 0.25:
                inside.append(k)
        if inside:
            widths.append(round(max(inside) - min(inside), 2))
        print(f"{run.name:<7} speed {speed:.3f}  " + "".join("#" if k in inside else "." for k in MULTIPLES)
              + (f"  {min(inside):.2f}-{max(inside):.2f}" if inside else "  none"), flush=True)
    print(f"\nruns with a window: {len(widths)}; its width (multiples of the speed): median "
          f"{statistics.median(widths):.2f}, range {min(widths):.2f}-{max(widths):.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
