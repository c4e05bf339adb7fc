"""The Ray Tune function trainable: a thin wrapper that turns a config dict into a `finetune` call.

Everything heavy (tokenized tasks, pretrained weights) arrives through `tune.with_parameters`, i.e. Ray's
object store, once per node rather than once per trial.

Checkpoints: at an epoch end, when at least `checkpoint_every` seconds have passed since the trial started
or last checkpointed, the training state (model, optimizer, schedule, random streams, figures so far) goes to
the sweep's storage with that epoch's report. A trial that Tune restarts (FailureConfig, or a resumed sweep)
finds it with `tune.get_checkpoint()` and continues after that epoch, to the same numbers.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from trainables import state as state_files
from trainables.ablations import ablation_from_dict
from trainables.finetune import FinetuneConfig, finetune
from trainables.rows import make_row, where_it_runs, with_ended
from trainables.worker import quiet_worker

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

    def save(self, state: dict) -> bool:
        """Whether the state was written (it goes to Tune with the next report)."""
        if self.every is None or time.monotonic() - self.last < self.every:
            return False
        self.pending = tempfile.mkdtemp(prefix="reinit-sweep-checkpoint-")
        state_files.save_state(self.pending, state)
        return True

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
    surviving checkpoint of the same trial is the one to go on from, not a fresh start. A checkpoint cut short
    (its node or the driver killed while Tune copied it to the storage: the state's marker there, its tensors
    not whole) is named on stderr and passed over for the one before it."""
    import pyarrow.fs

    for candidate in [checkpoint, *reversed(sibling_checkpoints(checkpoint))]:
        if candidate.filesystem.get_file_info(candidate.path).type == pyarrow.fs.FileType.NotFound:
            continue  # deleted since: a bucket's copy would raise where a local folder just holds no state
        with candidate.as_directory() as folder:
            if state_files.has_state(folder):
                try:
                    return state_files.load_state(folder)
                except state_files.UnreadableState as err:
                    print(f"checkpoint {candidate.path} cannot be read ({err}); going on from the one before it, "
                          "if any", file=sys.stderr, flush=True)
    return None


def sibling_checkpoints(checkpoint) -> list:
    """The other checkpoints in the trial's folder, oldest first (Tune numbers them checkpoint_000000, ...)."""
    from ray import tune

    fs, parent = checkpoint.filesystem, os.path.dirname(checkpoint.path.rstrip("/"))
    return [tune.Checkpoint(path, filesystem=fs) for path in saved_checkpoints(fs, parent)
            if path.rstrip("/") != checkpoint.path.rstrip("/")]


def dying_after(epoch: int, report):
    """`report`, and once it has reported `epoch` the process dies without cleaning up, like a lost machine."""
    def report_then_die(result: dict) -> None:
        report(result)
        if result["epoch"] == epoch:
            os._exit(1)
    return report_then_die


def replay_key(trial: dict) -> tuple:
    """What identifies a trial's result for `finetune_trainable(landed=...)`: its id and its per-layer
    learning-rate multipliers (a study rebuilt from the rows gives each landed trial back its own point)."""
    return trial["trial_id"], tuple(trial["finetune"].get("layer_lr_multipliers") or ())


def earlier_runs(tune_dir: str) -> tuple:
    """(the file system, the folders of the sweep's earlier Tune runs under `tune_dir`, newest first)."""
    import pyarrow.fs

    if "://" in tune_dir:
        fs, root = pyarrow.fs.FileSystem.from_uri(tune_dir)
    else:
        fs, root = pyarrow.fs.LocalFileSystem(), os.path.abspath(tune_dir)
    runs = fs.get_file_info(pyarrow.fs.FileSelector(root, allow_not_found=True))
    return fs, [r.path for r in sorted((r for r in runs if r.type == pyarrow.fs.FileType.Directory
                                        and r.base_name.startswith("tune-")), key=lambda r: r.base_name, reverse=True)]


def saved_checkpoints(fs, trial_folder: str) -> list[str]:
    """The checkpoint folders in a trial's folder, oldest first (Tune numbers them checkpoint_000000, ...)."""
    import pyarrow.fs

    entries = fs.get_file_info(pyarrow.fs.FileSelector(trial_folder, allow_not_found=True))
    return [f.path for f in sorted(entries, key=lambda f: f.base_name)
            if f.type == pyarrow.fs.FileType.Directory and f.base_name.startswith("checkpoint_")]


def earlier_checkpoints(tune_dir: str, trial_id: str) -> list:
    """Per earlier run of the sweep, newest run first, the newest checkpoint it left for `trial_id`
    (`<tune_dir>/tune-*/<trial_id>/checkpoint_*`), as tune.Checkpoints. This is how `--resume` goes on: from the
    store's own checkpoints, found by the trial's id, never from Tune's pickled experiment state."""
    from ray import tune

    fs, runs = earlier_runs(tune_dir)
    return [tune.Checkpoint(saved[-1], filesystem=fs) for saved in (saved_checkpoints(fs, f"{run}/{trial_id}")
                                                                    for run in runs) if saved]


