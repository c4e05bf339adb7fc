"""--logger wandb|mlflow: Ray Tune's own logger callbacks, set up for a sweep. Imported only when a tracker is
asked for (each needs its client: pip install 'reinit-sweep[trackers]')."""
from __future__ import annotations

import os
from pathlib import Path

from ray.air.integrations.mlflow import MLflowLoggerCallback

from sweep.store import join, location, sweep_dir


def tracker_callbacks(sweep) -> list:
    """W&B: a project named as the sweep, its runs in <storage>/<name>/wandb (WANDB_MODE=offline needs no
    account; WANDB_API_KEY as W&B reads it). MLflow: an experiment named as the sweep, at MLFLOW_TRACKING_URI,
    else in a file store beside the rows (<storage>/<name>/mlruns)."""
    callbacks = []
    for name in sweep.run.logger or ():
        if name == "wandb":
            from ray.air.integrations.wandb import WandbLoggerCallback

            folder = sweep_dir(sweep.run.storage, sweep.name)
            options = {"dir": str(folder)} if isinstance(location(sweep.run.storage), Path) else {}
            if options:
                Path(folder).mkdir(parents=True, exist_ok=True)
            if os.environ.get("WANDB_MODE"):  # the logging actors run in Ray's workers, started with their own env
                options["mode"] = os.environ["WANDB_MODE"]
            callbacks.append(WandbLoggerCallback(project=sweep.name, log_config=True, **options))
        elif name == "mlflow":
            uri = os.environ.get("MLFLOW_TRACKING_URI")
            if uri is None:  # a file store beside the rows; MLflow 3 asks for consent to keep writing one
                uri = mlflow_store(sweep)
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            callbacks.append(SweepMLflowLoggerCallback(tracking_uri=uri, experiment_name=sweep.name))
    return callbacks


def mlflow_store(sweep) -> str:
    where = join(location(sweep.run.storage), sweep.name, "mlruns")
    return Path(where).as_uri() if isinstance(where, Path) else str(where)


class SweepMLflowLoggerCallback(MLflowLoggerCallback):
    """Each Tune trial's params are its row's settings (a pack's: those its members share, and pack_size), not
    the whole Tune config, whose pack members would overflow MLflow's limit on a param's length."""

    def log_trial_start(self, trial):
        config = trial.config
        try:
            trial.config = trial_params(config["trial"])
            super().log_trial_start(trial)
        finally:
            trial.config = config


def trial_params(unit: dict) -> dict:
    rows = [member["row"] for member in unit.get("pack", [unit])]
    shared = {key: value for key, value in rows[0].items()
              if all(row.get(key) == value for row in rows) and value is not None}
    return {**{k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in shared.items()},
            "pack_size": len(rows), "tune_trial": unit["trial_id"]}
