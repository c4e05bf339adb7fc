"""`python -m sweep lr-multipliers`: per cell of the incremental grid (task, size, trial index, k), an Optuna
study (TPE through Ray Tune's OptunaSearch) over per-layer learning-rate multipliers, ASHA stopping poor
trials early.

- Objective: `val_metric`, the task's headline metric on the part of the cell's training subset held out of
  training (FinetuneConfig.val_size), after the trial's last reported epoch. The dev split is only reported
  (`dev_*`): nothing the searcher or the scheduler reads comes from it.
- Space: one log-uniform multiplier per encoder layer (`--group layer`), or two (`--group reinit-vs-kept`:
  one for layers k+1..L, one for 1..k); embeddings, pooler and head stay at the base learning rate. The
  study's first trial is every multiplier at 1: the same cell without the search, its baseline.
- Each cell's study is one Tune experiment in `<storage>/<name>/searches/<cell id>`. Cells run at the same
  time on the cluster: each Tuner is driven from a Ray task of its own (no CPU, on the driver's node, where
  the rows are written), and their trials share the cluster's resources.
- Resume: a rerun restores every unfinished cell (`Tuner.restore`), so its Optuna study, sampler state and
  remaining budget carry on where they stopped; a cell whose budget is spent is not started at all. A trial
  whose row landed after the study's last snapshot is not trained again: its stored figures are replayed to
  the study (`landed_reports`).
- Rows: one per trial, `<cell id>-s<n>`, n Optuna's trial number (s0 is the baseline); ASHA-stopped trials
  land too, with status `pruned`.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

from ray.tune import Callback

from sweep.checks import cannot_start
from sweep.grid import TrialSpec
from sweep.runner import land_row, make_tuner, trial_error
from sweep.store import filesystem, join, parent, stored_trial_ids

VAL_METRIC = "val_metric"  # the only figure the search reads: the held-out part of the training subset
FINISHED = ("ok", "diverged", "pruned")  # rows of trials a resumed study does not run again
GROUPS = ("layer", "reinit-vs-kept")


def layer_params(group: str, k: int, num_layers: int) -> tuple[str, ...]:
    """For each encoder layer 1..L, the name of the search parameter that sets its multiplier."""
    if group == "layer":
        return tuple(f"layer_{i}" for i in range(1, num_layers + 1))
    if group == "reinit-vs-kept":
        return tuple("kept" if i <= k else "reinit" for i in range(1, num_layers + 1))
    raise ValueError(f"--group: '{group}' is not one of {', '.join(GROUPS)}")


def trial_config(cell: dict, number: int, multipliers: list[float]) -> dict:
    """The config of the cell's n-th trial: the cell's own config with the multipliers and the held-out
    validation part set, under the trial's id."""
    config = copy.deepcopy(cell)
    trial_id = sample_id(cell["trial_id"], number)
    config["trial_id"] = trial_id
    config["finetune"].update(layer_lr_multipliers=list(multipliers), val_size=cell["row"]["val_size"])
    config["row"].update(trial_id=trial_id, cell=cell["trial_id"], sample=number, multipliers=list(multipliers))
    return config


@dataclasses.dataclass(frozen=True)
class MultiplierSpace:
    """One cell's define-by-run space for OptunaSearch: a log-uniform multiplier per distinct parameter, and
    the full trial config built from them. A module-level value, since OptunaSearch pickles it with its
    state."""

    params: tuple[str, ...]  # per layer 1..L, see layer_params
    low: float
    high: float
    cell: dict  # the cell's config (TrialSpec.to_config())

    def __call__(self, trial) -> dict:
        value = {name: trial.suggest_float(name, self.low, self.high, log=True) for name in dict.fromkeys(self.params)}
        return {"trial": trial_config(self.cell, trial.number, [value[name] for name in self.params])}

    @property
    def baseline(self) -> dict:
        return {name: 1.0 for name in dict.fromkeys(self.params)}


def cell_space(spec: TrialSpec, num_layers: int) -> MultiplierSpace:
    own = dict(spec.own_columns)
    cell = spec.to_config()
    cell["row"]["search_seed"] = spec.seed
    return MultiplierSpace(layer_params(own["group"], spec.k, num_layers), own["multiplier_low"],
                           own["multiplier_high"], cell)


