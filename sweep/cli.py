"""`python -m sweep <experiment>` (or `reinit-sweep <experiment>`): build the grid, skip what is done, run the
rest on Ray, land Parquet rows. The command line is made from the settings' declarations (sweep.config,
sweep.experiments, trialrows.recipe, trialrows.experiments); `--config FILE` reads the same settings from a
YAML or TOML file, and the options given on the command line override the file's. `execute` is the one path
from a resolved Sweep to rows, for the command line and the Python API (sweep.api) alike."""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import collections
import dataclasses
import importlib
import os
import shlex
import sys
import threading
import time
from pathlib import Path

from sweep.checks import (address_problems, cannot_start, data_dir_problems, gpu_problems, storage_access_problems,
                          storage_problems)
from sweep.config import (CONFIG_FILE, PRESET, Refused, Sweep, flag_of, options_of, read_config, resolve,
                          unknown_settings, write_config)
from sweep.experiments import EXPERIMENTS, GridSettings, trial_word
from sweep.fingerprints import reconcile, stored_fingerprints, with_fingerprints
from sweep.data import load_raw_tasks, prepare_data  # noqa: F401  (prepare_data: read from here by tests)
from sweep.grid import TrialSpec
from sweep.lock import sweep_lock
from sweep.precision import grid_settings, option_problems, target_of
from sweep.status import main as status_main
from sweep.status import record_plan
from sweep.store import FINISHED, finished_trial_ids, parent, rows_dir, sweep_dir
from trialrows.declare import Limits, parse_groups

# Layer, head and position counts of the paper's models, so that `--preset paper --dry-run` counts its grid offline.
KNOWN_SHAPES = {"bert-base-uncased": (12, 12, 512), "bert-base-cased": (12, 12, 512),
                "bert-large-uncased": (24, 16, 512)}
# GLUE's train split sizes (the hub's nyu-mll/glue), so that a dry run of sizes given as --fractions (the
# probing paper preset: full splits) or beyond a split counts offline too.
KNOWN_TRAIN_SIZES = {"sst2": 67349, "cola": 8551, "qnli": 104743, "rte": 2490, "mrpc": 3668, "stsb": 5749,
                     "wnli": 635, "squad_v2": 130319}
# The most trials one sweep may plan: the paper's largest grid is 2,145; a grid a thousand times as large is a
# typo (`--trials 10000000`) that would take minutes to list before anything ran.
MAX_TRIALS = 1_000_000


def parse_trials(values: list[str]) -> tuple[tuple[int, int], ...]:
    """'3' (every size) or 'SIZE=COUNT' items, e.g. `--trials 500=50 3`."""
    from sweep.experiments import trial_count

    try:
        return tuple(trial_count(v) for v in values)
    except ValueError as err:
        raise SystemExit(f"--trials: {err}") from None


def _argparse_type(option):
    """The option's word reader, its ValueError shown by argparse as `argument --flag: why`."""
    convert = option.type

    def read(word):
        try:
            return convert(word)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    read.__name__ = getattr(convert, "__name__", "value")
    return read


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors on one line that says where the options are listed: an experiment's usage
    is 35 lines, and its error came last, under them."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; its options: {self.prog} --help\n")


def unknown_option_problems(argv: list[str], experiment: str, unknown: list[str]) -> list[str]:
    """What argparse left unread, named as a --config key is (the experiment that takes it, or the closest
    option). The top level takes no option, so a flag typed before the experiment's name is only misplaced."""
    name_at = argv.index(experiment) if experiment in argv else 0
    if "--" in argv[name_at:]:  # argparse reads what follows it as no options at all
        given = [word for word in argv[name_at + 1:] if word != "--"]
        return [f"--: options go without it: python -m sweep {experiment} {' '.join(given)}".rstrip()]
    before = {word.partition("=")[0] for word in argv[:name_at]}
    flags = [word.partition("=")[0] for word in unknown if word.startswith("-")]
    problems = [f"{f}: an option of {experiment}, given before its name; give it after: python -m sweep {experiment} "
                f"{f} ..." for f in flags if f in before]
    problems += unknown_settings(experiment, [f[2:].replace("-", "_") for f in flags
                                              if f.startswith("--") and f not in before])
    others = [f for f in flags if not f.startswith("--") and f not in before] or ([] if flags else [" ".join(unknown)])
    return problems + [f"{o}: not an option of {experiment}; its options: python -m sweep {experiment} --help"
                       for o in others]


def build_parser() -> argparse.ArgumentParser:
    """One sub-command per experiment, each with every experiment's options and its own (so that
    `python -m sweep EXPERIMENT --help` lists what that experiment takes). No option is read by an abbreviation
    of its name, and no default is set here: what was given is told from what a preset or a declaration fills."""
    p = Parser(
        prog="python -m sweep", allow_abbrev=False,
        description="Partial-reinitialization finetuning sweeps on Ray Tune; one Parquet row per trial.",
        epilog="`python -m sweep EXPERIMENT --help`: that experiment's options. `python -m sweep --config FILE`: a "
               "sweep written in a YAML or TOML file (every sweep writes its own, resolved, as <storage>/<name>/"
               f"{CONFIG_FILE}). `python -m sweep status [--storage S] NAME`: what a sweep's store holds per cell and "
               "what a rerun would do, without starting Ray.",
    )
    experiments = p.add_subparsers(dest="experiment", metavar="experiment", required=True,
                                   help="which ablation grid to run: " + ", ".join(EXPERIMENTS))
    for name, experiment in EXPERIMENTS.items():
        sub = experiments.add_parser(name, help=experiment.summary, description=experiment.summary,
                                     allow_abbrev=False, argument_default=argparse.SUPPRESS)
        sub.add_argument("--config", metavar="FILE", help="read the settings from a YAML (.yaml) or TOML (.toml) "
                         "file; options given here override it")
        PRESET.add_to(sub)
        own = sub.add_argument_group(f"{name} options")
        for option in experiment.options:
            add(own, option)
        groups = parse_groups([o for o in options_of(name) if o not in experiment.options])
        for title, options in sorted(groups.items(), key=lambda group: group[0] != "grid"):  # the grid first
            group = sub.add_argument_group(title)
            for option in options:
                add(group, option)
    return p


def add(group, option) -> None:
    if option.type is not None and option.type not in (int, float, str):
        option = dataclasses.replace(option, type=_argparse_type(option))
    option.add_to(group)


