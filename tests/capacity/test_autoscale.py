"""Autoscaling in the simulator (capacity/autoscale.py): its policy is Serve's own, decision for
decision; a simulated pool follows a step in load up and back down with the delays and start-up it
is given, and loses no request on the way; the autoscale check's figures."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from capacity.autoscale import Decision, parse_steps, replicas_at, scaled, step_arrivals
from capacity.profile import CONTROL_LOOP_S, ROOT, Autoscaling, Profile, Workload, settings_from_config
from tests.capacity.helpers import AGREE, profile_dict, settings


def test_the_defaults_are_serves():
    from ray.serve.config import AutoscalingConfig

    serve = AutoscalingConfig()
    ours = Autoscaling()
    for field in dataclasses.fields(Autoscaling):
        assert getattr(ours, field.name) == getattr(serve, field.name), field.name


def test_scaling_factors_and_delays_decide_as_serves_policy_does():
    from ray.serve.autoscaling_policy import _apply_delay_logic, _apply_scaling_factors
    from ray.serve.config import AutoscalingConfig

    rng = random.Random(7)
    for up, down in ((None, None), (0.5, 0.3), (2.0, 1.0)):
        cfg = Autoscaling(max_replicas=20, upscaling_factor=up, downscaling_factor=down, upscale_delay_s=0.5,
                          downscale_delay_s=1.2)
        serve_cfg = AutoscalingConfig(max_replicas=20, upscaling_factor=up, downscaling_factor=down,
                                      upscale_delay_s=0.5, downscale_delay_s=1.2)
        ours, state, target, wanted = Decision(cfg), {}, 3, 3.0
        for tick in range(400):
            now = tick * 0.1
            running = max(1, target - rng.choice((0, 0, 1)))
            if tick % 7 == 0:  # what the metrics ask for holds a while, as a look-back window's mean does
                wanted = rng.choice((0.4, 1.0, 2.5, 3.0, 3.0, 3.0, 5.2, 9.0))
            desired = scaled(wanted, running, cfg)
            assert desired == _apply_scaling_factors(wanted, running, serve_cfg)
            theirs, state = _apply_delay_logic(desired, target, serve_cfg, state, _now=now)
            assert ours(desired, target, now) == theirs, (tick, desired, target)
            target = theirs


def _step_sim(startup_s: float = 2.0, startups: tuple = (), timing=None, **autoscaling):
    """The test profile, its LargeAnswerer autoscaled (1 to 4 replicas, target 1 ongoing request), under
    an open loop of 1 req/s, 40 req/s from 20 s, nothing from 60 s."""
    from capacity.simulate import Simulation

    a = Autoscaling(**{"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1, "metrics_interval_s": 1.0,
                       "look_back_period_s": 2.0, "upscale_delay_s": 3.0, "downscale_delay_s": 5.0, **autoscaling})
    s = settings(max_batch_size=2)
    s["LargeAnswerer"] = dataclasses.replace(s["LargeAnswerer"], autoscaling=a, startup_s=startup_s, startups=startups,
                                             **({"timing": timing} if timing else {}))
    # Slow large steps: 40 req/s keeps several calls ongoing there.
    p = Profile.from_dict(profile_dict(step=(20.0, 30.0)))
    sim = Simulation(p, Workload.mutual(0.0, AGREE), {}, s)
    sends = step_arrivals([(0, 1.0), (20, 40.0), (60, 0.0)], 60.0, seed=1)
    r = sim.run(duration_s=60.0, warmup_s=0.0, arrivals=sends, drain_s=60.0)
    return sim, r, sends


def test_a_pool_follows_a_step_up_after_its_delay_and_down_after_its_own():
    sim, r, sends = _step_sim()
    pool = r["pools"]["LargeAnswerer"]
    timeline, targets = pool["timeline"], pool["targets"]
    assert timeline[0] == (0.0, 1) and replicas_at(timeline, 19.0) == 1  # 1 req/s: one replica
    first_up = next(t for t, n in targets if n > 1)
    assert 20 + 3.0 <= first_up < 20 + 3.0 + 2.0  # the step, the upscale delay, a push or two of metrics
    assert max(n for _, n in timeline) == 4  # 40 req/s wants more than max_replicas
    for t, n in timeline[1:]:  # each replica that came up did so start-up after the tick after a target rose
        if n > replicas_at(timeline, t - 1e-9):
            assert any(abs(t - (tt + CONTROL_LOOP_S + 2.0)) < 1e-6 for tt, _ in targets)
        else:  # and each that stopped, the tick after the target fell
            assert any(abs(t - (tt + CONTROL_LOOP_S)) < 1e-6 and nn <= n for tt, nn in targets)
    last_down = targets[-1]
    assert targets[-1][1] == 1 and last_down[0] >= 60 + 5.0  # back to min, not before the downscale delay
    # Nothing lost on the way: every request sent was answered or turned away.
    assert r["completed"] + r["rejected"] + r["unfinished"] == len(sends) and r["unfinished"] == 0
    assert 1 < pool["replicas_mean"] < 4
    assert all(rep.died is not None for rep in sim.pools["LargeAnswerer"].retired)  # the retired loops ended


def test_a_slower_start_delays_the_replicas_not_the_decision():
    _, fast, _ = _step_sim(startup_s=0.5)
    _, slow, _ = _step_sim(startup_s=8.0)
    up = {k: next(t for t, n in r["pools"]["LargeAnswerer"]["timeline"] if n > 1) for k, r in (("fast", fast), ("slow", slow))}
    decided = {k: next(t for t, n in r["pools"]["LargeAnswerer"]["targets"] if n > 1) for k, r in (("fast", fast), ("slow", slow))}
    assert decided["fast"] == decided["slow"]
    assert up["slow"] - up["fast"] == pytest.approx(7.5)
    assert slow["p95_ms"] > fast["p95_ms"]


def test_a_replayed_run_starts_each_new_replica_in_its_own_measured_time():
    """A check gives each replica the target asks for the start-up measured for it, in order; those
    past the list take the pool's startup_s."""
    sim, r, _ = _step_sim(startup_s=2.0, startups=(0.5, 6.0))
    timeline, targets = r["pools"]["LargeAnswerer"]["timeline"], r["pools"]["LargeAnswerer"]["targets"]
    asked = [t for (_, before), (t, n) in zip(targets, targets[1:]) for _ in range(n - before)]
    came = [t for (_, before), (t, n) in zip(timeline, timeline[1:]) if n > before][:3]
    tick = CONTROL_LOOP_S  # Serve starts what one control loop decided in the next
    assert len(asked) == 3 and came == pytest.approx(sorted([asked[0] + tick + 0.5, asked[1] + tick + 6.0,
                                                             asked[2] + tick + 2.0]))


