"""The experiment registry: each experiment registered once, here, with everything about it: its grid (which
trials it makes), its own options (each declared once), its presets, the row columns it adds, its report view
and the surgery its trials use. `register` refuses a name or a column declared twice, at import.

Everything else is made from the entries: the sweep's command line, `--help`, checks and dry-run counts
(sweep.cli, sweep.experiments), the row schema (trialrows.schema), the report's tables and figures
(analysis) and the tests' lists. This module is pure Python, so the analysis reads the views without the
sweep or torch: a grid is built by calling the `grid` it is given (sweep.experiments.GridSettings: `cells()`,
`trial(...)`, `reinit(...)`, `surgery(kind)` for the ablation classes of trainables.ablations, and every
option's value by name). See the README's "Adding an experiment".

Rows of an experiment without an entry still get a table (`analysis.tables.other_table`).
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from trialrows.declare import Limits, Option, at_least, each, fraction, in_heads, in_layers, known_task, positive

CELL = ["task", "model", "train_size"]


@dataclasses.dataclass(frozen=True)
class View:
    """What the experiment's rows hold, for the report."""

    columns: tuple[str, ...]  # what the experiment's table keeps apart
    # One of `columns` whose values are the table's samples (its n), not conditions: a setting that splits the
    # conditions is looked for across them (two permutation sweeps draw different orders, at epochs 3 and 10).
    sample: str | None = None
    finetunes: bool = False  # rows finetune the pretrained model with some part reset (paired with the full model)
    reset_column: str | None = None  # set only where something is reset: null marks the full model
    title: str = ""  # set: a table and a figure made from this entry (analysis.tables/figures.experiment_*)
    note: str = ""
    x: str | None = None  # the figure's x axis (None: one point per condition)
    series: str | None = None  # one line per value of this column
    # Row columns only this experiment writes, with their Arrow type (trialrows.schema declares them as
    # settings): a store opens at one type whichever file comes first. A column is declared once, by the
    # first experiment that writes it; another may write it too.
    new_columns: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.sample is not None and self.sample not in self.columns:
            raise ValueError(f"View.sample {self.sample!r} is not one of its columns {list(self.columns)}")


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    build: Callable  # (grid, num_layers, num_heads) -> the grid's trials (sweep.grid.TrialSpec)
    summary: str  # one line for `--help`
    view: View
    options: tuple[Option, ...] = ()  # its own options, beside every experiment's (sweep.experiments.GridSettings)
    # Per preset name, the options this experiment's preset sets over the generic preset (sweep.config.PRESETS),
    # as a config file would write them.
    presets: dict = dataclasses.field(default_factory=dict)
    # "module:function" that runs this experiment's trials instead of sweep.runner.run_trials (same keyword
    # arguments), for experiments whose trials are not one finetuning run each (probing, searches).
    runner: str | None = None
    # "module:function" (specs, folder, options) -> (to run, planned rows, statuses a rerun skips, the table
    # printed at the end), for experiments whose specs are not trials (a search's cells); None: the specs are.
    plan: str | None = None
    # The option whose value is how many finetuning trials each planned spec stands for (a search's cell: its
    # study's --num-samples), for the dry run's price; None: each spec is one trial, or no finetuning trial.
    trials_per_spec: str | None = None
    # False: the experiment needs no layers of their own, so models that share one set across layers
    # (ALBERT) can run it.
    layerwise: bool = True
    problems: Callable[..., list[str]] | None = None  # (grid, limits) -> checks across its options
    surgery: tuple[str, ...] = ("reinit",)  # the ablation kinds its trials use (trainables.ablations.ABLATIONS)
    # Settings every experiment has that its trials never read (its surgery has no pooler, say): given with
    # another value than their default, they are refused, not silently ignored.
    ignores: tuple[str, ...] = ()

    def run_function(self) -> Callable:
        return _function(self.runner or "sweep.runner:run_trials")

    def plan_function(self) -> Callable | None:
        return _function(self.plan) if self.plan else None


def _function(name: str) -> Callable:
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


EXPERIMENTS: dict[str, Experiment] = {}
OWN_OPTIONS: dict[str, Option] = {}  # every experiment's own options by name (one declaration per name)
COLUMN_OWNERS: dict[str, str] = {}  # a new row column -> the experiment that declared it


