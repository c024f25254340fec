"""The core stays Ray- and HTTP-free: importing every tandem module must not pull in ray,
starlette or fastapi (otherwise the core can no longer be tested or embedded without them)."""

import json
import pkgutil
import subprocess
import sys

import tandem


def test_core_imports_no_serving_stack():
    modules = [m.name for m in pkgutil.walk_packages(tandem.__path__, "tandem.")]
    assert "tandem.pipeline" in modules and "tandem.engines.transformers_engine" in modules
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps([m for m in ('ray', 'starlette', 'fastapi') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_model_servers_on_model_free_engines_start_without_torch():
    """A replica's start is its module's import plus its engine's build: on the fake and paced engines
    that must not pay torch's import (a second of CPU), which on shared cores slows the replicas
    already serving while a pool scales up — what the autoscaling check measures."""
    code = ("import json, sys\n"
            "import deployments.small_reasoner, deployments.large_answerer, deployments.router\n"
            "from capacity.paced_check import PACED_PROFILE\n"
            "from tandem.engines.paced import PacedEngine\n"
            "from tandem.engines.fake import FakeEngine, default_rule\n"
            "PacedEngine('small', PACED_PROFILE, 0.3).warm_up()\n"
            "FakeEngine('small', default_rule(3, 10, 'A')).warm_up()\n"
            "print(json.dumps('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False
