"""The simulator against the real app (capacity/sim_check.py, stage_profile.py, machine_speed.py,
cpu_per_request.py): what a load measured, and how the check re-simulates it."""

from __future__ import annotations

import json

import pytest

from capacity.profile import ROOT, Call, Profile, Workload
from tests.capacity.helpers import profile, profile_dict, saved_run, saved_run_settings


def test_the_open_loop_check_counts_requests_that_end_after_sending_stops():
    """Near saturation the last requests sent queue longest; the measured p50 must count them, as the
    simulator does (its open loop drains), or the comparison sets a censored median against a full one."""
    from capacity.sim_check import open_loop_summary

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
    from capacity.stage_profile import Traces

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


def test_a_load_reports_each_stage_calls_mean_time_from_the_traces():
    """What the paced check sets beside the simulation's `stage_ms`: the Router's per-stage times, the
    total and the selector (not calls) left out."""
    from capacity.stage_profile import Traces

    traces = Traces()
    traces.add({"path": "agree", "latency_ms": {"encode_small": 30.0, "small_direct": 100.0, "total": 140.0}})
    traces.add({"path": "transfer", "latency_ms": {"encode_small": 50.0, "small_direct": 200.0,
                                                   "small_reasoning": 900.0, "selector": 0.1, "total": 1300.0}})
    assert traces.stage_means() == {"encode_small": 40.0, "small_direct": 150.0, "small_reasoning": 900.0}


def test_the_check_compares_a_loads_cpu_with_the_profiles_for_as_many_in_flight():
    """sim_check's speed diagnostic: the profile's CPU per request at 1 in flight, at its busier
    count, linear between and flat beyond — as the simulator charges it."""
    p = Profile.from_dict({**profile_dict(), "cpu_ms_per_request": {"Router": 150.0, "proxy": 50.0},
                           "cpu_ms_per_request_busy": {"concurrency": 8, "ms": {"Router": 100.0, "proxy": 30.0}}})
    assert p.cpu_ms_at(1) == 200.0 and p.cpu_ms_at(8) == 130.0 and p.cpu_ms_at(16) == 130.0
    assert p.cpu_ms_at(4.5) == pytest.approx(200.0 - 70.0 * 3.5 / 7)
    assert profile().cpu_ms_at(4) is None  # no CPU measured (a GPU profile)


def test_the_served_step_overhead_is_measured_against_the_engine_curves():
    from capacity.stage_profile import served_step_overhead

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

    from capacity.sim_check import steal_share

    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
    start = Times(100, 0, 10, 50, 0, 0, 0, 5, 40, 0)
    end = Times(170, 0, 20, 57, 0, 0, 0, 18, 90, 0)  # 100 s of CPU time, 13 stolen; guest inside user
    assert steal_share(start, end) == 0.13
    assert steal_share(start, start) is None
    assert steal_share(namedtuple("T", "user idle")(1, 1), namedtuple("T", "user idle")(2, 2)) is None


def test_the_check_simulates_each_load_on_the_cores_the_hypervisor_left_it():
    """A saved run (the fixture) re-simulated: the same load measured with 30 % of the CPU time
    stolen runs on 1.4 of the 2 cores, and the simulated app completes less."""
    import copy

    from capacity.sim_check import compare

    profile, c16 = saved_run(16)
    quiet, stolen = copy.deepcopy(c16), copy.deepcopy(c16)
    quiet["measured"]["steal"], stolen["measured"]["steal"] = 0.0, 0.3
    cfg = saved_run_settings()
    rows = compare(profile, [quiet, stolen], cfg, 20.0, 2, 0.25)
    assert [r["host_cores"] for r in rows] == [2, 1.4]
    assert rows[1]["simulated"]["throughput_rps"] < rows[0]["simulated"]["throughput_rps"] * 0.85