def register(experiment: Experiment) -> Experiment:
    """Add an experiment; a name, an option or a row column declared a second time is refused."""
    if experiment.name in EXPERIMENTS:
        raise ValueError(f"experiment '{experiment.name}' is registered twice")
    for option in experiment.options:
        known = OWN_OPTIONS.get(option.name)
        if known is not None and known != option and not _same_setting(known, option):
            raise ValueError(f"experiment '{experiment.name}': option {option.flag} is declared differently by "
                             "another experiment; declare it once and share it")
    new = [column for column, _ in experiment.view.new_columns]
    for column in dict.fromkeys(c for c in new if new.count(c) > 1):
        # The schema would hold the name twice, and no file could then be read with it: every row file of
        # every store would be set aside as unreadable.
        raise ValueError(f"experiment '{experiment.name}': row column '{column}' is declared twice in its "
                         "new_columns; declare it once")
    for column, _ in experiment.view.new_columns:
        if column in COLUMN_OWNERS:
            raise ValueError(f"experiment '{experiment.name}': row column '{column}' is already declared by "
                             f"'{COLUMN_OWNERS[column]}'; write it without declaring it again")
    view = experiment.view
    named = {*view.columns, *(c for c, _ in view.new_columns)}
    for role, column in (("reset_column", view.reset_column), ("x", view.x), ("series", view.series)):
        if column is not None and column not in named:
            raise ValueError(f"experiment '{experiment.name}': its view's {role} '{column}' is not one of its columns")
    for option in experiment.options:
        OWN_OPTIONS.setdefault(option.name, option)
    for column, _ in view.new_columns:
        COLUMN_OWNERS[column] = experiment.name
    EXPERIMENTS[experiment.name] = experiment
    return experiment


def _same_setting(a: Option, b: Option) -> bool:
    """Two declarations of one setting that differ only in what they say to the user or check for one
    experiment (probing's --layers counts from 0): the same name, type and default."""
    return (a.type, a.default, a.nargs, a.switch) == (b.type, b.default, b.nargs, b.switch)


def option_default(name: str):
    return OWN_OPTIONS[name].default


# --- the experiments' own options (an option several experiments share is declared once here) -----------


def _multiplier_range(value, _) -> list[str]:
    low, high = value
    if 0 < low <= 1 <= high < float("inf"):
        return []
    return [f"{low:g} {high:g} must be positive, finite and contain 1 (the baseline every study starts with)"]


def _block_size(size, limits: Limits) -> list[str]:
    if 1 <= size <= limits.num_layers:
        return []
    return [f"{size} is outside 1..{limits.num_layers} for {limits.model} ({limits.num_layers} layers)"]


K = Option("k", "restrict the kept-layer counts (default 0..L)", type=int, nargs="+", check=each(in_layers(0)),
           bad=("-1",))
LAYERS = Option("layers", "layers 1..L to use (default all)", type=int, nargs="+", check=each(in_layers(1)),
                bad=("0",))
BLOCK_SIZE = Option("block_size", "consecutive layers per block (default 3)", type=int, default=3,
                    check=_block_size, bad=("0",))
HEADS = Option("heads", "head indices 0..H-1 to reset (default all)", type=int, nargs="+", check=each(in_heads),
               bad=("-1",))
PERMUTATIONS = Option("permutations", "how many layer orders (default 10)", type=int, default=10,
                      check=at_least(1), bad=("0",))
LR_MULTIPLIER = Option("lr_multiplier", "learning rate of reinitialized layers over the base rate (default 5)",
                       type=float, default=5.0, check=positive, bad=("0",))
INTERMEDIATE_TASKS = Option("intermediate_tasks", "tasks finetuned first (default: the same as --tasks)",
                            type=str, nargs="+", check=each(known_task), bad=("nope",))
SEARCH = "lr-multipliers search (one Optuna study per cell: task x size x k)"
NUM_SAMPLES = Option("num_samples", "trials per cell, the study's budget; the first is every multiplier at 1 "
                     "(default 8)", type=int, default=8, check=at_least(1), bad=("0",), group=SEARCH)
MULTIPLIER_RANGE = Option("multiplier_range", "log-uniform range of each multiplier, must contain 1 (default 0.1 "
                          "10)", type=float, nargs=2, metavar=("LOW", "HIGH"), default=(0.1, 10.0),
                          check=_multiplier_range, bad=("2", "10"), group=SEARCH, repeats=True)
