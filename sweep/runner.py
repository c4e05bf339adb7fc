"""Running a list of trials on Ray Tune and landing each finished one as a Parquet row."""
from __future__ import annotations

import datetime
import platform
import time
from pathlib import Path

from sweep.grid import TrialSpec
from sweep.packs import group_into_packs, members, pack_resources, pack_results, resolve_pack
from sweep.store import filesystem, write_row

# Seconds between two epoch-end checkpoints of a trial. A BERT-base checkpoint (weights and Adam moments,
# 1.3 GB) took 3.65 s to a local disk here, more to a bucket: after every epoch that is 16% of a 500-example
# trial, while at most one per 15 minutes stays under 1% of any trial, and a lost machine costs at most ~15
# minutes of each of its trials. The paper's 500- and 5k-example trials finish before their first checkpoint
# is due: they simply start over. docs/benchmarks.md, "Checkpoints".
CHECKPOINT_EVERY = 900.0
CHECKPOINTS_KEPT = 2  # Tune's experiment snapshot may lag one checkpoint behind; it must still find it
FINISHED_NOTE = "FINISHED"  # what is left of a finished trial's checkpoint


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


def land_row(folder: Path | str, planned: dict, result: dict, status: str | None, error: str | None,
             **columns) -> dict:
    """Make a trial's row and write it to `folder`: the one way every runner lands a row. The planned row
    (TrialSpec.row()), what its last report measured (`result_fields`), the runner's own `columns`, the
    library versions and host; `status` None keeps the reported one (a trial that reported none failed)."""
    row = {**planned, **result_fields(result), **columns, **library_versions(), "host": platform.node()}
    row["status"] = status or row.get("status") or "error"
    row["error"] = error
    row["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_row(folder, row)
    return row


def make_tuner(trainable, *, name: str, storage_path, callbacks: list, max_failures: int, param_space=None,
               verbose: int = 0, checkpoint_config=None, **tune_options):
    """The one Tuner set-up of every runner: trials named and foldered by their trial_id, actors reused,
    rows landed by `callbacks`; `tune_options` add to the TuneConfig (a search's algorithm and scheduler)."""
    from ray import tune

    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            reuse_actors=True,
            trial_name_creator=lambda t: t.config["trial"]["trial_id"],
            trial_dirname_creator=lambda t: t.config["trial"]["trial_id"],
            **tune_options,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage_path),
            callbacks=callbacks,
            checkpoint_config=checkpoint_config,
            failure_config=tune.FailureConfig(max_failures=max_failures),
            verbose=verbose,
        ),
    )


def experiment_name() -> str:
    # Microseconds: a resumed run and the new cells after it may start within the same second.
    return datetime.datetime.now().strftime("tune-%Y%m%d-%H%M%S-%f")


def make_row_writer(folder: Path | str, keep_checkpoints: bool = True):
    """A Tune callback, run in the driver, that writes a trial's row the moment the trial ends (a pack's: one
    row per member), then (unless `keep_checkpoints`) deletes the checkpoints of a finished trial."""
    from ray.tune import Callback

    class ParquetRowWriter(Callback):
        def __init__(self):
            self.written: list[str] = []

        def _write(self, trial, status: str | None, error: str | None) -> None:
            ended = []
            for member, last_result in member_results(trial):
                row = land_row(folder, member["row"], last_result, status, error, **pack_columns(trial.config["trial"]))
                self.written.append(row["trial_id"])
                ended.append(row["status"])
            if "error" not in ended and not keep_checkpoints:
                drop_checkpoints(trial)

        def on_trial_complete(self, iteration, trials, trial, **info):
            if "status" not in (trial.last_result or {}):
                return  # it reported nothing: a resumed experiment's trial this run must not train
            self._write(trial, status=None, error=None)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._write(trial, status="error", error=trial_error(trial))

    return ParquetRowWriter()


def member_results(trial) -> list[tuple[dict, dict]]:
    """(trial config, its last result) for each trial a Tune trial ran: itself, or a pack's members (those it
    reported on; all of them when it failed before its first report)."""
    last = trial.last_result or {}
    if "pack" not in trial.config["trial"]:
        return [(trial.config["trial"], last)]
    by_id = pack_results(last)
    return [(m, by_id.get(m["trial_id"], {})) for m in members(trial.config["trial"])
            if not by_id or m["trial_id"] in by_id]


def pack_columns(trial: dict) -> dict:
    """pack_size and pack_id of the rows a Tune trial writes (1 and none for a trial trained alone)."""
    if "pack" not in trial:
        return {"pack_size": 1, "pack_id": None}
    return {"pack_size": len(trial["pack"]), "pack_id": trial["trial_id"]}


def trial_error(trial) -> str:
    """The tail of a failed trial's traceback, for its row's `error` column."""
    if trial.error_file:
        try:
            return Path(trial.error_file).read_text()[-4000:]
        except OSError:
            return f"trial failed; see {trial.error_file}"
    return "trial failed"


def drop_checkpoints(trial) -> None:
    """Delete what a finished trial's checkpoints hold, leaving in each folder a small note. A resumed Tune
    experiment whose last snapshot still had the trial running restores it from that folder, so the folder
    must exist; the trial then ends at once (finetune_trainable's run_only) without reading it."""
    import pyarrow.fs

    fs, path = trial.storage.storage_filesystem, trial.path
    for info in fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True)):
        if info.type == pyarrow.fs.FileType.Directory and info.base_name.startswith("checkpoint_"):
            fs.delete_dir_contents(info.path)
            with fs.open_output_stream(f"{info.path}/{FINISHED_NOTE}") as note:
                note.write(b"the trial finished; its row is in the sweep's rows folder\n")


