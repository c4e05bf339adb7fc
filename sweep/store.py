"""The results store: a trial's row lands as its own Parquet file, named by its trial_id; every
`COMPACT_AT` such files are compacted into one part file, so a store of 50,000 trials is a few dozen files.

A file appears whole or not at all, so a crash, a second sweep writing into the same folder, or an analysis
reading mid-sweep never meets half a file. A final row (`ok`, `diverged`, `pruned`) is never replaced: a
later row of the same trial_id is dropped (`write_row` returns None), so no resume, retry or second writer
can overwrite a finished result; only an `error` row is replaced, by the trial's next attempt (a file that
cannot be read is set aside into quarantine/, as readers set it aside, not written over). On a local or
network file system a file is written aside under a hidden name, then renamed; on an object store (s3://,
gs://) one upload is already all-or-nothing, so it goes straight to its key. Every file has the declared
row schema (`trialrows.schema`).

Compaction never loses a row: a part file is complete before any file it holds is deleted, and a file is
deleted only if it is still the one that was read (a trial rewritten meanwhile keeps its new file). A crash
in between, or two compactions at once, leave a row in two files; readers keep one row per trial
(`trialrows.read.unique_trials`). Parts merge like a log-structured tree: `FANOUT` parts of one level
become one part of the next, so each row is rewritten a few times at most.

Storage is a local folder or any URI pyarrow.fs understands (s3://bucket/prefix, gs://bucket/prefix,
file:///path); pyarrow's URI options work too, e.g. s3://bucket/prefix?endpoint_override=host:9000&scheme=http
for an S3-compatible server. Local folders come back as `Path`s, remote locations as URI strings.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq

from trainables.rows import FINAL
from trialrows.read import FINISHED, damage, quarantine_file, read_files, read_results
from trialrows.schema import rows_table

OBJECT_STORES = ("s3", "gcs")  # pyarrow.fs type names whose uploads appear whole or not at all
COMPACT_AT = 100  # single-row files that make a part file: 50,000 rows would otherwise be 50,000 files
FANOUT = 10  # parts of one level merged into one part of the next level
PART = "part-"


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


def write_row(folder: Path | str, row: dict) -> Path | str | None:
    """Land one trial's row as `<trial_id>.parquet`, then compact if `COMPACT_AT` such files wait. Returns
    where it landed, or None when the folder already holds a final row of that trial (which stands)."""
    fs, path = filesystem(folder)
    name = f"{row['trial_id']}.parquet"
    held = held_status(fs, f"{path}/{name}")
    if held in FINAL:
        return None
    if held not in (None, "error"):  # damaged: set aside, as readers set it aside, never written over
        quarantine_file(fs, f"{path}/{name}", held, "rows")
    where = put_file(folder, name, rows_table([row]), replace=held == "error")
    if where is None:  # another writer landed this trial between the look and the write: its row stands
        return None
    if len(_listing(fs, path)[0]) >= COMPACT_AT:
        try:
            compact(folder)
        except (OSError, pa.ArrowException) as err:
            # The row has landed and stands: merging files only tidies the folder, and the next write tries again.
            print(f"could not compact the rows in {folder} ({type(err).__name__}: {err}); every row stands, the next "
                  "row written tries again", file=sys.stderr, flush=True)
    return where


def held_status(fs, path: str) -> str | None:
    """The status of the row in the file at `path` ("error" for any that is not final); None when there is no
    file; why it is damaged (trialrows.read.damage), when it is. A read that fails for no fault of the file's (a
    network blip, too many open files) is no damage: `damage` raises what keeps this writer from the bytes, and
    a file whole after all is read again, so a finished row it holds stands (an error then is raised: the row is
    not written, and a rerun finds the file as it is)."""
    if fs.get_file_info(path).type != pyarrow.fs.FileType.File:
        return None
    try:
        return _status(fs, path)
    except (OSError, pa.ArrowException, ValueError):  # ValueError: a damaged name, not UTF-8
        why = damage(fs, path)
        if why is not None:
            return why
    return _status(fs, path) if fs.get_file_info(path).type == pyarrow.fs.FileType.File else None


def _status(fs, path: str) -> str:
    status = pq.read_table(path, columns=["status"], filesystem=fs)["status"].to_pylist()
    return status[0] if status and status[0] in FINAL else "error"


def put_file(folder: Path | str, name: str, table: pa.Table, replace: bool = True) -> Path | str | None:
    """Write `table` to `folder`/`name` so that it appears whole or not at all. A file already there is
    replaced only if `replace`; otherwise the write is dropped and None returned (on a local file system
    atomically; an object store has no create-if-absent, so there it is a look before the upload)."""
    fs, path = filesystem(folder)
    target = f"{path}/{name}"
    if fs.type_name in OBJECT_STORES:
        if not replace and fs.get_file_info(target).type == pyarrow.fs.FileType.File:
            return None
        pq.write_table(table, target, filesystem=fs)
        return join(folder, name)
    fs.create_dir(path)
    # Dot-prefixed: pyarrow and pandas dataset readers (and read_results) skip it until the move shows it.
    partial = f"{path}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        pq.write_table(table, partial, filesystem=fs)
    except BaseException:
        with contextlib.suppress(OSError):  # cut short (a full disk): hidden, it would only hold the space
            fs.delete_file(partial)
        raise
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        try:
            if replace:
                os.replace(partial, target)  # atomic, and replaces a file written before
            else:
                os.link(partial, target)  # atomic, and fails if a file is there
        except FileExistsError:
            return None
        finally:
            if not replace and os.path.exists(partial):
                os.unlink(partial)
    elif not replace and fs.get_file_info(target).type == pyarrow.fs.FileType.File:
        fs.delete_file(partial)
        return None
    else:
        fs.move(partial, target)
    return join(Path(path) if isinstance(fs, pyarrow.fs.LocalFileSystem) else folder, name)


def compact(folder: Path | str) -> int:
    """Merge the single-row files of `folder` into a part file, and every `FANOUT` parts of a level into
    one of the next; returns how many files it merged. Safe beside writers, readers and other compactions."""
    fs, path = filesystem(folder)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
        return 0
    loose = _listing(fs, path)[0]
    merged = _merge(folder, fs, loose, level=0) if loose else 0
    for level in itertools.count():
        same = [p for p in _listing(fs, path)[1] if p.base_name.startswith(f"{PART}{level}-")]
        if len(same) < FANOUT:
            return merged
        merged += _merge(folder, fs, same, level + 1)


def _listing(fs, path: str) -> tuple[list, list]:
    """(single-row files, part files) directly in `path`."""
    found = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    visible = [f for f in found if f.is_file and f.base_name.endswith(".parquet")
               and not f.base_name.startswith((".", "_"))]
    return ([f for f in visible if not f.base_name.startswith(PART)],
            [f for f in visible if f.base_name.startswith(PART)])


def _merge(folder, fs, files: list, level: int) -> int:
    try:
        table = read_files(fs, [f.path for f in files])
    except FileNotFoundError:  # another compaction took some of them first: it holds their rows now
        return 0
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    put_file(folder, f"{PART}{level}-{stamp}-{uuid.uuid4().hex[:12]}.parquet", table)
    for read in files:
        now = fs.get_file_info(read.path)
        # A file rewritten since it was read (a failed trial run again) keeps its new row.
        if now.type == pyarrow.fs.FileType.File and (now.mtime, now.size) == (read.mtime, read.size):
            try:
                fs.delete_file(read.path)
            except FileNotFoundError:  # a compaction beside this one merged it too: a row in two parts,
                pass  # which readers count once (trialrows.read.unique_trials)
    return len(files)


def finished_trial_ids(folder: Path | str, statuses=FINISHED) -> set[str]:
    """Every trial with a row of one of `statuses` under `folder` (default: done, so a rerun skips it)."""
    fs, path = filesystem(folder)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
        return set()
    table = read_results(folder, columns=["trial_id", "status"])
    return set(table.loc[table["status"].isin(statuses), "trial_id"])


def stored_trial_ids(folder: Path | str) -> set[str]:
    """Every trial with a row under `folder`, whichever file holds it."""
    fs, path = filesystem(folder)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
        return set()
    return set(read_results(folder, columns=["trial_id"])["trial_id"])


def parent(where: Path | str) -> Path | str:
    """The folder holding `where` (for a rows folder: its sweep's folder)."""
    if isinstance(where, Path):
        return where.parent
    base, sep, query = where.partition("?")
    return base.rstrip("/").rpartition("/")[0] + sep + query
