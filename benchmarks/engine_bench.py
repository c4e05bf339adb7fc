"""What the fused engine would do on a GPU, measured without one (docs/benchmarks.md, "Fused engine").

    .venv/bin/python benchmarks/engine_bench.py [--packs 1 8 31 64] [--out engine.json]

The trials are the paper's 500-example grid's: SST-2 (real files, ../shared/data/glue), 500-example subsets,
batch 8, lr 2e-5, clipping at 1.0, linear decay, dropout on; trial t has subset and seed t and k = t mod 13.
1. ops: aten ops dispatched by one pack-step (a TorchDispatchMode counts them), BERT-base's depth (12 layers,
   12 heads) with widths shrunk to --width, at each pack size; as a GPU runs it (bf16, the vocabulary's
   gradient read whole, widths bucketed) and as this CPU does (fp32). Views (ops that launch no kernel) are
   counted apart.
2. host: seconds a pack-step takes in bf16 at minimal widths (hidden 12, a 512-row vocabulary), where the
   arithmetic is a few microseconds: what the host spends dispatching the step (Python, torch's dispatcher,
   tiny kernels), an upper bound of a GPU host's time per op on this CPU.
3. setup: seconds a trial of BERT-base's shape (random weights) takes to set up, with this machine's threads:
   the grid's mix of surgery (k = 0, 4, 8, 12: 6 layers drawn on average), and the same trials with no surgery.
4. memory: bytes a trial holds at its peak per parameter: BERT-base's shape, a training step on the epoch's
   longest batch and an evaluation batch (trainables.memory.MemoryAccountant), packs of 1 and 2; the second
   trial's increment is the planning figure (trainables/fused.py PEAK_BYTES_PER_PARAMETER).
5. projection: the paper's 1,950-trial 500-example grid on one H100 from those figures and the roofline
   stated in `projection`.
Each timing carries the load average: other jobs may share this machine's cores.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fused_bench  # noqa: E402
from sweep.packs import GPU_PACKS_PER_TRIAL  # noqa: E402
from trialrows.recipe import resolve_precision  # noqa: E402

GRID_TRIALS, GRID_SIZE, GRID_EPOCHS, BATCH = 1950, 500, 5, 8
# The H100 SXM's roofline for the projection: datasheet dense bf16 peak and HBM3 bandwidth, each at the share a
# well-fed large kernel reaches (stated assumptions, not measurements).
H100_BF16_FLOPS, H100_BYTES_PER_S, ACHIEVED = 989e12, 3.35e12, (0.6, 0.8)
H100_MEMORY = 79 * 2**30  # free on an idle 80 GB card
# Memory traffic of a step per parameter (fp32 master weights, bf16 compute), counted from the code: fused
# AdamW reads weight, gradient and two moments and writes three (28 B); clipping reads the gradient for its norm
# and scales it in place (12 B); the backward writes each gradient (4 B) from its bf16 product (2 B read); the
# forward casts each weight to bf16 (4 B read, 2 B write), the backward reads that copy (2 B).
STEP_BYTES_PER_PARAMETER = 28 + 12 + 4 + 2 + 6 + 2
ISSUE_HOST_SECONDS_PER_OP = 4.6e-6  # the issue's figure: 150 ms for 32,574 ops


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))

    def totals(self) -> dict:
        views = sum(n for f, n in self.ops.items() if getattr(f, "is_view", False))
        return {"ops": sum(self.ops.values()), "views": views, "kernels": sum(self.ops.values()) - views}


def encoder(width: int, vocab: int = 30522, layers: int = 12, heads: int = 12):
    """A random encoder of BERT's depth and the given widths, as a Pretrained."""
    from transformers import BertConfig, BertModel

    from trainables.models import Pretrained

    torch.manual_seed(0)
    base = BertModel(BertConfig(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=layers,
                                num_attention_heads=heads, vocab_size=vocab))
    return Pretrained(name=f"bert-depth-width{width}", path="", config=base.config,
                      state_dict={k: v.detach().clone() for k, v in base.state_dict().items()})


def grid_trials(n: int, ks=None, **fields):
    from trainables.ablations import Reinit
    from trainables.finetune import FinetuneConfig

    return [FinetuneConfig(task="sst2", train_size=GRID_SIZE, subset_seed=t, seed=t, epochs=GRID_EPOCHS,
                           ablation=Reinit.incremental(t % 13 if ks is None else ks[t % len(ks)], 12), **fields)
            for t in range(n)]