def given_settings(args: argparse.Namespace) -> dict:
    """The settings the command line gave, by name (everything not given is absent)."""
    return {k: v for k, v in vars(args).items() if k not in ("experiment", "config", "preset")}


def parse_command_line(argv: list[str]) -> Sweep:
    """The Sweep a command line asks for: its --config file's settings, overridden by the options given."""
    argv = list(argv)
    if argv[:1] and argv[0].startswith("--config"):  # `python -m sweep --config FILE`: the file names it
        path = argv[1] if argv[0] == "--config" and len(argv) > 1 else argv[0].partition("=")[2]
        experiment, _, _ = read_config(path)
        if experiment is None:
            raise Refused([f"--config: {path} names no experiment; add `experiment: NAME` or give it first: "
                           "python -m sweep EXPERIMENT --config FILE"])
        argv = [experiment, *argv]
    problems = repeated_options(argv)
    if problems:
        raise Refused(problems)
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        raise Refused(unknown_option_problems(argv, args.experiment, unknown))
    given, preset = {}, getattr(args, "preset", None)
    if getattr(args, "config", None):
        experiment, file_preset, given = read_config(args.config)
        if experiment is not None and experiment != args.experiment:
            raise Refused([f"--config: {args.config} is a '{experiment}' sweep; run it as python -m sweep "
                           f"{experiment} --config {args.config}"])
        preset = preset or file_preset
    return resolve(args.experiment, {**given, **given_settings(args)}, preset)


def repeated_options(argv: list[str]) -> list[str]:
    """An option given more than once: argparse keeps its last value without a word, so `--k 0 3 --k 6` would run
    k = 6 alone and `--trials 500=50 --trials 3` three trials everywhere."""
    counts: dict[str, list[str]] = {}
    flag = None
    for word in argv:
        if word == "--":
            break
        if word.startswith("--"):
            flag, _, value = word.partition("=")
            counts.setdefault(flag, []).append(value)
        elif flag is not None and word:
            counts[flag][-1] = f"{counts[flag][-1]} {word}".strip()
    return [f"{flag}: given {len(values)} times ({'; '.join(v or '(no value)' for v in values)}), and only the "
            f"last would count; give it once, with all its values ({flag} {' '.join(v for v in values if v)})"
            for flag, values in counts.items() if len(values) > 1]


def settings_from_args(args) -> GridSettings:
    """The grid a parsed command line (build_parser().parse_args) asks for."""
    return resolve(args.experiment, given_settings(args), getattr(args, "preset", None)).grid


def task_file_problems(sweep: Sweep) -> list[str]:
    from trainables.tasks import CLASS_METRICS, HUB_PREFIX, REGRESSION_METRICS, TASKS

    grid = sweep.grid
    problems = []
    names = [s.name for s in grid.task_files]
    for source in grid.task_files:
        name, location = source.name, source.location
        if not name or not location:
            problems.append(f"--task-file: '{name}={location}' is not NAME=DIR or NAME=hub:DATASET[:CONFIG]")
            continue
        if not all(c.isalnum() or c in "_.-" for c in name) or name.startswith("."):
            problems.append(f"--task-file: '{name}' is not a task name: letters, digits, '_', '-' and '.' only (it "
                            "names folders and trial ids)")
        elif names.count(name) > 1:
            problems.append(f"--task-file: task '{name}' is defined {names.count(name)} times; define it once")
        elif name in TASKS:
            problems.append(f"--task-file: '{name}' is a built-in task's name; choose another")
        elif name not in [*grid.tasks, *(grid.intermediate_tasks or ())]:
            problems.append(f"--task-file: task '{name}' is not named in --tasks ({' '.join(grid.tasks)}); add it "
                            "there, or leave its --task-file out")
        if not location.startswith(HUB_PREFIX) and not Path(location).is_dir():
            problems.append(f"--task-file: '{location}' (task '{name}') is not a folder")
        if not source.text_columns or len(source.text_columns) > 2:
            problems.append(f"--text-columns: give one text column or two (a pair) for task '{name}'; got "
                            f"{len(source.text_columns)} ({' '.join(source.text_columns)})")
        elif len(set(source.text_columns)) < len(source.text_columns):
            problems.append(f"--text-columns: '{source.text_columns[0]}' is given twice for task '{name}'; a pair "
                            "is two different columns")
        if not source.label_column:
            problems.append(f"--label-column: which column holds the labels of task '{name}'; --task-file needs it "
                            f"(--label-column C, or {name}=DIR,label=C)")
        elif source.label_column in source.text_columns:  # the model would read the answer in its input
            problems.append(f"--label-column: '{source.label_column}' is also one of the --text-columns of task "
                            f"'{name}'; the labels cannot be part of the text")
        if source.splits and source.splits[0] == source.splits[1]:
            problems.append(f"--splits: '{source.splits[0]}' for both train and dev (task '{name}'); the dev split "
                            "must be another file or split")
        if source.metric is not None and source.metric not in (*CLASS_METRICS, *REGRESSION_METRICS):
            problems.append(f"--metric: '{source.metric}' is not one of {', '.join((*CLASS_METRICS, *REGRESSION_METRICS))}")
    return problems


def estimated_trials(sweep: Sweep, limits: Limits) -> int:
    """The grid's size without listing it: its cells times the trials one cell holds (with a precision
    target: --max-trials each)."""
    grid = grid_settings(sweep.grid, sweep)
    sizes = {task: grid.sizes_for(task) for task in grid.tasks}
    cells = sum(grid.trials_for(size) for task in grid.tasks for size in sizes[task] if (task, size) not in grid.skip)
    if not cells:
        return 0
    task = next(t for t in grid.tasks if sizes[t])
    one = dataclasses.replace(grid, tasks=(task,), sizes=sizes[task][:1], fractions=(), trials=((0, 1),), skip=())
    return cells * len(EXPERIMENTS[sweep.experiment].build(one, limits.num_layers, limits.num_heads))


