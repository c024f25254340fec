"""The paced check's own arithmetic: the hops' per-call costs from the zero-time copies, the zero
profile, and the figures its JSON line carries."""

from __future__ import annotations

import pytest

from capacity.paced_check import PACED_PROFILE, figures, hop_costs, print_stages, zero_profile
from capacity.profile import ROOT, Profile, Workload, settings_from_config
from capacity.simulate import simulate


def test_hop_costs_split_a_transferring_requests_extra_calls_from_an_agreeing_ones():
    # agree: router 1 + encode e + generate g = 20; transfer: + 2 g = 32 -> g = 6, e = 13
    assert hop_costs(20.0, 32.0, 1.0) == {"encode": 13.0, "generate": 6.0}
    assert hop_costs(5.0, 4.0, 1.0) == {"encode": 4.0, "generate": 0.0}  # noise never goes negative


def test_the_zero_profile_keeps_the_shape_at_no_time():
    zero = zero_profile(PACED_PROFILE)
    assert zero["workload"] == PACED_PROFILE["workload"]
    assert all(p["ms"] == 0 for g in zero["generators"].values() for c in g.values() for p in c)
    assert PACED_PROFILE["generators"]["large"]["step"][0]["ms"] > 0  # the original untouched


def test_the_paced_profile_simulates_and_the_figures_carry_the_bars():
    profile = Profile.from_dict({**PACED_PROFILE, "calls": {"encode": 5.0, "generate": 4.0}})
    workload = Workload.mutual(0.3, PACED_PROFILE["workload"]["stages"])
    sim = simulate(profile, workload, {"Router": 1, "VisionEncoder": 1, "SmallReasoner": 1, "LargeAnswerer": 1},
                   settings_from_config(ROOT / "serve_config.yaml"), concurrency=1, duration_s=20)
    # The agree path alone (most requests): Router 1 + encode call 5 + both towers' images (40 + 40, one
    # batch after the VisionEncoder's 5 ms wait) + generate call 4 + the large model's prefill 100 and
    # 2 steps of 120.
    assert sim["p50_ms"] == pytest.approx(1 + 5 + 5 + 80 + 4 + 100 + 240, abs=2)
    point = {"load": "closed c=1", "measured": {"throughput_rps": 10.0, "p50_ms": 100.0, "p95_ms": 200.0},
             "simulated": {"throughput_rps": 11.0, "p50_ms": 120.0, "p95_ms": 230.0}}
    rows = figures(1, [point])
    assert [(r["metric"], r["within"]) for r in rows] == [("throughput_rps", True), ("p50_ms", False), ("p95_ms", True)]
    assert rows[1]["error"] == pytest.approx(0.2) and rows[2]["tolerance"] == 0.2


def test_each_loads_stage_calls_and_vision_batches_print_real_beside_simulated(capsys):
    points = [{"load": "closed c=16", "measured": {"stage_ms": {"encode_small": 131.2, "small_direct": 830.4},
                                                   "vision_batch": 1.31},
               "simulated": {"stage_ms": {"encode_small": 137.4, "small_direct": 841.9, "large_direct": 771.8},
                             "pools": {"VisionEncoder": {"mean_batch": 2.0}}}}]
    print_stages(points)
    assert ("closed c=16      encode_small 131/137, small_direct 830/842; VisionEncoder calls per batch 1.31/2.0"
            in capsys.readouterr().out)