GROUP = Option("group", "layer: one multiplier per encoder layer (default); reinit-vs-kept: two, one for the "
               "reinitialized layers and one for the kept ones", type=str, default="layer",
               choices=("layer", "reinit-vs-kept"), bad=("nope",), group=SEARCH)
VAL_FRACTION = Option("val_fraction", "share of each training subset held out (never trained on) to measure the "
                      "search's objective; the dev split is only reported (default 0.2)", type=float, default=0.2,
                      check=fraction, bad=("1",), group=SEARCH)
SUBLAYERS = ("attention", "feed-forward")  # trainables.ablations.SUBLAYERS
SUBLAYER_PARTS = Option("sublayers", "which blocks of each layer to reset, one at a time (default both)",
                        type=str, nargs="+", default=SUBLAYERS, choices=SUBLAYERS, bad=("pooler",))
PARITIES = Option("parities", "odd: layers 1, 3, 5, ... reset; even: 2, 4, 6, ... (default both)", type=str,
                  nargs="+", default=("odd", "even"), choices=("odd", "even"), bad=("third",))
PROBING = "probing (the frozen model, a probe per layer 0..L; `--layers` picks some)"
PROBE_LAYERS = dataclasses.replace(LAYERS, help="layers 0..L to probe (0: the embeddings; default all)",
                                   check=each(in_layers(0)), bad=("-1",))
PROBE_KINDS = ("mean-pool", "cls-pooler", "truncated")  # trainables.probing.PROBES
PROBES = Option("probes", "mean-pool: the paper's (mean over real tokens -> linear; default); cls-pooler: the "
                "original code's ([CLS] -> frozen pooler -> linear); truncated: the course report's (layers 1..k "
                "frozen, pooler + linear trained on top)", type=str, nargs="+", default=("mean-pool",),
                choices=PROBE_KINDS, bad=("nope",), group=PROBING)
PATIENCE = Option("patience", "early stopping: epochs without a better validation loss (default 5)", type=int,
                  default=5, check=at_least(1, " epoch"), bad=("0",), group=PROBING)
MAX_PROBE_EPOCHS = Option("max_probe_epochs", "epoch limit per probe (default 40, the paper's)", type=int,
                          default=40, check=at_least(1), bad=("0",), group=PROBING)
PROBE_LR = Option("probe_lr", "AdamW learning rate of the probe (default 1e-3)", type=float, default=1e-3,
                  check=positive, bad=("0",), group=PROBING)
PROBE_VAL_FRACTION = Option("probe_val_fraction", "share of each training subset held out for early stopping "
                            "(default 0.1; the dev split is never used for it)", type=float, default=0.1,
                            check=fraction, bad=("1",), group=PROBING)


# --- grids: each gets the grid settings, the model's layer count and (heads) its attention heads ---------


def kept_counts(grid, num_layers: int) -> tuple[int, ...]:
    return grid.k if grid.k is not None else tuple(range(num_layers + 1))


def incremental(grid, num_layers: int, num_heads: int | None = None, experiment: str = "incremental",
                keep_layernorm: bool = False, **extra) -> list:
    """Keep layers 1..k pretrained, reinitialize the rest, for every k (paper section 4.1)."""
    return [grid.trial(experiment, task, size, t,
                       grid.reinit(range(k + 1, num_layers + 1), keep_layernorm=keep_layernorm), k=k, **extra)
            for task, size, t in grid.cells() for k in kept_counts(grid, num_layers)]


def layernorm(grid, num_layers: int, num_heads: int | None = None) -> list:
    """Incremental, but reinitialized layers keep their pretrained LayerNorm (paper appendix G, Figure 8)."""
    return incremental(grid, num_layers, experiment="layernorm", keep_layernorm=True)


def reinit_lr(grid, num_layers: int, num_heads: int | None = None) -> list:
    """Incremental, with the reinitialized layers at `lr_multiplier` times the learning rate (Figure 7)."""
    return incremental(grid, num_layers, experiment="reinit-lr", lr_multiplier=float(grid.lr_multiplier))