def validate(sweep: Sweep, limits: Limits) -> list[str]:
    """Every problem with the request, each naming the option, the value and what is allowed."""
    grid = sweep.grid
    problems = task_file_problems(sweep)
    for option in options_of(sweep.experiment):
        problems += option.problems(sweep.value(option), limits)
    if not grid.sizes and not grid.fractions:
        problems.append("--sizes: no subset size given; give --sizes or --fractions")
    problems += experiment_problems(grid, limits, sweep.experiment)
    problems += option_problems(sweep, EXPERIMENTS[sweep.experiment])
    problems += ignored_problems(sweep) + cell_problems(sweep)
    # The folder as the user typed it: resolved, a path through a symbolic link would read as another one.
    problems += data_dir_problems(grid.data_dir, [*grid.tasks, *(grid.intermediate_tasks or ())])
    problems += logger_problems(sweep.run.logger, sweep.run.storage)
    return problems


def experiment_problems(grid: GridSettings, limits: Limits, experiment: str) -> list[str]:
    """What the experiment's own check refuses of the grid (Experiment.problems)."""
    check = EXPERIMENTS[experiment].problems
    return check(grid, limits) if check else []


def cell_problems(sweep: Sweep) -> list[str]:
    """--trials and --skip words that name no cell of the grid, and --sizes that no count covers: each would
    leave cells out of the sweep without a word. (Sizes from --fractions are known once the splits are read:
    the plan asks `uncounted_problems` again then.)"""
    grid, problems = sweep.grid, uncounted_problems(sweep)
    if grid.fractions or sweep.run.target_ci is not None:  # a precision target sets every count
        return problems
    sizes = ", ".join(map(str, grid.sizes))
    trials, skips = grid.strays()
    if trials and "trials" in sweep.given:
        problems.append(f"--trials: {' '.join(map(trial_word, trials))} names a size not in --sizes ({sizes}); "
                        "give SIZE=COUNT for sizes of the grid, or a count for every size (e.g. 3)")
    if skips and "skip" in sweep.given:
        problems.append(f"--skip: {' '.join(f'{t}={n}' for t, n in skips)} is no cell of the grid (tasks "
                        f"{', '.join(grid.tasks)}; sizes {sizes}); give TASK=SIZE of one")
    return problems


def uncounted_problems(sweep: Sweep) -> list[str]:
    """The grid's sizes (those of --fractions once the splits are read) that no --trials word counts (none with a
    precision target, which sets every count)."""
    grid, words = sweep.grid, {}
    if sweep.run.target_ci is not None:
        return []
    for task in grid.tasks:
        for size in grid.known_sizes(task):
            fraction = grid.fraction_of(task, size)
            if not grid.trials_for(size):
                words.setdefault(size, f"{size} (--fractions {fraction:g} of {task})" if fraction else str(size))
    if not words:
        return []
    return [f"--trials: no count for size {', '.join(words.values())} (given: "
            f"{' '.join(map(trial_word, grid.trials))}); add SIZE=COUNT for it, or a count for every size"]


def ignored_problems(sweep: Sweep) -> list[str]:
    """Settings given that the experiment's trials never read (Experiment.ignores)."""
    from trialrows.experiments import AS_THEY_RUN

    ignores = EXPERIMENTS[sweep.experiment].ignores
    return [f"{o.flag}: {sweep.experiment}'s trials do not read it (given: {sweep.value(o)}); leave it out"
            for o in options_of(sweep.experiment) if o.name in ignores and o.name in sweep.given
            and sweep.value(o) not in (o.default, AS_THEY_RUN.get(o.name, o.default))]


def logger_problems(loggers, storage) -> list[str]:
    import importlib.util

    missing = [f"--logger: {name} needs the {name} package, which is not installed: pip install "
               f"'reinit-sweep[trackers]' (or pip install {name})" for name in loggers or ()
               if importlib.util.find_spec(name) is None]
    if "mlflow" in (loggers or ()) and not missing and not storage_shape_problems(storage):
        from sweep.trackers import mlflow_store_problem

        missing += filter(None, [mlflow_store_problem(storage)])
    return missing


def environment_problems(sweep: Sweep, dry_run: bool) -> list[str]:
    """Whether the storage can be written, the cluster answers and asked-for GPUs exist. Here the file system
    is only asked (a real run's storage was probed by writing once already, by `execute` before its lock), and
    a dry run counts this machine's GPUs when no cluster is named (a cluster's are known once Ray connects)."""
    from trainables.switches import switch_problems

    run = sweep.run
    problems = address_problems(run.address) + switch_problems()
    if storage_shape_problems(run.storage):
        return problems  # refused already (validate): a store that cannot be named is not asked
    problems += storage_access_problems(run.storage)
    if dry_run and run.address in (None, "", "local"):
        problems += gpu_problems(run.gpus_per_trial or 0.0, {"GPU": local_gpus()})
    return problems


def storage_shape_problems(storage: str) -> list[str]:
    from sweep.config import RUN

    return next(o for o in RUN if o.name == "storage").problems(storage, Limits())


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def model_limits(model: str, dry_run: bool) -> Limits:
    """The model's shape (layers, attention heads, positions, family, whether its family has a pretrained
    pooler), from its config; whether its checkpoint has one is known once its weights load (`buildable`)."""
    from trainables.models import FAMILIES, load_config

    if dry_run and model in KNOWN_SHAPES:  # counting needs no download (nor a network timeout)
        return Limits(model, *KNOWN_SHAPES[model], model_type="bert")
    config = load_config(model)
    positions = getattr(config, "max_position_embeddings", None)
    # Relative positions (DeBERTa without absolute ones) set no hard limit on the length.
    if getattr(config, "position_biased_input", True) is False:
        positions = None
    kind = FAMILIES.get(str(config.model_type))  # an unknown family is refused by family_problems
    return Limits(model, int(config.num_hidden_layers), int(config.num_attention_heads),
                  int(positions) if positions else None, model_type=str(config.model_type),
                  has_pooler=kind is None or kind.pooler is not None)


def family_problems(limits: Limits, experiment: str, settings: GridSettings) -> list[str]:
    """Whether the model's family is supported, and supports this experiment and its pooler options."""
    from trainables.models import FAMILIES
    from trainables.tasks import SQUAD_V2

    model, model_type = limits.model, limits.model_type
    if model_type not in FAMILIES:
        return [f"--model: '{model}' is a '{model_type}' model; supported families: {', '.join(FAMILIES)}"]
    reason = FAMILIES[model_type].not_layerwise
    if reason and EXPERIMENTS[experiment].layerwise:
        return [f"--model: '{model}' cannot run {experiment}: {reason}"]
    if not limits.has_pooler and settings.reinit_pooler:
        return [f"--reinit-pooler: '{model}' {limits.no_pooler()}; leave it out"]
    if settings.reinit_pooler and SQUAD_V2 in settings.tasks:
        return [f"--reinit-pooler: {SQUAD_V2}'s span head reads every token's state, never the pooler, so resetting "
                "it changes nothing but the draws after it; leave it out, or run the other tasks in a sweep of their "
                "own with it"]
    return []


