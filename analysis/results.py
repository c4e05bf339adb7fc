"""Reading the Parquet results store; needs nothing but the files (no sweep, no trainables)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def result_files(path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"results path '{path}' does not exist")
    return sorted(p for p in path.rglob("*.parquet") if not p.name.startswith((".", "_")))


def read_results(path, columns: list[str] | None = None) -> pd.DataFrame:
    """Every trial row under `path` (a storage folder, one sweep's folder, or a single file).

    Rows of different experiments and tasks carry different columns; they are unified, missing ones null.
    """
    tables = [pq.read_table(f) for f in result_files(path)]
    if not tables:
        return pd.DataFrame(columns=columns or ["trial_id", "status"])
    table = pa.concat_tables(tables, promote_options="permissive")
    if columns is not None:
        table = table.select([c for c in columns if c in table.column_names])
    return table.to_pandas()
