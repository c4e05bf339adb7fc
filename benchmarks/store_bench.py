"""The results store and the analysis at the paper's scale, on generated rows.

    .venv/bin/python benchmarks/store_bench.py --rows 20000 50000

For each N: N rows of a paper-sized grid (BERT-base, 12 layers; incremental in both reinit modes, localized,
single-layer, permutations, one-head ablations; 5 tasks, 2 sizes; 2% diverged, 1% failed before their first
report), landed as the store lands them (`COMPACT_AT` rows per level-0 part, parts merged by
`sweep.store.compact`), then, each in a fresh process timed by /usr/bin/time (wall seconds, peak resident
memory): `python -m analysis summary` and `python -m analysis report --formats png`. Also the cost of one
`write_row` (compaction included) over `--write-rows` rows. Prints one Markdown table for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.schema import rows_table  # noqa: E402
from sweep.store import COMPACT_AT, PART, compact, put_file, write_row  # noqa: E402

L, HEADS = 12, 12
TASKS = {"sst2": "accuracy", "qnli": "accuracy", "cola": "matthews_correlation", "mrpc": "accuracy",
         "rte": "accuracy"}
SIZES = (500, 5000)


def conditions():
    """(experiment, labels, reinit_layers, reinit_mode) of one task and size, in grid order."""
    for mode in ("intended", "paper-code"):
        for k in range(L + 1):
            yield "incremental", {"k": k}, list(range(k + 1, L + 1)), mode
    for block_mode, start in itertools.product(("block-reinit", "block-preserve"), range(1, L - 1)):
        block = list(range(start, start + 3))
        layers = block if block_mode == "block-reinit" else [i for i in range(1, L + 1) if i not in block]
        yield "localized", {"block_mode": block_mode, "block_start": start, "block_size": 3}, layers, "intended"
    for layer in range(1, L + 1):
        yield "single-layer", {"layer": layer}, [layer], "intended"
    for p in range(50):
        order = [int(i) + 1 for i in np.random.default_rng(p).permutation(L)]
        yield "permutation", {"permutation_index": p, "permutation_seed": p, "permutation": order}, [], None
    yield "heads", {}, [], "intended"
    for layer, head in itertools.product((1, 2, 11, 12), range(HEADS)):
        yield "heads", {"layer": layer, "head": head}, [], "intended"


def make_rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    grid = list(conditions())
    rows = []
    for trial in itertools.count():
        for task, size, (experiment, labels, layers, mode) in itertools.product(TASKS, SIZES, grid):
            if len(rows) == n:
                return rows
            value = float(np.clip(0.85 - 0.02 * len(layers) + rng.normal(0, 0.02), 0, 1))
            status = rng.choice(["ok", "diverged", "error"], p=[0.97, 0.02, 0.01])
            metric = TASKS[task]
            row = {
                "trial_id": f"{experiment}-{task}-n{size}-t{trial}-{seed}-{len(rows):07d}",
                "experiment": experiment, "task": task, "model": "bert-base-uncased", "data_source": "hub",
                "train_size": size, "trial_index": trial, "subset_seed": 1000 + trial, "seed": 2000 + trial,
                "reinit_layers": layers, "reinit_mode": mode, "keep_layernorm": False, "reinit_pooler": False,
                "epochs": 10 if size == 500 else 3, "lr": 2e-5, "batch_size": 8, "max_length": 128,
                "weight_decay": 0.0, "lr_schedule": "linear", "max_grad_norm": 1.0, "precision": "fp32",
                "recipe_version": 2, "eval_every": 0, **labels, "status": str(status), "error": None,
                "metric_name": metric, "dev_metric": value, f"dev_{metric}": value,
                "dev_metrics_by_epoch": [value - 0.01, value], "weight_distance": rng.uniform(1, 5, L).tolist(),
                "train_loss": 0.3, "train_seconds": 60.0, "eval_seconds": 4.0, "wall_seconds": 66.0,
                "model_flops": 1e15, "device": "NVIDIA H100", "host": "node-1", "torch_version": "2.13.0",
                "finished_at": f"2026-11-22T{trial % 24:02d}:00:00+0000",
            }
            if status == "diverged":
                row.update(dev_metric=float("nan"), **{f"dev_{metric}": float("nan")})
            elif status == "error":  # failed before its first report: the trial's identity only
                row = {key: v for key, v in row.items() if not key.startswith(("dev_", "weight_"))
                       and key not in ("train_loss", "train_seconds", "eval_seconds", "wall_seconds")}
                row.update(metric_name=None, error="Traceback ...: CUDA out of memory")
            rows.append(row)
    raise AssertionError("unreachable: itertools.count() never ends")


def land(folder: Path, rows: list[dict]) -> float:
    """The rows as the store holds them after len(rows) write_row calls; returns the seconds it took."""
    started = time.perf_counter()
    for batch in range(0, len(rows), COMPACT_AT):
        put_file(folder, f"{PART}0-{batch:08d}-{uuid.uuid4().hex[:12]}.parquet",
                 rows_table(rows[batch:batch + COMPACT_AT]))
        compact(folder)
    return time.perf_counter() - started


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of a command in a fresh process."""
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    wall, kb = done.stderr.strip().splitlines()[-1].split()
    return float(wall), int(kb) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[20000, 50000])
    p.add_argument("--write-rows", type=int, default=1000, help="rows written one by one through write_row")
    p.add_argument("--skip-report", action="store_true", help="time summary only")
    args = p.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "single" / "rows"
        sample = make_rows(args.write_rows, seed=1)
        started = time.perf_counter()
        for row in sample:
            write_row(folder, row)
        per_row = (time.perf_counter() - started) / len(sample) * 1000
        print(f"write_row: {per_row:.1f} ms per row over {len(sample)} rows (compaction included), "
              f"{len(list(folder.iterdir()))} files")
        print("| rows | files | landing (s) | summary (s) | summary peak (MB) | report (s) | report peak (MB) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for n in args.rows:
            store = Path(tmp) / f"n{n}" / "rows"
            landing = land(store, make_rows(n))
            files = len(list(store.iterdir()))
            summary = timed([python, "-m", "analysis", "summary", str(store)])
            report = (float("nan"), float("nan")) if args.skip_report else timed(
                [python, "-m", "analysis", "report", str(store), "--out", str(Path(tmp) / f"report{n}"),
                 "--formats", "png"])
            print(f"| {n:,} | {files} | {landing:.1f} | {summary[0]:.1f} | {summary[1]:.0f} | {report[0]:.1f} | "
                  f"{report[1]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