def localized(grid, num_layers: int, num_heads: int | None = None) -> list:
    """Blocks of `block_size` consecutive layers at every start: the block reinitialized (block-reinit), or
    only the block kept pretrained (block-preserve) (paper section 4.2, Figure 3)."""
    size = grid.block_size
    specs = []
    for task, n, t in grid.cells():
        for mode in ("block-reinit", "block-preserve"):
            for start in range(1, num_layers - size + 2):
                block = range(start, start + size)
                layers = block if mode == "block-reinit" else [i for i in range(1, num_layers + 1) if i not in block]
                own = {"block_mode": mode, "block_start": start, "block_size": size}
                specs.append(grid.trial("localized", task, n, t, grid.reinit(layers), own))
    return specs


def single_layer(grid, num_layers: int, num_heads: int | None = None) -> list:
    """Exactly one layer reinitialized, each layer in turn (Figure 6)."""
    return [grid.trial("single-layer", task, n, t, grid.reinit([layer]), {"layer": layer})
            for task, n, t in grid.cells() for layer in grid.layers or range(1, num_layers + 1)]


def permutation(grid, num_layers: int, num_heads: int | None = None) -> list:
    """All layers pretrained, in a shuffled order (Figure 4, Table 1). The n-th permutation's seed is the base
    seed plus n, so it is the same layer order for every task and size, and results pair across tasks by
    `permutation_index`. Trial index t trains every permutation on the same subset."""
    permute = grid.surgery("permute")
    return [grid.trial("permutation", task, n, t, permute.from_seed(grid.seed + index, num_layers),
                       {"permutation_index": index, "permutation_seed": grid.seed + index})
            for task, n, t in grid.cells() for index in range(grid.permutations)]


def heads(grid, num_layers: int, num_heads: int | None = None) -> list:
    """One attention head reinitialized, over layer x head, plus the same model with no head reset (layer
    and head null: the baseline) per task, size and trial."""
    if num_heads is None:
        raise ValueError("the heads experiment needs the model's number of attention heads")
    head = grid.surgery("head")
    specs = []
    for task, n, t in grid.cells():
        specs.append(grid.trial("heads", task, n, t, grid.reinit([]), {"layer": None, "head": None}))
        for layer in grid.layers or range(1, num_layers + 1):
            for h in grid.heads if grid.heads is not None else range(num_heads):
                specs.append(grid.trial("heads", task, n, t, head(layer=layer, head=h, mode=grid.reinit_mode),
                                        {"layer": layer, "head": h}))
    return specs


def sequential(grid, num_layers: int, num_heads: int | None = None) -> list:
    """Finetune on an intermediate task, then on the final task: the final x intermediate matrix, with
    direct finetuning (no intermediate task; intermediate_task null) on the diagonal."""
    return [grid.trial("sequential", task, n, t, grid.reinit([]), intermediate_task=None if first == task else first,
                       row_fields=("intermediate_task",))
            for task, n, t in grid.cells() for first in dict.fromkeys([task, *(grid.intermediate_tasks or grid.tasks)])]


def probing(grid, num_layers: int, num_heads: int | None = None) -> list:
    """The frozen model probed at every layer 0..L (0 = the embeddings) with each probe, on the subsets of
    the finetuning trials (trial index t: the same subset). One row per (task, size, trial, probe, layer);
    `epochs` is the early-stopping limit and `lr` the probe's (sweep.probing runs them, a subset at a time)."""
    layers = grid.layers if grid.layers is not None else range(num_layers + 1)
    return [grid.trial("probing", task, n, t, grid.surgery("reinit")(),
                       {"probe": probe, "layer": layer, "patience": grid.patience,
                        "val_fraction": grid.probe_val_fraction},
                       epochs=grid.max_probe_epochs, lr=grid.probe_lr, lr_schedule="constant")
            for task, n, t in grid.cells() for probe in grid.probes for layer in layers]


def lr_multipliers(grid, num_layers: int, num_heads: int | None = None) -> list:
    """The incremental grid's cells (layers 1..k kept, the rest reinitialized), each one an Optuna study over
    per-layer learning-rate multipliers that sweep.search runs: a spec here is a cell, not a trial."""
    low, high = grid.multiplier_range
    return [grid.trial("lr-multipliers", task, size, t, grid.reinit(range(k + 1, num_layers + 1)),
                       {"group": grid.group, "multiplier_low": float(low), "multiplier_high": float(high),
                        "val_size": min(size - 1, max(1, round(grid.val_fraction * size)))}, k=k)
            for task, size, t in grid.cells() for k in kept_counts(grid, num_layers)]


