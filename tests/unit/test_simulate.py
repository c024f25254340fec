"""The cluster simulator and the planner (benchmarks/simulate.py, benchmarks/plan.py): exact latencies
where the arithmetic is known, batching, queue limits, shared cores, and plans that meet their SLO."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from benchmarks.plan import Planner, admission_limit, gpus, lower_bound, overlay
from benchmarks.simulate import (PROFILE_KIND, ROOT, STEADY_PATHS, Call, Curve, PoolSettings, Profile, Workload,
                                 default_duration, parse_replicas, settings_from_config, simulate)


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


def saved_run(run: str, load: int) -> tuple[dict, dict]:
    """A saved sim_check run's profile (benchmarks/runs/) and its measured point at `load`, as the
    check's `compare` takes them."""
    import json

    d = ROOT / "benchmarks" / "runs" / "sim-check-2026-12-03" / run
    saved = json.loads((d / "sim_check.json").read_text())
    point = next({k: pt[k] for k in ("kind", "load", "measured")} for pt in saved["points"] if pt["load"] == load)
    return json.loads((d / "profile.json").read_text()), point


def test_curve_interpolates_and_extends_the_nearest_segment():
    c = Curve([(1, 2.0), (8, 4.0)])
    assert c(1) == 2.0 and c(8) == 4.0
    assert c(4.5) == pytest.approx(3.0)
    assert c(15) == pytest.approx(6.0)           # the last segment, extended
    assert c(0) == 2.0                           # never below the smallest measured time
    assert Curve([(3, 7.0)])(100) == 7.0


def test_one_request_at_a_time_takes_exactly_the_sum_of_its_stages():
    p = profile()
    # Both towers run in one VisionEncoder batch (4 + 4 ms); then the two direct answers in parallel,
    # each a prefill and 3 one-row steps; the large one is the slower: 2 * (5 + 3 * 2) = 22 ms.
    agree = simulate(p, Workload.mutual(0.0, AGREE), {}, settings(), concurrency=1, duration_s=20)
    assert agree["p50_ms"] == pytest.approx(1 + 8 + 22, abs=1e-6)
    # Transfer adds the small model's 20-step reasoning (5 + 20 * 2) and the large answer (2 * (5 + 3 * 2)).
    transfer = simulate(p, Workload.mutual(1.0, AGREE), {}, settings(), concurrency=1, duration_s=20)
    assert transfer["p50_ms"] == pytest.approx(31 + 45 + 22, abs=1e-6)
    assert transfer["paths"] == {"transfer": transfer["completed"]}
    # Closed loop: throughput is concurrency over latency (Little's law).
    assert agree["throughput_rps"] == pytest.approx(1000 / 31, rel=0.02)


def test_batch_wait_adds_latency_when_a_batch_cannot_fill():
    p = profile()
    no_wait = simulate(p, Workload.mutual(0.0, AGREE), {}, settings(), concurrency=1, duration_s=20)
    wait = simulate(p, Workload.mutual(0.0, AGREE), {}, settings(batch_wait_s=0.01), concurrency=1, duration_s=20)
    # One request cannot fill any batch: the vision batch and each decode loop wait their 10 ms.
    assert wait["p50_ms"] == pytest.approx(no_wait["p50_ms"] + 20, abs=1e-6)


def test_batching_carries_load_that_one_row_at_a_time_could_not():
    p = profile()
    w = Workload.mutual(0.0, AGREE)
    # One row at a time, the large model needs 2 * (5 + 6) = 22 ms per request: at most ~45 req/s.
    unbatched = simulate(p, w, {}, settings(max_batch_size=1), rate=120, duration_s=30)
    batched = simulate(p, w, {}, settings(), rate=120, duration_s=30)
    assert unbatched["throughput_rps"] < 60
    assert batched["throughput_rps"] == pytest.approx(120, rel=0.1)
    assert batched["pools"]["LargeAnswerer"]["mean_batch"] > 1.5
    assert batched["p95_ms"] < unbatched["p95_ms"]


def test_a_bounded_queue_rejects_past_capacity_and_an_unbounded_one_does_not():
    p = profile()
    w = Workload.mutual(0.0, AGREE)
    bounded = simulate(p, w, {}, settings(max_batch_size=1, max_ongoing=1, max_queued=4), rate=200, duration_s=20)
    assert bounded["rejection_rate"] > 0.3
    assert bounded["p95_ms"] < 1000  # what is admitted waits behind at most a few calls
    light = simulate(p, w, {}, settings(max_batch_size=1, max_ongoing=1, max_queued=4), rate=5, duration_s=20)
    assert light["rejection_rate"] == 0


def test_an_overloaded_open_loop_counts_what_its_drain_left_unanswered_and_no_plan_passes_with_it():
    """Queues without bounds at five times capacity: most requests are neither answered nor turned
    away when the run ends. They are counted, the rejection rate is a share of every arrival, and a
    planner does not take the answered ones' p95 for the app's."""
    p = profile()
    w = Workload.mutual(0.0, AGREE)
    s = settings(max_batch_size=1, max_ongoing=1)
    over = simulate(p, w, {}, s, rate=500, duration_s=4)
    assert over["unfinished"] > over["completed"] > 0 and over["rejected"] == 0 and over["rejection_rate"] == 0
    assert not Planner(p, w, s, p95_ms=1e9, verbose=False).meets(over)
    light = simulate(p, w, {}, s, rate=5, duration_s=4)
    assert light["unfinished"] == 0 and Planner(p, w, s, p95_ms=1e9, verbose=False).meets(light)
    closed = simulate(p, w, {}, s, concurrency=4, duration_s=4)
    assert closed["unfinished"] is None  # a closed loop's last requests are in flight by design
    from benchmarks.simulate import Simulation

    cut = Simulation(p, w, {}, settings(max_batch_size=1, max_ongoing=1, max_queued=4)).run(rate=200, duration_s=4, drain_s=0)
    assert cut["rejected"] > 0 and cut["unfinished"] > 0
    assert cut["rejection_rate"] == round(cut["rejected"] / (cut["completed"] + cut["rejected"] + cut["unfinished"]), 4)


def test_the_routers_admission_limit_sheds_at_the_door_and_keeps_capacity():
    """http.max_in_flight: past it a request is turned away before any work, so what is admitted
    waits behind at most the limit's worth of requests, and the app completes as many as without."""
    p = profile()
    w = Workload.mutual(0.0, AGREE)
    s = settings(max_batch_size=1, max_ongoing=1)
    s["Router"] = dataclasses.replace(s["Router"], max_ongoing=64)
    unlimited = simulate(p, w, {}, s, rate=200, duration_s=20)
    s["Router"] = dataclasses.replace(s["Router"], admit=4)
    limited = simulate(p, w, {}, s, rate=200, duration_s=20)
    assert unlimited["rejection_rate"] == 0 and limited["rejection_rate"] > 0.3
    assert limited["p95_ms"] < unlimited["p95_ms"] / 5
    assert limited["throughput_rps"] == pytest.approx(unlimited["throughput_rps"], rel=0.1)
    light = simulate(p, w, {}, s, rate=5, duration_s=20)
    assert light["rejection_rate"] == 0


def test_more_replicas_more_throughput():
    p = profile()
    w = Workload.mutual(0.0, AGREE)
    s = settings(max_batch_size=1)
    one = simulate(p, w, {}, s, rate=150, duration_s=20)
    three = simulate(p, w, parse_replicas("VisionEncoder=2,SmallReasoner=3,LargeAnswerer=4"), s, rate=150, duration_s=20)
    assert three["throughput_rps"] == pytest.approx(150, rel=0.1)
    assert three["throughput_rps"] > one["throughput_rps"] * 1.5
    assert three["replicas"]["LargeAnswerer"] == 4 and three["gpus"] == 2 + 3 + 4


