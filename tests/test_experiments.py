"""Every experiment of issue 3: paper grid counts, clear refusals, ids, and each one as a real Ray sweep on a
tiny model writing correct rows."""
from __future__ import annotations

import dataclasses

import pytest

from analysis.results import read_results
from sweep.cli import main
from sweep.experiments import EXPERIMENTS, GridSettings
from trialrows.experiments import heads, incremental, permutation, reinit_lr, sequential

def readme_paper_counts() -> dict[str, str]:
    """Each experiment's `--preset paper` trial count as the README's experiment table gives it (its last column
    ends ": COUNT ..."): the README is the list, so a new experiment's row there is its count here."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = re.findall(r"^\| `python -m sweep ([a-z-]+)` \|.*\| ([^|]*) \|$", text, re.M)
    number = re.compile(r"[\d,]+")
    return {name: "total: " + number.match(grid.rsplit(": ", 1)[1]).group() + " trials" for name, grid in rows}


# The paper's grids (REFERENCE.md; heads and sequential: our preset for the course reports' experiments).
PAPER_COUNTS = readme_paper_counts()


def test_every_experiment_has_a_paper_count():
    assert set(PAPER_COUNTS) == set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", sorted(PAPER_COUNTS))
def test_paper_dry_run_prints_the_papers_trial_count(experiment, capsys):
    assert main([experiment, "--preset", "paper", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "bert-base-uncased (12 layers)" in out and PAPER_COUNTS[experiment] in out


@pytest.mark.parametrize("argv, message", [
    (["localized", "--block-size", "5"], "--block-size: 5 is outside 1..4"),
    (["heads", "--heads", "4"], "--heads: 4 is outside 0..3"),
    (["single-layer", "--layers", "0"], "--layers: 0 is outside 1..4"),
    (["incremental", "--fractions", "0"], "--fractions: 0.0 is outside (0, 1]"),
    (["incremental", "--fractions", "1.5"], "--fractions: 1.5 is outside (0, 1]"),
    (["permutation", "--permutations", "0"], "--permutations: 0 must be at least 1"),
    (["reinit-lr", "--lr-multiplier", "-1"], "--lr-multiplier: -1.0 must be a positive"),
    (["sequential", "--intermediate-tasks", "nope"], "--intermediate-tasks: unknown task 'nope'"),
])
def test_bad_experiment_options_are_refused_before_any_work(tiny_bert, tmp_path, capsys, argv, message):
    code = main([*argv, "--model", tiny_bert, "--tasks", "synthetic", "--storage", str(tmp_path)])
    assert code == 2 and message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def settings(**options):
    base = dict(model="m", tasks=("sst2", "cola"), sizes=(100,), trials=((0, 2),))
    return GridSettings.of(**{**base, **options})


def test_incremental_ids_are_unchanged_by_the_new_fields():
    # Computed with recipe 2 (issue 14), which renewed every id on purpose (clipping, decay groups and trial
    # seeds change every number, so a recipe-1 row is another trial). Optional fields added since must not
    # make done trials look new.
    s = GridSettings.of(model="bert-base-uncased", tasks=("sst2",), sizes=(500,), trials=((0, 2),), k=(0, 12))
    assert [x.trial_id for x in incremental(s, 12)] == [
        "incremental-sst2-n500-k0-t0-a21dd0bd02", "incremental-sst2-n500-k12-t0-6937124c60",
        "incremental-sst2-n500-k0-t1-b4fff5147f", "incremental-sst2-n500-k12-t1-6d06f3224a"]
    old = dataclasses.replace(incremental(s, 12)[0], recipe_version=1)
    assert old.trial_id != incremental(s, 12)[0].trial_id


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
def test_grid_ids_are_unique_and_deterministic(experiment):
    build = EXPERIMENTS[experiment].build
    first, again = build(settings(), 4, 4), build(settings(), 4, 4)
    assert len({s.trial_id for s in first}) == len(first)
    assert [s.trial_id for s in first] == [s.trial_id for s in again]


def test_identity_includes_every_new_field_that_changes_the_computation():
    ids = lambda specs: {s.trial_id for s in specs}  # noqa: E731
    assert not ids(reinit_lr(settings(lr_multiplier=5.0), 4)) & ids(reinit_lr(settings(lr_multiplier=2.0), 4))
    assert not ids(permutation(settings(seed=0), 4)) & ids(permutation(settings(seed=1), 4))
    seq = sequential(settings(), 4)
    assert len(ids(seq)) == len(seq) == 2 * 2 * 2
    assert {(s.task, s.intermediate_task) for s in seq} == {("sst2", None), ("sst2", "cola"), ("cola", "sst2"),
                                                          ("cola", None)}


def test_the_nth_permutation_is_the_same_for_every_task_and_size():
    specs = permutation(settings(sizes=(100, 500), permutations=5), 12)
    by_index = {}
    for spec in specs:
        row = spec.row()
        by_index.setdefault(row["permutation_index"], set()).add(tuple(row["permutation"]))
        assert row["permutation_seed"] == row["permutation_index"]  # base seed 0 + n; seed 0 is used
    assert sorted(by_index) == [0, 1, 2, 3, 4]
    assert all(len(orders) == 1 for orders in by_index.values())
    assert len({next(iter(o)) for o in by_index.values()}) == 5


def test_heads_grid_has_a_baseline_and_every_layer_head():
    specs = heads(settings(tasks=("sst2",), trials=((0, 1),)), 2, 3)
    cells = [(s.row()["layer"], s.row()["head"]) for s in specs]
    assert cells == [(None, None)] + [(layer, head) for layer in (1, 2) for head in range(3)]


def sweep(ray_local, tiny_bert, tmp_path, experiment, *options, tasks=("synthetic",)):
    """Run one experiment as a real sweep on the tiny model; its rows."""
    argv = [experiment, "--model", tiny_bert, "--tasks", *tasks, "--trials", "1", "--epochs", "1",
            "--storage", str(tmp_path), "--name", experiment, *options]
    if "--fractions" not in options:
        argv += ["--sizes", "16"]
    assert main(argv) == 0
    rows = read_results(tmp_path / experiment)
    assert set(rows["status"]) == {"ok"} and rows["trial_id"].is_unique
    assert (rows["experiment"] == experiment).all()
    for distance in rows["weight_distance"]:
        assert len(distance) == 4 and all(d >= 0 for d in distance)
    return rows


def test_localized_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "localized")  # block size 3 of 4 layers: starts 1 and 2
    got = {(m, s, tuple(r)) for m, s, r in zip(rows["block_mode"], rows["block_start"], rows["reinit_layers"])}
    assert got == {("block-reinit", 1, (1, 2, 3)), ("block-reinit", 2, (2, 3, 4)),
                   ("block-preserve", 1, (4,)), ("block-preserve", 2, (1,))}
    assert set(rows["block_size"]) == {3}


def test_single_layer_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "single-layer", "--layers", "1", "4")
    assert sorted(zip(rows["layer"], map(tuple, rows["reinit_layers"]))) == [(1, (1,)), (4, (4,))]


def test_permutation_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "permutation", "--permutations", "2")
    rows = rows.sort_values("permutation_index")
    assert list(rows["permutation_index"]) == [0, 1] and list(rows["permutation_seed"]) == [0, 1]
    from trainables.ablations import Permute

    assert [list(p) for p in rows["permutation"]] == [list(Permute.from_seed(s, 4).order) for s in (0, 1)]
    assert all(len(r) == 0 for r in rows["reinit_layers"])


def test_layernorm_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "layernorm", "--k", "2")
    assert list(rows["k"]) == [2] and list(rows["keep_layernorm"]) == [True]
    assert list(rows["reinit_layers"].iloc[0]) == [3, 4]


def test_reinit_lr_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "reinit-lr", "--k", "2", "--lr-multiplier", "5")
    assert list(rows["lr_multiplier"]) == [5.0] and list(rows["reinit_layers"].iloc[0]) == [3, 4]
    moved = list(rows["weight_distance"].iloc[0])
    assert min(moved[2:]) > max(moved[:2]), "the reinitialized layers, at 5x the rate, move furthest"


def test_heads_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "heads", "--layers", "2", "--heads", "3")
    cells = sorted(zip(rows["layer"].fillna(-1), rows["head"].fillna(-1)))
    assert cells == [(-1, -1), (2, 3)]


def test_sequential_sweep(ray_local, tiny_bert, glue_dir, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "sequential", "--data-dir", str(glue_dir),
                 tasks=("synthetic", "sst2"))
    got = {(t, i if isinstance(i, str) else None) for t, i in zip(rows["task"], rows["intermediate_task"])}
    assert got == {("synthetic", None), ("synthetic", "sst2"), ("sst2", None), ("sst2", "synthetic")}
    assert set(rows["metric_name"]) == {"accuracy"}
    # The final task's dev metric is reported, evaluated on its own validation split.
    assert rows["dev_metric"].between(0, 1).all()
    # Weight change (recipe 2) runs from the final task's start; the intermediate phase has its own column,
    # set only where there was one.
    for t, i, d, phase in zip(rows["task"], rows["intermediate_task"], rows["weight_distance"],
                              rows["intermediate_weight_distance"]):
        assert len(d) == 4 and all(x > 0 for x in d)
        if isinstance(i, str):
            assert len(phase) == 4 and all(x > 0 for x in phase)
        else:
            assert phase is None or len(phase) == 0


def test_fractions_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "incremental", "--k", "4", "--fractions", "0.004")
    assert list(rows["train_size"]) == [20] and list(rows["train_fraction"]) == [0.004]  # 5000 train examples


def test_sequential_fractions_beyond_an_intermediate_split_are_refused(tiny_bert, tmp_path, capsys):
    # Half of SST-2 is 33,674 examples; the cola -> sst2 cell trains on that many CoLA examples first, which
    # its 8,551 cannot give: refused before any work, not a failed trial.
    argv = ["sequential", "--model", tiny_bert, "--tasks", "cola", "sst2", "--fractions", "0.5", "--trials", "1",
            "--storage", str(tmp_path), "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--fractions: 0.5 (sst2: 33674 examples) is larger than the cola train split (8,551 examples)" in err
    assert main([*argv[:6], "--intermediate-tasks", "sst2", *argv[6:]]) == 0  # sst2 -> cola fits


def test_fraction_sizes_without_a_trial_count_are_refused(tiny_bert, tmp_path, capsys):
    # The synthetic task's 5,000 training examples: 0.01 -> 50, 0.02 -> 100, which no --trials word counts.
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--fractions", "0.01", "0.02", "--k", "0",
            "--trials", "50=2", "--storage", str(tmp_path), "--dry-run"]
    assert main(argv) == 2
    assert "--trials: no count for size 100 (--fractions 0.02 of synthetic)" in capsys.readouterr().err


def test_probing_paper_preset_with_sizes_probes_those_subsets_only(tiny_bert, capsys):
    # --sizes replaces the preset's subsets (its full training splits), as it does every preset's --sizes.
    assert main(["probing", "--preset", "paper", "--model", tiny_bert, "--sizes", "500", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "total by size: 500: 120" in out and "--fractions 1.0" not in out


def test_the_demo_picks_left_out_name_only_the_experiments_own_settings(tiny_bert, capsys):
    # The demo's --k is incremental's; localized has no --k and probing reads no --epochs.
    for experiment in ("localized", "probing"):
        assert main([experiment, "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--dry-run"]) == 0
        picks = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("preset demo"))
        assert "--trials" in picks and "--k" not in picks and ("--epochs" in picks) == (experiment == "localized")
