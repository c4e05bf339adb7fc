"""Where a trial's time goes: one command, figures and ratios for docs/benchmarks.md.

    .venv/bin/python benchmarks/bench.py            # offline MiniLM, real SST-2 from ../shared/data/glue

1. the limit: a minimal hand-written training loop over the same model, batches and steps (batches
   collated beforehand: no data handling, no reporting, nothing but forward, backward and the step);
2. our trial's training throughput on the same work (trainables.finetune.finetune), as a ratio to the limit;
3. a real sweep of N trials (python -m sweep incremental, local Ray): wall time against the sum of pure
   train+eval compute over the concurrency, giving the overhead fraction;
4. the way the paper worked: one fresh process per trial (benchmarks/paper_style_trial.py: load the model,
   tokenize padded to 128, train, evaluate, save the model), as a ratio to our sweep on the same trials.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GLUE = ROOT.parent / "shared" / "data" / "glue"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="minilm")
    p.add_argument("--task", default="sst2")
    p.add_argument("--data-dir", default=str(DEFAULT_GLUE))
    p.add_argument("--size", type=int, default=500)
    p.add_argument("--epochs", type=int, default=2, help="per trial (the paper's 5 at 500 examples costs 2.5x)")
    p.add_argument("--k", type=int, nargs="+", default=[0, 6], help="kept-layer counts of the sweep's trials")
    p.add_argument("--trials", type=int, default=2, help="trials per k in the sweep and the paper-style run")
    p.add_argument("--cpus-per-trial", type=int, default=1)
    p.add_argument("--skip", nargs="*", default=[], choices=["limit", "sweep", "paper"])
    p.add_argument("--out", help="also write the figures as JSON here")
    return p.parse_args()


def limit_and_ours(args) -> dict:
    """Sections 1 and 2, on one thread per trial like a sweep's trial, in this process."""
    from trainables.data import collate, draw_subset, tokenize_task, train_batches
    from trainables.finetune import FinetuneConfig, finetune
    from trainables.models import build_classifier, load_pretrained, load_tokenizer
    from trainables.tasks import load_task

    torch.set_num_threads(args.cpus_per_trial)
    pretrained = load_pretrained(args.model)
    data = tokenize_task(load_task(args.task, args.data_dir), load_tokenizer(args.model), args.model, 128)
    seed = 0
    rows = draw_subset(len(data.train), args.size, seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))  # the same batch order as finetune's
    batches = [collate(data.train, b, 0) for _ in range(args.epochs) for b in train_batches(rows, 8, rng)]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)

    def minimal_loop(steps) -> float:
        model = build_classifier(pretrained, data.num_labels, seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
        model.train()
        tick = time.perf_counter()
        for batch in steps:
            labels = batch["labels"]
            loss = F.cross_entropy(model(**{k: v for k, v in batch.items() if k != "labels"}).logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return time.perf_counter() - tick

    minimal_loop(batches[:20])  # warm-up: first-call allocations and kernels
    limit_seconds = min(minimal_loop(batches), minimal_loop(batches))
    cfg = FinetuneConfig(task=args.task, train_size=args.size, subset_seed=seed, seed=seed, epochs=args.epochs,
                         threads=args.cpus_per_trial)
    ours = finetune(cfg, data, pretrained)
    return {
        "train_tokens": tokens,
        "limit_seconds": limit_seconds,
        "limit_tokens_per_s": tokens / limit_seconds,
        "ours_train_seconds": ours["train_seconds"],
        "ours_tokens_per_s": tokens / ours["train_seconds"],
        "ours_over_limit": ours["train_seconds"] / limit_seconds,
        "ours_eval_seconds": ours["eval_seconds"],
        "ours_mfu": ours["mfu"],
        "peak_flops": ours["peak_flops"],
    }


def sweep(args, storage: Path) -> dict:
    from analysis.results import read_results

    argv = [sys.executable, "-m", "sweep", "incremental", "--model", args.model, "--tasks", args.task,
            "--data-dir", args.data_dir, "--sizes", str(args.size), "--trials", str(args.trials),
            "--epochs", str(args.epochs), "--cpus-per-trial", str(args.cpus_per_trial), "--storage", str(storage),
            "--name", "bench", "--k", *map(str, args.k)]
    tick = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - tick
    rows = read_results(storage / "bench")
    compute = float((rows["train_seconds"] + rows["eval_seconds"]).sum())
    concurrency = max(1, min(len(rows), _cores() // args.cpus_per_trial))
    return {
        "sweep_trials": len(rows),
        "sweep_wall_seconds": wall,
        "sweep_compute_seconds": compute,
        "sweep_concurrency": concurrency,
        "sweep_overhead_fraction": 1 - compute / (concurrency * wall),
        "sweep_mean_trial_wall_seconds": float(rows["wall_seconds"].mean()),
        "sweep_mean_trial_compute_seconds": compute / len(rows),
        # Inside a trial but outside train+eval: model build, surgery, subset draw, reporting.
        "sweep_mean_trial_setup_seconds": float((rows["wall_seconds"] - rows["train_seconds"] - rows["eval_seconds"]).mean()),
        # Outside every trial: Ray start, loading and tokenizing the task once, loading weights once.
        "sweep_fixed_seconds": wall - float(rows["wall_seconds"].sum()) / concurrency,
    }


def paper_style(args, concurrency: int) -> dict:
    script = ROOT / "benchmarks" / "paper_style_trial.py"
    jobs = [[sys.executable, str(script), "--model", args.model, "--task", args.task, "--data-dir", args.data_dir,
             "--size", str(args.size), "--epochs", str(args.epochs), "--k", str(k), "--seed", str(t),
             "--threads", str(args.cpus_per_trial)] for t in range(args.trials) for k in args.k]
    run = lambda cmd: json.loads(subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True).stdout.splitlines()[-1])  # noqa: E731
    tick = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(run, jobs))
    wall = time.perf_counter() - tick
    return {
        "paper_trials": len(results),
        "paper_wall_seconds": wall,
        "paper_mean_trial_wall_seconds": float(np.mean([r["wall_seconds"] for r in results])),
        "paper_mean_trial_compute_seconds": float(np.mean([r["compute_seconds"] for r in results])),
    }


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def main() -> None:
    args = parse_args()
    figures = {"machine": f"{platform.node()} {platform.machine()}, {_cores()} cores", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d"), "args": vars(args)}
    if "limit" not in args.skip:
        figures.update(limit_and_ours(args))
        print(f"1. limit: {figures['limit_tokens_per_s']:,.0f} tokens/s ({figures['limit_seconds']:.1f}s)")
        print(f"2. ours:  {figures['ours_tokens_per_s']:,.0f} tokens/s ({figures['ours_train_seconds']:.1f}s); "
              f"ours/limit time = {figures['ours_over_limit']:.3f}x (target <= 1.15x); MFU {figures['ours_mfu']:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        if "sweep" not in args.skip:
            figures.update(sweep(args, Path(tmp)))
            print(f"3. sweep: {figures['sweep_trials']} trials in {figures['sweep_wall_seconds']:.1f}s wall, "
                  f"{figures['sweep_compute_seconds']:.1f}s compute over {figures['sweep_concurrency']} slots; "
                  f"overhead {figures['sweep_overhead_fraction']:.1%} of wall (target <= 10% for trials >= 20 s; "
                  f"mean trial compute {figures['sweep_mean_trial_compute_seconds']:.1f}s)")
            print(f"   of which per-trial set-up {figures['sweep_mean_trial_setup_seconds']:.2f}s a trial, "
                  f"fixed per sweep {figures['sweep_fixed_seconds']:.1f}s (Ray start, data, weights)")
    if "paper" not in args.skip:
        concurrency = figures.get("sweep_concurrency", max(1, _cores() // args.cpus_per_trial))
        figures.update(paper_style(args, concurrency))
        print(f"4. one process per trial: {figures['paper_trials']} trials in {figures['paper_wall_seconds']:.1f}s "
              f"wall (mean trial {figures['paper_mean_trial_wall_seconds']:.1f}s wall, "
              f"{figures['paper_mean_trial_compute_seconds']:.1f}s compute)")
        if "sweep_wall_seconds" in figures:
            figures["paper_over_sweep"] = figures["paper_wall_seconds"] / figures["sweep_wall_seconds"]
            print(f"   paper-style / our sweep = {figures['paper_over_sweep']:.2f}x (target >= 2x)")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
