"""The grid a sweep asks for, as one frozen value (`GridSettings`), and how an experiment's grid turns it into
trials. Every setting is declared once, as a field here (the grid's), in trialrows.recipe (training) or in
the experiment's registry entry (its own options, trialrows.experiments); the command line, config files,
the Python API and the checks are made from those declarations (sweep.config, sweep.cli)."""
from __future__ import annotations

import dataclasses

import numpy as np

from sweep.grid import TrialSpec
from trainables.ablations import ABLATIONS, REINIT_MODES, Reinit
from trialrows.declare import Option, declared, each, known_task, setting
from trialrows.experiments import EXPERIMENTS, OWN_OPTIONS, Experiment  # noqa: F401  (the registry, re-exported)
from trialrows.recipe import TRAIN, Recipe, default_epochs, default_max_length, recipe_version, resolve_precision

TASK = "your own task (use its NAME in --tasks)"


def _sizes(size, _) -> list[str]:
    return [] if size > 0 else [f"{size} is not a positive number of training examples"]


def _fractions(f, _) -> list[str]:
    return [] if 0 < f <= 1 else [f"{f} is outside (0, 1]; give a share of the train split"]


def trial_count(word: str) -> tuple[int, int]:
    """One --trials word: '3' (every size) or 'SIZE=COUNT' (e.g. 500=50), as (size or 0, count)."""
    if isinstance(word, (tuple, list)) and len(word) == 2:  # already (size, count)
        word = trial_word(word)
    size, _, count = str(word).rpartition("=")
    try:
        pair = (int(size) if size else 0, int(count))
    except ValueError:
        raise ValueError(f"'{word}' is neither a count nor SIZE=COUNT (e.g. 3 or 500=50)") from None
    if pair[1] < 1:
        raise ValueError(f"'{word}' asks for {pair[1]} trials; give at least 1")
    if size and pair[0] < 1:
        raise ValueError(f"'{word}' names size {pair[0]}; give a positive size")
    return pair


def trial_word(pair) -> str:
    size, count = pair
    return f"{size}={count}" if size else str(count)


def _trials(pairs, _) -> list[str]:
    sizes = [size for size, _ in pairs]
    twice = sorted({trial_word((s, 0)).split("=")[0] for s in sizes if sizes.count(s) > 1})
    if not twice:
        return []
    return [f"{'a count for every size' if t == '0' else f'size {t}'} is given twice "
            f"({' '.join(trial_word(p) for p in pairs)}); give one count per size" for t in twice]


def skipped_cell(word: str) -> tuple[str, int]:
    """One cell left out of the grid, 'TASK=SIZE' (the paper left out cola=50000)."""
    if isinstance(word, (tuple, list)) and len(word) == 2:  # already (task, size)
        word = f"{word[0]}={word[1]}"
    task, _, size = str(word).partition("=")
    if not task or not size.isdigit():
        raise ValueError(f"'{word}' is not TASK=SIZE (e.g. cola=50000)")
    return task, int(size)


def task_file(word: str):
    """One --task-file word: NAME=DIR or NAME=hub:DATASET[:CONFIG], then optionally its own columns:
    `,text=A[+B]`, `,label=C`, `,splits=TRAIN+DEV`, `,metric=M` (the --text-columns, --label-column,
    --splits and --metric of the other task files are the defaults)."""
    from trainables.tasks import TaskSource

    if isinstance(word, TaskSource):
        return word
    if isinstance(word, dict):  # a config file's mapping
        return task_file_mapping(word)
    name, _, rest = str(word).partition("=")
    parts, own = rest.split(","), {}
    location = [parts[0]]
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if eq and key in TASK_FILE_KEYS:
            own[TASK_FILE_KEYS[key]] = tuple(value.split("+")) if key in ("text", "splits") else value
        else:  # a comma inside the folder's own name
            location.append(part)
    return TaskSource(name, ",".join(location), own.get("text_columns", ()), own.get("label_column", ""),
                      own.get("splits"), own.get("metric"))


