"""The Python API and the trackers: `from sweep import run` runs a real sweep and returns its rows and Tune's
ResultGrid; --logger wandb and mlflow go through Ray's own callbacks (W&B offline, MLflow's file store), and
a user's Tune callback through the API."""
from __future__ import annotations

import pytest
from ray import tune


class Seen(tune.Callback):
    """A user's callback: what Tune reported to it."""

    def __init__(self):
        self.results = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.results.append(result)


def test_the_python_api_runs_a_sweep_with_both_trackers_and_a_callback(ray_local, tiny_bert, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    import sweep

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    seen = Seen()
    rows, results, value = sweep.run("incremental", model=tiny_bert, tasks=["synthetic"], sizes=[16], trials=1, k=[4],
                                     epochs=2, eval_every=1, storage=str(tmp_path), name="tracked",
                                     logger=["wandb", "mlflow"], callbacks=[seen])
    assert list(rows["status"]) == ["ok"] and list(rows["k"]) == [4] and value.grid.epochs == 2
    assert len(results) == 1 and results[0].metrics["dev_metric"] == rows["dev_metric"].iloc[0]  # Tune's ResultGrid
    assert [r["epoch"] for r in seen.results] == [1, 2]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "tracked" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
    assert run.data.params["k"] == "4" and run.data.params["trial_id"] == rows["trial_id"].iloc[0]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "dev_metric")][-1] == pytest.approx(
        rows["dev_metric"].iloc[0])
    offline = list((tmp_path / "tracked" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))


def test_a_tracker_without_its_client_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import importlib.util

    from sweep.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert main(["incremental", "--logger", "wandb", "--storage", str(tmp_path / "s"), "--dry-run"]) == 2
    assert "--logger: wandb needs the wandb package" in capsys.readouterr().err


def test_a_run_without_a_tracker_never_loads_a_trackers_client():
    """Ray Tune's usage count of a run's callbacks imports every tracker integration (MLflow's client among
    them); the sweep skips that count when its callbacks are its own, and leaves it to Ray when a tracker is in."""
    import subprocess
    import sys

    pytest.importorskip("mlflow")
    code = ("import sys; from ray.air._internal import usage; from sweep.runner import RowWriter, "
            "callback_counting_without_trackers as scoped\n"
            "calls = []; usage.tag_callbacks = lambda cbs: calls.append(len(cbs))\n"
            "with scoped(): usage.tag_callbacks([RowWriter('/nonexistent')])\n"
            "print('mlflow' in sys.modules, calls)\n"
            "from ray.air.integrations.mlflow import MLflowLoggerCallback\n"
            "with scoped(): usage.tag_callbacks([MLflowLoggerCallback()])\n"
            "print(calls, usage.tag_callbacks.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "False []"  # skipped, and nothing imported MLflow
    assert out[1] == "[1] <lambda>"  # counted by Ray's own function with a tracker, which is put back afterwards
