"""Running a list of trials on Ray Tune and landing each finished one as a Parquet row."""
from __future__ import annotations

import contextlib
import datetime
import os
import sys
from pathlib import Path

from ray.tune import Callback

from sweep.checks import unshared_storage_problems
from sweep.config import Refused, RunSettings
from sweep.grid import TrialSpec
from sweep.packs import group_into_packs, pack_memory_problems, pack_resources, resolve_pack, resumed_packs
from sweep.store import write_row
from trainables.rows import ended_rows, make_row

CHECKPOINTS_KEPT = 2  # the newest may be cut short by a lost machine; the one before it stands
FINISHED_NOTE = "FINISHED"  # what is left of a finished trial's checkpoint


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


def refuse_unplaceable(trainable) -> None:
    """Refuse a trainable whose fixed resources (probing's, a search's: checked once a sweep, where they are
    made) no node of the cluster can hold: Tune would keep its trials pending forever, only warning that the
    cluster may be autoscaling. Resources made per config (a sweep's packs) are checked by pack_resources."""
    import ray
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    from sweep.checks import node_shapes, placement_problems

    resources = getattr(trainable, "_resources", None)  # where tune.with_resources keeps them
    if not isinstance(resources, PlacementGroupFactory) or not ray.is_initialized():
        return
    asked = resources.required_resources
    problems = placement_problems(asked.get("CPU", 0.0), asked.get("GPU", 0.0), node_shapes(ray.nodes()))
    if problems:
        raise Refused(problems)


def experiment_name() -> str:
    # Microseconds: a resumed run and the new cells after it may start within the same second.
    return datetime.datetime.now().strftime("tune-%Y%m%d-%H%M%S-%f")


def planned_members(trial: dict) -> list[dict]:
    """The trials (each with its `trial_id` and planned `row`) a Tune trial's config stands for: a pack's
    members, a probing subset's probes, or itself."""
    return trial.get("pack") or trial.get("probes") or [trial]