def sublayer(grid, num_layers: int, num_heads: int | None = None) -> list:
    """Only the attention block or only the feed-forward block of one layer reinitialized, over layer x block,
    plus the full model (layer and sublayer null) per task, size and trial."""
    block = grid.surgery("sublayer")
    specs = []
    for task, n, t in grid.cells():
        specs.append(grid.trial("sublayer", task, n, t, grid.reinit([]), {"layer": None, "sublayer": None}))
        for layer in grid.layers or range(1, num_layers + 1):
            for part in grid.sublayers:
                specs.append(grid.trial("sublayer", task, n, t, block((layer,), part, mode=grid.reinit_mode),
                                        {"layer": layer, "sublayer": part}))
    return specs


def alternate(grid, num_layers: int, num_heads: int | None = None) -> list:
    """Every other layer reinitialized: the odd layers (1, 3, ...) or the even ones (2, 4, ...), as the
    original authors' code could."""
    first = {"odd": 1, "even": 2}
    return [grid.trial("alternate", task, n, t, grid.reinit(range(first[parity], num_layers + 1, 2)),
                       {"parity": parity})
            for task, n, t in grid.cells() for parity in grid.parities]


def embeddings(grid, num_layers: int, num_heads: int | None = None) -> list:
    """Only the embeddings reinitialized, every layer kept: what the pretrained embeddings carry that the
    layers cannot make up for (against the full model)."""
    return [grid.trial("embeddings", task, n, t, grid.surgery("embeddings")()) for task, n, t in grid.cells()]


def scratch(grid, num_layers: int, num_heads: int | None = None) -> list:
    """The floor: every layer and the embeddings reinitialized (incremental k = 0 keeps the embeddings)."""
    ablation = grid.surgery("scratch")(tuple(range(1, num_layers + 1)), grid.reinit_mode, grid.reinit_pooler)
    return [grid.trial("scratch", task, n, t, ablation) for task, n, t in grid.cells()]


# --- checks across an experiment's options ----------------------------------------------------------------


def probing_problems(grid, limits: Limits) -> list[str]:
    problems = []
    if "squad_v2" in grid.tasks:
        problems.append("--tasks: probing trains a sentence classifier per layer and cannot take squad_v2 "
                        "(question answering); every finetuning experiment can")
    if 0 < grid.probe_val_fraction < 1 and (word := size_below(grid, 2)):
        problems.append(f"{word} leaves nothing to train a probe on beside the held-out part; probing needs at "
                        "least 2 examples")
    if not limits.has_pooler and set(grid.probes) - {"mean-pool"}:
        problems.append(f"--probes: {', '.join(sorted(set(grid.probes) - {'mean-pool'}))} read the pooler; "
                        f"'{limits.model}' {limits.no_pooler()}; allowed for it: mean-pool")
    return problems


def search_problems(grid, limits: Limits) -> list[str]:
    if 0 < grid.val_fraction < 1 and (word := size_below(grid, 2)):
        return [f"{word} leaves nothing to train on beside the held-out part; lr-multipliers needs at least 2 "
                "examples"]
    return []


def sequential_problems(grid, limits: Limits) -> list[str]:
    """Sizes from --fractions (known once the splits are read) that an intermediate task's train split cannot
    give: a cell finetunes on it first at the final task's size (sweep.cli refuses --sizes beyond a split)."""
    split = dict(grid.train_split_sizes)
    if not grid.fractions or not split:
        return []
    problems = []
    for task in grid.tasks:
        for size in grid.sizes_for(task):
            fraction = grid.fraction_of(task, size)
            word = f"--fractions: {fraction:g} ({task}: {size} examples)" if fraction else f"--sizes: {size}"
            problems += [f"{word} is larger than the {first} train split ({split[first]:,} examples), which the "
                         f"{first} -> {task} cell trains on first at that size (--intermediate-tasks)"
                         for first in dict.fromkeys(grid.intermediate_tasks or grid.tasks)
                         if first != task and (task, size) not in grid.skip and size > split.get(first, size)]
    return list(dict.fromkeys(problems))