def earlier_pack_members(tune_dir: str) -> list[list[str]]:
    """The members (trial ids, in their order) of each fused pack an earlier run of the sweep left a checkpoint
    of, newest run first, each pack once: `--resume` forms these packs again (sweep.packs.resumed_packs), so that
    each goes on from its checkpoint even when some of its members' rows have landed (a member that diverged, an
    earlier group's). Only the checkpoints' state.json is read, not their weights."""
    import pyarrow.fs

    fs, runs = earlier_runs(tune_dir)
    seen: set[str] = set()
    found = []
    for run in runs:
        for entry in fs.get_file_info(pyarrow.fs.FileSelector(run, allow_not_found=True)):
            if entry.type != pyarrow.fs.FileType.Directory or not entry.base_name.startswith("pack-") \
                    or entry.base_name in seen:
                continue
            for checkpoint in reversed(saved_checkpoints(fs, entry.path)):
                try:
                    with fs.open_input_stream(f"{checkpoint}/{state_files.STATE_FILE}") as stream:
                        ids = json.loads(stream.read()).get("state", {}).get("trial_ids")
                except (OSError, ValueError, AttributeError):  # none (a finished pack's note), cut short, damaged
                    continue
                if isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids):
                    seen.add(entry.base_name)
                    found.append(ids)
                    break
    return found


def state_to_resume(trial_id: str, resume_from: str | None, usable) -> dict | None:
    """The training state a trial goes on from: of this run's checkpoint when Tune restarted it, else (and when
    none of this run's can be read) under `resume_from` of the newest earlier run that left one that can and
    that is `usable(state)`; None: a fresh start. A resumed run killed while copying its first checkpoint leaves
    only that one, cut short, in its folder: the one before it is in the run before."""
    from ray import tune

    checkpoints = [c for c in [tune.get_checkpoint()] if c is not None]  # this run's own
    if resume_from is not None:
        checkpoints += earlier_checkpoints(resume_from, trial_id)
    for checkpoint in checkpoints:
        state = load_state(checkpoint)
        if state is not None and usable(state):
            return state
    return None


def ended(result: dict, epochs: int) -> bool:
    """Whether a trial's report is its last: it diverged, or it ran every epoch."""
    return result["status"] != "ok" or result["epoch"] == epochs


def epoch_report(result: dict, where: dict) -> dict:
    """What Tune hears of an epoch: the figures, where the trial runs, and no status (only a row says how a
    trial ended)."""
    return {**{k: v for k, v in result.items() if k != "status"}, **where}


def trial_reporter(trial: dict, epochs: int, send):
    """`finetune`'s `report` for a trial of the sweep: each epoch's figures go to `send` (Tune) with where the
    trial runs and no status; the last (it ran every epoch, or diverged) also carries the trial's row."""
    where = where_it_runs()

    def report(result: dict) -> None:
        # Tune numbers a trial's reports itself unless told: from 1 in the new experiment of a `--resume`, from
        # the restored checkpoint's report after a retry that fell back to an older checkpoint. Either way its
        # step (TensorBoard's, the trackers') would name another epoch than the figures are of.
        out = {**epoch_report(result, where), "training_iteration": result["epoch"]}
        if ended(result, epochs):
            held_out = {"val_objective": result["val_metric"]} if "val_metric" in result else {}
            out = with_ended(out, [make_row(trial["row"], out, result["status"], pack_size=1, pack_id=None,
                                            **held_out)])
        send(out)

    return report


def finetune_trainable(config: dict, data: dict, pretrained: dict, checkpoint_every: float | None = None,
                       resume_from: str | None = None, landed: dict | None = None) -> None:
    """One trial. Its last report carries its row (trainables.rows). `resume_from`: the sweep's Tune folder,
    where a resumed sweep finds the checkpoints earlier runs left (`state_to_resume`). `landed`: per
    `replay_key`, the reports of a trial whose row the sweep already holds but that a resumed search runs
    again; they are reported again, marked `replayed`, instead of training, so the searcher and the scheduler
    learn the figures they would have."""
    from ray import tune

    quiet_worker()
    trial = config["trial"]
    if "pack" in trial:
        run_pack(trial, data, pretrained, checkpoint_every, resume_from)
        return
    if landed and replay_key(trial) in landed:
        for result in landed[replay_key(trial)]:
            tune.report({**result, "replayed": True})
        return
    resources = tune.get_context().get_trial_resources().required_resources
    cfg = finetune_config(trial, gpu_fraction=resources.get("GPU", 0.0), threads=int(resources.get("CPU", 1)))
    intermediate = data[trial["intermediate_data_key"]] if trial.get("intermediate_data_key") else None
    # A pack of one is named by its trial (sweep.packs.pack_config): an earlier run with another --pack may have
    # left the fused engine's state under this id.
    resume = state_to_resume(trial["trial_id"], resume_from, usable=lambda state: "model" in state)
    checkpoints = EpochCheckpoints(checkpoint_every, tune.report)
    report = trial_reporter(trial, cfg.epochs, checkpoints.report)
    fail_after = int(os.environ.get(FAIL_AFTER_EPOCH, "0"))
    if fail_after and tune.get_checkpoint() is None:
        report = dying_after(fail_after, report)
    finetune(cfg, data[trial["data_key"]], pretrained[trial["model_key"]], report=report, intermediate=intermediate,
             save=checkpoints.save if checkpoint_every is not None else None, resume=resume)


