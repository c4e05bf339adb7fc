"""Running the probing grid on Ray Tune: one Tune trial per training subset, one Parquet row per probe.

A probing row is one (task, size, trial index, probe, layer). The rows that share a training subset (same
task, size and trial index, the same probe settings) form one Tune trial, which runs the frozen encoder once
over that subset and the dev split and then trains a probe per row on the cached features
(trainables.probing.probe_subset). The trial reports once per probe; a callback in the driver writes that
probe's row the moment the report arrives, so a crash loses no finished probe, and a rerun (which skips
finished trial_ids) runs only the probes still missing, in as few subsets as they fall in.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sweep.checks import cannot_start
from sweep.grid import TrialSpec, data_key
from sweep.runner import RowWriter, experiment_name, fit, make_tuner, refuse_unplaceable

GROUP_COLUMNS = ("probe", "layer")  # the own columns that vary inside one subset's trial


def group_key(spec: TrialSpec) -> str:
    """What a probe shares with every probe of its Tune trial: its identity without probe and layer."""
    identity = spec.identity()
    identity["labels"] = {k: v for k, v in identity.get("labels", {}).items() if k not in GROUP_COLUMNS}
    return json.dumps(identity, sort_keys=True)


def group_config(specs: list[TrialSpec]) -> dict:
    """A Tune trial's config: the subset and probe settings shared by `specs`, and each probe's row."""
    first = specs[0]
    own = dict(first.own_columns)
    digest = hashlib.sha256(group_key(first).encode()).hexdigest()[:10]
    return {
        "trial_id": f"probing-{first.task}-n{first.train_size}-t{first.trial_index}-{digest}",
        "data_key": data_key(first.task, first.max_length),
        "model_key": first.model,
        "probe": {
            "task": first.task,
            "train_size": first.train_size,
            "subset_seed": first.subset_seed,
            "seed": first.seed,
            "max_epochs": first.epochs,
            "patience": own["patience"],
            "val_fraction": own["val_fraction"],
            "lr": first.lr,
            "batch_size": first.batch_size,
            "weight_decay": first.weight_decay,
            "precision": first.precision,  # the frozen pass runs in the precision its rows record
        },
        "probes": [{"probe": dict(s.own_columns)["probe"], "layer": dict(s.own_columns)["layer"], "trial_id": s.trial_id,
                    "row": s.row()} for s in specs],
    }


def group_specs(specs: list[TrialSpec]) -> list[dict]:
    """The Tune trials of a probing grid, one per training subset, in the grid's order."""
    groups: dict[str, list[TrialSpec]] = {}
    for spec in specs:
        if "probe" not in dict(spec.own_columns):  # what makes a trial a probe, whichever experiment planned it
            raise ValueError(f"sweep.probing runs probing trials only; got a '{spec.experiment}' trial")
        groups.setdefault(group_key(spec), []).append(spec)
    return [group_config(members) for members in groups.values()]


def check_poolers(groups: list[dict], pretrained: dict) -> None:
    """The [CLS] probes read the pooler: refuse, before any trial starts, a model that has none."""
    for group in groups:
        kinds = {p["probe"] for p in group["probes"]} - {"mean-pool"}
        weights = pretrained[group["model_key"]].state_dict
        if kinds and not any(name.startswith("pooler.") for name in weights):
            raise SystemExit(cannot_start([f"--probes: '{sorted(kinds)[0]}' reads the pooler, and model "
                                           f"'{group['model_key']}' has none; allowed for it: mean-pool"]))


class ProbeRowWriter(RowWriter):
    """The sweep's row writer (sweep.runner.RowWriter: a probe's row lands when its report arrives; a
    subset's trial that fails, or ends without reporting a probe, gives its missing probes `error` rows),
    with a line per probe: the progress view's line of the probe's end, or printed without a view."""

    def __init__(self, folder: Path, total: int, progress=None):
        super().__init__(folder, progress=progress)
        self.total = total

    def line(self, row: dict) -> str:
        metric = row.get("dev_metric")
        shown = f"dev {row.get('metric_name')} {metric:.4f}, stopped at epoch {row.get('stop_epoch')}" \
            if isinstance(metric, float) else ""
        return (f"[{len(self.written)}/{self.total}] {row['trial_id']} {row['probe']} layer {row['layer']}: "
                f"{row['status']} {shown}").rstrip()


def run_probing(
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
    callbacks=(),
):
    """Run the probing specs as one Tune trial per training subset; returns (Tune ResultGrid, the trial_ids
    of the rows written). Rows land in `folder` as each probe finishes."""
    from ray import tune

    from sweep.progress import ProgressView, probe_work
    from trainables.probing import probing_trainable

    groups = group_specs(specs)
    check_poolers(groups, pretrained)
    print(f"probing: {len(specs)} probes in {len(groups)} Tune trials (one encoder pass per training subset)")
    trainable = tune.with_resources(
        tune.with_parameters(probing_trainable, data=data, pretrained=pretrained),
        {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
    )
    refuse_unplaceable(trainable)
    progress = ProgressView({s.trial_id: probe_work(s) for s in specs})
    writer = ProbeRowWriter(folder, len(specs), progress=progress)
    tuner = make_tuner(trainable, param_space={"trial": tune.grid_search(groups)}, name=experiment_name(),
                       storage_path=tune_dir, callbacks=[writer, progress, *callbacks], max_failures=0,
                       verbose=verbose)
    return fit(tuner, tune_dir), writer.written