def buildable(model: str, sweep: Sweep, limits: Limits):
    """The model's pretrained weights, once a classifier has been built from them: a checkpoint whose
    weights do not fit its architecture is refused here, before Ray starts, not inside every trial. So is a
    sweep that reads or resets a pretrained pooler its checkpoint was saved without (an MLM-only BERT's: the
    classifier draws it fresh), as for a family without one: the same checks, now that the weights tell."""
    from trainables.models import build_classifier, load_pretrained, pretrained_pooler

    pretrained = load_pretrained(model)
    classifier = build_classifier(pretrained, num_labels=2, seed=0)
    if limits.has_pooler and pretrained_pooler(classifier) is None:
        saved = dataclasses.replace(limits, has_pooler=False)
        problems = (family_problems(saved, sweep.experiment, sweep.grid)
                    + experiment_problems(sweep.grid, saved, sweep.experiment))
        if problems:
            raise Refused(problems)
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


def shown(value) -> str:
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value)) if value else "-"
    return "all" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def describe_settings(sweep: Sweep, specs: list[TrialSpec]) -> str:
    """What runs: the preset in force and what it filled, and the resolved settings that shape the trials."""
    grid, lines = sweep.grid, []
    written = {o.name: o for o in options_of(sweep.experiment)}
    # The demo's sizes cleared for --fractions are nothing filled in: fractions replace them (sweep.config).
    filled = ", ".join(f"{flag_of(n)} {shown(written[n].written(getattr(sweep, n)))}" for n in sweep.filled
                       if getattr(sweep, n) not in ((), []))
    lines.append(f"preset {sweep.preset}: " + (f"filled {filled}" if filled else "filled nothing")
                 + (f"; its picks {', '.join(flag_of(n) for n in sweep.dropped)} are left out (you named what to "
                    "run on), declared defaults instead" if sweep.dropped else ""))
    experiment = EXPERIMENTS[sweep.experiment]
    own = [f"{o.flag} {shown(getattr(grid, o.name))}" for o in experiment.options]
    epochs = sorted({s.epochs for s in specs})
    rule = "" if grid.epochs else " (5 up to 500 examples, else 3)"
    common = {"trials": f"--trials {' '.join(trial_word(p) for p in grid.trials)}",
              "epochs": f"--epochs {' '.join(map(str, epochs)) or '-'}{rule}", "lr": f"--lr {grid.lr:g}",
              "batch_size": f"--batch-size {grid.batch_size}", "max_length": f"--max-length {grid.max_length}",
              "precision": f"--precision {grid.precision}", "pack": f"--pack {sweep.run.pack}",
              "seed": f"--seed {grid.seed}"}
    if grid.fractions:  # the sizes they give are in the table below; which fractions they are is not
        common = {"fractions": f"--fractions {shown(grid.fractions)}", **common}
    # A setting the trials never read is not shown as if it shaped them (probing's --epochs is its own limit).
    lines.append("settings: " + " · ".join([*own, *(text for name, text in common.items()
                                                     if name not in experiment.ignores)]))
    return "\n".join(lines)


def local_tasks(settings: GridSettings, tasks) -> list[str]:
    """The tasks whose data is on this machine (files, the built-in task): read whole in a dry run too."""
    from trainables.tasks import SYNTHETIC

    return [t for t in tasks if t in settings.sources and not settings.sources[t].is_hub
            or t == SYNTHETIC and t not in settings.sources
            or (settings.data_dir is not None and t not in settings.sources and t != SYNTHETIC)]


def load_data(sweep: Sweep, tasks: list[str], dry_run: bool) -> dict:
    """Every task's raw data, read whole before Ray starts, so that a problem in it (a label the task does not
    have, an answer outside its context, a file that does not parse) stops the sweep with one line naming the
    file and line. A dry run reads the local files only; the hub is not asked then."""
    settings = sweep.grid
    wanted = local_tasks(settings, tasks) if dry_run else list(tasks)
    hub = [t for t in wanted if t not in local_tasks(settings, tasks) and t != "synthetic"]
    if hub and not hub_offline() and not hub_answers():
        raise Refused([f"--tasks: {', '.join(hub)} come from the Hugging Face hub, which does not answer from this "
                       "machine; give --data-dir with a local GLUE folder (or SQuAD's files), --task-file for your "
                       "own, or HF_DATASETS_OFFLINE=1 to use what the datasets cache holds"])
    try:
        return load_raw_tasks(settings, wanted)
    except (OSError, ValueError) as err:
        hub = [t for t in wanted if t not in local_tasks(settings, tasks) and t != "synthetic"]
        if hub and is_unreachable(err):
            raise Refused([f"--tasks: {', '.join(hub)} come from the Hugging Face hub, which cannot be reached "
                           f"({type(err).__name__}: {str(err)[:200]}); give --data-dir with a local GLUE folder "
                           "(or SQuAD's files), or --task-file for your own"]) from None
        raise Refused([str(err)]) from None


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_answers(timeout: float = 5.0) -> bool:
    """Whether the hub's host takes a connection: asked once, quickly, before `datasets` retries for a minute."""
    import socket
    from urllib.parse import urlsplit

    endpoint = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80)),
                                      timeout=timeout):
            return True
    except OSError:
        return False


def is_unreachable(err: Exception) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return any(word in text for word in ("connection", "offline", "resolve", "timed out", "network", "couldn't reach",
                                         "hub", "internet"))


