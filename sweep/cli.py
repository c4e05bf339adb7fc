"""`python -m sweep <experiment>`: build the grid, skip what is done, run the rest on Ray, land Parquet rows."""
from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time
from pathlib import Path

from sweep.checks import (address_problems, cannot_start, data_dir_problems, gpu_problems, storage_access_problems,
                          storage_problems)
from sweep.experiments import EXPERIMENTS, PROBES, GridSettings
from sweep.options import Limits, Option, at_least, each, known_task, non_negative, parse_groups, positive
from sweep.grid import TrialSpec, data_key
from sweep.estimate import DEVICES
from sweep.packs import parse_pack
from sweep.precision import (DEFAULT_MAX_TRIALS, DEFAULT_PILOT, MEAN, PAIRED, grid_settings, option_problems,
                             precision_sweep)
from sweep.runner import CHECKPOINT_EVERY
from sweep.status import main as status_main
from sweep.status import record_plan
from sweep.store import FINISHED, finished_trial_ids, parent, rows_dir, sweep_dir

# Each preset fills in whatever the command line leaves unset; "demo" is the embedded offline default.
PRESETS = {
    # Demo: every layer reinitialized (k=0) or every layer kept (k=6), one trial each, 500 examples, 3 epochs:
    # two trials, one per core, show the finding in about three minutes (docs/benchmarks.md, "Demo"; on 300
    # examples the kept model reached 0.64 in one of two trials).
    "demo": dict(model="minilm", tasks=["synthetic"], sizes=[500], trials=["1"], k=[0, 6], epochs=3),
    "paper": dict(
        model="bert-base-uncased",
        tasks=["sst2", "cola", "qnli"],
        sizes=[500, 5000, 50000],
        trials=["500=50", "3"],
        skip=frozenset({("cola", 50000)}),
    ),
}

# Layer, head and position counts of the paper's models, so that `--preset paper --dry-run` counts its grid offline.
KNOWN_SHAPES = {"bert-base-uncased": (12, 12, 512), "bert-base-cased": (12, 12, 512),
                "bert-large-uncased": (24, 16, 512)}
# GLUE's train split sizes (the hub's nyu-mll/glue), so that a dry run of sizes given as --fractions (the
# probing paper preset: full splits) counts offline too.
KNOWN_TRAIN_SIZES = {"sst2": 67349, "cola": 8551, "qnli": 104743, "rte": 2490, "mrpc": 3668, "stsb": 5749,
                     "wnli": 635, "squad_v2": 130319}
# The default --max-length: question answering's windows are Hugging Face's example's (384 tokens);
# sentences fit in 128. Batches are padded to their own longest sequence, so a sentence task run beside
# squad_v2 at 384 costs the same as at 128.
DEFAULT_MAX_LENGTH, QA_MAX_LENGTH = 128, 384


def parse_trials(values: list[str]) -> tuple[tuple[int, int], ...]:
    """'3' (every size) or 'SIZE=COUNT' items, e.g. `--trials 500=50 3`."""
    counts = []
    for value in values:
        size, _, count = value.rpartition("=")
        try:
            counts.append((int(size) if size else 0, int(count)))
        except ValueError:
            raise SystemExit(f"--trials: '{value}' is neither a count nor SIZE=COUNT (e.g. 3 or 500=50)")
        if counts[-1][1] < 1:
            raise SystemExit(f"--trials: '{value}' asks for {counts[-1][1]} trials; give at least 1")
    return tuple(counts)


def _storage_help() -> str:
    return ("where rows, logs and checkpoints go: a folder (default ./results; on a cluster one every node sees) or "
            "a URI: s3://bucket/prefix, gs://bucket/prefix, file:///path")


def _gpus(gpus, _) -> list[str]:
    if 0 <= gpus <= 1 or (gpus > 1 and float(gpus).is_integer()):
        return []
    return [f"{gpus} must be a share of one GPU in [0, 1] (e.g. 0.25) or a whole number of GPUs"]


