"""The sweep's progress view: Tune events in, the lines a person watching reads out (plain in a log, one
redrawn line on a terminal), and a real sweep's console from `python -m sweep`."""
from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.progress import ProgressView, minutes, trial_work
from sweep.runner import RowWriter
from trainables.rows import make_row, with_ended

ROOT = Path(__file__).resolve().parents[1]


class FakeTrial:
    """What the view and the row writer read of a Tune trial: its config, status and last result."""

    def __init__(self, trial_id: str, epochs: int, status: str = "PENDING"):
        self.config = {"trial": {"trial_id": trial_id, "finetune": {"epochs": epochs}, "row": {"trial_id": trial_id}}}
        self.status, self.last_result, self.error_file = status, {}, None


def ending(trial: FakeTrial, status: str, dev_metric: float, **report) -> dict:
    """A trial's last report: its figures and its row (trainables.rows), as a trainable sends them."""
    trial.last_result = with_ended(report, [make_row(trial.config["trial"]["row"], {"dev_metric": dev_metric}, status)])
    return trial.last_result


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def a_view(sizes: dict[str, int], epochs: int = 2, folder=None):
    """A view, its trials and its clock; with `folder`, also the row writer that tells the view how trials
    end (sweep.runner.run_trials sets them up so)."""
    clock = Clock()
    trials = [FakeTrial(t, epochs) for t in sizes]
    view = ProgressView({t: size * epochs for t, size in sizes.items()}, interval=30, clock=clock)
    writer = RowWriter(folder, progress=view) if folder is not None else None
    return view, trials, clock, writer


def test_plain_lines_count_states_name_running_epochs_and_give_an_eta_from_the_first_epoch(capsys, tmp_path):
    ids = ["incremental-sst2-n100-k0-t0-aaaaaaaaaa", "incremental-sst2-n100-k3-t0-bbbbbbbbbb",
           "incremental-sst2-n400-k6-t0-cccccccccc"]
    view, trials, clock, writer = a_view(dict(zip(ids, [100, 100, 400])), folder=tmp_path)
    view.on_step_end(0, trials)
    assert capsys.readouterr().out == ("[0/3] ok 0 · diverged 0 · failed 0 · running 0 · pending 3 · elapsed 0.0 min "
                                       "· eta after the first epochs\n")

    a, b, c = trials
    a.status = b.status = "RUNNING"
    clock.now = 10
    view.on_trial_result(1, trials, a, {"epoch": 1, "epochs": 2})
    assert capsys.readouterr().out == "", "a plain line at most every interval, unless a trial ends"
    clock.now = 31
    view.on_step_end(2, trials)
    line = capsys.readouterr().out
    # Work is size x epochs: a's first epoch did 100 of 1,200 in 31 s, so 1,100 are left at that pace.
    assert line == (f"[0/3] ok 0 · diverged 0 · failed 0 · running 2 · pending 1 · elapsed 0.5 min · "
                    f"eta {minutes(1100 * 31 / 100)} | sst2-n100-k0-t0 1/2 epochs, sst2-n100-k3-t0 0/2 epochs\n")

    clock.now = 40
    last = ending(a, "ok", 0.875, epoch=2, epochs=2)
    for callback in (writer, view):  # in the order run_trials gives them to Tune
        callback.on_trial_result(3, trials, a, last)
    writer.on_trial_complete(3, trials, a)
    assert capsys.readouterr().out.endswith(f"ok 1 · diverged 0 · failed 0 · running 1 · pending 1 · elapsed 0.7 min · "
                                            f"eta {minutes(1000 * 40 / 200)} | sst2-n100-k3-t0 0/2 epochs | ended: "
                                            f"{ids[0]} ok dev_metric=0.8750\n")
    writer.on_trial_error(4, trials, b)
    c.status = "RUNNING"
    writer.on_trial_complete(5, trials, c) if ending(c, "diverged", float("nan")) else None
    out = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert out[0].startswith("[2/3] ok 1 · diverged 0 · failed 1 ·") and out[0].endswith(f"ended: {ids[1]} error")
    assert out[1].startswith("[3/3] ok 1 · diverged 1 · failed 1 · running 0 · pending 0") and out[1].endswith(
        f"eta 0.0 min | ended: {ids[2]} diverged")


