"""The sweep's progress view: Tune events in, the lines a person watching reads out (plain in a log, one
redrawn line on a terminal), and a real sweep's console from `python -m sweep`."""
from __future__ import annotations

import io
import json
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
    assert "Loading weights" not in out, "transformers' bar over the model's tensors"
    ended = [line for line in lines if " | ended: incremental-synthetic-n16-" in line]
    assert len(ended) == 2 and ended[-1].startswith("[2/2] ok 2 · diverged 0 · failed 0 · running 0 · pending 0")
    assert lines.index(ended[0]) > next(i for i, line in enumerate(lines) if line.startswith("[0/2] "))


def test_loading_the_model_leaves_transformers_progress_bars_as_it_found_them(tiny_bert):
    from transformers.utils import logging

    from trainables.models import load_pretrained

    for enabled in (True, False):
        (logging.enable_progress_bar if enabled else logging.disable_progress_bar)()
        load_pretrained(tiny_bert)
        assert logging.is_progress_bar_enabled() == enabled
    logging.enable_progress_bar()


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


def a_pack(ids: list[str], epochs: int = 2) -> FakeTrial:
    pack = FakeTrial("pack-incremental-sst2-n100-cccccccccc", epochs, status="RUNNING")
    pack.config["trial"]["pack"] = [{"trial_id": t, "finetune": {"epochs": epochs}, "row": {"trial_id": t}}
                                    for t in ids]
    return pack


def test_a_gpu_packs_members_waiting_for_an_earlier_group_are_pending_not_running(capsys):
    ids = [f"incremental-sst2-n100-k{k}-t0-{c * 10}" for k, c in zip((0, 3, 6), "abc")]
    pack, clock = a_pack(ids), Clock()
    view = ProgressView({t: 100 * 2 for t in ids}, interval=30, clock=clock)
    first = {"epoch": 1, "pack_results": {ids[0]: {"trial_id": ids[0], "epoch": 1}},
             "pack_waiting": json.dumps(ids[1:])}  # groups of one: the first trains, the other two wait
    view.on_trial_result(0, [pack], pack, first)
    assert view.line().startswith("[0/3] ok 0 · diverged 0 · failed 0 · running 1 · pending 2 ·")
    assert view.line().endswith("| sst2-n100-k0-t0 1/2 epochs")
    # The first group ended: the second starts (0 of its epochs reported yet), the third still waits.
    view.end(ids[0], "ok", 0.5)
    view.on_trial_result(1, [pack], pack, {**first, "epoch": 2, "pack_waiting": json.dumps(ids[2:])})
    assert "running 1 · pending 1 ·" in view.line() and view.line().endswith("| sst2-n100-k3-t0 0/2 epochs")
    # A report made before packs said who waits (a restored experiment's) names none: every member runs.
    older = a_pack(ids)
    view = ProgressView({t: 100 * 2 for t in ids}, interval=30, clock=clock)
    view.on_trial_result(0, [older], older, {k: v for k, v in first.items() if k != "pack_waiting"})
    assert "running 3 · pending 0 ·" in view.line()


def test_a_pack_trained_in_groups_reports_which_members_wait(tiny_bert, pretrained, synthetic, monkeypatch):
    """A pack that the device holds one member of at a time (a GPU's memory, here made up on a CPU) trains three
    groups one after another; each report names the members whose group has not started."""
    from ray import tune

    import trainables.fused as fused
    from sweep.cli import parse_command_line
    from sweep.experiments import EXPERIMENTS
    from sweep.packs import pack_config
    from trainables.tune_trainable import finetune_trainable

    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "0", "2", "4",
            "--trials", "1", "--epochs", "2", "--max-length", "32"]
    members = [s.to_config() for s in EXPERIMENTS["incremental"].build(parse_command_line(argv).grid, 4, 4)]
    ids = [m["trial_id"] for m in members]
    one = fused.PEAK_BYTES_PER_PARAMETER * fused.parameter_count(pretrained) / fused.MEMORY_SHARE * 1.5
    monkeypatch.setattr(fused, "device_budget", lambda device, fraction: int(one))
    resources = type("Resources", (), {"required_resources": {"CPU": 1}})()
    context = type("Context", (), {"get_trial_resources": lambda _: resources})()
    monkeypatch.setattr(tune, "get_context", lambda: context)
    monkeypatch.setattr(tune, "get_checkpoint", lambda: None)
    reports = []
    monkeypatch.setattr(tune, "report", lambda metrics, checkpoint=None: reports.append(metrics))
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # the trainable sets its own
    pack = pack_config(members)
    finetune_trainable({"trial": pack}, {pack["data_key"]: synthetic}, {pack["model_key"]: pretrained})
    waiting = [json.loads(r.get("pack_waiting", "[]")) for r in reports]
    trained = [sorted(r["pack_results"]) for r in reports]
    assert trained == [ids[:1], ids[:1], ids[:2], ids[:2], ids, ids], "one member a group, two epochs each"
    assert waiting == [ids[1:], ids[2:], ids[2:], [], [], []], "waiting until the group before has ended"


