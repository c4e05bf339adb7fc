"""The experiment registry: everything about an experiment in one entry of EXPERIMENTS: its grid builder, its
own options (each declared once, with its type, default, help and allowed values), its presets, the checks
across its options and its runner. The command line, its validation, `--help` and dry-run counts are made
from the entries; see the README's "Adding an experiment"."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from sweep.grid import TrialSpec
from sweep.options import Limits, Option, at_least, each, fraction, in_heads, in_layers, known_task, positive
from trainables.ablations import SUBLAYERS, HeadReinit, Permute, Reinit, Scratch, SublayerReinit
from trainables.finetune import default_epochs

# --- the experiments' own options (an option several experiments share is declared once here) -----------


def _multiplier_range(value, _) -> list[str]:
    low, high = value
    if 0 < low <= 1 <= high < float("inf"):
        return []
    return [f"{low:g} {high:g} must be positive, finite and contain 1 (the baseline every study starts with)"]


def _block_size(size, limits) -> list[str]:
    if 1 <= size <= limits.num_layers:
        return []
    return [f"{size} is outside 1..{limits.num_layers} for {limits.model} ({limits.num_layers} layers)"]


K = Option("--k", "restrict the kept-layer counts (default 0..L)", type=int, nargs="+", check=each(in_layers(0)),
           bad=("-1",))
LAYERS = Option("--layers", "layers 1..L to use (default all)", type=int, nargs="+", check=each(in_layers(1)),
                bad=("0",))
BLOCK_SIZE = Option("--block-size", "consecutive layers per block (default 3)", type=int, default=3,
                    check=_block_size, bad=("0",))
HEADS = Option("--heads", "head indices 0..H-1 to reset (default all)", type=int, nargs="+", check=each(in_heads),
               bad=("-1",))
PERMUTATIONS = Option("--permutations", "how many layer orders (default 10)", type=int, default=10,
                      check=at_least(1), bad=("0",))
LR_MULTIPLIER = Option("--lr-multiplier", "learning rate of reinitialized layers over the base rate (default 5)",
                       type=float, default=5.0, check=lambda v, _: [] if 0 < v < float("inf") else [
                           f"{v} must be positive and finite"], bad=("0",))
INTERMEDIATE_TASKS = Option("--intermediate-tasks", "tasks finetuned first (default: the same as --tasks)",
                            nargs="+", check=each(known_task), bad=("nope",))
SEARCH = "lr-multipliers search (one Optuna study per cell: task x size x k)"
NUM_SAMPLES = Option("--num-samples", "trials per cell, the study's budget; the first is every multiplier at 1 "
                     "(default 8)", type=int, default=8, check=at_least(1), bad=("0",), group=SEARCH)
MULTIPLIER_RANGE = Option("--multiplier-range", "log-uniform range of each multiplier, must contain 1 (default 0.1 "
                          "10)", type=float, nargs=2, metavar=("LOW", "HIGH"), default=(0.1, 10.0),
                          check=_multiplier_range, bad=("2", "10"), group=SEARCH)
GROUP = Option("--group", "layer: one multiplier per encoder layer (default); reinit-vs-kept: two, one for the "
               "reinitialized layers and one for the kept ones", default="layer", choices=("layer", "reinit-vs-kept"),
               bad=("nope",), group=SEARCH, field="multiplier_group")
VAL_FRACTION = Option("--val-fraction", "share of each training subset held out (never trained on) to measure the "
                      "search's objective; the dev split is only reported (default 0.2)", type=float, default=0.2,
                      check=fraction, bad=("1",), group=SEARCH)
SUBLAYER_PARTS = Option("--sublayers", "which blocks of each layer to reset, one at a time (default both)",
                        nargs="+", default=SUBLAYERS, choices=SUBLAYERS, bad=("pooler",))
PARITIES = Option("--parities", "odd: layers 1, 3, 5, ... reset; even: 2, 4, 6, ... (default both)", nargs="+",
                  default=("odd", "even"), choices=("odd", "even"), bad=("third",))
PROBING = "probing (the frozen model, a probe per layer 0..L; `--layers` picks some)"
PROBE_LAYERS = dataclasses.replace(LAYERS, help="layers 0..L to probe (0: the embeddings; default all)",
                                   check=each(in_layers(0)), bad=("-1",))


def _probes_help() -> str:
    return ("mean-pool: the paper's (mean over real tokens -> linear; default); cls-pooler: the original code's "
            "([CLS] -> frozen pooler -> linear); truncated: the course report's (layers 1..k frozen, pooler + "
            "linear trained on top)")


def _probe_names() -> tuple[str, ...]:
    from trainables.probing import PROBES

    return tuple(PROBES)


PROBES = Option("--probes", _probes_help(), nargs="+", default=("mean-pool",), choices=_probe_names(),
                bad=("nope",), group=PROBING)
PATIENCE = Option("--patience", "early stopping: epochs without a better validation loss (default 5)", type=int,
                  default=5, check=at_least(1, " epoch"), bad=("0",), group=PROBING)
MAX_PROBE_EPOCHS = Option("--max-probe-epochs", "epoch limit per probe (default 40, the paper's)", type=int,
                          default=40, check=at_least(1), bad=("0",), group=PROBING)
PROBE_LR = Option("--probe-lr", "AdamW learning rate of the probe (default 1e-3)", type=float, default=1e-3,
                  check=positive, bad=("0",), group=PROBING)
PROBE_VAL_FRACTION = Option("--probe-val-fraction", "share of each training subset held out for early stopping "
                            "(default 0.1; the dev split is never used for it)", type=float, default=0.1,
                            check=fraction, bad=("1",), group=PROBING)


@dataclasses.dataclass(frozen=True)
class GridSettings:
    """What a user chose on the command line (after presets), independent of any experiment."""

    model: str
    tasks: tuple[str, ...]
    sizes: tuple[int, ...]
    trials: tuple[tuple[int, int], ...]  # (train size, trials at that size); size 0 = every other size
    data_dir: str | None = None  # a local GLUE folder; None: the hub (the synthetic task is built in)
    k: tuple[int, ...] | None = None  # None: 0..L
    skip: frozenset = frozenset()  # (task, size) cells left out, as the paper left out CoLA at 50k
    epochs: int | None = None  # None: the paper's rule by subset size
    lr: float = 2e-5
    batch_size: int = 8
    max_length: int = 128
    weight_decay: float = 0.0
    lr_schedule: str = "linear"
    max_grad_norm: float = 1.0  # 0: no clipping
    precision: str = "fp32"
    eval_every: int = 0  # 0: the dev split after the last epoch only
    reinit_mode: str = "intended"
    reinit_pooler: bool = False
    seed: int = 0  # base of every trial's seeds (trial_seeds)
    # Options of particular experiments.
    block_size: int = BLOCK_SIZE.default  # localized: consecutive layers per block
    layers: tuple[int, ...] | None = None  # single-layer, heads: which layers (1-based); None: all
    heads: tuple[int, ...] | None = None  # heads: which heads (0-based); None: all
    permutations: int = PERMUTATIONS.default  # permutation: how many layer orders
    lr_multiplier: float = LR_MULTIPLIER.default  # reinit-lr: the reinitialized layers' lr over the base lr
    intermediate_tasks: tuple[str, ...] | None = None  # sequential: None: the same as `tasks`
    multiplier_range: tuple[float, float] = MULTIPLIER_RANGE.default  # lr-multipliers: the log-uniform search range
    multiplier_group: str = GROUP.default  # lr-multipliers: one multiplier per "layer", or "reinit-vs-kept" (two)
    val_fraction: float = VAL_FRACTION.default  # lr-multipliers: share of each training subset held out for the objective
    probes: tuple[str, ...] = PROBES.default  # probing: which probes (trainables.probing.PROBES)
    patience: int = PATIENCE.default  # probing: epochs without a better validation loss before a probe stops
    max_probe_epochs: int = MAX_PROBE_EPOCHS.default  # probing: the paper's limit
    probe_lr: float = PROBE_LR.default  # probing: AdamW learning rate of the probe (only the probe trains)
    probe_val_fraction: float = PROBE_VAL_FRACTION.default  # probing: share of each training subset held out for early stopping
    fractions: tuple[float, ...] = ()  # train sizes as fractions of each task's train split (see sizes_for)
    train_split_sizes: tuple[tuple[str, int], ...] = ()  # task -> train split size, for fractions
    task_sources: tuple = ()  # the user's tasks (trainables.tasks.TaskSource), usable by name in `tasks`
    # What the trials will read (sweep.fingerprints): task -> its data's fingerprint, and the weights'; empty
    # in a dry run, which reads neither.
    data_fingerprints: tuple[tuple[str, str], ...] = ()
    model_fingerprint: str | None = None
    # Options only one experiment has, by name: an experiment's own option needs no field here.
    own: tuple[tuple[str, object], ...] = ()

    def option(self, name: str):
        """An experiment's own option: given, else its declared default."""
        given = dict(self.own)
        if name in given:
            return given[name]
        return next(o.default for e in EXPERIMENTS.values() for o in e.options if o.setting == name)

    def trials_for(self, size: int) -> int:
        counts = dict(self.trials)
        return counts.get(size, counts.get(0, 0))

    def fraction_of(self, task: str, size: int) -> float | None:
        """The fraction a size came from (None for sizes given as counts)."""
        split = dict(self.train_split_sizes)
        for f in self.fractions:
            if task in split and max(1, round(f * split[task])) == size and size not in self.sizes:
                return f
        return None

    def source_for(self, task: str) -> str:
        # The kind of source, not the folder, is part of a trial's identity: moving the data keeps ids.
        if task in self.sources:
            return "hub-dataset" if self.sources[task].is_hub else "file"
        return "synthetic" if task == "synthetic" else ("local" if self.data_dir else "hub")

    @property
    def sources(self) -> dict:
        return {source.name: source for source in self.task_sources}

    def sizes_for(self, task: str) -> tuple[int, ...]:
        """The task's subset sizes: `sizes`, then each fraction of its train split (at least one example)."""
        split = dict(self.train_split_sizes)
        if self.fractions and task not in split:
            raise ValueError(f"--fractions needs the size of the {task} train split, which is not known")
        from_fractions = [max(1, round(f * split[task])) for f in self.fractions]
        return tuple(dict.fromkeys([*self.sizes, *from_fractions]))

    def cells(self):
        """(task, size, trial_index) in a stable order."""
        for task in self.tasks:
            for size in self.sizes_for(task):
                if (task, size) in self.skip:
                    continue
                for trial_index in range(self.trials_for(size)):
                    yield task, size, trial_index

    def reinit(self, layers, **options) -> Reinit:
        return Reinit(layers=tuple(layers), mode=self.reinit_mode, reinit_pooler=self.reinit_pooler, **options)


