"""The lr-multipliers search from its Parquet rows alone: per cell, the best multipliers against the same
cell's baseline (every multiplier 1), and which multipliers mattered (Optuna's PED-ANOVA importances).

    from analysis import load, search
    rows = load("results/lr-multipliers")
    search.best_table(rows)         # one row per cell
    search.importance_table(rows)   # one row per cell and parameter

"Best" is chosen by the search's own objective (`val_objective`, measured on examples held out of the
training subset), among trials that ran every epoch; its dev metric is then read, never used to choose.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.results import as_list

CELL_COLUMNS = ["cell", "task", "model", "train_size", "k", "group", "metric_name"]
BEST_COLUMNS = [*CELL_COLUMNS, "trials", "completed", "pruned", "failed", "baseline_val", "baseline_dev",
                "best_sample", "best_multipliers", "best_val", "best_dev", "dev_delta"]
IMPORTANCE_COLUMNS = [*CELL_COLUMNS, "param", "importance", "completed", "note"]


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


def search_params(row) -> dict[str, float]:
    """The study's parameters of one trial row, from its per-layer multipliers: layer_i each, or the
    reinitialized layers' and the kept layers' multiplier (`group` reinit-vs-kept)."""
    multipliers = as_list(row["multipliers"])
    if row["group"] == "reinit-vs-kept":
        k = int(row["k"])
        params = {}
        if k >= 1:
            params["kept"] = multipliers[0]
        if k < len(multipliers):
            params["reinit"] = multipliers[k]
        return params
    return {f"layer_{i}": m for i, m in enumerate(multipliers, start=1)}


def rebuild_study(group: pd.DataFrame):
    """An Optuna study holding one cell's trials as the search ran them: completed trials with their
    objective, pruned ones with their per-epoch values, failed ones as failed."""
    import optuna

    study = optuna.create_study(direction="maximize")
    for _, row in group.sort_values("sample").iterrows():
        distribution = optuna.distributions.FloatDistribution(row["multiplier_low"], row["multiplier_high"], log=True)
        params = search_params(row)
        by_epoch = {step: value for step, value in enumerate(as_list(row.get("val_metrics_by_epoch")), start=1)}
        if row["status"] == "ok" and pd.notna(row["val_objective"]):
            state, value = optuna.trial.TrialState.COMPLETE, float(row["val_objective"])
        elif row["status"] == "pruned":
            state, value = optuna.trial.TrialState.PRUNED, None
        else:
            state, value = optuna.trial.TrialState.FAIL, None
        study.add_trial(optuna.trial.create_trial(
            state=state, value=value, params=params, distributions={name: distribution for name in params},
            intermediate_values=by_epoch))
    return study


def importance_evaluator():
    """PED-ANOVA (Watanabe et al., 2023; `optuna.importance.PedAnovaImportanceEvaluator`): how much each
    multiplier explains of the top `target_quantile` of the objective, from Parzen estimators of the top and
    of all completed trials. Named here rather than Optuna's default, which has changed between versions:
    it draws nothing at random (the same rows give the same importances), and needs nothing beyond Optuna
    (fANOVA and mean decrease in impurity need scikit-learn and a seeded forest)."""
    import optuna

    return optuna.importance.PedAnovaImportanceEvaluator(target_quantile=0.1, region_quantile=1.0)


def importance_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per cell, the importance of each multiplier for the validation objective (`importance_evaluator`:
    PED-ANOVA, on the completed trials of a study rebuilt from the rows). A cell with fewer than two
    completed trials, or no spread, gets a note instead."""
    import optuna

    picked = search_rows(rows)
    if picked.empty:
        return pd.DataFrame(columns=IMPORTANCE_COLUMNS)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    records = []
    for cell, group in picked.groupby("cell", sort=False):
        base = {column: group.iloc[0].get(column) for column in CELL_COLUMNS}
        low, high = group["multiplier_low"].min(), group["multiplier_high"].max()
        if not 0 < low < high:
            records.append({**base, "param": None, "importance": np.nan, "completed": 0,
                            "note": f"no search range to rebuild the study from ({low}, {high})"})
            continue
        study = rebuild_study(group)
        completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        note = ""
        importances = {}
        if not len(completed) >= 2:
            note = f"{len(completed)} completed trial(s): too few for importances"
        elif len({t.value for t in completed}) < 2:
            note = "every completed trial has the same objective: no importance to tell"
        else:
            try:
                importances = optuna.importance.get_param_importances(study, evaluator=importance_evaluator())
            except (ValueError, RuntimeError) as err:
                note = f"no importances: {err}"
        if importances:
            records += [{**base, "param": p, "importance": v, "completed": len(completed), "note": ""}
                        for p, v in importances.items()]
        else:
            records.append({**base, "param": None, "importance": np.nan, "completed": len(completed), "note": note})
    return pd.DataFrame.from_records(records, columns=IMPORTANCE_COLUMNS)