def specs_of(argv: list[str]) -> list:
    from sweep.cli import parse_command_line
    from sweep.experiments import EXPERIMENTS

    return EXPERIMENTS[argv[0]].build(parse_command_line(argv).grid, 4, 4)


def test_a_probing_sweep_shows_its_probes_one_running_at_a_time_and_each_ending(tiny_bert, tmp_path, monkeypatch,
                                                                                 capsys):
    from ray import tune

    import sweep.probing as probing

    specs = specs_of(["probing", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--trials", "1",
                      "--probes", "mean-pool", "--layers", "0", "1", "2", "--max-probe-epochs", "3"])
    built = {}
    monkeypatch.setattr(tune, "with_parameters", lambda trainable, **objects: trainable)
    monkeypatch.setattr(tune, "with_resources", lambda trainable, resources: trainable)
    monkeypatch.setattr(probing, "make_tuner", lambda trainable, **options: built.update(options))
    monkeypatch.setattr(probing, "fit", lambda tuner, tune_dir: None)
    probing.run_probing(specs, data={}, pretrained={tiny_bert: type("Pretrained", (), {"state_dict": {}})},
                        folder=tmp_path, tune_dir=tmp_path, cpus_per_trial=1,
                        gpus_per_trial=0)
    writer, view = built["callbacks"][:2]
    assert writer.progress is view and view.work == {s.trial_id: 24 for s in specs}, "a probe counts its subset"

    (group,) = built["param_space"]["trial"]["grid_search"]
    subset = FakeTrial(group["trial_id"], 0, status="RUNNING")
    subset.config = {"trial": group}
    first = group["probes"][0]
    view.see([subset])
    # Its probes train one after another: the first runs, the others wait; a probe reports no epochs.
    assert view.line().startswith("[0/3] ok 0 · diverged 0 · failed 0 · running 1 · pending 2 ·")
    assert view.line().endswith("| synthetic-n24-t0 mean-pool layer 0")
    capsys.readouterr()
    report = with_ended({"row_id": first["trial_id"], "probe": "mean-pool", "layer": 0},
                        [make_row(first["row"], {"dev_metric": 0.75, "metric_name": "accuracy", "stop_epoch": 3},
                                  "ok")])
    for callback in (writer, view):
        callback.on_trial_result(0, [subset], subset, report)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1, "one line a probe: the view's, which ends with the writer's own account of the probe"
    assert out[0].startswith("[1/3] ok 1 · diverged 0 · failed 0 · running 1 · pending 1 ·")
    assert out[0].endswith(f"{first['trial_id']} mean-pool layer 0: ok dev accuracy 0.7500, stopped at epoch 3")
    assert "synthetic-n24-t0 mean-pool layer 1 |" in out[0] and view.eta() is not None


