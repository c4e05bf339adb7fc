"""The results store under concurrent writers and readers: never a half-written or corrupt file."""
from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pyarrow.fs
import pytest

from analysis.results import read_results
from sweep.store import finished_trial_ids, join, location, parent, rows_dir, sweep_dir, write_row


def write_many(folder, writer: int, n: int) -> None:
    for i in range(n):
        # Both writers write the same ids: the same trial landing twice must still be one row.
        write_row(folder, {"trial_id": f"t{i}", "status": "ok", "dev_metric": float(writer), "payload": "x" * 5000})


def test_two_writers_and_a_reader_never_meet_a_partial_file(tmp_path):
    folder = tmp_path / "rows"
    folder.mkdir()
    ctx = mp.get_context("spawn")
    writers = [ctx.Process(target=write_many, args=(folder, w, 150)) for w in (1, 2)]
    for p in writers:
        p.start()
    reads = 0
    while any(p.is_alive() for p in writers):
        table = read_results(folder)  # raises on a truncated or half-renamed Parquet file
        assert table["trial_id"].is_unique
        reads += 1
    for p in writers:
        p.join()
        assert p.exitcode == 0
    table = read_results(folder)
    assert len(table) == 150 and set(table["dev_metric"]) <= {1.0, 2.0}
    assert reads > 1
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], "no temporary file is left behind"
    assert finished_trial_ids(folder) == {f"t{i}" for i in range(150)}


def test_model_folder_without_safetensors_is_refused(tmp_path):
    from trainables.models import resolve_model_path

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickled weights could run code")
    with pytest.raises(ValueError, match="holds no \\*.safetensors weights"):
        resolve_model_path(str(tmp_path))


def test_storage_locations_local_file_uri_and_object_store():
    assert rows_dir("results", "sw") == Path("results").resolve() / "sw" / "rows"
    assert rows_dir("file:///tmp/results", "sw") == Path("/tmp/results/sw/rows")  # file:// is a local folder
    uri = "s3://bucket/prefix?endpoint_override=host:9000&scheme=http"
    assert sweep_dir(uri, "sw") == "s3://bucket/prefix/sw?endpoint_override=host:9000&scheme=http"
    assert rows_dir(uri, "sw") == join(sweep_dir(uri, "sw"), "rows")
    assert parent(rows_dir(uri, "sw")) == sweep_dir(uri, "sw")
    assert location("gs://bucket/p/") == "gs://bucket/p/"


def test_rows_on_an_object_store_are_written_read_and_skipped(s3_bucket):
    folder = rows_dir(s3_bucket, "sw")
    write_row(folder, {"trial_id": "a", "status": "ok", "dev_metric": 0.5})
    write_row(folder, {"trial_id": "b", "status": "error", "dev_metric": None})
    # The same trial again: refused, the finished row stays as it landed (an object store has no create-if-absent,
    # so the writer looks first).
    assert write_row(folder, {"trial_id": "a", "status": "ok", "dev_metric": 0.75}) is None
    fs, path = pyarrow.fs.FileSystem.from_uri(folder)
    names = sorted(f.base_name for f in fs.get_file_info(pyarrow.fs.FileSelector(path)))
    assert names == ["a.parquet", "b.parquet"], "an object store gets each row at its final key, no temp file"
    assert finished_trial_ids(folder) == {"a"}
    table = read_results(sweep_dir(s3_bucket, "sw")).set_index("trial_id")
    assert table.loc["a", "dev_metric"] == 0.5 and len(table) == 2
    assert finished_trial_ids(rows_dir(s3_bucket, "nothing-yet")) == set()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_results(sweep_dir(s3_bucket, "nothing-yet"))


def test_rows_under_a_file_uri(tmp_path):
    folder = rows_dir(f"file://{tmp_path}", "sw")
    write_row(folder, {"trial_id": "a", "status": "diverged"})
    assert (tmp_path / "sw" / "rows" / "a.parquet").is_file()
    assert finished_trial_ids(folder) == {"a"}
    assert list(read_results(f"file://{tmp_path}/sw")["trial_id"]) == ["a"]


