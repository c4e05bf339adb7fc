"""Reading the Parquet results store; needs nothing but the files.

The store is read once, through `pyarrow.dataset` (files read in parallel; local folders, file://, s3://,
gs://), with the declared row schema (`trialrows.schema`) widened by any column a file adds, so files of any
age and kind read together. `read_results` returns one row per trial (analysis.load prepares them for its
tables and figures).

A file that cannot be read as rows (cut short, overwritten, a foreign Parquet file whose columns clash with
the schema) is set aside into a `quarantine/` folder beside its own, with one line on stderr naming it, and
every other file is read: one damaged file never hides the good rows, and the trials it held simply have no
row (a rerun trains them again).
"""
from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs
import pyarrow.parquet as pq

from trialrows.schema import SCHEMA

FINISHED = ("ok", "diverged")  # a trial with such a row is done: running it again gives the same answer
STUDY_FINISHED = (*FINISHED, "pruned")  # a search's trial is done too when its scheduler stopped it (sweep.search)


QUARANTINE = "quarantine"  # where unreadable row files are set aside, beside the folder that held them


def _visible(name: str) -> bool:
    # Dot- and underscore-prefixed names are rows still being written (or other tools' metadata).
    return name.endswith(".parquet") and not name.startswith((".", "_"))


def _set_aside(path: str, root: str) -> bool:
    # A set-aside file sits directly in a quarantine/ folder below `root` (quarantine_file puts it there): a store
    # inside a folder of that name, or a sweep given that name, is read like any other.
    inside = path[len(root):] if path.startswith(root) else path
    parts = inside.replace("\\", "/").strip("/").split("/")
    return len(parts) >= 2 and parts[-2] == QUARANTINE


def row_files(path) -> tuple[pyarrow.fs.FileSystem, list[str]]:
    """(file system, row files) under `path`: a local folder or file, or a URI (s3://bucket/prefix,
    gs://..., file:///...)."""
    path = str(path)
    if "://" in path:
        fs, root = pyarrow.fs.FileSystem.from_uri(path)
    else:
        fs, root = pyarrow.fs.LocalFileSystem(), str(Path(path).expanduser().resolve())
    info = fs.get_file_info(root)
    if info.type == pyarrow.fs.FileType.File:
        return fs, [root]
    if info.type != pyarrow.fs.FileType.Directory:
        raise FileNotFoundError(f"results path '{path}' does not exist")
    found = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
    return fs, sorted(f.path for f in found if f.is_file and _visible(f.base_name)
                       and not _set_aside(f.path, root))


def result_files(path) -> list[str]:
    """The row files under `path` (hidden names, rows still being written, are left out)."""
    return row_files(path)[1]


def read_table(path, columns: list[str] | None = None, attempts: int = 10) -> pa.Table:
    """Every row under `path` as stored (a trial written twice appears twice), one Arrow table. A file that
    vanishes between listing and reading (a compaction moved its rows into a part file, and is deleting the
    files it merged) means: wait a moment and list again."""
    for attempt in range(attempts - 1):
        try:
            return read_files(*row_files(path), columns=columns)
        except FileNotFoundError:
            time.sleep(0.02 * (attempt + 1))
    return read_files(*row_files(path), columns=columns)


def read_files(fs: pyarrow.fs.FileSystem, files: list[str], columns: list[str] | None = None) -> pa.Table:
    """The rows of these files as one table: the declared schema, then any column a file adds. A file that
    cannot be read as rows is set aside (`damage`, `quarantine_file`) and the others are read."""
    try:
        return _read_files(fs, files, columns)
    except FileNotFoundError:
        raise  # a file a compaction merged and deleted meanwhile: the caller lists again
    except (pa.ArrowException, OSError, ValueError) as err:  # ValueError: a damaged name, not UTF-8, decoded by pyarrow
        damaged = {f: why for f in files if (why := damage(fs, f))}
        if not damaged:
            gone = [f for f in files if fs.get_file_info(f).type == pyarrow.fs.FileType.NotFound]
            if gone:
                # What failed has gone since (another reader set it aside, a compaction merged it): list again.
                raise FileNotFoundError(f"{gone[0]} was moved while it was read") from err
            raise
        for path, why in damaged.items():
            quarantine_file(fs, path, why, "rows")
        return _read_files(fs, [f for f in files if f not in damaged], columns)


def _read_files(fs: pyarrow.fs.FileSystem, files: list[str], columns: list[str] | None = None) -> pa.Table:
    if not files:
        schema = SCHEMA if columns is None else pa.schema([f for f in SCHEMA if f.name in columns])
        return schema.empty_table()
    factory = ds.FileSystemDatasetFactory(fs, files, ds.ParquetFileFormat())
    found = factory.inspect(promote_options="permissive")
    # The declared types win, so a file whose column is all null (or an older file's int) reads as declared.
    schema = pa.schema([*SCHEMA, *(f for f in found if f.name not in SCHEMA.names)])
    dataset = factory.finish(schema)
    if columns is not None:
        columns = [c for c in columns if c in schema.names]
    return dataset.to_table(columns=columns)