class RowWriter(Callback):
    """A Tune callback, run in the driver, that lands the rows the trials' reports carry (trainables.rows),
    as they arrive, and an `error` row for each trial that failed or ended without one.

    A trial whose final row has landed (before this run: `landed`; or in it) keeps it: a second row for it,
    from a retried or restarted attempt, is dropped here, and the store refuses it too (sweep.store.write_row).
    A row that cannot be written (a full disk, no permission) is named in one line and counted in
    `unwritten`; the trial runs again on a rerun. `progress`, if given, is told how each trial ended."""

    def __init__(self, folder: Path | str, landed=frozenset(), keep_checkpoints: bool = True, progress=None):
        self.folder, self.keep_checkpoints, self.progress = folder, keep_checkpoints, progress
        self.final: set[str] = set(landed)  # trials whose final row stands
        self.written: list[str] = []  # trial_ids of the rows this run wrote, in order
        self.errored: set[str] = set()
        self.unwritten: dict[str, str] = {}  # trial_id -> why its row could not be written

    def land(self, row: dict) -> bool:
        """Write `row` unless its trial's final row stands; returns whether it was written."""
        trial_id = row["trial_id"]
        if trial_id in self.final or (row["status"] == "error" and trial_id in self.errored):
            return False
        try:
            written = write_row(self.folder, row) is not None
        except Exception as err:  # noqa: BLE001 (raised in Tune's callback, it would end the whole sweep)
            self.unwritten[trial_id] = f"{type(err).__name__}: {err}"
            fix = "with space and permission there" if isinstance(err, OSError) else \
                "(a value the row schema cannot hold: a bug of this project's, please report it)"
            print(f"cannot write the row of {trial_id} to {self.folder}: {err}; it runs again when the sweep is "
                  f"rerun {fix}", file=sys.stderr, flush=True)
            self.tell(trial_id, "unwritten", None)
            return False
        if row["status"] == "error":
            self.errored.add(trial_id)
        else:
            self.final.add(trial_id)
        if written:
            self.written.append(trial_id)
        # Told even when another writer's row stood first: the trial has ended either way.
        self.tell(trial_id, row["status"], row.get("dev_metric"), row)
        if written and self.progress is None and (line := self.line(row)):
            print(line, flush=True)
        return written

    def line(self, row: dict) -> str | None:
        """This writer's own line for a row it landed (a probe's, a search's sample): the progress view's line of
        its trial's end, or printed where there is no view. None: the view's plain line, and nothing printed."""
        return None

    def tell(self, trial_id: str, status: str, metric, row: dict | None = None) -> None:
        if self.progress is not None:
            self.progress.end(trial_id, status, metric, self.line(row) if row is not None else None)

    def unended(self, trial) -> list[dict]:
        return [m for m in planned_members(trial.config["trial"])
                if m["trial_id"] not in self.final and m["trial_id"] not in self.unwritten]

    def on_trial_result(self, iteration, trials, trial, result, **info):
        for row in ended_rows(result):
            self.land(row)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.on_trial_result(iteration, trials, trial, trial.last_result or {})
        for member in self.unended(trial):
            self.land(self.end_row(member, trial.last_result or {}))
        if not self.keep_checkpoints and not self.unended(trial):
            drop_checkpoints(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        for member in self.unended(trial):
            self.land(make_row(member["row"], where_known(trial.last_result), "error", trial_error(trial)))

    def end_row(self, member: dict, last: dict) -> dict:
        """The row of a trial that ended with no row of its own (a runner's trials always send one)."""
        return make_row(member["row"], where_known(last), "error", "the trial ended without a final report")


def where_known(last: dict | None) -> dict:
    """`host` and `node_id` of a trial's last report (where it ran), if it made one."""
    return {k: (last or {}).get(k) for k in ("host", "node_id")}


def trial_error(trial) -> str:
    """The tail of a failed trial's traceback, for its row's `error` column."""
    if trial.error_file:
        try:
            return Path(trial.error_file).read_text()[-4000:]
        except OSError:
            return f"trial failed; see {trial.error_file}"
    return "trial failed"


def drop_checkpoints(trial) -> None:
    """Delete what a finished trial's checkpoints hold, in this run's folder of the trial and in those earlier
    runs of the sweep left (a resumed trial went on from them), leaving in each checkpoint folder a small note
    that says why it is empty."""
    import pyarrow.fs

    fs, experiment = trial.storage.storage_filesystem, os.path.dirname(trial.path.rstrip("/"))
    runs = fs.get_file_info(pyarrow.fs.FileSelector(os.path.dirname(experiment), allow_not_found=True))
    for run in runs:
        if run.type != pyarrow.fs.FileType.Directory or not run.base_name.startswith("tune-"):
            continue
        folder = f"{run.path}/{os.path.basename(trial.path.rstrip('/'))}"
        for info in fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True)):
            if info.type == pyarrow.fs.FileType.Directory and info.base_name.startswith("checkpoint_"):
                fs.delete_dir_contents(info.path)
                with fs.open_output_stream(f"{info.path}/{FINISHED_NOTE}") as note:
                    note.write(b"the trial finished; its row is in the sweep's rows folder\n")


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
    callbacks=(),
    known=(),
):
    """Run every spec as a Tune trial; returns (the Tune ResultGrid, the trial_ids of the rows written). Rows
    land in `folder` as trials end. `options` holds how to run (sweep.config.RunSettings, or the Sweep; None:
    their declared defaults): checkpoint_every, keep_checkpoints, max_failures, resume, pack. `callbacks` are
    more Tune callbacks (trackers, the Python API's). `known`: the trials whose rows stand, and `specs` (a resume
    forms an earlier run's pack again whole, its done members too: sweep.packs.resumed_packs).

    Every run is a new Tune experiment. With `resume`, each trial goes on from the newest checkpoint an earlier
    run left for its trial_id under `tune_dir` (trainables.tune_trainable.earlier_checkpoints): a resume is
    rebuilt from the store's rows (which trials are done) and checkpoints, and never unpickles Tune's
    experiment state, which anyone who can write to the store could have replaced."""
    from ray import tune

    import ray

    from sweep.progress import ProgressView, trial_work
    from trainables.tune_trainable import earlier_pack_members

    if options is None:
        options = RunSettings()
    checkpoint_every, keep_checkpoints = options.checkpoint_every, options.keep_checkpoints
    max_failures, resume = options.max_failures, options.resume
    problems = unshared_storage_problems(tune_dir)
    if problems:
        raise Refused(problems)
    parameters = max(map(parameter_count, pretrained.values()))
    resources = pack_resources(cpus_per_trial, gpus_per_trial, ray.nodes(), parameters)
    trainable = make_trainable(data, pretrained, resources, checkpoint_every, str(tune_dir) if resume else None)
    if resume:
        print(f"--resume: each unfinished trial goes on from the newest checkpoint an earlier run left for it under "
              f"{tune_dir}", flush=True)
    size, fuse_alone = resolve_pack(options.pack, gpus_per_trial, parameters)
    configs, units, standing = [spec.to_config() for spec in specs], [], set()
    if resume and size > 1 and known:
        # --pack auto sizes packs by the cards' free memory, which moves a little from run to run; a pack sizes its
        # groups on its own card, and a saved group too large for it splits: an earlier pack is formed again
        # whatever its size. --pack N is the user's bound.
        units, configs, standing = resumed_packs(configs, {s.trial_id: s.to_config() for s in known},
                                                 earlier_pack_members(str(tune_dir)),
                                                 None if options.pack == "auto" else size)
        if units:
            print(f"--resume: {len(units)} fused pack(s) go on from their checkpoints as they were"
                  + (f", with {len(standing)} member(s) whose rows stand (not written again)" if standing else ""),
                  flush=True)
    units += group_into_packs(configs, size, pretrained, fuse_alone)
    if not gpus_per_trial:  # on a GPU, a pack sizes its groups by the card's memory
        problems = pack_memory_problems(units, cpus_per_trial, ray.nodes(), parameters)
        if problems:
            raise Refused(problems)
    if size > 1 or fuse_alone:
        fused = sum("pack" in unit for unit in units)
        print(f"--pack {options.pack}: up to {size} trial{'s' * (size > 1)} a fused pack; {len(specs)} "
              f"trial{'s' * (len(specs) != 1)} in {len(units)} Tune trial{'s' * (len(units) != 1)}, {fused} of them "
              "fused packs", flush=True)
    progress = ProgressView({s.trial_id: trial_work(s) for s in specs})
    writer = RowWriter(folder, landed=standing, keep_checkpoints=keep_checkpoints, progress=progress)
    tuner = make_tuner(
        trainable, param_space={"trial": tune.grid_search(units)}, name=experiment_name(), storage_path=tune_dir,
        callbacks=[writer, progress, *callbacks],
        checkpoint_config=tune.CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
        # A failed or preempted trial goes on from its last checkpoint, up to this many times.
        max_failures=max_failures, verbose=verbose,
    )
    results = fit(tuner, tune_dir)
    say_unwritten(writer, folder)
    return results, writer.written


