"""Serve's controller log read as the autoscale check reads it: the fixture is a real controller log's
lines from one step load (two pools scaled 1 -> 3 -> 1, then one 1 -> 2 -> 1)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from capacity.serve_log import PoolLog, controller_log, parse

LOG = Path(__file__).parent / "fixtures" / "serve_controller.log"


def _wall(stamp: str) -> float:
    return datetime.datetime.strptime(f"2026-12-07 {stamp}", "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_pools_replicas_and_targets_change_when_the_controller_logged_them():
    events = parse(LOG.read_text().splitlines(), "tandem")
    start = _wall("15:39:00,000")
    small = PoolLog(events, "SmallReasoner", start, start + 1000, running=1, target=1)
    assert small.targets() == [(0.0, 1), (30.935, 3), (98.245, 1), (322.701, 2), (334.414, 1)]
    # Up as each replica came up; down as the controller stopped the running ones, the loop after deciding.
    assert small.timeline() == [(0.0, 1), (38.763, 2), (39.098, 3), (98.373, 2), (98.376, 1), (325.434, 2), (334.541, 1)]
    assert small.startups() == pytest.approx([38.763 - 31.683, 39.098 - 31.683, 325.434 - 322.818])
    large = PoolLog(events, "LargeAnswerer", start, start + 1000, running=1, target=1)
    assert [n for _, n in large.timeline()] == [1, 2, 3, 2, 1]
    assert large.startups() == pytest.approx([38.421 - 30.580, 39.099 - 30.580])


def test_a_decision_is_acted_on_by_the_next_control_loop():
    """From each target to the replica begun or stopped for it: the controller's loop period, or more
    where a loop ran long."""
    events = parse(LOG.read_text().splitlines(), "tandem")
    start = _wall("15:39:00,000")
    small = PoolLog(events, "SmallReasoner", start, start + 1000, running=1, target=1)
    assert small.action_gaps() == pytest.approx([0.748, 0.128, 0.117, 0.127])


def test_only_the_window_and_the_app_asked_for_count():
    lines = LOG.read_text().splitlines() + [
        "INFO 2026-12-07 15:45:00,000 controller 1 -- Adding 1 replica to Deployment(name='SmallReasoner', app='zero').",
        "INFO 2026-12-07 15:45:00,000 controller 1 -- some line without a deployment",
        "not a log line"]
    events = parse(lines, "tandem")
    assert all(e.t <= _wall("15:44:36,569") for e in events)
    later = PoolLog(events, "SmallReasoner", _wall("15:44:00,000"), _wall("15:46:00,000"), running=1, target=1)
    assert later.timeline() == [(0.0, 1), (25.434, 2), (34.541, 1)]


def test_a_replica_stopped_while_starting_never_counts_and_has_no_startup():
    lines = [
        "INFO 2026-12-07 10:00:01,000 controller 1 -- Upscaling Deployment(name='P', app='a') from 1 to 3 replicas.",
        "INFO 2026-12-07 10:00:01,100 controller 1 -- Adding 2 replicas to Deployment(name='P', app='a').",
        "INFO 2026-12-07 10:00:02,000 controller 1 -- Downscaling Deployment(name='P', app='a') from 3 to 2 replicas.",
        "INFO 2026-12-07 10:00:02,100 controller 1 -- Stopping Replica(id='x', deployment='P', app='a') (currently ReplicaState.STARTING).",
        "INFO 2026-12-07 10:00:05,100 controller 1 -- Replica(id='y', deployment='P', app='a') started successfully on node 'n' after 4.0s.",
    ]
    pool = PoolLog(parse(lines, "a"), "P", _wall("10:00:00,000"), _wall("10:01:00,000"), running=1, target=1)
    assert pool.timeline() == [(0.0, 1), (5.1, 2)]
    assert pool.startups() == [pytest.approx(4.0), None]


def test_the_controller_log_is_found_in_the_latest_session(tmp_path):
    serve = tmp_path / "ray" / "session_latest" / "logs" / "serve"
    serve.mkdir(parents=True)
    assert controller_log(str(tmp_path)) is None
    (serve / "controller_build_app_12.log").write_text("")
    (serve / "controller_11.log").write_text("")
    assert controller_log(str(tmp_path)) == serve / "controller_11.log"
