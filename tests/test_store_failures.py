"""The store's rows are never hidden, miscounted or left to a second writer: a store inside a folder named like
the quarantine is read; a row that landed counts as landed when the compaction after it fails; a write cut short
leaves nothing behind; a file with a damaged column name is set aside instead of stopping every read; a live
holder of the lock in another container of this host keeps it."""
from __future__ import annotations

import errno
import itertools
import json
import platform
import re
import threading
import time
from pathlib import Path

import pyarrow.fs
import pyarrow.parquet as pq

import sweep.store as store
from sweep.runner import RowWriter
from sweep.store import finished_trial_ids, write_row
from trainables.rows import ENDED_ROWS, make_row
from trialrows.read import QUARANTINE, read_results


def row(trial_id: str, status: str = "ok", dev_metric: float = 0.9) -> dict:
    return make_row({"trial_id": trial_id, "experiment": "incremental", "task": "synthetic"},
                    {"dev_metric": dev_metric}, status, "boom" if status == "error" else None)


class Trial:
    def __init__(self, config: dict):
        self.config, self.last_result, self.error_file = {"trial": config}, {}, None


def test_a_store_inside_a_folder_named_quarantine_is_read(tmp_path):
    # Only a quarantine/ folder inside the store holds set-aside files; one above it is the user's own folder,
    # and reading past it would make every rerun train every trial again.
    storage = tmp_path / QUARANTINE / "results"
    rows = storage / "sweep" / "rows"
    write_row(rows, row("t"))
    assert finished_trial_ids(rows) == {"t"}
    assert list(read_results(storage)["trial_id"]) == ["t"]
    set_aside = storage / "sweep" / QUARANTINE / "rows-old.parquet"
    set_aside.parent.mkdir()
    pq.write_table(store.rows_table([row("old")]), set_aside)
    assert list(read_results(storage)["trial_id"]) == ["t"], "a set-aside file below the store stays unread"
    write_row(storage / QUARANTINE / "rows", row("u"))  # a sweep named like the folder (--name quarantine)
    assert sorted(read_results(storage)["trial_id"]) == ["t", "u"]


def test_a_row_that_landed_stands_when_the_compaction_after_it_fails(tmp_path, monkeypatch, capsys):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "COMPACT_AT", 1)
    monkeypatch.setattr(store, "_merge", full_disk)
    folder = tmp_path / "rows"
    writer = RowWriter(folder)
    config = {"trial_id": "t", "row": {"trial_id": "t"}}
    writer.on_trial_result(0, [], Trial(config), {ENDED_ROWS: json.dumps([row("t")])})
    assert finished_trial_ids(folder) == {"t"}, "the row landed"
    assert writer.written == ["t"] and writer.unwritten == {}, "so it is counted as written, not as lost"
    err = capsys.readouterr().err
    assert "cannot write the row of t" not in err and f"could not compact the rows in {folder}" in err
    writer.on_trial_complete(1, [], Trial(config))
    assert read_results(folder).loc[0, "status"] == "ok", "and no error row follows it"


def test_a_write_that_fails_leaves_no_hidden_file_behind(tmp_path, monkeypatch):
    # A full disk cuts the write short: its half-written file, hidden from readers, would hold the space.
    real = pq.write_table

    def cut_short(table, where, **kwargs):
        real(table, where, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    folder = tmp_path / "rows"
    folder.mkdir()
    monkeypatch.setattr(store.pq, "write_table", cut_short)
    for replace in (True, False):
        try:
            store.put_file(folder, "t.parquet", store.rows_table([row("t")]), replace=replace)
        except OSError:
            pass
        assert list(folder.iterdir()) == []


def test_a_file_whose_column_names_are_damaged_is_set_aside_and_every_good_row_is_read(tmp_path, capsys):
    # A flipped byte in a footer can leave it parseable with a name that is no longer UTF-8: pyarrow then raises
    # UnicodeDecodeError, which stopped every read of the store (the sweep's plan, status, the analysis).
    rows = tmp_path / "sweep" / "rows"
    write_row(rows, row("good"))
    write_row(rows, {**row("bad"), "dev_qu\u00e9": 0.5})
    damaged = rows / "bad.parquet"
    damaged.write_bytes(damaged.read_bytes().replace("dev_qu\u00e9".encode(), b"dev_qu\xb3\xa9"))
    assert finished_trial_ids(rows) == {"good"}
    assert f"set aside {damaged}" in capsys.readouterr().err
    assert (tmp_path / "sweep" / QUARANTINE / "rows-bad.parquet").exists()
    assert write_row(rows, row("bad")) is not None, "its trial lands anew"


def test_a_live_holder_in_another_pid_namespace_of_this_host_keeps_the_lock(tmp_path):
    # Containers with host networking (Ray's docker set-up, hostNetwork pods) share the host's name but number
    # their processes anew: a pid alive there may not exist here, and taking its lock made two writers.
    from sweep import lock

    now = time.time()
    here = {"host": platform.node(), "pid": 2 ** 22 - 7, "command": "python -m sweep incremental", "heartbeat": now}
    elsewhere = {**here, "pid_namespace": "pid:[1]"}
    assert lock.why_gone(elsewhere, now) is None, "its heartbeat is fresh: it may be writing"
    assert lock.why_gone(elsewhere, now + lock.STALE + 1), "until it stops renewing the lock"
    assert lock.why_gone({**here, "pid_namespace": lock.pid_namespace()}, now) == "that process is gone"
    assert lock.why_gone(here, now) == "that process is gone", "a lock written before namespaces were recorded"
    with lock.sweep_lock(str(tmp_path / "sweep"), "python -m sweep incremental") as path:
        assert json.loads(Path(path).read_text())["pid_namespace"] == lock.pid_namespace()


def test_a_lock_holding_json_that_is_no_claim_goes_stale_like_garbage(tmp_path, monkeypatch):
    # `null` or a list parsed, read as "no lock", and the claim then failed at once, again and again: a spin.
    from sweep import lock

    monkeypatch.setattr(lock, "STALE", 0.2)  # an unknown writer's lock: gone once it stays unchanged that long

    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / lock.LOCK).write_text("null")
    fs = pyarrow.fs.LocalFileSystem()
    holder = lock.read_lock(fs, str(folder / lock.LOCK))
    assert holder is not None and holder["command"] == "an unknown command"
    with lock.sweep_lock(str(folder), "python -m sweep incremental", poll=0.01) as path:
        assert json.loads(Path(path).read_text())["command"] == "python -m sweep incremental"


