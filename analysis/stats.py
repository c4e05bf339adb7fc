"""Per-condition statistics with honest intervals: scipy's t-distribution with n-1 degrees of freedom."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

# Columns that identify a condition (everything a trial index is paired across).
CONDITION_COLUMNS = ["experiment", "task", "model", "train_size", "k", "reinit_mode", "metric_name"]


def t_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided t-interval of the mean; (nan, nan) for fewer than two values rather than a made-up one."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float("nan"), float("nan")
    if np.all(values == values[0]):  # zero spread: scipy would return nan from 0 * inf
        return float(values[0]), float(values[0])
    low, high = stats.t.interval(confidence, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    return float(low), float(high)


def condition_table(rows: pd.DataFrame, value: str = "dev_metric") -> pd.DataFrame:
    """n, mean, std, 95% t-interval and +-2 std per condition, from finished (status ok) trials only;
    `excluded` counts the diverged and failed trials left out of each condition."""
    by = [c for c in CONDITION_COLUMNS if c in rows.columns]
    ok = rows["status"] == "ok"
    records = []
    for key, group in rows.groupby(by, dropna=False, sort=True):
        values = group.loc[ok.loc[group.index], value].astype(float).to_numpy()
        low, high = t_interval(values)
        std = float(values.std(ddof=1)) if len(values) > 1 else float("nan")
        records.append({
            **dict(zip(by, key)),
            "n": len(values),
            "excluded": int((~ok.loc[group.index]).sum()),
            "mean": float(values.mean()) if len(values) else float("nan"),
            "std": std,
            "ci95_low": low,
            "ci95_high": high,
            "mean_minus_2std": float(values.mean()) - 2 * std if len(values) > 1 else float("nan"),
            "mean_plus_2std": float(values.mean()) + 2 * std if len(values) > 1 else float("nan"),
            "note": "" if len(values) > 1 else ("one trial: no interval" if len(values) else "no finished trial"),
        })
    return pd.DataFrame.from_records(records)
