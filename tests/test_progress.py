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

from sweep.progress import ProgressView, minutes

ROOT = Path(__file__).resolve().parents[1]


class FakeTrial:
    """What the view reads of a Tune trial: its config, status and last result."""

    def __init__(self, trial_id: str, epochs: int, status: str = "PENDING"):
        self.config = {"trial": {"trial_id": trial_id, "finetune": {"epochs": epochs}}}
        self.status, self.last_result = status, {}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def a_view(sizes: dict[str, int], epochs: int = 2):
    clock = Clock()
    trials = [FakeTrial(t, epochs) for t in sizes]
    view = ProgressView({t: size * epochs for t, size in sizes.items()}, interval=30, clock=clock)
    return view, trials, clock


def test_plain_lines_count_states_name_running_epochs_and_give_an_eta_from_the_first_epoch(capsys):
    ids = ["incremental-sst2-n100-k0-t0-aaaaaaaaaa", "incremental-sst2-n100-k3-t0-bbbbbbbbbb",
           "incremental-sst2-n400-k6-t0-cccccccccc"]
    view, trials, clock = a_view(dict(zip(ids, [100, 100, 400])))
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
    view.on_trial_result(3, trials, a, {"epoch": 2, "epochs": 2})
    a.last_result = {"status": "ok", "dev_metric": 0.875}
    view.on_trial_complete(3, trials, a)
    assert capsys.readouterr().out.endswith(f"ok 1 · diverged 0 · failed 0 · running 1 · pending 1 · elapsed 0.7 min · "
                                            f"eta {minutes(1000 * 40 / 200)} | sst2-n100-k3-t0 0/2 epochs | ended: "
                                            f"{ids[0]} ok dev_metric=0.8750\n")
    view.on_trial_error(4, trials, b)
    c.status, c.last_result = "RUNNING", {"status": "diverged", "dev_metric": float("nan")}
    view.on_trial_complete(5, trials, c)
    out = capsys.readouterr().out.splitlines()
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
    view, (a, b), clock = a_view({"incremental-synthetic-n500-k0-t0-aaaaaaaaaa": 500,
                                  "incremental-synthetic-n500-k6-t0-bbbbbbbbbb": 500})
    a.status = "RUNNING"
    view.on_step_end(0, [a, b])
    clock.now = 0.5
    view.on_step_end(1, [a, b])  # within the second: not redrawn
    clock.now = 1.5
    view.on_trial_result(2, [a, b], a, {"epoch": 1, "epochs": 2})
    a.last_result = {"status": "ok", "dev_metric": 0.5}
    view.on_trial_complete(3, [a, b], a)
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


def test_a_restored_experiment_counts_trials_ended_before_as_done_without_their_pace(capsys):
    view, (a, b), clock = a_view({"incremental-synthetic-n100-k0-t0-aaaaaaaaaa": 100,
                                  "incremental-synthetic-n100-k6-t0-bbbbbbbbbb": 100})
    a.status, b.status = "TERMINATED", "RUNNING"
    clock.now = 60
    view.on_step_end(0, [a, b])
    assert "[1/2] ok 0 · diverged 0 · failed 0 · running 1 · pending 0" in capsys.readouterr().out
    assert view.eta() is None, "a trial ended before this run says nothing of its pace"
    view.on_trial_result(1, [a, b], b, {"epoch": 2, "epochs": 2, "resumed_from_epoch": 1})
    assert view.eta() == 0.0
    assert pickle.loads(pickle.dumps(ProgressView({"x": 1.0}))).work == {"x": 1.0}, "Tune pickles its callbacks"


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


def test_a_pack_counts_and_ends_each_member(capsys):
    ids = ["incremental-sst2-n100-k0-t0-aaaaaaaaaa", "incremental-sst2-n100-k3-t0-bbbbbbbbbb"]
    clock = Clock()
    pack = FakeTrial("pack-incremental-sst2-n100-cccccccccc", 2, status="RUNNING")
    pack.config["trial"]["pack"] = [{"trial_id": t, "finetune": {"epochs": 2}} for t in ids]
    view = ProgressView({t: 100 * 2 for t in ids}, interval=30, clock=clock)
    clock.now = 31
    view.on_trial_result(0, [pack], pack, {"status": "ok", "epoch": 1, "pack_results": {
        ids[0]: {"trial_id": ids[0], "epoch": 1, "status": "ok"}, ids[1]: {"trial_id": ids[1], "epoch": 1, "status": "ok"}}})
    # Both members did one of their two epochs in 31 s: 200 of 400 left at 200 per 31 s.
    assert capsys.readouterr().out == (f"[0/2] ok 0 · diverged 0 · failed 0 · running 2 · pending 0 · elapsed 0.5 min"
                                       f" · eta {minutes(31)} | sst2-n100-k0-t0 1/2 epochs, sst2-n100-k3-t0 1/2 epochs\n")
    pack.last_result = {"status": "ok", "pack_results": [  # the list form of a Tune experiment from before
        {"trial_id": ids[0], "epoch": 2, "status": "ok", "dev_metric": 0.75},
        {"trial_id": ids[1], "epoch": 1, "status": "diverged", "dev_metric": float("nan")}]}
    view.on_trial_complete(1, [pack], pack)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"ended: {ids[0]} ok dev_metric=0.7500")
    assert out[1].startswith("[2/2] ok 1 · diverged 1 · failed 0 · running 0 · pending 0")