def test_a_terminal_gets_one_line_redrawn_in_place_and_ended_trials_above_it(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setenv("COLUMNS", "200")  # the live line is cut to the terminal's width
    view, (a, b), clock, _ = a_view({"incremental-synthetic-n500-k0-t0-aaaaaaaaaa": 500,
                                     "incremental-synthetic-n500-k6-t0-bbbbbbbbbb": 500})
    a.status = "RUNNING"
    view.on_step_end(0, [a, b])
    clock.now = 0.5
    view.on_step_end(1, [a, b])  # within the second: not redrawn
    clock.now = 1.5
    view.on_trial_result(2, [a, b], a, {"epoch": 1, "epochs": 2})
    view.end(a.config["trial"]["trial_id"], "ok", 0.5)  # what the row writer says once its row landed
    view.on_experiment_end([a, b])
    frames = screen.getvalue().split("\r\x1b[K")[1:]
    assert len(frames) == 5 and all("\n" not in f for f in frames[:2])
    assert "running 1" in frames[0] and "synthetic-n500-k0-t0 0/2 epochs" in frames[0]
    assert "synthetic-n500-k0-t0 1/2 epochs" in frames[1] and f"eta {minutes(1500 * 1.5 / 500)}" in frames[1]
    assert frames[2] == "incremental-synthetic-n500-k0-t0-aaaaaaaaaa ok dev_metric=0.5000\n"
    assert frames[3].startswith("[1/2] ok 1") and frames[4].startswith("[1/2] ok 1") and frames[4].endswith("\n")
    monkeypatch.setenv("COLUMNS", "40")
    view.show(force=True)
    assert len(screen.getvalue().rsplit("\r\x1b[K", 1)[1]) == 39, "a wrapped line could not be redrawn in place"


def test_a_trial_resumed_from_a_checkpoint_counts_only_this_runs_pace(capsys):
    view, (a, b), clock, _ = a_view({"incremental-synthetic-n100-k0-t0-aaaaaaaaaa": 100,
                                     "incremental-synthetic-n100-k6-t0-bbbbbbbbbb": 100}, epochs=4)
    a.status = "RUNNING"
    clock.now = 60
    view.on_trial_result(0, [a, b], a, {"epoch": 2, "resumed_from_epoch": 1})
    # a did 1 epoch of 4 this run (its first came from the checkpoint): 100 x 1 of work in 60 s, and
    # 100 x 2 (a) + 100 x 4 (b) = 600 left.
    assert view.eta() == 600 * 60 / 100
    assert pickle.loads(pickle.dumps(ProgressView({"x": 1.0}))).work == {"x": 1.0}, "Tune pickles its callbacks"


def test_a_row_that_cannot_be_written_counts_as_failed(capsys, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("rows cannot go under a file")
    view, (a,), clock, writer = a_view({"incremental-synthetic-n100-k0-t0-aaaaaaaaaa": 100}, folder=blocked / "rows")
    writer.on_trial_result(0, [a], a, ending(a, "ok", 0.9, epoch=2))
    captured = capsys.readouterr()
    assert f"cannot write the row of {a.config['trial']['trial_id']} to {blocked / 'rows'}" in captured.err
    assert captured.out.startswith("[1/1] ok 0 · diverged 0 · failed 1")
    assert list(writer.unwritten) == [a.config["trial"]["trial_id"]] and writer.written == []


def test_a_real_sweep_console_says_what_it_prepares_shows_progress_and_no_ray_banner(tiny_bert, tmp_path):
    command = [sys.executable, "-m", "sweep", "incremental", "--model", tiny_bert, "--tasks", "synthetic",
               "--sizes", "16", "--k", "0", "2", "--trials", "1", "--epochs", "2", "--storage", str(tmp_path),
               "--name", "watch"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_AIR_NEW_OUTPUT", None)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    lines = out.splitlines()
    assert any(line.startswith("preparing 2 trials: loading and tokenizing synthetic") for line in lines)
    assert out.count("tensorboard --logdir") == 1 and f"tensorboard --logdir {tmp_path / 'watch'}" in out
    assert "Configuration for experiment" not in out and "View detailed results here" not in out
    ended = [line for line in lines if " | ended: incremental-synthetic-n16-" in line]
    assert len(ended) == 2 and ended[-1].startswith("[2/2] ok 2 · diverged 0 · failed 0 · running 0 · pending 0")
    assert lines.index(ended[0]) > next(i for i, line in enumerate(lines) if line.startswith("[0/2] "))


def test_a_pack_counts_and_ends_each_member(capsys, tmp_path):
    ids = ["incremental-sst2-n100-k0-t0-aaaaaaaaaa", "incremental-sst2-n100-k3-t0-bbbbbbbbbb"]
    clock = Clock()
    pack = FakeTrial("pack-incremental-sst2-n100-cccccccccc", 2, status="RUNNING")
    pack.config["trial"]["pack"] = [{"trial_id": t, "finetune": {"epochs": 2}, "row": {"trial_id": t}} for t in ids]
    view = ProgressView({t: 100 * 2 for t in ids}, interval=30, clock=clock)
    writer = RowWriter(tmp_path, progress=view)
    clock.now = 31
    first = {"epoch": 1, "pack_results": {ids[0]: {"trial_id": ids[0], "epoch": 1},
                                          ids[1]: {"trial_id": ids[1], "epoch": 1}}}
    diverged = make_row(pack.config["trial"]["pack"][1]["row"], {"dev_metric": float("nan")}, "diverged")
    for callback in (writer, view):
        callback.on_trial_result(0, [pack], pack, with_ended(first, [diverged]))
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"ended: {ids[1]} diverged")
    # The running member did one of its two epochs in 31 s; the diverged one's work is done: 100 left at
    # 100 per 31 s (a member ended early does its share of the pace).
    pack.last_result = with_ended({"epoch": 2, "pack_results": {ids[0]: {"trial_id": ids[0], "epoch": 2}}},
                                  [make_row(pack.config["trial"]["pack"][0]["row"], {"dev_metric": 0.75}, "ok")])
    writer.on_trial_complete(1, [pack], pack)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"ended: {ids[0]} ok dev_metric=0.7500")
    assert out[0].startswith("[2/2] ok 1 · diverged 1 · failed 0 · running 0 · pending 0")
    assert sorted(p.stem for p in tmp_path.glob("*.parquet")) == sorted(ids), "each member lands its own row"


def test_a_sequential_trials_eta_counts_its_intermediate_round():
    from types import SimpleNamespace

    ids = ["sequential-sst2-n100-k6-t0-aaaaaaaaaa", "sequential-sst2-n100-k6-t1-bbbbbbbbbb"]
    clock, trials = Clock(), [FakeTrial(t, 2) for t in ids]
    for trial in trials:
        trial.config["trial"]["finetune"]["intermediate_task"] = "cola"
    spec = SimpleNamespace(train_size=100, epochs=2, intermediate_task="cola")
    view = ProgressView({t: trial_work(spec) for t in ids}, interval=30, clock=clock)
    trials[0].status, clock.now = "RUNNING", 30
    view.on_trial_result(0, trials, trials[0], {"epoch": 1})
    # Its first report came after the intermediate round's 2 epochs and 1 of its own: 300 of its 400 in 30 s, and
    # 100 + 400 left (counted as 100 of 200, the ETA had been 90 s).
    assert view.eta() == 500 * 30 / 300
    view.on_trial_result(1, trials, trials[1], {"epoch": 2, "resumed_from_epoch": 1})
    assert view.first_fraction[ids[1]] == 3 / 4, "a saved state is past the intermediate round"
