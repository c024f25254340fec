"""The planner (capacity/plan.py): plans that meet their SLO and the config overlays it writes."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from capacity.profile import (ROOT, Profile, Workload)
from capacity.simulate import STEADY_PATHS, default_duration, simulate
from capacity.plan import Planner, admission_limit, gpus, lower_bound, overlay
from tests.capacity.helpers import AGREE, profile, profile_dict, settings
from tests.commands import PY, run_ok


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
    from capacity.simulate import Simulation

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
    from capacity.plan import main

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

    from capacity.simulate import main as simulate_main

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


def test_the_plan_command_writes_a_whole_config_that_serve_and_validate_config_accept(tmp_path):
    """`--base CONFIG --out FILE`: the file is a serve config as `serve deploy` reads it (Serve's own
    schema) and as `tandem validate-config` checks it, with the planned replicas in it."""
    from ray.serve.schema import ServeDeploySchema

    run_ok(PY, "-m", "capacity.stage_profile", "--estimate", "cluster", "--out", str(tmp_path / "P.json"))
    out = run_ok(PY, "-m", "capacity.plan", "--profile", str(tmp_path / "P.json"), "--rate", "20", "--p95-ms", "30000",
                 "--transfer-rate", "0.137", "--config", "serve_config.gpu.yaml", "--base", "serve_config.gpu.yaml",
                 "--out", str(tmp_path / "plan.yaml")).stdout
    planned = json.loads(out.strip().splitlines()[-1])["replicas"]
    written = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    ServeDeploySchema.model_validate(written)
    run_ok(PY, "-m", "tandem.cli", "validate-config", str(tmp_path / "plan.yaml"))
    deps = {d["name"]: d for d in written["applications"][0]["deployments"]}
    assert {name: deps[name]["num_replicas"] for name in planned} == planned
    assert written["applications"][0]["args"] == {**yaml.safe_load((ROOT / "serve_config.gpu.yaml").read_text())[
        "applications"][0]["args"], "http": written["applications"][0]["args"]["http"]}


def test_a_plan_the_search_cannot_find_is_an_error_message_not_a_traceback(tmp_path, capsys):
    from capacity.plan import main

    d = profile_dict() | {"workload": {"policy": "mutual", "requests": 60, "images": 1, "transfer_rate": 0.3,
                                       "stages": {k: {**v, "n": 60} for k, v in AGREE.items()}}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    # An unloaded request takes tens of ms: no replica count answers within 1 ms.
    assert main(["--profile", str(path), "--rate", "20", "--p95-ms", "1", "--duration-s", "5",
                 "--config", str(ROOT / "serve_config.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("plan: no plan meets p95 1.0 ms") and "Traceback" not in err
