"""`tandem validate-config`: a broken serve config must fail here, with the key named, not on the
cluster after minutes of start-up."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(path):
    return subprocess.run([sys.executable, "-m", "tandem.cli", "validate-config", str(path)],
                          capture_output=True, text=True)


def test_shipped_config_is_valid():
    out = run(ROOT / "serve_config.yaml")
    assert out.returncode == 0, out.stderr


def test_unknown_arg_and_unknown_deployment_are_named(tmp_path):
    text = (ROOT / "serve_config.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("budget_tokens:", "budget_tokenz:").replace("name: LargeAnswerer", "name: Large"))
    out = run(bad)
    assert out.returncode != 0
    assert "unknown key 'selector.budget_tokenz'" in out.stderr and "unknown deployment 'Large'" in out.stderr


def test_deployment_names_match_what_the_builder_binds():
    from tandem.config import DEPLOYMENT_NAMES
    import deployments.app as app
    assert set(app._DEFAULT_OPTIONS) == set(DEPLOYMENT_NAMES)
