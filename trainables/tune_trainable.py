"""The Ray Tune function trainable: a thin wrapper that turns a config dict into a `finetune` call.

Everything heavy (tokenized tasks, pretrained weights) arrives through `tune.with_parameters`, i.e. Ray's
object store, once per node rather than once per trial.

Checkpoints: at an epoch end, when at least `checkpoint_every` seconds have passed since the trial started
or last checkpointed, the training state (model, optimizer, schedule, random streams, figures so far) goes to
the sweep's storage with that epoch's report. A trial that Tune restarts (FailureConfig, or a resumed sweep)
finds it with `tune.get_checkpoint()` and continues after that epoch, to the same numbers.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from trainables import state as state_files
from trainables.ablations import ablation_from_dict
from trainables.finetune import FinetuneConfig, finetune

STATE_FILE = state_files.STATE_FILE  # in a checkpoint's folder: it holds a training state (trainables.state)
# Test-only fault injection: a trial on its first attempt dies (as a preempted machine would) right after
# reporting this epoch, so tests can watch Tune bring it back from its checkpoint.
FAIL_AFTER_EPOCH = "REINIT_SWEEP_FAIL_AFTER_EPOCH"


def finetune_config(trial: dict, gpu_fraction: float, threads: int) -> FinetuneConfig:
    """The FinetuneConfig a trial config (as built by the sweep) describes."""
    fields = dict(trial["finetune"])
    return FinetuneConfig(
        **fields, ablation=ablation_from_dict(trial["ablation"]), gpu_fraction=gpu_fraction, threads=threads
    )


class EpochCheckpoints:
    """`save` and `report` for `finetune`: a state offered at an epoch end is written when `every` seconds
    have passed since the last checkpoint (0: every epoch; None: never), and goes to Tune with that report."""

    def __init__(self, every: float | None, report):
        self.every, self.report_to_tune = every, report
        self.last = time.monotonic()
        self.pending: str | None = None

    def save(self, state: dict) -> None:
        if self.every is None or time.monotonic() - self.last < self.every:
            return
        self.pending = tempfile.mkdtemp(prefix="reinit-sweep-checkpoint-")
        state_files.save_state(self.pending, state)

    def report(self, result: dict) -> None:
        from ray import tune

        if self.pending is None:
            self.report_to_tune(result)
            return
        try:  # Tune copies the folder to the sweep's storage before report returns
            self.report_to_tune(result, checkpoint=tune.Checkpoint.from_directory(self.pending))
        finally:
            shutil.rmtree(self.pending, ignore_errors=True)
            self.pending, self.last = None, time.monotonic()


def load_state(checkpoint) -> dict | None:
    """The training state in a Tune checkpoint; None when it holds none (a finished trial's checkpoint keeps
    only a note once the sweep has deleted its weights). Tune's record of a trial can name a checkpoint it
    has since replaced and deleted (num_to_keep) when the driver died between the two: then the newest
    surviving checkpoint of the same trial is the one to go on from, not a fresh start."""
    for candidate in [checkpoint, *reversed(sibling_checkpoints(checkpoint))]:
        with candidate.as_directory() as folder:
            if state_files.has_state(folder):
                return state_files.load_state(folder)
    return None


def sibling_checkpoints(checkpoint) -> list:
    """The other checkpoints in the trial's folder, oldest first (Tune numbers them checkpoint_000000, ...)."""
    import pyarrow.fs
    from ray import tune

    fs, parent = checkpoint.filesystem, os.path.dirname(checkpoint.path.rstrip("/"))
    found = fs.get_file_info(pyarrow.fs.FileSelector(parent, allow_not_found=True))
    return [tune.Checkpoint(f.path, filesystem=fs) for f in sorted(found, key=lambda f: f.base_name)
            if f.type == pyarrow.fs.FileType.Directory and f.base_name.startswith("checkpoint_")
            and f.path.rstrip("/") != checkpoint.path.rstrip("/")]


def dying_after(epoch: int, report):
    """`report`, and once it has reported `epoch` the process dies without cleaning up, like a lost machine."""
    def report_then_die(result: dict) -> None:
        report(result)
        if result["epoch"] == epoch:
            os._exit(1)
    return report_then_die


def replay_key(trial: dict) -> tuple:
    """What identifies a trial's result for `finetune_trainable(landed=...)`: its id and its per-layer
    learning-rate multipliers (a study restored from an older snapshot may give the same number to another
    point of the space)."""
    return trial["trial_id"], tuple(trial["finetune"].get("layer_lr_multipliers") or ())


