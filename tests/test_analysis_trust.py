"""Results one can trust at the paper's scale (issue 13): conditions keyed on every setting, early error
rows, one full-model reference, permutations by layer order, paired differences, one schema that every
reader opens, and a compacting store that never loses a row."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from scipy import stats

from analysis import tables as T
from analysis.format import correlations_readable as readable_correlations
from analysis.format import readable
from analysis.report import build_report
from analysis.results import prepare, read_results
from analysis.schema import REPLICATE, SCHEMA, SETTING, role
from analysis.search import importance_table
from analysis.stats import condition_table
from sweep.store import COMPACT_AT, compact, finished_trial_ids, write_row

L = 4


def row(trial_id, *, experiment="incremental", task="sst2", k=L, t=0, value=0.8, status="ok", mode="intended",
        **extra):
    base = {
        "trial_id": trial_id, "experiment": experiment, "task": task, "model": "m", "data_source": "hub",
        "train_size": 100, "trial_index": t, "subset_seed": 100 + t, "seed": 200 + t, "k": k,
        "reinit_layers": list(range(k + 1, L + 1)) if k is not None else [], "reinit_mode": mode,
        "keep_layernorm": False, "reinit_pooler": False, "epochs": 3, "lr": 2e-5, "batch_size": 8,
        "max_length": 64, "weight_decay": 0.0, "lr_schedule": "linear", "max_grad_norm": 1.0,
        "precision": "fp32", "recipe_version": 2, "status": status, "error": None,
        "metric_name": "accuracy", "dev_metric": value, "dev_accuracy": value,
        "finished_at": "2026-11-22T10:00:00+0000",
    }
    if status == "error":  # failed before its first report: no metric at all
        base.update(metric_name=None, dev_metric=None, dev_accuracy=None, error="Traceback: boom")
    return {**base, **extra}


def test_two_settings_are_two_conditions_everywhere_and_the_report_says_so(tmp_path):
    rows = [row(f"a{t}", t=t, value=0.8 + 0.01 * t) for t in range(3)]
    rows += [row(f"b{t}", t=t, value=0.6 + 0.01 * t, epochs=10) for t in range(3)]
    folder = tmp_path / "rows"
    for r in rows:
        write_row(folder, r)
    prepared = prepare(read_results(folder))
    table = condition_table(prepared).set_index("epochs")
    assert list(table["n"]) == [3, 3] and table.loc[10, "mean"] == pytest.approx(0.61)
    figure_numbers = T.incremental_table(prepared)
    assert len(figure_numbers) == 2 and set(figure_numbers["epochs"]) == {3, 10}
    assert set(T.reference_table(prepared)["epochs"]) == {3, 10}  # one full-model line per setting
    report = build_report(folder, tmp_path / "report", formats=["png"])
    assert any("mixes settings" in line and "epochs = 10, 3" in line for line in report.header)
    assert len([f for f in report.figures if f.name.startswith("fig2")]) == 2


def test_two_permutation_sweeps_at_two_settings_are_two_conditions_in_figure_4_and_table_1():
    """Each sweep draws its own layer orders, so no order runs at both settings: the setting has to be looked
    for across the orders (the table's samples), not within one."""
    orders = {3: [[1, 2, 3, 4], [4, 3, 2, 1], [2, 1, 4, 3]], 10: [[1, 3, 2, 4], [3, 1, 4, 2], [2, 4, 1, 3]]}
    rows = prepare(pd.DataFrame([
        row(f"{task}-{epochs}-{p}", experiment="permutation", task=task, k=None, reinit_mode=None, epochs=epochs,
            value=base + (0.3 if epochs == 10 else 0.0) + 0.01 * p, permutation=order, permutation_index=p,
            permutation_seed=p + epochs)
        for epochs, drawn in orders.items() for p, order in enumerate(drawn)
        for task, base in (("sst2", 0.6), ("cola", 0.3))]))
    table = T.permutation_table(rows)
    sst2 = table[table["task"] == "sst2"].set_index("epochs")
    assert list(sst2["n"]) == [3, 3] and sst2.loc[10, "mean"] == pytest.approx(0.91)
    correlations = T.permutation_correlations(rows)  # pooled, epochs alone would make Spearman 1.0
    assert list(correlations["n"]) == [3, 3] and set(correlations["epochs"]) == {3, 10}
    assert T.mixed_settings(rows) == {"permutation": {"epochs": ["10", "3"]}}


def test_sequential_finetuning_at_two_settings_is_measured_against_direct_finetuning_at_the_same_one():
    rows = prepare(pd.DataFrame([
        row(f"{via or 'direct'}{epochs}-{t}", experiment="sequential", k=None, reinit_mode=None, t=t, epochs=epochs,
            intermediate_task=via, value=base + (0.05 if via else 0.0) + 0.01 * t)
        for epochs, base in ((3, 0.8), (10, 0.6)) for t in range(3) for via in (None, "qnli")]))
    table = T.sequential_table(rows).set_index(["intermediate_task", "epochs"])
    assert len(table) == 4 and table.loc[("qnli", 3), "direct"] == pytest.approx(0.81)
    assert list(table["delta"]) == pytest.approx([0.0, 0.0, 0.05, 0.05])
    matrix = T.sequential_matrix(rows)
    assert list(matrix.index.get_level_values("epochs")) == [3, 10]
    assert matrix.to_numpy() == pytest.approx(np.array([[0.81, 0.86], [0.61, 0.66]]))


def test_the_reports_count_of_trials_left_out_is_the_tables_own(tmp_path):
    """A trial can finish ('ok': its loss stayed finite) without a value (an undefined correlation): the
    tables count it as failed, and so does the report's header."""
    folder = tmp_path / "rows"
    for t in range(4):
        write_row(folder, row(f"a{t}", t=t, k=2, value=float("nan") if t == 3 else 0.7 + 0.01 * t))
    table = T.incremental_table(prepare(read_results(folder)))
    assert list(table["n"]) == [3] and list(table["failed"]) == [1]
    report = build_report(folder, tmp_path / "report", formats=["png"])
    assert "Trials: 4 ok, 0 diverged, 0 error." in report.header
    assert any(line.startswith("Left out of every mean, interval and figure: 0 diverged and 1 failed trials (1 of "
                               "them finished without a dev metric)") for line in report.header), report.header


def test_a_store_from_two_torch_versions_says_so_in_the_summary_and_the_report(tmp_path, capsys):
    from analysis.__main__ import main

    folder = tmp_path / "rows"
    for t in range(5):
        write_row(folder, row(f"a{t}", t=t, torch_version="2.11.0" if t < 2 else "2.13.0",
                              transformers_version="5.24.0"))
    assert main(["summary", str(folder)]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "torch versions" in line]
    assert len(said) == 1 and "2 torch versions (2.11.0: 2 trials, 2.13.0: 3 trials)" in said[0], out
    assert "trunc_normal_" in said[0] and "transformers versions" not in out
    report = build_report(folder, tmp_path / "report", formats=["png"])
    assert said[0] in report.header
    one = prepare(read_results(folder))
    assert T.mixed_versions_lines(one[one["torch_version"] == "2.13.0"]) == []
    # two releases on the same side of 2.12: said, without the draws' change
    (line,) = T.mixed_versions_lines(one.assign(torch_version=["2.13.0+cpu"] * 2 + ["2.13.1"] * 3))
    assert "2 torch versions" in line and "trunc_normal_" not in line


def test_a_trial_that_failed_before_reporting_breaks_nothing(tmp_path):
    folder = tmp_path / "rows"
    write_row(folder, row("early", k=2, status="error"))  # the first file: no metric_name, no dev_metric
    for t in range(2):
        write_row(folder, row(f"ok{t}", k=2, t=t + 1, value=0.7))
    prepared = prepare(read_results(folder))
    table = condition_table(prepared)
    assert len(table) == 1  # no phantom "no finished trial" condition
    assert (table.loc[0, "n"], table.loc[0, "failed"], table.loc[0, "diverged"]) == (2, 1, 0)
    report = build_report(folder, tmp_path / "report", formats=["png"])  # used to raise TypeError sorting
    assert any("1 failed" in line for line in report.header)
    alone = tmp_path / "alone"
    write_row(alone, row("only", status="error"))
    assert build_report(alone, tmp_path / "report2", formats=["png"]).header


def test_k_equal_L_is_one_full_model_reference_whatever_the_mode():
    values = [0.80, 0.82, 0.84]
    rows = [row(f"{m}{t}", mode=m, t=t, value=v) for m in ("intended", "paper-code") for t, v in enumerate(values)]
    rows += [row(f"e{t}", k=0, t=t, value=0.5) for t in range(3)]
    refs = T.reference_table(prepare(pd.DataFrame(rows)))
    full = refs[refs["reference"] == "full model"].iloc[0]
    assert full["n"] == 3 and full["ci95_high"] == pytest.approx(stats.t.interval(
        0.95, 2, loc=np.mean(values), scale=stats.sem(values))[1])


def test_figure_4_counts_permutations_and_averages_their_repeats():
    orders = [[1, 2, 3, 4], [4, 3, 2, 1], [2, 1, 4, 3]]
    rows = []
    for p, order in enumerate(orders):
        for t in range(3):  # three trials of each permutation
            rows.append(row(f"p{p}t{t}", experiment="permutation", k=None, t=t, value=0.6 + 0.05 * p + 0.01 * t,
                            permutation=order, permutation_index=p, permutation_seed=p, reinit_mode=None))
    # another sweep's index 0 is another order: a fourth permutation, not a repeat of the first
    rows.append(row("other", experiment="permutation", k=None, value=0.9, permutation=[1, 3, 2, 4],
                    permutation_index=0, permutation_seed=7, reinit_mode=None))
    table = T.permutation_table(prepare(pd.DataFrame(rows))).iloc[0]
    means = [0.61, 0.66, 0.71, 0.9]
    assert (table["n"], table["trials"]) == (4, 10)
    assert table["mean"] == pytest.approx(np.mean(means))
    assert table["ci95_low"] == pytest.approx(stats.t.interval(0.95, 3, loc=np.mean(means), scale=stats.sem(means))[0])


def test_paired_differences_against_the_full_model_match_scipy():
    full = [0.80, 0.83, 0.79, 0.85, 0.81, 0.84]
    k2 = [0.70, 0.75, 0.72, 0.71, 0.78, 0.74]
    rows = [row(f"f{t}", t=t, value=v) for t, v in enumerate(full)]
    rows += [row(f"k{t}", k=2, t=t, value=v) for t, v in enumerate(k2)]
    rows.append(row("k-extra", k=2, t=9, value=0.1))  # no full model at index 9: not a pair
    table = T.paired_differences(prepare(pd.DataFrame(rows)))
    got = table[table["k"] == 2].iloc[0]
    differences = np.subtract(k2, full)
    assert got["pairs"] == 6 and got["mean_difference"] == pytest.approx(differences.mean())
    assert (got["ci95_low"], got["ci95_high"]) == pytest.approx(
        stats.t.interval(0.95, 5, loc=differences.mean(), scale=stats.sem(differences)))
    assert got["wilcoxon_p"] == pytest.approx(stats.wilcoxon(differences).pvalue)
    # The report shows the interval too, beside the mean difference it belongs to (the table has no std).
    shown = readable(table[table["k"] == 2]).iloc[0]
    assert shown["95% CI"] == f"[{got['ci95_low']:.4f}, {got['ci95_high']:.4f}]"
    assert list(shown.index).index("95% CI") == list(shown.index).index("mean_difference") + 1


def mixed_store(folder):
    """ok, diverged, error, k = L, probing and search rows, the k = L and error rows first by name."""
    write_row(folder, row("0-full"))  # empty reinit_layers
    write_row(folder, row("1-error", k=2, status="error"))
    write_row(folder, row("2-diverged", k=1, status="diverged", value=float("nan")))
    write_row(folder, row("3-ok", k=2, value=0.7, weight_distance=[0.1, 0.2, 0.3, 0.4]))
    write_row(folder, row("4-probe", experiment="probing", k=None, layer=2, probe="mean-pool", stop_epoch=5,
                          val_losses=[0.5, 0.4]))
    write_row(folder, row("5-search", experiment="lr-multipliers", k=2, multipliers=[1.0, 2.0, 0.5, 1.0],
                          cell="c", sample=0, val_objective=0.6, status="pruned"))
    write_row(folder, row("6-new", k=3, some_new_option="x"))  # a column nobody declared yet


def test_every_reader_opens_a_mixed_store_with_no_options(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    folder = tmp_path / "rows"
    mixed_store(folder)
    frame = pd.read_parquet(folder)
    assert len(frame) == 7 and frame["reinit_layers"].map(len).tolist()[:2] == [0, 2]
    table = ds.dataset(folder).to_table()
    assert table.num_rows == 7 and table.schema.field("k").type == SCHEMA.field("k").type
    ((count, pruned),) = duckdb.sql(f"select count(*), count(*) filter (where status = 'pruned') "
                                    f"from read_parquet('{folder}/*.parquet')").fetchall()
    assert (count, pruned) == (7, 1)
    ours = read_results(folder)
    assert len(ours) == 7 and ours.set_index("trial_id").loc["6-new", "some_new_option"] == "x"


def test_compaction_keeps_every_row_skip_done_and_a_rerun(tmp_path):
    folder = tmp_path / "rows"
    n = 3 * COMPACT_AT + 7
    for i in range(n):
        write_row(folder, row(f"t{i:04d}", t=i, status="error" if i == 5 else "ok"))
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) < 20 and sum(f.startswith("part-") for f in files) == 3
    assert not [f for f in files if f.startswith(".")]
    assert finished_trial_ids(folder) == {f"t{i:04d}" for i in range(n)} - {"t0005"}
    write_row(folder, row("t0005", t=5, value=0.9))  # the failed trial run again: its new row wins
    compact(folder)
    rows = read_results(folder)
    assert len(rows) == n and rows.set_index("trial_id").loc["t0005", "status"] == "ok"
    assert rows.attrs["repeated_rows"] == 1  # its error row is kept in a part file, never read as the trial
    assert len(pd.read_parquet(folder)) == n + 1  # as stored: nothing deleted that was not copied first


def test_the_schema_declares_every_identity_field_of_every_experiment():
    from sweep.experiments import EXPERIMENTS, GridSettings

    grid = GridSettings.of(model="m", tasks=("sst2", "cola"), sizes=(100,), trials=((0, 2),), k=(0, 2), layers=(1,),
                        heads=(0,), permutations=2)
    for name, experiment in EXPERIMENTS.items():
        for spec in experiment.build(grid, 2, 2)[:6]:
            columns = spec.row()
            for field in dataclasses.fields(spec):
                if field.name in ("trial_index", "subset_seed", "seed"):
                    assert role(field.name) == REPLICATE
                elif field.name in spec.identity() and field.name in columns:
                    assert role(field.name) == SETTING, (name, field.name)
            for label, _ in spec.own_columns:
                assert label in SCHEMA.names, (name, label)
            for column in spec.ablation.columns():
                assert role(column) == SETTING, (name, column)


def test_importances_are_ped_anova_and_the_same_every_time():
    rng = np.random.default_rng(0)
    rows = []
    for s in range(20):
        m = [1.0, 1.0, 1.0] if s == 0 else [float(x) for x in rng.uniform(0.5, 5, 3)]
        rows.append(row(f"c-s{s}", experiment="lr-multipliers", k=1, multipliers=m, cell="c", sample=s,
                        group="layer", multiplier_low=0.5, multiplier_high=5.0,
                        val_objective=0.5 + 0.1 * np.log(m[1]) + rng.normal(0, 0.01)))
    first = importance_table(prepare(pd.DataFrame(rows)))
    assert first.iloc[0]["param"] == "layer_2" and first.iloc[0]["importance"] > 0.5
    pd.testing.assert_frame_equal(first, importance_table(prepare(pd.DataFrame(rows))))


def test_full_model_rows_from_before_fingerprints_pair_with_the_conditions_their_table_pools_them_with(tmp_path):
    """k = L ran before rows carried fingerprints and counts as done, so a widened grid adds k = 2 with them:
    the condition table pools the old rows with the task's one fingerprint, and so must the pairing."""
    full, k2 = [0.80, 0.83, 0.79, 0.85], [0.70, 0.75, 0.72, 0.71]
    for t, (a, b) in enumerate(zip(full, k2)):
        write_row(tmp_path, row(f"f{t}", t=t, value=a))  # no data_fingerprint, model_fingerprint
        write_row(tmp_path, row(f"k{t}", k=2, t=t, value=b, data_fingerprint="d1", model_fingerprint="m1"))
    prepared = prepare(read_results(tmp_path))
    assert list(condition_table(prepared)["n"]) == [4, 4]  # one condition each: the fingerprints pooled
    got = T.paired_differences(prepared).iloc[0]
    differences = np.subtract(k2, full)
    assert got["pairs"] == 4 and got["mean_difference"] == pytest.approx(differences.mean())
    assert (got["ci95_low"], got["ci95_high"]) == pytest.approx(
        stats.t.interval(0.95, 3, loc=differences.mean(), scale=stats.sem(differences)))


def test_table_1_pairs_tasks_run_at_one_fraction_of_their_own_sizes_and_shows_what_splits_it():
    """--fractions 0.01 gives every task its own train_size (673 and 86): the permutations still pair across
    tasks, at the same fraction. And a setting that splits Table 1 (epochs) is a column of the report's table."""
    orders = [[1, 2, 3, 4], [4, 3, 2, 1], [2, 1, 4, 3], [3, 4, 1, 2], [1, 3, 2, 4]]
    values = {"sst2": [0.60, 0.70, 0.65, 0.80, 0.62], "cola": [0.30, 0.35, 0.20, 0.40, 0.33]}
    sizes = {"sst2": 673, "cola": 86}
    rows = prepare(pd.DataFrame([
        row(f"{task}-{p}", experiment="permutation", task=task, k=None, reinit_mode=None, train_size=sizes[task],
            train_fraction=0.01, value=values[task][p], permutation=order, permutation_index=p, permutation_seed=p)
        for p, order in enumerate(orders) for task in sizes]))
    (got,) = T.permutation_correlations(rows).to_dict("records")
    assert (got["task_a"], got["task_b"], got["n"], got["train_fraction"]) == ("sst2", "cola", 5, 0.01)
    assert got["spearman"] == pytest.approx(stats.spearmanr(values["sst2"], values["cola"]).statistic)
    assert got["pearson_p"] == pytest.approx(stats.pearsonr(values["sst2"], values["cola"]).pvalue)
    shown = readable_correlations(T.permutation_correlations(rows))
    assert "train_fraction" in shown.columns and "train_size" not in shown.columns

    both = prepare(pd.DataFrame([
        row(f"{task}-{epochs}-{p}", experiment="permutation", task=task, k=None, reinit_mode=None, epochs=epochs,
            value=values[task][p] * (1 if epochs == 3 else 1.1), permutation=order, permutation_index=p,
            permutation_seed=p + epochs)
        for epochs in (3, 10) for p, order in enumerate(orders) for task in sizes]))
    shown = readable_correlations(T.permutation_correlations(both))
    assert list(shown["epochs"]) == ["3", "10"] and list(shown["tasks"]) == ["sst2, cola"] * 2


def test_table_1_spearman_p_of_a_few_permutations_is_the_exact_one_not_zero():
    """Four permutations that rank the tasks alike: spearmanr's t approximation says p = 0 ("<0.0001"), but
    one pairing in 24 does that by chance, so the two-sided p is 2/24."""
    orders = [[1, 2, 3, 4], [4, 3, 2, 1], [2, 1, 4, 3], [3, 4, 1, 2]]
    values = {"sst2": [0.60, 0.70, 0.65, 0.80], "cola": [0.30, 0.35, 0.33, 0.40]}
    rows = prepare(pd.DataFrame([
        row(f"{task}-{p}", experiment="permutation", task=task, k=None, reinit_mode=None, value=values[task][p],
            permutation=order, permutation_index=p, permutation_seed=p)
        for p, order in enumerate(orders) for task in values]))
    (got,) = T.permutation_correlations(rows).to_dict("records")
    x, y = values["sst2"], values["cola"]
    observed = stats.spearmanr(x, y).statistic
    null = [stats.spearmanr(np.array(x)[list(order)], y).statistic for order in itertools.permutations(range(4))]
    assert got["spearman"] == pytest.approx(observed) == pytest.approx(1.0)
    assert got["spearman_p"] == pytest.approx(np.mean(np.abs(null) >= abs(observed) - 1e-12)) == pytest.approx(2 / 24)
    assert got["pearson_p"] == pytest.approx(stats.pearsonr(x, y).pvalue)  # exact under normality already
    assert "exact" in got["note"]
    assert readable_correlations(T.permutation_correlations(rows)).iloc[0]["Spearman (p)"] == "1.00 (0.08)"


def test_the_sequential_matrix_names_the_metric_of_each_final_tasks_row():
    # Each row's cells are in its final task's own metric (MCC for CoLA): the matrix did not say which.
    from analysis.format import matrix_readable

    rows = prepare(pd.DataFrame([
        row(f"{task}-{via}-{t}", experiment="sequential", k=None, reinit_mode=None, t=t, task=task,
            metric_name=metric, intermediate_task=None if via == task else via, value=0.5 + 0.01 * t)
        for task, metric in (("cola", "matthews_correlation"), ("sst2", "accuracy")) for via in ("cola", "sst2")
        for t in range(2)]))
    readable = matrix_readable(T.sequential_matrix(rows))
    assert dict(zip(readable["final \\ intermediate"], readable["metric_name"])) == {
        "cola": "matthews_correlation", "sst2": "accuracy"}
