"""Statistics from Parquet rows: intervals against scipy, one-trial conditions, excluded trials."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.results import read_results
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