# What a trial's last report contributes to its row besides its dev_* metrics (Tune adds its own
# bookkeeping, which we leave out).
RESULT_COLUMNS = {
    "status", "metric_name", "dev_metric", "dev_metrics_by_epoch", "train_loss", "lr_last", "resumed_from_epoch",
    "train_seconds", "eval_seconds", "wall_seconds", "model_flops", "mfu", "peak_flops", "peak_flops_source",
    "device", "torch_threads", "weight_distance", "dev_epochs", "epochs_run", "clipped_steps",
    "intermediate_weight_distance", "pack_size", "pack_id", "model_type", "label_names", "task_file",
}  # fmt: skip


def result_fields(last_result: dict) -> dict:
    return {k: v for k, v in last_result.items() if k in RESULT_COLUMNS or k.startswith("dev_")}


def run_trials(
    specs: list[TrialSpec],
    *,
    data: dict,
    pretrained: dict,
    folder: Path | str,
    tune_dir: Path | str,
    cpus_per_trial: float,
    gpus_per_trial: float,
    options=None,
    verbose: int = 0,
):
    """Run every spec as a Tune trial; returns the Tune ResultGrid. Rows land in `folder` as trials end.
    `options` is the parsed command line (None when called from Python), for settings of how to run:
    checkpoint_every, keep_checkpoints, max_failures, resume (see sweep.cli's "running" options).

    With `resume`, the newest Tune experiment under `tune_dir` is restored first (Tuner.restore): its
    unfinished and failed trials continue from their last checkpoints, in their own trial folders; then any
    spec it did not hold (a widened grid) runs in a new experiment."""
    from ray import tune

    import ray

    from sweep.progress import ProgressView

    checkpoint_every = getattr(options, "checkpoint_every", CHECKPOINT_EVERY)
    keep_checkpoints = getattr(options, "keep_checkpoints", False)
    max_failures = getattr(options, "max_failures", 2)
    resources = pack_resources(cpus_per_trial, gpus_per_trial, ray.nodes(),
                               max(map(parameter_count, pretrained.values())))
    trainable = make_trainable(data, pretrained, resources, checkpoint_every,
                               run_only=frozenset(s.trial_id for s in specs))
    if getattr(options, "resume", False):
        specs = resume_experiment(tune_dir, trainable, specs)
        if not specs:
            return None, []
    writer = make_row_writer(folder, keep_checkpoints)
    checkpointed = checkpoint_every is not None and checkpoint_every < CHECKPOINT_EVERY
    size, fuse_alone = resolve_pack(getattr(options, "pack", 1), gpus_per_trial,
                                    max(map(parameter_count, pretrained.values())), checkpointed)
    units = group_into_packs([spec.to_config() for spec in specs], size, pretrained, fuse_alone)
    if size > 1 or fuse_alone:
        fused = sum("pack" in unit for unit in units)
        print(f"--pack {getattr(options, 'pack', 1)}: up to {size} trial{'s' * (size > 1)} a fused pack; {len(specs)} "
              f"trials in {len(units)} Tune trials, {fused} of them fused packs (packs keep no checkpoint; "
              f"--checkpoint-every below {CHECKPOINT_EVERY:g} or --pack 1 trains trials alone, checkpointed)", flush=True)
    tuner = make_tuner(
        trainable, param_space={"trial": tune.grid_search(units)}, name=experiment_name(), storage_path=tune_dir,
        callbacks=[writer, ProgressView({s.trial_id: s.train_size * s.epochs for s in specs})],
        checkpoint_config=tune.CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
        # A failed or preempted trial goes on from its last checkpoint, up to this many times.
        max_failures=max_failures, verbose=verbose,
    )
    return tuner.fit(), writer.written


def make_trainable(data, pretrained, resources, checkpoint_every, run_only):
    from ray import tune

    from trainables.tune_trainable import finetune_trainable

    return tune.with_resources(
        tune.with_parameters(finetune_trainable, data=data, pretrained=pretrained,
                             checkpoint_every=checkpoint_every, run_only=run_only),
        resources,
    )


def parameter_count(pretrained) -> int:
    """Parameters of a pretrained encoder (its head is small beside it), for sizing --pack auto on GPUs."""
    return sum(tensor.numel() for tensor in pretrained.state_dict.values())


def latest_experiment(tune_dir: Path | str) -> str | None:
    """The newest Tune experiment under a sweep's folder that can be restored, as a path or URI."""
    import pyarrow.fs
    from ray import tune

    from sweep.store import join

    fs, path = filesystem(tune_dir)
    found = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    names = sorted((f.base_name for f in found if f.type == pyarrow.fs.FileType.Directory
                    and f.base_name.startswith("tune-")), reverse=True)
    for name in names:
        experiment = str(join(tune_dir, name))
        if tune.Tuner.can_restore(experiment):
            return experiment
    return None


def resume_experiment(tune_dir: Path | str, trainable, specs: list[TrialSpec]) -> list[TrialSpec]:
    """Restore and finish the newest Tune experiment of the sweep; returns the specs it did not hold."""
    from ray import tune

    experiment = latest_experiment(tune_dir)
    if experiment is None:
        print(f"--resume: no Tune experiment to continue under {tune_dir}; running the trials afresh", flush=True)
        return specs
    print(f"--resume: continuing {experiment}: its unfinished trials go on from their last checkpoints",
          flush=True)
    restored = tune.Tuner.restore(experiment, trainable=trainable, resume_unfinished=True, resume_errored=True)
    held = {m["trial_id"] for result in restored.fit() for m in members(result.config["trial"])}
    rest = [spec for spec in specs if spec.trial_id not in held]
    if rest:
        print(f"--resume: {len(rest)} trials were not in that experiment; running them now", flush=True)
    return rest
