"""Reading the Parquet results store; needs nothing but the files (no sweep, no trainables).

`read_results` returns the rows exactly as stored. `load` is what the tables and figures use: the same
rows with integer columns as nullable integers (a column that is null for some experiments would
otherwise come back as floats: k=3.0) and a trial that appears in two files counted once.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# Columns that hold whole numbers whenever they are set (see docs/results-schema.md).
INTEGER_COLUMNS = (
    "train_size", "trial_index", "subset_seed", "seed", "k", "epochs", "batch_size", "max_length",
    "block_start", "block_size", "layer", "head", "permutation_index", "permutation_seed", "stop_epoch", "cell",
)  # fmt: skip
# Columns that hold a list per row.
LIST_COLUMNS = ("reinit_layers", "dev_metrics_by_epoch", "permutation", "multipliers", "weight_distance")
STATUSES = ("ok", "diverged", "error")
# Columns every table may rely on; `prepare` adds any a file lacks (a failed trial's row may carry no metric).
CORE_COLUMNS = ("trial_id", "experiment", "task", "model", "train_size", "trial_index", "reinit_layers",
                "reinit_mode", "metric_name", "dev_metric")


def result_files(path) -> list[Path]:
    """The row files under a local `path` (hidden names, rows still being written, are left out)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"results path '{path}' does not exist")
    return sorted(p for p in path.rglob("*.parquet") if not p.name.startswith((".", "_")))


def uri_result_files(uri: str):
    """(file system, row files) under a URI: s3://bucket/prefix, gs://..., file:///... (pyarrow.fs)."""
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(uri)
    info = fs.get_file_info(root)
    if info.type == pyarrow.fs.FileType.File:
        return fs, [root]
    if info.type != pyarrow.fs.FileType.Directory:
        raise FileNotFoundError(f"results path '{uri}' does not exist")
    found = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
    return fs, sorted(f.path for f in found if f.is_file and f.base_name.endswith(".parquet")
                      and not f.base_name.startswith((".", "_")))


def read_results(path, columns: list[str] | None = None) -> pd.DataFrame:
    """Every trial row under `path` (a storage folder, one sweep's folder, or a single file).

    Rows of different experiments and tasks carry different columns; they are unified, missing ones null.
    `path` may also be a URI (s3://bucket/prefix/sweep, gs://..., file:///...).
    """
    if "://" in str(path):
        fs, files = uri_result_files(str(path))
        tables = [pq.read_table(f, filesystem=fs) for f in files]
    else:
        tables = [pq.read_table(f) for f in result_files(path)]
    if not tables:
        return pd.DataFrame(columns=columns or ["trial_id", "status"])
    table = pa.concat_tables(tables, promote_options="permissive")
    if columns is not None:
        table = table.select([c for c in columns if c in table.column_names])
    return table.to_pandas()


def prepare(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows the analysis works on (a copy): integer columns as nullable integers, a missing status
    read as 'error', and a trial_id met twice (the same trial copied into two folders, or run again under
    a second sweep name) kept once: its finished row if it has one, else its latest."""
    rows = rows.copy()
    if "status" not in rows.columns:
        rows["status"] = "error"
    rows["status"] = rows["status"].astype(object).where(rows["status"].notna(), "error").astype(str)
    for column in CORE_COLUMNS:
        if column not in rows.columns:
            rows[column] = np.nan if column == "dev_metric" else pd.Series([None] * len(rows), dtype=object)
    rows["dev_metric"] = pd.to_numeric(rows["dev_metric"], errors="coerce")
    for column in INTEGER_COLUMNS:
        if column in rows.columns:
            rows[column] = _as_integers(rows[column])
    if "trial_id" in rows.columns and len(rows) and not rows["trial_id"].is_unique:
        order = rows.assign(
            _ok=(rows["status"] == "ok").astype(int),
            _when=rows["finished_at"].astype(str) if "finished_at" in rows.columns else "",
        ).sort_values(["_ok", "_when"], kind="stable")
        rows = rows.loc[order.drop_duplicates("trial_id", keep="last").index.sort_values()]
    return rows.reset_index(drop=True)


def load(path) -> pd.DataFrame:
    """`prepare(read_results(path))`: what every table and figure function expects."""
    return prepare(read_results(path))


def _as_integers(column: pd.Series) -> pd.Series:
    if pd.api.types.is_integer_dtype(column.dtype):
        return column.astype("Int64")
    if pd.api.types.is_float_dtype(column.dtype) or column.dtype == object:
        numbers = pd.to_numeric(column, errors="coerce")
        present = numbers.dropna()
        if numbers.isna().equals(column.isna()) and np.all(np.mod(present.to_numpy(float), 1) == 0):
            return numbers.astype("Int64")
    return column


def as_list(value) -> list:
    """A list cell (numpy array, list, or null) as a plain list."""
    if value is None or (np.isscalar(value) and pd.isna(value)):
        return []
    return list(np.asarray(value).tolist())