def size_below(grid, least: int) -> str | None:
    """A subset size of the grid under `least`, as it was given: '--sizes: 1', or '--fractions: 1e-05 (sst2: 1
    examples)' once the train splits are read (the plan checks again then); None if there is none."""
    for task in grid.tasks:
        for size in grid.known_sizes(task):
            if size < least:
                fraction = grid.fraction_of(task, size)
                return f"--fractions: {fraction:g} ({task}: {size} examples)" if fraction else f"--sizes: {size}"
    return None


# --- the registry ---------------------------------------------------------------------------------------

# Probing and searches run each unit once, without checkpoints: a failed unit is an error row that the next run
# retries (a restarted search trial would report to its study twice, a probe group reruns whole in seconds).
RESTARTS = ("max_failures", "checkpoint_every", "keep_checkpoints")
# The values of ignored settings that ask for what the units do anyway (no restart, no checkpoint): accepted.
AS_THEY_RUN = {"max_failures": 0, "checkpoint_every": None, "keep_checkpoints": False}

PAPER_5K = dict(sizes=[5000], skip=[])  # the paper's single-size experiments: 5k examples, every task
FINETUNED = (*CELL, "reinit_mode")

# k in 0..L at 500/5k/50k (no 50k for CoLA); 50 trials at 500, else 3: the generic paper preset.
register(Experiment("incremental", incremental, "keep layers 1..k pretrained, reinitialize the rest (Figure 2)",
                    View((*FINETUNED, "k"), finetunes=True), (K,)))
register(Experiment("reinit-lr", reinit_lr, "incremental, reinitialized layers at a higher learning rate (Figure 7)",
                    View((*FINETUNED, "lr_multiplier", "k"), finetunes=True), (K, LR_MULTIPLIER)))
register(Experiment("layernorm", layernorm, "incremental, reinitialized layers keep their LayerNorm (Figure 8)",
                    View((*FINETUNED, "keep_layernorm", "k"), finetunes=True), (K,),
                    {"paper": dict(PAPER_5K, trials=["3"])}))
register(Experiment("localized", localized, "a block of consecutive layers reinitialized, or only it kept (Figure 3)",
                    View((*FINETUNED, "block_mode", "block_size", "block_start"), finetunes=True), (BLOCK_SIZE,),
                    {"paper": dict(PAPER_5K, trials=["10"])}))
register(Experiment("single-layer", single_layer, "exactly one layer reinitialized, each in turn (Figure 6)",
                    View((*FINETUNED, "layer"), finetunes=True), (LAYERS,), {"paper": dict(PAPER_5K, trials=["3"])}))
register(Experiment("permutation", permutation, "every layer pretrained, in a shuffled order (Figure 4, Table 1)",
                    View((*CELL, "permutation"), sample="permutation"), (PERMUTATIONS,),
                    {"paper": dict(PAPER_5K, trials=["1"], permutations=10), "demo": dict(trials=["1"], permutations=4)},
                    surgery=("permute",), ignores=("reinit_mode", "reinit_pooler")))
# From the course reports (no grid given there): every layer x head, 5k, 3 trials.
register(Experiment("heads", heads, "one attention head reinitialized, over layer x head",
                    View((*FINETUNED, "layer", "head"), finetunes=True, reset_column="head"), (LAYERS, HEADS),
                    {"paper": dict(PAPER_5K, trials=["3"]), "demo": dict(trials=["1"], layers=[1, 6], heads=[0, 6])},
                    surgery=("reinit", "head"), ignores=("reinit_pooler",)))
# From the course reports: the SST-2/CoLA/QNLI matrix at 5k, 3 trials.
register(Experiment("sequential", sequential, "finetune on an intermediate task, then on the final one",
                    View((*CELL, "intermediate_task")), (INTERMEDIATE_TASKS,), {"paper": dict(PAPER_5K, trials=["3"])},
                    problems=sequential_problems))
# Paper appendix E and the original scripts: probes train on each task's full training split, 8 trials per
# layer (they differ in the held-out carve, the head's draw, dropout and batch order).
register(Experiment("probing", probing, "the frozen model probed at every layer 0..L (dashed lines of Figure 2)",
                    View((*CELL, "probe", "layer")),
                    (PROBE_LAYERS, PROBES, PATIENCE, MAX_PROBE_EPOCHS, PROBE_LR, PROBE_VAL_FRACTION),
                    {"paper": dict(sizes=[], fractions=[1.0], trials=["8"], skip=[]), "demo": dict(trials=["2"])},
                    runner="sweep.probing:run_probing", layerwise=False, problems=probing_problems,
                    ignores=("epochs", "lr", "lr_schedule", "max_grad_norm", "reinit_mode", "reinit_pooler",
                             *RESTARTS)))
