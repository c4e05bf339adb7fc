"""The lr-multipliers search, the trackers and `python -m sweep status`: a rerun's study draws new
points, a different budget is refused before anything is recorded, status reads the newest of two plans
written in one second, and MLflow logs probing trials, searches and object-storage sweeps without crashing."""
from __future__ import annotations

import datetime
import itertools
import json
import os
import subprocess
import sys
import types

import pytest

import sweep.cli
import sweep.status
from sweep.api import configure
from sweep.cli import main
from sweep.config import Refused
from sweep.experiments import EXPERIMENTS, GridSettings
from sweep.search import experiment_dir, planned_rows, record_budget, search_options
from sweep.store import parent, write_row
from trialrows.experiments import lr_multipliers


def drive(searcher, trials: int, values) -> dict[int, list]:
    """Ask the study for `trials` trials one after another, as Tune does with one trial pending at a time, and
    tell it each one's objective; the multipliers of each trial, by sample number."""
    asked = {}
    for i in range(trials):
        config = searcher.suggest(f"t{i}")["trial"]
        searcher.on_trial_complete(f"t{i}", {"val_metric": next(values)})
        asked[config["row"]["sample"]] = config["finetune"]["layer_lr_multipliers"]
    return asked


def test_a_rerun_study_draws_new_points_not_those_its_landed_trials_tried():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings = GridSettings.of(model="m", tasks=("synthetic",), sizes=(40,), trials=((0, 1),), k=(2,), epochs=2)
    (spec,) = lr_multipliers(settings, 4)
    budget = 30  # TPE's random start is 10 trials: the kill below lands within it
    values = (0.5 + 0.01 * i for i in itertools.count())
    first = drive(search_options(spec, 4, budget)["search_alg"], 5, values)
    assert first[0] == [1.0] * 4 and len({tuple(m) for m in first.values()}) == 5

    # Killed once s0..s4 landed; the rerun asks them again (replayed), then new trials.
    again = drive(search_options(spec, 4, budget, first)["search_alg"], 9, values)
    assert {n: again[n] for n in first} == first, "the landed trials are asked again at their own points"
    repeated = {n: m for n, m in again.items() if n not in first and m in first.values()}
    assert repeated == {}, f"new trials of the rerun repeat landed points: {repeated}"


def test_a_different_budget_is_refused_before_the_plan_is_recorded(tiny_bert, tmp_path, monkeypatch, capsys):
    handed = []

    def run(todo, settings, options, folder, pretrained, raw=None, **_):
        """Stands in for the search: fixes each study's budget as run_searches does, lands the first baseline."""
        handed.append(options.num_samples)
        for spec in todo:
            record_budget(experiment_dir(parent(folder), spec), spec, options.num_samples)
        write_row(folder, {**planned_rows(todo, 1)[0], "status": "ok", "metric_name": "accuracy", "dev_metric": 0.5})

    monkeypatch.setattr(sweep.cli, "run", run)
    monkeypatch.setattr(sweep.cli, "start_ray_if_none", lambda address: False)  # the stand-in needs no Ray
    argv = ["lr-multipliers", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "2", "--trials",
            "1", "--storage", str(tmp_path), "--name", "budget", "--num-samples"]
    main([*argv, "3"])
    assert handed == [3]
    capsys.readouterr()

    assert main([*argv, "5"]) == 2
    assert "--num-samples: 5 differs from the 3 the study" in capsys.readouterr().err
    assert handed == [3], "refused before any work"
    assert main(["status", "--storage", str(tmp_path), "budget"]) == 0
    out = capsys.readouterr().out
    assert "3 trials; done 1, not yet run 2" in out
    assert "--num-samples 3` (" in out and "would run 2 trials (not yet run 2) and skip 1 (done 1)" in out


def test_status_reads_the_newest_of_two_plans_written_in_one_second(tmp_path, monkeypatch):
    """A precision sweep's rerun records its pilot and then its whole grid, milliseconds apart."""
    class Clock(datetime.datetime):
        ticks = itertools.count(1000)

        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 11, 28, 5, 0, 0, next(cls.ticks), tzinfo=tz)

    monkeypatch.setattr(sweep.status, "datetime", types.SimpleNamespace(datetime=Clock, timezone=datetime.timezone))
    settings = GridSettings.of(model="m", tasks=("synthetic",), sizes=(16,), trials=((0, 2),), k=(0, 2))
    rows = [spec.row() for spec in EXPERIMENTS["incremental"].build(settings, 4)]
    pilot = (["incremental", "--pilot"], [row for row in rows if row["trial_index"] == 0])
    whole = (["incremental", "--whole"], rows)
    for name, plans in (("pilot-last", (whole, pilot)), ("whole-last", (pilot, whole))):
        for argv, planned in plans:
            sweep.status.record_plan(str(tmp_path / name), argv, "incremental", planned, ("ok", "diverged"))
        (argv, planned) = plans[-1]
        out = sweep.status.status(str(tmp_path), name)
        assert f"rerunning `python -m sweep {' '.join(argv)}`" in out and f"would run {len(planned)} trials" in out


