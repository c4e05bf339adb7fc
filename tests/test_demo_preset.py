"""The demo preset's short schedule (3 epochs) is the demo's alone: any grid of another model, task or size
gets the paper's epochs rule, and --epochs always wins."""
from __future__ import annotations

from sweep.cli import build_parser, settings_from_args


def settings(*argv: str):
    return settings_from_args(build_parser().parse_args(["incremental", *argv]))


def test_the_demo_runs_three_epochs_and_other_grids_the_paper_rule():
    assert settings().epochs == 3 and settings().k == (0, 6)
    for other in (["--tasks", "sst2"], ["--sizes", "200"], ["--model", "bert-base-uncased"], ["--fractions", "0.1"]):
        assert settings(*other).epochs is None, other  # None: 5 epochs up to 500 examples, else 3
    assert settings("--epochs", "7").epochs == 7 and settings("--preset", "paper").epochs is None
