"""Per-condition statistics with honest intervals, and paired correlations; every number from scipy.

- Intervals: two-sided t-interval of the mean with n-1 degrees of freedom (`scipy.stats.t.interval`), the
  sample standard deviation (ddof=1), and mean +- 2 std where the paper used it. One trial gives a mean
  and no interval, said so in `note`.
- Only trials with status 'ok' enter a mean; diverged and failed trials are counted (`excluded`, and by
  kind in `diverged` and `failed`), never averaged.
- Correlations: `scipy.stats.spearmanr` and `scipy.stats.pearsonr`, two-sided p-values.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats

# Columns that identify a condition in every experiment (everything a trial index is paired across).
CONDITION_COLUMNS = ["experiment", "task", "model", "train_size", "k", "reinit_mode", "metric_name"]
# Columns that identify a condition in some experiments; used when the rows carry them.
EXTRA_CONDITION_COLUMNS = [
    "lr_multiplier", "block_mode", "block_start", "block_size", "layer", "head", "probe", "intermediate_task",
    "cell", "keep_layernorm", "reinit_pooler",
]  # fmt: skip
# Shown only where they vary: every row carries them, and they are constant in most sweeps.
QUIET_COLUMNS = ("keep_layernorm", "reinit_pooler")

ONE_TRIAL = "one trial: no interval"
NO_TRIAL = "no finished trial"


def t_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided t-interval of the mean; (nan, nan) for fewer than two values rather than a made-up one."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float("nan"), float("nan")
    if np.all(values == values[0]):  # zero spread: scipy would return nan from 0 * inf
        return float(values[0]), float(values[0])
    low, high = stats.t.interval(confidence, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    return float(low), float(high)


def describe(values, confidence: float = 0.95) -> dict:
    """n, mean, std (ddof=1), t-interval, mean +- 2 std and a note for one sample of values."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    mean = float(values.mean()) if n else float("nan")
    std = float(values.std(ddof=1)) if n > 1 else float("nan")
    low, high = t_interval(values, confidence)
    return {
        "n": n,
        "mean": mean,
        "std": std,
        "ci95_low": low,
        "ci95_high": high,
        "mean_minus_2std": mean - 2 * std,
        "mean_plus_2std": mean + 2 * std,
        "note": "" if n > 1 else (ONE_TRIAL if n else NO_TRIAL),
    }


def summarize(rows: pd.DataFrame, by: list[str], value: str = "dev_metric", confidence: float = 0.95):
    """One row per combination of `by` present in `rows`: `describe` of `value` over the finished trials,
    plus how many trials were left out (`excluded` = `diverged` + `failed`; a finished trial without a
    value counts as failed)."""
    by = [c for c in by if c in rows.columns]
    columns = [*by, "n", "excluded", "diverged", "failed", "mean", "std", "ci95_low", "ci95_high",
               "mean_minus_2std", "mean_plus_2std", "note"]
    if rows.empty or value not in rows.columns:
        return pd.DataFrame(columns=columns)
    values = pd.to_numeric(rows[value], errors="coerce")
    usable = (rows["status"] == "ok") & values.notna()
    records = []
    groups = rows.groupby(by, dropna=False, sort=True) if by else [((), rows)]
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        good = usable.loc[group.index]
        diverged = int((group["status"] == "diverged").sum())
        records.append({
            **dict(zip(by, key)),
            **describe(values.loc[group.index][good], confidence),
            "excluded": int((~good).sum()),
            "diverged": diverged,
            "failed": int((~good).sum()) - diverged,
        })
    return pd.DataFrame.from_records(records, columns=columns)


def condition_columns(rows: pd.DataFrame) -> list[str]:
    """The columns that tell conditions apart in `rows`: the common ones, and each experiment-specific
    one that is set somewhere (keep_layernorm and reinit_pooler only where they vary)."""
    extra = [
        c for c in EXTRA_CONDITION_COLUMNS
        if c in rows.columns and rows[c].notna().any() and (c not in QUIET_COLUMNS or rows[c].nunique() > 1)
    ]
    by = [c for c in CONDITION_COLUMNS if c in rows.columns]
    return by[:-1] + extra + by[-1:] if by and by[-1] == "metric_name" else by + extra


def condition_table(rows: pd.DataFrame, value: str = "dev_metric") -> pd.DataFrame:
    """n, mean, std, 95% t-interval and +-2 std per condition, from finished (status ok) trials only;
    `excluded` counts the diverged and failed trials left out of each condition."""
    return summarize(rows, condition_columns(rows), value)


def correlation(x, y) -> dict:
    """Spearman and Pearson correlation of paired samples with two-sided p-values (scipy). Fewer than three
    pairs, or a constant side, give nan and a note instead of a number."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = len(x)
    out = {"n": n, "spearman": np.nan, "spearman_p": np.nan, "pearson": np.nan, "pearson_p": np.nan, "note": ""}
    if n < 3:
        out["note"] = f"{n} pairs: too few for a correlation"
        return out
    if np.all(x == x[0]) or np.all(y == y[0]):
        out["note"] = "one side is constant: no correlation"
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spearman = stats.spearmanr(x, y)
        pearson = stats.pearsonr(x, y)
    out.update(spearman=float(spearman.statistic), spearman_p=float(spearman.pvalue),
               pearson=float(pearson.statistic), pearson_p=float(pearson.pvalue))
    return out