def as_on_gpu(pack) -> None:
    """What a CUDA pack does differently: the vocabulary's gradient read whole, widths bucketed (its trials are
    made with GPU_PRECISION)."""
    pack.words.sparse, pack.bucketed = False, True


GPU_PRECISION = resolve_precision("auto", gpu_share=1.0)  # what `precision: auto` runs on a GPU


def count_ops(data, packs: list[int], width: int) -> list[dict]:
    from trainables.fused import Pack

    pretrained, rows = encoder(width), []
    for size in packs:
        row = {"pack": size}
        for where in ("gpu", "cpu"):
            pack = Pack(grid_trials(size, precision=GPU_PRECISION if where == "gpu" else "fp32"), data, pretrained)
            if where == "gpu":
                as_on_gpu(pack)
            batches, labels = pack.plan(pack.orders())
            pack.step(batches[0], labels[0])  # first step: moments and gradient views are made
            with OpCounter() as counter:
                pack.step(batches[1], labels[1])
            row[where] = counter.totals()
        rows.append(row)
        print(f"ops per pack-step, pack {size:>2}: as on a GPU {row['gpu']['ops']:,} ({row['gpu']['kernels']:,} "
              f"not views); as on this CPU {row['cpu']['ops']:,}", flush=True)
    return rows


def shortened(split, tokens: int, vocab: int):
    """The split with every sequence cut to its first `tokens` tokens and ids folded into a `vocab`-row table:
    the same steps, ops and shapes' kinds, next to no arithmetic."""
    from trainables.data import TokenizedSplit

    keep = np.minimum(split.lengths, tokens)
    index = np.concatenate([np.arange(start, start + n) for start, n in zip(split.offsets[:-1], keep)])
    return TokenizedSplit(input_ids=split.input_ids[index] % vocab, token_type_ids=split.token_type_ids[index],
                          offsets=np.concatenate([[0], np.cumsum(keep)]), labels=split.labels)


def host_seconds(data, packs: list[int], steps: int) -> list[dict]:
    """Seconds a pack-step takes where the arithmetic is negligible: hidden 12, one attention head (the op
    sequence does not depend on either), sequences cut to 8 tokens, a 512-row vocabulary."""
    from trainables.fused import Pack

    vocab = 512
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a GPU host dispatches from one thread; idle OpenMP threads only add waits here
    small = dataclasses.replace(data, train=shortened(data.train, 8, vocab))
    pretrained, rows = encoder(12, vocab=vocab, heads=1), []
    for size in packs:
        pack = Pack(grid_trials(size, threads=1, precision=GPU_PRECISION), small, pretrained)
        as_on_gpu(pack)
        batches, labels = pack.plan(pack.orders())
        pack.step(batches[0], labels[0])
        with OpCounter() as counter:
            pack.step(batches[1], labels[1])
        walls, cpus = [], []
        for batch, y in zip(batches[2:2 + steps], labels[2:2 + steps]):
            tick, cpu = time.perf_counter(), time.thread_time()
            pack.step(batch, y)
            walls.append(time.perf_counter() - tick)
            cpus.append(time.thread_time() - cpu)
        # CPU time of this thread: what the host spends, whatever else shares the cores (wall time beside it)
        seconds, wall = statistics.median(cpus), statistics.median(walls)
        ops = counter.totals()["ops"]
        rows.append({"pack": size, "seconds_per_step": seconds, "wall_seconds_per_step": wall, "ops": ops,
                     "seconds_per_op": seconds / ops, "load": os.getloadavg()})
        print(f"host, pack {size:>2}: {seconds * 1e3:.1f} ms of CPU a pack-step at minimal widths ({wall * 1e3:.1f} "
              f"ms wall), {ops:,} ops: {seconds / ops * 1e6:.2f} us an op ({load()})", flush=True)
    torch.set_num_threads(threads)
    return rows


