"""`python -m sweep status`: a sweep's store read per cell (done, diverged, failed, not yet run), without Ray,
on a local folder and on S3; what it says a rerun would run is what the rerun runs."""
from __future__ import annotations

import pytest

import sweep.cli
from analysis.results import read_results
from sweep.cli import main
from sweep.status import cell_counts, read_plans, trial_table
from sweep.store import rows_dir, sweep_dir, write_row

# What the stand-in for Ray gives the first three trials it is handed; the fourth never runs.
OUTCOMES = ("ok", "diverged", "error")


def fake_run(outcomes: dict):
    """Replaces sweep.cli.run: lands a row per outcome instead of training, and remembers what it was given."""
    def run(todo, settings, args, folder, pretrained, raw=None, **_):
        outcomes["handed"] = [spec.trial_id for spec in todo]
        for spec, status in zip(todo, OUTCOMES):
            write_row(folder, {**spec.row(), "status": status, "metric_name": "accuracy",
                               "dev_metric": 0.5 if status == "ok" else None})
            outcomes[spec.trial_id] = status
    return run


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path) -> str:
    return str(tmp_path) if request.param == "local" else request.getfixturevalue("s3_bucket")


def test_status_of_done_diverged_failed_and_missing_trials(tiny_bert, storage, monkeypatch, capsys):
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "0", "2",
            "--trials", "2", "--storage", storage, "--name", "sw"]
    outcomes = {}
    monkeypatch.setattr(sweep.cli, "run", fake_run(outcomes))
    assert main(argv) == 1  # a failed trial
    handed = outcomes.pop("handed")
    assert len(handed) == 4 and set(outcomes) == set(handed[:3])
    capsys.readouterr()

    assert main(["status", "--storage", storage, "sw"]) == 0
    out = capsys.readouterr().out
    assert "4 trials; " in out and all(f"{state} 1" in out for state in ("done", "diverged", "failed", "not yet run"))
    assert "would run 2 trials (failed 1, not yet run 1) and skip 2 (done 1, diverged 1)" in out
    assert f"python -m sweep incremental --model {tiny_bert} " in out

    # Per cell (k), the counts the fake run's outcomes give.
    sweep_folder = sweep_dir(storage, "sw")
    trials = trial_table(read_plans(sweep_folder), read_results(rows_dir(storage, "sw")))
    counts = cell_counts(trials).set_index("k")
    k_of = dict(zip(trials["trial_id"], trials["k"]))
    for k in (0, 2):
        mine = [outcomes.get(t, "missing") for t in handed if k_of[t] == k]
        assert counts.loc[k, ["trials", "done", "diverged", "failed", "not yet run"]].tolist() == [
            2, mine.count("ok"), mine.count("diverged"), mine.count("error"), mine.count("missing")]

    # The rerun runs exactly what status said: the failed trial and the one never run.
    monkeypatch.setattr(sweep.cli, "run", fake_run(rerun := {}))
    main(argv)
    assert set(rerun["handed"]) == {handed[2], handed[3]}