def test_decode_steps_run_as_one_wait_give_the_figures_a_step_at_a_time_gives():
    """Own devices: a decode loop's steps between one join or finish and the next run as one wait,
    cut at the end of the step a new job arrives in. A 200-step reasoning row is decoding when a
    second request's short answer arrives mid-step: with room it joins at that step's end, in a full
    batch (one row) it waits for the reasoning to finish. Either way every latency is the
    step-at-a-time run's to the bit (k times a step is not the sum of k steps in floating point),
    and its utilisation and batch figures too, in a fraction of the events."""
    from benchmarks.simulate import Simulation

    long = {**AGREE, "small_reasoning": {"prompt_tokens": 10, "decode_steps": 200}}
    mean_batch = []
    for s in (settings(), settings(max_batch_size=1)):
        runs = []
        for coast in (True, False):
            sim = Simulation(profile(), Workload.mutual(1.0, long), {}, s)
            sim.coast = coast
            events, step = [0], sim.env.step

            def counted():
                events[0] += 1
                step()
            sim.env.step = counted
            sim.run(arrivals=[0.0, 0.1003, 0.2507], duration_s=1.0, warmup_s=0.0)
            runs.append((sorted(lat for _, lat, _ in sim.latencies), events[0],
                         {n: (p.batches, p.batched, sum(r.compute_s for r in p.replicas), p.queue_s)
                          for n, p in sim.pools.items()}))
        (lat, events_coasting, pools), (lat_steps, events_steps, pools_steps) = runs
        assert len(lat) == 3 and lat == lat_steps  # to the bit: the coasted times are summed a step at a time
        for name, (batches, rows, busy_s, queued_s) in pools.items():
            assert (batches, rows) == pools_steps[name][:2]  # steps and rows in them, counted alike
            assert [busy_s, *queued_s] == pytest.approx([pools_steps[name][2], *pools_steps[name][3]], abs=1e-12)
        assert events_coasting < events_steps / 3
        small = pools["SmallReasoner"]
        mean_batch.append(small[1] / small[0])
    # the short answers were decoded beside the reasoning where the batch had room, after it where not
    assert mean_batch[1] == 1.0 < mean_batch[0]


def test_a_coasts_end_is_the_sum_of_its_steps_to_the_bit():
    """`repeated_sum` adds a binade's worth of steps at once: it must give what k additions give, also
    where the sums cross binades, where a step is under half a spacing, and at rounding ties."""
    import math
    import random

    from benchmarks.simulate import repeated_sum

    def added(s, d, k):
        for _ in range(k):
            s += d
        return s
    rng = random.Random(7)
    cases = [(0.0, 0.01, 300), (1.0, math.ulp(1.0) / 2, 5), (1.0, math.ulp(1.0) * 1.5, 40), (3.0, math.ulp(1.0), 9),
             (2.0 - 1e-9, 0.0125, 400), (7.99, 0.004, 600), (5.0, 1e-17, 10), (0.3, 0.1, 0), (0.3, 0.1, 1)]
    for _ in range(20000):
        s = rng.choice([rng.uniform(0, 200), 2.0 ** rng.randint(-4, 7) - rng.choice([0, 1e-9, 1e-3]), 0.0])
        d = rng.choice([rng.uniform(1e-5, 0.2), math.ulp(max(s, 1.0)) * rng.choice([0.25, 0.5, 1.5, 2.5, 3.0])])
        cases.append((s, d, rng.randint(0, 600)))
    mismatches = [(s, d, k) for s, d, k in cases if repeated_sum(s, d, k) != added(s, d, k)]
    assert not mismatches
    assert repeated_sum(0.3, 0.1, 7) != 0.3 + 7 * 0.1  # the loop's rounding, not the product's


def test_called_off_events_are_dropped_and_the_rest_run_in_their_order():
    """The environment drops called-off timeouts in bulk (an arrival that wakes a coasting loop early
    calls the loop's timeout off); what is left runs in the order it would have, ties included, and
    none of the called-off."""
    from benchmarks.simulate import _Environment

    env, ran = _Environment(), []
    events = []
    for i in range(6000):
        ev = env.timeout((i * 7919 % 500) / 100)  # many at the same time: their order is their creation's
        ev.callbacks.append(lambda _e, i=i: ran.append(i))
        events.append((ev._delay, i, ev))
    off = {i for i in range(6000) if i % 3}
    for _, i, ev in events:
        if i in off:
            env.call_off(ev)
    assert len(env._queue) < 3000  # dropped, not left to pop as no-ops
    env.run()
    assert ran == [i for _, i, _ in sorted(events, key=lambda e: e[:2]) if i not in off]


def test_a_wake_processed_in_place_runs_in_the_order_a_trip_through_the_queue_gives():
    """`succeed_next` processes a succeeded event at once where nothing else is due now (simpy would
    pop it next) and queues it otherwise: either way everything runs in the order `succeed` gives,
    ties included, and the wakes at times of their own skip the queue."""
    from benchmarks.simulate import _Environment

    def script(in_place: bool):
        env, ran = _Environment(), []

        def woken(i):
            ran.append(("wake", i, env.now))
            if i % 4 == 0:  # a wake that sets more work for this very instant
                env.timeout(0).callbacks.append(lambda _e: ran.append(("then", i, env.now)))

        for i in range(400):
            wake = env.event()
            wake.callbacks.append(lambda _e, i=i: woken(i))
            # Half the alarms share their times with others (ties), half have times of their own.
            at = (i * 37 % 50) / 10 if i % 2 else 10 + i / 7
            alarm = env.timeout(at)
            alarm.callbacks.append(lambda _e, w=wake: env.succeed_next(w) if in_place else w.succeed())
            env.timeout((i * 11 % 50) / 10).callbacks.append(lambda _e, i=i: ran.append(("other", i, env.now)))
        env.run()
        return ran, next(env._eid)

    (queued, queued_ids), (in_place, in_place_ids) = script(False), script(True)
    assert in_place == queued
    assert queued_ids - in_place_ids >= 150  # the 200 wakes at times of their own, less any tie


def test_a_simulation_leaves_no_reference_cycles():
    """The cyclic collector is off while a simulation runs: a run must make no cycles, or its garbage
    would pile up — coasting loops woken early and shared cores alike."""
    import gc

    from benchmarks.simulate import Simulation

    long = {**AGREE, "small_reasoning": {"prompt_tokens": 10, "decode_steps": 200}}
    try:
        for cores in (None, 2.0):
            sim = Simulation(profile(), Workload.mutual(0.5, long), {}, settings(batch_wait_s=0.01), host_cores=cores)
            sim.env.DROP_AT = 4  # called-off timeouts dropped from the queue often, not left to pop
            gc.set_debug(0)
            gc.collect()  # what came before the run (the last simulation: it is all links), freed
            gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds from here on, kept in gc.garbage
            r = sim.run(rate=40.0, duration_s=20.0)
            assert r["completed"] > 300 and gc.isenabled()
            gc.collect()
            assert gc.garbage == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_two_replicas_are_drawn_as_random_sample_draws_them():
    """The power of two choices draws its pair by hand, faster: the very pairs random.sample gives
    for a seed (figures recorded before stand), the same stream after, any pool size."""
    import random

    from benchmarks.simulate import Simulation

    for n in (3, 4, 21, 22, 25, 1760):
        sim = Simulation(profile(), Workload.mutual(0.0, AGREE), {"LargeAnswerer": n}, settings(), seed=n)
        pool, rng = sim.pools["LargeAnswerer"], random.Random(n)
        assert all(tuple(rng.sample(pool.replicas, 2)) == pool._two() for _ in range(3000))
        assert rng.random() == sim.rng.random()