def test_a_gone_holders_lock_that_cannot_be_removed_stops_the_command_with_the_reason(tmp_path, monkeypatch):
    from sweep import lock

    folder = tmp_path / "sweep"
    folder.mkdir()
    gone = {"host": platform.node(), "pid": 2 ** 22 - 7, "pid_namespace": lock.pid_namespace(), "command": "old",
            "heartbeat": time.time()}
    (folder / lock.LOCK).write_text(json.dumps(gone))

    class Undeletable:  # a folder whose files this user may read and not remove (pyarrow's types are sealed)
        def __init__(self, fs):
            self.fs = fs

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def delete_file(self, path):
            raise PermissionError(errno.EACCES, "Permission denied", path)

    fs, _ = lock.filesystem(str(folder))
    monkeypatch.setattr(lock, "filesystem", lambda where: (Undeletable(fs), str(folder)))
    raised = []

    def take():
        try:
            with lock.sweep_lock(str(folder), "python -m sweep incremental", poll=0.01):
                pass
        except OSError as err:
            raised.append(str(err))

    waiting = threading.Thread(target=take, daemon=True)  # it had taken the lock over again and again, forever
    waiting.start()
    waiting.join(20)
    assert not waiting.is_alive() and len(raised) == 1, "the command neither ended nor said why"
    assert re.search("of a holder that is gone cannot be removed .*Permission denied.*remove it", raised[0])


def test_a_row_the_schema_cannot_hold_is_named_and_the_sweep_goes_on(tmp_path, capsys):
    # Raised inside Tune's callback, the conversion error would have ended every other trial of the sweep.
    folder = tmp_path / "rows"
    writer = RowWriter(folder)
    bad = {**row("t"), "dev_metric": "not a number"}
    writer.on_trial_result(0, [], Trial({"trial_id": "t", "row": {"trial_id": "t"}}), {ENDED_ROWS: json.dumps([bad])})
    assert "t" in writer.unwritten and writer.unwritten["t"].startswith("ArrowInvalid")
    assert "a bug of this project's" in capsys.readouterr().err
    good = {ENDED_ROWS: json.dumps([row("u")])}
    writer.on_trial_result(0, [], Trial({"trial_id": "u", "row": {"trial_id": "u"}}), good)
    assert finished_trial_ids(folder) == {"u"}


def test_a_trial_whose_row_another_writer_landed_first_counts_as_ended(tmp_path):
    class Progress:
        def __init__(self):
            self.ended = {}

        def end(self, trial_id, status, metric, line=None):
            self.ended[trial_id] = status

    folder = tmp_path / "rows"
    write_row(folder, row("t", dev_metric=0.5))  # a second command's row, landed first
    progress = Progress()
    writer = RowWriter(folder, progress=progress)
    ended = {ENDED_ROWS: json.dumps([row("t")])}
    writer.on_trial_result(0, [], Trial({"trial_id": "t", "row": {"trial_id": "t"}}), ended)
    assert writer.written == [] and progress.ended == {"t": "ok"}
    assert read_results(folder).loc[0, "dev_metric"] == 0.5, "the row that landed first stands"


def test_a_sweep_that_could_write_no_row_ends_with_its_count_not_a_traceback(tmp_path, capsys):
    from sweep.cli import report

    rows, code = report(tmp_path / "never-made" / "rows", {"a", "b"})
    assert code == 1 and rows.empty
    assert "(0 of 2 trials" in capsys.readouterr().out


