"""Where the local app's CPU goes: CPU time per request of every process it runs, at concurrency 1.

    python -m capacity.cpu_per_request [--n 95]

Starts serve_config.yaml's app, sends `tandem:mutual` on held-out grid items one at a time (after 5 of
warm-up), and reads each process's user + system CPU time (psutil) before and after: the Router, the
three model deployments, Serve's proxy and controller, and this client. On a machine whose cores the
replicas share, the sum bounds the app's throughput (cores x 1000 / sum ms, before batching shares
the decode steps); set beside a stage profile, it shows how much of each replica's CPU is not its
model's work. Prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

PROCESSES = ("Router", "VisionEncoder", "SmallReasoner", "LargeAnswerer")


def app_processes(app: str = "tandem") -> dict:
    import psutil

    found = {"client": psutil.Process()}
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        for name in PROCESSES:
            if f"ServeReplica:{app}:{name}" in cmd:
                found[name] = p
        if "ProxyActor" in cmd:
            found["proxy"] = p
        if "ServeController" in cmd:
            found["controller"] = p
    return found


def cpu_seconds(processes: dict) -> dict[str, float]:
    return {k: sum(p.cpu_times()[:2]) for k, p in processes.items()}


def machine_busy_s(t=None) -> float:
    """Every core's busy CPU seconds since boot, all processes together (not idle, waiting on I/O or
    stolen; guest time is inside user time), from `t` (a `psutil.cpu_times()` reading) or now."""
    import psutil

    t = t or psutil.cpu_times()
    return sum(getattr(t, f) for f in t._fields if f not in ("idle", "iowait", "steal", "guest", "guest_nice"))


def others_cores(machine_before: float, machine_after: float, app_before: dict[str, float],
                 app_after: dict[str, float], wall_s: float) -> float:
    """The cores the machine's other processes kept busy between two readings: its busy CPU less
    the app's processes' (on a local Ray cluster: the raylet, the GCS, the dashboard and its agents)."""
    app = sum(app_after[k] - app_before[k] for k in app_before)
    return round(max(0.0, (machine_after - machine_before - app) / wall_s), 3) if wall_s > 0 else 0.0


def ms_per_request(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """Each process's CPU ms per request between two `cpu_seconds` readings over n requests."""
    return {k: round((after[k] - before[k]) / n * 1000, 2) for k in before}


def main(argv=None) -> int:
    import httpx

    from benchmarks.client import LocalApps, item_body
    from tasks.grid import grid_items

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=95, help="measured requests (after 5 of warm-up)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bodies = [item_body(item) for item in grid_items(args.n + 5, seed=21)]
    with LocalApps() as app, httpx.Client(timeout=60) as http:
        processes = app_processes()
        for body in bodies[:5]:
            http.post(f"{app.url}/v1/chat/completions", json=body)
        before, start = cpu_seconds(processes), time.perf_counter()
        paths = [http.post(f"{app.url}/v1/chat/completions", json=b).json()["tandem"]["path"] for b in bodies[5:]]
        after, wall = cpu_seconds(processes), time.perf_counter() - start
    per = ms_per_request(before, after, len(paths))
    total = round(sum(per.values()), 1)
    print(f"{len(paths)} requests, {wall / len(paths) * 1000:.1f} ms each, "
          f"{paths.count('transfer') / len(paths):.0%} transferred; CPU ms per request:")
    for name, ms in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<14} {ms:>7.2f}")
    print(f"  {'sum':<14} {total:>7.1f}  (bound on {os.cpu_count()} cores: {os.cpu_count() * 1000 / total:.1f} req/s)")
    print(json.dumps({"benchmark": "cpu_per_request", "requests": len(paths),
                      "wall_ms_per_request": round(wall / len(paths) * 1000, 1),
                      "transfer_rate": round(paths.count("transfer") / len(paths), 3),
                      "cpu_ms_per_request": per, "sum_ms": total}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