def test_a_damaged_file_another_reader_sets_aside_meanwhile_fails_no_read(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    import trialrows.read as read
    from trialrows.schema import rows_table

    rows = tmp_path / "sw" / "rows"
    rows.mkdir(parents=True)
    pq.write_table(rows_table([{"trial_id": "good", "status": "ok"}]), rows / "good.parquet")
    (rows / "bad.parquet").write_bytes(b"cut short")
    probe = read.damage

    def other_reader_first(fs, path):
        # A second reader (`sweep status` beside the sweep) met the same file and set it aside first.
        if (rows / "bad.parquet").exists():
            read.quarantine_file(fs, str(rows / "bad.parquet"), "cut short", "rows")
        return probe(fs, path)

    monkeypatch.setattr(read, "damage", other_reader_first)
    assert list(read_results(tmp_path)["trial_id"]) == ["good"]
    assert (tmp_path / "sw" / "quarantine" / "rows-bad.parquet").is_file()


def test_a_row_file_this_reader_may_not_open_is_not_set_aside_as_damaged(tmp_path):
    # Any OSError counted as damage: a good row another user's permissions (or a bucket's network) kept from this
    # reader was moved to quarantine/, and a rerun would train its finished trial again. Root ignores file modes
    # here, so a filesystem denies the one file as a shared store's permissions would.
    import pyarrow.parquet as pq

    from trialrows.read import read_files
    from trialrows.schema import rows_table

    rows = tmp_path / "sw" / "rows"
    rows.mkdir(parents=True)
    for name in ("good", "theirs"):
        pq.write_table(rows_table([{"trial_id": name, "status": "ok"}]), rows / f"{name}.parquet")
    local = pyarrow.fs.LocalFileSystem()

    class Denying(pyarrow.fs.FileSystemHandler):
        def __eq__(self, other):
            return isinstance(other, Denying)

        def __ne__(self, other):
            return not self == other

        def get_type_name(self):
            return "denying"

        def normalize_path(self, path):
            return path

        def get_file_info(self, paths):
            return local.get_file_info(paths)

        def get_file_info_selector(self, selector):
            return local.get_file_info(selector)

        def open_input_file(self, path):
            if path.endswith("theirs.parquet"):
                raise PermissionError(f"[Errno 13] Permission denied: '{path}'")
            return local.open_input_file(path)

        open_input_stream = open_input_file

        def create_dir(self, path, recursive):
            local.create_dir(path, recursive=recursive)

        def move(self, src, dest):
            local.move(src, dest)

        def delete_dir_contents(self, path, missing_dir_ok=False):
            local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

        def open_output_stream(self, path, metadata):
            return local.open_output_stream(path, metadata=metadata)

        def open_append_stream(self, path, metadata):
            return local.open_append_stream(path, metadata=metadata)

        def delete_root_dir_contents(self):
            raise PermissionError("not here")

        copy_file, delete_dir, delete_file = (lambda self, *a, n=n: getattr(local, n)(*a)
                                              for n in ("copy_file", "delete_dir", "delete_file"))

    fs = pyarrow.fs.PyFileSystem(Denying())
    with pytest.raises(PermissionError, match="theirs.parquet"):
        read_files(fs, sorted(str(p) for p in rows.iterdir()))
    assert (rows / "theirs.parquet").is_file() and not (tmp_path / "sw" / "quarantine").exists()


def test_a_file_set_aside_twice_keeps_both_copies(tmp_path):
    # The second move to quarantine/rows-<name> replaced the first copy: a row set aside before was lost.
    from trialrows.read import quarantine_file

    rows = tmp_path / "sw" / "rows"
    rows.mkdir(parents=True)
    fs = pyarrow.fs.LocalFileSystem()
    for text in (b"first", b"second"):
        (rows / "t.parquet").write_bytes(text)
        quarantine_file(fs, str(rows / "t.parquet"), "cut short", "rows")
    kept = sorted(p.read_bytes() for p in (tmp_path / "sw" / "quarantine").iterdir())
    assert kept == [b"first", b"second"]
