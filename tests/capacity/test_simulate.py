"""The cluster simulator (capacity/simulate.py, capacity/pools.py): latencies where the arithmetic is
known, batching, queue limits, admission, shared cores and the CPU they charge."""

from __future__ import annotations


import pytest
import yaml

from capacity.profile import (ROOT, Curve, Profile, Workload, parse_replicas, settings_from_config)
from capacity.simulate import simulate
from tests.capacity.helpers import AGREE, profile, profile_dict, run_on_cores, settings, shared


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
    # Each stage call's time from its send to its end, named as the app's trace names them.
    assert transfer["stage_ms"] == {"encode_large": 8.0, "encode_small": 8.0, "large_direct": 22.0,
                                    "large_transfer": 22.0, "small_direct": 11.0, "small_reasoning": 45.0}
    # Closed loop: throughput is concurrency over latency (Little's law).
    assert agree["throughput_rps"] == pytest.approx(1000 / 31, rel=0.02)


def test_a_replayed_run_sends_each_request_on_the_path_it_took():
    """A check replays a measured open loop on the same requests: each send on the path its request
    took, drawn only where that is unknown (a request turned away), as a run without paths draws."""
    from capacity.simulate import Simulation

    p, w = profile(), Workload.mutual(0.3, AGREE)
    arrivals = [0.1 * i for i in range(40)]
    paths = ["transfer" if i % 4 == 0 else "agree" for i in range(40)]
    sim = Simulation(p, w, {}, settings())
    sim.run(duration_s=4.0, warmup_s=0.0, arrivals=arrivals, paths=paths)
    assert [path for _, _, path in sorted(sim.latencies)] == paths
    drawn = simulate(p, w, {}, settings(), duration_s=4.0, warmup_s=0.0, arrivals=arrivals)
    unknown = simulate(p, w, {}, settings(), duration_s=4.0, warmup_s=0.0, arrivals=arrivals, paths=[None] * 40)
    assert {k: v for k, v in unknown.items() if k != "wall_s"} == {k: v for k, v in drawn.items() if k != "wall_s"}
    assert set(drawn["paths"]) == {"agree", "transfer"} and drawn["paths"] != {"agree": 30, "transfer": 10}
    with pytest.raises(ValueError, match="39 paths for 40 arrivals"):
        simulate(p, w, {}, settings(), duration_s=4.0, arrivals=arrivals, paths=paths[1:])


def test_a_simulation_asked_to_logs_every_stage_call_under_its_requests_arrival():
    from capacity.simulate import Simulation

    p = profile()
    sim = Simulation(p, Workload.mutual(0.5, AGREE), {}, settings())
    sim.calls = []
    sim.run(duration_s=2.0, warmup_s=0.0, arrivals=[0.0, 1.0], paths=["transfer", "agree"])
    by_request = {t: sorted((stage, round(s * 1000, 6)) for a, stage, s in sim.calls if a == t) for t in (0.0, 1.0)}
    # One at a time, each call takes what it takes alone (test_one_request_at_a_time_takes_exactly_the_sum_of_its_stages).
    assert by_request[1.0] == [("encode_large", 8.0), ("encode_small", 8.0), ("large_direct", 22.0), ("small_direct", 11.0)]
    assert by_request[0.0] == sorted(by_request[1.0] + [("large_transfer", 22.0), ("small_reasoning", 45.0)])
    assert Simulation(p, Workload.mutual(1.0, AGREE), {}, settings()).calls is None  # not unless asked


def test_batch_wait_adds_latency_when_a_batch_cannot_fill():
    p = profile()
    no_wait = simulate(p, Workload.mutual(0.0, AGREE), {}, settings(), concurrency=1, duration_s=20)
    wait = simulate(p, Workload.mutual(0.0, AGREE), {}, settings(batch_wait_s=0.01, batch_wait_mode="always"),
                    concurrency=1, duration_s=20)
    # One request cannot fill any batch: the vision batch and each decode loop wait their 10 ms.
    assert wait["p50_ms"] == pytest.approx(no_wait["p50_ms"] + 20, abs=1e-6)
    # Adaptive waits (the app's default): a lone request's decode stages start at once; its two
    # encodes reach the VisionEncoder together (closer than the wait), so that batch still waits.
    adaptive = simulate(p, Workload.mutual(0.0, AGREE), {}, settings(batch_wait_s=0.01), concurrency=1, duration_s=20)
    assert adaptive["p50_ms"] == pytest.approx(no_wait["p50_ms"] + 10, abs=1e-6)


