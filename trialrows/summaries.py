"""Per-condition statistics with honest intervals, every number from scipy, and a search's best trial per cell:
what the sweep prints when it ends and the analysis reports.

- Intervals: two-sided t-interval of the mean with n-1 degrees of freedom (`scipy.stats.t.interval`), the
  sample standard deviation (ddof=1), and mean +- 2 std where the paper used it. One trial gives a mean
  and no interval, said so in `note`.
- Only trials with status 'ok' enter a mean; diverged and failed trials are counted (`excluded`, and by
  kind in `diverged` and `failed`), never averaged.
- A condition a precision-targeted sweep ran (`--target-ci` on its mean; trialrows.precision) gets the interval
  whose coverage Stein's two-stage procedure guarantees, over the N trials the procedure chose: mean +-
  t_{n0-1} s0 / sqrt(N), not the t-interval on N-1 degrees of freedom; its `note` says so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from trialrows.read import as_list
from trialrows.conditions import (  # noqa: F401  (re-exported: the summaries' readers use them)
    DERIVED, FINGERPRINT_OF, LEADING_COLUMNS, assume_fingerprints, condition_columns, groupable, implied_dropped,
    split_settings,
)


# What `summarize` gives each condition, after the columns that name it.
STATISTICS = ["n", "excluded", "diverged", "failed", "mean", "std", "ci95_low", "ci95_high", "mean_minus_2std",
              "mean_plus_2std", "note", "chance", "at_chance"]
ONE_TRIAL = "one trial: no interval"
NO_TRIAL = "no finished trial"


def t_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided t-interval of the mean; (nan, nan) for fewer than two values rather than a made-up one."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float("nan"), float("nan")
    if np.all(values == values[0]):  # zero spread: scipy would return nan from 0 * inf
        return float(values[0]), float(values[0])
    from scipy import stats  # here: a second of every command's start (sweep.cli reads these modules)

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


def summarize(rows: pd.DataFrame, by: list[str], value: str = "dev_metric", confidence: float = 0.95,
              pooled=()):
    """One row per condition: per combination of `by` present in `rows`, split further by every setting
    that varies within it (`split_settings`; so two settings are never pooled by accident) except those
    named in `pooled`: `describe` of `value` over the finished trials, plus how many trials were left out
    (`excluded` = `diverged` + `failed`; a finished trial without a value counts as failed)."""
    rows = groupable(rows)
    by = [c for c in by if c in rows.columns]
    by += split_settings(rows, by, (*pooled, value))
    columns = [*by, *STATISTICS]
    if rows.empty or value not in rows.columns:
        return pd.DataFrame(columns=columns)
    values = pd.to_numeric(rows[value], errors="coerce")
    usable = (rows["status"] == "ok") & values.notna()
    # Only the columns the groups need: slicing ~100 columns per group is what made this slow.
    # A precision target is on the headline metric (not on a weight distance or a per-permutation mean).
    outcomes, lines = stein_outcomes(rows) if value == "dev_metric" else (None, pd.Series(-1, index=rows.index))
    frame = rows[by].assign(_value=values.where(usable), _left=~usable, _diverged=rows["status"] == "diverged",
                            _line=lines)
    groups = frame.groupby(by, dropna=False, sort=False) if by else frame.groupby(np.zeros(len(frame)))
    table = groups.agg(n=("_value", "count"), mean=("_value", "mean"), std=("_value", "std"),
                       excluded=("_left", "sum"), diverged=("_diverged", "sum"), _first=("_line", "min"),
                       _last=("_line", "max"))
    table = (table.reset_index() if by else table.reset_index(drop=True))
    from scipy import stats

    n = table["n"].to_numpy()
    half = stats.t.ppf((1 + confidence) / 2, np.maximum(n - 1, 1)) * table["std"].to_numpy() / np.sqrt(np.maximum(n, 1))
    half = np.where(table["std"].to_numpy() == 0, 0.0, half)  # zero spread: an interval of one point
    table["ci95_low"], table["ci95_high"] = table["mean"] - half, table["mean"] + half
    table["failed"] = table["excluded"] - table["diverged"]
    table["note"] = np.where(n > 1, "", np.where(n == 1, ONE_TRIAL, NO_TRIAL))
    table = with_stein_intervals(table, outcomes, "n", "mean")
    # after Stein's replaced a condition's std, mean and count with those of its N values
    two_std = 2 * table["std"]
    table["mean_minus_2std"], table["mean_plus_2std"] = table["mean"] - two_std, table["mean"] + two_std
    table = table.astype({"n": int, "excluded": int, "diverged": int, "failed": int})
    chance = chance_columns(rows, by, usable if value == "dev_metric" else None)
    table = table.merge(chance, on=by, how="left") if by else pd.concat([table, chance], axis=1)
    return _sorted(table[columns], by)


def chance_columns(rows: pd.DataFrame, by: list[str], usable: pd.Series | None) -> pd.DataFrame:
    """Per condition, `chance`: the dev score of the best constant prediction (the majority class), where a
    model that learned nothing lands; `at_chance`: how many of its finished trials predicted one constant
    for every dev example (their score is a constant's share, not something learned). Rows that do not
    record it (older ones; a value other than the dev metric: `usable` None) give nan and 0."""
    def column(name):
        return pd.to_numeric(rows[name], errors="coerce") if name in rows.columns and usable is not None \
            else pd.Series(np.nan, index=rows.index)

    frame = rows[by].assign(_chance=column("dev_chance_metric"),
                            _at=(usable if usable is not None else False) & column("dev_constant_prediction").eq(1))
    groups = frame.groupby(by, dropna=False, sort=False) if by else frame.groupby(np.zeros(len(frame)))
    table = groups.agg(chance=("_chance", "median"), at_chance=("_at", "sum"))
    table = table.reset_index() if by else table.reset_index(drop=True)
    table["at_chance"] = table["at_chance"].astype(float).where(table["chance"].notna())  # unknown, not 0
    return table


def stein_outcomes(rows: pd.DataFrame) -> tuple[pd.DataFrame | None, pd.Series]:
    """(the precision-targeted conditions' outcomes, each row's line in it: -1 for none); (None, all -1) for
    rows no precision-targeted sweep wrote (trialrows.precision.precision_outcomes)."""
    from trialrows.precision import precision_outcomes, targeted

    if not targeted(rows):
        return None, pd.Series(-1, index=rows.index)
    return precision_outcomes(rows)


def with_stein_intervals(table: pd.DataFrame, outcomes: pd.DataFrame | None, n: str, mean: str, on: str = "mean"):
    """`table` (with the `_first`, `_last` precision lines of each group's rows) with Stein's interval, count
    and mean where a group is exactly one precision-targeted condition (on `on`) whose trials have all
    finished; the helper columns dropped."""
    from trialrows.precision import PILOT, REFERENCE, STAGE_TWO

    one = (table["_first"] == table["_last"]) & (table["_first"] >= 0)
    table = table.drop(columns=["_first", "_last"]).assign(_line=table["_first"].where(one, -1))
    if outcomes is None or not one.any():
        return table.drop(columns="_line")
    done = outcomes[(outcomes["target_on"] == on) & ~outcomes["state"].isin([PILOT, STAGE_TWO, REFERENCE])]
    picked = table["_line"].isin(done.index)
    found = done.loc[table.loc[picked, "_line"]]
    table = table.astype({n: float}) if picked.any() else table
    for mine, theirs in ((n, "values"), (mean, "mean"), ("ci95_low", "ci95_low"), ("ci95_high", "ci95_high")):
        table.loc[picked, mine] = found[theirs].to_numpy(float)
    if "std" in table:  # the spread of the same N values: rows past N (a wider earlier plan) are not in them
        table.loc[picked, "std"] = found["std"].to_numpy(float)
    table.loc[picked, "note"] = [f"Stein two-stage interval (n0 {int(r.pilot_trials)}, W {r.target_ci:g}): {r.state}"
                                 + (f"; {r.note}" if r.note else "") for r in found.itertuples()]
    return table.drop(columns="_line")


def _sorted(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Rows in the order of `by`, nulls last; values of mixed types (a None beside strings) never raise."""
    if table.empty or not by:
        return table
    key = lambda s: s.map(lambda v: (1, "") if _missing(v) else (0, str(v))) if s.dtype == object else s  # noqa: E731
    return table.sort_values(by, key=key, kind="stable", na_position="last").reset_index(drop=True)


def _missing(value) -> bool:
    return value is None or (np.isscalar(value) and pd.isna(value))



def condition_table(rows: pd.DataFrame, value: str = "dev_metric") -> pd.DataFrame:
    """n, mean, std, 95% t-interval and +-2 std per condition, from finished (status ok) trials only;
    `excluded` counts the diverged and failed trials left out of each condition, by kind in `diverged`
    and `failed`."""
    rows = _metric_named(rows)
    return summarize(rows, condition_columns(rows), value)


def _metric_named(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows as read from the store (the sweep's summary) with every metric name filled (metric_names)."""
    if "metric_name" not in rows.columns or "task" not in rows.columns or rows["metric_name"].notna().all():
        return rows
    return rows.assign(metric_name=metric_names(rows))


def metric_names(rows: pd.DataFrame) -> pd.Series:
    """Each row's metric name; a trial that failed before its first report has none and takes its task's (the
    most common among the task's rows), so it counts in its own condition's `failed` rather than as a
    condition of its own beside it."""
    names = rows["metric_name"].astype(object)
    known = names.notna()
    if known.all() or not known.any():
        return names.where(known, None)
    by_task = rows[known].groupby("task")["metric_name"].agg(lambda m: m.mode().iloc[0])
    return names.where(known, rows["task"].map(by_task)).where(lambda s: s.notna(), None)


# --- the lr-multipliers search: per cell, its best trial against its baseline -------------------------------

CELL_COLUMNS = ["cell", "task", "model", "train_size", "k", "group", "metric_name"]
BEST_COLUMNS = [*CELL_COLUMNS, "trials", "completed", "pruned", "failed", "baseline_val", "baseline_dev",
                "best_sample", "best_multipliers", "best_val", "best_dev", "dev_delta"]


def search_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The lr-multipliers rows, with the columns this module reads (rows written before a column existed
    read as: trial order by row, one multiplier per layer, the range the multipliers span)."""
    if rows.empty or "experiment" not in rows.columns or "multipliers" not in rows.columns:
        return rows.iloc[0:0]
    picked = rows[rows["experiment"] == "lr-multipliers"].copy()
    defaults = {"cell": picked.get("trial_id"), "sample": np.arange(len(picked)), "group": "layer", "k": pd.NA,
                "val_objective": np.nan, "val_metrics_by_epoch": None, "dev_metric": np.nan}
    # A column every row leaves null is one the rows were written before (the schema holds every column).
    for column, value in defaults.items():
        if column not in picked.columns or picked[column].isna().all():
            picked[column] = value
    spread = picked["multipliers"].map(lambda v: as_list(v) or [np.nan])
    for column, edge in (("multiplier_low", min), ("multiplier_high", max)):
        if column not in picked.columns or picked[column].isna().all():
            picked[column] = spread.map(edge).groupby(picked["cell"]).transform(edge)
    return picked


def _multipliers_text(value) -> str:
    return " ".join(f"{m:.3g}" for m in as_list(value))


def _is_baseline(value) -> bool:
    values = as_list(value)
    return bool(values) and all(m == 1.0 for m in values)


def best_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the best completed trial by the validation objective, its multipliers (layers 1..L) and dev
    metric, against the baseline trial of the same cell (every multiplier 1; same subset, seed and held-out
    part, so the difference is the multipliers' alone). `dev_delta` = best_dev - baseline_dev."""
    picked = search_rows(rows)
    if picked.empty:
        return pd.DataFrame(columns=BEST_COLUMNS)
    records = []
    for cell, group in picked.groupby("cell", sort=False):
        first = group.iloc[0]
        completed = group[(group["status"] == "ok") & group["val_objective"].notna()]
        baseline = group[group["multipliers"].map(_is_baseline) & (group["status"] == "ok")]
        record = {column: first.get(column) for column in CELL_COLUMNS}
        record.update(
            trials=len(group), completed=len(completed), pruned=int((group["status"] == "pruned").sum()),
            failed=int(group["status"].isin(["error", "diverged"]).sum()),
            baseline_val=baseline["val_objective"].iloc[0] if len(baseline) else np.nan,
            baseline_dev=baseline["dev_metric"].iloc[0] if len(baseline) else np.nan,
        )
        if len(completed):
            # Ties go to the earliest trial (the baseline is trial 0): a search must beat it to count.
            best = completed.sort_values(["val_objective", "sample"], ascending=[False, True]).iloc[0]
            record.update(best_sample=int(best["sample"]), best_multipliers=_multipliers_text(best["multipliers"]),
                          best_val=best["val_objective"], best_dev=best["dev_metric"])
        records.append(record)
    table = pd.DataFrame.from_records(records, columns=BEST_COLUMNS)
    table["dev_delta"] = table["best_dev"] - table["baseline_dev"]
    return table.sort_values(["task", "model", "train_size", "k", "group"]).reset_index(drop=True)