# Ours (the paper only tried 5x): one study per incremental cell at 500 examples; demo: two cells (k=0 stays
# at chance at the base rate, k=3 learns already: room for the search either way, a few minutes).
register(Experiment("lr-multipliers", lr_multipliers, "an Optuna search over per-layer learning-rate multipliers, "
                    "per incremental cell", View((*CELL, "k", "group", "multipliers")),
                    (K, NUM_SAMPLES, MULTIPLIER_RANGE, GROUP, VAL_FRACTION),
                    {"paper": dict(sizes=[500], trials=["1"], skip=[]), "demo": dict(sizes=[500], trials=["1"], k=[0, 3])},
                    runner="sweep.search:run_searches", plan="sweep.search:plan_searches", problems=search_problems,
                    ignores=RESTARTS, trials_per_spec="num_samples"))
register(Experiment("sublayer", sublayer, "only the attention or only the feed-forward block of one layer reinitialized",
                    View((*FINETUNED, "sublayer", "layer"), finetunes=True, reset_column="sublayer",
                         title="Attention or feed-forward block of one layer reinitialized",
                         note="Only the named block of the layer (with its LayerNorm) is reinitialized; the full model "
                              "(sublayer empty) is the same grid's baseline.", x="layer", series="sublayer",
                         new_columns=(("sublayer", "string"),)),
                    (LAYERS, SUBLAYER_PARTS), {"paper": dict(PAPER_5K, trials=["3"]), "demo": dict(trials=["1"], layers=[1, 6])},
                    surgery=("reinit", "sublayer"), ignores=("reinit_pooler",)))
register(Experiment("alternate", alternate, "every other layer reinitialized: the odd ones or the even ones",
                    View((*FINETUNED, "parity"), finetunes=True, title="Every other layer reinitialized (odd or even "
                         "layers)", x="parity", new_columns=(("parity", "string"),)),
                    (PARITIES,), {"paper": dict(PAPER_5K, trials=["3"]), "demo": dict(trials=["1"])}))
register(Experiment("scratch", scratch, "every layer and the embeddings reinitialized: the floor",
                    View(FINETUNED, finetunes=True, title="From scratch: every layer and the embeddings reinitialized",
                         note="The floor: against incremental k = 0 (embeddings only, the reference lines), what the "
                              "pretrained embeddings alone carry.", new_columns=(("reinit_embeddings", "bool"),)),
                    presets={"paper": dict(PAPER_5K, trials=["3"]), "demo": dict(trials=["1"])}, surgery=("scratch",)))
register(Experiment("embeddings", embeddings, "only the embeddings reinitialized, every layer kept",
                    View((*FINETUNED, "reinit_embeddings"), finetunes=True, reset_column="reinit_embeddings",
                         title="Only the embeddings reinitialized, every layer kept",
                         note="Word, position and token-type embeddings (and their LayerNorm) drawn afresh; every "
                              "layer and the pooler pretrained. Against the full model (the reference line)."),
                    presets={"paper": dict(PAPER_5K, trials=["3"]), "demo": dict(trials=["1"])},
                    surgery=("embeddings",), ignores=("reinit_mode", "reinit_pooler")))

VIEWS: dict[str, View] = {name: e.view for name, e in EXPERIMENTS.items()}
KNOWN_EXPERIMENTS = tuple(EXPERIMENTS)
FINETUNE_EXPERIMENTS = tuple(name for name, view in VIEWS.items() if view.finetunes)
EXPERIMENT_COLUMNS = {name: list(view.columns) for name, view in VIEWS.items()}
RESET_COLUMNS = tuple(dict.fromkeys(v.reset_column for v in VIEWS.values() if v.reset_column))
GENERIC = tuple(name for name, view in VIEWS.items() if view.title)  # tables and figures made from the entry
NEW_COLUMNS = tuple(column for view in VIEWS.values() for column in view.new_columns)