def size_problems(settings: GridSettings, raw: dict, intermediate=()) -> list[str]:
    """--sizes beyond a task's train split, from the data read (or GLUE's known split sizes in a dry run);
    `intermediate`: the tasks sequential finetuning trains on first, at the size of each other task's cell."""
    split = {**{t: KNOWN_TRAIN_SIZES[t] for t in [*settings.tasks, *intermediate]
                if t in KNOWN_TRAIN_SIZES and not settings.data_dir},
             **{t: len(d.train) for t, d in raw.items()}}
    largest = {task: max((s for s in settings.sizes if (task, s) not in settings.skip), default=0)
               for task in settings.tasks}
    too_large = [task for task in settings.tasks if task in split and largest[task] > split[task]]
    problems = [f"--sizes: {largest[task]} is larger than the {task} train split ({split[task]:,} examples)"
                for task in too_large]
    for first in dict.fromkeys(intermediate):
        # its own cells aside (a skipped one too): every other task's cell trains on it first at that cell's size
        widest = max((size for task, size in largest.items() if task != first), default=0)
        if first in split and first not in too_large and widest > split[first]:
            problems.append(f"--sizes: {widest} is larger than the {first} train split ({split[first]:,} examples), "
                            "which --intermediate-tasks trains on first at that size")
    return problems


def window_problems(settings: GridSettings, raw: dict) -> list[str]:
    """Question answering: the longest question and the window's stride must leave room for context."""
    from trainables.qa import window_room_problem
    from trainables.tasks import SQUAD_V2

    if SQUAD_V2 not in raw:
        return []
    from trainables.models import load_tokenizer

    try:
        tokenizer = load_tokenizer(settings.model)
    except (OSError, ValueError):
        return []  # a model it cannot load is refused on its own
    problem = window_room_problem(raw[SQUAD_V2], tokenizer, settings.max_length)
    return [problem] if problem else []


def refuse(problems: list[str]) -> int:
    print(cannot_start(problems), file=sys.stderr)
    return 2


@dataclasses.dataclass(frozen=True)
class Planned:
    """What a sweep will do: its trials, what is left to run, and how the end is reported."""

    specs: list
    todo: list
    rows: list  # every planned row (TrialSpec.row(), or a search's)
    rerun_skips: tuple
    table: object
    note: str
    raw: dict | None
    pretrained: object = None  # the model's weights, loaded to fingerprint them (None in a dry run)
    ray_started: bool = False  # Ray was started while they loaded: the run shuts it down


def plan(sweep: Sweep, dry_run: bool) -> Planned:
    """Everything checked and the grid built, before Ray starts; raises Refused."""
    experiment, grid = EXPERIMENTS[sweep.experiment], sweep.grid
    try:
        limits = model_limits(grid.model, dry_run)
    except (OSError, ValueError) as err:  # no such folder, no safetensors weights, no hub to reach
        hint = ("; the hub does not answer: give a local folder with safetensors weights, or --model minilm (offline)"
                if is_unreachable(err) else "")
        raise Refused([f"--model: '{grid.model}' cannot be loaded: {str(err).splitlines()[0]}{hint}"]) from None
    problems = family_problems(limits, sweep.experiment, grid)
    if problems:
        raise Refused(problems)
    from trainables.tasks import TASKS

    limits = dataclasses.replace(limits, known_tasks=(*sorted(TASKS), *grid.sources))
    problems = validate(sweep, limits) + environment_problems(sweep, dry_run)
    if problems:
        raise Refused(problems)
    tasks = list(dict.fromkeys([*grid.tasks, *(grid.intermediate_tasks or ())]))
    raw = load_data(sweep, tasks, dry_run)
    sequential = any(option.name == "intermediate_tasks" for option in experiment.options)
    intermediate = (grid.intermediate_tasks or grid.tasks) if sequential else ()
    problems = size_problems(grid, raw, intermediate) + window_problems(grid, raw)
    if problems:
        raise Refused(problems)
    if grid.fractions:  # sizes from fractions need each task's train split size
        if dry_run and grid.data_dir is None and set(tasks) - set(raw) <= KNOWN_TRAIN_SIZES.keys():
            splits = {**{t: KNOWN_TRAIN_SIZES[t] for t in tasks if t not in raw}, **{t: len(d.train) for t, d in raw.items()}}
        else:
            raw = {**load_raw_tasks(grid, [t for t in tasks if t not in raw]), **raw}
            splits = {task: len(data.train) for task, data in raw.items()}
        grid = dataclasses.replace(grid, train_split_sizes=tuple((t, splits[t]) for t in tasks if t in splits))
        sweep = dataclasses.replace(sweep, grid=grid)
        # again, now with the fractions' sizes
        if problems := experiment_problems(grid, limits, sweep.experiment) + uncounted_problems(sweep):
            raise Refused(problems)
    count = estimated_trials(sweep, limits)
    if count == 0:  # what is left once --skip, --trials and the experiment's own lists are applied
        given = {"tasks": " ".join(grid.tasks), "trials": " ".join(map(trial_word, grid.trials)),
                 "skip": " ".join(f"{t}={n}" for t, n in grid.skip) or "none"}
        raise Refused([f"the grid holds no trial ({'; '.join(f'--{k} {v}' for k, v in given.items())}, and "
                       f"{sweep.experiment}'s own options): nothing to run; name cells it can train"])
    if count > MAX_TRIALS:
        target = target_of(sweep)  # a target's grid holds --max-trials indices a cell, whatever --trials says
        given = (f"--max-trials: {target.max_trials} makes" if target else
                 f"--trials: {' '.join(map(trial_word, grid.trials))} make")
        raise Refused([f"{given} a grid of {count:,} trials; one sweep plans at most {MAX_TRIALS:,} (split it into "
                       "several --name)"])
    pretrained, ray_started = None, False
    try:  # a Ray started here stops with any refusal or error before the plan is handed back
        folder = rows_dir(sweep.run.storage, sweep.name)
        if not dry_run:  # what the trials will read, loaded once: its fingerprints are part of every trial id
            stored = stored_fingerprints(folder)

            def load():
                print(f"loading {grid.model}", flush=True)
                try:
                    weights = buildable(grid.model, sweep, limits)
                except Refused:
                    raise
                except (OSError, ValueError) as err:
                    raise Refused([f"--model: '{grid.model}' cannot be built: {err}"]) from None
                return weights, {**load_raw_tasks(grid, [t for t in tasks if t not in raw]), **raw}

            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="load") as pool:
                loading = pool.submit(load)
                # A sweep with no rows yet runs trials: Ray starts while the weights and data load (2-3 s each)
                if len(stored) == 0 and sweep.run.target_ci is None:
                    ray_started = start_ray_if_none(sweep.run.address)
                pretrained, raw = loading.result()
            grid = with_fingerprints(grid, {t: raw[t] for t in tasks}, pretrained, stored)
            sweep = dataclasses.replace(sweep, grid=grid)
        specs = experiment.build(grid_settings(grid, sweep), limits.num_layers, limits.num_heads)
        lines = []
        if not dry_run:
            specs, lines = reconcile(specs, stored)
        plan_function = experiment.plan_function() or plan_trials
        todo, planned, rerun_skips, table, note = plan_function(specs, folder, sweep, read=not dry_run)
        note = "\n".join(line for line in [note, *lines] if line)
        return Planned(specs, todo, planned, tuple(rerun_skips), table, note, raw or None, pretrained,
                       ray_started), sweep, limits
    except BaseException:
        stop_ray(ray_started)
        raise


