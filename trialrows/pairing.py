"""Which rows are the full model, and what a condition pairs with it on: shared by the analysis's paired
differences and by precision targets on paired differences (the sweep plans with them, the analysis reports
them), so both sides pair the same way."""
from __future__ import annotations

import pandas as pd

from trialrows.experiments import FINETUNE_EXPERIMENTS, RESET_COLUMNS, VIEWS
from trialrows.schema import settings

# Settings that change nothing when no layer, head or pooler is reset: every such row of one task, model,
# size, training recipe and trial index is the same computation (the full model), whichever experiment or
# reinit mode ran it.
FULL_MODEL_NEUTRAL = ("experiment", "k", "reinit_layers", "reinit_mode", "keep_layernorm", "lr_multiplier",
                      "layer", "head", "block_mode", "block_start", "block_size", "permutation",
                      *(name for view in VIEWS.values() for name, _ in view.new_columns))
PAIR_COLUMNS = ("trial_index", "subset_seed", "seed")  # what the conditions of one trial index share


def no_items(value) -> bool:
    """An empty or null list cell."""
    return len(value) == 0 if hasattr(value, "__len__") else True


def full_model_mask(rows: pd.DataFrame) -> pd.Series:
    """Rows that finetune the whole pretrained model with nothing reset or reordered."""
    if rows.empty or "reinit_layers" not in rows.columns:
        return pd.Series(False, index=rows.index)
    mask = rows["experiment"].isin(FINETUNE_EXPERIMENTS) & rows["reinit_layers"].map(no_items)
    for column in RESET_COLUMNS:  # a head or block reset where this column is set
        if column in rows.columns:
            mask &= rows[column].isna()
    if "permutation" in rows.columns:
        mask &= rows["permutation"].map(no_items)
    if "reinit_pooler" in rows.columns:
        mask &= ~rows["reinit_pooler"].astype(object).where(rows["reinit_pooler"].notna(), False).astype(bool)
    return mask


def computation_columns(rows: pd.DataFrame) -> list[str]:
    """The settings that define a full-model computation (every setting but `FULL_MODEL_NEUTRAL`)."""
    return [c for c in settings(rows.columns) if c not in FULL_MODEL_NEUTRAL]


def full_model_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The full-model rows, each computation once: rows of the same recipe and trial index that differ only
    in `FULL_MODEL_NEUTRAL` (incremental k = L under both reinit modes, the heads baseline, ...) are one
    trial; the incremental grid's row is the one kept."""
    full = rows[full_model_mask(rows)]
    if full.empty:
        return full
    key = [*computation_columns(full), *[c for c in PAIR_COLUMNS if c in full.columns]]
    first = full.assign(_incremental=full["experiment"] != "incremental").sort_values("_incremental", kind="stable")
    kept = first.drop_duplicates(key, keep="first").index.sort_values()
    return full.loc[kept]
