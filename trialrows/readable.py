"""Tables for people: numbers rounded, counts as counts, the interval in one column, empty columns dropped.
Shared by the sweep's closing table and the analysis (analysis.format writes them as Markdown, LaTeX or
HTML); the CSV files keep the raw numbers."""
from __future__ import annotations

import numpy as np
import pandas as pd

# Columns of the raw tables that the readable form folds into others or leaves to the CSV.
FOLDED = {"ci95_low", "ci95_high", "mean_minus_2std", "mean_plus_2std", "excluded"}
P_VALUES = {"spearman_p", "pearson_p", "wilcoxon_p"}
QUIET = ("keep_layernorm", "reinit_pooler", "reinit_mode")


def number(value, digits: int = 4) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (tuple, list, np.ndarray)):  # a search's multipliers were printed to 17 digits each
        return "(" + ", ".join(f"{v:.3g}" if isinstance(v, (float, np.floating)) else str(v) for v in value) + ")"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if float(value).is_integer() and abs(value) < 1e6 and digits == 0:
            return str(int(value))
        return f"{value:.{digits}f}"
    return str(value)


def p_value(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "n/a"  # no test could be made: the note says why
    return "<0.0001" if value < 1e-4 else f"{value:.4f}"


def readable(table: pd.DataFrame, two_std: bool = False) -> pd.DataFrame:
    """The table as strings: n, diverged and failed counts beside 'mean', 'std', '95% CI' as [low, high],
    '±2 std' (when `two_std`); columns empty everywhere, and reinit_mode / keep_layernorm where constant,
    left out."""
    if table.empty:
        return table.astype(str)
    table = table.copy()
    out = pd.DataFrame(index=table.index)
    # The interval goes beside the spread it comes from: a condition's std, or a paired table's mean difference
    # (which has no std column of its own), else beside the mean (a precision target's Stein interval).
    anchor = next((c for c in ("std", "mean_difference", "mean") if c in table.columns), None)
    for column in table.columns:
        if column in FOLDED:
            continue
        series = table[column]
        if (series.isna().all() or (series.astype(str) == "").all()) and column not in P_VALUES:
            continue  # a test that could not be made stays, as "n/a" beside the note that says why
        if column in QUIET and series.nunique(dropna=False) <= 1:
            continue
        if column in P_VALUES:
            out[column] = series.map(p_value)
        elif column in ("mean", "std", "mean_difference", "spearman", "pearson", "baseline", "delta", "direct",
                        "mean_val_objective", "chance"):
            out[column] = series.map(number)
        elif column in ("train_size", "n", "diverged", "failed", "k", "layer", "head", "block_start", "block_size",
                        "pairs", "permutations", "at_chance", "needed", "trials", "values", "pilot_trials",
                        "max_trials", "best_sample", "completed", "pruned"):  # float where one row has none
            out[column] = series.map(lambda v: number(v, 0))
        elif column == "lr_multiplier":
            out[column] = series.map(lambda v: "" if pd.isna(v) else f"{v:g}x")
        elif column == "mean_stop_epoch":
            out[column] = series.map(lambda v: number(v, 1))
        else:
            out[column] = series.map(lambda v: number(v))
        if column == anchor and "ci95_low" in table.columns:
            out["95% CI"] = [
                "" if np.isnan(lo) else f"[{lo:.4f}, {hi:.4f}]" for lo, hi in zip(table["ci95_low"], table["ci95_high"])
            ]
            if two_std and "std" in table.columns:
                out["±2 std"] = ["" if np.isnan(s) else f"±{2 * s:.4f}" for s in table["std"].astype(float)]
    if "note" in out.columns and (out["note"] == "").all():
        out = out.drop(columns="note")
    return out.reset_index(drop=True)