def execute(sweep: Sweep, *, argv: list[str] | None = None, callbacks=(), dry_run: bool | None = None):
    """Run a resolved sweep: check everything, print the resolved grid, record the plan and the config, run
    what is not done on Ray, print the summary. Returns (the grid's rows as a DataFrame, what the runner
    returned: Tune's ResultGrid, or None when nothing ran, the exit code). Raises Refused."""
    dry_run = sweep.run.dry_run if dry_run is None else dry_run
    if dry_run:
        return planned_and_run(sweep, argv, callbacks, dry_run=True)
    # The lock's folder is made from these two: a bad one is refused before anything is written.
    problems = [p for option in options_of(sweep.experiment) if option.flag in ("--name", "--storage")
                for p in option.problems(sweep.value(option), None)]
    problems = problems or storage_problems(sweep.run.storage)
    if problems:
        raise Refused(problems)
    # One writer at a time: a second command for this sweep waits, then plans from the rows the first left.
    command = "python -m sweep " + (shlex.join(argv) if argv else f"--config {config_path(sweep)}")
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(sweep_lock(sweep_dir(sweep.run.storage, sweep.name), command))
        except OSError as err:  # a full disk or no permission, met by the lock's first write
            raise Refused([cannot_write(sweep, err)]) from None
        return planned_and_run(sweep, argv, callbacks, dry_run=False)


def record_sweep(sweep: Sweep, argv, rows: list[dict], rerun_skips) -> None:
    """The plan (sweep status reads it) and the resolved config beside the rows; a write that fails is Refused."""
    where = sweep_dir(sweep.run.storage, sweep.name)
    try:
        record_plan(where, argv or ["--config", str(config_path(sweep))], sweep.experiment, rows, rerun_skips)
        write_config(sweep, where)
    except OSError as err:
        raise Refused([cannot_write(sweep, err)]) from None


def cannot_write(sweep: Sweep, err: OSError) -> str:
    return (f"--storage: cannot write under {sweep_dir(sweep.run.storage, sweep.name)} ({err}); make room there or "
            "give another --storage")


def planned_and_run(sweep: Sweep, argv, callbacks, dry_run: bool):
    import pandas as pd

    planned, sweep, limits = plan(sweep, dry_run)
    folder = rows_dir(sweep.run.storage, sweep.name)
    if sweep.run.target_ci is not None:  # two stages, planned by the driver
        return precision_sweep(planned, sweep, argv, folder, limits.num_layers, callbacks)
    print(f"{sweep.experiment}: {sweep.grid.model} ({limits.num_layers} layers), storage {sweep.run.storage}/{sweep.name}")
    print(describe_settings(sweep, planned.specs))
    print(describe_grid(planned.specs))
    if planned.note:
        print(planned.note)
    if dry_run:
        experiment = EXPERIMENTS[sweep.experiment]
        if experiment.runner is None or experiment.trials_per_spec:  # finetuning trials: trainables.cost counts
            from sweep.estimate import estimate_text

            copies = getattr(sweep, experiment.trials_per_spec) if experiment.trials_per_spec else 1
            print(estimate_text(planned.specs, sweep.grid, sweep, limits.num_layers, folder, planned.raw, copies))
        return pd.DataFrame(planned.rows), None, 0
    try:
        record_sweep(sweep, argv, planned.rows, planned.rerun_skips)
        todo = planned.todo
        print(f"{len(planned.specs) - len(todo)} already done, {len(todo)} to run")
        results = None
        if todo:
            extra = {"callbacks": list(callbacks)} if callbacks else {}
            # A resume forms earlier packs again whole: with members whose rows stand, never with other trials.
            # plan_trials left out of todo exactly the specs with finished rows, so every spec is one or the other
            # (a search plans otherwise, but its runner takes no `known`): the store is not read again.
            known = planned.specs if sweep.run.resume else ()
            results = run(todo, sweep.grid, sweep, folder, planned.pretrained, planned.raw, known=known, **extra)
    finally:
        stop_ray(planned.ray_started)
    rows, code = report(folder, {row["trial_id"] for row in planned.rows}, planned.table)
    return rows, results, code


def precision_sweep(planned, sweep, argv, folder, num_layers: int, callbacks=()):
    """Plan, run and report a precision-targeted sweep (sweep.precision; the command's flow once its grid is built
    and the sweep's lock is held): (the rows, None, the exit code), as planned_and_run returns. Raises Refused."""
    import pandas as pd

    from sweep.estimate import stored_rows
    from sweep.precision import (cost_text, describe_target, end_table, paired_problems, stage_two, stage_two_text,
                                 target_of, targeted)

    target, grid, raw = target_of(sweep), sweep.grid, planned.raw
    specs = targeted(planned.specs, target)
    problems = paired_problems(specs, target)
    if problems:
        raise Refused(problems)
    pilot = [s for s in specs if s.trial_index < target.pilot]
    print(f"{sweep.experiment}: {grid.model} ({num_layers} layers), storage {sweep.run.storage}/{sweep.name}")
    print(describe_target(specs, target))
    print(describe_grid(pilot).replace("trials", "pilot", 1))
    if planned.note:
        print(planned.note)
    stored = stored_rows(folder)
    if sweep.run.dry_run:
        from sweep.experiments import EXPERIMENTS

        if EXPERIMENTS[sweep.experiment].runner is None:  # finetuning trials: what trainables.cost counts
            print(cost_text(specs, grid, sweep, num_layers, folder, target, stored, raw))
        return pd.DataFrame([s.row() for s in pilot]), None, 0
    record_sweep(sweep, argv, [s.row() for s in pilot], FINISHED)
    ray_session = RaySession(sweep, planned.pretrained, callbacks)
    try:
        done = finished_trial_ids(folder)  # read once: the store is read whole, not once a spec
        todo = [s for s in pilot if s.trial_id not in done]
        print(f"pilot stage: {len(pilot) - len(todo)} of {len(pilot)} already done, {len(todo)} to run", flush=True)
        if todo:
            ray_session.run(todo, sweep, folder, raw, known=landed_or_todo(specs, done, todo))
        second, table, _, _ = stage_two(specs, stored_rows(folder), target)
        record_sweep(sweep, argv, [s.row() for s in [*pilot, *second]], FINISHED)
        done = finished_trial_ids(folder)
        todo = [s for s in second if s.trial_id not in done]
        print(stage_two_text(table, second, todo, target), flush=True)
        # --resume in both stages: a trial goes on from its own checkpoints, found by its id, and the two stages
        # share none. A pilot retried first (one that failed, while another condition's stage 2 ran) made the
        # stage-2 trials of the run before start over.
        if todo:
            ray_session.run(todo, sweep, folder, raw, known=landed_or_todo(specs, done, todo))
    finally:
        ray_session.close()
    rows, code = report(folder, {s.trial_id for s in [*pilot, *second]}, lambda found: end_table(found, target))
    return rows, None, code


