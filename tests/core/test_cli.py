"""`tandem ask` end to end on the default (trained) checkpoints: the JSON a user scripts against carries
the path, per-stage latency and tokens, and they agree with each other."""

import json
import subprocess

import pytest

from tests.commands import PY, ROOT, run_ok

EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("policy, path", [("mutual", {"agree", "transfer"}), ("large", {"large"}),
                                          ("always", {"transfer"})])
def test_ask_json(policy, path):
    sample = json.loads((EXAMPLES / "grid.json").read_text())
    out = run_ok(PY, "-m", "tandem.cli", "ask", "--image", str(EXAMPLES / sample["image"]),
                 "--policy", policy, "--json", sample["prompt"])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["policy"] == policy and result["path"] in path
    assert isinstance(result["answer"], str)
    assert set(result["tokens"]) <= set(result["latency_ms"]) and result["latency_ms"]["total"] > 0
    assert result["usage"]["completion_tokens"] == sum(result["tokens"].values())
    if result["path"] == "transfer":
        assert result["transferred_tokens"] > 0 and "small_reasoning" in result["tokens"]
    else:
        assert result["transferred_tokens"] == 0


def test_build_tiny_command(tmp_path):
    run_ok(PY, "-m", "tandem.cli", "build-tiny", str(tmp_path / "ck"), "--size", "small")
    assert (tmp_path / "ck" / "model.safetensors").exists() and (tmp_path / "ck" / "processor_config.json").exists()


def test_ask_takes_a_policy_parameter_and_refuses_a_bad_one():
    sample = json.loads((EXAMPLES / "grid.json").read_text())
    cmd = [PY, "-m", "tandem.cli", "ask", "--image", str(EXAMPLES / sample["image"]), "--json"]
    out = run_ok(*cmd, "--policy", "confidence@0.99", "--reasoning-max-tokens", "4", sample["prompt"])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["params"] == {"threshold": 0.99}
    assert result["path"] == "large" or result["tokens"]["small_reasoning"] <= 4
    bad = subprocess.run(cmd + ["--policy", "mutual@0.5", sample["prompt"]], capture_output=True, text=True)
    assert bad.returncode == 2 and "takes no parameter" in bad.stderr
