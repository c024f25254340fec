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