def damage(fs: pyarrow.fs.FileSystem, path: str) -> str | None:
    """Why the file at `path` cannot be read as rows with the declared schema (None: it can, or it is gone): not
    Parquet, cut short, or columns of types that clash with the declared ones (a foreign file). What keeps this
    reader from its bytes at all (permissions, a bucket's network) is no damage of the file's and is raised."""
    try:
        pa.unify_schemas([SCHEMA, pq.read_schema(path, filesystem=fs)], promote_options="permissive")
        _read_files(fs, [path])
    except FileNotFoundError:
        return None  # gone, not damaged
    except (pa.ArrowException, OSError, ValueError) as err:
        if isinstance(err, OSError):
            _bytes_reachable(fs, path)  # raises when this reader cannot read the bytes at all
        return f"{type(err).__name__}: {err}"
    return None


def _bytes_reachable(fs: pyarrow.fs.FileSystem, path: str) -> None:
    """Raise the error of reading the file's bytes, if any: a file this reader may not open (another user's, on
    shared storage) or cannot reach now (a bucket's network) is no damaged one, and setting it aside would make
    a rerun train its finished trial again. Bytes that read but do not parse are the file's own damage."""
    with fs.open_input_file(path) as handle:
        handle.read()


def quarantine_file(fs: pyarrow.fs.FileSystem, path: str, why: str, what: str = "a plan") -> str:
    """Move a damaged file into `quarantine/` beside its folder, saying so in one line; returns where it went
    (its own path when it could not be moved: it is left out of every read all the same)."""
    folder, name = os.path.split(path)
    target = f"{os.path.dirname(folder)}/{QUARANTINE}/{os.path.basename(folder)}-{name}"
    try:
        fs.create_dir(os.path.dirname(target))
        if fs.get_file_info(target).type != pyarrow.fs.FileType.NotFound:  # one set aside before: both are kept
            stem, ext = os.path.splitext(target)
            target = f"{stem}-{uuid.uuid4().hex[:8]}{ext}"
        fs.move(path, target)
    except OSError as err:
        print(f"cannot read {path} as {what} ({why.splitlines()[0]}); left out of this read (moving it aside failed: "
              f"{err})", file=sys.stderr, flush=True)
        return path
    after = "Its trials have no row: a rerun trains them again" if what == "rows" else "It is left out"
    print(f"set aside {path}: it cannot be read as {what} ({why.splitlines()[0]}); now {target}. {after}",
          file=sys.stderr, flush=True)
    return target


def read_results(path, columns: list[str] | None = None) -> pd.DataFrame:
    """One row per trial under `path` (a storage folder, one sweep's folder, a single file, or a URI):
    `unique_trials` of every row stored. `attrs['repeated_rows']` says how many rows it dropped."""
    if columns is not None and "trial_id" in columns:
        columns = list(dict.fromkeys([*columns, "status", "finished_at"]))
    frame = read_table(path, columns).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    unique = unique_trials(frame)
    unique.attrs["repeated_rows"] = len(frame) - len(unique)
    return unique


def unique_trials(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per trial_id (the same trial copied into two folders or part files, or run again after it
    failed): its first finished row if it has one (a finished row is final: a later one of the same trial
    is a stale copy, never a correction), else its latest error, by `finished_at` (compared as timestamps)."""
    if "trial_id" not in rows.columns or rows["trial_id"].is_unique:
        return rows.reset_index(drop=True)
    status = rows["status"] if "status" in rows.columns else pd.Series("error", index=rows.index)
    finished = status.notna() & status.ne("error")
    when = finished_times(rows)
    nanoseconds = pd.Series(when.to_numpy(dtype="datetime64[ns]").astype("int64"), index=rows.index, dtype=float)
    nanoseconds[when.isna()] = np.nan
    # Sorted so that the row to keep comes last: errors before finished rows, errors oldest first and finished
    # rows newest first (an undated row is the least preferred of its kind).
    order = rows.assign(_finished=finished, _key=nanoseconds.where(~finished, -nanoseconds))
    order = order.sort_values(["_finished", "_key"], kind="stable", na_position="first")
    keep = order.drop_duplicates("trial_id", keep="last").index.sort_values()
    return rows.loc[keep].reset_index(drop=True)


def finished_times(rows: pd.DataFrame) -> pd.Series:
    """`finished_at` as UTC timestamps (rows written in different time zones compare correctly)."""
    if "finished_at" not in rows.columns:
        return pd.Series(pd.NaT, index=rows.index, dtype="datetime64[ns, UTC]")
    return pd.to_datetime(rows["finished_at"], utc=True, format="ISO8601", errors="coerce")



def as_list(value) -> list:
    """A list cell (numpy array, list, tuple, or null) as a plain list."""
    if value is None or (np.isscalar(value) and pd.isna(value)):
        return []
    return list(np.asarray(value).tolist())