def setup_seconds(data, trials: int, threads: int) -> dict:
    """Seconds a BERT-base-shape trial takes to set up (set_up_pack, `threads` trials at a time), with the
    grid's mix of surgery and with none."""
    from trainables.ablations import Reinit
    from trainables.fused import set_up_pack

    pretrained = fused_bench.bert_base_shape()
    out = {"threads": threads, "trials": trials}
    cases = {"grid mix (k 0, 4, 8, 12)": grid_trials(trials, ks=[0, 4, 8, 12]),
             "no surgery": [dataclasses.replace(c, ablation=Reinit()) for c in grid_trials(trials)]}
    for name, cfgs in cases.items():
        for staged in (False, True):
            tick, cpu = time.perf_counter(), time.process_time()
            set_up_pack(cfgs, data, pretrained, "cpu", workers=threads, staged=staged)
            per_trial, cpu_per_trial = (time.perf_counter() - tick) / trials, (time.process_time() - cpu) / trials
            key = f"{name}, {'staged for a GPU' if staged else 'in place'}"
            out[key], out[f"{key}, CPU seconds"] = per_trial, cpu_per_trial
            print(f"setup, {key}: {per_trial:.2f} s a trial wall, {cpu_per_trial:.2f} s of CPU ({threads} threads, "
                  f"{load()})", flush=True)
    return out


def bytes_per_parameter(data, precision: str) -> dict:
    from trainables.fused import PEAK_BYTES_PER_PARAMETER, Pack

    pretrained = fused_bench.bert_base_shape()
    params = sum(t.numel() for t in pretrained.state_dict.values())
    peaks, starts = {}, {}
    for size in (1, 2):
        pack = Pack(grid_trials(size, precision=precision), data, pretrained)
        as_on_gpu(pack)
        peaks[size] = pack.peak_memory(data.validation)
        starts[size] = sum(t.numel() * t.element_size() for t in pack.start.tensors())
        print(f"memory, {precision}, pack {size}: peak {peaks[size] / 2**30:.2f} GiB ({load()})", flush=True)
    per_trial = peaks[2] - peaks[1]
    # on a GPU the weights that weight change is measured from stay in host memory
    on_gpu = (per_trial - (starts[2] - starts[1])) / params
    out = {"precision": precision, "parameters": params, "peak_bytes": peaks, "per_trial_bytes": per_trial,
           "bytes_per_parameter": per_trial / params, "bytes_per_parameter_on_gpu": on_gpu,
           "planned": PEAK_BYTES_PER_PARAMETER, "planned_over_measured": PEAK_BYTES_PER_PARAMETER / on_gpu}
    print(f"memory, {precision}: {out['bytes_per_parameter']:.1f} bytes a parameter a trial here; {on_gpu:.1f} on a "
          f"GPU (start weights in host memory); planned {PEAK_BYTES_PER_PARAMETER}: "
          f"{PEAK_BYTES_PER_PARAMETER / on_gpu - 1:+.1%}", flush=True)
    return out


