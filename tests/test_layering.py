"""Who may import whom: the sweep writes rows and the analysis reads them, and both share only trialrows
(the declarations of settings, the experiment registry, the row schema, reading, and the summaries both
print); trainables reads trialrows' declarations (the recipe, the rows' vocabulary) and knows neither the
sweep nor the analysis. trialrows imports no torch, so the analysis runs without it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "trialrows": {"trialrows"},
    "trainables": {"trainables", "trialrows"},
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


def loaded_packages(code: str, packages: set[str]) -> list[str]:
    """Which of `packages` a fresh interpreter has loaded after running `code`."""
    code += f"; import sys; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(packages)!r})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return eval(out.strip().splitlines()[-1])


def test_a_dry_run_of_every_experiment_loads_no_analysis_module():
    code = ("from sweep.cli import main, EXPERIMENTS; import sweep.runner, sweep.search, sweep.probing; "
            "[main([e, '--dry-run']) for e in EXPERIMENTS]")
    assert loaded_packages(code, {"analysis"}) == []


def test_the_analysis_and_the_registry_load_neither_torch_nor_the_sweep():
    code = "import analysis, analysis.report, analysis.tables, analysis.figures, trialrows.experiments, trialrows.schema"
    assert loaded_packages(code, {"torch", "sweep", "ray", "trainables"}) == []


def module_imports(path: Path) -> set[str]:
    """The project modules a file imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_no_import_loops():
    """No module reaches itself through what it imports, even lazily inside a function (tasks -> qa -> data ->
    tasks, analysis.experiments <-> analysis.figures were two)."""
    modules = {f"{p.parent.name}.{p.stem}": p for package in ALLOWED for p in (ROOT / package).glob("*.py")
               if p.stem != "__init__"}
    graph = {m: {i for i in module_imports(p) if i in modules and i != m} for m, p in modules.items()}
    for start in graph:
        seen, stack = set(), [(start, [start])]
        while stack:
            module, path = stack.pop()
            for nxt in graph[module]:
                assert nxt != start, " -> ".join([*path, nxt])
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))


def test_a_trial_worker_loads_neither_datasets_nor_scipy_nor_a_tracker():
    """A Ray worker that trains (the trainable, the fused engine) gets tokenized tasks and computes no interval:
    datasets, scipy and the trackers' clients are seconds of every trial process's start that it never uses."""
    code = "import trainables.tune_trainable, trainables.fused, trainables.finetune, trainables.probing"
    assert loaded_packages(code, {"datasets", "scipy", "mlflow", "wandb"}) == []