def test_mlflow_logs_a_probing_trial_with_its_probes_shared_settings(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from ray.tune.experiment import Trial

    from sweep.probing import group_specs
    from sweep.trackers import tracker_callbacks

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # restored afterwards: the callback sets it
    settings = GridSettings.of(model="m", tasks=("synthetic",), sizes=(40,), trials=((0, 1),))
    (group,) = group_specs(EXPERIMENTS["probing"].build(settings, 4, 4))
    (callback,) = tracker_callbacks(configure("probing", storage=str(tmp_path), name="probe", logger=["mlflow"]))
    callback.setup()
    trial = Trial("probing_trainable", config={"trial": group}, stub=True)
    callback.log_trial_start(trial)
    callback.log_trial_end(trial)

    client = MlflowClient(tracking_uri=(tmp_path / "probe" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("probe").experiment_id])
    params = run.data.params
    assert params["task"] == "synthetic" and params["train_size"] == "40" and params["tune_trial"] == group["trial_id"]
    assert "layer" not in params, "the probes differ in their layer: not a setting they share"


def test_mlflow_of_a_search_sets_up_in_a_worker_the_driver_did_not_prepare(tmp_path, monkeypatch):
    """A search's Tuners run in Ray tasks (sweep.search.run_searches): their callbacks are unpickled and set up in
    a Ray worker, whose environment is the one Ray started with, not the driver's of later."""
    pytest.importorskip("mlflow")
    from ray import cloudpickle

    from sweep.trackers import tracker_callbacks

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    worker_env = dict(os.environ)  # as Ray started, before the sweep set its trackers up
    (callback,) = tracker_callbacks(configure("lr-multipliers", storage=str(tmp_path), name="ml", logger=["mlflow"]))
    pickled = tmp_path / "callback.pkl"
    pickled.write_bytes(cloudpickle.dumps(callback))
    code = ("import pickle, sys\ncallback = pickle.loads(open(sys.argv[1], 'rb').read())\ncallback.setup()\n"
            "print(callback.mlflow_util._mlflow.get_experiment_by_name('ml').name)")
    done = subprocess.run([sys.executable, "-c", code, str(pickled)], env=worker_env, capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "ml"


def test_mlflow_without_a_tracking_uri_on_object_storage_is_refused_with_the_way_round(monkeypatch):
    pytest.importorskip("mlflow")
    from sweep.trackers import tracker_callbacks

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    remote = configure("incremental", storage="s3://my-bucket/reinit-sweep", name="sw", logger=["mlflow"])
    with pytest.raises(Refused, match="--logger: mlflow .*s3://my-bucket/reinit-sweep.*MLFLOW_TRACKING_URI"):
        tracker_callbacks(remote)
    # Checked with the other settings too, before Ray starts or any data is read.
    from sweep.cli import logger_problems

    (problem,) = logger_problems(["mlflow"], "s3://my-bucket/reinit-sweep")
    assert problem.startswith("--logger: mlflow keeps its file store in a folder")
    assert logger_problems(["mlflow"], "/tmp/results") == []
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert logger_problems(["mlflow"], "s3://my-bucket/reinit-sweep") == []
    (callback,) = tracker_callbacks(remote)
    assert callback.tracking_uri == "http://mlflow.example:5000"


def test_a_plan_written_by_hand_without_a_time_zone_sorts_with_the_others(tmp_path):
    settings = GridSettings.of(model="m", tasks=("synthetic",), sizes=(16,), trials=((0, 1),), k=(0,))
    rows = [spec.row() for spec in EXPERIMENTS["incremental"].build(settings, 4)]
    folder = tmp_path / "sw"
    sweep.status.record_plan(str(folder), ["incremental"], "incremental", rows, ("ok",))
    hand = {"command": "python -m sweep incremental --by-hand", "experiment": "incremental", "trials": rows,
            "written_at": "2099-01-01T00:00:00", "rerun_skips": ["ok"]}
    (folder / sweep.status.PLANS / "by-hand.json").write_text(json.dumps(hand))
    plans = sweep.status.read_plans(str(folder))
    assert [p["command"] for p in plans][-1] == hand["command"]  # read as UTC: the newest


def test_a_tracker_logs_no_run_for_a_rerun_searchs_replayed_trials(tmp_path, monkeypatch):
    # Each landed trial of a rerun search replays its stored figures to the searcher: MLflow (and W&B) had logged
    # each as one more run, so every rerun doubled the landed trials in the tracker
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from ray.tune.experiment import Trial

    from sweep.trackers import tracker_callbacks

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    specs = EXPERIMENTS["lr-multipliers"].build(GridSettings.of(model="m", tasks=("synthetic",), sizes=(40,)), 4, 4)
    (callback,) = tracker_callbacks(configure("lr-multipliers", storage=str(tmp_path), name="ml", logger=["mlflow"]))
    callback.setup()
    replayed, trained, failed = (Trial("t", config={"trial": specs[0].to_config()}, stub=True) for _ in range(3))
    for trial in (replayed, trained, failed):
        callback.log_trial_start(trial)
    for epoch in (1, 2):
        callback.log_trial_result(epoch, replayed, {"epoch": epoch, "training_iteration": epoch, "replayed": True})
        callback.log_trial_result(epoch, trained, {"epoch": epoch, "training_iteration": epoch, "dev_metric": 0.5})
    callback.log_trial_end(replayed)
    callback.log_trial_end(trained)
    callback.log_trial_end(failed, failed=True)

    client = MlflowClient(tracking_uri=(tmp_path / "ml" / "mlruns").as_uri())
    runs = client.search_runs([client.get_experiment_by_name("ml").experiment_id])
    assert sorted(run.info.status for run in runs) == ["FAILED", "FINISHED"]
    (done,) = [run for run in runs if run.info.status == "FINISHED"]
    assert [m.step for m in client.get_metric_history(done.info.run_id, "dev_metric")] == [1, 2]
