"""Per saved run (as it ran, no re-simulation): at concurrency 16 and in the open loop, the share of
the app's cores its processes used (CPU per answered request x throughput), the load's CPU per
request over the profile's for as many in flight, a work-conserving bound on throughput — the app's
cores over the profile's CPU per request, at the canary's speed (`bound`) and at the profile's
(`bound0`) — against the measured throughput, and the simulator's saved errors (`sim`, `sim0`).

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-04/probes/bound.py
"""
import json, sys, glob
from benchmarks.simulate import Profile, app_cores
for run in sorted(glob.glob("benchmarks/runs/sim-check-2026-12-0*/run*")):
    try:
        pd = json.load(open(run + "/profile.json")); saved = json.load(open(run + "/sim_check.json"))
    except FileNotFoundError:
        continue
    prof = Profile.from_dict(pd)
    out = []
    for pt in saved["points"]:
        m = pt["measured"]
        if "cpu_ms_per_request" not in m: continue
        cores = saved["host_cores"] * (1 - (m.get("steal") or 0)); ac = app_cores(cores, prof)
        used = m["throughput_rps"] * m["cpu_ms_per_request"] / 1000
        infl = pt["load"] if pt["kind"] == "closed" else m["throughput_rps"] * m["mean_ms"] / 1000
        cpu = prof.cpu_ms_at(infl); ms = pt.get("machine_slower") or 1
        bound = ac / (cpu / 1000) / ms
        bound0 = ac / (cpu / 1000)
        out.append(f"{pt['kind'][0]}{pt['load']:<5}: util {used/ac:.2f} cpu/prof {m['cpu_ms_per_request']/cpu:.2f} bound {bound/m['throughput_rps']-1:+.0%} bound0 {bound0/m['throughput_rps']-1:+.0%} sim {pt['throughput_error']:+.0%} sim0 {format(pt['profile_speed_errors'][0], '+.0%') if pt.get('profile_speed_errors') else '-'} mach {ms:.2f}")
    print(run.split('/')[-1], " | ".join(out[2:]))
