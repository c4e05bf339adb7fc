"""A sweep as one value (`Sweep`): the experiment, its grid (sweep.experiments.GridSettings) and how to run it
(`RunSettings`), resolved the same way from a config file, the command line or Python.

`resolve` takes what the user gave (by setting name: a config file's keys, the command line's options,
the Python API's keywords; the command line wins over the file) and fills in the rest: a preset's values,
then each setting's declared default. A preset never overrides what was given, and the demo's small-grid
picks (its k, trials and epochs) are left out as soon as the user names their own model, tasks or sizes.
Every sweep writes the value it ran, resolved, to `<storage>/<name>/sweep.yaml`: `python -m sweep --config
<that file>` runs it again exactly.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from pathlib import Path

from sweep.experiments import EXPERIMENTS, GRID, TASK_FILE_DEFAULTS, GridSettings
from sweep.packs import parse_pack
from sweep.checks import Refused  # noqa: F401  (raised by every part of the sweep; read from here)
from sweep.estimate import DEVICES
from sweep.precision import DEFAULT_MAX_TRIALS, DEFAULT_PILOT
from trialrows.declare import Option, at_least, declared, positive, setting
from trialrows.precision import MEAN, PAIRED
from trialrows.recipe import default_max_length, resolve_precision

RUN_GROUP = "running"
PRECISION_GROUP = "precision targets (Stein's two-stage procedure: a pilot per condition, then the count it needs)"
CONFIG_FILE = "sweep.yaml"  # the resolved config each sweep writes beside its rows
LOGGERS = ("wandb", "mlflow")
# Seconds between two epoch-end checkpoints of a trial. A BERT-base checkpoint (weights and Adam moments,
# 1.3 GB) took 3.65 s to a local disk here, more to a bucket: after every epoch that is 16% of a 500-example
# trial, while at most one per 15 minutes stays under 1% of any trial, and a lost machine costs at most ~15
# minutes of each of its trials. The paper's 500- and 5k-example trials finish before their first checkpoint
# is due: they simply start over. docs/benchmarks.md, "Checkpoints".
CHECKPOINT_EVERY = 900.0


def checkpoint_interval(value: str) -> float | None:
    """--checkpoint-every: seconds >= 0, or 'off'."""
    if value == "off":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or not math.isfinite(seconds):
        raise ValueError(f"'{value}' is not a number of seconds >= 0 (0: every epoch) or 'off'")
    return seconds


def failure_count(value: str) -> int:
    """--max-failures: a whole number >= 0."""
    if not str(value).isdigit():
        raise ValueError(f"'{value}' is not a whole number of restarts >= 0")
    return int(value)


def _gpus(gpus, _) -> list[str]:
    if 0 <= gpus <= 1 or (gpus > 1 and float(gpus).is_integer()):
        return []
    return [f"{gpus} must be a share of one GPU in [0, 1] (e.g. 0.25) or a whole number of GPUs"]


NAME_BYTES = 100  # a folder name: file systems take 255 bytes, and Tune's folders and files go inside it


def _control_characters(value: str) -> list[str]:
    """A path with a NUL (which no file system takes) or another control character: refused, not a traceback."""
    bad = sorted({repr(c) for c in value if ord(c) < 32 or ord(c) == 127})
    return [f"{value!r} holds the control character(s) {', '.join(bad)}; give a name without them"] if bad else []


def _name(name, _) -> list[str]:
    if bad := _control_characters(name):
        return bad
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        return [f"'{name}' must be one folder name (no '/', not '.' or '..'), made under --storage"]
    if len(name.encode()) > NAME_BYTES:
        return [f"'{name[:20]}...' is {len(name.encode())} bytes long; give a folder name of at most {NAME_BYTES}"]
    return []


def _storage(storage, _) -> list[str]:
    """The shape of a URI (a local folder is checked by writing, sweep.checks)."""
    if bad := _control_characters(storage):
        return bad
    scheme, sep, rest = storage.partition("://")
    if not sep:
        return []
    where = rest.split("?")[0]
    if scheme == "file" and not where.startswith("/"):
        return [f"'{storage}' names no folder; a file URI is file:///absolute/path"]
    if scheme in ("s3", "gs", "gcs") and not where.strip("/"):
        return [f"'{storage}' names no bucket; give {scheme}://bucket/prefix"]
    return []


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How a sweep runs: where, on what, and what it keeps. Changes no number a trial computes."""

    gpus_per_trial: float = setting(0.0, "a GPU share, e.g. 0.25; 0 = CPU", check=_gpus, bad=("1.5",), group=RUN_GROUP)
    cpus_per_trial: float = setting(1.0, "CPUs per trial (default 1)", check=positive, bad=("0",), group=RUN_GROUP)
    address: str | None = setting(None, "an existing Ray cluster (or 'auto'); default: start a local one",
                                  bad=("127.0.0.1:1",), group=RUN_GROUP)  # checked by connecting (sweep.checks)
    storage: str = setting("./results", "where rows, logs and checkpoints go: a folder (default ./results; on a "
                           "cluster one every node sees) or a URI: s3://bucket/prefix, gs://bucket/prefix, "
                           "file:///path", check=_storage, bad=("/dev/null/store",), group=RUN_GROUP)
    name: str | None = setting(None, "sweep name, a folder under --storage (default: the experiment)", check=_name,
                               bad=("../x",), group=RUN_GROUP)
    dry_run: bool = setting(False, "print the resolved grid and run nothing", group=RUN_GROUP, saved=False)
    resume: bool = setting(False, "continue the sweep's interrupted Tune experiment: unfinished trials go on from "
                           "their last checkpoints (default: finished trials are skipped, unfinished ones start "
                           "over)", group=RUN_GROUP, saved=False)
    checkpoint_every: float | None = setting(
        CHECKPOINT_EVERY, "checkpoint a trial (model, optimizer, progress) at the first epoch end at least SECONDS "
        f"after its last checkpoint; 0: every epoch; off: never (default {CHECKPOINT_EVERY:g})",
        type=checkpoint_interval, metavar="SECONDS", bad=("-1",), group=RUN_GROUP, null_word="off",
        show=lambda v: "off" if v is None else v)
    keep_checkpoints: bool = setting(False, "keep a finished trial's checkpoints (default: deleted once its row is "
                                     "written)", group=RUN_GROUP)
    max_failures: int = setting(2, "times a failed or preempted trial is restarted from its last checkpoint "
                                "(default 2)", type=failure_count, metavar="N", bad=("-1",), group=RUN_GROUP)
    pack: int | str = setting(
        "auto", "train up to N trials of the same task, size and schedule as one fused computation (one Tune "
        "trial, resources scaled to it, one row per trial); 1: each trial alone, unfused; auto: on CPUs each trial "
        "fused alone (the fused encoder is the faster there), on GPUs as many as fit in the free GPU memory; "
        "packs checkpoint as trials do (default auto). Sequential "
        "finetuning, searches and probing run unfused", type=parse_pack, metavar="N|auto", bad=("0",),
        group=RUN_GROUP)
    logger: tuple[str, ...] = setting((), "also log every trial's per-epoch figures and settings to wandb (Weights "
                                      "& Biases: WANDB_MODE=offline needs no account) or mlflow (MLFLOW_TRACKING_URI, "
                                      "default a file store beside the rows: <storage>/<name>/mlruns), through Ray "
                                      "Tune's own logger callbacks", choices=LOGGERS, bad=("tensorboard",),
                                      group=RUN_GROUP)
    estimate_for: str | None = setting(None, "the device a dry run's cost estimate is for: wall time and GPU-hours "
                                       "(core-hours on a CPU) from each trial's FLOPs, the device's peak and the "
                                       "store's measured MFU (default: cpu, or a100 with --gpus-per-trial)",
                                       choices=DEVICES, bad=("tpu",), group=RUN_GROUP)
    # How many trials a condition gets (sweep.precision): row columns, never part of a trial's id.
    target_ci: float | None = setting(None, "run each condition until its 95%% interval has at most this half-width "
                                      "W (replaces --trials): a pilot of --pilot-trials, then as many trials as "
                                      "its spread needs", metavar="W", check=positive, bad=("0",),
                                      group=PRECISION_GROUP)
    target_on: str | None = setting(None, "mean: each condition's mean; paired: its difference against the full "
                                    "model on the same trial indices (default mean)", choices=(MEAN, PAIRED),
                                    bad=("median",), group=PRECISION_GROUP)
    pilot_trials: int | None = setting(None, f"n0: pilot trials per condition, at least 2 (default {DEFAULT_PILOT})",
                                       metavar="N0", check=at_least(2), bad=("1",), group=PRECISION_GROUP)
    max_trials: int | None = setting(None, "the most trials of a condition; one stopped here says so (default "
                                     f"{DEFAULT_MAX_TRIALS})", metavar="N", check=at_least(2), bad=("1",),
                                     group=PRECISION_GROUP)