def _max_length(length, limits) -> list[str]:
    if length >= 1 and (limits.max_positions is None or length <= limits.max_positions):
        return []
    most = f"1..{limits.max_positions}: {limits.model} has {limits.max_positions} positions" \
        if limits.max_positions else "at least 1"
    return [f"{length} is outside {most}"]


def _name(name, _) -> list[str]:
    if name not in ("", ".", "..") and "/" not in name and "\\" not in name:
        return []
    return [f"'{name}' must be one folder name (no '/', not '.' or '..'), made under --storage"]


def _sizes(size, _) -> list[str]:
    return [] if size > 0 else [f"{size} is not a positive number of training examples"]


def _fractions(f, _) -> list[str]:
    return [] if 0 < f <= 1 else [f"{f} is outside (0, 1]; give a share of the train split"]


def _trials(value, _) -> list[str]:
    try:
        parse_trials([value])
    except SystemExit as err:
        return [str(err.code).partition(": ")[2]]
    return []


TASK = "your own task (use its NAME in --tasks)"
TRAIN, RUN = "finetuning", "running"
PRECISION = "precision targets (Stein's two-stage procedure: a pilot per condition, then the count it needs)"
# Every experiment's options; each experiment adds its own (sweep.experiments).
COMMON_OPTIONS = (
    Option("--model", "hub name, local folder, or 'minilm' (the offline MiniLM package)", bad=("/no/such/model",)),
    Option("--tasks", "GLUE names (sst2 cola qnli rte mrpc stsb wnli), squad_v2 (question answering), synthetic, or "
           "a --task-file NAME", nargs="+", check=each(known_task), bad=("nope",)),
    Option("--data-dir", "a local GLUE folder (SST-2/train.tsv, ...; for squad_v2 the official train-v2.0.json and "
           "dev-v2.0.json); default: the hub", bad=("/no/such/folder",)),  # checked with the tasks (data_dir_problems)
    Option("--task-file", "define task NAME from a folder holding a train and a dev file (.csv, .tsv, .jsonl or "
           ".parquet), or from a hub dataset: NAME=hub:DATASET[:CONFIG]", nargs="+", metavar="NAME=DIR",
           bad=("own=/no/such/folder",), group=TASK),  # checked with its columns (task_file_problems)
    Option("--text-columns", "the text column, or two for a pair", nargs="+", metavar="COLUMN", bad=("a", "b", "c"),
           group=TASK),
    Option("--label-column", "class names (strings or integers), or numbers for regression", metavar="COLUMN",
           bad=("label",), group=TASK),  # refused without --task-file
    Option("--splits", "file names without suffix, or hub split names (default: train dev; hub: train validation)",
           nargs=2, metavar=("TRAIN", "DEV"), bad=("train", "dev"), group=TASK),  # refused without --task-file
    Option("--metric", "headline metric: accuracy, macro_f1, f1 (two classes), matthews_correlation, or pearson, "
           "spearman (regression); default: accuracy for classes (macro_f1 reported too), pearson for numbers "
           "(spearman too)", bad=("accuracy",), group=TASK),  # refused without --task-file
    Option("--sizes", "training subset sizes", type=int, nargs="+", check=each(_sizes), bad=("0",)),
    Option("--trials", "trials per size: N, or SIZE=N items (e.g. 500=50 3)", nargs="+", check=each(_trials),
           bad=("0",)),
    Option("--fractions", "subset sizes as fractions of each task's train split, in (0, 1] (e.g. 0.01 0.1 1.0); "
           "replaces the preset's --sizes unless --sizes is given too", type=float, nargs="+", check=each(_fractions),
           bad=("0",)),
    Option("--seed", "base seed: trial i's subset and model seeds are drawn from (seed, i), so sweeps with different "
           "--seed share no subset, weight draw or batch order (default 0)", type=int, default=0,
           check=at_least(0), bad=("-1",)),
    Option("--epochs", "default: 5 for subsets of <=500 examples, else 3", type=int, check=at_least(1), bad=("0",),
           group=TRAIN),
    Option("--lr", "learning rate (default 2e-5)", type=float, default=2e-5, check=positive, bad=("0",), group=TRAIN),
    Option("--batch-size", "examples per step (default 8)", type=int, default=8, check=at_least(1), bad=("0",),
           group=TRAIN),
    Option("--max-length", f"tokens per sequence, at most the model's positions (default {DEFAULT_MAX_LENGTH}; "
           f"{QA_MAX_LENGTH} when a task is squad_v2, whose contexts are split into windows of this length sharing "
           "a third of it)", type=int, check=_max_length, bad=("100000",), group=TRAIN),
    Option("--weight-decay", "AdamW weight decay (default 0)", type=float, default=0.0, check=non_negative,
           bad=("-1",), group=TRAIN),
    Option("--lr-schedule", "learning-rate schedule (default linear)", default="linear",
           choices=("linear", "constant"), bad=("cosine",), group=TRAIN),
    Option("--max-grad-norm", "clip each step's gradient to this global norm, as the paper's code (run_glue) did; "
           "0: no clipping (default 1.0)", type=float, default=1.0, check=non_negative, bad=("-1",), group=TRAIN),
    Option("--precision", "bf16: bfloat16 autocast; auto: bf16 when trials get a GPU, else fp32 (default auto)",
           default="auto", choices=("auto", "fp32", "bf16"), bad=("fp16",), group=TRAIN),
    Option("--eval-every", "evaluate the dev split every N epochs for per-epoch curves; 0: after the last epoch only, "
           "as the paper reports (default 0)", type=int, default=0, metavar="N", check=at_least(0), bad=("-1",),
           group=TRAIN),
    Option("--reinit-mode", "intended: the paper's description; paper-code: the original code's quirks",
           default="intended", choices=("intended", "paper-code"), bad=("nope",), group=TRAIN),
    Option("--reinit-pooler", "also reinitialize the pooler", action="store_true", group=TRAIN),
    Option("--gpus-per-trial", "a GPU share, e.g. 0.25; 0 = CPU", type=float, default=0.0, check=_gpus,
           bad=("1.5",), group=RUN),
    Option("--cpus-per-trial", "CPUs per trial (default 1)", type=float, default=1.0, check=positive, bad=("0",),
           group=RUN),
    Option("--address", "an existing Ray cluster (or 'auto'); default: start a local one",
           bad=("127.0.0.1:1",), group=RUN),  # checked by connecting (address_problems)
    Option("--storage", _storage_help(), default="./results", bad=("/dev/null/store",),
           group=RUN),  # checked by writing (storage_problems; a dry run asks the file system)
    Option("--name", "sweep name, a folder under --storage (default: the experiment)", check=_name, bad=("../x",),
           group=RUN),
    Option("--dry-run", "print the grid and run nothing", action="store_true", group=RUN),
    Option("--resume", "continue the sweep's interrupted Tune experiment: unfinished trials go on from their last "
           "checkpoints (default: finished trials are skipped, unfinished ones start over)", action="store_true",
           group=RUN),
    Option("--checkpoint-every", "checkpoint a trial (model, optimizer, progress) at the first epoch end at least "
           f"SECONDS after its last checkpoint; 0: every epoch; off: never (default {CHECKPOINT_EVERY:g})",
           type=lambda v: checkpoint_interval(v), default=CHECKPOINT_EVERY, metavar="SECONDS", bad=("-1",),
           group=RUN),  # its type refuses what it cannot take
    Option("--keep-checkpoints", "keep a finished trial's checkpoints (default: deleted once its row is written)",
           action="store_true", group=RUN),
    Option("--max-failures", "times a failed or preempted trial is restarted from its last checkpoint (default 2)",
           type=lambda v: failure_count(v), default=2, metavar="N", bad=("-1",), group=RUN),
    Option("--pack", "train up to N trials of the same task, size and schedule as one fused computation (one Tune "
           "trial, resources scaled to it, one row per trial); 1: each trial alone, unfused; auto: on CPUs each trial "
           "fused alone (the fused encoder is the faster there), on GPUs as many as fit in GPU memory; with "
           "--checkpoint-every below its default, as 1 (packs keep no checkpoint) (default auto). Sequential "
           "finetuning, searches and probing run unfused", type=parse_pack, default="auto", metavar="N|auto", bad=("0",), group=RUN),
    Option("--estimate-for", "the device a dry run's cost estimate is for: wall time and GPU-hours (core-hours on "
           "a CPU) from each trial's FLOPs, the device's peak and the store's measured MFU (default: cpu, or a100 "
           "with --gpus-per-trial)", choices=DEVICES, bad=("tpu",), group=RUN),
    Option("--target-ci", "run each condition until its 95%% interval has at most this half-width W (replaces "
           "--trials): a pilot of --pilot-trials, then as many trials as its spread needs", type=float,
           metavar="W", check=positive, bad=("0",), group=PRECISION),
    Option("--target-on", "mean: each condition's mean; paired: its difference against the full model on the same "
           "trial indices (default mean)", choices=(MEAN, PAIRED), bad=("median",), group=PRECISION),
    Option("--pilot-trials", f"n0: pilot trials per condition, at least 2 (default {DEFAULT_PILOT})", type=int,
           metavar="N0", check=at_least(2), bad=("1",), group=PRECISION),
    Option("--max-trials", f"the most trials of a condition; one stopped here says so (default {DEFAULT_MAX_TRIALS})",
           type=int, metavar="N", check=at_least(2), bad=("1",), group=PRECISION),
)


