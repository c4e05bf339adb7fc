"""--logger wandb|mlflow: Ray Tune's own logger callbacks, set up for a sweep. Imported only when a tracker is
asked for (each needs its client: pip install 'reinit-sweep[trackers]')."""
from __future__ import annotations

import os
from pathlib import Path

from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.air.integrations.wandb import WandbLoggerCallback

from sweep.checks import Refused
from sweep.runner import planned_members
from sweep.store import join, location, sweep_dir


def tracker_callbacks(sweep) -> list:
    """W&B: a project named as the sweep, its runs in <storage>/<name>/wandb (WANDB_MODE=offline needs no
    account; WANDB_API_KEY as W&B reads it). MLflow: an experiment named as the sweep, at MLFLOW_TRACKING_URI,
    else in a file store beside the rows (<storage>/<name>/mlruns; refused for a bucket, which has no folder)."""
    callbacks = []
    for name in sweep.run.logger or ():
        if name == "wandb":
            folder = sweep_dir(sweep.run.storage, sweep.name)
            options = {"dir": str(folder)} if isinstance(location(sweep.run.storage), Path) else {}
            if options:
                Path(folder).mkdir(parents=True, exist_ok=True)
            if os.environ.get("WANDB_MODE"):  # the logging actors run in Ray's workers, started with their own env
                options["mode"] = os.environ["WANDB_MODE"]
            callbacks.append(SweepWandbLoggerCallback(project=sweep.name, log_config=True, **options))
        elif name == "mlflow":
            uri = os.environ.get("MLFLOW_TRACKING_URI")
            callbacks.append(SweepMLflowLoggerCallback(tracking_uri=uri or mlflow_store(sweep),
                                                       experiment_name=sweep.name, file_store=uri is None))
    return callbacks


def mlflow_store(sweep) -> str:
    """The file store beside the rows; MLflow keeps one in a local (or mounted) folder only."""
    problem = mlflow_store_problem(sweep.run.storage)
    if problem:
        raise Refused([problem])
    return join(location(sweep.run.storage), sweep.name, "mlruns").as_uri()


def mlflow_store_problem(storage) -> str | None:
    """Why MLflow cannot keep its file store beside the rows at `storage` (a bucket has no folder); None if it can
    or MLFLOW_TRACKING_URI names another store."""
    if os.environ.get("MLFLOW_TRACKING_URI") or isinstance(location(storage), Path):
        return None
    return (f"--logger: mlflow keeps its file store in a folder, and --storage {storage} is not one; set "
            "MLFLOW_TRACKING_URI to an MLflow server (or a local folder)")


class TrainedTrialsOnly:
    """A tracker's runs are the trials that train: a rerun search's landed trials replay their stored figures
    (reports marked `replayed`) for its searcher, and each would have been logged as a new run, a second time. So a
    trial's run starts with its first report that is not a replay; one that ends without any report still gets
    its run (a trial that failed at once)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unstarted, self.replays = set(), set()

    def start_run(self, trial) -> None:
        super().log_trial_start(trial)

    def log_trial_start(self, trial):
        self.unstarted.add(trial)

    def log_trial_result(self, iteration, trial, result):
        if result.get("replayed"):
            self.replays.add(trial)
            return
        if trial in self.unstarted:
            self.unstarted.discard(trial)
            self.start_run(trial)
        super().log_trial_result(iteration, trial, result)

    def log_trial_end(self, trial, failed=False):
        if trial in self.unstarted:
            self.unstarted.discard(trial)
            if trial in self.replays:
                return
            self.start_run(trial)
        super().log_trial_end(trial, failed)


class SweepWandbLoggerCallback(TrainedTrialsOnly, WandbLoggerCallback):
    pass


class SweepMLflowLoggerCallback(TrainedTrialsOnly, MLflowLoggerCallback):
    """Each Tune trial's params are its row's settings (a pack's: those its members share, and pack_size), not
    the whole Tune config, whose pack members would overflow MLflow's limit on a param's length."""

    def __init__(self, *args, file_store: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.file_store = file_store

    def setup(self, *args, **kwargs):
        # MLflow 3 asks for consent to keep writing a file store; given in the process that sets the callback up,
        # since a search's Tuners run in Ray tasks, whose environment is Ray's, not the driver's.
        if self.file_store:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        super().setup(*args, **kwargs)

    def start_run(self, trial) -> None:
        config = trial.config
        try:
            trial.config = trial_params(config["trial"])
            super().start_run(trial)
        finally:
            trial.config = config


def trial_params(unit: dict) -> dict:
    rows = [member["row"] for member in planned_members(unit)]  # a probing trial's probes too
    shared = {key: value for key, value in rows[0].items()
              if all(row.get(key) == value for row in rows) and value is not None}
    return {**{k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in shared.items()},
            "pack_size": len(unit.get("pack", [unit])), "tune_trial": unit["trial_id"]}
