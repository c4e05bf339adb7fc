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
  the rows are written), and their trials share the cluster's resources. Within a cell, one trial at a time
  (`search_options`), so that the same command suggests the same multipliers however fast its trials run.
- Resume: a rerun rebuilds every unfinished cell's study from the cell's rows (never from Tune's pickled
  experiment state, which anyone who can write to the store could have replaced): each landed trial is asked
  again at its own point and replays its stored figures instead of training (`landed_reports`), so Optuna
  and ASHA learn what they knew, under the trial's own number; the rest of the budget is new trials, numbered
  after them. A cell whose budget is spent is not started at all. The rebuilt study's next suggestions come
  from the same history but not the same sampler state, so they may differ from an uninterrupted run's: its
  sampler is seeded from `search_seed` and the landed sample numbers (`sampler_seed`).
- The study hears a trial ASHA stopped as pruned (at its rung's figure, below every finished trial, as Optuna's
  own pruners leave it) and a diverged one as failed (`CellSearch`).
- Rows: one per trial, `<cell id>-s<n>`, n Optuna's trial number (s0 is the baseline); ASHA-stopped trials
  land too, with status `pruned`.
- Progress: every study's trials on the sweep's one progress line, in the driver (sweep.progress.follow).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
from pathlib import Path

from ray.tune.search.optuna import OptunaSearch

from sweep.checks import Refused
from sweep.grid import TrialSpec
from sweep.progress import trial_work
from sweep.runner import RowWriter, experiment_name, make_tuner, refuse_unplaceable
from sweep.store import filesystem, join, parent, stored_trial_ids
from trainables.rows import make_row
from trialrows.read import STUDY_FINISHED

VAL_METRIC = "val_metric"  # the only figure the search reads: the held-out part of the training subset
FINISHED = STUDY_FINISHED  # rows of trials a resumed study does not run again
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
    landed: tuple[int, ...] = ()  # the sample numbers of the cell's landed trials, asked first in this order

    def __call__(self, trial) -> dict:
        value = {name: trial.suggest_float(name, self.low, self.high, log=True) for name in dict.fromkeys(self.params)}
        return {"trial": trial_config(self.cell, self.sample(trial.number), [value[name] for name in self.params])}

    def sample(self, number: int) -> int:
        """The sample number of the study's n-th trial: the landed ones first, then the numbers they left free."""
        if number < len(self.landed):
            return self.landed[number]
        free = (n for n in itertools.count() if n not in self.landed)
        return next(itertools.islice(free, number - len(self.landed), None))

    def point(self, multipliers) -> dict:
        """The search parameters that give these per-layer multipliers."""
        point = {}
        for name, multiplier in zip(self.params, multipliers):
            point.setdefault(name, float(multiplier))
        return point

    @property
    def baseline(self) -> dict:
        return {name: 1.0 for name in dict.fromkeys(self.params)}


def cell_space(spec: TrialSpec, num_layers: int, landed: tuple[int, ...] = ()) -> MultiplierSpace:
    own = dict(spec.own_columns)
    cell = spec.to_config()
    cell["row"]["search_seed"] = spec.seed
    return MultiplierSpace(layer_params(own["group"], spec.k, num_layers), own["multiplier_low"],
                           own["multiplier_high"], cell, landed)