TRIAL_SEED_STREAM = 0x7121A1  # keeps trial seeds apart from every other use of the same base seed


def trial_seeds(base_seed: int, trial_index: int) -> tuple[int, int]:
    """(subset_seed, seed) of a trial index: drawn from SeedSequence(base seed, trial index), so every
    condition of one index shares them (the paired design) while two base seeds share no subset, no weight
    draw and no batch order (with base + index, `--seed 1` repeated trials 1..n-1 of `--seed 0`)."""
    # 32 bits: what every consumer takes (numpy's legacy RandomState inside Optuna's sampler stops there).
    state = np.random.SeedSequence([TRIAL_SEED_STREAM, int(base_seed), int(trial_index)]).generate_state(2, np.uint32)
    return int(state[0]), int(state[1])


def trial(settings: GridSettings, experiment: str, task: str, size: int, trial_index: int, ablation,
          own_columns: dict | None = None, **extra):
    """A trial with the settings' common fields; the trial index alone sets both seeds, so every condition
    of one index trains on the same subset with the same head and batch order (a paired design). `own_columns`
    are the experiment's own row columns."""
    own_columns = dict(own_columns or {})
    subset_seed, seed = trial_seeds(settings.seed, trial_index)
    fraction = settings.fraction_of(task, size)
    if fraction is not None:
        own_columns["train_fraction"] = fraction
    if task in settings.sources:  # which columns were read is part of what the trial computes
        own_columns.update(settings.sources[task].columns())
    fingerprints = dict(settings.data_fingerprints)
    read = [t for t in (extra.get("intermediate_task"), task) if t is not None]
    return TrialSpec(
        experiment=experiment,
        task=task,
        model=settings.model,
        data_source=settings.source_for(task),
        train_size=size,
        trial_index=trial_index,
        subset_seed=subset_seed,
        seed=seed,
        ablation=ablation,
        epochs=settings.epochs or default_epochs(size),
        lr=settings.lr,
        batch_size=settings.batch_size,
        max_length=settings.max_length,
        weight_decay=settings.weight_decay,
        lr_schedule=settings.lr_schedule,
        max_grad_norm=settings.max_grad_norm,
        precision=settings.precision,
        eval_every=settings.eval_every,
        own_columns=tuple(own_columns.items()),
        data_fingerprint="+".join(fingerprints[t] for t in read) if fingerprints else None,
        model_fingerprint=settings.model_fingerprint,
        **extra,
    )


