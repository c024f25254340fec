"""Shared by the capacity tests: a small stage profile with known arithmetic, pool settings, a saved
sim_check run, and a way to run work on a simulation's shared cores."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from capacity.profile import PROFILE_KIND, PoolSettings, Profile, Workload


def profile(**kw) -> Profile:
    return Profile.from_dict(profile_dict(**kw))


def profile_dict(*, router=1.0, vision=(4.0, 12.0), prefill=(5.0, 5.0), step=(2.0, 4.0), large_factor=2.0) -> dict:
    """Vision: vision[0] ms for 1 image, vision[1] for 8. Prefill: flat. Step: step[0] ms at 1 row,
    step[1] at 8. The large model is `large_factor` times slower."""
    def gen(f):
        return {"prefill": [{"batch": 1, "prompt_tokens": 10, "ms": prefill[0] * f},
                            {"batch": 8, "prompt_tokens": 10, "ms": prefill[1] * f}],
                "step": [{"batch": 1, "ms": step[0] * f}, {"batch": 8, "ms": step[1] * f}]}
    return {"kind": PROFILE_KIND, "router": {"ms": router},
            "vision": {r: [{"images": 1, "ms": vision[0]}, {"images": 8, "ms": vision[1]}] for r in ("small", "large")},
            "generators": {"small": gen(1.0), "large": gen(large_factor)}}


def settings(**over) -> dict[str, PoolSettings]:
    base = dict(max_ongoing=64, max_queued=-1, max_batch_size=8, batch_wait_s=0.0)
    base.update(over)
    return {name: PoolSettings(**base, gpus_per_replica=0.0 if name == "Router" else 1.0)
            for name in ("Router", "VisionEncoder", "SmallReasoner", "LargeAnswerer")}


AGREE = {"small_direct": {"prompt_tokens": 10, "decode_steps": 3}, "large_direct": {"prompt_tokens": 10, "decode_steps": 3},
         "small_reasoning": {"prompt_tokens": 10, "decode_steps": 20}, "large_transfer": {"prompt_tokens": 10, "decode_steps": 3}}


def saved_run(load: int) -> tuple[dict, dict]:
    """A sim_check run's profile and its measured point at `load` (a closed loop of 1 or 16), as the
    check's `compare` takes them: a real run on the local CPU app, kept as a fixture."""
    saved = json.loads((Path(__file__).parent / "fixtures" / "sim_check_run.json").read_text())
    point = next(pt for pt in saved["points"] if pt["load"] == load)
    return copy.deepcopy(saved["profile"]), copy.deepcopy(point)


def shared(host_cores: float = 2, **kw):
    """A simulation of the test profile on shared cores (one replica a pool: six event loops)."""
    from capacity.simulate import Simulation

    return Simulation(profile(), Workload.mutual(0.0, AGREE), {}, settings(), host_cores=host_cores, **kw)


def run_on_cores(sim, starts: list[tuple[float, float, str]], until: float = 60.0) -> list[float]:
    """Each (start s, work s, class) run on the simulation's cores; the times each ended."""
    ends = [None] * len(starts)

    def at(i, start, work, cls):
        yield sim.env.timeout(start)
        sim.cores.run(work, cls, lambda: ends.__setitem__(i, sim.env.now))
    for i, (start, work, cls) in enumerate(starts):
        sim.env.process(at(i, start, work, cls))
    sim.env.run(until=until)
    return ends


def saved_run_settings() -> dict[str, PoolSettings]:
    """serve_config.yaml's pool settings as the saved run's app had them: every idle replica waited its
    whole batch window (`batch_wait_mode: always`)."""
    from capacity.profile import ROOT, settings_from_config

    out = settings_from_config(ROOT / "serve_config.yaml")
    for s in out.values():
        s.batch_wait_mode = "always"
    return out
