"""`python -m sweep <experiment>`: build the grid, skip what is done, run the rest on Ray, land Parquet rows."""
from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time
from pathlib import Path

from sweep.checks import address_problems, cannot_start, data_dir_problems, gpu_problems, storage_problems
from sweep.experiments import EXPERIMENTS, GridSettings
from sweep.grid import TrialSpec, data_key
from sweep.packs import parse_pack
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

# Layer and head counts of the paper's models, so that `--preset paper --dry-run` counts its grid offline.
KNOWN_SHAPES = {"bert-base-uncased": (12, 12), "bert-base-cased": (12, 12), "bert-large-uncased": (24, 16)}
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sweep",
        description="Partial-reinitialization finetuning sweeps on Ray Tune; one Parquet row per trial.",
        epilog="`python -m sweep status [--storage S] NAME`: what a sweep's store holds per cell and what a rerun "
               "would do, without starting Ray.",
    )
    p.add_argument("experiment", choices=sorted(EXPERIMENTS), help="which ablation grid to run")
    p.add_argument("--preset", choices=sorted(PRESETS), default="demo",
                   help="fills every grid option you leave unset (default: demo, offline MiniLM on the "
                        "built-in synthetic task; paper: the paper's grid on bert-base-uncased)")
    grid = p.add_argument_group("grid")
    grid.add_argument("--model", help="hub name, local folder, or 'minilm' (the offline MiniLM package)")
    grid.add_argument("--tasks", nargs="+",
                      help="GLUE names (sst2 cola qnli rte mrpc stsb wnli), squad_v2 (question answering), synthetic, "
                           "or a --task-file NAME")
    grid.add_argument("--data-dir", help="a local GLUE folder (SST-2/train.tsv, ...; for squad_v2 the official "
                                         "train-v2.0.json and dev-v2.0.json); default: the hub")
    own = p.add_argument_group("your own task (use its NAME in --tasks)")
    own.add_argument("--task-file", nargs="+", metavar="NAME=DIR",
                     help="define task NAME from a folder holding a train and a dev file (.csv, .tsv, .jsonl or "
                          ".parquet), or from a hub dataset: NAME=hub:DATASET[:CONFIG]")
    own.add_argument("--text-columns", nargs="+", metavar="COLUMN", help="the text column, or two for a pair")
    own.add_argument("--label-column", metavar="COLUMN",
                     help="class names (strings or integers), or numbers for regression")
    own.add_argument("--splits", nargs=2, metavar=("TRAIN", "DEV"),
                     help="file names without suffix, or hub split names (default: train dev; hub: train validation)")
    own.add_argument("--metric", help="headline metric: accuracy, macro_f1, f1 (two classes), matthews_correlation, "
                                      "or pearson, spearman (regression); default: accuracy for classes (macro_f1 "
                                      "reported too), pearson for numbers (spearman too)")
    grid.add_argument("--sizes", nargs="+", type=int, help="training subset sizes")
    grid.add_argument("--trials", nargs="+", help="trials per size: N, or SIZE=N items (e.g. 500=50 3)")
    grid.add_argument("--fractions", nargs="+", type=float,
                      help="subset sizes as fractions of each task's train split, in (0, 1] (e.g. 0.01 0.1 1.0); "
                           "replaces the preset's --sizes unless --sizes is given too")
    grid.add_argument("--k", nargs="+", type=int, help="restrict the kept-layer counts (default 0..L)")
    grid.add_argument("--block-size", type=int, help="localized: consecutive layers per block (default 3)")
    grid.add_argument("--layers", nargs="+", type=int,
                      help="single-layer, heads: layers 1..L to use; probing: 0..L (default all)")
    grid.add_argument("--heads", nargs="+", type=int, help="heads: head indices 0..H-1 to reset (default all)")
    grid.add_argument("--permutations", type=int, help="permutation: how many layer orders (default 10)")
    grid.add_argument("--lr-multiplier", type=float,
                      help="reinit-lr: learning rate of reinitialized layers over the base rate (default 5)")
    grid.add_argument("--intermediate-tasks", nargs="+",
                      help="sequential: tasks finetuned first (default: the same as --tasks)")
    grid.add_argument("--seed", type=int, default=0,
                      help="base seed: trial i's subset and model seeds are drawn from (seed, i), so sweeps with "
                           "different --seed share no subset, weight draw or batch order (default 0)")
    train = p.add_argument_group("finetuning")
    train.add_argument("--epochs", type=int, help="default: 5 for subsets of <=500 examples, else 3")
    train.add_argument("--lr", type=float, default=2e-5)
    train.add_argument("--batch-size", type=int, default=8)
    train.add_argument("--max-length", type=int,
                       help=f"tokens per sequence (default {DEFAULT_MAX_LENGTH}; {QA_MAX_LENGTH} when a task is "
                            "squad_v2, whose contexts are split into windows of this length sharing a third of it)")
    train.add_argument("--weight-decay", type=float, default=0.0)
    train.add_argument("--lr-schedule", choices=["linear", "constant"], default="linear")
    train.add_argument("--max-grad-norm", type=float, default=1.0,
                       help="clip each step's gradient to this global norm, as the paper's code (run_glue) did; "
                            "0: no clipping (default 1.0)")
    train.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                       help="bf16: bfloat16 autocast; auto: bf16 when trials get a GPU, else fp32 (default auto)")
    train.add_argument("--eval-every", type=int, default=0, metavar="N",
                       help="evaluate the dev split every N epochs for per-epoch curves; 0: after the last epoch "
                            "only, as the paper reports (default 0)")
    train.add_argument("--reinit-mode", choices=["intended", "paper-code"], default="intended",
                       help="intended: the paper's description; paper-code: the original code's quirks")
    train.add_argument("--reinit-pooler", action="store_true", help="also reinitialize the pooler")
    search = p.add_argument_group("lr-multipliers search (one Optuna study per cell: task x size x k)")
    search.add_argument("--num-samples", type=int, default=8,
                        help="trials per cell, the study's budget; the first is every multiplier at 1 (default 8)")
    search.add_argument("--multiplier-range", nargs=2, type=float, metavar=("LOW", "HIGH"),
                        help="log-uniform range of each multiplier, must contain 1 (default 0.1 10)")
    search.add_argument("--group", choices=["layer", "reinit-vs-kept"],
                        help="layer: one multiplier per encoder layer (default); reinit-vs-kept: two, one for the "
                             "reinitialized layers and one for the kept ones")
    search.add_argument("--val-fraction", type=float,
                        help="share of each training subset held out (never trained on) to measure the search's "
                             "objective; the dev split is only reported (default 0.2)")
    from trainables.probing import PROBES

    probe = p.add_argument_group("probing (the frozen model, a probe per layer 0..L; `--layers` picks some)")
    probe.add_argument("--probes", nargs="+", choices=PROBES,
                       help="mean-pool: the paper's (mean over real tokens -> linear; default); cls-pooler: the "
                            "original code's ([CLS] -> frozen pooler -> linear); truncated: the course report's "
                            "(layers 1..k frozen, pooler + linear trained on top)")
    probe.add_argument("--patience", type=int, default=5,
                       help="early stopping: epochs without a better validation loss (default 5)")
    probe.add_argument("--max-probe-epochs", type=int, default=40, help="epoch limit per probe (default 40, the paper's)")
    probe.add_argument("--probe-lr", type=float, default=1e-3, help="AdamW learning rate of the probe (default 1e-3)")
    probe.add_argument("--probe-val-fraction", type=float, default=0.1,
                       help="share of each training subset held out for early stopping (default 0.1; the dev "
                            "split is never used for it)")
    run = p.add_argument_group("running")
    run.add_argument("--gpus-per-trial", type=float, default=0.0, help="a GPU share, e.g. 0.25; 0 = CPU")
    run.add_argument("--cpus-per-trial", type=float, default=1.0)
    run.add_argument("--address", help="an existing Ray cluster (or 'auto'); default: start a local one")
    run.add_argument("--storage", default="./results",
                     help="where rows, logs and checkpoints go: a folder (default ./results; on a cluster one every "
                          "node sees) or a URI: s3://bucket/prefix, gs://bucket/prefix, file:///path")
    run.add_argument("--name", help="sweep name, a folder under --storage (default: the experiment)")
    run.add_argument("--dry-run", action="store_true", help="print the grid and run nothing")
    run.add_argument("--resume", action="store_true",
                     help="continue the sweep's interrupted Tune experiment: unfinished trials go on from their "
                          "last checkpoints (default: finished trials are skipped, unfinished ones start over)")
    run.add_argument("--checkpoint-every", type=checkpoint_interval, default=CHECKPOINT_EVERY, metavar="SECONDS",
                     help="checkpoint a trial (model, optimizer, progress) at the first epoch end at least SECONDS "
                          f"after its last checkpoint; 0: every epoch; off: never (default {CHECKPOINT_EVERY:g})")
    run.add_argument("--keep-checkpoints", action="store_true",
                     help="keep a finished trial's checkpoints (default: deleted once its row is written)")
    run.add_argument("--max-failures", type=failure_count, default=2, metavar="N",
                     help="times a failed or preempted trial is restarted from its last checkpoint (default 2)")
    run.add_argument("--pack", type=parse_pack, default="auto", metavar="N|auto",
                     help="train up to N trials of the same task, size and schedule as one fused computation (one "
                          "Tune trial, resources scaled to it, one row per trial); 1: each trial alone; auto: 1 on "
                          "CPUs, where fusing does not pay, and as many as fit in GPU memory on GPUs (default auto). "
                          "Sequential finetuning, searches and probing run unfused")
    return p


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