def run_pack(pack: dict, data: dict, pretrained: dict, checkpoint_every: float | None = None,
             resume_from: str | None = None) -> None:
    """A pack of trials (sweep.packs) as one computation. Each epoch's report holds, under `pack_results` (by
    trial_id), every member's latest figures (a diverged member's stay as they were when it stopped), under
    `pack_waiting` the members whose group has not started (finetune_pack's `planned` groups; a JSON list,
    absent when none), and the rows of the members that ended with it. Checkpoints as a single trial's
    (`pack_checkpoints`): a restarted pack goes on from its last one."""
    from ray import tune

    from trainables.fused import finetune_pack

    members = pack["pack"]
    resources = tune.get_context().get_trial_resources().required_resources
    cfgs = [finetune_config(m, gpu_fraction=resources.get("GPU", 0.0), threads=int(resources.get("CPU", 1)))
            for m in members]
    latest = [{} for _ in members]
    where = where_it_runs()
    save, resume, to_tune = pack_checkpoints(pack["trial_id"], members, checkpoint_every, resume_from)
    groups: list[list[int]] = []  # as finetune_pack sizes them (`planned`), before its first report
    group_of: dict[int, int] = {}

    def planned(sized: list[list[int]]) -> None:
        groups[:] = sized
        group_of.update({i: g for g, group in enumerate(sized) for i in group})

    done: set[int] = set()  # members that have ended (a resumed pack's first report holds those of before)
    current = 0  # the group training now: the ones after it wait

    def report(epoch_results: dict[int, dict]) -> None:
        nonlocal current
        rows = []
        for i, result in epoch_results.items():
            latest[i] = {**epoch_report(result, where), "trial_id": members[i]["trial_id"]}
            if ended(result, cfgs[i].epochs):
                rows.append(make_row(members[i]["row"], latest[i], result["status"]))
                done.add(i)
        # A group trains to its end, then the next starts (an out-of-memory split's halves are one group's).
        current = max([current, *(group_of[i] for i in epoch_results if i in group_of)])
        while current < len(groups) and set(groups[current]) <= done:
            current += 1
        waiting = [members[i]["trial_id"] for group in groups[current + 1:] for i in group]
        epoch = max(r["epoch"] for r in epoch_results.values())
        # Keyed by trial_id, not a list: Tune's TensorBoard logger flattens a dict (each member's curves under
        # pack_results/<trial_id>/) but warns on a list of dicts.
        summary = {"epoch": epoch, "pack_size": len(members),
                   "pack_results": {m["trial_id"]: r for m, r in zip(members, latest) if r},
                   **({"pack_waiting": json.dumps(waiting)} if waiting else {})}
        if len(members) == 1:  # reported as the trial alone would be, so TensorBoard shows its curves the same
            # (its step too: see trial_reporter). A larger pack's epochs can go back down (a split's second half,
            # its finished members reported again on a resume), so Tune's own count stands there.
            summary = {**{k: v for k, v in latest[0].items() if k != "trial_id"}, **summary,
                       "training_iteration": epoch}
        to_tune(with_ended(summary, rows))

    finetune_pack(cfgs, data[pack["data_key"]], pretrained[pack["model_key"]], report=report,
                  pack_id=pack["trial_id"], save=save, resume=resume, planned=planned)


def pack_checkpoints(pack_id: str, members: list[dict], checkpoint_every: float | None, resume_from: str | None):
    """(save, resume, report to Tune) for `finetune_pack`, as `finetune_trainable` has them for one trial: the
    pack's state at epoch ends every `checkpoint_every` seconds, and the state to go on from, if Tune restarted
    the pack, or an earlier run under `resume_from` left a checkpoint of these very members (else None: a fresh
    start)."""
    from ray import tune

    ids = [m["trial_id"] for m in members]
    resume = state_to_resume(pack_id, resume_from, usable=lambda state: state.get("trial_ids") == ids)
    checkpoints = EpochCheckpoints(checkpoint_every, tune.report)
    report = checkpoints.report
    fail_after = int(os.environ.get(FAIL_AFTER_EPOCH, "0"))
    if fail_after and tune.get_checkpoint() is None:
        report = dying_after(fail_after, report)
    save = None if checkpoint_every is None else (lambda state: checkpoints.save({**state, "trial_ids": ids}))
    return save, resume, report