def test_metrics_are_recorded_and_pushed_at_their_own_period_and_decided_on_the_control_loop():
    """A metrics interval that is no multiple of the control loop's 0.1 s (0.25 s) is kept, not rounded."""
    sim, r, _ = _step_sim(metrics_interval_s=0.25)
    scaler = sim.autoscalers["LargeAnswerer"]
    times = [t for t, _ in scaler.records]
    assert len(times) > 4 and all(b - a == pytest.approx(0.25) for a, b in zip(times, times[1:]))
    assert scaler.pushed_at / 0.25 == pytest.approx(round(scaler.pushed_at / 0.25))
    decisions = [t for t, _ in r["pools"]["LargeAnswerer"]["targets"][1:]]
    assert decisions and all(t / 0.1 == pytest.approx(round(t / 0.1)) for t in decisions)


def test_the_control_loop_ticks_at_its_period_and_phase_and_the_handle_at_its_own():
    """Serve's loop sleeps its interval (the default period) between loops, so a loop's period is that
    plus its work; the loop and the handle began before the load, each at a phase of its own. The
    simulation keeps each clock: decisions on the loop's ticks, the replicas following one tick
    later, records and pushes on the handle's."""
    from ray.serve._private.constants import CONTROL_LOOP_INTERVAL_S

    from capacity.profile import ControlTiming

    assert CONTROL_LOOP_S == CONTROL_LOOP_INTERVAL_S == ControlTiming().period_s
    timing = ControlTiming(period_s=0.125, control_phase_s=0.04, handle_phase_s=0.17)
    sim, r, _ = _step_sim(timing=timing, metrics_interval_s=0.25)
    scaler = sim.autoscalers["LargeAnswerer"]
    ticks = lambda ts: [(t - 0.04) / 0.125 for t in ts]  # noqa: E731
    decisions = [t for t, _ in r["pools"]["LargeAnswerer"]["targets"][1:]]
    assert decisions and all(k == pytest.approx(round(k)) for k in ticks(decisions))
    stopped = [t for (_, before), (t, n) in zip(r["pools"]["LargeAnswerer"]["timeline"],
                                                 r["pools"]["LargeAnswerer"]["timeline"][1:]) if n < before]
    assert stopped and all(any(t == pytest.approx(d + 0.125) for d in decisions) for t in stopped)
    records = [t for t, _ in scaler.records]
    assert all((t - 0.17) / 0.25 == pytest.approx(round((t - 0.17) / 0.25)) for t in records)
    assert (scaler.pushed_at - 0.17) / 0.25 == pytest.approx(round((scaler.pushed_at - 0.17) / 0.25))
    # the same load on the default clocks decides at other instants, the same number of times
    _, default, _ = _step_sim(metrics_interval_s=0.25)
    assert [t for t, _ in default["pools"]["LargeAnswerer"]["targets"][1:]] != decisions