def test_a_vision_batch_takes_every_call_that_queued_while_the_last_one_ran():
    """The VisionEncoder's batcher (tandem/batcher.py): a batch forms when the towers come free, from
    every call waiting (up to 8). Requests 10 ms apart against batches of 80 ms and more: batches of
    2, 8, 8, 8, 8 and 6 calls — not one request's pair each, as `@serve.batch` would run them."""
    p = profile(vision=(40.0, 96.0))
    arrivals = [0.01 * i for i in range(20)]
    run = simulate(p, Workload.mutual(0.0, AGREE), {}, settings(batch_wait_s=0.005, batch_wait_mode="always"),
                   arrivals=arrivals, duration_s=2.0, warmup_s=0.0)
    assert run["pools"]["VisionEncoder"]["mean_batch"] == round(40 / 6, 2) and run["completed"] == 20
    # The first pair waits its 5 ms (sent at 1 ms) and runs 40 + 40 ms; four pairs then run as
    # 2 x 64 ms from 86 ms, and so on: the encodes take 339.6 ms on average.
    assert run["stage_ms"]["encode_small"] == pytest.approx(339.6, abs=0.05)


def test_adaptive_waits_batch_a_model_servers_stages_when_other_requests_are_in_flight():
    p = profile()
    w = Workload.mutual(0.0, AGREE)
    alone = simulate(p, w, {}, settings(batch_wait_s=0.01), concurrency=1, duration_s=20)
    busy = simulate(p, w, {}, settings(batch_wait_s=0.01), concurrency=8, duration_s=20)
    assert alone["pools"]["LargeAnswerer"]["mean_batch"] == pytest.approx(1.0)
    assert busy["pools"]["LargeAnswerer"]["mean_batch"] > 2


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
    step-at-a-time run's (to float rounding), and its utilisation and batch figures too, in a
    fraction of the events."""
    from capacity.simulate import Simulation

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
        assert len(lat) == 3 and lat == pytest.approx(lat_steps, abs=1e-9)
        for name, (batches, rows, busy_s, queued_s) in pools.items():
            assert (batches, rows) == pools_steps[name][:2]  # steps and rows in them, counted alike
            assert [busy_s, *queued_s] == pytest.approx([pools_steps[name][2], *pools_steps[name][3]], abs=1e-9)
        assert events_coasting < events_steps / 3
        small = pools["SmallReasoner"]
        mean_batch.append(small[1] / small[0])
    # the short answers were decoded beside the reasoning where the batch had room, after it where not
    assert mean_batch[1] == 1.0 < mean_batch[0]


def test_a_simulation_leaves_no_reference_cycles():
    """The cyclic collector is off while a simulation runs: a run must make no cycles, or its garbage
    would pile up — coasting loops woken early and shared cores alike."""
    import gc

    from capacity.simulate import Simulation

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

    from capacity.simulate import Simulation

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


def test_a_deployment_routed_by_stage_affinity_says_so_in_its_settings(tmp_path):
    """The simulator routes where the config says the app does: serve_config.yaml's model servers use
    the StageAffinityRouter at its own default queue bound, which a config's kwargs override."""
    import inspect

    from capacity.profile import AFFINITY_QUEUE
    from deployments.affinity_router import StageAffinityRouter

    default = inspect.signature(StageAffinityRouter.initialize_state).parameters["max_queued_for_affinity"].default
    assert AFFINITY_QUEUE == default
    s = settings_from_config(ROOT / "serve_config.yaml")
    assert {name: x.affinity_queue for name, x in s.items()} == {
        "Router": None, "VisionEncoder": None, "SmallReasoner": default, "LargeAnswerer": default}
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    for d in cfg["applications"][0]["deployments"]:
        if d["name"] == "SmallReasoner":
            d["request_router_config"]["request_router_kwargs"] = {"max_queued_for_affinity": 3}
        if d["name"] == "LargeAnswerer":
            del d["request_router_config"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    s = settings_from_config(tmp_path / "c.yaml")
    assert (s["SmallReasoner"].affinity_queue, s["LargeAnswerer"].affinity_queue) == (3, None)


def _follow_ups(affinity_queue):
    """Every transferring request at 12 in flight on three replicas a model pool: for each later call
    in a pool, the replica its earlier call ran on, what that replica held then, and where it went."""
    from capacity.simulate import Simulation

    pools = settings(max_ongoing=8)
    for name in ("SmallReasoner", "LargeAnswerer"):
        pools[name].affinity_queue = affinity_queue
    sim = Simulation(profile(), Workload.mutual(1.0, AGREE), {"SmallReasoner": 3, "LargeAnswerer": 3}, pools, seed=1)
    seen, first = [], {}
    for pool in (sim.pools["SmallReasoner"], sim.pools["LargeAnswerer"]):
        def submit(job, pool=pool, inner=pool.submit):
            earlier = first.get((pool.name, job.request))
            held = earlier.ongoing if earlier is not None else None
            ok = inner(job)
            if earlier is None:
                first[(pool.name, job.request)] = job.replica
            elif job.replica is not None:
                seen.append((earlier, held, job.replica))
            return ok
        pool.submit = submit
    sim.run(concurrency=12, duration_s=3.0, warmup_s=0.0)
    return seen


def test_a_later_call_goes_to_the_replica_that_ran_the_requests_earlier_one_while_it_is_not_too_busy():
    """The StageAffinityRouter as the app runs it: the reasoning follows the small model's direct
    answer, the transfer the large one's, onto the same replica, unless that replica holds more than
    the bound; then (and without affinity) the power of two choices decides."""
    bound = _follow_ups(affinity_queue=2)
    assert len(bound) > 100
    assert all(went is earlier for earlier, held, went in bound if held <= 2)
    busy = [went is earlier for earlier, held, went in bound if held > 2]
    assert 0 < sum(busy) < len(busy)  # past the bound, the default choice: sometimes the same replica
    assert all(went is earlier for earlier, _, went in _follow_ups(affinity_queue=8))  # 8 at most, and room
    free = _follow_ups(affinity_queue=None)
    assert 0 < sum(went is earlier for earlier, _, went in free) < len(free)


def test_replica_counts_are_parsed_strictly():
    assert parse_replicas("VisionEncoder=1, LargeAnswerer=3") == {"VisionEncoder": 1, "LargeAnswerer": 3}
    for bad in ("Vision=1", "LargeAnswerer=0", "LargeAnswerer=x"):
        with pytest.raises(Exception):
            parse_replicas(bad)


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

    from capacity.simulate import Simulation

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
    from capacity.simulate import Simulation

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


def test_with_model_waits_only_the_apps_own_work_shares_the_cores():
    """The paced engine's model work is a wait: on shared cores it takes its time however many loops
    run at once, while the Router's work and the calls' hops share the cores and stretch under load."""
    import dataclasses

    from capacity.simulate import Simulation

    p = dataclasses.replace(profile(), call_ms={"encode": 20.0, "generate": 30.0})
    w = Workload.mutual(0.0, AGREE)
    run = lambda c, **kw: simulate(p, w, {}, settings(), concurrency=c, duration_s=30, **kw)  # noqa: E731
    own, paced, cpu = run(1), run(1, host_cores=1, model_waits=True), run(1, host_cores=1)
    # alone: the two towers' hops, then the two models' hops, overlap on one core, each pair at half
    # speed (one hop's time more); the model work does not stretch
    assert own["p50_ms"] < paced["p50_ms"] < cpu["p50_ms"]
    assert paced["p50_ms"] - own["p50_ms"] == pytest.approx(20.0 + 30.0, rel=0.02)
    assert run(1, host_cores=4, model_waits=True)["p50_ms"] == pytest.approx(own["p50_ms"], rel=1e-6)
    # under load the hops queue for the core, so the paced run is slower than on own devices
    assert run(8, host_cores=1, model_waits=True)["p50_ms"] > run(8)["p50_ms"] * 1.1
    sim = Simulation(p, w, {}, settings(), host_cores=1, model_waits=True)
    sim.run(concurrency=4, duration_s=20.0, warmup_s=0.0)
    # the cores were charged the Router and the hops only: 2 encode and 2 generate calls a request
    started = len(sim.arrivals) + sim.in_flight
    per_request_ms = p.router_ms + 2 * 20.0 + 2 * 30.0
    assert sim.cores.work_s * 1000 == pytest.approx(started * per_request_ms, rel=0.05)
    assert sim.model_ms > 0