def settings_from_args(args) -> GridSettings:
    preset = {**PRESETS[args.preset], **EXPERIMENTS[args.experiment].presets.get(args.preset, {})}
    if args.model is not None and args.model != preset["model"]:
        for name in ("k", "layers", "heads"):
            preset.pop(name, None)  # a preset's layer and head picks are chosen for its own model
    if any(getattr(args, name) is not None for name in ("model", "tasks", "sizes", "fractions")):
        preset.pop("epochs", None)  # a preset's short schedule is chosen for its own model, task and size
    if args.fractions is not None:
        preset["sizes"] = []  # fractions replace the preset's sizes; --sizes adds to them
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else preset.get(name)  # noqa: E731
    optional = lambda name: tuple(pick(name)) if pick(name) is not None else None  # noqa: E731
    return GridSettings(
        model=pick("model"),
        tasks=tuple(pick("tasks")),
        sizes=tuple(pick("sizes")),
        trials=parse_trials(pick("trials")),
        data_dir=str(Path(args.data_dir).resolve()) if args.data_dir else None,
        k=tuple(pick("k")) if pick("k") is not None else None,
        skip=preset.get("skip", frozenset()),
        epochs=pick("epochs"),
        lr=args.lr,
        batch_size=args.batch_size,
        max_length=args.max_length or default_max_length([*pick("tasks"), *(pick("intermediate_tasks") or ())]),
        weight_decay=args.weight_decay,
        lr_schedule=args.lr_schedule,
        max_grad_norm=args.max_grad_norm,
        precision=resolve_precision(args.precision, args.gpus_per_trial),
        eval_every=args.eval_every,
        reinit_mode=args.reinit_mode,
        reinit_pooler=args.reinit_pooler,
        seed=args.seed,
        block_size=pick("block_size") or 3,
        layers=optional("layers"),
        heads=optional("heads"),
        permutations=pick("permutations") if pick("permutations") is not None else 10,
        lr_multiplier=pick("lr_multiplier") if pick("lr_multiplier") is not None else 5.0,
        intermediate_tasks=optional("intermediate_tasks"),
        probes=tuple(dict.fromkeys(pick("probes") or ("mean-pool",))),
        patience=args.patience,
        max_probe_epochs=args.max_probe_epochs,
        probe_lr=args.probe_lr,
        probe_val_fraction=args.probe_val_fraction,
        fractions=tuple(pick("fractions") or ()),
        multiplier_range=tuple(args.multiplier_range or (0.1, 10.0)),
        multiplier_group=args.group or "layer",
        val_fraction=args.val_fraction if args.val_fraction is not None else 0.2,
        task_sources=task_sources(args),
    )


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
        given = [o for o, v in (("--text-columns", args.text_columns), ("--label-column", args.label_column),
                                ("--splits", args.splits), ("--metric", args.metric)) if v]
        return [f"{given[0]}: only means something with --task-file NAME=DIR"] if given else []
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


