"""The house rules, held: README.md within 250 lines, no tracked .py file over 600 lines and no
function over 80, no run data in the tree. A newcomer's README and small units drift back when
nothing looks."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tracked(pattern: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.split()]


def test_the_readme_stays_within_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_no_python_file_over_600_lines_and_no_function_over_80():
    too_long = []
    for path in tracked("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > 600:
            too_long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, too_long


def test_no_run_data_is_tracked():
    assert not [p for p in tracked("*") if p.relative_to(ROOT).parts[:2] == ("benchmarks", "runs")
                or p.relative_to(ROOT).parts[0] == "results"]
