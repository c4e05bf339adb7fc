"""Issue 24 through real sweeps (local Ray): a trial's identity covers its data and its weights; stores
written before fingerprints keep working; two sweeps writing one store at once train each trial once; a
damaged row file makes a rerun train that trial alone; a full disk is named, and a rerun with space
finishes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sweep.cli import main
from sweep.status import status
from tests.commands import overridden
from tests.conftest import save_tiny_bert
from tests.test_task_files import examples, make_task
from trialrows.read import read_results
from trialrows.schema import rows_table

ROOT = Path(__file__).resolve().parents[1]


def argv(model: str, storage, name: str, *extra: str) -> list[str]:
    return overridden(["incremental", "--model", model, "--tasks", "synthetic", "--sizes", "24", "--epochs", "1",
                       "--trials", "1", "--k", "0", "4", "--storage", str(storage), "--name", name], extra)


def own_task_argv(model: str, folder, storage) -> list[str]:
    return ["incremental", "--model", model, "--task-file", f"mine={folder}", "--tasks", "mine", "--text-columns",
            "review", "--label-column", "sentiment", "--sizes", "20", "--epochs", "1", "--trials", "1", "--k", "4",
            "--storage", str(storage), "--name", "fp"]


def test_changed_data_or_weights_run_as_new_trials_and_say_so(ray_local, tmp_path, capsys):
    model = save_tiny_bert(tmp_path / "model")
    task = make_task(tmp_path / "task", ".csv")
    assert main(own_task_argv(str(model), task, tmp_path)) == 0
    first = read_results(tmp_path / "fp")
    assert len(first) == 1 and first.loc[0, "data_fingerprint"] and first.loc[0, "model_fingerprint"]
    capsys.readouterr()

    make_task(tmp_path / "task", ".csv", dev=examples(12, 1))  # the dev file cut short
    assert main(own_task_argv(str(model), task, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "the data of mine changed since this sweep's rows of 1 of these trials were written" in out
    assert "0 already done, 1 to run" in out
    save_tiny_bert(model, seed=1)  # other weights, same folder and name
    assert main(own_task_argv(str(model), task, tmp_path)) == 0
    out = capsys.readouterr().out
    assert f"the weights of {model} changed" in out and "0 already done, 1 to run" in out

    rows = read_results(tmp_path / "fp")
    assert len(rows) == 3 and rows["settings_id"].nunique() == 1, "one trial's settings on three inputs"
    assert rows["trial_id"].nunique() == 3 and rows[["data_fingerprint", "model_fingerprint"]].drop_duplicates().shape[0] == 3
    from trialrows.summaries import summarize

    assert len(summarize(rows, ["task", "k"])) == 3, "never pooled: three conditions"
    assert main(own_task_argv(str(model), task, tmp_path)) == 0
    assert "1 already done, 0 to run" in capsys.readouterr().out


@pytest.fixture(scope="module")
def landed_sweep(ray_local, tiny_bert, tmp_path_factory) -> Path:
    """The store of `argv`'s sweep, landed (two trials), for the tests below to copy: the same sweep each ran."""
    storage = tmp_path_factory.mktemp("landed")
    assert main(argv(tiny_bert, storage, "landed")) == 0
    return storage / "landed"


def test_rows_written_before_fingerprints_still_count_as_done(landed_sweep, tiny_bert, tmp_path, capsys):
    shutil.copytree(landed_sweep, tmp_path / "old")  # its rows, Tune's folders and config
    rows = tmp_path / "old" / "rows"
    for path in rows.glob("*.parquet"):  # as an older version wrote them: no fingerprints, the old ids
        (row,) = pq.read_table(path).to_pylist()
        row["trial_id"] = row.pop("settings_id")
        row.pop("data_fingerprint"), row.pop("model_fingerprint")
        path.unlink()
        pq.write_table(rows_table([row]), rows / f"{row['trial_id']}.parquet")
    capsys.readouterr()
    assert main(argv(tiny_bert, tmp_path, "old", "--trials", "2")) == 0
    out = capsys.readouterr().out
    assert "2 already done, 2 to run" in out and "2 trials continue rows written before fingerprints" in out
    table = read_results(tmp_path / "old")
    assert len(table) == 4 and table["data_fingerprint"].isna().sum() == 2
    from trialrows.summaries import summarize

    (k0, k4) = summarize(table, ["task", "k"])["n"]
    assert (k0, k4) == (2, 2), "old rows pool with the new ones of the one data their task has"
    assert "2 rows predate fingerprints" in status(str(tmp_path), "old")


def test_a_damaged_row_makes_a_rerun_train_that_trial_alone(landed_sweep, tiny_bert, tmp_path, capsys):
    shutil.copytree(landed_sweep, tmp_path / "damaged")
    damaged, kept = sorted((tmp_path / "damaged" / "rows").glob("*.parquet"))
    kept_bytes = kept.read_bytes()
    damaged.write_bytes(damaged.read_bytes()[:100])
    capsys.readouterr()
    assert main(argv(tiny_bert, tmp_path, "damaged")) == 0
    captured = capsys.readouterr()
    assert f"set aside {damaged}" in captured.err and "1 already done, 1 to run" in captured.out
    assert kept.read_bytes() == kept_bytes and len(read_results(tmp_path / "damaged")) == 2


def test_two_sweeps_writing_one_store_at_once_train_each_trial_once(tiny_bert, tmp_path):
    command = [sys.executable, "-m", "sweep", *argv(tiny_bert, tmp_path, "both", "--trials", "2")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    outs = [p.communicate(timeout=900)[0] for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    waited = [out for out in outs if "waiting: `python -m sweep incremental" in out]
    assert len(waited) == 1 and "4 already done, 0 to run" in waited[0], outs
    rows = read_results(tmp_path / "both")
    assert len(rows) == 4 and rows["trial_id"].is_unique and rows.attrs["repeated_rows"] == 0
    trained = [p for p in (tmp_path / "both").glob("tune-*/*") if p.is_dir()]
    assert len(trained) == 4, "each trial trained once, by one of the two"
    assert not (tmp_path / "both" / "LOCK").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB file system, nearly full; the test can free it. Needs the right to mount (root here, as in CI)."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.decode().strip()}")
    filler = where / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True)  # until it is full
    os.truncate(filler, filler.stat().st_size - 40 * 1024)  # room for the lock and the plan, not for two rows
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_is_named_every_trial_is_accounted_for_and_a_rerun_with_space_finishes(
        ray_local, tiny_bert, small_disk, capsys):
    assert main(argv(tiny_bert, small_disk, "full")) == 1
    captured = capsys.readouterr()
    assert f"cannot write the row of incremental-synthetic-n24-k0-t0-" in captured.err
    assert f"to {small_disk / 'full' / 'rows'}" in captured.err and "No space left on device" in captured.err
    assert "failed 2" in captured.out  # the progress line counts them, where it said "failed 0"
    assert "2 trials; not yet run 2" in status(str(small_disk), "full"), "no row, no error row: not yet run"
    (small_disk / "filler").unlink()
    assert main(argv(tiny_bert, small_disk, "full")) == 0
    assert "0 already done, 2 to run" in capsys.readouterr().out
    assert set(read_results(small_disk / "full")["status"]) == {"ok"}