def validate(settings: GridSettings, args, num_layers: int, num_heads: int | None = None) -> list[str]:
    """Every problem with the request, each naming the option, the value and what is allowed."""
    from trainables.tasks import TASKS

    problems = task_file_problems(args)
    known = [*sorted(TASKS), *settings.sources]
    for task in settings.tasks:
        if task not in known:
            problems.append(f"--tasks: unknown task '{task}'; allowed: {', '.join(known)}")
    for task in settings.intermediate_tasks or ():
        if task not in known:
            problems.append(f"--intermediate-tasks: unknown task '{task}'; allowed: {', '.join(known)}")
    if args.experiment == "probing" and "squad_v2" in settings.tasks:
        problems.append("--tasks: probing trains a sentence classifier per layer and cannot take squad_v2 "
                        "(question answering); every finetuning experiment can")
    if not settings.sizes and not settings.fractions:
        problems.append("--sizes: no subset size given; give --sizes or --fractions")
    for fraction in settings.fractions:
        if not 0 < fraction <= 1:
            problems.append(f"--fractions: {fraction} is outside (0, 1]; give a share of the train split")
    if not 1 <= settings.block_size <= num_layers:
        problems.append(f"--block-size: {settings.block_size} is outside 1..{num_layers} for {settings.model} "
                        f"({num_layers} layers)")
    lowest = 0 if args.experiment == "probing" else 1  # probing reads layer 0, the embeddings output
    for layer in settings.layers or ():
        if not lowest <= layer <= num_layers:
            problems.append(f"--layers: {layer} is outside {lowest}..{num_layers} for {settings.model} "
                            f"({num_layers} layers)")
    for head in settings.heads or ():
        if num_heads is not None and not 0 <= head < num_heads:
            problems.append(f"--heads: {head} is outside 0..{num_heads - 1} for {settings.model} "
                            f"({num_heads} attention heads per layer)")
    if settings.permutations < 1:
        problems.append(f"--permutations: {settings.permutations} must be at least 1")
    if not settings.lr_multiplier > 0:
        problems.append(f"--lr-multiplier: {settings.lr_multiplier} must be positive")
    for size in settings.sizes:
        if size <= 0:
            problems.append(f"--sizes: {size} is not a positive number of training examples")
    for k in settings.k or ():
        if not 0 <= k <= num_layers:
            problems.append(f"--k: {k} is outside 0..{num_layers} for {settings.model} ({num_layers} layers)")
    if settings.epochs is not None and settings.epochs < 1:
        problems.append(f"--epochs: {settings.epochs} must be at least 1")
    if not 0 < settings.lr < float("inf"):
        problems.append(f"--lr: {settings.lr} must be a positive finite number")
    if settings.batch_size < 1:
        problems.append(f"--batch-size: {settings.batch_size} must be at least 1")
    if not 0 <= settings.max_grad_norm < float("inf"):
        problems.append(f"--max-grad-norm: {settings.max_grad_norm} must be a finite number >= 0 (0: no clipping)")
    if settings.eval_every < 0:
        problems.append(f"--eval-every: {settings.eval_every} must be >= 0 (0: after the last epoch only)")
    gpus = args.gpus_per_trial
    if not (0 <= gpus <= 1 or (gpus > 1 and float(gpus).is_integer())):
        problems.append(f"--gpus-per-trial: {gpus} must be a share of one GPU in [0, 1] (e.g. 0.25) or a whole "
                        "number of GPUs")
    if args.cpus_per_trial <= 0:
        problems.append(f"--cpus-per-trial: {args.cpus_per_trial} must be positive")
    low, high = settings.multiplier_range
    if not 0 < low <= 1 <= high < float("inf"):
        problems.append(f"--multiplier-range: {low:g} {high:g} must be positive, finite and contain 1 (the "
                        "baseline every study starts with)")
    if args.num_samples < 1:
        problems.append(f"--num-samples: {args.num_samples} must be at least 1")
    if not 0 < settings.val_fraction < 1:
        problems.append(f"--val-fraction: {settings.val_fraction} must be in (0, 1)")
    elif args.experiment == "lr-multipliers" and min(settings.sizes, default=2) < 2:
        problems.append(f"--sizes: {min(settings.sizes)} leaves nothing to train on beside the held-out part; "
                        "lr-multipliers needs at least 2 examples")
    if args.patience < 1:
        problems.append(f"--patience: {args.patience} must be at least 1 epoch")
    if args.max_probe_epochs < 1:
        problems.append(f"--max-probe-epochs: {args.max_probe_epochs} must be at least 1")
    if not 0 < args.probe_lr < float("inf"):
        problems.append(f"--probe-lr: {args.probe_lr} must be a positive finite number")
    if not 0 < args.probe_val_fraction < 1:
        problems.append(f"--probe-val-fraction: {args.probe_val_fraction} must be in (0, 1)")
    elif args.experiment == "probing" and 0 < min(settings.sizes, default=2) < 2:
        problems.append(f"--sizes: {min(settings.sizes)} leaves nothing to train a probe on beside the held-out "
                        "part; probing needs at least 2 examples")
    # The folder as the user typed it: resolved, a path through a symbolic link would read as another one.
    problems += data_dir_problems(args.data_dir, [*settings.tasks, *(settings.intermediate_tasks or ())])
    return problems


