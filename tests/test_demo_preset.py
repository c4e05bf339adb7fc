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


def test_fractions_are_shown_among_the_settings_and_the_sizes_they_clear_are_no_fill(capsys, tmp_path):
    # With --fractions the command said "preset demo: filled --sizes -" and its settings line left them out.
    from sweep.cli import main

    argv = ["incremental", "--tasks", "synthetic", "--fractions", "0.1", "--k", "0", "--dry-run",
            "--storage", str(tmp_path)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("preset demo: filled --model minilm;") and "--sizes" not in lines[1], lines[1]
    assert lines[2].startswith("settings: --k 0 · --fractions 0.1 · --trials "), lines[2]