RUN = declared(RunSettings)
for _experiment in EXPERIMENTS.values():  # a misspelled name would never refuse anything
    if _unknown := sorted(set(_experiment.ignores) - {o.name for o in (*GRID, *RUN)}):
        raise ValueError(f"experiment '{_experiment.name}' ignores {_unknown}, which are not settings every "
                         "experiment has")


def options_of(experiment: str) -> tuple[Option, ...]:
    """Every option an experiment takes: the grid's and recipe's (GridSettings), the task files', its own,
    and how to run (sweep.config.RunSettings)."""
    return (*GRID, *TASK_FILE_DEFAULTS, *EXPERIMENTS[experiment].options, *RUN)
PRESET = Option("preset", "fills every setting you leave unset (default: demo, the offline MiniLM on the built-in "
                "synthetic task; paper: the paper's grid on bert-base-uncased)", type=str, choices=("demo", "paper"),
                group="grid")


@dataclasses.dataclass(frozen=True)
class Preset:
    values: dict  # by setting name, as a config file writes them
    # True: its values beyond what to run on (WHAT_TO_RUN_ON) are the demo's small-grid picks, left out as soon
    # as the user names any of what to run on; a grid of another model, task or size gets the declared defaults.
    picks: bool = False


WHAT_TO_RUN_ON = ("model", "tasks", "data_dir", "task_files", "sizes", "fractions", "skip")
PRESETS = {
    # Demo: every layer reinitialized (k=0) or every layer kept (k=6), one trial each, 500 examples, 3 epochs:
    # two trials, one per core, show the finding in about two minutes (docs/benchmarks.md, "Demo").
    "demo": Preset(dict(model="minilm", tasks=["synthetic"], sizes=[500], trials=["1"], k=[0, 6], epochs=3),
                   picks=True),
    "paper": Preset(dict(model="bert-base-uncased", tasks=["sst2", "cola", "qnli"], sizes=[500, 5000, 50000],
                         trials=["500=50", "3"], skip=["cola=50000"])),
}