def landed_or_todo(specs: list[TrialSpec], done: set[str], todo: list[TrialSpec]) -> list[TrialSpec]:
    """The runner's `known` for a stage: the trials whose rows stand, and those it runs. Not a later stage's
    trial, nor one a loosened target no longer asks for: a resumed pack that held one would train it along as
    if its row stood, and drop the row."""
    running = {s.trial_id for s in todo}
    return [s for s in specs if s.trial_id in done or s.trial_id in running]


class RaySession:
    """One Ray for both stages: started at the first stage with trials to run (unless one is running), shut
    down at the end; the pretrained weights are those the plan loaded."""

    def __init__(self, sweep, pretrained, callbacks=()):
        self.sweep, self.pretrained, self.callbacks, self.owned = sweep, pretrained, callbacks, False

    def run(self, todo, sweep, folder, raw, known=()) -> None:
        import ray

        if not ray.is_initialized():
            start_ray(self.sweep.run.address)
            self.owned = True
        run(todo, sweep.grid, sweep, folder, self.pretrained, raw, callbacks=self.callbacks, known=known)

    def close(self) -> None:
        if self.owned:
            shutdown_ray()


def config_path(sweep: Sweep):
    from sweep.store import join

    return join(sweep_dir(sweep.run.storage, sweep.name), CONFIG_FILE)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["status"]:
        return status_main(argv[1:])
    try:
        sweep = parse_command_line(argv)
        _, _, code = execute(sweep, argv=argv)
    except Refused as err:
        return refuse(err.problems)
    return code


def plan_trials(specs: list[TrialSpec], folder, options, read: bool = True):
    """(specs to run, planned rows, statuses a rerun skips, the table printed at the end, a note for the grid):
    every spec is a trial, done once its row is finished."""
    done = finished_trial_ids(folder) if read else set()
    return [s for s in specs if s.trial_id not in done], [s.row() for s in specs], FINISHED, None, ""


def quiet_ray_logs() -> None:
    """Ray's token-authentication banner (Ray 2.60 turns token auth on for a local ray.init and says so at
    WARNING) is not the sweep's business: auth stays on, the line goes."""
    import logging

    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


# Ray's settings for a Ray of the command's own, read by the processes ray.init starts (a user's own value
# stands). The autoscaler's v1 monitor, on SIGTERM, reports its end to the GCS that ray.shutdown has already
# stopped, and is killed a second later: a second of every sweep's end (ray.shutdown 1.4 s, 0.35 s with v2's).
# A local Ray scales nothing; v2's monitor is the one the GCS is asked about, and ends at once.
# Ray starts a worker per core for its first driver, but Ray Tune gives its trials' actors a runtime_env of
# their own (env_vars, ray.tune.execution.class_cache), so no trial ever runs in one: two idle processes here,
# a core-second spent while the driver loads the weights. (A search's cells, plain tasks, did use them: each now
# starts its worker, about a second, once per cell.)
LOCAL_RAY = {"RAY_enable_autoscaler_v2": "1", "RAY_prestart_worker_first_driver": "0"}
# v2's monitor, on a Ray that cannot grow, calls every trial that waits for a free core or GPU infeasible: "No
# available node types can fulfill placement group requests ... Add suitable node types to this cluster", one
# line per waiting trial every 5 s, forwarded to the command's output. A local Ray's size is fixed, and what a
# trial asks for was checked before any started (gpu_problems; Tune says so itself of a trial that can never
# fit), so those lines are false alarms. Ray's driver forwards autoscaler events while ray_constants'
# AUTOSCALER_EVENTS (RAY_SCHEDULER_EVENTS, read when ray is imported) is on: off while a Ray of the command's own
# runs, unless the user set it; a cluster's, which can grow, keeps them.
SCHEDULER_EVENTS = "RAY_SCHEDULER_EVENTS"


