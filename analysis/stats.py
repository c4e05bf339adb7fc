"""Per-condition statistics with honest intervals (trialrows.summaries, which the sweep prints with too), and
paired correlations; every number from scipy.

- Correlations: `scipy.stats.spearmanr` and `scipy.stats.pearsonr`, two-sided p-values.
"""
from __future__ import annotations

import warnings

import numpy as np
from scipy import stats

from trialrows.summaries import (  # noqa: F401
    DERIVED, LEADING_COLUMNS, NO_TRIAL, ONE_TRIAL, condition_columns, condition_table, describe, groupable,
    implied_dropped, split_settings, stein_outcomes, summarize, t_interval, with_stein_intervals,
)


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