def finetune_trainable(config: dict, data: dict, pretrained: dict, checkpoint_every: float | None = None,
                       run_only: frozenset | None = None, landed: dict | None = None) -> None:
    """One trial. `run_only`: the trial ids this run may train; any other trial of a resumed Tune experiment
    (finished since the experiment's last snapshot, or dropped from the grid) ends at once, reporting nothing.
    `landed`: per `replay_key`, the reports of a trial whose row the sweep already holds but that a resumed
    search runs again (it ended after the study's last snapshot); they are reported again, marked `replayed`,
    instead of training, so the searcher and the scheduler learn the figures they would have."""
    from ray import tune

    trial = config["trial"]
    if "pack" in trial:
        run_pack(trial, data, pretrained, run_only, checkpoint_every)
        return
    if run_only is not None and trial["trial_id"] not in run_only:
        return
    if landed and replay_key(trial) in landed:
        for result in landed[replay_key(trial)]:
            tune.report({**result, "replayed": True})
        return
    resources = tune.get_context().get_trial_resources().required_resources
    cfg = finetune_config(trial, gpu_fraction=resources.get("GPU", 0.0), threads=int(resources.get("CPU", 1)))
    intermediate = data[trial["intermediate_data_key"]] if trial.get("intermediate_data_key") else None
    checkpoint = tune.get_checkpoint()
    resume = load_state(checkpoint) if checkpoint is not None else None
    checkpoints = EpochCheckpoints(checkpoint_every, tune.report)
    report = checkpoints.report
    fail_after = int(os.environ.get(FAIL_AFTER_EPOCH, "0"))
    if fail_after and checkpoint is None:
        report = dying_after(fail_after, report)
    finetune(cfg, data[trial["data_key"]], pretrained[trial["model_key"]], report=report, intermediate=intermediate,
             save=checkpoints.save if checkpoint_every is not None else None, resume=resume)


def run_pack(pack: dict, data: dict, pretrained: dict, run_only: frozenset | None,
             checkpoint_every: float | None = None) -> None:
    """A pack of trials (sweep.packs) as one computation. Each epoch's report holds, under `pack_results` (by
    trial_id), every
    member's latest figures (a diverged member's stay as they were when it stopped); the sweep writes one row
    per member from the last. Checkpoints as a single trial's (`pack_checkpoints`): a restarted pack goes on
    from its last one."""
    from ray import tune

    from trainables.fused import finetune_pack

    members = [m for m in pack["pack"] if run_only is None or m["trial_id"] in run_only]
    if not members:
        return
    resources = tune.get_context().get_trial_resources().required_resources
    cfgs = [finetune_config(m, gpu_fraction=resources.get("GPU", 0.0), threads=int(resources.get("CPU", 1)))
            for m in members]
    latest = [{} for _ in members]

    def report(epoch_results: dict[int, dict]) -> None:
        for i, result in epoch_results.items():
            latest[i] = {**result, "trial_id": members[i]["trial_id"]}
        epoch = max(r["epoch"] for r in epoch_results.values())
        statuses = [r.get("status") for r in latest]
        # Keyed by trial_id, not a list: Tune's TensorBoard logger flattens a dict (each member's curves under
        # pack_results/<trial_id>/) but warns on a list of dicts.
        summary = {"status": "ok", "epoch": epoch, "pack_size": len(members),
                   "pack_results": {m["trial_id"]: r for m, r in zip(members, latest) if r},
                   "trials_ok": statuses.count("ok"), "trials_diverged": statuses.count("diverged")}
        if len(members) == 1:  # reported as the trial alone would be, so TensorBoard shows its curves the same
            own = {k: v for k, v in latest[0].items() if k != "trial_id"}
            summary = {**own, **summary, "status": own.get("status", "ok")}
        to_tune(summary)

    save, resume, to_tune = pack_checkpoints(members, checkpoint_every)
    finetune_pack(cfgs, data[pack["data_key"]], pretrained[pack["model_key"]], report=report,
                  pack_id=pack["trial_id"], save=save, resume=resume)


def pack_checkpoints(members: list[dict], checkpoint_every: float | None):
    """(save, resume, report to Tune) for `finetune_pack`, as `finetune_trainable` has them for one trial: the
    pack's state at epoch ends every `checkpoint_every` seconds, and the state to go on from, if Tune restarted
    the pack from a checkpoint of these very members (else None: a fresh start)."""
    from ray import tune

    ids = [m["trial_id"] for m in members]
    checkpoint = tune.get_checkpoint()
    resume = load_state(checkpoint) if checkpoint is not None else None
    if resume is not None and resume.get("trial_ids") != ids:
        resume = None
    checkpoints = EpochCheckpoints(checkpoint_every, tune.report)
    report = checkpoints.report
    fail_after = int(os.environ.get(FAIL_AFTER_EPOCH, "0"))
    if fail_after and checkpoint is None:
        report = dying_after(fail_after, report)
    save = None if checkpoint_every is None else (lambda state: checkpoints.save({**state, "trial_ids": ids}))
    return save, resume, report
