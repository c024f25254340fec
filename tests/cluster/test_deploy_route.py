"""The documented cluster route, as a new user runs it, on this CPU with the default config: `ray start
--head`, then `serve deploy`, `serve status` and a query. Ray 2.60 turns token authentication on
for a new cluster and its Serve CLI sends the token (which `ray start` wrote to ~/.ray/auth_token)
only when RAY_AUTH_MODE=token is set: without it the deploy is refused, with it the app comes up
(cluster/README.md says so). Runs on ports of its own and stops the cluster it started, nothing else."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head(tmp_path):
    """A Ray head started with `ray start --head --block` in its own session: stopping that command
    stops the processes it started (a bare `ray stop` would stop every Ray on the machine)."""
    ports = {"port": free_port(), "dashboard-port": free_port(), "ray-client-server-port": free_port()}
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    log = open(tmp_path / "ray-start.log", "w")
    proc = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2",
                             *[f"--{k}={v}" for k, v in ports.items()]],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    dashboard = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "ray-start.log").read_text()[-2000:]
            try:
                if httpx.get(f"{dashboard}/api/version", timeout=2).status_code in (200, 401):
                    break
            except httpx.HTTPError:
                time.sleep(1)
        yield dashboard, env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def serve_cli(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "serve"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_ray_start_serve_deploy_status_and_a_query_as_documented(head, tmp_path):
    dashboard, env = head
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))

    refused = serve_cli("deploy", str(path), "-a", dashboard, env=env)
    assert refused.returncode != 0 and "Missing authentication token" in refused.stderr + refused.stdout

    token = {**env, "RAY_AUTH_MODE": "token"}
    deployed = serve_cli("deploy", str(path), "-a", dashboard, env=token)
    assert deployed.returncode == 0, deployed.stderr[-2000:]
    deadline, status = time.monotonic() + 300, ""
    while time.monotonic() < deadline and "status: RUNNING" not in status:
        time.sleep(2)
        status = serve_cli("status", "-a", dashboard, env=token).stdout
    assert "status: RUNNING" in status, status
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                   json={"model": "tandem:large", "messages": [{"role": "user", "content": "What is 2+2?"}]})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["message"]["content"]