def test_shared_cores_slow_replicas_that_compute_at_once():
    p = profile()
    w = Workload.mutual(0.0, AGREE)
    # The two direct answers decode at the same time: on one core each step runs twice as slow.
    own = simulate(p, w, {}, settings(), concurrency=1, duration_s=20)
    shared = simulate(p, w, {}, settings(), concurrency=1, duration_s=20, host_cores=1)
    assert shared["p50_ms"] > own["p50_ms"] * 1.2


def test_profile_kind_is_checked_and_scaling_scales_every_stage():
    with pytest.raises(ValueError, match="not a stage profile"):
        Profile.from_dict({"kind": "latency-profile"})
    p = profile()
    double = p.scaled({"router": 2, "vision": 2, "small": 2, "large": 2})
    one = simulate(p, Workload.mutual(1.0, AGREE), {}, settings(), concurrency=1, duration_s=20)
    two = simulate(double, Workload.mutual(1.0, AGREE), {}, settings(), concurrency=1, duration_s=20)
    assert two["p50_ms"] == pytest.approx(2 * one["p50_ms"], rel=1e-6)


def test_settings_come_from_the_serve_config():
    s = settings_from_config(ROOT / "serve_config.gpu.yaml")
    cfg = yaml.safe_load((ROOT / "serve_config.gpu.yaml").read_text())
    d = {x["name"]: x for x in cfg["applications"][0]["deployments"]}
    assert s["VisionEncoder"].gpus_per_replica == d["VisionEncoder"]["ray_actor_options"]["num_gpus"]
    assert s["LargeAnswerer"].max_batch_size == d["LargeAnswerer"]["user_config"]["max_batch_size"]
    assert s["Router"].max_ongoing == d["Router"]["max_ongoing_requests"] and s["Router"].gpus_per_replica == 0
    cpu = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]
    assert settings_from_config(ROOT / "serve_config.yaml")["Router"].admit == cpu["args"]["http"]["max_in_flight"]
    assert settings_from_config(ROOT / "serve_config.yaml")["LargeAnswerer"].admit is None


def test_replica_counts_are_parsed_strictly():
    assert parse_replicas("VisionEncoder=1, LargeAnswerer=3") == {"VisionEncoder": 1, "LargeAnswerer": 3}
    for bad in ("Vision=1", "LargeAnswerer=0", "LargeAnswerer=x"):
        with pytest.raises(Exception):
            parse_replicas(bad)


def test_the_plan_meets_its_slo_and_one_replica_fewer_in_its_busiest_pool_does_not():
    p = profile()
    w = Workload.mutual(0.3, AGREE)
    s = settings(max_ongoing=16, max_queued=64)
    planner = Planner(p, w, s, p95_ms=300, duration_s=10, verbose=False)
    replicas, result = planner.plan(200)
    assert planner.meets(result)
    bound = lower_bound(p, w, s, 200)
    assert all(replicas[n] >= bound[n] for n in replicas)
    for pool in ("SmallReasoner", "LargeAnswerer"):
        if replicas[pool] > 1:  # the trim step already tried this: it must miss
            assert not planner.meets(planner.evaluate({**replicas, pool: replicas[pool] - 1}, 200))
    double, _ = planner.plan(400)
    assert 1.5 <= gpus(double, s) / gpus(replicas, s) <= 2.5


