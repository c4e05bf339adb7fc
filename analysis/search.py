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

from trialrows.read import as_list

from trialrows.summaries import (  # noqa: E402,F401
    BEST_COLUMNS, CELL_COLUMNS, best_table, search_rows,
)

IMPORTANCE_COLUMNS = [*CELL_COLUMNS, "param", "importance", "completed", "note"]


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
