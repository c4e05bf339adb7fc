"""Running a list of trials on Ray Tune and landing each finished one as a Parquet row."""
from __future__ import annotations

import collections
import platform
import time
from pathlib import Path

from sweep.grid import TrialSpec
from sweep.store import write_row


def library_versions() -> dict:
    import ray
    import torch
    import transformers

    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "ray_version": ray.__version__,
        "python_version": platform.python_version(),
    }


def make_row_writer(folder: Path):
    """A Tune callback, run in the driver, that writes a trial's row the moment the trial ends."""
    from ray.tune import Callback

    versions = library_versions()

    class ParquetRowWriter(Callback):
        def __init__(self):
            self.written: list[str] = []

        def _write(self, trial, status: str | None, error: str | None) -> None:
            result = result_fields(trial.last_result or {})
            row = {**trial.config["trial"]["row"], **result, **versions, "host": platform.node()}
            if status is not None:
                row["status"] = status
            row.setdefault("status", "error")
            row["error"] = error
            row["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            write_row(folder, row)
            self.written.append(row["trial_id"])

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._write(trial, status=None, error=None)

        def on_trial_error(self, iteration, trials, trial, **info):
            message = None
            if trial.error_file:
                try:
                    message = Path(trial.error_file).read_text()[-4000:]
                except OSError:
                    message = f"trial failed; see {trial.error_file}"
            self._write(trial, status="error", error=message or "trial failed")

    return ParquetRowWriter()


# What a trial's last report contributes to its row besides its dev_* metrics (Tune adds its own
# bookkeeping, which we leave out).
RESULT_COLUMNS = {
    "status", "metric_name", "dev_metric", "dev_metrics_by_epoch", "train_loss", "lr_last",
    "train_seconds", "eval_seconds", "wall_seconds", "model_flops", "mfu", "peak_flops", "peak_flops_source",
    "device", "torch_threads", "weight_distance",
}  # fmt: skip


def result_fields(last_result: dict) -> dict:
    return {k: v for k, v in last_result.items() if k in RESULT_COLUMNS or k.startswith("dev_")}


def make_progress_printer(total: int):
    """A Tune callback printing one line per ended trial: counts by state and an ETA from the pace so far."""
    from ray.tune import Callback

    class ProgressPrinter(Callback):
        def __init__(self):
            self.started = time.monotonic()
            self.ended = collections.Counter()

        def _line(self, trials, trial, status: str) -> None:
            self.ended[status] += 1
            done = sum(self.ended.values())
            running = sum(t.status == "RUNNING" for t in trials) - 1  # the trial ending is still RUNNING
            elapsed = time.monotonic() - self.started
            eta = elapsed / done * (total - done)
            metric = (trial.last_result or {}).get("dev_metric")
            shown = f"dev_metric={metric:.4f}" if isinstance(metric, float) else ""
            print(
                f"[{done}/{total}] ok {self.ended['ok']} · diverged {self.ended['diverged']} · "
                f"failed {self.ended['error']} · running {max(running, 0)} · pending {total - done - max(running, 0)}"
                f" · elapsed {elapsed / 60:.1f} min · eta {eta / 60:.1f} min | {trial.config['trial']['trial_id']} "
                f"{status} {shown}",
                flush=True,
            )

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._line(trials, trial, (trial.last_result or {}).get("status", "ok"))

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trials, trial, "error")

    return ProgressPrinter()


def run_trials(
    specs: list[TrialSpec],
    *,
    data: dict,
    pretrained: dict,
    folder: Path,
    tune_dir: Path,
    cpus_per_trial: float,
    gpus_per_trial: float,
    options=None,
    verbose: int = 0,
):
    """Run every spec as a Tune trial; returns the Tune ResultGrid. Rows land in `folder` as trials end.
    `options` is the parsed command line (None when called from Python), for settings of how to run."""
    from ray import tune

    from trainables.tune_trainable import finetune_trainable

    trainable = tune.with_resources(
        tune.with_parameters(finetune_trainable, data=data, pretrained=pretrained),
        {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
    )
    writer = make_row_writer(folder)
    tuner = tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search([spec.to_config() for spec in specs])},
        tune_config=tune.TuneConfig(
            reuse_actors=True,
            trial_name_creator=lambda t: t.config["trial"]["trial_id"],
            trial_dirname_creator=lambda t: t.config["trial"]["trial_id"],
        ),
        run_config=tune.RunConfig(
            name=time.strftime("tune-%Y%m%d-%H%M%S"),
            storage_path=str(tune_dir),
            callbacks=[writer, make_progress_printer(len(specs))],
            failure_config=tune.FailureConfig(max_failures=0),
            verbose=verbose,
        ),
    )
    return tuner.fit(), writer.written