def options_of(experiment: str) -> tuple[Option, ...]:
    return (*COMMON_OPTIONS, *EXPERIMENTS[experiment].options)


def build_parser() -> argparse.ArgumentParser:
    """One sub-command per experiment, each with every experiment's options and its own (so that
    `python -m sweep EXPERIMENT --help` lists what that experiment takes)."""
    p = argparse.ArgumentParser(
        prog="python -m sweep",
        description="Partial-reinitialization finetuning sweeps on Ray Tune; one Parquet row per trial.",
        epilog="`python -m sweep EXPERIMENT --help`: that experiment's options. `python -m sweep status [--storage "
               "S] NAME`: what a sweep's store holds per cell and what a rerun would do, without starting Ray.",
    )
    experiments = p.add_subparsers(dest="experiment", metavar="experiment", required=True,
                                   help="which ablation grid to run: " + ", ".join(EXPERIMENTS))
    for name, experiment in EXPERIMENTS.items():
        sub = experiments.add_parser(name, help=experiment.summary, description=experiment.summary)
        sub.add_argument("--preset", choices=sorted(PRESETS), default="demo",
                         help="fills every grid option you leave unset (default: demo, offline MiniLM on the "
                              "built-in synthetic task; paper: the paper's grid on bert-base-uncased)")
        own = sub.add_argument_group(f"{name} options")
        for option in experiment.options:
            option.add_to(own, parsed_default(option))
        for title, options in parse_groups(COMMON_OPTIONS).items():
            group = sub.add_argument_group(title)
            for option in options:
                option.add_to(group, parsed_default(option))
    return p