def fit(tuner, tune_dir):
    """tuner.fit(); a failure to write Tune's own files (its logs and state under `tune_dir`: a full disk, no
    permission) ends the run with one line naming the folder instead of a traceback. Rows landed so far stand,
    and a rerun runs what is left."""
    try:
        with callback_counting_without_trackers():
            return tuner.fit()
    except OSError as err:
        raise Refused([f"--storage: the sweep stopped: Ray Tune could not write under {tune_dir} ({err}); the rows "
                       "landed so far stand, and running the same command again, with space there, runs what is "
                       "left"]) from err


TRACKERS = ("ray.air.integrations.", "ray.tune.logger.aim")  # where Ray's tracker callbacks are defined


@contextlib.contextmanager
def callback_counting_without_trackers():
    """Ray Tune counts a run's callbacks by class for its usage statistics (ray.air._internal.usage), and imports
    every tracker integration it knows to compare against, MLflow's and W&B's clients among them when installed:
    0.9 s of the driver before the first trial can start. A run whose callbacks are only the sweep's own (no
    --logger) has no tracker to count, so the count is skipped for it; with a tracker, Ray counts as before."""
    from ray.air._internal import usage

    count = getattr(usage, "tag_callbacks", None)
    if count is None:  # another Ray: nothing to skip
        yield
        return

    def tag_callbacks(callbacks):
        trackers = [c for c in callbacks or () for cls in type(c).__mro__ if cls.__module__.startswith(TRACKERS)]
        return count(callbacks) if trackers else False

    usage.tag_callbacks = tag_callbacks
    try:
        yield
    finally:
        usage.tag_callbacks = count


def say_unwritten(writer: RowWriter, folder) -> None:
    if writer.unwritten:
        reason = next(iter(writer.unwritten.values()))
        print(f"{len(writer.unwritten)} trials ended but their rows could not be written to {folder} ({reason}); "
              "make room there and run the same command again: they run again then", file=sys.stderr, flush=True)


def make_trainable(data, pretrained, resources, checkpoint_every, resume_from):
    from ray import tune

    from trainables.tune_trainable import finetune_trainable

    return tune.with_resources(
        tune.with_parameters(finetune_trainable, data=data, pretrained=pretrained,
                             checkpoint_every=checkpoint_every, resume_from=resume_from),
        resources,
    )


def parameter_count(pretrained) -> int:
    """Parameters of a pretrained encoder (its head is small beside it), for sizing --pack auto on GPUs."""
    return sum(tensor.numel() for tensor in pretrained.state_dict.values())
