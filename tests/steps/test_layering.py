"""Import layering: the step driver imports no engine, and ``beam_dp.io`` does not import ``beam_dp.beam``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(package: str) -> set[tuple[str, str]]:
    """(module file, imported module) for every import statement under ``beam_dp/<package>``."""
    found = set()
    for path in (ROOT / "beam_dp" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {(path.name, alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add((path.name, node.module))
    return found


def test_io_does_not_import_the_beam_adapter():
    assert not [(f, m) for f, m in _imports("io") if m == "beam_dp.beam" or m.startswith("beam_dp.beam.")]


def test_the_driver_imports_no_engine():
    engines = ("apache_beam", "pyflink", "beam_dp.beam", "beam_dp.flink", "beam_dp.io")
    assert not [(f, m) for f, m in _imports("steps") if m.split(".")[0] in engines or m.startswith(engines)]
    code = ("import sys, beam_dp.steps, beam_dp.steps.driver, beam_dp.steps.policies; "
            "bad = [m for m in ('apache_beam', 'pyflink') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
