"""What tells the conditions of a set of rows apart: the columns that vary, less those others imply, with rows
made groupable (list cells as tuples, fingerprints that old rows lack assumed). Shared by the summaries and by
the precision targets (trialrows.precision), which must group rows exactly as the tables do."""
from __future__ import annotations

import numpy as np
import pandas as pd

from trialrows.schema import settings

# Columns a condition table always shows first, when the rows carry them.
LEADING_COLUMNS = ["experiment", "task", "model", "train_size"]
# Settings that other settings usually imply (reinit_layers by k or a block, a task file's labels by the
# file, a fingerprint by its task or model): left out of a table's columns when they split nothing further.
DERIVED = ("reinit_layers", "permutation", "multipliers", "label_names", "text_columns", "label_column",
           "data_source", "model_type", "data_fingerprint", "model_fingerprint")


def groupable(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with list cells of setting columns as tuples, so they group (rows straight from Parquet, not
    through results.prepare, hold numpy arrays there), and fingerprints unknown to old rows assumed
    (`assume_fingerprints`)."""
    rows = assume_fingerprints(rows)
    lists = [c for c in settings(rows.columns) if rows[c].dtype == object
             and rows[c].map(lambda v: isinstance(v, (list, np.ndarray))).any()]
    if not lists:
        return rows
    rows = rows.copy()
    for column in lists:
        rows[column] = rows[column].map(lambda v: tuple(np.asarray(v).tolist()) if isinstance(v, (list, np.ndarray)) else v)
    return rows


# A fingerprint column, and the columns whose rows read the same data or weights.
FINGERPRINT_OF = {"data_fingerprint": ("task", "intermediate_task", "data_source"), "model_fingerprint": ("model",)}


def assume_fingerprints(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows written before fingerprints existed (null there) pooled with their task's (or model's) rows when
    those have one fingerprint only: the same data, as far as anything can tell. Where the data changed
    (two fingerprints), old rows stay a condition of their own rather than being mixed into either."""
    present = [c for c in FINGERPRINT_OF if c in rows.columns and rows[c].isna().any() and rows[c].notna().any()]
    if not present:
        return rows
    rows = rows.copy()
    for column in present:
        keys = [c for c in FINGERPRINT_OF[column] if c in rows.columns]
        filled = rows[keys].astype(object).where(rows[keys].notna(), "-")
        distinct = rows.groupby([filled[c] for c in keys], dropna=False)[column].transform(
            lambda values: values.dropna().iloc[0] if values.dropna().nunique() == 1 else None)
        rows[column] = rows[column].where(rows[column].notna(), distinct)
    return rows


def split_settings(rows: pd.DataFrame, by: list[str], pooled=()) -> list[str]:
    """The settings (trialrows.schema) outside `by` and `pooled` that take more than one value within a
    group of `by`, less those the others imply (reinit_layers when k is there): the columns that keep
    every condition apart."""
    if rows.empty:
        return []
    codes = _Codes(rows)
    groups = codes.of(by)
    candidates = [c for c in settings(rows.columns) if c not in by and c not in pooled
                  and _count(codes.of([c], groups)) > _count(groups)]
    return implied_dropped(rows, by, candidates, codes)


class _Codes:
    """Integer codes of rows' values per column (null a value like any other), combined into group ids:
    counting groups this way is one vectorised pass instead of a pandas groupby per question."""

    def __init__(self, rows: pd.DataFrame):
        self.rows, self.cache = groupable(rows), {}

    def column(self, name: str) -> np.ndarray:
        if name not in self.cache:
            self.cache[name] = pd.factorize(self.rows[name], use_na_sentinel=False)[0]
        return self.cache[name]

    def of(self, columns, base: np.ndarray | None = None) -> np.ndarray:
        ids = np.zeros(len(self.rows), dtype=np.int64) if base is None else base
        for name in columns:
            values = self.column(name)
            ids = pd.factorize(ids * (int(values.max(initial=0)) + 1) + values)[0]
        return ids



def _count(ids: np.ndarray) -> int:
    """How many groups the ids of `_Codes.of` make."""
    return int(ids.max(initial=-1)) + 1


def implied_dropped(rows: pd.DataFrame, fixed: list[str], extra: list[str], codes=None) -> list[str]:
    """`extra` less each `DERIVED` column whose values the rest of `fixed` + `extra` already determine."""
    codes = codes or _Codes(rows)
    kept = list(extra)
    groups = _count(codes.of([*fixed, *kept]))
    for column in [c for c in extra if c in DERIVED]:
        rest = [c for c in kept if c != column]
        if _count(codes.of([*fixed, *rest])) == groups:
            kept = rest
    return kept


def condition_columns(rows: pd.DataFrame) -> list[str]:
    """The columns that tell conditions apart in `rows`: experiment, task, model and size, then every
    setting (trialrows.schema) that varies, less those the others imply, then metric_name."""
    lead = [c for c in LEADING_COLUMNS if c in rows.columns]
    codes = _Codes(rows)
    varying = [c for c in settings(rows.columns) if c not in lead and _count(codes.of([c])) > 1]
    tail = ["metric_name"] if "metric_name" in rows.columns else []
    return [*lead, *implied_dropped(rows, lead, varying, codes), *tail]