def test_the_plan_sizes_the_routers_admission_limit_and_meets_its_slo_with_it():
    p = profile()
    w = Workload.mutual(0.3, AGREE)
    s = settings(max_ongoing=16, max_queued=64)
    s["Router"] = dataclasses.replace(s["Router"], admit=2)  # the config's, replaced by the plan's
    planner = Planner(p, w, s, p95_ms=300, duration_s=10, verbose=False)
    replicas, result = planner.plan(200)
    limit = planner.settings_for(replicas, 200)["Router"].admit
    assert limit == min(-(-200 * 300 // (1000 * replicas["Router"])), 16 - 1)  # rate share x SLO, below Serve's
    assert planner.meets(result) and result["rejection_rate"] <= 0.001
    assert admission_limit(1000, 21, 20000, 256) == 255 and admission_limit(0.1, 4, 100, 64) == 1


def test_a_kept_admission_limit_takes_more_routers_to_carry_the_rate():
    """With the config's limit kept (4 in flight a Router), the rate's ~7 requests in flight need
    several Routers: one alone turns requests away at the door."""
    p = profile()
    w = Workload.mutual(0.3, AGREE)
    s = settings(max_ongoing=64, max_queued=64)
    s["Router"] = dataclasses.replace(s["Router"], admit=4)
    planner = Planner(p, w, s, p95_ms=300, duration_s=10, size_admission=False, verbose=False)
    one = planner.evaluate({"Router": 1, "VisionEncoder": 4, "SmallReasoner": 4, "LargeAnswerer": 4}, 200)
    assert one["pools"]["Router"]["rejected"] > 0 and not planner.meets(one)
    replicas, result = planner.plan(200)
    assert replicas["Router"] >= 2 and planner.meets(result)
    assert planner.settings_for(replicas, 200)["Router"].admit == 4


def test_a_plan_is_simulated_for_many_slowest_paths_and_its_sanity_runs_it_four_times_as_long(tmp_path, capsys):
    """A reasoning path seconds long fills the decode batches over minutes: the planner's runs last
    STEADY_PATHS of its latencies (at least 30 s), and --sanity reports the plan over four times that."""
    from benchmarks.plan import main

    w = Workload.mutual(0.3, AGREE)
    assert default_duration(profile(), w) == 30.0  # a path of milliseconds
    slow = profile(step=(100.0, 200.0))
    assert default_duration(slow, w) == pytest.approx(STEADY_PATHS * w.unloaded_s(slow)) and w.unloaded_s(slow) > 2
    d = profile_dict()
    d["workload"] = {"policy": "mutual", "requests": 60, "images": 1, "transfer_rate": 0.3,
                     "stages": {k: {**v, "n": 60} for k, v in AGREE.items()}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    assert main(["--profile", str(path), "--rate", "100", "--p95-ms", "300", "--sanity", "--config",
                 str(ROOT / "serve_config.yaml")]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["longer"]["duration_s"] == 120.0 and isinstance(summary["longer"]["meets"], bool)
    assert "over 120 simulated s" in out

    from benchmarks.simulate import main as simulate_main

    d = profile_dict(step=(100.0, 200.0)) | {"workload": d["workload"]}
    path.write_text(json.dumps(d))
    for seconds, noted in ((10, True), (default_duration(Profile.from_dict(d), w) + 1, False)):
        assert simulate_main(["--profile", str(path), "--rate", "2", "--duration-s", str(seconds)]) == 0
        out = capsys.readouterr().out
        assert ("a pipeline still filling" in out) == noted
        assert json.loads(out.strip().splitlines()[-1])["benchmark"] == "simulate"


def test_overlay_fixes_replicas_and_drops_autoscaling():
    base = yaml.safe_load((ROOT / "serve_config.gpu.yaml").read_text())
    plan = {"Router": 2, "VisionEncoder": 3, "SmallReasoner": 4, "LargeAnswerer": 5}
    whole = overlay(plan, base)
    for d in whole["applications"][0]["deployments"]:
        assert d["num_replicas"] == plan[d["name"]] and "autoscaling_config" not in d
    assert base["applications"][0]["deployments"][1].get("autoscaling_config")  # the base is untouched
    assert overlay(plan)["applications"][0]["deployments"][3] == {"name": "LargeAnswerer", "num_replicas": 5}
    sized = overlay(plan, base, max_in_flight=40)["applications"][0]
    assert sized["args"]["http"]["max_in_flight"] == 40
    assert sized["args"]["http"]["max_images"] == base["applications"][0]["args"]["http"]["max_images"]
    assert "max_in_flight" not in base["applications"][0]["args"]["http"]
    assert overlay(plan, max_in_flight=40)["applications"][0]["args"] == {"http": {"max_in_flight": 40}}


def test_a_planned_admission_limit_comes_with_model_queues_that_hold_it(tmp_path):
    """The planner sizes a Router's limit up to 255 in flight: the whole config it writes raises each
    model queue to the calls so many requests can have waiting at once (two encodes each), as
    `tandem validate-config` requires, and simulates the plan with those queues."""
    import subprocess
    import sys

    base = yaml.safe_load((ROOT / "serve_config.gpu.yaml").read_text())
    plan = {"Router": 2, "VisionEncoder": 3, "SmallReasoner": 4, "LargeAnswerer": 5}
    whole = overlay(plan, base, max_in_flight=255)
    queued = {d["name"]: d.get("max_queued_requests") for d in whole["applications"][0]["deployments"]}
    assert queued == {"Router": 1024, "VisionEncoder": 510, "SmallReasoner": 256, "LargeAnswerer": 256}

    def validate(config: dict):
        path = tmp_path / "plan.yaml"
        path.write_text(yaml.safe_dump(config))
        return subprocess.run([sys.executable, "-m", "tandem.cli", "validate-config", str(path)],
                              capture_output=True, text=True)

    assert validate(whole).returncode == 0
    unraised = overlay(plan, base)
    unraised["applications"][0]["args"]["http"]["max_in_flight"] = 255
    assert "VisionEncoder max_queued_requests (256)" in validate(unraised).stderr

    planner = Planner(profile(), Workload.mutual(0.3, AGREE), settings(max_ongoing=64, max_queued=8), p95_ms=300,
                      verbose=False)
    sized = planner.settings_for({"Router": 1, "VisionEncoder": 1, "SmallReasoner": 1, "LargeAnswerer": 1}, 200)
    assert sized["Router"].admit == 60  # 200 req/s x 0.3 s
    assert (sized["VisionEncoder"].max_queued, sized["SmallReasoner"].max_queued,
            sized["LargeAnswerer"].max_queued) == (120, 60, 60)


def test_measured_cpu_the_stages_do_not_account_for_loads_shared_cores_only():
    import dataclasses

    p = profile()
    w = Workload.mutual(0.0, AGREE)
    alone = simulate(p, w, {}, settings(), concurrency=8, duration_s=20, host_cores=1)
    busy = dataclasses.replace(p, cpu_ms_per_request=200.0)  # far more than the stages' ~40 ms
    loaded = simulate(busy, w, {}, settings(), concurrency=8, duration_s=20, host_cores=1)
    assert loaded["throughput_rps"] < alone["throughput_rps"] * 0.6
    # one request alone: the extra CPU runs beside it, not on its critical path
    one = simulate(busy, w, {}, settings(), concurrency=1, duration_s=20)  # own devices: not charged
    assert one["p50_ms"] == pytest.approx(1 + 8 + 22, abs=1e-6)


def test_on_shared_cores_a_simulation_reports_the_cpu_it_charged_each_request():
    """One request at a time, the simulation charges a request the profile's measured CPU per request
    (its stages, and the rest beside them) and says so; on own devices it charges no CPU and says
    nothing of it."""
    import dataclasses

    p = dataclasses.replace(profile(), cpu_ms_per_request=200.0)
    one = simulate(p, Workload.mutual(0.0, AGREE), {}, settings(), concurrency=1, duration_s=20, host_cores=2)
    assert one["cpu_ms_per_request"] == pytest.approx(200.0, rel=0.02)
    assert "cpu_ms_per_request" not in simulate(p, Workload.mutual(0.0, AGREE), {}, settings(), concurrency=1,
                                                duration_s=20)


def test_the_open_loop_check_counts_requests_that_end_after_sending_stops():
    """Near saturation the last requests sent queue longest; the measured p50 must count them, as the
    simulator does (its open loop drains), or the comparison sets a censored median against a full one."""
    from benchmarks.sim_check import open_loop_summary

    # (sent, (status, latency_ms, end)) over a 10 s run: warm-up to 1 s, then one request a second whose
    # latency grows by a second each time, the late ones ending after the 10 s window.
    records = [(t, (200, 1000.0 * t, t + t)) for t in range(1, 10)] + [(0.5, (200, 1.0, 0.6))]
    out = open_loop_summary(records, 0.0, 10.0)
    assert out["p50_ms"] == 5000.0  # the median of 1..9 s, not of the four that ended inside the window
    assert out["throughput_rps"] == round(4 / 9, 3)  # completions inside the window (ends at 2, 4, 6, 8 s)


def test_a_load_reports_the_workload_its_answers_carried():
    """Which items transfer is fixed by the items: the check feeds the simulator the paths and stage
    sizes the loads' answers reported (not a smaller sample's), and counts the answers an overloaded
    app gave without the small model."""
    from benchmarks.stage_profile import Traces

    traces = Traces()
    traces.add({"path": "agree", "stages": {"small_direct": {"prompt_tokens": 80, "decode_steps": 2},
                                            "large_direct": {"prompt_tokens": 76, "decode_steps": 2}}})
    traces.add({"path": "transfer", "degraded": False, "stages": {"small_direct": {"prompt_tokens": 84, "decode_steps": 2},
                                               "large_direct": {"prompt_tokens": 78, "decode_steps": 2},
                                               "small_reasoning": {"prompt_tokens": 80, "decode_steps": 40},
                                               "large_transfer": {"prompt_tokens": 150, "decode_steps": 2}}})
    traces.add({"path": "large", "degraded": True, "stages": {"large_direct": {"prompt_tokens": 76, "decode_steps": 2}}})
    w = traces.workload()
    assert w["transfer_rate"] == round(1 / 3, 4) and w["requests"] == 3 and w["degraded"] == 1
    traces = Traces()
    traces.add({"path": "agree", "stages": {"small_direct": {"prompt_tokens": 80, "decode_steps": 2},
                                            "large_direct": {"prompt_tokens": 76, "decode_steps": 2}}})
    traces.add({"path": "transfer", "stages": {"small_direct": {"prompt_tokens": 84, "decode_steps": 2},
                                               "large_direct": {"prompt_tokens": 78, "decode_steps": 2},
                                               "small_reasoning": {"prompt_tokens": 80, "decode_steps": 40},
                                               "large_transfer": {"prompt_tokens": 150, "decode_steps": 2}}})
    w = traces.workload()
    assert w["transfer_rate"] == 0.5 and w["requests"] == 2
    assert w["stages"]["small_direct"] == {"prompt_tokens": 82.0, "decode_steps": 2.0, "n": 2}
    assert w["stages"]["small_reasoning"]["decode_steps"] == 40.0
    sim = Workload.from_measured(w)
    assert dict((name, share) for name, share, _ in sim.paths) == {"agree": 0.5, "transfer": 0.5}


def test_cpu_measured_with_requests_in_flight_is_charged_by_how_many_are_in_flight():
    """One request alone costs the app more CPU than each of eight in flight (batching, loops that
    serve many): a profile that measured both charges a busy app the lower figure."""
    import dataclasses

    w = Workload.mutual(0.0, AGREE)
    alone_only = dataclasses.replace(profile(), cpu_ms_per_request=200.0)
    with_busy = dataclasses.replace(alone_only, cpu_busy=(8, 60.0))
    run = lambda p, c: simulate(p, w, {}, settings(), concurrency=c, duration_s=20, host_cores=1)  # noqa: E731
    assert run(with_busy, 8)["throughput_rps"] > run(alone_only, 8)["throughput_rps"] * 1.5
    assert run(with_busy, 1)["throughput_rps"] == pytest.approx(run(alone_only, 1)["throughput_rps"], rel=1e-6)
    loaded = Profile.from_dict({**profile_dict(), "cpu_ms_per_request": {"Router": 150.0, "proxy": 50.0},
                                "cpu_ms_per_request_busy": {"concurrency": 8, "ms": {"Router": 40.0, "proxy": 20.0}}})
    assert loaded.cpu_busy == (8, 60.0) and loaded.scaled({"small": 2}).cpu_busy == (8, 60.0)


def test_the_cpu_charged_with_requests_in_flight_totals_the_measured_figure_there():
    """With 8 in flight the model loops batch, so a request's share of their work is below its work
    alone: the CPU beside it is the measured figure less that share (as the simulation batches at 8),
    and the simulation charges a request the measured total there — not less by the batching's gain."""
    import dataclasses

    from benchmarks.simulate import Simulation

    w = Workload.mutual(0.0, AGREE)
    p = dataclasses.replace(profile(), cpu_ms_per_request=200.0, cpu_busy=(8, 150.0))
    sim = Simulation(p, w, {}, settings(), host_cores=2)
    alone, busy, count = sim._unaccounted_cpu_s()
    batched = sim._model_ms_per_request(8)
    model_alone = sum(share * (w.images if c.kind == "vision" else 1) * w.call_ms(p, c)
                      for _, share, phases in w.paths for phase in phases for c in phase)
    assert count == 8 and batched < 0.8 * model_alone  # profile(): its calls carry no overheads
    assert alone * 1000 == pytest.approx(200.0 - p.router_ms - model_alone)
    assert busy * 1000 == pytest.approx(150.0 - p.router_ms - batched)
    beside = []
    run = Simulation(p, w, {}, settings(), host_cores=2)
    run._unaccounted_at = lambda n, f=run._unaccounted_at: beside.append(f(n)) or beside[-1]
    r = run.run(concurrency=8, duration_s=30.0, warmup_s=0.0)
    requests = r["completed"] + run.in_flight / 2
    assert p.router_ms + (run.model_ms + sum(beside) * 1000) / requests == pytest.approx(150.0, rel=0.05)


def test_an_open_loop_replays_given_send_times():
    """The check against the app replays the app's own arrivals: the same bursts, so the same queue."""
    p = profile()
    w = Workload.mutual(0.0, AGREE)
    s = settings(max_batch_size=1, max_ongoing=1)
    burst = [1.0 + i * 0.001 for i in range(20)] + [5.0 + i * 0.5 for i in range(10)]
    r = simulate(p, w, {}, s, arrivals=burst, duration_s=10, warmup_s=0)
    assert r["completed"] == 30 and r["rate_rps"] == 3.0
    even = simulate(p, w, {}, s, arrivals=[0.3 * i for i in range(1, 31)], duration_s=10, warmup_s=0)
    assert r["p95_ms"] > 5 * even["p95_ms"]  # the burst queues; the same count spread out does not
    assert simulate(p, w, {}, s, arrivals=burst, duration_s=10, warmup_s=0, seed=7)["p50_ms"] == r["p50_ms"]
    with pytest.raises(ValueError):
        simulate(p, w, {}, s, arrivals=burst, rate=3.0)


def test_the_open_loop_sends_on_its_schedule_even_when_the_client_lags():
    """Each send is due at a fixed time from the start: a client busy between sends (here 3 ms of
    blocking work against a mean gap of 2 ms) sends late, but sends every request the rate scheduled —
    the loop that slept each gap after a send offered 6 % less than its rate near saturation."""
    import asyncio
    import random
    import time

    from benchmarks.client import poisson_sends

    rate, duration, seed = 500.0, 0.2, 4
    rng, due, scheduled = random.Random(seed), 0.0, []
    while due < duration:
        scheduled.append(due)
        due += rng.expovariate(rate)

    async def run():
        start, sent = time.monotonic(), []
        async for _ in poisson_sends(rate, seed, duration):
            sent.append(time.monotonic() - start)
            time.sleep(0.003)
        return sent

    sent = asyncio.run(run())
    assert len(sent) == len(scheduled) > 60
    assert all(s >= t - 1e-3 for s, t in zip(sent, scheduled))  # never early


def test_the_check_compares_a_loads_cpu_with_the_profiles_for_as_many_in_flight():
    """sim_check's speed diagnostic: the profile's CPU per request at 1 in flight, at its busier
    count, linear between and flat beyond — as the simulator charges it."""
    p = Profile.from_dict({**profile_dict(), "cpu_ms_per_request": {"Router": 150.0, "proxy": 50.0},
                           "cpu_ms_per_request_busy": {"concurrency": 8, "ms": {"Router": 100.0, "proxy": 30.0}}})
    assert p.cpu_ms_at(1) == 200.0 and p.cpu_ms_at(8) == 130.0 and p.cpu_ms_at(16) == 130.0
    assert p.cpu_ms_at(4.5) == pytest.approx(200.0 - 70.0 * 3.5 / 7)
    assert profile().cpu_ms_at(4) is None  # no CPU measured (a GPU profile)


def test_a_served_step_overhead_is_added_to_every_decode_step():
    """A served decode loop spends more a step than the engine alone (the replica's event loop and
    its stream share the process): a profile that measured it charges it at every batch size."""
    base = profile_dict()
    served = Profile.from_dict({**base, "served": {"step_overhead_ms": {"small": 1.0, "large": 0.5}}})
    assert served.step["small"](1) == 3.0 and served.step["small"](8) == 5.0 and served.step["large"](8) == 8.5
    assert served.scaled({"small": 1.0}).step_overhead_ms == {"small": 1.0, "large": 0.5}
    # One agreeing request alone: the large direct answer (3 steps) sets the pace, 1.5 ms later.
    agree = simulate(served, Workload.mutual(0.0, AGREE), {}, settings(), concurrency=1, duration_s=20)
    assert agree["p50_ms"] == pytest.approx(1 + 8 + 22 + 3 * 0.5, abs=1e-6)


def test_the_served_step_overhead_is_measured_against_the_engine_curves():
    from benchmarks.stage_profile import served_step_overhead

    gens = profile_dict()["generators"]  # small: prefill 5 ms for 10 tokens, step 2 ms at one row
    decodes = [("small", 10, 20, 5 + 20 * 3.0), ("small", 10, 2, 5 + 2 * 2.0),  # 20 ms over 22 steps
               ("large", 10, 3, 10 + 3 * 4.0 - 1.0)]  # faster than the curves: never below zero
    assert served_step_overhead(decodes, gens) == {"small": round(20 / 22, 3), "large": 0.0}
    assert served_step_overhead([], gens) == {}
    # Measured against the simulator's own prediction: a long prompt's prefill is read off the same
    # curve (by total prompt tokens) the simulator will charge, so a row that decodes exactly as
    # predicted leaves no overhead to add twice.
    sloped = profile_dict(prefill=(5.0, 40.0))
    predicted = Workload.call_ms(Profile.from_dict(sloped), Call("generate", "small", 45, 3))
    assert predicted == pytest.approx(22.5 + 3 * 2.0)
    assert served_step_overhead([("small", 45, 3, predicted)], sloped["generators"]) == {"small": 0.0}


def test_the_check_reads_the_hypervisors_share_of_the_cores():
    """A load that ran while the hypervisor gave 13 % of the time to other guests had 1.74 of the
    machine's 2 cores: the check measures that share (Linux's steal), guest time counted once."""
    from collections import namedtuple

    from benchmarks.sim_check import steal_share

    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
    start = Times(100, 0, 10, 50, 0, 0, 0, 5, 40, 0)
    end = Times(170, 0, 20, 57, 0, 0, 0, 18, 90, 0)  # 100 s of CPU time, 13 stolen; guest inside user
    assert steal_share(start, end) == 0.13
    assert steal_share(start, start) is None
    assert steal_share(namedtuple("T", "user idle")(1, 1), namedtuple("T", "user idle")(2, 2)) is None


def test_the_check_simulates_each_load_on_the_cores_the_hypervisor_left_it():
    """A saved run (benchmarks/runs/) re-simulated: the same load measured with 30 % of the CPU time
    stolen runs on 1.4 of the 2 cores, and the simulated app completes less."""
    import copy

    from benchmarks.sim_check import compare

    profile, c16 = saved_run("run31", 16)
    quiet, stolen = copy.deepcopy(c16), copy.deepcopy(c16)
    quiet["measured"]["steal"], stolen["measured"]["steal"] = 0.0, 0.3
    cfg = settings_from_config(ROOT / "serve_config.yaml")
    rows = compare(profile, [quiet, stolen], cfg, 20.0, 2, 0.25)
    assert [r["host_cores"] for r in rows] == [2, 1.4]
    assert rows[1]["simulated"]["throughput_rps"] < rows[0]["simulated"]["throughput_rps"] * 0.85


def test_the_check_counts_the_cores_the_machines_other_processes_kept_busy():
    """The machine's busy CPU less the app's processes' over a span, per second: Ray's own daemons,
    which the app's threads cannot use. Never below zero (the readings are not taken at one instant)."""
    from benchmarks.cpu_per_request import others_cores

    app_before, app_after = {"Router": 10.0, "proxy": 5.0}, {"Router": 22.0, "proxy": 8.0}  # 15 s of the app's
    assert others_cores(100.0, 118.0, app_before, app_after, 10.0) == 0.3  # 18 s busy over 10 s
    assert others_cores(100.0, 110.0, app_before, app_after, 10.0) == 0.0
    assert others_cores(100.0, 118.0, app_before, app_after, 0.0) == 0.0


def test_the_app_shares_the_cores_its_profile_found_ray_did_not_keep_busy():
    """A profile that measured 0.6 cores of Ray's own processes leaves the app's threads 1.4 of 2: the
    same load simulated from it completes less than from the same profile without the figure."""
    import copy

    from benchmarks.sim_check import compare

    bare, c16 = saved_run("run34", 16)
    busy = copy.deepcopy(bare)
    busy["cpu_ms_per_request_busy"]["others_cores"] = 0.6
    assert Profile.from_dict(busy).others_cores == 0.6 and Profile.from_dict(bare).others_cores == 0.0
    c16["measured"]["steal"] = 0.0
    cfg = settings_from_config(ROOT / "serve_config.yaml")
    [alone] = compare(bare, [copy.deepcopy(c16)], cfg, 20.0, 2, 0.25)
    [shared] = compare(busy, [copy.deepcopy(c16)], cfg, 20.0, 2, 0.25)
    assert (alone["app_cores"], shared["app_cores"]) == (2, 1.4)
    assert shared["simulated"]["throughput_rps"] < alone["simulated"]["throughput_rps"] * 0.85


def shared(host_cores: float = 2, **kw):
    """A simulation of the test profile on shared cores (one replica a pool: six event loops)."""
    from benchmarks.simulate import Simulation

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


def test_shared_cores_share_among_everything_running_and_never_do_more_than_the_cores():
    """Processor sharing: 4 model loops' 1 s each on 2 cores all end at 2 s; 2 model loops and 12
    requests' overheads (on the 6 event loops: 6 threads) — 8 threads at a quarter core each, an
    overhead at half its loop's — the loops end at 4 s, the overheads, then 6 threads at a third,
    at 7 s: 14 s of work in 7 s on 2 cores."""
    assert shared().cores.loops == 6  # the client's and the proxy's, and one per replica
    assert run_on_cores(shared(), [(0, 1.0, "model")] * 4) == pytest.approx([2.0] * 4)
    ends = run_on_cores(shared(), [(0, 1.0, "model")] * 2 + [(0, 1.0, "overhead")] * 12)
    assert ends[:2] == pytest.approx([4.0] * 2) and ends[2:] == pytest.approx([7.0] * 12)


def test_work_slows_when_more_starts_after_it_and_speeds_up_when_that_ends():
    """On one core: A (1 s of work) alone from 0; B (1 s) from 0.5 — A's last half at half a core ends
    at 1.5 (not at 1.0, as when a start fixed its speed), B's last half alone ends at 2.0."""
    assert run_on_cores(shared(host_cores=1), [(0.0, 1.0, "model"), (0.5, 1.0, "other")]) == pytest.approx([1.5, 2.0])


def test_a_closed_loop_at_saturation_gets_the_cores_work_done_and_no_more():
    from benchmarks.simulate import Simulation

    p = profile(router=3.0)
    sim = Simulation(p, Workload.mutual(0.5, AGREE), {}, settings(), host_cores=1)
    given, run = [0.0], sim.cores.run

    def counted(work_s, cls, done):
        given[0] += work_s
        run(work_s, cls, done)
    sim.cores.run = counted
    sim.run(concurrency=16, duration_s=30, warmup_s=0)
    sim.cores._advance()
    left = sum(end - sim.cores.served[c] for c in sim.cores.CLASSES for end, _, _ in sim.cores.due[c])
    assert 0.95 <= (given[0] - left) / sim.env.now <= 1.0 + 1e-9  # a core's work per second, at most
    own = simulate(p, Workload.mutual(0.5, AGREE), {}, settings(), concurrency=16, duration_s=30)
    assert own["throughput_rps"] > 1.5 * sim.summary(None, 16, 30, 0, 0)["throughput_rps"]  # four loops, one core


def test_a_machine_measured_slower_slows_work_on_shared_cores_from_that_moment():
    """The canary's slowdown per step (the last holds on) divides every activity's speed on shared
    cores from the step it was measured in, mid-activity too; on own devices it means nothing."""
    ends = run_on_cores(shared(slower=[1.0, 2.0], slower_step_s=1.0), [(0, 1.5, "model"), (3.0, 1.0, "overhead")])
    assert ends == pytest.approx([2.0, 5.0])  # 1 s at full speed, the last 0.5 s at half; 2x after
    p, w = profile(), Workload.mutual(0.0, AGREE)
    base = simulate(p, w, {}, settings(), concurrency=1, duration_s=20, host_cores=2)
    slow = simulate(p, w, {}, settings(), concurrency=1, duration_s=20, host_cores=2, slower=[2.0])
    assert slow["p50_ms"] == pytest.approx(2 * base["p50_ms"], rel=0.02)
    assert slow["throughput_rps"] == pytest.approx(base["throughput_rps"] / 2, rel=0.05)
    own = simulate(p, w, {}, settings(), concurrency=1, duration_s=20)
    own_slower = simulate(p, w, {}, settings(), concurrency=1, duration_s=20, slower=[3.0])
    assert (own_slower["p50_ms"], own_slower["throughput_rps"]) == (own["p50_ms"], own["throughput_rps"])


def test_the_model_loops_work_takes_the_model_units_speed_and_the_rest_the_python_units():
    """Given both, the model loops' work is slowed by the canary's model unit and the overheads (and
    the CPU beside each request) by its Python unit; given one, it slows everything."""
    both = shared(slower=[1.0], slower_model=[2.0]).cores.rates()
    assert (both["model"], both["other"], both["overhead"]) == (0.5, 1.0, 1.0)
    one = shared(slower=[1.5]).cores.rates()
    assert (one["model"], one["other"], one["overhead"]) == pytest.approx((1 / 1.5,) * 3)
    p, w = profile(), Workload.mutual(0.0, AGREE)
    base = simulate(p, w, {}, settings(), concurrency=1, duration_s=20, host_cores=2)
    model_slow = simulate(p, w, {}, settings(), concurrency=1, duration_s=20, host_cores=2,
                          slower=[1.0], slower_model=[2.0])
    all_slow = simulate(p, w, {}, settings(), concurrency=1, duration_s=20, host_cores=2, slower=[2.0])
    # the profile's Router and call overheads are not the model's: only part of the latency doubles
    assert base["p50_ms"] * 1.2 < model_slow["p50_ms"] < all_slow["p50_ms"]


def test_a_paired_timing_takes_each_repeats_difference_back_to_back():
    """The steps' cost comes from each repeat's long run less its short one, the two timed back to back:
    a machine that slows between repeats moves both sides of a pair alike."""
    from benchmarks import latency_profile

    clock, calls, speed = [0.0], [], [1.0]

    def work(ms, name):
        def fn():
            calls.append(name)
            clock[0] += ms * speed[0] / 1000
            if name == "long":
                speed[0] *= 2  # the machine halves its speed after every pair
        return fn

    real = latency_profile.time.perf_counter
    latency_profile.time.perf_counter = lambda: clock[0]
    try:
        short, diff = latency_profile.paired_ms(work(10, "short"), work(30, "long"), "cpu", repeats=3)
    finally:
        latency_profile.time.perf_counter = real
    assert calls == ["short", "long"] * 4  # a warm-up pair, then three
    assert short == pytest.approx(10 * 4) and diff == pytest.approx(20 * 4)  # the middle pair's speed


def test_the_canary_windows_its_samples_and_carries_a_gap_forward():
    from benchmarks.machine_speed import mean_ms, slower, window_means

    samples = [(10.0, 4.0), (10.5, 6.0), (11.2, 10.0), (13.1, 8.0)]
    assert mean_ms(samples, 10.0, 11.0) == 5.0 and mean_ms(samples, 20.0, 21.0) is None
    assert window_means(samples, 10.0, 13.5, 1.0) == [5.0, 10.0, None, 8.0]
    assert slower([5.0, 10.0, None, 8.0], 5.0) == [1.0, 2.0, 2.0, 1.6]
    assert slower([None, 2.5], 5.0) == [1.0, 0.5]  # before any sample: the profile's speed


def test_the_canary_process_reports_the_cpu_time_of_its_unit():
    import time

    from benchmarks.machine_speed import Canary

    with Canary(interval_s=0.05) as canary:
        start = time.monotonic()
        time.sleep(0.6)
        end = time.monotonic()
    inside = [ms for t, ms in canary.samples if start <= t < end]
    assert inside and all(ms > 0 for ms in inside)
    assert canary.mean_ms(start, end) == pytest.approx(sum(inside) / len(inside), abs=1e-3)


def test_the_canary_times_a_model_unit_in_turn_with_its_python_unit():
    """Given a checkpoint, the canary also times the app's kind of work — a model built from its
    config, at one thread — alternating with the Python loop; each unit's samples are kept apart."""
    import time

    from benchmarks.machine_speed import Canary

    with Canary(interval_s=0.05, checkpoint=str(ROOT / "tandem" / "trained" / "small")) as canary:
        start = time.monotonic()
        time.sleep(0.8)
        end = time.monotonic()
    py = [ms for t, ms in canary.samples if start <= t < end]
    model = [ms for t, ms in canary.torch_samples if start <= t < end]
    assert py and model and all(ms > 0 for ms in py + model)
    assert abs(len(py) - len(model)) <= 1  # in turn
    assert canary.mean_ms(start, end, "torch") == pytest.approx(sum(model) / len(model), abs=1e-3)


def test_the_check_simulates_each_load_at_the_speed_its_canary_measured():
    """A saved run's closed loop at 16, measured while the canary's unit took twice its time while
    profiling, is simulated on a machine twice as slow (and, beside it, at the profile's speed); a load
    without canary figures (a run before the canary) is simulated as before."""
    import copy

    from benchmarks.sim_check import compare

    prof, c16 = saved_run("run35", 16)
    cfg = settings_from_config(ROOT / "serve_config.yaml")
    [before] = compare(copy.deepcopy(prof), [copy.deepcopy(c16)], cfg, 20.0, 2, 0.25)
    prof["source"]["canary_ms"] = 5.0
    slow = copy.deepcopy(c16)
    slow["measured"].update(canary_ms=10.0, canary_ms_windows=[10.0] * 10)
    [unmeasured, measured] = compare(prof, [copy.deepcopy(c16), slow], cfg, 20.0, 2, 0.25, elasticity=1.0)
    assert unmeasured["machine_slower"] is None and "simulated_profile_speed" not in unmeasured
    assert unmeasured["simulated"]["throughput_rps"] == before["simulated"]["throughput_rps"]
    assert measured["machine_slower"] == 2.0
    assert measured["simulated_profile_speed"]["throughput_rps"] == before["simulated"]["throughput_rps"]
    assert measured["simulated"]["throughput_rps"] < before["simulated"]["throughput_rps"] * 0.6


def test_the_check_runs_the_app_at_the_canarys_slowdown_to_the_power_of_its_elasticity():
    """A load whose canary read the machine 4x slower, taken at elasticity 0.5, is simulated exactly as
    one read 2x slower taken one for one — and by default (0.73) between 1x and 4x."""
    import copy

    from benchmarks.sim_check import compare

    prof, c16 = saved_run("run35", 16)
    cfg = settings_from_config(ROOT / "serve_config.yaml")
    prof["source"]["canary_ms"] = 5.0

    def at(ms: float, **kw) -> dict:
        load = copy.deepcopy(c16)
        load["measured"].update(canary_ms=ms, canary_ms_windows=[ms] * 10)
        [row] = compare(copy.deepcopy(prof), [load], cfg, 20.0, 2, 0.25, **kw)
        return row

    half, whole = at(20.0, elasticity=0.5), at(10.0, elasticity=1.0)
    assert half["simulated"] == whole["simulated"]
    assert half["machine_slower"] == 4.0  # the canary's own reading, as reported
    default, alone = at(20.0), at(5.0)
    assert (at(20.0, elasticity=1.0)["simulated"]["throughput_rps"] < default["simulated"]["throughput_rps"]
            < alone["simulated"]["throughput_rps"])


def test_the_elasticity_fit_finds_the_power_the_apps_cpu_moved_by():
    """Loads whose CPU per request went as the canary's slowdown to the 0.6 give 0.6 (r = 1); loads
    without a canary reading are left out; too few loads is an error, not a number."""
    from benchmarks.sim_check import fit_elasticity

    points = [{"machine_slower": s, "cpu_vs_profile": s ** 0.6} for s in (0.7, 0.9, 1.0, 1.3, 1.8)]
    points.append({"machine_slower": None, "cpu_vs_profile": 1.5})
    assert fit_elasticity(points) == {"elasticity": 0.6, "r": 1.0, "loads": 5}
    with pytest.raises(ValueError):
        fit_elasticity(points[:2])


def test_the_check_runs_the_model_loops_at_the_model_units_speed_when_asked():
    """A load whose Python unit ran at the profile's speed while its model unit took twice as long is,
    asked to (`model_unit="torch"`), simulated slower than at the profile's speed throughout; by
    default the check takes the Python unit's speed for the model loops too."""
    import copy

    from benchmarks.sim_check import compare

    prof, c16 = saved_run("run35", 16)
    cfg = settings_from_config(ROOT / "serve_config.yaml")
    prof["source"].update(canary_ms=5.0, canary_torch_ms=8.0)
    c16["measured"].update(canary_ms=5.0, canary_ms_windows=[5.0] * 10,
                           canary_torch_ms=16.0, canary_torch_ms_windows=[16.0] * 10)
    [model_slow] = compare(copy.deepcopy(prof), [copy.deepcopy(c16)], cfg, 20.0, 2, 0.25, model_unit="torch")
    [py_only] = compare(copy.deepcopy(prof), [copy.deepcopy(c16)], cfg, 20.0, 2, 0.25)
    assert model_slow["machine_slower"] == 1.0 and model_slow["machine_slower_torch"] == 2.0
    assert py_only["machine_slower_torch"] == 2.0  # reported beside, not applied
    assert py_only["simulated"]["throughput_rps"] == py_only["simulated_profile_speed"]["throughput_rps"]
    # The model loops' work is under half the app's CPU at 16 (the rest: overheads, Serve), so
    # doubling it alone costs well under half the throughput (0.85x since the cores are shared as
    # processor sharing; 0.8x was asked of the model before it, which over-delivered work).
    assert model_slow["simulated"]["throughput_rps"] < py_only["simulated"]["throughput_rps"] * 0.9


def test_the_check_also_runs_each_load_at_the_speed_its_own_cpu_says_it_ran():
    """Beside the check, a load is simulated at its measured CPU per request over what the simulation
    charges a request of it at the profile's speed: a load that spent just that is simulated as at the
    profile's speed; one that spent twice that, as on a machine twice as slow — and neither changes the
    check's own figures."""
    import copy

    from benchmarks.sim_check import compare

    prof, c16 = saved_run("run35", 16)
    cfg = settings_from_config(ROOT / "serve_config.yaml")
    [first] = compare(copy.deepcopy(prof), [copy.deepcopy(c16)], cfg, 20.0, 2, 0.25)
    charged = c16["measured"]["cpu_ms_per_request"] / first["speed_given_cpu"]

    def spent(ms: float) -> dict:
        load = copy.deepcopy(c16)
        load["measured"]["cpu_ms_per_request"] = ms
        [row] = compare(copy.deepcopy(prof), [load], cfg, 20.0, 2, 0.25)
        return row

    same, twice = spent(charged), spent(2 * charged)
    assert same["speed_given_cpu"] == pytest.approx(1.0, abs=1e-3)
    assert same["simulated_given_cpu"]["throughput_rps"] == pytest.approx(same["simulated"]["throughput_rps"], rel=0.01)
    assert twice["speed_given_cpu"] == pytest.approx(2.0, abs=1e-3)
    assert twice["simulated_given_cpu"]["throughput_rps"] < 0.6 * twice["simulated"]["throughput_rps"]
    assert twice["simulated"] == same["simulated"] == first["simulated"]
    assert twice["given_cpu_errors"][0] == pytest.approx(
        twice["simulated_given_cpu"]["throughput_rps"] / c16["measured"]["throughput_rps"] - 1, abs=1e-3)


def test_a_profile_measured_under_steal_is_taken_as_that_much_longer_than_its_work():
    """The profile's times are wall times: measured while the hypervisor gave 25 % of the CPU time to
    other guests, they are a third longer than the work: its stages are taken at three quarters of them,
    and a load on unstolen cores runs faster (not by all of it: the batch waits and the CPU the stages
    do not account for, CPU time, are not wall times)."""
    import copy

    from benchmarks.sim_check import compare

    prof, c1 = saved_run("run35", 1)
    c1["measured"]["steal"] = 0.0
    cfg = settings_from_config(ROOT / "serve_config.yaml")
    quiet, stolen = copy.deepcopy(prof), copy.deepcopy(prof)
    quiet["source"]["steal"], stolen["source"]["steal"] = 0.0, 0.25
    [a] = compare(quiet, [copy.deepcopy(c1)], cfg, 20.0, 2, 0.25)
    [b] = compare(stolen, [copy.deepcopy(c1)], cfg, 20.0, 2, 0.25)
    assert b["simulated"]["p50_ms"] < 0.95 * a["simulated"]["p50_ms"]
    assert b["simulated"]["throughput_rps"] > a["simulated"]["throughput_rps"] * 1.05


def test_a_503_is_told_apart_by_where_it_was_turned_away():
    """sim_check counts each load's 503s by where they came from, from the bodies the app sends: the
    Router's door (its admission limit), a model deployment's queue passed on by the Router, Serve's
    proxy (the Router's own queue, plain text)."""
    from ray.serve.exceptions import BackPressureError

    from benchmarks.sim_check import turned_away_by
    from tandem.admission import Admission
    from tandem.errors import Overloaded

    gate = Admission(1)
    gate.enter()
    with pytest.raises(Overloaded) as door:
        gate.enter()
    assert turned_away_by(json.dumps(door.value.to_openai())) == "door"
    refusal = BackPressureError(num_queued_requests=32, max_queued_requests=32).message
    router = (ROOT / "deployments" / "router.py").read_text()
    assert 'Overloaded(f"a model deployment is at capacity: {err}"' in router  # the Router passes it on so
    model = Overloaded(f"a model deployment is at capacity: {refusal}")
    assert turned_away_by(json.dumps(model.to_openai())) == "model_queue"
    assert turned_away_by(refusal) == "proxy"
    assert turned_away_by("upstream connect error") == "other"


def test_a_saved_run_is_resimulated_with_the_settings_it_measured():
    """Runs since 62 record their pools' settings; the runs before take the serve config they ran
    (kept beside them), not today's, whose model deployments take more at once since session 32."""
    from benchmarks.sim_check import run_settings

    runs = ROOT / "benchmarks" / "runs"
    before = run_settings(json.loads((runs / "sim-check-2026-12-04" / "run61" / "sim_check.json").read_text()))
    assert (before["VisionEncoder"].max_ongoing, before["VisionEncoder"].max_queued) == (16, 32)
    assert before["Router"].admit == 24
    recorded = json.loads((runs / "sim-check-2026-12-04" / "run62" / "sim_check.json").read_text())
    assert run_settings(recorded)["VisionEncoder"] == PoolSettings(**recorded["settings"]["VisionEncoder"])
    assert settings_from_config(ROOT / "serve_config.yaml")["VisionEncoder"].max_ongoing == 48 == \
        run_settings(recorded)["VisionEncoder"].max_ongoing