def projection(data, ops: int, host_per_op: float, setup_per_trial: float, bytes_per_param: float,
               setup_threads: int) -> dict:
    """The 1,950-trial grid on one H100: packs as large as fit, each step at the larger of its device time (a
    roofline of FLOPs and bytes) and its host time (ops x seconds an op; the host runs ahead otherwise)."""
    from trainables.cost import sequence_flops
    from trainables.data import draw_subset
    from trainables.finetune import FinetuneConfig
    from trainables.fused import MAX_GROUP, bucket

    pretrained = fused_bench.bert_base_shape()
    params = sum(t.numel() for t in pretrained.state_dict.values())
    shape = fused_bench.model_shape(pretrained, data.num_labels)
    pack = min(MAX_GROUP, int(0.9 * H100_MEMORY // (bytes_per_param * params)))
    steps = math.ceil(GRID_SIZE / BATCH) * GRID_EPOCHS
    # FLOPs of a trial's training with the engine's padding: each step's tokens rounded up to its bucket
    lengths = data.train.lengths
    rng = np.random.default_rng(0)
    train_flops = 0.0
    for t in range(8):
        rows = draw_subset(len(lengths), GRID_SIZE, t)
        for _ in range(GRID_EPOCHS):
            for batch in np.array_split(rng.permutation(rows), math.ceil(GRID_SIZE / BATCH)):
                padded = bucket(int(lengths[batch].sum()))
                train_flops += sequence_flops([padded / len(batch)] * len(batch), shape, True, BATCH)
    train_flops /= 8
    eval_flops = sequence_flops(data.validation.lengths, shape, False, FinetuneConfig.eval_batch_size)
    flops_s, bytes_s = H100_BF16_FLOPS * ACHIEVED[0], H100_BYTES_PER_S * ACHIEVED[1]
    compute = pack * train_flops / steps / flops_s
    memory = pack * params * STEP_BYTES_PER_PARAMETER / bytes_s
    device = max(compute, memory)
    host = ops * host_per_op
    step = max(device, host)
    packs = math.ceil(GRID_TRIALS / pack)
    eval_seconds = pack * eval_flops / flops_s
    train_minutes = packs * (steps * step + eval_seconds) / 60
    setup_minutes = GRID_TRIALS * setup_per_trial / 60
    # a sweep's Tune trial on a GPU holds GPU_PACKS_PER_TRIAL groups: the first's setup is on the critical path
    sweep_minutes = train_minutes + setup_minutes / GPU_PACKS_PER_TRIAL
    out = {"pack": pack, "steps_per_trial": steps, "train_flops_per_trial": train_flops,
           "compute_s_per_pack_step": compute, "memory_s_per_pack_step": memory, "host_s_per_pack_step": host,
           "step_s": step, "eval_s_per_pack": eval_seconds, "grid_minutes_setup_overlapped": train_minutes,
           "grid_minutes_setup_serial": train_minutes + setup_minutes, "grid_minutes_as_a_sweep": sweep_minutes,
           "setup_threads": setup_threads,
           "assumptions": {"bf16_flops": H100_BF16_FLOPS, "hbm_bytes_per_s": H100_BYTES_PER_S, "achieved": ACHIEVED,
                           "step_bytes_per_parameter": STEP_BYTES_PER_PARAMETER, "free_memory": H100_MEMORY}}
    print(f"projection: packs of {pack}; a pack-step {compute * 1e3:.1f} ms of FLOPs, {memory * 1e3:.1f} ms of "
          f"memory traffic, {host * 1e3:.1f} ms of host: {step * 1e3:.1f} ms; the {GRID_TRIALS}-trial grid "
          f"{train_minutes:.1f} H100-minutes with setup overlapped, {train_minutes + setup_minutes:.1f} with "
          f"setup on the critical path ({setup_per_trial:.2f} s a trial), {sweep_minutes:.1f} as a sweep runs it "
          f"(the first of every {GPU_PACKS_PER_TRIAL} groups waits for its setup)", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packs", type=int, nargs="+", default=[1, 8, 31, 64])
    parser.add_argument("--width", type=int, default=24, help="hidden width for counting ops (default 24)")
    parser.add_argument("--host-steps", type=int, default=5)
    parser.add_argument("--setup-trials", type=int, default=4)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip", nargs="*", default=[], choices=["ops", "host", "setup", "memory"])
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    data = fused_bench.sst2_task(str(fused_bench.DEFAULT_GLUE),
                                 AutoTokenizer.from_pretrained(fused_bench.default_tokenizer()), "bert-uncased")
    figures = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": f"{os.cpu_count()} cores",
               "torch": torch.__version__, "load_at_start": os.getloadavg()}
    print(f"{figures['machine']}, torch {torch.__version__}, {args.threads} threads, {load()}", flush=True)
    if "ops" not in args.skip:
        figures["ops"] = count_ops(data, args.packs, args.width)
    if "host" not in args.skip:
        figures["host"] = host_seconds(data, args.packs, args.host_steps)
    if "setup" not in args.skip:
        figures["setup"] = setup_seconds(data, args.setup_trials, args.threads)
    if "memory" not in args.skip:
        figures["memory"] = bytes_per_parameter(data, "fp32")
        figures["memory bf16"] = bytes_per_parameter(data, "bf16")
    if {"ops", "host", "setup", "memory"} <= set(figures):
        at = max(figures["ops"], key=lambda r: r["pack"] <= 31 and r["pack"])
        # pack 1's: larger packs add CPU kernel time (a CPU's bmm loops over the pack) that a GPU spends in one
        # kernel launch; the op sequence itself does not change
        per_op = min(figures["host"], key=lambda r: r["pack"])["seconds_per_op"]
        # a GPU host's 16 threads share the trials' CPU seconds
        setup = figures["setup"]["grid mix (k 0, 4, 8, 12), staged for a GPU, CPU seconds"]
        for name, host in (("measured here", per_op), ("the issue's 4.6 us an op", ISSUE_HOST_SECONDS_PER_OP)):
            print(f"-- with {name}; setup at {setup / 16:.2f} s a trial (16 host threads):")
            figures[f"projection ({name})"] = projection(
                data, at["gpu"]["ops"], host, setup / 16, figures["memory bf16"]["bytes_per_parameter_on_gpu"], 16)
    figures["load_at_end"] = os.getloadavg()
    print(load())
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