def preset_filled() -> set[str]:
    """Options a preset may fill in: left unset by the parser, so that a preset can tell them from given."""
    names = {name for preset in PRESETS.values() for name in preset}
    names |= {name for e in EXPERIMENTS.values() for preset in e.presets.values() for name in preset}
    return names | {"max_length"}  # its default depends on the tasks


def parsed_default(option: Option):
    return None if option.dest in preset_filled() else option.default


def checkpoint_interval(value: str) -> float | None:
    """--checkpoint-every: seconds >= 0, or 'off'."""
    if value == "off":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number of seconds >= 0 (0: every epoch) or 'off'")
    return seconds


def failure_count(value: str) -> int:
    """--max-failures: a whole number >= 0."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"'{value}' is not a whole number of restarts >= 0")
    return int(value)


def option_values(args) -> dict:
    """The value in effect of every option of the experiment, by its dest: the command line's, else the
    presets', else the option's default."""
    preset = {**PRESETS[args.preset], **EXPERIMENTS[args.experiment].presets.get(args.preset, {})}
    if args.model is not None and args.model != preset["model"]:
        for name in ("k", "layers", "heads"):
            preset.pop(name, None)  # a preset's layer and head picks are chosen for its own model
    if any(getattr(args, name) is not None for name in ("model", "tasks", "sizes", "fractions")):
        preset.pop("epochs", None)  # a preset's short schedule is chosen for its own model, task and size
    if args.fractions is not None:
        preset["sizes"] = []  # fractions replace the preset's sizes; --sizes adds to them
    values = {}
    for option in options_of(args.experiment):
        given = getattr(args, option.dest)
        values[option.dest] = preset.get(option.dest, option.default) if given is None else given
    if values["max_length"] is None:
        values["max_length"] = default_max_length([*values["tasks"], *(values.get("intermediate_tasks") or ())])
    values["skip"] = preset.get("skip", frozenset())
    return values


def settings_from_args(args) -> GridSettings:
    values = option_values(args)
    fields = {f.name for f in dataclasses.fields(GridSettings)}
    chosen = {option.setting: values[option.dest] for option in options_of(args.experiment)
              if option.setting in fields}
    chosen = {name: tuple(v) if isinstance(v, list) else v for name, v in chosen.items()}
    own = tuple((o.setting, tuple(values[o.dest]) if isinstance(values[o.dest], list) else values[o.dest])
                for o in EXPERIMENTS[args.experiment].options if o.setting not in fields)
    return GridSettings(**{
        **chosen,
        "own": own,
        "trials": parse_trials(values["trials"]),
        "data_dir": str(Path(args.data_dir).resolve()) if args.data_dir else None,
        "skip": values["skip"],
        "precision": resolve_precision(values["precision"], values["gpus_per_trial"]),
        "probes": tuple(dict.fromkeys(values.get("probes") or PROBES.default)),
        "fractions": tuple(values["fractions"] or ()),
        "task_sources": task_sources(args),
    })


def task_sources(args) -> tuple:
    """The --task-file definitions; malformed ones are left to task_file_problems to report."""
    from trainables.tasks import HUB_PREFIX, TaskSource

    sources = []
    for item in args.task_file or ():
        name, _, location = item.partition("=")
        if name and location:
            location = location if location.startswith(HUB_PREFIX) else str(Path(location).expanduser().resolve())
            sources.append(TaskSource(name, location, tuple(args.text_columns or ()), args.label_column or "",
                                      tuple(args.splits) if args.splits else None, args.metric))
    return tuple(sources)


def task_file_problems(args) -> list[str]:
    from trainables.tasks import CLASS_METRICS, HUB_PREFIX, REGRESSION_METRICS, TASKS

    if not args.task_file:
        given = [(o, v) for o, v in (("--text-columns", args.text_columns), ("--label-column", args.label_column),
                                     ("--splits", args.splits), ("--metric", args.metric)) if v]
        return [f"{o}: only means something with --task-file NAME=DIR (given: {' '.join(v) if isinstance(v, list) else v})"
                for o, v in given]
    problems = []
    for item in args.task_file:
        name, _, location = item.partition("=")
        if not name or not location:
            problems.append(f"--task-file: '{item}' is not NAME=DIR or NAME=hub:DATASET[:CONFIG]")
        elif name in TASKS:
            problems.append(f"--task-file: '{name}' is a built-in task's name; choose another")
        elif not location.startswith(HUB_PREFIX) and not Path(location).expanduser().is_dir():
            problems.append(f"--task-file: '{location}' (task '{name}') is not a folder")
    if not args.text_columns or len(args.text_columns) > 2:
        problems.append(f"--text-columns: give one text column or two (a pair); got {len(args.text_columns or ())}")
    if not args.label_column:
        problems.append("--label-column: which column holds the labels; --task-file needs it")
    if args.metric is not None and args.metric not in (*CLASS_METRICS, *REGRESSION_METRICS):
        problems.append(f"--metric: '{args.metric}' is not one of {', '.join((*CLASS_METRICS, *REGRESSION_METRICS))}")
    return problems


def default_max_length(tasks) -> int:
    from trainables.tasks import SQUAD_V2

    return QA_MAX_LENGTH if SQUAD_V2 in tasks else DEFAULT_MAX_LENGTH


def resolve_precision(precision: str, gpus_per_trial: float) -> str:
    """`auto`: bf16 where trials get a GPU (tensor cores; the Trainer's usual choice there), fp32 on CPUs,
    where bf16 autocast is faster only on CPUs with bf16 instructions and the paper's numbers are fp32."""
    if precision != "auto":
        return precision
    return "bf16" if gpus_per_trial > 0 else "fp32"


def validate(settings: GridSettings, args, limits: Limits) -> list[str]:
    """Every problem with the request, each naming the option, the value and what is allowed."""
    problems = task_file_problems(args)
    values = option_values(args)
    for option in options_of(args.experiment):
        problems += option.problems(values[option.dest], limits)
    if not settings.sizes and not settings.fractions:
        problems.append("--sizes: no subset size given; give --sizes or --fractions")
    check = EXPERIMENTS[args.experiment].problems
    problems += check(settings, limits) if check else []
    problems += option_problems(args, EXPERIMENTS[args.experiment])
    # The folder as the user typed it: resolved, a path through a symbolic link would read as another one.
    problems += data_dir_problems(args.data_dir, [*settings.tasks, *(settings.intermediate_tasks or ())])
    return problems


def environment_problems(args, dry_run: bool) -> list[str]:
    """Whether the storage can be written, the cluster answers and asked-for GPUs exist. A dry run writes
    nothing: it asks the file system instead of writing a probe, and counts this machine's GPUs when no
    cluster is named (a cluster's are known once Ray connects)."""
    problems = address_problems(args.address)
    problems += storage_access_problems(args.storage) if dry_run else storage_problems(args.storage)
    if dry_run and args.address in (None, "", "local"):
        problems += gpu_problems(args.gpus_per_trial or 0.0, {"GPU": local_gpus()})
    return problems


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def model_limits(model: str, dry_run: bool) -> Limits:
    """The model's shape (layers, attention heads, positions, family), from its config."""
    from trainables.models import load_config

    if dry_run and model in KNOWN_SHAPES:  # counting needs no download (nor a network timeout)
        return Limits(model, *KNOWN_SHAPES[model], model_type="bert")
    config = load_config(model)
    positions = getattr(config, "max_position_embeddings", None)
    # Relative positions (DeBERTa without absolute ones) set no hard limit on the length.
    if getattr(config, "position_biased_input", True) is False:
        positions = None
    return Limits(model, int(config.num_hidden_layers), int(config.num_attention_heads),
                  int(positions) if positions else None, model_type=str(config.model_type))


def family_problems(limits: Limits, experiment: str, settings: GridSettings) -> list[str]:
    """Whether the model's family is supported, and supports this experiment and its pooler options."""
    from trainables.models import FAMILIES

    model, model_type = limits.model, limits.model_type
    if model_type not in FAMILIES:
        return [f"--model: '{model}' is a '{model_type}' model; supported families: {', '.join(FAMILIES)}"]
    reason = FAMILIES[model_type].not_layerwise
    if reason and EXPERIMENTS[experiment].layerwise:
        return [f"--model: '{model}' cannot run {experiment}: {reason}"]
    if FAMILIES[model_type].pooler is None and settings.reinit_pooler:
        return [f"--reinit-pooler: '{model}' is a '{model_type}' model, whose classifier has no pretrained pooler "
                "(its head is drawn fresh in every trial); leave it out"]
    return []


def buildable(model: str):
    """The model's pretrained weights, once a classifier has been built from them: a checkpoint whose
    weights do not fit its architecture is refused here, before Ray starts, not inside every trial."""
    from trainables.models import build_classifier, load_pretrained

    pretrained = load_pretrained(model)
    build_classifier(pretrained, num_labels=2, seed=0)
    return pretrained


def describe_grid(specs: list[TrialSpec]) -> str:
    counts = collections.Counter((s.task, s.train_size) for s in specs)
    lines = [f"{'task':<10} {'size':>7} {'trials':>7}"]
    lines += [f"{task:<10} {size:>7} {n:>7}" for (task, size), n in sorted(counts.items())]
    by_size = collections.Counter()
    for (_, size), n in counts.items():
        by_size[size] += n
    lines.append("total by size: " + ", ".join(f"{size}: {n:,}" for size, n in sorted(by_size.items())))
    lines.append(f"total: {len(specs):,} trials")
    return "\n".join(lines)


def load_raw_tasks(settings: GridSettings, tasks) -> dict:
    from trainables.tasks import load_task

    return {task: load_task(task, settings.data_dir, sources=settings.sources) for task in tasks}


def prepare_data(settings: GridSettings, specs: list[TrialSpec], raw: dict | None = None) -> dict:
    """Load and tokenize once for the whole sweep every task its trials train or evaluate on (the final and
    any intermediate task); trials share the result via Ray's object store."""
    from trainables.data import tokenize_task
    from trainables.models import load_tokenizer
    from trainables.qa import tokenize_qa_task
    from trainables.tasks import SQUAD_V2

    needed = {}  # task -> the largest subset any trial draws from it
    for spec in specs:
        for task in spec.tasks:
            needed[task] = max(needed.get(task, 0), spec.train_size)
    raw = {**load_raw_tasks(settings, [t for t in needed if t not in (raw or {})]), **(raw or {})}
    for task, size in needed.items():
        if size > len(raw[task].train):
            raise SystemExit(f"--sizes: {size} is larger than the {task} train split ({len(raw[task].train):,} examples)")
    tokenizer = load_tokenizer(settings.model)
    cache = tokenized_cache()

    def tokenize(task):  # question answering has its own windows (trainables.qa), not cached
        if task == SQUAD_V2:
            return tokenize_qa_task(raw[task], tokenizer, settings.model, settings.max_length)
        return tokenize_task(raw[task], tokenizer, settings.model, settings.max_length, cache)

    return {data_key(task, settings.max_length): tokenize(task)
            for task in needed}


def tokenized_cache() -> Path:
    """Where tokenized splits are kept between sweeps: in `datasets`' cache (HF_DATASETS_CACHE moves it)."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "reinit-sweep-tokenized"


def refuse(problems: list[str]) -> int:
    print(cannot_start(problems), file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["status"]:
        return status_main(argv[1:])
    args = build_parser().parse_args(argv)
    experiment = EXPERIMENTS[args.experiment]
    try:
        settings = settings_from_args(args)
    except SystemExit as err:  # --trials it cannot read
        return refuse([str(err.code)])
    try:
        limits = model_limits(settings.model, args.dry_run)
    except (OSError, ValueError) as err:  # no such folder, no safetensors weights, no hub to reach
        return refuse([f"--model: '{settings.model}' cannot be loaded: {err}"])
    problems = family_problems(limits, args.experiment, settings)
    if problems:
        return refuse(problems)
    from trainables.models import FAMILIES
    from trainables.tasks import TASKS

    limits = dataclasses.replace(limits, known_tasks=(*sorted(TASKS), *settings.sources),
                                 has_pooler=FAMILIES[limits.model_type].pooler is not None)
    problems = validate(settings, args, limits) + environment_problems(args, args.dry_run)
    if problems:
        return refuse(problems)
    tasks = list(dict.fromkeys([*settings.tasks, *(settings.intermediate_tasks or ())]))
    try:  # the user's files are read whole, and every problem in them reported, before any work
        raw = load_raw_tasks(settings, [t for t in tasks if t in settings.sources]) or None
    except (OSError, ValueError) as err:
        return refuse([str(err)])
    if settings.fractions and args.dry_run and settings.data_dir is None and set(tasks) <= KNOWN_TRAIN_SIZES.keys():
        settings = dataclasses.replace(settings, train_split_sizes=tuple((t, KNOWN_TRAIN_SIZES[t]) for t in tasks))
    elif settings.fractions:  # sizes from fractions need each task's train split size
        raw = {**load_raw_tasks(settings, [t for t in tasks if t not in (raw or {})]), **(raw or {})}
        settings = dataclasses.replace(
            settings, train_split_sizes=tuple((task, len(data.train)) for task, data in raw.items()))
    specs = experiment.build(grid_settings(settings, args), limits.num_layers, limits.num_heads)
    name = args.name or args.experiment
    folder = rows_dir(args.storage, name)
    if args.target_ci is not None:  # two stages, planned by the driver
        return precision_sweep(specs, settings, args, argv, folder, limits.num_layers, raw)
    plan = experiment.plan_function() or plan_trials
    todo, planned, rerun_skips, table, note = plan(specs, folder, args, read=not args.dry_run)
    print(f"{args.experiment}: {settings.model} ({limits.num_layers} layers), storage {args.storage}/{name}")
    print(describe_grid(specs))
    if note:
        print(note)
    if args.dry_run:
        if experiment.runner is None:  # finetuning trials: what trainables.cost counts
            from sweep.estimate import estimate_text

            print(estimate_text(specs, settings, args, limits.num_layers, folder, raw))
        return 0

    record_plan(sweep_dir(args.storage, name), argv, args.experiment, planned, rerun_skips)
    print(f"{len(specs) - len(todo)} already done, {len(todo)} to run")
    if todo:
        print(f"loading {settings.model}", flush=True)
        try:
            pretrained = buildable(settings.model)
        except (OSError, ValueError) as err:
            return refuse([f"--model: '{settings.model}' cannot be built: {err}"])
        run(todo, settings, args, folder, pretrained, raw)
    return report(folder, {row["trial_id"] for row in planned}, table)


def plan_trials(specs: list[TrialSpec], folder, options, read: bool = True):
    """(specs to run, planned rows, statuses a rerun skips, the table printed at the end, a note for the grid):
    every spec is a trial, done once its row is finished."""
    done = finished_trial_ids(folder) if read else set()
    return [s for s in specs if s.trial_id not in done], [s.row() for s in specs], FINISHED, None, ""


def run(todo: list[TrialSpec], settings: GridSettings, args, folder: Path, pretrained, raw: dict | None = None) -> None:
    import ray

    owns_ray = not ray.is_initialized()
    if owns_ray:
        start_ray(args.address)
    try:
        problems = gpu_problems(args.gpus_per_trial, ray.cluster_resources())
        if problems:
            raise SystemExit(cannot_start(problems))
        started = time.perf_counter()
        tasks = ", ".join(sorted({task for spec in todo for task in spec.tasks}))
        print(f"preparing {len(todo)} trials: loading and tokenizing {tasks}", flush=True)
        try:
            data = prepare_data(settings, todo, raw)
        except (OSError, ValueError) as err:  # a malformed file
            raise SystemExit(f"cannot start the sweep: {err}") from err
        print(f"data and weights ready in {time.perf_counter() - started:.1f}s; trials start now\n"
              f"TensorBoard (per-epoch curves of every trial): tensorboard --logdir {parent(folder)}", flush=True)
        EXPERIMENTS[args.experiment].run_function()(
            todo,
            data=data,
            pretrained={settings.model: pretrained},
            folder=folder,
            tune_dir=parent(folder),
            cpus_per_trial=args.cpus_per_trial,
            gpus_per_trial=args.gpus_per_trial,
            options=args,
        )
    finally:
        if owns_ray:
            ray.shutdown()  # before the interpreter exits, so workers stop quietly instead of by SIGTERM


def start_ray(address: str | None) -> None:
    import ray

    print(f"starting Ray ({'at ' + address if address else 'on this machine'})", flush=True)
    # Trials find tasks and weights in the object store, so workers need no path of the driver's.
    try:
        ray.init(address=address, include_dashboard=False, configure_logging=False,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    except ConnectionError as err:  # `--address auto` with no cluster running
        raise SystemExit(cannot_start([f"--address: {err}"])) from err


def report(folder: Path, grid_ids: set[str], table=None) -> int:
    """Counts the rows of `grid_ids` and prints `table` of them (default: the per-condition summary)."""
    from trialrows.read import read_results
    from trialrows.summaries import condition_table

    rows = read_results(folder)
    rows = rows[rows["trial_id"].isin(grid_ids)]
    statuses = rows["status"].value_counts().to_dict() if len(rows) else {}
    print(f"\nresults: {folder} ({len(rows)} of {len(grid_ids)} trials; {statuses})")
    if len(rows):
        print((table or condition_table)(rows).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0 if len(rows) == len(grid_ids) and statuses.get("error", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
