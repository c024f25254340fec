"""Every command the README and docs/ give runs from its documented place: the quick form where one
fits a test's time, `--help` (which imports the module and builds its parser) for the long ones. A
module moved or a refactor that breaks a command fails here, not in a reader's terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.commands import PY, ROOT, run_ok

# The long runs the docs give, checked to start: their modules import and their flags parse.
HELP = ["benchmarks.strategies", "benchmarks.calibrate", "benchmarks.budget", "benchmarks.load", "benchmarks.soak",
        "benchmarks.engine_batching", "benchmarks.load_memory", "benchmarks.latency_profile", "benchmarks.prefix_reuse",
        "benchmarks.served_overhead", "benchmarks.affinity",
        "capacity.stage_profile", "capacity.simulate", "capacity.plan", "capacity.sim_check", "capacity.paced_check", "capacity.autoscale_check",
        "training.train", "training.probes.count_probe", "training.probes.copy_probe",
        "training.probes.trace_errors"]


@pytest.mark.parametrize("module", HELP)
def test_each_documented_module_starts(module):
    assert "usage:" in run_ok(PY, "-m", module, "--help", timeout=120).stdout


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_strategies_quick_command_runs_and_ends_with_its_json_line(tmp_path):
    report = last_json(run_ok(PY, "-m", "benchmarks.strategies", "--quick", "--out", str(tmp_path)).stdout)
    assert report["benchmark"] == "strategies" and report["n"] == 12 and "mutual" in report["rows"]


@pytest.mark.slow
def test_the_capacity_commands_run_from_an_estimated_profile(tmp_path):
    profile = tmp_path / "P.json"
    run_ok(PY, "-m", "capacity.stage_profile", "--estimate", "cluster", "--out", str(profile))
    sim = last_json(run_ok(PY, "-m", "capacity.simulate", "--profile", str(profile), "--rate", "20", "--replicas",
                        "VisionEncoder=1,SmallReasoner=2,LargeAnswerer=1", "--duration-s", "30").stdout)
    assert sim["completed"] > 0


@pytest.mark.slow
def test_the_grid_export_the_training_smoke_run_and_a_probe_run(tmp_path):
    run_ok(PY, "-m", "tasks.grid", str(tmp_path / "grid.jsonl"), "--n", "4")
    assert len((tmp_path / "grid.jsonl").read_text().splitlines()) == 4
    facts = last_json(run_ok(PY, "-m", "training.train", "--role", "small", "--steps", "4", "--out", str(tmp_path)).stdout)
    assert facts["steps"] == 4 and (tmp_path / "small" / "model.safetensors").exists()
    run_ok(PY, "-m", "training.probes.trace_errors", "--role", "small", "--tier", "compose", "--n", "4")


@pytest.mark.slow
def test_the_cli_commands_of_the_readme(tmp_path):
    question = json.loads((ROOT / "examples" / "grid.json").read_text())["prompt"]
    tandem = str(Path(PY).with_name("tandem"))
    run_ok(tandem, "validate-config", "serve_config.yaml")
    answer = json.loads(run_ok(tandem, "ask", "--image", "examples/grid.png", "--policy", "mutual", "--json",
                               question).stdout)
    assert answer["policy"] == "mutual"