def test_a_call_counts_toward_its_pools_total_from_its_send_as_serves_handle_counts_it():
    """Fast replicas behind a slow hop (1 s of RPC and fetch per generate call): what the pool's
    replicas hold is small, what its callers have out is not, and Serve scales on the latter."""
    from capacity.simulate import Simulation

    def peak(hop_ms: float) -> int:
        a = Autoscaling(min_replicas=1, max_replicas=4, target_ongoing_requests=1, metrics_interval_s=1.0,
                        look_back_period_s=2.0, upscale_delay_s=1.0, downscale_delay_s=5.0)
        s = settings(max_batch_size=8)
        s["LargeAnswerer"] = dataclasses.replace(s["LargeAnswerer"], autoscaling=a, startup_s=0.5)
        p = Profile.from_dict({**profile_dict(step=(1.0, 1.0)), "calls": {"encode": 0.0, "generate": hop_ms}})
        sim = Simulation(p, Workload.mutual(0.0, AGREE), {}, s)
        r = sim.run(duration_s=20.0, warmup_s=0.0, arrivals=step_arrivals([(0, 4.0)], 20.0, seed=3), drain_s=20.0)
        assert r["unfinished"] == 0
        return max(n for _, n in r["pools"]["LargeAnswerer"]["timeline"])

    assert peak(0.0) == 1  # 4 req/s of ~10-ms calls: well under one ongoing call
    assert peak(1000.0) >= 3  # each call is out ~1 s: about 4 at once


def test_configs_autoscale_only_when_asked_and_scaling_to_zero_is_refused():
    gpu = settings_from_config(ROOT / "serve_config.gpu.yaml")
    assert all(s.autoscaling is None for s in gpu.values())
    scaled_gpu = settings_from_config(ROOT / "serve_config.gpu.yaml", autoscaling=True)
    assert scaled_gpu["SmallReasoner"].autoscaling.max_replicas > scaled_gpu["SmallReasoner"].autoscaling.min_replicas
    with pytest.raises(ValueError, match="min_replicas"):
        Autoscaling.from_config({"min_replicas": 0, "max_replicas": 2})


def test_steps_parse_and_send_at_each_rate():
    steps = parse_steps("0:2, 30:8,90:0")
    assert steps == [(0.0, 2.0), (30.0, 8.0), (90.0, 0.0)]
    sends = step_arrivals(steps, 120.0, seed=3)
    assert 40 <= sum(1 for t in sends if t < 30) <= 80 and 400 <= sum(1 for t in sends if 30 <= t < 90) <= 560
    assert not [t for t in sends if t >= 90]
    for bad in ("5:2", "0:x", "0:-1", ""):
        with pytest.raises(Exception, match="bad steps"):
            parse_steps(bad)


