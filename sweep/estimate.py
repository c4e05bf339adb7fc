"""What a sweep will cost before it runs, and what a running one has left.

A trial's time is its model FLOPs (counted as `trainables.cost` counts them in every trial) over a device's
peak times a model-FLOPs utilisation (MFU) measured over the wall clock, plus a little work outside the trial's
own clock; trials are scheduled in grid order, each to the first free slot, after the sweep's start.

- FLOPs: each trial's own, from the token lengths of its subset and of the dev split, tokenized as the sweep
  tokenizes them (from `datasets`' cache after the first time), when the task's data is at hand (a local
  folder, the synthetic task, a task file); a hub task in a dry run (nothing is downloaded) is counted from
  typical lengths (`TYPICAL_TOKENS`), said so. A stored row of the same trial gives its FLOPs exactly.
- Peak: in the precision the trials run in (`--precision`; auto: bf16 on a GPU, fp32 on a CPU, resolved for
  the device estimated for), the data sheets' dense peak for a GPU (`trainables.cost.GPU_PEAK_FLOPS`); for a CPU,
  the matmul peak of one trial's threads, as a trial measures it: in a dry run measured now (the rows' MFU is
  relative to the peak each measured under its own load, so rows run on a busier or quieter machine carry
  over), in `sweep status` the running sweep's rows' own.
- MFU: the model FLOPs of the finished rows on that kind of device over their wall seconds, in all, over their
  median peak, a fused pack's rows together over its wall clock (a row without `pack_id`: x its pack size): in a
  dry run every sweep's rows under `--storage` (the same model's when there are some), weighed against
  `DEFAULT_MFU` as if it were `PRIOR_ROWS` rows (a machine's speed moves 15-20% from one sweep to the next here,
  so two rows are mostly the default and forty mostly theirs); in `sweep status` the running sweep's own alone.
  A GPU row is read as its pack holding one whole device.
- Slots: on a CPU, the CPUs over `--cpus-per-trial` (this machine's, or the cluster's when Ray runs; a trial
  given less than a CPU shares one); on a GPU, one device's throughput (trials sharing it share it): wall time
  on one device, and its GPU-hours. `sweep status` counts a pack as one slot.
- A dry run prices the trials a rerun would run: those without a finished row in the sweep's folder.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
import os

import numpy as np
import pandas as pd

# --estimate-for: a CPU (this machine's kind) or a GPU of the data sheets.
DEVICES = ("cpu", "a10g", "a100", "h100", "h200", "l4", "l40s", "t4", "v100")
# MFU over the wall clock when the store has no finished row on that kind of device, and the prior its rows are
# weighed against. CPU: this 2-core VM's MiniLM trials on real SST-2 and CoLA run by the sweep command on an
# idle machine: 0.437 over the 8 rows of two sweeps and 0.459 for fused_bench's sweep row (docs/benchmarks.md,
# "Precision targets and cost estimates", 2026-11-24; 0.33 before, from rows run beside the test suite). GPU: an
# H100, --pack auto's groups of 34 BERT-base trials (SST-2, 500 examples, 5 epochs, bf16), setup, probe and
# evaluation included: 0.0225 of the dense bf16 peak for the paper's 1,950 trials, projected from three runs of
# four groups (the first with its one-time costs, 39.9 s; then 31.4 s a group with the next set up beside it; the
# last 28.5: 30.1 minutes), rounded down to 0.022 (docs/benchmarks.md, "Page-locked pages registered",
# 2026-11-27; 0.0203 measured over two groups before, 0.0123 at the code of 2026-11-26 13:30). Batch 8
# of short sentences is bound by memory traffic (AdamW over fp32 master weights, clipping), not by FLOPs; 5% had
# been assumed before. Unfused trials on a GPU run far lower (0.001-0.002 for a pack of 1 or the Trainer peer
# there): the default is --pack auto's, and --pack 1 (every trial unfused, one Hugging Face model each) takes
# UNFUSED_GPU_MFU, the middle of that range, which 0.022 would make look 10-20x faster than it runs.
DEFAULT_MFU = {"cpu": 0.44, "gpu": 0.022}
UNFUSED_GPU_MFU = 0.0015
# An fp32 trial on a GPU (or bf16 on a card without bf16 tensor cores), of which no row has been measured: its
# matmuls run at the fp32 peak, 1/r = 14.8x slower on an H100, while the rest of a step (the update's memory
# traffic over fp32 master weights) stays. So from bf16's measured m = 0.022 and a matmul efficiency e:
# 1 / (r / m + (1 - r) / e) of the fp32 peak, 0.08-0.14 for e = 0.11-0.23 (the projection's model FLOPs took 3-6
# minutes of the grid's 30), where bf16's default would have said 0.022: 4-6x the time. Derived, not measured.
DERIVED_FP32_GPU_MFU = 0.1
PRIOR_ROWS = 4
# Seconds once per sweep (Ray's start, loading and tokenizing the tasks, loading the weights) and per trial
# outside its own clock (its Ray actor, its row), on this VM (docs/benchmarks.md); a second stage of a
# precision-targeted sweep starts its Tune run again (Ray stays up).
STARTUP_SECONDS, TRIAL_OVERHEAD_SECONDS, STAGE_SECONDS = 25.0, 2.0, 8.0
# Tokens per example (mean, mean of squares) of the train and dev splits of tasks counted without their data (a
# hub task in a dry run): measured with the BERT uncased vocabulary on the GLUE files here (QNLI's train split is
# not here: its dev split's figures); any other task: DEFAULT_TOKENS. SQuAD 2.0: per question, over its windows
# at its default --max-length 384 (1.02-1.03 a question), on the slices here (train: the official split's first
# 10 articles, 4,719 questions; dev: its first, 208).
TYPICAL_TOKENS = {"sst2": ((13.3, 269.0), (25.5, 764.0)), "cola": ((11.3, 145.0), (11.7, 159.0)),
                  "qnli": ((51.0, 2947.0), (51.0, 2947.0)), "squad_v2": ((174.0, 35317.0), (161.8, 30447.0))}
DEFAULT_TOKENS = ((64.0, 64.0**2 * 1.25),) * 2
DEV_SIZES = {"sst2": 872, "cola": 1043, "qnli": 5463, "rte": 277, "mrpc": 408, "stsb": 1500, "wnli": 71,
             "squad_v2": 11873}  # GLUE's dev splits, for hub tasks counted without their data
# Hidden sizes of the paper's hub models, whose config a dry run does not download (their layers and heads
# are sweep.cli.KNOWN_SHAPES'); feed-forward layers are 4x as wide.
KNOWN_HIDDEN = {"bert-base-uncased": 768, "bert-base-cased": 768, "bert-large-uncased": 1024}


def trial_overhead(device: str) -> float:
    """Seconds a trial costs outside its own clock. On GPUs --pack auto puts a hundred-odd trials in one Tune
    actor (sweep.packs: three groups of what fits), so the actor's start is a few hundredths of a second a
    trial, and a pack's setup and evaluation are inside the rows' wall time, which the MFU is measured over."""
    return TRIAL_OVERHEAD_SECONDS if device == "cpu" else 0.0


@dataclasses.dataclass(frozen=True)
class Rate:
    """How fast trials go on one kind of device."""

    device: str  # a DEVICES name
    peak: float  # FLOP/s of one slot
    mfu: float  # model FLOPs per second of a trial's wall clock, over the peak
    slots: int  # trials at once
    source: str  # where the MFU comes from, for the printout
    startup: float = STARTUP_SECONDS
    overhead: float = TRIAL_OVERHEAD_SECONDS
    share: float = 1.0  # CPUs of a slot (core-hours), or 1 device (GPU-hours)

    def trial_seconds(self, flops: float) -> float:
        return flops / (self.peak * self.mfu) + self.overhead

    @property
    def gpu(self) -> bool:
        return self.device != "cpu"


def schedule_seconds(durations, slots: int) -> float:
    """Wall time of jobs run in the given order, each started on the first slot to come free."""
    free = [0.0] * max(1, int(slots))
    for duration in durations:
        heapq.heapreplace(free, free[0] + float(duration))
    return max(free)


def sweep_seconds(flops, rate: Rate, started: bool = False) -> float:
    """A sweep's wall time: its start (unless `started`), then its trials on the rate's slots."""
    durations = [rate.trial_seconds(f) for f in flops]
    if not durations:
        return 0.0
    return (0.0 if started else rate.startup) + schedule_seconds(durations, rate.slots)


def device_hours(flops, rate: Rate) -> float:
    """GPU-hours (on a GPU) or core-hours (on a CPU) the trials hold their devices for."""
    return sum(rate.trial_seconds(f) for f in flops) * rate.share / 3600


def device_kind(device) -> str | None:
    """A row's `device` (torch's name for it) as a DEVICES name; None for a device not listed."""
    if not isinstance(device, str):
        return None
    from trainables.cost import GPU_PEAK_FLOPS  # torch comes with it: `sweep status` needs it only here

    if device == "cpu":
        return "cpu"
    for key in GPU_PEAK_FLOPS:  # the data sheets' order: H200 before H100, L40S before L4
        if key.lower() in device.lower():
            return key.lower() if key.lower() in DEVICES else None
    return None


def measured_mfu(rows: pd.DataFrame, device: str, model: str | None = None,
                 precision: str | None = None) -> tuple[float, float, int, str] | None:
    """(MFU over the wall clock, the peak the rows measured, rows, which rows) from the store's finished rows on
    `device` (in `precision` when there are such rows: each is measured against its own precision's peak): the
    same model's when there are any, else every model's; None without such rows. MFU x peak is their FLOPs over
    their wall seconds."""
    needed = {"model_flops", "wall_seconds", "peak_flops", "device", "status"}
    if rows is None or rows.empty or not needed <= set(rows.columns):
        return None
    pack = pd.to_numeric(rows["pack_size"], errors="coerce").fillna(1) if "pack_size" in rows else \
        pd.Series(1.0, index=rows.index)
    flops, wall, peak = (pd.to_numeric(rows[c], errors="coerce") for c in ("model_flops", "wall_seconds", "peak_flops"))
    usable = (rows["status"] == "ok") & (flops > 0) & (wall > 0) & (peak > 0) & \
        (rows["device"].map(device_kind) == device)
    if not usable.any():
        return None
    if precision is not None and "precision" in rows and (usable & (rows["precision"] == precision)).any():
        usable &= rows["precision"] == precision
    same = usable & (rows["model"] == model) if model is not None and "model" in rows else usable
    picked, which = (same, f"{int(same.sum())} finished rows of {model}") if same.any() else \
        (usable, f"{int(usable.sum())} finished rows of other models")
    # Their FLOPs over their wall seconds in all (the rate that gives their total time back), over their peak:
    # a CPU's peak, measured at each trial's start, moves with the machine's load, so MFU is not averaged. A
    # fused pack's rows each carry the wall clock of the whole Tune trial up to their end (a later group's
    # includes the groups before it), so a pack counts once: its rows' FLOPs over its longest wall.
    key = pack_key(rows)
    alone = ~key.str.startswith(PACKED)  # no pack_id: the row stands for its pack_size trials
    totals = pd.DataFrame({"flops": flops * pack.where(alone, 1), "wall": wall})[picked].groupby(key[picked])
    rate = float(totals["flops"].sum().sum() / totals["wall"].max().sum())
    typical_peak = float(peak[picked].median())
    return rate / typical_peak, typical_peak, int(picked.sum()), which


PACKED = "pack:"


def pack_key(rows: pd.DataFrame) -> pd.Series:
    """Which computation each row's wall clock measured: its fused pack (`pack_id`), else the row alone."""
    own = pd.Series([f"row:{i}" for i in range(len(rows))], index=rows.index, dtype=object)
    if "pack_id" not in rows:
        return own
    packed = rows["pack_id"].map(lambda p: f"{PACKED}{p}" if isinstance(p, str) and p else None)
    return packed.where(packed.notna(), own).astype(object)


def rate_for(device: str, rows: pd.DataFrame | None, model: str, cpus_per_trial: float, cpus: float | None = None,
             precision: str = "auto", fused: bool = True) -> Rate:
    """The rate of trials of `model` in `precision` on `device`: the store's rows' MFU weighed against the
    default's (`blended_mfu`), times the data sheet's peak in that precision or this CPU's, measured now.
    `fused` False: on a GPU the trials train unfused (--pack 1), whose default is UNFUSED_GPU_MFU."""
    from trainables.cost import GPU_PEAK_FLOPS, NO_BF16_CORES, cpu_peak  # measured once, as a trial measures it
    from trialrows.recipe import resolve_precision

    precision = resolve_precision(precision, 0.0 if device == "cpu" else 1.0)
    measured = measured_mfu(rows, device, model, precision)
    threads = max(1, int(cpus_per_trial or 1))
    if device == "cpu":
        cpus = cpus or os.cpu_count() or 1
        # A trial runs at least one thread: given less than a core, it shares that core with the slots beside it.
        held = min(float(cpus_per_trial or 1), threads)
        slots, share = max(1, int(cpus // max(cpus_per_trial or 1, 1e-9))), held
        peak = cpu_peak(threads, precision) * held / threads
        where = (f"{flops_per_second(peak)} {precision} matmul peak of {threads} thread{'s' * (threads > 1)}, "
                 "measured here now")
        if held < threads:
            where += f", shared by {threads / held:g} trials"
    else:
        key = next(k for k in GPU_PEAK_FLOPS if k.lower() == device)
        slots, share, peak = 1, 1.0, GPU_PEAK_FLOPS[key][precision]
        emulated = precision == "bf16" and key in NO_BF16_CORES
        where = f"{flops_per_second(peak)}, {key}'s data-sheet dense {'fp32' if emulated else precision} peak"
        if emulated:
            where += " (no bf16 tensor cores: bf16 runs at fp32's rate)"
    default, stated = DEFAULT_MFU["cpu" if device == "cpu" else "gpu"], "the stated default"
    if device != "cpu" and not fused:
        default, stated = UNFUSED_GPU_MFU, "the stated default of unfused trials (--pack 1) on a GPU"
    elif device != "cpu" and (precision == "fp32" or emulated):
        default, stated = DERIVED_FP32_GPU_MFU, "the default derived for fp32 from bf16's (no fp32 GPU run measured)"
    if measured:
        mfu = blended_mfu(measured[0], measured[2], default)
        source = (f"MFU {mfu:.3f}: the FLOPs over the wall seconds of the store's {measured[3]} on {device} "
                  f"({measured[0]:.3f} against their {flops_per_second(measured[1])} peak), weighed against {stated} "
                  f"{default:g} as {PRIOR_ROWS} rows")
    else:
        mfu = default
        source = f"MFU {mfu:g}, {stated} (no finished row on {device} in the store)"
    return Rate(device, peak, mfu, slots, f"{where}; {source}", overhead=trial_overhead(device), share=share)


def flops_per_second(peak: float) -> str:
    return f"{peak / 1e12:.0f} TFLOP/s" if peak >= 1e12 else f"{peak / 1e9:.0f} GFLOP/s"


def blended_mfu(measured: float, rows: int, default: float, prior_rows: int = PRIOR_ROWS) -> float:
    """The rows' MFU and the default's, weighed as `rows` against `prior_rows` rows."""
    return (rows * measured + prior_rows * default) / (rows + prior_rows)


# --- FLOPs per trial ----------------------------------------------------------------------------------------


def model_shape(model: str, num_layers: int, num_labels: int = 2):
    """The classifier's `trainables.cost.FlopShape`, as `finetune` counts its FLOPs: the model built from its
    config on the meta device (no weights read); for a hub model a dry run does not download, BERT's layout at
    its known size."""
    return _model_shape(model, num_layers, num_labels)


@functools.lru_cache(maxsize=None)
def _model_shape(model: str, num_layers: int, num_labels: int):
    import torch
    from transformers import AutoModelForSequenceClassification, BertConfig

    from trainables.cost import flop_shape
    from trainables.models import load_config

    if model in KNOWN_HIDDEN:
        hidden = KNOWN_HIDDEN[model]
        config = BertConfig(hidden_size=hidden, num_hidden_layers=num_layers, num_attention_heads=hidden // 64,
                            intermediate_size=4 * hidden)
    else:
        config = load_config(model)
    config.num_labels = num_labels
    with torch.device("meta"):
        classifier = AutoModelForSequenceClassification.from_config(config)
    return flop_shape(classifier)


def trial_flops(spec, data: dict | None, shape) -> float:
    """The model FLOPs a trial will count: its epochs over its subset's token lengths, each dev evaluation
    (every `eval_every` epochs and after the last), and sequential finetuning's intermediate round.
    `data`: the tokenized tasks by data key (sweep.data.prepare_data), or None (typical lengths)."""
    from sweep.grid import data_key
    from trainables.cost import sequence_flops
    from trainables.finetune import FinetuneConfig, draw_rows

    def train(task: str) -> float:
        tokenized = (data or {}).get(data_key(task, spec.max_length))
        if tokenized is None:
            return spec.epochs * _typical(task, spec.train_size, shape, True, spec.batch_size)
        lengths = tokenized.train.lengths[draw_rows(tokenized.train, spec.train_size, spec.subset_seed)]
        return spec.epochs * sequence_flops(lengths, shape, True, spec.batch_size)

    evaluations = sum(epoch == spec.epochs or (spec.eval_every > 0 and epoch % spec.eval_every == 0)
                      for epoch in range(1, spec.epochs + 1))  # as trainables.finetune.evaluated_at
    tokenized = (data or {}).get(data_key(spec.task, spec.max_length))
    eval_batch = FinetuneConfig.eval_batch_size
    dev = sequence_flops(tokenized.validation.lengths, shape, False, eval_batch) if tokenized is not None else \
        _typical(spec.task, DEV_SIZES.get(spec.task, 1000), shape, False, eval_batch)
    return train(spec.task) + evaluations * dev + (train(spec.intermediate_task) if spec.intermediate_task else 0.0)


def _typical(task: str, examples: int, shape, train: bool, batch_size: int) -> float:
    """FLOPs of one pass over `examples` of typical length (`TYPICAL_TOKENS`)."""
    from trainables.cost import token_flops

    mean, square = TYPICAL_TOKENS.get(task, DEFAULT_TOKENS)[0 if train else 1]
    return token_flops(examples * mean, examples * square, -(-examples // batch_size), shape, train)


def local_data(settings, specs, raw=None) -> tuple[dict | None, str]:
    """The tokenized tasks of `specs` when their data is at hand (not the hub: a dry run downloads nothing),
    and a note of how FLOPs were counted."""
    from sweep.data import prepare_data

    if settings.data_dir is None and any(t not in ("synthetic", *settings.sources) for s in specs for t in s.tasks):
        return None, "FLOPs from typical token lengths (a hub task: a dry run reads no hub data)"
    try:
        if settings.task_files:  # the user's files: read as given
            return prepare_data(settings, specs, raw), COUNTED
        # Several dry runs in one process (the tests, a notebook) tokenize a built-in or local task once.
        key = (settings.model, settings.data_dir, settings.max_length,
               tuple(sorted({t for s in specs for t in s.tasks})), max(s.train_size for s in specs))
        if key not in _TOKENIZED:
            _TOKENIZED[key] = prepare_data(settings, specs, raw)
        return _TOKENIZED[key], COUNTED
    except (OSError, ValueError, SystemExit) as err:
        return None, f"FLOPs from typical token lengths (the data could not be read: {err})"


COUNTED = "FLOPs from each trial's own subset and the dev split"
_TOKENIZED: dict = {}


def spec_flops(specs, settings, num_layers: int, stored: pd.DataFrame | None = None, raw=None) -> tuple[list[float], str]:
    """Each spec's model FLOPs (a stored row of the same trial gives its own), and how they were counted."""
    known = {}
    if stored is not None and len(stored) and "model_flops" in stored:
        ok = stored[(stored["status"] == "ok") & pd.to_numeric(stored["model_flops"], errors="coerce").gt(0)]
        known = dict(zip(ok["trial_id"], ok["model_flops"].astype(float)))
        if "settings_id" in ok:  # a dry run's specs carry no fingerprints: their ids are the rows' settings ids
            known = {**{i: f for i, f in zip(ok["settings_id"], ok["model_flops"].astype(float))
                        if isinstance(i, str)}, **known}
    todo = [s for s in specs if s.trial_id not in known]
    data, note = local_data(settings, todo, raw) if todo else (None, "FLOPs from the store's rows")
    labels = {key: task.num_labels for key, task in (data or {}).items()}
    shapes = {}
    flops = []
    for spec in specs:
        if spec.trial_id in known:
            flops.append(known[spec.trial_id])
            continue
        from sweep.grid import data_key

        labels_of = labels.get(data_key(spec.task, spec.max_length), 2)
        shape = shapes.setdefault(labels_of, model_shape(settings.model, num_layers, labels_of))
        flops.append(trial_flops(spec, data, shape))
    return flops, note


# --- what the command prints ---------------------------------------------------------------------------------


def hours(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def cost_table(specs, flops, rate: Rate) -> str:
    """Each trial's FLOPs and time (per cell with the range over its trials when the grid is long)."""
    frame = pd.DataFrame({"task": [s.task for s in specs], "size": [s.train_size for s in specs],
                          "epochs": [s.epochs for s in specs], "trial": [s.trial_id for s in specs],
                          "flops": flops})
    frame["seconds"] = frame["flops"].map(rate.trial_seconds)
    if len(frame) <= 24:
        # A dry run loads no data, so its specs carry no fingerprints: their ids are the rows' `settings_id`, not
        # the `trial_id` the rows are named by.
        lines = [f"{'settings_id':<56} {'FLOPs':>9} {'time':>8}"]
        lines += [f"{r.trial:<56} {r.flops:>9.3g} {hours(r.seconds):>8}" for r in frame.itertuples()]
        return "\n".join(lines)
    cells = frame.groupby(["task", "size", "epochs"], sort=True).agg(
        trials=("trial", "size"), low=("flops", "min"), high=("flops", "max"), seconds=("seconds", "mean"))
    lines = [f"{'task':<10} {'size':>7} {'epochs':>6} {'trials':>7} {'FLOPs per trial':>19} {'time per trial':>14}"]
    for (task, size, epochs), cell in zip(cells.index, cells.itertuples(index=False)):
        spread = f"{cell.low:.3g}" if f"{cell.low:.3g}" == f"{cell.high:.3g}" else f"{cell.low:.3g}-{cell.high:.3g}"
        lines.append(f"{task:<10} {size:>7} {epochs:>6} {cell.trials:>7} {spread:>19} {hours(cell.seconds):>14}")
    return "\n".join(lines)


def summary_line(label: str, flops, rate: Rate, started: bool = False) -> str:
    unit = "GPU-hours" if rate.gpu else "core-hours"
    where = f"one {rate.device}" if rate.gpu else f"{rate.slots} slot{'s' * (rate.slots > 1)} of this machine's kind"
    return (f"{label}: {len(flops):,} trials, {sum(flops):.3g} FLOPs; {hours(sweep_seconds(flops, rate, started))} "
            f"wall on {where}{'' if started else ' (start included)'}, {device_hours(flops, rate):.2f} {unit}")


def header(rate: Rate, note: str) -> str:
    return (f"cost on {rate.device}: {rate.source}; {rate.slots} trial{'s' * (rate.slots > 1)} at once; "
            f"{note}")


def stored_rows(folder) -> pd.DataFrame:
    """Every row under `folder`: a sweep's rows, or a whole storage location's (empty when there is none)."""
    from sweep.store import filesystem
    from trialrows.read import read_results

    import pyarrow.fs

    none = pd.DataFrame(columns=["trial_id", "status"])
    try:
        fs, path = filesystem(folder)
        if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
            return none
        return read_results(folder)
    except OSError:  # a bucket a dry run cannot reach from here: the estimate falls back on its stated defaults
        return none


def chosen_device(args) -> str:
    return args.estimate_for or ("cpu" if not args.gpus_per_trial else "a100")


def dry_run_estimate(specs, settings, args, num_layers: int, folder, raw=None, stored=None,
                     everything=None) -> tuple[list[float], Rate, str]:
    """(each spec's FLOPs, the rate on --estimate-for, how the FLOPs were counted) for a dry run: FLOPs known
    from the sweep's own rows (`stored`), the rate measured by every sweep's rows under --storage (`everything`,
    read here unless given)."""
    everything, stored = store_rows(args, folder, everything, stored)
    flops, note = spec_flops(specs, settings, num_layers, stored, raw)
    rate = rate_for(chosen_device(args), everything, settings.model, args.cpus_per_trial,
                    precision=trial_precision(settings, args), fused=getattr(args, "pack", "auto") != 1)
    return flops, rate, note


def store_rows(args, folder, everything=None, stored=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every row under --storage, the sweep's own), each read unless given."""
    from sweep.store import location

    if everything is None:
        everything = stored_rows(location(args.storage))
    if stored is None:  # the sweep's folder lies under the location: no row there (or a bucket that does not
        stored = stored_rows(folder) if len(everything) else everything  # answer), none in it: asked once
    return everything, stored


def trial_precision(settings, args) -> str:
    """The precision the sweep's trials run in: the one it was given, else auto. The sweep resolved auto for
    the devices its own trials get (--gpus-per-trial), which need not be the device estimated for."""
    return settings.precision if "precision" in getattr(args, "given", ()) else "auto"


def estimate_text(specs, settings, args, num_layers: int, folder, raw=None, copies: int = 1) -> str:
    """What `--dry-run` prints of a sweep's cost. `copies`: the finetuning trials each spec stands for (a
    search's cell: its study's trials, each at most the cell's trial, fewer epochs where ASHA stops it)."""
    if not specs:
        return "cost: no trial to run"
    everything, stored = store_rows(args, folder)
    flops, rate, note = dry_run_estimate(specs, settings, args, num_layers, folder, raw, stored, everything)
    # A rerun skips the trials the store has finished: only the others cost anything.
    # By settings: a dry run reads no weights, so a row of other data or weights at the same settings counts too.
    done = done_ids(stored) if copies == 1 else done_in_cells(stored)
    finished = [int(s.trial_id in done) if copies == 1 else min(copies, done[s.trial_id]) for s in specs]
    left = [f for f, n in zip(flops, finished) for _ in range(copies - n)]
    trials = len(specs) * copies
    label = f"total ({trials - len(left)} of {trials} already done at these settings)" if len(left) < trials \
        else "total"
    table = cost_table(specs, flops, rate)
    if copies > 1:
        table += (f"\n(a line per cell: one trial of its study, which runs {copies}; the total counts each trial to "
                  "its last epoch, and ASHA stops some earlier)")
    return "\n".join([header(rate, note), table, summary_line(label, left, rate)])


def done_in_cells(stored: pd.DataFrame) -> collections.Counter:
    """Per cell (its id and its settings id: a dry run's cells carry no fingerprints), how many trials of its
    study the store holds finished rows of."""
    from trialrows.read import STUDY_FINISHED

    counts: collections.Counter = collections.Counter()
    if stored is None or not len(stored) or "cell" not in stored or "status" not in stored:
        return counts
    finished = stored[stored["status"].isin(STUDY_FINISHED) & stored["cell"].notna()]
    counts.update(finished["cell"])
    if "settings_id" in finished:  # a sample's row carries its cell's settings id
        counts.update(i for i, cell in zip(finished["settings_id"], finished["cell"])
                      if isinstance(i, str) and i != cell)
    return counts


def done_ids(stored: pd.DataFrame) -> set:
    """The ids of the trials `stored` holds finished rows of, and their settings ids (a dry run's specs carry no
    fingerprints)."""
    from trialrows.read import FINISHED

    if stored is None or not len(stored) or "status" not in stored:
        return set()
    finished = stored[stored["status"].isin(FINISHED)]
    ids = set(finished["trial_id"])
    if "settings_id" in finished:
        ids |= {i for i in finished["settings_id"] if isinstance(i, str)}
    return ids


# --- a running sweep ------------------------------------------------------------------------------------------


def observed_slots(rows: pd.DataFrame) -> int:
    """The most trials (a fused pack: one) the rows show running at once (a trial ran from finished_at -
    wall_seconds to finished_at); 1 without such rows."""
    from trialrows.read import finished_times

    if rows.empty or "wall_seconds" not in rows:
        return 1
    end = finished_times(rows)
    wall = pd.to_numeric(rows["wall_seconds"], errors="coerce")
    usable = end.notna() & wall.notna()
    if not usable.any():
        return 1
    # A pack's members share its device and its wall clock: one span per pack, however many rows it landed.
    spans = pd.DataFrame({"end": (end - pd.Timestamp(0, tz="UTC")).dt.total_seconds(), "wall": wall})[usable]
    spans = spans.groupby(pack_key(rows)[usable]).max()
    ends = spans["end"].to_numpy(float)
    starts = ends - spans["wall"].to_numpy(float)
    # finished_at is in whole seconds, written a moment after the trial's clock stopped: a trial that began as
    # another ended must not count as beside it.
    slack = np.minimum(5.0, 0.1 * (ends - starts))
    starts, ends = starts + slack, ends - slack
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends], key=lambda x: (x[0], x[1]))
    running = best = 0
    for _, step in events:
        running += step
        best = max(best, running)
    return max(1, best)


def work_units(rows: pd.DataFrame) -> pd.Series:
    """Subset size x epochs of each row (NaN where either is unknown)."""
    return pd.to_numeric(rows["train_size"], errors="coerce").astype(float) * \
        pd.to_numeric(rows["epochs"], errors="coerce").astype(float)


def remaining_line(trials: pd.DataFrame, stored: pd.DataFrame, not_run: str) -> str:
    """`sweep status`'s estimate of what a sweep has left: its trials not yet run, each at the mean FLOPs of
    the finished trials of its cell (task, size, epochs; a cell without any: scaled by size x epochs from its
    task's), at the rate of its finished rows, on as many slots as its rows show at once."""
    left = trials[trials["state"] == not_run]
    if left.empty:
        return "remaining: nothing planned is left to run"
    ok = stored[stored["status"] == "ok"] if len(stored) and "model_flops" in stored else stored.iloc[0:0]
    if ok.empty or "device" not in ok:
        return f"remaining: {len(left)} trials; no finished trial yet to measure a rate from"
    device = ok["device"].map(device_kind).mode()
    device = device.iloc[0] if len(device) else None
    measured = measured_mfu(stored, device, None) if device else None
    if measured is None:
        return f"remaining: {len(left)} trials; its rows ran on a device without a known peak"
    cell = ["task", "train_size", "epochs"]
    ok = ok.assign(model_flops=pd.to_numeric(ok["model_flops"], errors="coerce"))
    means = ok.groupby(cell)["model_flops"].mean()
    keys = pd.MultiIndex.from_frame(left[cell].astype(object))
    flops = means.reindex(keys).to_numpy(float)
    # A cell none of whose trials has finished (a grid's larger subsets run after its small ones): the FLOPs per
    # example-epoch of its task's finished rows (else every task's), times its own; their mean would price a
    # 5k-example trial as a 500-example one.
    per_unit = ok["model_flops"] / work_units(ok)
    by_task = per_unit.groupby(ok["task"]).mean().reindex(left["task"]).to_numpy(float)
    scaled = np.where(np.isfinite(by_task), by_task, float(per_unit.mean())) * work_units(left).to_numpy(float)
    flops = np.where(np.isfinite(flops), flops, np.where(np.isfinite(scaled), scaled, float(means.mean())))
    slots = observed_slots(ok)
    rate = Rate(device, measured[1], measured[0], slots, "", overhead=trial_overhead(device), share=1.0)
    seconds = sweep_seconds(flops, rate, started=True)
    return (f"remaining: {len(left)} trials not yet run (or running), about {hours(seconds)} on {slots} "
            f"slot{'s' * (slots > 1)} at the rate of its {measured[2]} finished rows (MFU {measured[0]:.3f} of "
            f"{flops_per_second(measured[1])})")