def startup_trials(num_samples: int) -> int:
    """TPE's random start (the baseline included): a third of the budget, 2 to 10 trials (Optuna's default of
    10 would leave a small budget all random)."""
    return max(2, min(10, num_samples // 3))


def search_options(spec: TrialSpec, num_layers: int, num_samples: int) -> dict:
    """What a cell's Tuner adds to the common set-up (sweep.runner.make_tuner): Optuna's sampler, ASHA, the
    budget."""
    import optuna
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    space = cell_space(spec, num_layers)
    searcher = OptunaSearch(
        space, metric=VAL_METRIC, mode="max", points_to_evaluate=[space.baseline],
        sampler=optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=startup_trials(num_samples)),
    )
    # OptunaSearch uses no Optuna pruner: early stopping is ASHA's, on the same held-out metric, per epoch.
    scheduler = ASHAScheduler(time_attr="epoch", metric=VAL_METRIC, mode="max", max_t=spec.epochs, grace_period=1,
                              reduction_factor=3)
    return {"search_alg": searcher, "scheduler": scheduler, "num_samples": num_samples}


class SearchRowWriter(Callback):
    """Writes one row per ended trial, pruned ones included, and prints one line. It runs in the cell's
    driver task; a module-level class, since Tune pickles callbacks with the experiment."""

    def __init__(self, folder: Path | str, cell: str, num_samples: int):
        self.folder, self.cell, self.num_samples = folder, cell, num_samples

    def _write(self, trial, status: str | None, error: str | None) -> None:
        last = trial.last_result or {}
        epochs = trial.config["trial"]["finetune"]["epochs"]
        epochs_run = int(last.get("epoch", 0))
        if status is None:
            status = last.get("status", "error")
            if status == "ok" and epochs_run < epochs:
                status = "pruned"  # ASHA stopped it
        row = land_row(self.folder, trial.config["trial"]["row"], last, status, error,
                       val_objective=last.get(VAL_METRIC),  # what Optuna was told: the last epoch's val_metric
                       val_metrics_by_epoch=last.get("val_metrics_by_epoch"), epochs_run=epochs_run,
                       layer_lrs=last.get("layer_lrs"))
        done = count_rows(self.folder, f"{self.cell}-s")
        shown = " ".join(f"{m:.3g}" for m in row["multipliers"])
        val, dev = row["val_objective"], row.get("dev_metric")
        print(f"[{self.cell} {done}/{self.num_samples}] s{row['sample']} {status} after {row['epochs_run']}/{epochs} "
              f"epochs | multipliers {shown} | val {val if val is None else f'{val:.4f}'} "
              f"dev {dev if dev is None else f'{dev:.4f}'}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = trial.last_result or {}
        if last.get("replayed"):  # its row landed before the kill that its study's snapshot missed: it stands
            print(f"[{self.cell}] s{trial.config['trial']['row']['sample']} had landed before the restart; "
                  "its row stands and the study got its figures back", flush=True)
        elif "status" in last:  # else it reported nothing this run: its row stands
            self._write(trial, status=None, error=None)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._write(trial, status="error", error=trial_error(trial))


def count_rows(folder: Path | str, prefix: str) -> int:
    """How many rows in `folder` (a local folder or a storage URI) have a trial_id starting with `prefix`."""
    return sum(trial_id.startswith(prefix) for trial_id in stored_trial_ids(folder))


def experiment_dir(tune_dir: Path | str, spec: TrialSpec) -> Path | str:
    """Where a cell's Tune experiment lives: a local folder or a storage URI."""
    return join(join(tune_dir, "searches"), spec.trial_id)


def search_cell(spec: TrialSpec, num_layers: int, num_samples: int, trainable, folder: Path | str,
                path: Path | str, callbacks=()) -> str:
    """Run one cell's study to its budget, or continue it where it stopped (inside a Ray task)."""
    from ray import tune

    if tune.Tuner.can_restore(str(path)):
        # Optuna's study and sampler, Tune's trials and the remaining budget all come back; trials that were
        # running start again, errored ones are retried.
        tuner = tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True)
    else:
        tuner = make_tuner(trainable, name=spec.trial_id, storage_path=parent(path), max_failures=0,
                           callbacks=[SearchRowWriter(folder, spec.trial_id, num_samples), *callbacks],
                           **search_options(spec, num_layers, num_samples))
    tuner.fit()
    return spec.trial_id


def check_budget(path: Path | str, num_samples: int) -> str | None:
    """A cell's budget is fixed when its study starts (Tune restores it); a different one is refused."""
    fs, where = filesystem(path)
    saved = f"{where}/search.json"
    if fs.get_file_info(saved).is_file:
        with fs.open_input_stream(saved) as handle:
            started = json.loads(handle.read())["num_samples"]
        if started != num_samples:
            return (f"--num-samples: {num_samples} differs from the {started} the study in {path} started with; "
                    f"rerun with --num-samples {started} to continue it, or give a new --name")
    return None


def record_budget(path: Path | str, spec: TrialSpec, num_samples: int) -> None:
    fs, where = filesystem(path)
    fs.create_dir(where)
    with fs.open_output_stream(f"{where}/search.json") as handle:
        handle.write(json.dumps({"num_samples": num_samples, "cell": spec.identity()}).encode())


def run_searches(specs: list[TrialSpec], *, data: dict, pretrained: dict, folder: Path | str, tune_dir: Path | str,
                 cpus_per_trial: float, gpus_per_trial: float, options=None, callbacks=()) -> list[str]:
    """Every cell's study at once, each to `options.num_samples` trials; returns the cells searched.
    `callbacks` (trackers, the Python API's) go to every cell's Tuner."""
    import ray
    from ray import tune
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from trainables.tune_trainable import finetune_trainable

    num_samples = options.num_samples if options is not None else 8
    problems = [p for p in (check_budget(experiment_dir(tune_dir, s), num_samples) for s in specs) if p]
    if problems:
        raise SystemExit(cannot_start(problems))
    for spec in specs:
        record_budget(experiment_dir(tune_dir, spec), spec, num_samples)

    # Tasks and weights go to the object store once; every cell's trials read the same copy.
    trainable = tune.with_resources(
        tune.with_parameters(finetune_trainable, data=ray.put(data), pretrained=ray.put(pretrained),
                             landed=landed_reports(specs, folder)),
        {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
    )
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    # Tune saves a study's state at most every few seconds by default; every second keeps the trials a kill
    # makes a resumed study run again to those that ended in the last second (and those replay their rows).
    search = ray.remote(num_cpus=0)(search_cell).options(
        scheduling_strategy=here, runtime_env={"env_vars": {"TUNE_GLOBAL_CHECKPOINT_S": "1"}})
    print(f"{len(specs)} studies of {num_samples} trials each; Tune experiments in {join(tune_dir, 'searches')}")
    return ray.get([
        search.remote(spec, pretrained[spec.model].num_layers, num_samples, trainable, folder,
                      experiment_dir(tune_dir, spec), list(callbacks))
        for spec in specs
    ])


def sample_id(cell_id: str, number: int) -> str:
    """The trial id of a cell's n-th trial (Optuna's trial number)."""
    return f"{cell_id}-s{number}"


def planned_rows(specs: list[TrialSpec], num_samples: int) -> list[dict]:
    """The identity row of every trial the cells' studies make when they run to their budget (the
    multipliers a trial will try are not known before it runs)."""
    return [{**spec.row(), "trial_id": sample_id(spec.trial_id, n), "cell": spec.trial_id, "sample": n}
            for spec in specs for n in range(num_samples)]


def finished_rows(folder: Path | str, columns: list[str]):
    """The stored rows of the searches' finished trials (FINISHED), `columns` of them; None when there are none."""
    import pyarrow.fs

    from trialrows.read import read_results

    fs, path = filesystem(folder)
    if not fs.get_file_info(path).type == pyarrow.fs.FileType.Directory:
        return None
    rows = read_results(folder, columns=["trial_id", "cell", "status", *columns])
    if "cell" not in rows.columns:
        return None
    return rows[rows["status"].isin(FINISHED) & rows["cell"].notna()]


def unfinished_cells(specs: list[TrialSpec], folder: Path | str, num_samples: int) -> list[TrialSpec]:
    """The cells whose study has fewer than `num_samples` finished rows."""
    rows = finished_rows(folder, [])
    if rows is None:
        return list(specs)
    done = rows.groupby("cell")["trial_id"].nunique()
    return [s for s in specs if done.get(s.trial_id, 0) < num_samples]


def landed_reports(specs: list[TrialSpec], folder: Path | str) -> dict:
    """For `finetune_trainable(landed=...)`: per trial whose row has landed, the epoch reports that gave it
    (the held-out figure of every epoch, the last with the row's status). A kill can land between a trial's
    row and its study's next snapshot; the resumed study then runs that trial again, and gets these back
    instead of a second training."""
    from trainables.tune_trainable import replay_key
    from trialrows.read import as_list

    rows = finished_rows(folder, ["multipliers", "val_metrics_by_epoch"])
    if rows is None:
        return {}
    cells = {s.trial_id for s in specs}
    landed = {}
    for row in rows[rows["cell"].isin(cells)].itertuples():
        values, multipliers = as_list(row.val_metrics_by_epoch), as_list(row.multipliers)
        if not values or not multipliers:
            continue  # a row without the figures to replay: the trial trains again
        # ASHA hears every epoch again; restored, it could stop the replay at an earlier rung than the first run
        # did, and Optuna would then learn that rung's figure. The row stands as it landed either way.
        reports = [{"epoch": i, "epochs_run": i, VAL_METRIC: float(v), "val_metrics_by_epoch": values[:i],
                    "status": "ok"} for i, v in enumerate(values, 1)]
        if row.status == "diverged":
            reports[-1]["status"] = "diverged"
        trial = {"trial_id": row.trial_id, "finetune": {"layer_lr_multipliers": [float(m) for m in multipliers]}}
        landed[replay_key(trial)] = reports
    return landed


def plan_searches(specs: list[TrialSpec], folder, options, read: bool = True):
    """The registry's plan for lr-multipliers (see sweep.cli.plan_trials): a spec is a cell, a study of
    --num-samples trials, done once that many of its trials finished."""
    from trialrows.summaries import best_table

    todo = unfinished_cells(specs, folder, options.num_samples) if read else list(specs)
    note = (f"(trials above are cells: each is an Optuna study of --num-samples {options.num_samples} trials, "
            f"{len(specs) * options.num_samples:,} trials in all)")
    return todo, planned_rows(specs, options.num_samples), FINISHED, best_table, note
