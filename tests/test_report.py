"""The analysis report: per-experiment tables, Table 1's pairing, figures, the index page and the command.

Rendered once per module on hand-made results of every experiment type (tests/test_report_data.py), and
on real sweep results when there are some (REINIT_SWEEP_RESULTS, or the demo runs' usual folders).
"""
from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis import figures as F
from analysis import tables as T
from analysis.__main__ import main
from analysis.report import TABLES, build_report
from analysis.results import load, prepare
from tests.test_report_data import L, make_records, write_results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    return write_results(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def rows(results) -> pd.DataFrame:
    return load(results)


@pytest.fixture(scope="module")
def report(demo_report):
    return demo_report


# --- Table 1: paired by permutation index -----------------------------------------------------------


ORDERS = list(itertools.permutations(range(1, 5)))  # index i: the i-th of the 24 orders of 4 layers


def _permutation_rows(rng, values: dict, shuffle_trial_index=False) -> list[dict]:
    out = []
    for task, per_index in values.items():
        for i, value in per_index.items():
            out.append({"trial_id": f"p-{task}-{i}", "experiment": "permutation", "task": task, "model": "m",
                        "train_size": 5000, "trial_index": int(rng.integers(100)) if shuffle_trial_index else i,
                        "permutation_index": i, "permutation": list(ORDERS[i]),
                        "reinit_layers": [], "reinit_mode": "intended", "metric_name": "accuracy",
                        "status": "ok", "dev_metric": value})
    return out


def test_permutation_correlations_pair_by_permutation_index_not_row_order():
    rng = np.random.default_rng(0)
    quality = rng.normal(size=10)
    values = {
        "sst2": {i: 0.75 + 0.02 * q + rng.normal(0, 0.01) for i, q in enumerate(quality)},
        "qnli": {i: 0.70 + 0.02 * q + rng.normal(0, 0.01) for i, q in enumerate(quality)},
        "cola": {i: round(0.3 + 0.02 * q, 2) for i, q in enumerate(quality)},  # rounded: ties
    }
    rows = prepare(pd.DataFrame(_permutation_rows(rng, values)))
    table = T.permutation_correlations(rows)
    assert list(zip(table["task_a"], table["task_b"])) == [("sst2", "qnli"), ("sst2", "cola"), ("qnli", "cola")]
    for _, r in table.iterrows():
        x = [values[r["task_a"]][i] for i in range(10)]
        y = [values[r["task_b"]][i] for i in range(10)]
        assert r["n"] == 10 and r["note"] == ""
        assert (r["spearman"], r["spearman_p"]) == pytest.approx(tuple(stats.spearmanr(x, y)))
        assert (r["pearson"], r["pearson_p"]) == pytest.approx(tuple(stats.pearsonr(x, y)))
    # shuffled rows and trial indices that say nothing about the permutation: the same table
    records = _permutation_rows(rng, values, shuffle_trial_index=True)
    shuffled = prepare(pd.DataFrame(records).sample(frac=1, random_state=1))
    pd.testing.assert_frame_equal(T.permutation_correlations(shuffled), table)


def test_permutation_correlations_use_only_permutations_both_tasks_finished():
    rng = np.random.default_rng(1)
    values = {"sst2": {i: 0.7 + 0.01 * i + rng.normal(0, 0.003) for i in range(6)},
              "qnli": {i: 0.6 + 0.01 * i for i in range(6) if i != 2}}
    records = _permutation_rows(rng, values)
    records.append({**records[0], "trial_id": "p-sst2-5-failed", "permutation_index": 5, "status": "diverged",
                    "dev_metric": None})
    records.append({**records[0], "trial_id": "p-sst2-0-again", "dev_metric": values["sst2"][0] + 0.01})
    table = T.permutation_correlations(prepare(pd.DataFrame(records)))
    pairs = [0, 1, 3, 4, 5]
    x = [values["sst2"][i] + (0.005 if i == 0 else 0) for i in pairs]  # two trials of permutation 0: averaged
    y = [values["qnli"][i] for i in pairs]
    assert table.loc[0, "n"] == 5
    assert table.loc[0, "spearman"] == pytest.approx(stats.spearmanr(x, y).statistic)
    assert table.loc[0, "pearson_p"] == pytest.approx(stats.pearsonr(x, y).pvalue)


def test_permutation_correlations_pair_by_layer_order_not_by_index():
    """Two sweeps' n-th permutations are different orders: only the same order is paired."""
    rng = np.random.default_rng(2)
    values = {"sst2": {i: 0.7 + 0.01 * i for i in range(4)}, "qnli": {i: 0.6 + 0.02 * i for i in range(4)}}
    records = _permutation_rows(rng, values)
    for r in records:
        if r["task"] == "qnli" and r["permutation_index"] == 3:
            r["permutation"] = [4, 3, 2, 1]  # index 3, but another permutation
    table = T.permutation_correlations(prepare(pd.DataFrame(records)))
    assert table.loc[0, "n"] == 3
    x, y = [values["sst2"][i] for i in range(3)], [values["qnli"][i] for i in range(3)]
    assert table.loc[0, "pearson"] == pytest.approx(stats.pearsonr(x, y).statistic)


# --- tables on every experiment ----------------------------------------------------------------------


def test_every_table_function_returns_a_dataframe_even_without_rows(rows):
    empty = prepare(pd.DataFrame(columns=["trial_id", "status"]))
    for spec in TABLES:
        assert isinstance(spec.function(empty), pd.DataFrame), spec.name
        assert isinstance(spec.function(rows), pd.DataFrame) and not spec.function(rows).empty, spec.name
    for make in F.FIGURES:
        assert make(empty) == [], make.__name__


def test_incremental_table_matches_scipy_and_leaves_out_the_diverged_trial(rows):
    table = T.incremental_table(rows).set_index(["task", "train_size", "k"])
    cell = table.loc[("sst2", 500, 2)]
    values = rows[(rows["experiment"] == "incremental") & (rows["task"] == "sst2") & (rows["train_size"] == 500)
                  & (rows["k"] == 2) & (rows["status"] == "ok")]["dev_metric"].to_numpy()
    assert cell["n"] == len(values) == 9 and cell["excluded"] == 1 and cell["diverged"] == 1
    low, high = stats.t.interval(0.95, 8, loc=values.mean(), scale=stats.sem(values))
    assert (cell["ci95_low"], cell["ci95_high"]) == pytest.approx((low, high))
    assert table.loc[("qnli", 5000, 7), "failed"] == 1


def test_reference_lines_are_incremental_k_L_and_k_0(rows):
    refs = T.reference_table(rows)
    got = T.reference_values(refs, "cola", "bert-base-uncased", 5000)
    inc = rows[(rows["experiment"] == "incremental") & (rows["task"] == "cola") & (rows["train_size"] == 5000)]
    assert got["full model"]["mean"] == pytest.approx(inc[inc["k"] == L]["dev_metric"].mean())
    assert got["embeddings only"]["mean"] == pytest.approx(inc[inc["k"] == 0]["dev_metric"].mean())
    assert got["full model"]["source"] == "incremental"  # preferred over the heads baseline rows


def test_single_layer_table_says_one_trial_and_no_finished_trial(rows):
    table = T.single_layer_table(rows).set_index(["task", "layer"])
    assert table.loc[("cola", 12), "n"] == 1 and table.loc[("cola", 12), "note"] == "one trial: no interval"
    assert np.isnan(table.loc[("cola", 12), "ci95_low"])
    assert table.loc[("cola", 11), "n"] == 0 and table.loc[("cola", 11), "note"] == "no finished trial"


def test_tables_of_the_other_experiments(rows):
    localized = T.localized_table(rows)
    assert set(localized["block_mode"]) == {"block-reinit", "block-preserve"} and localized["block"].iloc[0] == "1-3"
    lr = T.lr_multiplier_table(rows)
    assert set(lr["lr_multiplier"]) == {1.0, 5.0} and set(lr["experiment"]) == {"incremental", "reinit-lr"}
    assert set(lr["train_size"]) == {5000}  # only the incremental cells the reinit-lr grid shares
    layernorm = T.layernorm_table(rows)
    assert set(layernorm["keep_layernorm"]) == {False, True}
    probing = T.probing_table(rows)
    assert sorted(probing["layer"].unique()) == list(range(L + 1)) and "mean_stop_epoch" in probing
    heads = T.heads_table(rows)
    assert len(heads) == 2 * 4 * 12 and heads["delta"].notna().all()
    matrix = T.sequential_matrix(rows)
    assert matrix.shape == (4, 4) and matrix.notna().all().all()
    sequential = T.sequential_table(rows)
    assert (sequential.loc[sequential["final_task"] == sequential["intermediate_task"], "delta"] == 0).all()
    distance = T.weight_distance_table(rows)
    assert set(distance["weight_layer"]) == set(range(1, L + 1))
    assert "mystery" in set(T.other_table(rows)["experiment"])


# --- figures -----------------------------------------------------------------------------------------


def test_incremental_figure_has_size_lines_and_the_probing_curve_dashed(rows):
    (plot,) = F.incremental_figure(rows)
    axes = [ax for ax in plot.figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["SST-2", "QNLI", "CoLA"]
    styles = {line.get_label(): line.get_linestyle() for line in axes[0].get_lines()}
    assert styles["probe (mean-pool), 5,000 examples"] == "--"
    assert styles["finetuned, 500 examples"] == "-" and styles["finetuned, 5,000 examples"] == "-"


def test_localized_figure_draws_the_two_reference_lines(rows):
    (plot,) = F.localized_figure(rows)
    ax = plot.figure.axes[0]
    refs = T.reference_values(T.reference_table(rows), "sst2", "bert-base-uncased", 5000)
    levels = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines()}
    assert levels["full model (all layers pretrained)"] == pytest.approx(refs["full model"]["mean"])
    assert levels["embeddings only (all layers reinitialized)"] == pytest.approx(refs["embeddings only"]["mean"])


def test_every_figure_is_made_on_every_experiment(rows):
    names = [p.name for p in F.all_figures(rows)]
    assert names == ["fig2-incremental", "fig3-localized", "fig4-permutation", "fig5-scatter-n500",
                     "fig6-single-layer", "fig7-reinit-lr", "fig8-layernorm", "weight-distance",
                     "sequential-matrix", "heads", *T.GENERIC]  # then every registered experiment's own


# --- the report --------------------------------------------------------------------------------------


def test_report_writes_every_table_and_figure_and_an_index(report):
    folder = report.folder
    assert {t.name for t in report.tables} == {s.name for s in TABLES}
    assert len(report.figures) == 10 + len(T.GENERIC) + 1  # F.all_figures' and probing vs incremental
    index = (folder / "index.md").read_text()
    page = (folder / "index.html").read_text()
    for item in report.items:
        for name in item.files:
            assert (folder / name).stat().st_size > 0, name
        assert item.api in index and item.files[0] in index and item.files[0] in page
    for item in report.figures:
        assert f"![{item.name}](figures/{item.name}.png)" in index
        assert (folder / "figures" / f"{item.name}.png").read_bytes()[:4] == b"\x89PNG"
        assert (folder / "figures" / f"{item.name}.pdf").read_bytes()[:4] == b"%PDF"
    assert index.count(f"Made by: `{report.command}`") == len(report.items)
    assert "5 diverged and 3 failed trials" in index  # the hand-made set's left-out trials, said once up top
    table1 = (folder / "tables" / "permutation-correlations.md").read_text()
    assert "Spearman (p)" in table1 and "| sst2, qnli |" in table1
    assert (folder / "tables" / "single-layer.tex").read_text().startswith(r"\begin{table}")
    single = (folder / "tables" / "single-layer.md").read_text()
    assert "±2 std" in single and "one trial: no interval" in single and "no finished trial" in single
    csv = pd.read_csv(folder / "tables" / "incremental.csv")
    assert {"ci95_low", "ci95_high", "excluded", "n"} <= set(csv.columns)


def test_report_cli_on_a_partial_sweep(tmp_path, capsys):
    # A sweep still filling: some cells, some failed, the permutation grid half done.
    records = [r for r in make_records() if r["experiment"] in ("incremental", "permutation")]
    records = [r for r in records if not (r["experiment"] == "permutation" and r["permutation_index"] >= 4)]
    records = [r for r in records if not (r["experiment"] == "incremental" and r["k"] % 4)]
    write_results(tmp_path / "results", records)
    assert main(["report", str(tmp_path / "results"), "--out", str(tmp_path / "out"), "--formats", "png"]) == 0
    out = capsys.readouterr().out
    assert "figures" in out and "1 diverged" not in out
    made = sorted(p.name for p in (tmp_path / "out" / "figures").iterdir())
    assert made == ["fig2-incremental.png", "fig4-permutation.png", "fig5-scatter-n500.png", "weight-distance.png"]
    assert main(["summary", str(tmp_path / "results")]) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty), "--out", str(tmp_path / "none")]) == 1