def preset_values(experiment: str, preset: str, given) -> tuple[dict, tuple[str, ...]]:
    """(the preset's values for what was not given, the demo picks left out because the user named what to
    run on). An experiment's registry entry adds to or overrides the generic preset."""
    base = PRESETS[preset]
    values = {**base.values, **EXPERIMENTS[experiment].presets.get(preset, {})}
    dropped = ()
    if base.picks and any(name in given for name in WHAT_TO_RUN_ON):
        dropped = tuple(n for n in values if n not in WHAT_TO_RUN_ON and n not in given)
        values = {n: v for n, v in values.items() if n in WHAT_TO_RUN_ON}
    if "fractions" in given and "sizes" not in given:
        values["sizes"] = []  # fractions replace the preset's sizes; --sizes adds to them
    if "sizes" in given and "fractions" not in given:
        values.pop("fractions", None)  # the preset's subsets given as fractions (probing's full splits) go too
    return {n: v for n, v in values.items() if n not in given}, dropped


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One sweep, resolved: what a config file, the command line or the Python API asked for, presets and
    declared defaults filled in."""

    experiment: str
    grid: GridSettings
    run: RunSettings = RunSettings()
    preset: str = "demo"
    filled: tuple[str, ...] = ()  # the settings the preset filled in
    dropped: tuple[str, ...] = ()  # the demo's picks left out (the user named what to run on)
    given: tuple[str, ...] = ()  # the settings the user gave (the rest: preset or declared default)

    def __getattr__(self, name: str):
        """Any setting by name (a runner reads `options.max_failures`, `options.num_samples`)."""
        if name.startswith("__") or name in ("grid", "run"):
            raise AttributeError(name)
        if name in RUN_NAMES:
            return getattr(self.run, name)
        return getattr(self.grid, name)

    @property
    def name(self) -> str:
        return self.run.name or self.experiment

    def value(self, option: Option):
        return getattr(self, option.name) if option not in TASK_FILE_DEFAULTS else None

    def settings(self) -> dict:
        """Every setting a config file holds, by name, as it writes them (the resolved config)."""
        written = {"experiment": self.experiment, "preset": self.preset}
        ignores = EXPERIMENTS[self.experiment].ignores  # given back, they would be refused (and change nothing)
        # a preset's words for sizes or tasks left out (the paper's 500=50 and cola=50000 beside --sizes 5000
        # --tasks sst2), given back, would be refused as naming no cell
        strays = dict(zip(("trials", "skip"), self.grid.strays()))
        for option in options_of(self.experiment):
            if option.saved and option.name not in ignores:
                value = self.value(option)
                if option.name in strays:
                    value = tuple(v for v in value if v not in strays[option.name])
                written[option.name] = option.written(value)
        if self.run.target_ci is not None:
            written.pop("trials", None)  # the target sets each condition's count; a file that fixed it is refused
        written["name"] = self.name
        if "://" not in self.run.storage:  # a relative folder would be another one from another directory
            written["storage"] = str(Path(self.run.storage).expanduser().resolve())
        return written


RUN_NAMES = {o.name for o in RUN}
ALIASES = {"task_file": "task_files"}  # a setting's name spelled as its flag (--task-file)


def resolve(experiment: str, given: dict, preset: str | None = None) -> Sweep:
    """A Sweep from the settings given (by name, values as a config file or the Python API holds them:
    words are read as on the command line). Raises Refused naming every setting it cannot read."""
    if experiment not in EXPERIMENTS:
        raise Refused([f"experiment: '{experiment}' is not one of {', '.join(EXPERIMENTS)}"])
    options = {o.name: o for o in options_of(experiment)}
    problems = []
    for alias, name in ALIASES.items():  # the flag's spelling (`task_file=`, as a config file may write it)
        if alias in given:
            if name in given:
                problems.append(f"{name}: given twice, as {alias} and as {name}; keep one")
            given = {name if key == alias else key: value for key, value in given.items()}
    problems += unknown_settings(experiment, given)
    preset = preset or "demo"
    if preset not in PRESETS:
        problems.append(f"--preset: '{preset}' is not one of {', '.join(PRESETS)}")
        preset = "demo"
    values, read = {}, {}
    for name, value in given.items():
        if name in options:
            try:  # no sizes means something beside fractions: theirs replace the preset's (as the resolved config says)
                read[name] = options[name].read(value, empty=name == "sizes" and bool(given.get("fractions")))
            except ValueError as err:
                problems.append(str(err))
    if "task_files" not in read:
        problems += [f"{o.flag}: only means something with --task-file NAME=DIR (given: "
                     f"{' '.join(map(str, read[o.name])) if isinstance(read[o.name], tuple) else read[o.name]})"
                     for o in TASK_FILE_DEFAULTS if o.name in read]
    if problems:
        raise Refused(problems)
    fill, dropped = preset_values(experiment, preset, read)
    for name, option in options.items():
        if name in read:
            values[name] = read[name]
        elif name in fill:
            values[name] = option.read(fill[name], empty=True)  # a preset's [] is meant (no sizes: fractions)
        else:
            values[name] = option.default
    values["data_dir"] = str(Path(values["data_dir"]).expanduser().resolve()) if values["data_dir"] else None
    values["task_files"] = task_sources(values)
    if values["max_length"] is None:
        values["max_length"] = default_max_length([*values["tasks"], *(values.get("intermediate_tasks") or ())])
    values["precision"] = resolve_precision(values["precision"], values["gpus_per_trial"])
    own = tuple((o.name, values[o.name]) for o in EXPERIMENTS[experiment].options)
    grid = GridSettings(**{o.name: values[o.name] for o in GRID}, own=own)
    run = RunSettings(**{o.name: values[o.name] for o in RUN})
    # The picks named are those this experiment reads (the demo's --k is incremental's, probing reads no --epochs).
    dropped = tuple(n for n in dropped if n in options and n not in EXPERIMENTS[experiment].ignores)
    return Sweep(experiment, grid, run, preset, tuple(n for n in fill if n in options), dropped, tuple(read))


def unknown_settings(experiment: str, given) -> list[str]:
    flags = {o.name: o.flag for o in options_of(experiment)}
    names = set(flags)
    problems = []
    for name in given:
        if name in names:
            continue
        elsewhere = [e for e, entry in EXPERIMENTS.items() if name in {o.name for o in entry.options}]
        if elsewhere:
            problems.append(f"{flag_of(name)}: an option of {', '.join(elsewhere)}; {experiment} does not take it")
        else:
            close = difflib.get_close_matches(name, sorted(names), n=1)
            problems.append(f"{flag_of(name)}: not a setting of {experiment}"
                            + (f"; did you mean {flags[close[0]]}?" if close else
                               f"; its settings: python -m sweep {experiment} --help"))
    return problems


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def task_sources(values: dict) -> tuple:
    """The --task-file definitions, each with its own columns or else the --text-columns, --label-column,
    --splits and --metric every task file shares; folders made absolute."""
    from trainables.tasks import HUB_PREFIX

    sources = []
    for source in values["task_files"] or ():
        location = source.location
        if location and not location.startswith(HUB_PREFIX):
            location = str(Path(location).expanduser().resolve())
        sources.append(dataclasses.replace(
            source, location=location,
            text_columns=source.text_columns or tuple(values.get("text_columns") or ()),
            label_column=source.label_column or values.get("label_column") or "",
            splits=source.splits or (tuple(values["splits"]) if values.get("splits") else None),
            metric=source.metric or values.get("metric")))
    return tuple(sources)


# --- config files ---------------------------------------------------------------------------------------


def read_config(path: str | Path) -> tuple[str | None, str | None, dict]:
    """(experiment, preset, settings by name) from a YAML (.yaml, .yml) or TOML (.toml) file. Keys are
    setting names (`max_grad_norm`, or the flag's spelling `max-grad-norm`); values as on the command line
    or as YAML/TOML types."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise Refused([f"--config: cannot read {path} ({err})"]) from None
    try:
        if path.suffix == ".toml":
            import tomllib

            document = tomllib.loads(text)
        else:
            import yaml

            document = yaml.load(text, Loader=_yaml_loader())
    except KeyTwice as err:
        raise Refused([f"--config: {path} {err}"]) from None
    except Exception as err:  # yaml.YAMLError, tomllib.TOMLDecodeError: they say where
        raise Refused([f"--config: {path} does not parse ({err})"]) from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise Refused([f"--config: {path} must hold a mapping of settings, not {type(document).__name__}"])
    settings, keys = {}, {}
    for key, value in document.items():
        name = str(key).replace("-", "_")
        name = ALIASES.get(name, name)
        if name in keys:  # one would silently win over the other
            raise Refused([f"--config: {path} gives {name} twice, as '{keys[name]}' and as '{key}'; keep one"])
        settings[name], keys[name] = value, key
    experiment, preset = settings.pop("experiment", None), settings.pop("preset", None)
    return experiment, preset, settings


class KeyTwice(ValueError):
    """A YAML mapping with a key given twice."""


_LOADER = []


def _yaml_loader():
    """PyYAML's safe loader, but a key given twice is refused: PyYAML keeps the later value without a word (an
    `lr` added below the file's own), where TOML and the command line's lists refuse a value given twice."""
    if not _LOADER:
        import yaml

        def mapping(loader, node, deep=False):
            seen = []
            for key_node, _ in node.value:  # merged keys (<<: *anchor) are not among these: overriding them is meant
                key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                if earlier := [at for other, at in seen if other == key]:
                    raise KeyTwice(f"gives {key} twice (lines {earlier[0]} and {line}); keep one")
                seen.append((key, line))
            return loader.construct_mapping(node, deep)

        loader = type("SweepLoader", (yaml.SafeLoader,), {})
        loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
        _LOADER.append(loader)
    return _LOADER[0]


def to_yaml(sweep: Sweep) -> str:
    import yaml

    header = (f"# The resolved settings of `{sweep.experiment}` sweep '{sweep.name}': every setting, presets filled in.\n"
              f"# Run it again, exactly: python -m sweep --config <this file>   (command-line options override it)\n")
    return header + yaml.safe_dump(sweep.settings(), sort_keys=False, allow_unicode=True, width=120)


def write_config(sweep: Sweep, folder) -> None:
    """The resolved config beside the sweep's rows (a local folder or a storage URI)."""
    from sweep.store import filesystem, join

    fs, path = filesystem(join(folder, CONFIG_FILE))
    fs.create_dir(path.rsplit("/", 1)[0])
    with fs.open_output_stream(path) as out:
        out.write(to_yaml(sweep).encode())