def test_two_commands_taking_over_one_gone_holders_lock_never_both_hold_it(tmp_path, monkeypatch):
    # Both judged the dead holder's lock gone; the first took it over and claimed it, and the second then deleted
    # that fresh claim (it deleted whatever lock was there) and claimed its own: two writers of one sweep.
    from sweep import lock

    folder = tmp_path / "sweep"
    folder.mkdir()
    gone = {"host": platform.node(), "pid": 2 ** 22 - 7, "pid_namespace": lock.pid_namespace(), "command": "old",
            "token": "dead", "heartbeat": time.time()}
    (folder / lock.LOCK).write_text(json.dumps(gone))
    real, inside, first_in, leave = lock.why_gone, [], threading.Event(), threading.Event()

    def hold(name):
        with lock.sweep_lock(str(folder), name, poll=0.01):
            inside.append(name)
            first_in.set()
            leave.wait(10)
            inside.remove(name)

    first = threading.Thread(target=hold, args=("first",), daemon=True)

    def why_gone(holder, now):  # the second command has judged the lock gone: the first overtakes it right then
        if threading.current_thread().name == "second" and not first.is_alive() and not first_in.is_set():
            first.start()
            first_in.wait(10)
        return real(holder, now)

    monkeypatch.setattr(lock, "why_gone", why_gone)
    seen = []

    def second():
        with lock.sweep_lock(str(folder), "second", poll=0.01):
            seen.append(list(inside))

    waiting = threading.Thread(target=second, name="second", daemon=True)
    waiting.start()
    time.sleep(0.5)
    assert seen == [], f"the second command took the lock while {seen} held it"
    leave.set()
    waiting.join(10)
    first.join(10)
    assert seen == [[]], "it took the lock once the first had let it go"


def test_a_live_holder_on_a_host_whose_clock_lags_keeps_the_lock(tmp_path, monkeypatch):
    # Another host's heartbeat is its own clock's: one running minutes behind looked stale at once, and its lock
    # was taken from it while it wrote. What shows a holder gone is a lock that stops changing.
    from sweep import lock

    # 2 s: a holder thread starved for 0.4 s under a loaded CI machine's suite could look gone. The window below
    # stays 1 s, within which the heartbeat's ten-minute lag alone took the lock before.
    monkeypatch.setattr(lock, "STALE", 2.0)
    folder = tmp_path / "sweep"
    folder.mkdir()
    beating, holding = threading.Event(), threading.Event()
    beating.set()
    wrote = []  # when the holder last changed the lock

    def holder():  # renews the lock every 0.05 s, its clock ten minutes behind
        for beat in itertools.count():
            if not beating.is_set():
                return
            claim = {"host": "another-host", "pid": 1, "command": "held", "token": "t", "heartbeat": time.time() - 600,
                     "beat": beat}
            wrote.append(time.monotonic())
            lock._write_local(str(folder / lock.LOCK), claim, replace=True)
            holding.set()
            time.sleep(0.05)

    renewing = threading.Thread(target=holder, daemon=True)
    renewing.start()
    # The taker starts once the lock is there: on a loaded machine a thread's first write can come late, and a
    # taker that found no lock simply took it (CI failed so, at b3a1de7, with STALE already 2 s).
    assert holding.wait(10)
    got = []

    def take():
        with lock.sweep_lock(str(folder), "python -m sweep incremental", poll=0.01):
            got.append(time.monotonic())

    waiting = threading.Thread(target=take, daemon=True)
    waiting.start()
    time.sleep(1.0)
    assert got == [], "the live holder's lock was taken over"
    beating.clear()
    renewing.join()
    waiting.join(10)
    # From its last change, not from the moment it was told to stop: a holder thread starved just before that
    # stopped changing the lock earlier, and was rightly taken over sooner.
    assert got and got[0] - wrote[-1] >= lock.STALE, "taken over once it stopped changing for STALE seconds"


def test_a_final_row_whose_read_fails_once_is_never_overwritten(tmp_path, monkeypatch):
    # One failed read of the landed row (a network blip on an object store, too many open files) counted it as a
    # damaged file, and the trial's next row was written over it: the finished result was gone.
    folder = tmp_path / "sweep" / "rows"
    write_row(folder, row("t", dev_metric=0.9))
    real, failures = pq.read_table, [OSError(errno.EIO, "Input/output error")]

    def read_once_failing(*args, **kwargs):
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(store.pq, "read_table", read_once_failing)
    write_row(folder, row("t", dev_metric=0.1))
    kept = [pq.read_table(p)["dev_metric"][0].as_py() for p in (tmp_path / "sweep").rglob("*.parquet")]
    assert 0.9 in kept, "the finished row is still in the store, if only set aside"
    assert kept == [0.9], "a file whole after all is read again: its final row stands where it was"
