"""Running one of the project's commands from a test, as a user would from the repository root: it
must succeed, and a failure shows what the process said on stderr (a crash at exit leaves nothing
else to go on)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def run_ok(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`args` run offline from the repository root, to exit status 0."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}; stderr:\n{done.stderr[-4000:]}"
    return done