def startup_trials(num_samples: int) -> int:
    """TPE's random start (the baseline included): a third of the budget, 2 to 10 trials (Optuna's default of
    10 would leave a small budget all random)."""
    return max(2, min(10, num_samples // 3))


def sampler_seed(seed: int, landed) -> int:
    """The seed of a cell's sampler: the cell's own, or on a rerun one drawn from it and the landed sample numbers.
    Enqueued points (the landed ones, the baseline) draw nothing, so the cell's own seed would give the rerun's
    new trials the random-start points its landed trials already tried, one for one."""
    drawn = sorted(set(landed) - {0})  # s0 is the enqueued baseline
    if not drawn:
        return seed
    return int.from_bytes(hashlib.sha256(json.dumps([seed, drawn]).encode()).digest()[:4], "big")


class CellSearch(OptunaSearch):
    """OptunaSearch that tells the study how each trial ended as Optuna's own pruners would. Ray's would tell a
    trial ASHA stopped as complete, its rung's figure (an early epoch's) then ranking as a finished trial's
    objective, and a diverged trial's nan would leave it running in the study (Optuna refuses a complete nan).
    A module-level class, since Tune pickles the searcher with the experiment."""

    def __init__(self, *args, epochs: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.epochs = epochs

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        value = (result or {}).get(VAL_METRIC)
        if error or value is None:
            super().on_trial_complete(trial_id, result, error)
        elif not math.isfinite(value):  # diverged: a failure, never a result
            super().on_trial_complete(trial_id, None, error=True)
        elif result.get("epoch", self.epochs) < self.epochs:  # ASHA stopped it (a replay too, as the run did)
            # Tune passes a stopping report to on_trial_complete only
            self.on_trial_result(trial_id, {**result, "training_iteration": result["epoch"]})
            super().on_trial_complete(trial_id, None)  # no value: pruned, at its last intermediate one
        else:
            super().on_trial_complete(trial_id, result, error)


def search_options(spec: TrialSpec, num_layers: int, num_samples: int, landed: dict[int, list] | None = None) -> dict:
    """What a cell's Tuner adds to the common set-up (sweep.runner.make_tuner): Optuna's sampler, ASHA, the
    budget. `landed`: the multipliers of the cell's landed trials by sample number; they are asked first (and
    replay their figures), then the baseline if it has not landed, then the sampler's own points."""
    import optuna
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter

    landed = landed or {}
    space = cell_space(spec, num_layers, tuple(sorted(landed)))
    points = [space.point(landed[n]) for n in space.landed] + ([] if 0 in landed else [space.baseline])
    searcher = CellSearch(
        space, metric=VAL_METRIC, mode="max", points_to_evaluate=points,
        sampler=optuna.samplers.TPESampler(seed=sampler_seed(spec.seed, landed),
                                           n_startup_trials=startup_trials(num_samples)),
        epochs=spec.epochs,
    )
    # OptunaSearch uses no Optuna pruner: early stopping is ASHA's, on the same held-out metric, per epoch.
    scheduler = ASHAScheduler(time_attr="epoch", metric=VAL_METRIC, mode="max", max_t=spec.epochs, grace_period=1,
                              reduction_factor=3)
    # One trial of a cell at a time, its next asked once it has ended: with two running, which one ends first
    # (the machine's load) decides what TPE has heard when it is asked, and ASHA's async rungs which is stopped,
    # so the same command would suggest other multipliers. Cells still run at once and fill the cluster.
    return {"search_alg": ConcurrencyLimiter(searcher, max_concurrent=1), "scheduler": scheduler,
            "num_samples": num_samples}


class SearchRowWriter(RowWriter):
    """The sweep's row writer (sweep.runner.RowWriter) for one cell's study, in the cell's driver task: a trial
    that ran its epochs lands the row it reported; one that ASHA stopped gets a `pruned` row made from its last
    report; a replayed one (its row landed in an earlier run) stands. Prints a line per row. A module-level
    class, since Tune pickles callbacks with the experiment."""

    def __init__(self, folder: Path | str, cell: str, num_samples: int, progress=None):
        super().__init__(folder, progress=progress)
        self.cell, self.num_samples = cell, num_samples

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = trial.last_result or {}
        if last.get("replayed"):  # its row landed in an earlier run: it stands
            self.final.add(trial.config["trial"]["trial_id"])
            print(f"[{self.cell}] s{trial.config['trial']['row']['sample']} had landed in an earlier run; its row "
                  "stands and the study got its figures back", flush=True)
        super().on_trial_complete(iteration, trials, trial, **info)

    def end_row(self, member: dict, last: dict) -> dict:
        return make_row(member["row"], last, "pruned", val_objective=last.get(VAL_METRIC))  # ASHA stopped it

    def line(self, row: dict) -> str:
        done = count_rows(self.folder, f"{self.cell}-s")
        shown = " ".join(f"{m:.3g}" for m in row["multipliers"])
        val, dev = row.get("val_objective"), row.get("dev_metric")
        return (f"[{self.cell} {done}/{self.num_samples}] s{row['sample']} {row['status']} after "
                f"{row.get('epochs_run') or 0}/{row['epochs']} epochs | multipliers {shown} | val "
                f"{val if val is None else f'{val:.4f}'} dev {dev if dev is None else f'{dev:.4f}'}")


def count_rows(folder: Path | str, prefix: str) -> int:
    """How many rows in `folder` (a local folder or a storage URI) have a trial_id starting with `prefix`."""
    return sum(trial_id.startswith(prefix) for trial_id in stored_trial_ids(folder))


def experiment_dir(tune_dir: Path | str, spec: TrialSpec) -> Path | str:
    """Where a cell's Tune experiment lives: a local folder or a storage URI."""
    return join(join(tune_dir, "searches"), spec.trial_id)


# A cell's study runs in a Ray task, whose INFO lines the sweep's driver forwards: Optuna's "A new study created in
# memory" and Tune's closing "Wrote the latest version of all result files" for every cell, which say nothing its
# own lines do not. Their warnings still show.
QUIET_IN_CELLS = ("optuna", "ray.tune.tune")


def quiet_cell() -> None:
    import optuna

    from trainables.worker import quiet_loggers

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # Optuna's own handler, not the logging tree's levels
    quiet_loggers(QUIET_IN_CELLS)


def search_cell(spec: TrialSpec, num_layers: int, num_samples: int, trainable, folder: Path | str,
                path: Path | str, landed: dict[int, list], callbacks=(), progress=None) -> str:
    """Run one cell's study to its budget (inside a Ray task), as a new Tune experiment under the cell's folder;
    `landed`: the multipliers of its trials whose rows landed in earlier runs, by sample number; `progress`: the
    ProgressRelay to the driver's progress view (sweep.progress.follow)."""
    quiet_cell()
    writer = SearchRowWriter(folder, spec.trial_id, num_samples, progress=progress)
    tuner = make_tuner(trainable, name=experiment_name(), storage_path=path, max_failures=0,
                       callbacks=[writer, *([progress] if progress is not None else []), *callbacks],
                       **search_options(spec, num_layers, num_samples, landed))
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


def budget_problems(specs: list[TrialSpec], tune_dir: Path | str, num_samples: int) -> list[str]:
    return [p for p in (check_budget(experiment_dir(tune_dir, s), num_samples) for s in specs) if p]


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
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from sweep.progress import ProgressRelay, ProgressView, follow
    from trainables.tune_trainable import finetune_trainable

    num_samples = options.num_samples if options is not None else 8
    problems = budget_problems(specs, tune_dir, num_samples)
    if problems:
        raise Refused(problems)
    # Tasks and weights go to the object store once; every cell's trials read the same copy.
    trainable = tune.with_resources(
        tune.with_parameters(finetune_trainable, data=ray.put(data), pretrained=ray.put(pretrained),
                             landed=landed_reports(specs, folder)),
        {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
    )
    refuse_unplaceable(trainable)  # here, before any budget is recorded
    for spec in specs:
        record_budget(experiment_dir(tune_dir, spec), spec, num_samples)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    search = ray.remote(num_cpus=0)(search_cell).options(scheduling_strategy=here)
    print(f"{len(specs)} studies of {num_samples} trials each; Tune experiments in {join(tune_dir, 'searches')}")
    points = landed_points(folder)
    view = ProgressView(search_work(specs, pretrained, num_samples, points))
    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
    try:
        return follow(view, [
            search.remote(spec, pretrained[spec.model].num_layers, num_samples, trainable, folder,
                          experiment_dir(tune_dir, spec), points.get(spec.trial_id, {}), list(callbacks),
                          ProgressRelay(queue))
            for spec in specs
        ], queue)
    finally:
        queue.shutdown()


def search_work(specs: list[TrialSpec], pretrained: dict, num_samples: int, points: dict) -> dict[str, float]:
    """trial_id -> work (sweep.progress.trial_work) of each trial the studies train in this run: per cell, the
    samples its landed ones leave of the budget, numbered as the study numbers them (MultiplierSpace.sample).
    Its landed trials are replayed, not trained. ASHA stops some early: their work left goes with them, so the
    ETA before then is of every trial running its epochs."""
    work = {}
    for spec in specs:
        space = cell_space(spec, pretrained[spec.model].num_layers, tuple(sorted(points.get(spec.trial_id, {}))))
        for number in range(len(space.landed), num_samples):
            work[sample_id(spec.trial_id, space.sample(number))] = trial_work(spec)
    return work


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


def landed_points(folder: Path | str) -> dict[str, dict[int, list]]:
    """Per cell, the multipliers of its trials whose rows landed, by sample number: what a rerun's study asks
    first (`search_options`)."""
    from trialrows.read import as_list

    rows = finished_rows(folder, ["sample", "multipliers"])
    if rows is None:
        return {}
    points: dict[str, dict[int, list]] = {}
    for row in rows.itertuples():
        if as_list(row.multipliers):
            points.setdefault(row.cell, {})[int(row.sample)] = [float(m) for m in as_list(row.multipliers)]
    return points


def landed_reports(specs: list[TrialSpec], folder: Path | str) -> dict:
    """For `finetune_trainable(landed=...)`: per trial whose row has landed, the epoch reports that gave it
    (the held-out figure of every epoch). A rerun's study asks each landed trial again (`landed_points`) and
    gets these back instead of a second training."""
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
        reports = [{"epoch": i, "epochs_run": i, VAL_METRIC: float(v), "val_metrics_by_epoch": values[:i]}
                   for i, v in enumerate(values, 1)]
        trial = {"trial_id": row.trial_id, "finetune": {"layer_lr_multipliers": [float(m) for m in multipliers]}}
        landed[replay_key(trial)] = reports
    return landed


def plan_searches(specs: list[TrialSpec], folder, options, read: bool = True):
    """The registry's plan for lr-multipliers (see sweep.cli.plan_trials): a spec is a cell, a study of
    --num-samples trials, done once that many of its trials finished."""
    from trialrows.summaries import best_table

    todo = unfinished_cells(specs, folder, options.num_samples) if read else list(specs)
    # Here, before the plan is recorded: a refused command must not become the one `status` says a rerun runs.
    problems = budget_problems(todo, parent(folder), options.num_samples) if read else []
    if problems:
        raise Refused(problems)
    note = (f"(trials above are cells: each is an Optuna study of --num-samples {options.num_samples} trials, "
            f"{len(specs) * options.num_samples:,} trials in all)")
    return todo, planned_rows(specs, options.num_samples), FINISHED, best_table, note
