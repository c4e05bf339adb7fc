"""Who may import whom: the sweep writes rows and the analysis reads them, and both share only trialrows
(the row schema, reading, and the summaries both print); trainables knows neither."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "trialrows": {"trialrows"},
    "trainables": {"trainables"},
    "analysis": {"analysis", "trialrows"},
    "sweep": {"sweep", "trainables", "trialrows"},
}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
    return found & set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_it_may(package):
    for path in sorted((ROOT / package).glob("*.py")):
        assert imported_packages(path) <= ALLOWED[package], path.relative_to(ROOT)


def test_a_dry_run_of_every_experiment_loads_no_analysis_module():
    code = ("import sys; from sweep.cli import main, EXPERIMENTS; import sweep.runner, sweep.search, sweep.probing; "
            "[main([e, '--dry-run']) for e in EXPERIMENTS]; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'analysis'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
