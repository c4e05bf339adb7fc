"""The results store: one Parquet file per finished trial, named by its trial_id.

A file appears whole or not at all (written aside, then renamed), so a crash, a second sweep writing into the
same folder, or an analysis reading mid-sweep never meets half a file; and since the name is the trial_id,
a trial that is run again replaces its row instead of adding a second one.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.results import read_results

FINISHED = ("ok", "diverged")  # statuses a rerun skips: running them again would give the same answer


def rows_dir(storage: str, name: str) -> Path:
    return Path(storage).expanduser().resolve() / name / "rows"


def write_row(folder: Path, row: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{row['trial_id']}.parquet"
    # Dot-prefixed: pyarrow and pandas dataset readers skip it until the rename makes it visible.
    partial = folder / f".{row['trial_id']}.{uuid.uuid4().hex}.tmp"
    pq.write_table(pa.Table.from_pylist([row]), partial)
    os.replace(partial, final)
    return final


def finished_trial_ids(folder: Path) -> set[str]:
    if not folder.is_dir():
        return set()
    table = read_results(folder, columns=["trial_id", "status"])
    return set(table.loc[table["status"].isin(FINISHED), "trial_id"])