def incremental(settings: GridSettings, num_layers: int, num_heads: int | None = None,
                experiment: str = "incremental", keep_layernorm: bool = False, **extra) -> list[TrialSpec]:
    """Keep layers 1..k pretrained, reinitialize the rest, for every k (paper section 4.1)."""
    ks = settings.k if settings.k is not None else tuple(range(num_layers + 1))
    return [
        trial(settings, experiment, task, size, t,
              settings.reinit(range(k + 1, num_layers + 1), keep_layernorm=keep_layernorm), k=k, **extra)
        for task, size, t in settings.cells()
        for k in ks
    ]


def layernorm(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """Incremental, but reinitialized layers keep their pretrained LayerNorm (paper appendix G, Figure 8)."""
    return incremental(settings, num_layers, experiment="layernorm", keep_layernorm=True)


def reinit_lr(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """Incremental, with the reinitialized layers at `lr_multiplier` times the learning rate (Figure 7)."""
    return incremental(settings, num_layers, experiment="reinit-lr", lr_multiplier=float(settings.lr_multiplier))


def localized(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """Blocks of `block_size` consecutive layers at every start: the block reinitialized (block-reinit), or
    only the block kept pretrained (block-preserve) (paper section 4.2, Figure 3)."""
    size = settings.block_size
    specs = []
    for task, n, t in settings.cells():
        for mode in ("block-reinit", "block-preserve"):
            for start in range(1, num_layers - size + 2):
                block = range(start, start + size)
                layers = block if mode == "block-reinit" else [i for i in range(1, num_layers + 1) if i not in block]
                own_columns = {"block_mode": mode, "block_start": start, "block_size": size}
                specs.append(trial(settings, "localized", task, n, t, settings.reinit(layers), own_columns))
    return specs


def single_layer(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """Exactly one layer reinitialized, each layer in turn (Figure 6)."""
    layers = settings.layers or tuple(range(1, num_layers + 1))
    return [
        trial(settings, "single-layer", task, n, t, settings.reinit([layer]), {"layer": layer})
        for task, n, t in settings.cells()
        for layer in layers
    ]


def permutation_seed(settings: GridSettings, index: int) -> int:
    """The seed of the n-th permutation: the base seed plus n (0 is a valid seed)."""
    return settings.seed + index


def permutation(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """All layers pretrained, in a shuffled order (Figure 4, Table 1). The n-th permutation depends only on
    the base seed and n, so it is the same layer order for every task and size, and results pair across
    tasks by `permutation_index`. `--trials` trials per permutation; trial index t trains every permutation
    on the same subset, so within an index only the layer order differs."""
    specs = []
    for task, n, t in settings.cells():
        for index in range(settings.permutations):
            seed = permutation_seed(settings, index)
            ablation = Permute.from_seed(seed, num_layers)
            own_columns = {"permutation_index": index, "permutation_seed": seed}
            specs.append(trial(settings, "permutation", task, n, t, ablation, own_columns))
    return specs


def heads(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """One attention head reinitialized, over layer x head, plus the same model with no head reset (layer
    and head null: the baseline) per task, size and trial."""
    if num_heads is None:
        raise ValueError("the heads experiment needs the model's number of attention heads")
    layers = settings.layers or tuple(range(1, num_layers + 1))
    head_ids = settings.heads if settings.heads is not None else tuple(range(num_heads))
    specs = []
    for task, n, t in settings.cells():
        specs.append(trial(settings, "heads", task, n, t, settings.reinit([]), {"layer": None, "head": None}))
        for layer in layers:
            for head in head_ids:
                ablation = HeadReinit(layer=layer, head=head, mode=settings.reinit_mode)
                specs.append(trial(settings, "heads", task, n, t, ablation, {"layer": layer, "head": head}))
    return specs


def sequential(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """Finetune on an intermediate task, then on the final task: the final x intermediate matrix, with
    direct finetuning (no intermediate task; intermediate_task null) on the diagonal."""
    intermediates = settings.intermediate_tasks or settings.tasks
    specs = []
    for task, n, t in settings.cells():
        for first in dict.fromkeys([task, *intermediates]):
            specs.append(trial(settings, "sequential", task, n, t, settings.reinit([]),
                               intermediate_task=None if first == task else first, row_fields=("intermediate_task",)))
    return specs


def probing(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """The frozen model probed at every layer 0..L (0 = the embeddings) with each probe, on the subsets of
    the finetuning trials (trial index t: the same subset). One row per (task, size, trial, probe, layer);
    `epochs` is the early-stopping limit and `lr` the probe's (sweep.probing runs them, a subset at a time)."""
    layers = settings.layers if settings.layers is not None else tuple(range(num_layers + 1))
    return [
        dataclasses.replace(
            trial(settings, "probing", task, n, t, Reinit(),
                  {"probe": probe, "layer": layer, "patience": settings.patience,
                   "val_fraction": settings.probe_val_fraction}),
            epochs=settings.max_probe_epochs, lr=settings.probe_lr, lr_schedule="constant")
        for task, n, t in settings.cells()
        for probe in settings.probes
        for layer in layers
    ]


def lr_multipliers(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """The incremental grid's cells (layers 1..k kept, the rest reinitialized), each one an Optuna study over
    per-layer learning-rate multipliers that sweep.search runs: a spec here is a cell, not a trial."""
    low, high = settings.multiplier_range
    ks = settings.k if settings.k is not None else tuple(range(num_layers + 1))
    specs = []
    for task, size, t in settings.cells():
        own_columns = {"group": settings.multiplier_group, "multiplier_low": float(low), "multiplier_high": float(high),
                  "val_size": min(size - 1, max(1, round(settings.val_fraction * size)))}
        specs += [trial(settings, "lr-multipliers", task, size, t, settings.reinit(range(k + 1, num_layers + 1)),
                        own_columns, k=k) for k in ks]
    return specs


def probing_problems(settings: GridSettings, limits: Limits) -> list[str]:
    problems = []
    if "squad_v2" in settings.tasks:
        problems.append("--tasks: probing trains a sentence classifier per layer and cannot take squad_v2 "
                        "(question answering); every finetuning experiment can")
    if 0 < settings.probe_val_fraction < 1 and 0 < min(settings.sizes, default=2) < 2:
        problems.append(f"--sizes: {min(settings.sizes)} leaves nothing to train a probe on beside the held-out "
                        "part; probing needs at least 2 examples")
    if not limits.has_pooler and set(settings.probes) - {"mean-pool"}:
        problems.append(f"--probes: {', '.join(sorted(set(settings.probes) - {'mean-pool'}))} read the pooler; "
                        f"'{limits.model}' is a '{limits.model_type}' model, whose classifier has no pretrained "
                        "pooler; allowed for it: mean-pool")
    return problems


def search_problems(settings: GridSettings, limits: Limits) -> list[str]:
    if 0 < settings.val_fraction < 1 and min(settings.sizes, default=2) < 2:
        return [f"--sizes: {min(settings.sizes)} leaves nothing to train on beside the held-out part; "
                "lr-multipliers needs at least 2 examples"]
    return []


def sublayer(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """Only the attention block or only the feed-forward block of one layer reinitialized, over layer x block,
    plus the full model (layer and sublayer null) per task, size and trial."""
    layers = settings.layers or tuple(range(1, num_layers + 1))
    specs = []
    for task, n, t in settings.cells():
        specs.append(trial(settings, "sublayer", task, n, t, settings.reinit([]), {"layer": None, "sublayer": None}))
        for layer in layers:
            for part in settings.option("sublayers"):
                ablation = SublayerReinit((layer,), part, mode=settings.reinit_mode)
                specs.append(trial(settings, "sublayer", task, n, t, ablation, {"layer": layer, "sublayer": part}))
    return specs


def alternate(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """Every other layer reinitialized: the odd layers (1, 3, ...) or the even ones (2, 4, ...), as the
    original authors' code could."""
    first = {"odd": 1, "even": 2}
    return [
        trial(settings, "alternate", task, n, t, settings.reinit(range(first[parity], num_layers + 1, 2)),
              {"parity": parity})
        for task, n, t in settings.cells()
        for parity in settings.option("parities")
    ]


def scratch(settings: GridSettings, num_layers: int, num_heads: int | None = None) -> list[TrialSpec]:
    """The floor: every layer and the embeddings reinitialized (incremental k = 0 keeps the embeddings)."""
    ablation = Scratch(tuple(range(1, num_layers + 1)), settings.reinit_mode, settings.reinit_pooler)
    return [trial(settings, "scratch", task, n, t, ablation) for task, n, t in settings.cells()]


@dataclasses.dataclass(frozen=True)
class Experiment:
    build: Callable[..., list[TrialSpec]]  # (settings, num_layers, num_heads) -> the grid
    summary: str = ""  # one line for `--help`
    options: tuple[Option, ...] = ()  # its own options, beside every experiment's (sweep.cli.COMMON_OPTIONS)
    # Per preset name, the grid options this experiment's preset sets over the generic preset.
    presets: dict = dataclasses.field(default_factory=dict)
    # "module:function" that runs this experiment's specs instead of sweep.runner.run_trials (same keyword
    # arguments), for experiments whose trials are not one finetuning run each (probing, searches).
    runner: str | None = None
    # False: the experiment needs no layers of their own, so models that share one set across layers
    # (ALBERT) can run it.
    layerwise: bool = True
    problems: Callable[[GridSettings, Limits], list[str]] | None = None  # checks across its options
    # "module:function" (specs, folder, options) -> (to run, planned rows, statuses a rerun skips, the table
    # printed at the end), for experiments whose specs are not trials (a search's cells); None: the specs are.
    plan: str | None = None

    def run_function(self) -> Callable:
        return _function(self.runner or "sweep.runner:run_trials")

    def plan_function(self) -> Callable | None:
        return _function(self.plan) if self.plan else None


def _function(name: str) -> Callable:
    import importlib

    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


_PAPER_5K = dict(sizes=[5000], skip=frozenset())
EXPERIMENTS: dict[str, Experiment] = {
    # k in 0..L at 500/5k/50k (no 50k for CoLA); 50 trials at 500, else 3: the generic paper preset.
    "incremental": Experiment(incremental, "keep layers 1..k pretrained, reinitialize the rest (Figure 2)", (K,)),
    "reinit-lr": Experiment(reinit_lr, "incremental, reinitialized layers at a higher learning rate (Figure 7)",
                            (K, LR_MULTIPLIER)),
    "layernorm": Experiment(layernorm, "incremental, reinitialized layers keep their LayerNorm (Figure 8)", (K,),
                            {"paper": dict(_PAPER_5K, trials=["3"])}),
    "localized": Experiment(localized, "a block of consecutive layers reinitialized, or only it kept (Figure 3)",
                            (BLOCK_SIZE,), {"paper": dict(_PAPER_5K, trials=["10"])}),
    "single-layer": Experiment(single_layer, "exactly one layer reinitialized, each in turn (Figure 6)", (LAYERS,),
                               {"paper": dict(_PAPER_5K, trials=["3"])}),
    "permutation": Experiment(permutation, "every layer pretrained, in a shuffled order (Figure 4, Table 1)",
                              (PERMUTATIONS,), {"paper": dict(_PAPER_5K, trials=["1"], permutations=10),
                                                "demo": dict(trials=["1"], permutations=4)}),
    # From the course reports (no grid given there): every layer x head, 5k, 3 trials.
    "heads": Experiment(heads, "one attention head reinitialized, over layer x head", (LAYERS, HEADS),
                        {"paper": dict(_PAPER_5K, trials=["3"]),
                         "demo": dict(trials=["1"], layers=[1, 6], heads=[0, 6])}),
    # From the course reports: the SST-2/CoLA/QNLI matrix at 5k, 3 trials.
    "sequential": Experiment(sequential, "finetune on an intermediate task, then on the final one",
                             (INTERMEDIATE_TASKS,), {"paper": dict(_PAPER_5K, trials=["3"])}),
    # Paper appendix E and the original scripts: probes train on each task's full training split, 8 trials
    # per layer (they differ in the held-out carve, the head's draw, dropout and batch order).
    "probing": Experiment(probing, "the frozen model probed at every layer 0..L (dashed lines of Figure 2)",
                          (PROBE_LAYERS, PROBES, PATIENCE, MAX_PROBE_EPOCHS, PROBE_LR, PROBE_VAL_FRACTION),
                          {"paper": dict(sizes=[], fractions=[1.0], trials=["8"], skip=frozenset()),
                           "demo": dict(trials=["2"])},
                          runner="sweep.probing:run_probing", layerwise=False, problems=probing_problems),
    # Ours (the paper only tried 5x): one study per incremental cell at 500 examples; demo: two cells.
    "lr-multipliers": Experiment(lr_multipliers, "an Optuna search over per-layer learning-rate multipliers, per "
                                 "incremental cell", (K, NUM_SAMPLES, MULTIPLIER_RANGE, GROUP, VAL_FRACTION),
                                 {"paper": dict(sizes=[500], trials=["1"], skip=frozenset()),
                                  # k=0 stays at chance at the base rate, k=3 learns already: room for the
                                  # search either way, a few minutes.
                                  "demo": dict(sizes=[500], trials=["1"], k=[0, 3])},
                                 runner="sweep.search:run_searches", problems=search_problems,
                                 plan="sweep.search:plan_searches"),
    "sublayer": Experiment(sublayer, "only the attention or only the feed-forward block of one layer reinitialized",
                           (LAYERS, SUBLAYER_PARTS), {"paper": dict(_PAPER_5K, trials=["3"]),
                                                      "demo": dict(trials=["1"], layers=[1, 6])}),
    "alternate": Experiment(alternate, "every other layer reinitialized: the odd ones or the even ones", (PARITIES,),
                            {"paper": dict(_PAPER_5K, trials=["3"]), "demo": dict(trials=["1"])}),
    "scratch": Experiment(scratch, "every layer and the embeddings reinitialized: the floor",
                          presets={"paper": dict(_PAPER_5K, trials=["3"]), "demo": dict(trials=["1"])}),
}
