"""Statistics from Parquet rows: intervals against scipy, one-trial conditions, excluded trials."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.results import read_results, read_table
from analysis.stats import condition_table, t_interval


def test_t_interval_matches_scipy_with_n_minus_1_degrees_of_freedom():
    values = np.array([0.81, 0.84, 0.79, 0.9, 0.86])
    low, high = t_interval(values)
    half = stats.t.ppf(0.975, df=4) * values.std(ddof=1) / np.sqrt(5)
    assert (low, high) == pytest.approx((values.mean() - half, values.mean() + half))
    assert np.isnan(t_interval([0.8])).all()
    assert t_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)


def test_condition_table_counts_and_leaves_out_failed_trials(tmp_path):
    rows = pd.DataFrame({
        "trial_id": list("abcde"), "experiment": "incremental", "task": "sst2", "model": "m",
        "train_size": 500, "k": [0, 0, 0, 6, 6], "reinit_mode": "intended", "metric_name": "accuracy",
        "status": ["ok", "ok", "diverged", "ok", "error"], "dev_metric": [0.5, 0.6, np.nan, 0.9, np.nan],
    })
    path = tmp_path / "rows.parquet"
    rows.to_parquet(path)
    table = condition_table(read_results(path)).set_index("k")
    assert table.loc[0, "n"] == 2 and table.loc[0, "excluded"] == 1
    assert table.loc[0, "mean"] == pytest.approx(0.55)
    assert table.loc[6, "n"] == 1 and table.loc[6, "note"] == "one trial: no interval"
    assert np.isnan(table.loc[6, "ci95_low"])


# --- intervals and correlations against scipy, on hand-made data --------------------------------------

from analysis.results import prepare  # noqa: E402
from analysis.stats import condition_columns, correlation, describe, summarize  # noqa: E402


def _scipy_summary(values):
    values = np.asarray(values, dtype=float)
    mean, std = values.mean(), values.std(ddof=1)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=std / np.sqrt(len(values)))
    return mean, std, low, high


@pytest.mark.parametrize("values", [
    [0.5, 0.7],  # n=2: t with one degree of freedom, a very wide interval
    [0.81, 0.84, 0.79, 0.9, 0.86],
    [0.8, 0.8, 0.9, 0.9, 0.9, 0.7],  # ties
    list(np.random.default_rng(3).normal(0.6, 0.1, 50)),  # the paper's 50 trials at 500 examples
])
def test_describe_matches_scipy_t_interval_with_n_minus_1_df(values):
    got = describe(values)
    mean, std, low, high = _scipy_summary(values)
    assert got["n"] == len(values) and got["note"] == ""
    assert got["mean"] == pytest.approx(mean) and got["std"] == pytest.approx(std)
    assert (got["ci95_low"], got["ci95_high"]) == pytest.approx((low, high))
    assert (got["mean_minus_2std"], got["mean_plus_2std"]) == pytest.approx((mean - 2 * std, mean + 2 * std))
    # the half-width is t_{0.975, n-1} * s / sqrt(n), not a normal 1.96 and not a population std
    assert got["ci95_high"] - mean == pytest.approx(stats.t.ppf(0.975, len(values) - 1) * std / np.sqrt(len(values)))


def test_describe_one_trial_and_none_say_so_instead_of_an_interval():
    one = describe([0.73])
    assert one["n"] == 1 and one["mean"] == 0.73 and one["note"] == "one trial: no interval"
    assert all(np.isnan(one[c]) for c in ("std", "ci95_low", "ci95_high", "mean_minus_2std", "mean_plus_2std"))
    none = describe([])
    assert none["n"] == 0 and np.isnan(none["mean"]) and none["note"] == "no finished trial"


def test_summarize_groups_leaves_out_diverged_and_failed_and_counts_them():
    rows = pd.DataFrame({
        "task": ["a"] * 6 + ["b"] * 3,
        "status": ["ok", "ok", "ok", "diverged", "error", "ok", "ok", "error", "error"],
        "dev_metric": [0.6, 0.7, 0.9, np.nan, np.nan, np.nan, 0.5, 0.9, np.nan],  # an ok row with no value
    })
    table = summarize(rows, ["task"]).set_index("task")
    mean, std, low, high = _scipy_summary([0.6, 0.7, 0.9])
    assert table.loc["a", "n"] == 3 and table.loc["a", "excluded"] == 3
    assert table.loc["a", "diverged"] == 1 and table.loc["a", "failed"] == 2
    assert (table.loc["a", "ci95_low"], table.loc["a", "ci95_high"]) == pytest.approx((low, high))
    # a failed trial's metric (if it has one) never enters the mean
    assert table.loc["b", "n"] == 1 and table.loc["b", "mean"] == 0.5
    assert table.loc["b", "note"] == "one trial: no interval"


def test_condition_columns_take_each_experiments_own_columns():
    rows = prepare(pd.DataFrame({
        "trial_id": list("abcd"), "experiment": ["incremental", "incremental", "localized", "localized"],
        "task": "sst2", "model": "m", "train_size": 500, "k": [0, 6, None, None], "reinit_mode": "intended",
        "block_mode": [None, None, "block-reinit", "block-preserve"], "block_start": [None, None, 1, 1],
        "keep_layernorm": False, "metric_name": "accuracy", "status": "ok", "dev_metric": [0.5, 0.8, 0.7, 0.6],
    }))
    by = condition_columns(rows)
    assert "block_mode" in by and "block_start" in by and "keep_layernorm" not in by
    table = condition_table(rows)
    assert len(table) == 4 and (table["n"] == 1).all()  # the two localized modes are not pooled


@pytest.mark.parametrize("x, y", [
    ([0.1, 0.4, 0.35, 0.8, 0.6, 0.2, 0.9, 0.5, 0.45, 0.7], [0.3, 0.5, 0.3, 0.9, 0.7, 0.1, 0.8, 0.65, 0.4, 0.6]),
    ([1, 2, 2, 3, 3, 3, 4, 5, 5, 6], [2, 1, 2, 2, 4, 3, 5, 5, 6, 6]),  # ties on both sides
    ([0.8, 0.8, 0.9], [0.1, 0.3, 0.2]),  # three pairs, ties
])
def test_correlation_matches_scipy_including_ties(x, y):
    got = correlation(x, y)
    spearman, pearson = stats.spearmanr(x, y), stats.pearsonr(x, y)
    assert got["n"] == len(x) and (got["note"] == "") == (len(x) > 8)
    p = spearman.pvalue if len(x) > 8 else stats.permutation_test(  # few pairs: every pairing, not the t approximation
        (x,), lambda v: stats.spearmanr(v, y).statistic, permutation_type="pairings").pvalue
    assert (got["spearman"], got["spearman_p"]) == pytest.approx((spearman.statistic, p))
    assert (got["pearson"], got["pearson_p"]) == pytest.approx((pearson.statistic, pearson.pvalue))
    # Spearman with ties is Pearson on average ranks
    assert got["spearman"] == pytest.approx(np.corrcoef(stats.rankdata(x), stats.rankdata(y))[0, 1])
    assert got["pearson"] == pytest.approx(np.corrcoef(x, y)[0, 1])


def test_correlation_refuses_too_few_pairs_and_constant_sides():
    assert correlation([0.1, 0.2], [0.3, 0.1])["note"].startswith("2 pairs")
    constant = correlation([0.5, 0.5, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4])
    assert np.isnan(constant["spearman"]) and np.isnan(constant["pearson"]) and "constant" in constant["note"]


def test_prepare_makes_integer_columns_integers_and_counts_a_trial_once(tmp_path):
    a = pd.DataFrame({"trial_id": ["t1", "t2"], "experiment": ["incremental", "permutation"], "k": [3, None],
                      "permutation_index": [None, 4], "status": ["ok", "ok"], "dev_metric": [0.7, 0.6],
                      "finished_at": ["2026-01-01", "2026-01-01"]})
    b = pd.DataFrame({"trial_id": ["t1"], "experiment": ["incremental"], "k": [3], "status": ["error"],
                      "dev_metric": [None], "finished_at": ["2026-01-02"]})
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    a.to_parquet(tmp_path / "one" / "rows.parquet")
    b.to_parquet(tmp_path / "two" / "rows.parquet")
    (tmp_path / "one" / ".t3.tmp.parquet").write_bytes(b"half a file")  # written aside: never read
    assert read_table(tmp_path).num_rows == 3  # as stored
    raw = read_results(tmp_path)  # one row per trial
    assert len(raw) == 2 and raw.attrs["repeated_rows"] == 1
    rows = prepare(raw)
    assert len(rows) == 2 and str(rows["k"].dtype) == "Int64" and str(rows["permutation_index"].dtype) == "Int64"
    assert rows.set_index("trial_id").loc["t1", "status"] == "ok"  # the finished copy wins over the failed one