def test_the_check_counts_the_cores_the_machines_other_processes_kept_busy():
    """The machine's busy CPU less the app's processes' over a span, per second: Ray's own daemons,
    which the app's threads cannot use. Never below zero (the readings are not taken at one instant)."""
    from capacity.cpu_per_request import others_cores

    app_before, app_after = {"Router": 10.0, "proxy": 5.0}, {"Router": 22.0, "proxy": 8.0}  # 15 s of the app's
    assert others_cores(100.0, 118.0, app_before, app_after, 10.0) == 0.3  # 18 s busy over 10 s
    assert others_cores(100.0, 110.0, app_before, app_after, 10.0) == 0.0
    assert others_cores(100.0, 118.0, app_before, app_after, 0.0) == 0.0


def test_the_app_shares_the_cores_its_profile_found_ray_did_not_keep_busy():
    """A profile that measured 0.6 cores of Ray's own processes leaves the app's threads 1.4 of 2: the
    same load simulated from it completes less than from the same profile without the figure."""
    import copy

    from capacity.sim_check import compare

    bare, c16 = saved_run(16)
    bare["cpu_ms_per_request_busy"].pop("others_cores", None)
    busy = copy.deepcopy(bare)
    busy["cpu_ms_per_request_busy"]["others_cores"] = 0.6
    assert Profile.from_dict(busy).others_cores == 0.6 and Profile.from_dict(bare).others_cores == 0.0
    c16["measured"]["steal"] = 0.0
    cfg = saved_run_settings()
    [alone] = compare(bare, [copy.deepcopy(c16)], cfg, 20.0, 2, 0.25)
    [shared] = compare(busy, [copy.deepcopy(c16)], cfg, 20.0, 2, 0.25)
    assert (alone["app_cores"], shared["app_cores"]) == (2, 1.4)
    assert shared["simulated"]["throughput_rps"] < alone["simulated"]["throughput_rps"] * 0.85


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
    from capacity.machine_speed import mean_ms, slower, window_means

    samples = [(10.0, 4.0), (10.5, 6.0), (11.2, 10.0), (13.1, 8.0)]
    assert mean_ms(samples, 10.0, 11.0) == 5.0 and mean_ms(samples, 20.0, 21.0) is None
    assert window_means(samples, 10.0, 13.5, 1.0) == [5.0, 10.0, None, 8.0]
    assert slower([5.0, 10.0, None, 8.0], 5.0) == [1.0, 2.0, 2.0, 1.6]
    assert slower([None, 2.5], 5.0) == [1.0, 0.5]  # before any sample: the profile's speed


def test_the_canary_process_reports_the_cpu_time_of_its_unit():
    import time

    from capacity.machine_speed import Canary

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

    from capacity.machine_speed import Canary

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

    from capacity.sim_check import compare

    prof, c16 = saved_run(16)
    cfg = saved_run_settings()
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

    from capacity.sim_check import compare

    prof, c16 = saved_run(16)
    cfg = saved_run_settings()
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
    from capacity.sim_check import fit_elasticity

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

    from capacity.sim_check import compare

    prof, c16 = saved_run(16)
    cfg = saved_run_settings()
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

    from capacity.sim_check import compare

    prof, c16 = saved_run(16)
    cfg = saved_run_settings()
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

    from capacity.sim_check import compare

    prof, c1 = saved_run(1)
    c1["measured"]["steal"] = 0.0
    cfg = saved_run_settings()
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

    from capacity.sim_check import turned_away_by
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


def test_a_send_reports_the_path_its_request_took_and_nothing_when_turned_away():
    """What the open loops record beside each send time, for the simulator to replay: the path from
    the answer's trace (and its stage calls' times); a 503 has none (the simulator draws one for it)."""
    import asyncio

    import httpx

    from capacity.sim_check import _post

    def answer(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["n"] == 0:
            return httpx.Response(503, text="Request dropped due to backpressure")
        return httpx.Response(200, json={"tandem": {"path": "transfer", "latency_ms": {"small_direct": 5.0}}})

    async def send(n: int) -> list:
        took = []
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            status, _, _ = await _post(http, "http://app", {"n": n}, took=took.append)
        return [status, took]

    assert asyncio.run(send(1)) == [200, [{"path": "transfer", "latency_ms": {"small_direct": 5.0}}]]
    assert asyncio.run(send(0)) == [503, []]
