"""Nothing in the project unpickles a file that came from elsewhere or runs a model's remote code: weights
come from safetensors (tests/test_store.py), and any torch.load reads tensors only."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for folder in ("trainables", "sweep", "analysis", "benchmarks") for p in (ROOT / folder).rglob("*.py")]


def calls(pattern: str) -> list[str]:
    found = []
    for path in SOURCES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_sources_are_found():
    assert len(SOURCES) > 20 and any(p.name == "finetune.py" for p in SOURCES)


def test_no_pickle_loads_and_no_remote_code():
    assert calls(r"\b(c?pickle|cloudpickle|dill|joblib)\.loads?\(") == []
    assert calls(r"trust_remote_code\s*=\s*True") == []
    assert calls(r"use_safetensors\s*=\s*False") == []


def test_every_torch_load_reads_tensors_only():
    loads = calls(r"torch\.load\(")
    unsafe = [line for line in loads if "weights_only=True" not in line]
    assert unsafe == [], "torch.load without weights_only=True can execute code from the file"