TASK_FILE_KEYS = {"text": "text_columns", "label": "label_column", "splits": "splits", "metric": "metric"}
TASK_FILE_FIELDS = ("name", "location", "text_columns", "label_column", "splits", "metric")


def task_file_mapping(word: dict):
    """A config file's task file: its fields by name (what the sweep's own config file writes), or by the
    command line's short keys (text, label): `text: review` was refused with Python's "unexpected keyword
    argument", which listed nothing allowed."""
    from trainables.tasks import TaskSource

    given: dict = {}
    for key, value in word.items():
        field = TASK_FILE_KEYS.get(key, key)
        if field not in TASK_FILE_FIELDS:
            raise ValueError(f"{key!r} is not a key of a task file; allowed: {', '.join(TASK_FILE_FIELDS)} (or the "
                             "command line's text, label)")
        if field in given:
            raise ValueError(f"{field} is given twice in one task file, as {field} and as {key}; keep one")
        given[field] = value
    if not given.get("name") or not given.get("location"):
        raise ValueError(f"a task file needs a name and a location (a folder or hub:DATASET); given {word}")
    split = lambda v: tuple(v.split("+")) if isinstance(v, str) else tuple(v or ())  # noqa: E731 ("A+B" or [A, B])
    return TaskSource(str(given["name"]), str(given["location"]), split(given.get("text_columns")),
                      str(given.get("label_column") or ""), split(given["splits"]) if given.get("splits") else None,
                      given.get("metric"))


def task_file_written(source) -> dict:
    return {"name": source.name, "location": source.location, "text_columns": list(source.text_columns),
            "label_column": source.label_column, "splits": list(source.splits) if source.splits else None,
            "metric": source.metric}


# Rows keep seeds as 64-bit integers, some of them the base seed plus an index (permutation_seed): a base seed
# past that range would train and then lose its rows.
SEED_LIMIT = 2**32