@contextlib.contextmanager
def environment(settings: dict[str, str]):
    """os.environ with `settings` added where unset, for what starts inside; as it was afterwards."""
    added = {k: v for k, v in settings.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def start_ray(address: str | None) -> None:
    """Start a local Ray, or join the cluster at `address`; raises Refused with the one line that says why not."""
    import ray

    print(f"starting Ray ({'at ' + address if address else 'on this machine'})", flush=True)
    quiet_ray_logs()
    # Trials find tasks and weights in the object store, so workers need no path of the driver's. No runtime_env
    # (a trial's actor of a job with one started 0.6 s later). Workers tokenize nothing; the driver, which does,
    # forks Ray's processes after its tokenizer ran.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        # Only for a Ray of its own. A driver that joins a cluster with RAY_enable_autoscaler_v2 set takes the
        # cluster for v2 (ray.autoscaler.v2.utils.is_autoscaler_v2 trusts the local flag) and parses a v1
        # monitor's log lines as v2 events: a "Failed to parse event" traceback for each, 25 in a 12 s sweep,
        # which filled the lost-node test's unread pipe and stalled its sweep for 10 minutes.
        with environment(LOCAL_RAY if address in (None, "", "local") else {}):
            ray.init(address=address, include_dashboard=False, configure_logging=False)
        if started_here():
            quiet_autoscaler_events()
    except ConnectionError as err:  # no cluster (`--address auto` with none running), or a token refused
        from sweep.checks import connection_problem

        raise Refused([connection_problem(address, err)]) from None


def started_here() -> bool:
    """Whether ray.init started its Ray (address None joins one already running on this machine, which may be
    a cluster's head that can grow)."""
    import ray

    return bool(getattr(ray._private.worker._global_node, "head", False))


_EVENTS_BEFORE: list[int] = []  # what quiet_autoscaler_events found, for shutdown_ray to put back


def quiet_autoscaler_events() -> None:
    if SCHEDULER_EVENTS in os.environ:  # the user's own setting stands
        return
    from ray._private import ray_constants

    _EVENTS_BEFORE.append(ray_constants.AUTOSCALER_EVENTS)
    ray_constants.AUTOSCALER_EVENTS = 0


def shutdown_ray() -> None:
    """ray.shutdown, before the interpreter exits, so workers stop quietly instead of by SIGTERM; a Ray joined
    later by this process forwards its autoscaler's events as before."""
    import ray

    try:
        ray.shutdown()
    finally:
        if _EVENTS_BEFORE:
            from ray._private import ray_constants

            ray_constants.AUTOSCALER_EVENTS = _EVENTS_BEFORE.pop()


def start_ray_if_none(address: str | None) -> bool:
    """start_ray unless this process is already connected to a Ray (the Python API's caller may be); whether
    it started one."""
    import ray

    if ray.is_initialized():
        return False
    start_ray(address)
    return True


def stop_ray(started: bool) -> None:
    if started:
        # The summary's statistics import scipy (a second) while Ray's shutdown waits for its processes to end
        threading.Thread(target=importlib.import_module, args=("scipy.stats",), daemon=True).start()
        shutdown_ray()


def run(todo: list[TrialSpec], settings: GridSettings, options: Sweep, folder: Path, pretrained, raw: dict | None = None,
        callbacks=(), known=()):
    """Start (or join) Ray, tokenize, and hand the trials to the experiment's runner; returns what it returns.
    `known`: the trials whose rows stand, and `todo` (finetuning trials' runner forms a resumed pack again whole)."""
    import ray

    run_settings = options.run
    owns_ray = not ray.is_initialized()
    if owns_ray:
        start_ray(run_settings.address)
    try:
        problems = gpu_problems(run_settings.gpus_per_trial, ray.cluster_resources())
        if problems:
            raise Refused(problems)
        started = time.perf_counter()
        tasks = ", ".join(sorted({task for spec in todo for task in spec.tasks}))
        print(f"preparing {len(todo)} trials: loading and tokenizing {tasks}", flush=True)
        try:
            data = prepare_data(settings, todo, raw)
        except (OSError, ValueError) as err:  # a malformed file
            raise Refused([str(err)]) from None
        print(f"data and weights ready in {time.perf_counter() - started:.1f}s; trials start now\n"
              f"TensorBoard (per-epoch curves of every trial): tensorboard --logdir {parent(folder)}", flush=True)
        trackers = []
        if run_settings.logger:  # sweep.trackers imports MLflow's client through Ray's callback (1.4 s)
            from sweep.trackers import tracker_callbacks

            trackers = tracker_callbacks(options)
        extra = {"callbacks": [*trackers, *callbacks]}
        if not extra["callbacks"]:
            extra = {}
        if EXPERIMENTS[options.experiment].runner is None and known:  # finetuning trials: sweep.runner.run_trials
            extra["known"] = known
        returned = EXPERIMENTS[options.experiment].run_function()(
            todo,
            data=data,
            pretrained={settings.model: pretrained},
            folder=folder,
            tune_dir=parent(folder),
            cpus_per_trial=run_settings.cpus_per_trial,
            gpus_per_trial=run_settings.gpus_per_trial,
            options=options,
            **extra,
        )
        # run_trials and run_probing return (Tune's ResultGrid, the trial ids written); searches their cells.
        return returned[0] if isinstance(returned, tuple) else returned
    finally:
        if owns_ray:
            shutdown_ray()


def report(folder: Path, grid_ids: set[str], table=None):
    """Counts the rows of `grid_ids` and prints `table` of them (default: the per-condition summary); returns
    (the rows, the exit code)."""
    import pandas as pd

    from trialrows.readable import readable
    from trialrows.read import read_results
    from trialrows.summaries import condition_table

    try:
        rows = read_results(folder)
    except FileNotFoundError:  # not one row could be written (said as each failed): the count says so
        rows = pd.DataFrame(columns=["trial_id", "status"])
    rows = rows[rows["trial_id"].isin(grid_ids)] if len(rows) else rows
    statuses = rows["status"].value_counts().to_dict() if len(rows) else {}
    counts = "".join(f"; {status} {n}" for status, n in statuses.items())
    print(f"\nresults: {folder} ({len(rows)} of {len(grid_ids)} trials{counts})")
    if len(rows):  # as `analysis report` shows it: the interval in one column, counts as counts, empty ones left out
        print(readable((table or condition_table)(rows)).to_string(index=False))
    return rows, 0 if len(rows) == len(grid_ids) and statuses.get("error", 0) == 0 else 1


def entry() -> None:
    """The `reinit-sweep` console script: `python -m sweep`'s twin."""
    quiet_console()
    exit_now(main())


def exit_now(code: int) -> None:
    """Exit with `code` once the exit handlers have run (logging's, Ray's), but without the interpreter's
    teardown: after a sweep that is a second or more of freeing torch's, Ray's and pandas' modules object by
    object, which nothing needs (every row and file is written and closed by then)."""
    import atexit
    import threading

    for thread in threading.enumerate():  # as the interpreter would: a thread still writing finishes first
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def quiet_console() -> None:
    # Before Ray is imported (it reads these once): progress lines of different trials differ only in numbers
    # and ids, which Ray's log deduplication masks, so it would fold them into "[repeated Nx]"; Tune's legacy
    # console output prints nothing at verbose=0, where the new one prints a configuration box and a TensorBoard
    # command into Ray's session folder (none of our trials' events). The sweep shows its own progress.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


if __name__ == "__main__":
    entry()
