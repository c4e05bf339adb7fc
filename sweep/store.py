"""The results store: one Parquet file per finished trial, named by its trial_id.

A file appears whole or not at all, so a crash, a second sweep writing into the same folder, or an analysis
reading mid-sweep never meets half a file; and since the name is the trial_id, a trial that is run again
replaces its row instead of adding a second one. On a local or network file system a row is written aside
under a hidden name, then renamed; on an object store (s3://, gs://) one upload is already all-or-nothing,
so the row goes straight to its key.

Storage is a local folder or any URI pyarrow.fs understands (s3://bucket/prefix, gs://bucket/prefix,
file:///path); pyarrow's URI options work too, e.g. s3://bucket/prefix?endpoint_override=host:9000&scheme=http
for an S3-compatible server. Local folders come back as `Path`s, remote locations as URI strings.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq

from analysis.results import read_results

FINISHED = ("ok", "diverged")  # statuses a rerun skips: running them again would give the same answer
OBJECT_STORES = ("s3", "gcs")  # pyarrow.fs type names whose uploads appear whole or not at all


def location(storage) -> Path | str:
    """A storage argument as a local folder (`Path`, absolute) or a remote URI (`str`)."""
    storage = str(storage)
    if storage.startswith("file://"):
        return Path(pyarrow.fs.FileSystem.from_uri(storage)[1])
    if "://" in storage:
        return storage
    return Path(storage).expanduser().resolve()


def join(where: Path | str, *parts: str) -> Path | str:
    """`where`/part/...; for a URI the parts go into its path, before any ?query."""
    if isinstance(where, Path):
        return where.joinpath(*parts)
    base, sep, query = where.partition("?")
    return "/".join([base.rstrip("/"), *parts]) + sep + query


def sweep_dir(storage, name: str) -> Path | str:
    """A sweep's folder: its rows and Ray Tune's experiments (logs, TensorBoard events, checkpoints)."""
    return join(location(storage), name)


def rows_dir(storage, name: str) -> Path | str:
    return join(sweep_dir(storage, name), "rows")


def filesystem(where: Path | str) -> tuple[pyarrow.fs.FileSystem, str]:
    """The pyarrow file system holding `where`, and the path on it."""
    if isinstance(where, Path) or "://" not in where:
        return pyarrow.fs.LocalFileSystem(), str(Path(where).expanduser().resolve())
    return pyarrow.fs.FileSystem.from_uri(where)


def write_row(folder: Path | str, row: dict) -> Path | str:
    table = pa.Table.from_pylist([row])
    name = f"{row['trial_id']}.parquet"
    fs, path = filesystem(folder)
    if fs.type_name in OBJECT_STORES:
        pq.write_table(table, f"{path}/{name}", filesystem=fs)
        return join(folder, name)
    fs.create_dir(path)
    # Dot-prefixed: pyarrow and pandas dataset readers (and read_results) skip it until the move shows it.
    partial = f"{path}/.{row['trial_id']}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, partial, filesystem=fs)
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        os.replace(partial, f"{path}/{name}")  # atomic, and replaces a row written before
    else:
        fs.move(partial, f"{path}/{name}")
    return join(Path(path) if isinstance(fs, pyarrow.fs.LocalFileSystem) else folder, name)


def finished_trial_ids(folder: Path | str) -> set[str]:
    fs, path = filesystem(folder)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
        return set()
    table = read_results(folder, columns=["trial_id", "status"])
    return set(table.loc[table["status"].isin(FINISHED), "trial_id"])


def parent(where: Path | str) -> Path | str:
    """The folder holding `where` (for a rows folder: its sweep's folder)."""
    if isinstance(where, Path):
        return where.parent
    base, sep, query = where.partition("?")
    return base.rstrip("/").rpartition("/")[0] + sep + query