REAL_DEFAULT = os.pathsep.join(["/tmp/sst2run/sst2-minilm", "/tmp/demo/incremental"])
REAL = [Path(p) for p in os.environ.get("REINIT_SWEEP_RESULTS", REAL_DEFAULT).split(os.pathsep) if p]


@pytest.mark.parametrize("source", REAL, ids=[p.name for p in REAL])
def test_report_on_real_sweep_results(source, tmp_path):
    if not source.exists() or not any(source.rglob("*.parquet")):
        pytest.skip(f"no sweep results at {source} (set REINIT_SWEEP_RESULTS to a results folder)")
    made = build_report(source, tmp_path / "report")
    names = {p.name for p in made.figures}
    assert "fig2-incremental" in names and (tmp_path / "report" / "index.md").exists()
    table = T.incremental_table(load(source))
    ok = load(source).query("status == 'ok'")
    assert table["n"].sum() == len(ok[ok["experiment"] == "incremental"])


def test_analysis_imports_neither_sweep_nor_trainables():
    code = ("import sys, analysis, analysis.report, analysis.figures, analysis.__main__\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sweep', 'trainables', 'torch', 'ray')); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # the results store (sweep/store.py) reads rows with analysis.results: that stays light
    light = subprocess.run([sys.executable, "-c", "import sys, analysis.results; "
                            "print([m for m in ('matplotlib', 'scipy') if m in sys.modules])"],
                           cwd=ROOT, capture_output=True, text=True)
    assert light.stdout.strip() == "[]", light.stdout + light.stderr
    for path in (ROOT / "analysis").glob("*.py"):  # not even lazily, inside a function
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] in ("sweep", "trainables")], (path, names)