def test_a_searchs_studies_show_on_one_view_in_the_driver(tiny_bert, tmp_path, capsys):
    """Each study's Tuner runs in a Ray task: a relay there hands its events to the driver's one view; its
    landed trials are replayed (no work, not shown), the rest count, and a trial ASHA stopped is pruned."""
    from sweep.progress import ProgressRelay, feed, short_name
    from sweep.search import SearchRowWriter, cell_space, search_work

    (spec,) = specs_of(["lr-multipliers", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "40", "--k", "2",
                        "--trials", "1", "--epochs", "2"])
    pretrained = {tiny_bert: type("Pretrained", (), {"num_layers": 4})()}
    work = search_work([spec], pretrained, 4, {spec.trial_id: {1: [1.0] * 4}})  # s1 landed in an earlier run
    ids = [f"{spec.trial_id}-s{n}" for n in (0, 2, 3)]
    assert work == {t: 40 * 2 for t in ids}, "the study asks s1 first (replayed), then the free numbers"
    assert short_name(ids[0]) == "synthetic-n40-k2-t0-s0", "the experiment's name has a hyphen of its own"

    class Queue(list):  # ray.util.queue.Queue's calls, in one process
        put_nowait = list.append

    events, space = Queue(), cell_space(spec, 4)
    relay = ProgressRelay(events)
    writer = SearchRowWriter(tmp_path, spec.trial_id, 4, progress=relay)
    trials = [FakeTrial(f"{spec.trial_id}-s{n}", 2) for n in (1, 0)]
    for trial, number in zip(trials, (1, 0)):
        trial.config = space(type("OptunaTrial", (), {"number": number, "suggest_float": lambda *a, **k: 1.0})())
        relay.on_trial_start(0, trials, trial)
    relay.on_trial_result(0, trials, trials[0], {"epoch": 1, "replayed": True})
    relay.on_trial_result(0, trials, trials[1], {"epoch": 1})
    trials[1].last_result = {"epoch": 1, "epochs_run": 1, "val_metric": 0.5}
    writer.on_trial_complete(1, trials, trials[1])  # stopped by ASHA after its first epoch
    assert capsys.readouterr().out == "", "in the study's task, the writer leaves its lines to the driver's view"

    view, relayed = ProgressView(work, interval=30, clock=Clock()), {}
    feed(view, events, relayed)
    first, ended = capsys.readouterr().out.splitlines()
    assert "running 1 · pending 2 ·" in first and first.endswith("| synthetic-n40-k2-t0-s0 0/2 epochs"), "s1 replays"
    assert ended.startswith("[1/3] ok 0 · diverged 0 · pruned 1 · failed 0 · running 0 · pending 2 ·")
    assert ended.endswith(f"| ended: [{spec.trial_id} 1/4] s0 pruned after 1/2 epochs | multipliers 1 1 1 1 | "
                           "val 0.5000 dev None")


@pytest.mark.parametrize("argv, names", [
    (["localized", "--block-size", "3"], [f"synthetic-n24-t0 block-{mode} {start}..{start + 2}"
                                          for mode in ("reinit", "preserve") for start in (1, 2)]),
    (["heads", "--layers", "2", "--heads", "0", "3"], ["synthetic-n24-t0", "synthetic-n24-t0 layer 2 head 0",
                                                       "synthetic-n24-t0 layer 2 head 3"]),
    (["sublayer", "--layers", "1", "--sublayers", "attention"], ["synthetic-n24-t0",
                                                                 "synthetic-n24-t0 layer 1 attention"]),
    (["alternate"], ["synthetic-n24-t0 odd layers", "synthetic-n24-t0 even layers"]),
    (["reinit-lr", "--k", "2", "--lr-multiplier", "10"], ["synthetic-n24-k2-t0 lr x10"]),
    (["permutation", "--permutations", "2"], ["synthetic-n24-t0 order 0", "synthetic-n24-t0 order 1"]),
    (["incremental", "--k", "2"], ["synthetic-n24-k2-t0"]),
])
def test_running_trials_are_named_by_what_their_ids_give_only_as_a_digest(tiny_bert, argv, names):
    # A localized sweep's trials of one cell and index all showed as `synthetic-n24-t0`: which block was running?
    from sweep.progress import members

    specs = specs_of([*argv, "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--trials", "1"])
    running = FakeTrial("", 1)
    running.config = {"trial": {"trial_id": "pack", "pack": [s.to_config() for s in specs]}}
    assert sorted(name for _, _, name in members(running)) == sorted(names)