def test_the_simulate_command_autoscales_a_config(tmp_path, capsys):
    from capacity.simulate import main

    d = profile_dict(step=(20.0, 30.0)) | {"workload": {"policy": "mutual", "images": 1, "transfer_rate": 0.0,
                                                        "stages": {k: {**v, "n": 10} for k, v in AGREE.items()}}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    args = ["--profile", str(path), "--config", str(ROOT / "serve_config.gpu.yaml"), "--rate-steps", "0:5,20:200",
            "--duration-s", "40"]
    assert main(args + ["--autoscale", "--startup-s", "SmallReasoner=1,LargeAnswerer=1"]) == 0
    out = capsys.readouterr().out
    r = json.loads(out.strip().splitlines()[-1])
    assert "LargeAnswerer autoscaled" in out and len(r["pools"]["LargeAnswerer"]["timeline"]) > 1
    assert main(args) == 0  # without --autoscale the pools keep their replicas
    assert "timeline" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pools"]["LargeAnswerer"]


def test_the_check_reads_the_worst_second_and_the_whole_runs_p95():
    from capacity.autoscale import replicas_at
    from capacity.autoscale_check import STEPS, figures

    class Poller:
        def timeline(self, pool):
            return [(0.2, 1), (5.4, 3)] if pool == "SmallReasoner" else [(0.2, 1), (40.0, 2)]

        def target_timeline(self, pool):  # polled: a sample every 0.25 s, the target moving between two
            changes = [(0.0, 1), (33.1, 3), (104.6, 1)] if pool == "SmallReasoner" else [(0.0, 1), (35.0, 2)]
            return [(t / 4, replicas_at(changes, t / 4)) for t in range(0, 600)]

    real = [(t, 100.0 + t) for t in range(0, 150)]
    measured = {"last_end_s": 60.0, "latencies": real}
    sim = {"pools": {"SmallReasoner": {"timeline": [(0.0, 1), (3.0, 3)], "targets": [(0.0, 1), (32.6, 3), (104.3, 1)]},
                     "LargeAnswerer": {"timeline": [(0.0, 1), (39.0, 2), (45.0, 3)],
                                       "targets": [(0.0, 1), (34.0, 2), (38.0, 3), (102.9, 1)]}}}
    rows = {(r["load"], r["metric"]): r for r in figures(1, Poller(), measured, sim, [(t, 1.1 * ms) for t, ms in real])}
    small, large = rows[("SmallReasoner", "replicas (worst second)")], rows[("LargeAnswerer", "replicas (worst second)")]
    assert (small["error"], small["at_s"], small["within"]) == (2, 3, False)  # 3 simulated, 1 real at 3, 4 and 5 s
    assert (small["seconds_off"], small["seconds"]) == (3, 61)
    assert (small["slack_s"], large["slack_s"]) == (2.0, 0.0)  # real 1 at 3, 4, 5 s: simulated 1 until 3.0 s
    # When each decided: the first poll that saw the target move, against the simulated decision.
    up, down = rows[("SmallReasoner", "scale-up decided (s)")], rows[("SmallReasoner", "scale-down decided (s)")]
    assert (up["real"], up["simulated"], up["error"]) == (33.25, 32.6, -0.65)
    assert (down["real"], down["simulated"], down["error"]) == (104.75, 104.3, -0.45)
    never = rows[("LargeAnswerer", "scale-down decided (s)")]
    assert (never["real"], never["simulated"], never["error"], never["within"]) == (None, 102.9, None, None)
    whole = rows[("whole run", "p95_ms")]
    assert whole["error"] == pytest.approx(0.1, abs=1e-3) and whole["within"] and whole["tolerance"] == 0.2
    assert sum(1 for load, metric in rows if load.startswith("step")) == len(STEPS)


def test_the_check_reads_the_requests_in_flight_over_each_step_and_after_each_change():
    from capacity.autoscale_check import in_flight

    # One request from 29 s for 2 s (half its time in each of the first two steps), one from 91 s for 4 s.
    held = in_flight([(29.0, 2000.0), (91.0, 4000.0)])  # rounded to 3 decimals
    expected = {"1/s from 0 s": 1 / 30, "8/s from 30 s": 1 / 60, "1/s from 90 s": 4 / 60, "30-35 s": 1 / 5,
                "90-95 s": 4 / 5}
    assert held == pytest.approx(expected, abs=1e-3)


def test_the_check_compares_each_stage_calls_time_by_the_step_its_request_was_sent_in(capsys):
    from capacity.autoscale_check import print_stages, stage_ms_by_step

    real = stage_ms_by_step([(10.0, "small_direct", 400.0), (20.0, "small_direct", 500.0),
                             (31.0, "small_direct", 900.0), (31.0, "encode_small", 120.0), (95.0, "small_direct", 450.0)])
    assert real == {"1/s from 0 s": {"small_direct": 450.0}, "8/s from 30 s": {"encode_small": 120.0, "small_direct": 900.0},
                    "1/s from 90 s": {"small_direct": 450.0}}
    sim = stage_ms_by_step([(5.0, "small_direct", 430.0), (40.0, "small_direct", 850.0)])
    print_stages({"real": real, "simulated": sim})
    out = capsys.readouterr().out
    assert "1/s from 0 s   small_direct 450/430\n" in out and "8/s from 30 s  small_direct 900/850\n" in out
    assert "encode_small" not in out  # a stage the simulation did not run there is not compared
    assert "90 s" not in out  # nor a step it ran none in


def test_the_check_times_each_new_replica_from_the_target_that_asked_for_it():
    from capacity.autoscale_check import ReplicaPoller

    poller = ReplicaPoller(start=0.0)
    both = lambda small, large: {"SmallReasoner": small, "LargeAnswerer": large}  # noqa: E731
    poller.samples = [(0.1, both(1, 1))]
    poller.targets = [(0.1, both(1, 1)), (36.3, both(3, 1)), (40.1, both(3, 2)), (104.0, both(1, 1))]
    poller.seen = {"s0": {"RUNNING": 0.1}, "l0": {"RUNNING": 0.1},
                   "s2": {"STARTING": 36.8, "RUNNING": 43.0}, "s1": {"STARTING": 36.6, "RUNNING": 41.9},
                   "l1": {"STARTING": 40.4}}  # never ran
    poller.pool_of = {"s0": "SmallReasoner", "s1": "SmallReasoner", "s2": "SmallReasoner",
                      "l0": "LargeAnswerer", "l1": "LargeAnswerer"}
    assert poller.startups("SmallReasoner") == [5.6, 6.7]  # in the order they appeared
    assert poller.startups("LargeAnswerer") == [None]
    assert poller.startup_s() == pytest.approx(6.15)


def test_the_time_slack_is_how_far_the_simulated_scaling_is_from_the_real():
    from capacity.autoscale_check import slack_s

    sim = [(0.0, 1), (37.7, 2), (42.1, 3), (102.8, 2), (102.8, 1)]
    seconds = range(0, 150)
    assert slack_s([(0.05, 1), (39.7, 2), (41.2, 3), (102.5, 1)], sim, seconds) == 0.0
    # 3 real at 103 s, simulated 1 from 102.8 s: within 1 of it until then
    assert slack_s([(0.05, 1), (39.7, 2), (41.2, 3), (103.9, 1)], sim, seconds) == 0.2
    assert slack_s([(0.05, 1), (35.0, 3), (102.5, 1)], sim, seconds) == 2.7  # 3 at 35 s, simulated 2 from 37.7 s
    assert slack_s([(0.05, 1), (44.5, 3), (102.5, 1)], sim, seconds) == 1.9  # 1 at 44 s, simulated 2 until 42.1 s


def test_the_check_takes_the_real_pools_from_the_controllers_log_and_says_how_late_the_polls_saw_them(tmp_path):
    import datetime

    from capacity.autoscale_check import LoggedPools, ReplicaPoller, poll_lag

    start = datetime.datetime(2026, 12, 7, 10, 0, 0).timestamp()
    log = tmp_path / "controller_1.log"
    log.write_text("\n".join(f"INFO 2026-12-07 10:0{m}:{s},{ms} controller 1 -- {msg}" for m, s, ms, msg in [
        (0, 33, "100", "Upscaling Deployment(name='SmallReasoner', app='tandem') from 1 to 3 replicas."),
        (0, 33, "220", "Adding 2 replicas to Deployment(name='SmallReasoner', app='tandem')."),
        (0, 40, "500", "Replica(id='a', deployment='SmallReasoner', app='tandem') started successfully on node 'n'."),
        (0, 41, "000", "Replica(id='b', deployment='SmallReasoner', app='tandem') started successfully on node 'n'."),
        (1, 43, "800", "Downscaling Deployment(name='SmallReasoner', app='tandem') from 3 to 1 replicas."),
        (1, 43, "920", "Stopping Replica(id='a', deployment='SmallReasoner', app='tandem') (currently ReplicaState.RUNNING)."),
        (1, 43, "923", "Stopping Replica(id='b', deployment='SmallReasoner', app='tandem') (currently ReplicaState.RUNNING)."),
        (1, 44, "000", "Adding 1 replica to Deployment(name='SmallReasoner', app='tandem-twin')."),  # another app
    ]))
    poller = ReplicaPoller(start=0.0)
    both = lambda small, large: {"SmallReasoner": small, "LargeAnswerer": large}  # noqa: E731
    # The polls saw each change up to a poll's period and round trip late.
    poller.samples = [(0.1, both(1, 1)), (40.7, both(2, 1)), (41.2, both(3, 1)), (104.2, both(1, 1))]
    poller.targets = [(0.1, both(1, 1)), (33.3, both(3, 1)), (104.0, both(1, 1))]
    logged = LoggedPools(log, start, start + 150, poller)
    assert logged.timeline("SmallReasoner") == [(0.0, 1), (40.5, 2), (41.0, 3), (103.92, 2), (103.923, 1)]
    assert logged.target_timeline("SmallReasoner") == [(0.0, 1), (33.1, 3), (103.8, 1)]
    assert logged.startups("SmallReasoner") == pytest.approx([7.28, 7.78]) and logged.startups("LargeAnswerer") == []
    assert logged.timeline("LargeAnswerer") == [(0.0, 1)]
    # 2 held 0.5 s, 3 held until 103.92 s, 1 from 103.923 s; the 2 held for 3 ms no poll could see.
    lag = poll_lag(logged, poller)
    assert lag["min_s"] == pytest.approx(0.2) and lag["max_s"] == pytest.approx(0.277)
    assert lag["mean_s"] == pytest.approx((0.2 + 0.2 + 0.277) / 3, abs=1e-3)
    # The loop that acted on each decision came 0.12 s after it: the controller's period here.
    assert logged.loop_period_s() == pytest.approx(0.12)
    _the_simulation_takes_the_logged_period_and_draws_its_phases(logged, poller)


def _the_simulation_takes_the_logged_period_and_draws_its_phases(logged, poller):
    from capacity.autoscale_check import AUTOSCALING, POOLS, sim_timing

    one, again, two = (sim_timing(logged, run, AUTOSCALING) for run in (1, 1, 2))
    assert one == again and one != two  # drawn per run, from the run's number
    for timing in (one, two):
        assert {t.period_s for t in timing.values()} == {0.12}
        assert len({t.control_phase_s for t in timing.values()}) == 1  # one controller for every pool
        assert all(0 <= t.control_phase_s < 0.12 and 0 <= t.handle_phase_s < 1.0 for t in timing.values())
    assert set(one) == set(POOLS) and one["SmallReasoner"].handle_phase_s != one["LargeAnswerer"].handle_phase_s
    # without a log, the polls know no period: Serve's interval
    assert {t.period_s for t in sim_timing(poller, 1, AUTOSCALING).values()} == {CONTROL_LOOP_S}


def test_the_check_compares_the_controllers_look_back_mean_with_the_simulated_one_by_window():
    from capacity.autoscale_check import totals_gap

    sim = [(t / 10, 8.0 if t < 900 else 2.0) for t in range(0, 1500)]  # each 0.1-s tick; 8 until 90 s
    real = [(t / 4 + 0.05, 8.5 if t < 4 * 92 else 2.0) for t in range(0, 600)]  # 0.5 more, and 2 s longer
    gap = totals_gap(real, sim)
    assert gap["1/s from 0 s"] == pytest.approx(0.5) and gap["8/s from 30 s"] == pytest.approx(0.5)
    assert gap["90-95 s"] == pytest.approx(6.5 * 2 / 5, abs=0.05)  # 6.5 more for the first 2 of its 5 s
    assert gap["30-35 s"] == pytest.approx(0.5)
