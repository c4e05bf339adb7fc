"""Precision targets and cost estimates, measured (docs/benchmarks.md, "Precision targets and cost estimates").

    # 1. a precision-targeted sweep against a fixed-count one: per condition, its trials and interval half-width
    .venv/bin/python benchmarks/precision_bench.py compare FIXED_ROWS TARGETED_ROWS
    # 2. a sweep's estimated time (what its dry run says, from the store's rows or the defaults) against the
    #    wall time of the same command, with the load average sampled while it runs
    .venv/bin/python benchmarks/precision_bench.py estimate -- incremental --model minilm ... --storage S --name N

`compare` reads two stores of the same grid: the fixed-count one's conditions get their t-interval (n-1 df), the
targeted one's the interval of Stein's two-stage procedure (trialrows.precision); it prints each condition's
count and half-width, the widest half-width of each, and the ratio of their trials in all.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def compare(fixed: str, targeted: str) -> None:
    from analysis.results import load
    from analysis.stats import condition_table
    from trialrows.precision import precision_table

    plain = condition_table(load(fixed))
    plain["half_width"] = (plain["ci95_high"] - plain["ci95_low"]) / 2
    stein = precision_table(load(targeted))
    keys = ["task", "k"]
    both = plain[[*keys, "n", "mean", "half_width"]].merge(
        stein[[*keys, "pilot_sd", "needed", "trials", "mean", "half_width", "state"]], on=keys,
        suffixes=("_fixed", "_targeted"))
    print("| task | k | fixed: trials | fixed: mean | fixed: half-width | targeted: pilot sd | targeted: trials | "
          "targeted: mean | targeted: half-width | state |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in both.itertuples():
        print(f"| {r.task} | {r.k} | {r.n} | {r.mean_fixed:.4f} | {r.half_width_fixed:.4f} | {r.pilot_sd:.4f} | "
              f"{r.trials} | {r.mean_targeted:.4f} | {r.half_width_targeted:.4f} | {r.state} |")
    n_fixed, n_targeted = int(both["n"].sum()), int(both["trials"].sum())
    print(f"\nwidest half-width: fixed {both['half_width_fixed'].max():.4f}, targeted "
          f"{both['half_width_targeted'].max():.4f} (target {stein['target_ci'].iloc[0]:g})")
    print(f"trials in all: fixed {n_fixed}, targeted {n_targeted}: {n_targeted / n_fixed:.2f}x")


def estimated(argv: list[str]):
    """(estimated seconds, the rate, how FLOPs were counted, trials to run) of a sweep command, as its dry run
    estimates it."""
    from sweep import cli, estimate
    from sweep.precision import grid_settings
    from sweep.store import rows_dir

    sweep = cli.parse_command_line(argv)
    limits = cli.model_limits(sweep.grid.model, True)
    specs = cli.EXPERIMENTS[sweep.experiment].build(grid_settings(sweep.grid, sweep), limits.num_layers,
                                                    limits.num_heads)
    folder = rows_dir(sweep.run.storage, sweep.name)
    stored = estimate.stored_rows(folder)
    finished = stored[stored["status"].isin(["ok", "diverged"])] if len(stored) else stored
    # A dry run's specs carry no fingerprints: a landed row is known by its settings_id
    done = set(finished.get("settings_id", pd.Series(dtype=str))) | set(finished.get("trial_id", pd.Series(dtype=str)))
    todo = [s for s in specs if s.trial_id not in done]
    flops, rate, note = estimate.dry_run_estimate(todo, sweep.grid, sweep, limits.num_layers, folder, stored=stored)
    return estimate.sweep_seconds(flops, rate), rate, note, len(todo)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def measure(argv: list[str]) -> None:
    before = load_average()
    seconds, rate, note, trials = estimated(argv)
    print(f"estimate: {trials} trials, {seconds:.0f} s ({rate.source}; {rate.slots} slots; {note})", flush=True)
    samples, done = [], threading.Event()

    def sample():
        while not done.wait(10):
            samples.append(load_average())

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sweep", *argv], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - started
    done.set()
    mean_load = sum(samples) / len(samples) if samples else before
    print(f"measured: {wall:.0f} s wall; estimate / measured = {seconds / wall:.2f}; load average before "
          f"{before:.2f}, during {mean_load:.2f} (mean of {len(samples)} samples), after {load_average():.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare")
    c.add_argument("fixed")
    c.add_argument("targeted")
    e = sub.add_parser("estimate")
    e.add_argument("sweep", nargs=argparse.REMAINDER, help="the sweep's arguments, after --")
    args = p.parse_args()
    if args.command == "compare":
        compare(args.fixed, args.targeted)
    else:
        measure([a for a in args.sweep if a != "--"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