def model_shape(model: str, dry_run: bool) -> tuple[int, int, str]:
    """(layers, attention heads per layer, transformers model_type) of a model, from its config."""
    from trainables.models import load_config

    if dry_run and model in KNOWN_SHAPES:  # counting needs no download (nor a network timeout)
        return (*KNOWN_SHAPES[model], "bert")
    config = load_config(model)
    return int(config.num_hidden_layers), int(config.num_attention_heads), str(config.model_type)


def family_problems(model: str, model_type: str, experiment: str, settings: GridSettings) -> list[str]:
    """Whether the model's family is supported, and supports this experiment and its pooler options."""
    from trainables.models import FAMILIES

    if model_type not in FAMILIES:
        return [f"--model: '{model}' is a '{model_type}' model; supported families: {', '.join(FAMILIES)}"]
    reason = FAMILIES[model_type].not_layerwise
    if reason and experiment != "probing":
        return [f"--model: '{model}' cannot run {experiment}: {reason}"]
    if FAMILIES[model_type].pooler is None:
        no_pooler = f"'{model}' is a '{model_type}' model, whose classifier has no pretrained pooler"
        if settings.reinit_pooler:
            return [f"--reinit-pooler: {no_pooler} (its head is drawn fresh in every trial); leave it out"]
        if experiment == "probing" and set(settings.probes) - {"mean-pool"}:
            return [f"--probes: {', '.join(sorted(set(settings.probes) - {'mean-pool'}))} read the pooler; "
                    f"{no_pooler}; allowed for it: mean-pool"]
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
    settings = settings_from_args(args)
    try:
        num_layers, num_heads, model_type = model_shape(settings.model, args.dry_run)
    except (OSError, ValueError) as err:  # no such folder, no safetensors weights, no hub to reach
        return refuse([f"--model: '{settings.model}' cannot be loaded: {err}"])
    problems = family_problems(settings.model, model_type, args.experiment, settings)
    if problems:
        return refuse(problems)
    problems = validate(settings, args, num_layers, num_heads)
    if not args.dry_run:  # a dry run writes nothing and connects to nothing
        problems += storage_problems(args.storage) + address_problems(args.address)
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
    specs = EXPERIMENTS[args.experiment].build(settings, num_layers, num_heads)
    name = args.name or args.experiment
    print(f"{args.experiment}: {settings.model} ({num_layers} layers), storage {args.storage}/{name}")
    print(describe_grid(specs))
    if args.experiment == "lr-multipliers":
        print(f"(trials above are cells: each is an Optuna study of --num-samples {args.num_samples} trials, "
              f"{len(specs) * args.num_samples:,} trials in all)")
    if args.dry_run:
        return 0

    folder = rows_dir(args.storage, name)
    done = finished_trial_ids(folder)
    todo = [s for s in specs if s.trial_id not in done]
    planned, rerun_skips, table = [s.row() for s in specs], FINISHED, None
    if args.experiment == "lr-multipliers":  # a spec is a cell: a study of --num-samples trials
        from analysis.search import best_table
        from sweep.search import FINISHED as STUDY_FINISHED
        from sweep.search import planned_rows, unfinished_cells

        todo, planned = unfinished_cells(specs, folder, args.num_samples), planned_rows(specs, args.num_samples)
        rerun_skips, table = STUDY_FINISHED, best_table
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


def run(todo: list[TrialSpec], settings: GridSettings, args, folder: Path, pretrained, raw: dict | None = None) -> None:
    import ray

    owns_ray = not ray.is_initialized()
    if owns_ray:
        print(f"starting Ray ({'at ' + args.address if args.address else 'on this machine'})", flush=True)
        # Trials find tasks and weights in the object store, so workers need no path of the driver's.
        try:
            ray.init(address=args.address, include_dashboard=False, configure_logging=False,
                     runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
        except ConnectionError as err:  # `--address auto` with no cluster running
            raise SystemExit(cannot_start([f"--address: {err}"])) from err
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


def report(folder: Path, grid_ids: set[str], table=None) -> int:
    """Counts the rows of `grid_ids` and prints `table` of them (default: the per-condition summary)."""
    from analysis.results import read_results
    from analysis.stats import condition_table

    rows = read_results(folder)
    rows = rows[rows["trial_id"].isin(grid_ids)]
    statuses = rows["status"].value_counts().to_dict() if len(rows) else {}
    print(f"\nresults: {folder} ({len(rows)} of {len(grid_ids)} trials; {statuses})")
    if len(rows):
        print((table or condition_table)(rows).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0 if len(rows) == len(grid_ids) and statuses.get("error", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
