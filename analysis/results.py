"""Reading the Parquet results store for the tables and figures; needs nothing but the files (no sweep, no
trainables): trialrows.read reads them, `load` is what the tables and figures use: the same rows with
integer columns as nullable integers (a column that is null for some experiments would otherwise come back
as floats: k=3.0), list settings as tuples (so they group), fingerprints that rows written before them lack
assumed as the tables assume them, and a failed trial that never reported its metric given its task's metric
name.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from trialrows.conditions import assume_fingerprints
from trialrows.read import (  # noqa: F401
    FINISHED, as_list, finished_times, read_files, read_results, read_table, result_files, row_files, unique_trials,
)
from trialrows.schema import SCHEMA, SETTING, role
from trialrows.summaries import metric_names

# Columns every table may rely on; `prepare` adds any a frame lacks.
CORE_COLUMNS = ("trial_id", "experiment", "task", "model", "train_size", "trial_index", "reinit_layers",
                "reinit_mode", "metric_name", "dev_metric")


def prepare(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows the analysis works on (a copy): one per trial, integer columns as nullable integers, a
    missing status read as 'error', list settings as tuples, and a trial that failed before reporting
    given the metric name its task's other rows have (so it counts in its condition, not in a new one).
    Rows written before fingerprints take their task's (model's) only one (`assume_fingerprints`), once for
    the whole store: the condition tables pool them so, and every pairing and reference must match them the
    same way (a k = L row of then is the full model of a k = 2 row of now)."""
    rows = assume_fingerprints(unique_trials(rows.copy()))
    if "status" not in rows.columns:
        rows["status"] = "error"
    rows["status"] = rows["status"].astype(object).where(rows["status"].notna(), "error").astype(str)
    for column in CORE_COLUMNS:
        if column not in rows.columns:
            rows[column] = np.nan if column == "dev_metric" else pd.Series([None] * len(rows), dtype=object)
    rows["dev_metric"] = pd.to_numeric(rows["dev_metric"], errors="coerce")
    for column in rows.columns:
        if column in SCHEMA.names and pa.types.is_integer(SCHEMA.field(column).type):
            rows[column] = _as_integers(rows[column])
        elif role(column) == SETTING and rows[column].dtype == object:
            rows[column] = rows[column].map(_hashable)
    rows["metric_name"] = metric_names(rows)
    return rows


def load(path) -> pd.DataFrame:
    """`prepare(read_results(path))`: what every table and figure function expects."""
    return prepare(read_results(path))


def _hashable(value):
    """A list cell as a tuple, so rows group by it; anything else as it is."""
    if isinstance(value, (list, np.ndarray)):
        return tuple(np.asarray(value).tolist())
    return value


def _as_integers(column: pd.Series) -> pd.Series:
    if pd.api.types.is_integer_dtype(column.dtype):
        return column.astype("Int64")
    if pd.api.types.is_float_dtype(column.dtype) or column.dtype == object:
        numbers = pd.to_numeric(column, errors="coerce")
        present = numbers.dropna()
        if numbers.isna().equals(column.isna()) and np.all(np.mod(present.to_numpy(float), 1) == 0):
            return numbers.astype("Int64")
    return column