def test_status_of_a_sweep_that_is_not_there_names_the_ones_that_are(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setattr(sweep.cli, "run", fake_run({}))
    main(["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "0", "--trials", "1",
          "--storage", str(tmp_path), "--name", "there"])
    with pytest.raises(SystemExit, match=r"NAME: no sweep 'typo' under --storage .*; sweeps there: there$"):
        main(["status", "--storage", str(tmp_path), "typo"])


def test_status_counts_every_trial_of_a_search_budget(tiny_bert, tmp_path, monkeypatch, capsys):
    from sweep.search import planned_rows

    def run(todo, settings, args, folder, pretrained, raw=None, **_):  # the first study's baseline lands, nothing else
        write_row(folder, {**planned_rows(todo, 1)[0], "status": "ok", "metric_name": "accuracy", "dev_metric": 0.5})

    monkeypatch.setattr(sweep.cli, "run", run)
    main(["lr-multipliers", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "0", "2",
          "--trials", "1", "--num-samples", "3", "--storage", str(tmp_path), "--name", "search"])
    capsys.readouterr()
    main(["status", "--storage", str(tmp_path), "search"])
    out = capsys.readouterr().out
    assert "6 trials; done 1, not yet run 5" in out and "would run 5 trials (not yet run 5) and skip 1 (done 1)" in out


def test_status_says_a_lock_whose_holder_is_gone_is_left_behind_not_being_written(tmp_path, capsys):
    import json
    import os
    import platform
    import subprocess
    import time

    from sweep.lock import LOCK, pid_namespace
    from sweep.status import record_plan

    where = sweep_dir(str(tmp_path), "sw")
    record_plan(where, ["incremental"], "incremental", [{"trial_id": "t0", "experiment": "incremental", "task": "sst2",
                                                         "train_size": 500}], ("ok", "diverged"))
    ended = subprocess.Popen(["true"])
    ended.wait()
    for pid in (ended.pid, os.getpid()):  # a killed driver's lock (renewed a moment ago), then a live holder's
        (tmp_path / "sw" / LOCK).write_text(json.dumps({
            "host": platform.node(), "pid": pid, "pid_namespace": pid_namespace(), "command": "python -m sweep x",
            "started_at": "2026-11-28T10:00:00+00:00", "heartbeat": time.time()}))
        assert main(["status", "--storage", str(tmp_path), "sw"]) == 0
        last = capsys.readouterr().out.splitlines()[-1]
        if pid == ended.pid:
            assert last == (f"a lock left by `python -m sweep x` on {platform.node()} (pid {pid}, since "
                            "2026-11-28T10:00:00+00:00): that process is gone; nothing writes this sweep now, and "
                            "the next command for it takes the lock over")
        else:
            assert last.startswith("being written now by `python -m sweep x`")


def test_status_does_not_call_a_lock_of_another_host_whose_clock_lags_left_behind(tmp_path, capsys):
    # Its heartbeat, ten minutes behind by its own clock, read as "nothing writes this sweep now, and the next
    # command takes the lock over", while that command would wait for the live holder (sweep.lock).
    import json
    import re
    import time

    from sweep.lock import LOCK, STALE
    from sweep.status import record_plan

    where = sweep_dir(str(tmp_path), "sw")
    record_plan(where, ["incremental"], "incremental", [{"trial_id": "t0", "experiment": "incremental", "task": "sst2",
                                                         "train_size": 500}], ("ok", "diverged"))
    (tmp_path / "sw" / LOCK).write_text(json.dumps({"host": "another-host", "pid": 7, "command": "python -m sweep x",
                                                    "heartbeat": time.time() - 600}))
    assert main(["status", "--storage", str(tmp_path), "sw"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    renewed = re.fullmatch(r"held by `python -m sweep x` on another-host \(pid 7\), another host; its lock was last "
                           r"renewed (\d+) s ago by the storage's clock \(every 20 s while it runs\): the next command "
                           rf"for this sweep waits for it, and takes the lock over once it stays unrenewed for "
                           rf"{STALE:.0f} s", last)
    # The file's age, not the heartbeat's 600 s; seconds, not [0-2]: a loaded machine can stall this test that long.
    assert renewed and int(renewed[1]) < 60, last


def test_status_of_a_sweep_whose_recorded_grid_was_damaged_says_so(tmp_path, capsys):
    from sweep.status import record_plan

    where = sweep_dir(str(tmp_path), "sw")
    record_plan(where, ["incremental"], "incremental", [{"trial_id": "t0", "experiment": "incremental", "task": "sst2",
                                                         "train_size": 500}], ("ok", "diverged"))
    plan = next((tmp_path / "sw" / "plans").iterdir())
    plan.write_text(plan.read_text()[:40])  # cut short
    for _ in range(2):  # the read that sets it aside, and the next one
        assert main(["status", "--storage", str(tmp_path), "sw"]) == 0
        out = capsys.readouterr().out
        assert "no recorded grid yet" not in out and "before `status` existed" not in out
        assert (f"its recorded grid was set aside as damaged ({tmp_path / 'sw' / 'quarantine'}/plans-{plan.name}): "
                "trials it never ran are not counted; running its command again records it anew") in out


def test_status_of_a_permutation_sweep_counts_its_cells_by_layer_order(tmp_path, capsys):
    """A permutation's cell is its layer order, a list in the recorded grid and in the rows: status raised
    `TypeError: unhashable type: 'list'` on every permutation sweep."""
    from sweep.status import record_plan

    planned = [{"trial_id": f"p{n}", "experiment": "permutation", "task": "sst2", "train_size": 64, "trial_index": 0,
                "permutation": order} for n, order in enumerate(([2, 1, 3], [3, 1, 2]))]
    record_plan(sweep_dir(str(tmp_path), "perm"), ["permutation"], "permutation", planned, ("ok", "diverged"))
    write_row(rows_dir(str(tmp_path), "perm"), {**planned[0], "status": "ok", "metric_name": "accuracy",
                                                  "dev_metric": 0.5})
    assert main(["status", "--storage", str(tmp_path), "perm"]) == 0
    out = capsys.readouterr().out
    header, *cells = out.splitlines()[1:4]
    assert "2 trials; done 1, not yet run 1" in out and "permutation" in header.split(), out
    assert [line.split()[0] for line in cells] == ["sst2", "sst2"] and "(2, 1, 3)" in cells[0], out