def _seed_range(v, _) -> list[str]:
    return [] if 0 <= v < SEED_LIMIT else [f"{v} must be at least 0 and below 2**32 ({SEED_LIMIT:,})"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GridSettings(Recipe):
    """What a sweep asks for (after presets), whatever the experiment: the model, tasks, subsets, trials and
    the training recipe (the Recipe fields), and the experiment's own options in `own`, read by name
    (`grid.k`, `grid.parities`: the given value, else the option's declared default)."""

    model: str = setting(help="hub name, local folder, or 'minilm' (the offline MiniLM package)",
                         bad=("/no/such/model",))
    tasks: tuple[str, ...] = setting(help="GLUE names (sst2 cola qnli rte mrpc stsb wnli), squad_v2 (question "
                                     "answering), synthetic, or a --task-file NAME", check=each(known_task),
                                     bad=("nope",))
    data_dir: str | None = setting(None, "a local GLUE folder (SST-2/train.tsv, ...; for squad_v2 the official "
                                   "train-v2.0.json and dev-v2.0.json); default: the hub", bad=("/no/such/folder",))
    task_files: tuple = setting((), "define task NAME from a folder holding a train and a dev file (.csv, .tsv, "
                                ".jsonl or .parquet), or from a hub dataset: NAME=hub:DATASET[:CONFIG]; its own "
                                "columns after commas: ,text=A[+B] ,label=C ,splits=TRAIN+DEV ,metric=M",
                                flag="--task-file", type=task_file, nargs="+", metavar="NAME=DIR[,text=..,label=..]",
                                bad=("own=/no/such/folder",), group=TASK, show=lambda v: [task_file_written(s) for s in v])
    sizes: tuple[int, ...] = setting(help="training subset sizes", check=each(_sizes), bad=("0",))
    trials: tuple[tuple[int, int], ...] = setting(((0, 3),), "trials per size: N, or SIZE=N items (e.g. 500=50 "
                                                  "3); default 3", type=trial_count, nargs="+", check=_trials,
                                                  bad=("0",), show=lambda v: [trial_word(p) for p in v])
    fractions: tuple[float, ...] = setting((), "subset sizes as fractions of each task's train split, in (0, 1] "
                                           "(e.g. 0.01 0.1 1.0); replaces the preset's --sizes unless --sizes is "
                                           "given too", check=each(_fractions), bad=("0",))
    seed: int = setting(0, "base seed: trial i's subset and model seeds are drawn from (seed, i), so sweeps with "
                        "different --seed share no subset, weight draw or batch order (default 0)", check=_seed_range,
                        bad=(str(SEED_LIMIT),))
    skip: tuple[tuple[str, int], ...] = setting((), "cells left out of the grid, TASK=SIZE (the paper preset's "
                                                "cola=50000)", type=skipped_cell, nargs="*", cli=False,
                                                show=lambda v: [f"{t}={s}" for t, s in v])
    reinit_mode: str = setting("intended", "intended: the paper's description; paper-code: the original code's "
                               "quirks", choices=REINIT_MODES, bad=("nope",), group=TRAIN)
    reinit_pooler: bool = setting(False, "also reinitialize the pooler", group=TRAIN)
    own: tuple[tuple[str, object], ...] = ()  # the experiment's own options given (the rest: their defaults)
    train_split_sizes: tuple[tuple[str, int], ...] = ()  # task -> train split size, for fractions
    # What the trials will read (sweep.fingerprints): task -> its data's fingerprint, and the weights'; empty
    # in a dry run, which reads neither.
    data_fingerprints: tuple[tuple[str, str], ...] = ()
    model_fingerprint: str | None = None

    def __getattr__(self, name: str):
        """An experiment's own option: given, else its declared default."""
        if name.startswith("__") or name in ("own",):
            raise AttributeError(name)
        given = dict(self.own)
        if name in given:
            return given[name]
        if name in OWN_OPTIONS:
            return OWN_OPTIONS[name].default
        raise AttributeError(f"{type(self).__name__} has no setting '{name}'")

    def option(self, name: str):
        return getattr(self, name)

    @classmethod
    def of(cls, **values) -> "GridSettings":
        """Settings from keyword values, an experiment's own options among them (`GridSettings.of(k=(0, 2))`)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        own = tuple((k, v) for k, v in values.items() if k not in fields)
        return cls(**{k: v for k, v in values.items() if k in fields}, own=own)

    @property
    def sources(self) -> dict:
        """The user's tasks (trainables.tasks.TaskSource) by name, usable in `tasks`."""
        return {source.name: source for source in self.task_files}

    def trials_for(self, size: int) -> int:
        counts = dict(self.trials)
        return counts.get(size, counts.get(0, 0))

    def strays(self) -> tuple[tuple, tuple]:
        """(--trials pairs, --skip cells) that name no cell of the grid: a size or task it does not have. None
        where sizes come from --fractions (known once the splits are read)."""
        if self.fractions:
            return (), ()
        return (tuple(p for p in self.trials if p[0] and p[0] not in self.sizes),
                tuple(c for c in self.skip if c[0] not in self.tasks or c[1] not in self.sizes))

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

    def sizes_for(self, task: str) -> tuple[int, ...]:
        """The task's subset sizes: `sizes`, then each fraction of its train split (at least one example)."""
        split = dict(self.train_split_sizes)
        if self.fractions and task not in split:
            raise ValueError(f"--fractions needs the size of the {task} train split, which is not known")
        from_fractions = [max(1, round(f * split[task])) for f in self.fractions]
        return tuple(dict.fromkeys([*self.sizes, *from_fractions]))

    def known_sizes(self, task: str) -> tuple[int, ...]:
        """The task's subset sizes known so far: `sizes`, and the fractions' once its train split is read."""
        return self.sizes_for(task) if not self.fractions or task in dict(self.train_split_sizes) else self.sizes

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

    @staticmethod
    def surgery(kind: str):
        """The ablation class of a kind (trainables.ablations.ABLATIONS), for an experiment's grid."""
        return ABLATIONS[kind]

    def trial(self, experiment: str, task: str, size: int, trial_index: int, ablation, own_columns: dict | None = None,
              **extra) -> TrialSpec:
        return trial(self, experiment, task, size, trial_index, ablation, own_columns, **extra)


# The task-file columns that every --task-file without its own takes; inputs to GridSettings.task_files.
TASK_FILE_DEFAULTS = (
    Option("text_columns", "the text column, or two for a pair (default of every --task-file)", type=str, nargs="+",
           metavar="COLUMN", bad=("a", "b", "c"), group=TASK, saved=False),
    Option("label_column", "class names (strings or integers), or numbers for regression (default of every "
           "--task-file)", type=str, metavar="COLUMN", bad=("label",), group=TASK, saved=False),
    Option("splits", "file names without suffix, or hub split names (default: train dev; hub: train validation)",
           type=str, nargs=2, metavar=("TRAIN", "DEV"), bad=("train", "dev"), group=TASK, saved=False),
    Option("metric", "headline metric: accuracy, macro_f1, f1 (two classes), matthews_correlation, or pearson, "
           "spearman (regression); default: accuracy for classes (macro_f1 reported too), pearson for numbers "
           "(spearman too)", type=str, bad=("accuracy",), group=TASK, saved=False),
)
GRID = declared(GridSettings)


TRIAL_SEED_STREAM = 0x7121A1  # keeps trial seeds apart from every other use of the same base seed


def trial_seeds(base_seed: int, trial_index: int) -> tuple[int, int]:
    """(subset_seed, seed) of a trial index: drawn from SeedSequence(base seed, trial index), so every
    condition of one index shares them (the paired design) while two base seeds share no subset, no weight
    draw and no batch order (with base + index, `--seed 1` repeated trials 1..n-1 of `--seed 0`)."""
    # 32 bits: what every consumer takes (numpy's legacy RandomState inside Optuna's sampler stops there).
    state = np.random.SeedSequence([TRIAL_SEED_STREAM, int(base_seed), int(trial_index)]).generate_state(2, np.uint32)
    return int(state[0]), int(state[1])


def trial(settings: GridSettings, experiment: str, task: str, size: int, trial_index: int, ablation,
          own_columns: dict | None = None, **extra) -> TrialSpec:
    """A trial with the settings' common fields; the trial index alone sets both seeds, so every condition
    of one index trains on the same subset with the same head and batch order (a paired design). `own_columns`
    are the experiment's own row columns; `extra` sets TrialSpec fields, a recipe field over the grid's."""
    own_columns = dict(own_columns or {})
    subset_seed, seed = trial_seeds(settings.seed, trial_index)
    fraction = settings.fraction_of(task, size)
    if fraction is not None:
        own_columns["train_fraction"] = fraction
    if task in settings.sources:  # which columns were read is part of what the trial computes
        own_columns.update(settings.sources[task].columns())
    fingerprints = dict(settings.data_fingerprints)
    read = [t for t in (extra.get("intermediate_task"), task) if t is not None]
    recipe = {**settings.recipe(), "epochs": settings.epochs or default_epochs(size),
              "max_length": settings.max_length or default_max_length([*settings.tasks, *(settings.intermediate_tasks or ())]),
              "precision": resolve_precision(settings.precision, 0.0)}  # resolved by the sweep; auto: CPU
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
        own_columns=tuple(own_columns.items()),
        data_fingerprint="+".join(fingerprints[t] for t in read) if fingerprints else None,
        model_fingerprint=settings.model_fingerprint,
        recipe_version=recipe_version(read),
        **{**recipe, **extra},
    )

