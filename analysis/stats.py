"""Per-condition statistics with honest intervals (trialrows.summaries, which the sweep prints with too), and
paired correlations; every number from scipy.

- Correlations: `scipy.stats.spearmanr` and `scipy.stats.pearsonr`, two-sided p-values; Spearman's p over at
  most `EXACT_SPEARMAN` pairs from every pairing (`scipy.stats.permutation_test`), as spearmanr's t
  approximation gives 0 to three pairs in the same order, whose exact p is 1/3.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats

from trialrows.summaries import (  # noqa: F401
    DERIVED, LEADING_COLUMNS, NO_TRIAL, ONE_TRIAL, condition_columns, condition_table, describe, groupable,
    implied_dropped, split_settings, stein_outcomes, summarize, t_interval, with_stein_intervals,
)


EXACT_SPEARMAN = 8  # 8! = 40,320 pairings, enumerated in a fraction of a second; the paper's N = 10 stays asymptotic


def correlation(x, y) -> dict:
    """Spearman and Pearson correlation of paired samples with two-sided p-values (scipy). Fewer than three
    pairs, or a constant side, give nan and a note instead of a number. Up to `EXACT_SPEARMAN` pairs,
    Spearman's p is exact (every pairing of the values), and the note says so."""
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
    if n <= EXACT_SPEARMAN:
        out["spearman_p"] = exact_spearman_p(x, y)
        out["note"] = f"{n} pairs: Spearman's p exact, over all {math.factorial(n):,} pairings"
    return out


def exact_spearman_p(x, y) -> float:
    """Two-sided p of Spearman's rho under independence, from every ordering of `x` against `y`
    (scipy.stats.permutation_test; ties keep their average ranks, as spearmanr gives them)."""
    ranks_y = stats.rankdata(y)
    ranks_y = ranks_y - ranks_y.mean()

    def rho(values, axis):
        ranks = np.moveaxis(stats.rankdata(values, axis=axis), axis, -1)
        ranks = ranks - ranks.mean(axis=-1, keepdims=True)
        return (ranks @ ranks_y) / np.sqrt((ranks ** 2).sum(axis=-1) * (ranks_y @ ranks_y))

    return float(stats.permutation_test((np.asarray(x, dtype=float),), rho, permutation_type="pairings",
                                        vectorized=True, n_resamples=math.factorial(len(x))).pvalue)
