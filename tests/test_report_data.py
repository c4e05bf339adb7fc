"""Hand-made results of every experiment type, with the row schema of docs/results-schema.md.

`write_results(folder)` lays them out as a sweep store would (`<folder>/<experiment>/rows/*.parquet`), so
the report can be rendered on them without a sweep. The numbers follow the paper's shapes (more kept
layers help, more data helps more, permutations land near the all-reinitialized model), with noise, a few
diverged and failed trials, a condition with a single trial and one with none finished.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

L = 12
MODEL = "bert-base-uncased"
TASKS = {"sst2": ("accuracy", 0.5, 0.92), "qnli": ("accuracy", 0.5, 0.89), "cola": ("matthews_correlation", 0.0, 0.55)}
SEQ_TASKS = {"cola": ("matthews_correlation", 0.0, 0.53), "mrpc": ("accuracy", 0.68, 0.78),
             "rte": ("accuracy", 0.5, 0.63), "wnli": ("accuracy", 0.44, 0.55)}
NOISE = {500: 0.045, 5000: 0.012}


def _row(rng, experiment, task, size, trial, layers, *, metric, value, k=None, keep_layernorm=False,
         status="ok", **extra):
    name, _, _ = metric
    value = float(np.clip(value, -1, 1))
    by_epoch = [value - 0.02 * (2 - e) + rng.normal(0, 0.004) for e in range(3)] + [value]
    ident = f"{experiment}|{task}|{size}|{trial}|{k}|{sorted(extra.items())}|{layers}|{keep_layernorm}"
    row = {
        "trial_id": f"{experiment}-{task}-n{size}-t{trial}-" + hashlib.sha256(ident.encode()).hexdigest()[:10],
        "experiment": experiment, "task": task, "model": MODEL, "data_source": "hub", "train_size": size,
        "trial_index": trial, "subset_seed": trial, "seed": trial, "k": k, "reinit_layers": list(layers),
        "reinit_mode": "intended", "keep_layernorm": keep_layernorm, "reinit_pooler": False,
        "epochs": 5 if size <= 500 else 3, "lr": 2e-5, "batch_size": 8, "max_length": 128,
        "weight_decay": 0.0, "lr_schedule": "linear", "status": status, "error": None,
        "metric_name": name, "dev_metric": value, "dev_metrics_by_epoch": by_epoch, f"dev_{name}": value,
        "train_seconds": 60.0, "eval_seconds": 5.0, "wall_seconds": 66.0, "model_flops": 1e15, "mfu": 0.3,
        "torch_version": "2.13.0", "transformers_version": "5.23.0", "ray_version": "2.60.0",
        "finished_at": "2026-11-21T04:00:00+0000", **extra,
    }
    if status == "diverged":
        row.update(dev_metric=float("nan"), **{f"dev_{name}": float("nan")})
    elif status == "error":
        row.update(dev_metric=None, dev_metrics_by_epoch=[], error="Traceback ...: CUDA out of memory",
                   **{f"dev_{name}": None})
    return row


def _curve(metric, kept_fraction, size):
    """Finetuned score with layers 1..k pretrained: more data closes more of the gap."""
    _, chance, full = metric
    floor = chance + (full - chance) * (0.25 if size <= 500 else 0.55)
    top = full - (0.06 * (full - chance) if size <= 500 else 0.0)
    speed = 0.35 if size <= 500 else 0.18
    return floor + (top - floor) * (1 - np.exp(-kept_fraction / speed)) / (1 - np.exp(-1 / speed))


def make_rows(seed: int = 0) -> pd.DataFrame:
    return pd.DataFrame(make_records(seed))


def make_records(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    # incremental (Figure 2, 5) with weight distances on the 5k trials
    for task, metric in TASKS.items():
        for size, trials in ((500, 10), (5000, 3)):
            for k in range(L + 1):
                for t in range(trials):
                    value = _curve(metric, k / L, size) + rng.normal(0, NOISE[size])
                    extra = {}
                    if size == 5000:
                        grow = np.linspace(0.5, 2.0, L) * (1 + 0.1 * t)
                        extra["weight_distance"] = [float(x) for x in grow * (3 if task == "qnli" else 2)]
                    status = "ok"
                    if (task, size, k, t) in {("sst2", 500, 2, 9), ("cola", 500, 5, 8)}:
                        status = "diverged"
                    if (task, size, k, t) == ("qnli", 5000, 7, 2):
                        status = "error"
                    rows.append(_row(rng, "incremental", task, size, t, range(k + 1, L + 1), metric=metric,
                                     value=value, k=k, status=status, **extra))
    # weight distances of the full model at 500 examples too: smaller changes with less data
    for row in rows:
        if row["train_size"] == 500 and row["k"] == L:
            row["weight_distance"] = [float(x) for x in np.linspace(0.2, 0.9, L) * (3 if row["task"] == "qnli" else 2)]
    # probing (dashed lines of Figure 2): near chance for the first half, rising later
    for task, metric in TASKS.items():
        _, chance, full = metric
        for layer in range(L + 1):
            for t in range(3):
                value = chance + (full - chance) * 0.75 / (1 + np.exp(-(layer - 8) / 1.2)) + rng.normal(0, 0.006)
                rows.append(_row(rng, "probing", task, 5000, t, [], metric=metric, value=value, layer=layer,
                                 probe="mean-pool", stop_epoch=int(rng.integers(5, 40))))
    # localized (Figure 3): block reinitialized near the full model, block preserved near embeddings-only
    for task, metric in TASKS.items():
        full = _curve(metric, 1.0, 5000)
        floor = _curve(metric, 0.0, 5000)
        for start in range(1, L - 1):
            for t in range(3):
                early = np.exp(-(start - 1) / 3)
                reinit = full - (full - floor) * 0.25 * early + rng.normal(0, 0.01)
                keep = floor + (full - floor) * 0.6 * early + rng.normal(0, 0.01)
                block = range(start, start + 3)
                rows.append(_row(rng, "localized", task, 5000, t, block, metric=metric, value=reinit,
                                 block_mode="block-reinit", block_start=start, block_size=3))
                rows.append(_row(rng, "localized", task, 5000, t, [i for i in range(1, L + 1) if i not in block],
                                 metric=metric, value=keep, block_mode="block-preserve", block_start=start,
                                 block_size=3))
    # single layer (Figure 6, +-2 std); layer 12 of CoLA has one finished trial, layer 11 none
    for task, metric in TASKS.items():
        full = _curve(metric, 1.0, 5000)
        for layer in range(1, L + 1):
            for t in range(3):
                status = "ok"
                if task == "cola" and layer == 12 and t > 0:
                    status = "error"
                if task == "cola" and layer == 11:
                    status = "diverged"
                drop = 0.08 if (task == "cola" and layer == 1) else 0.01
                rows.append(_row(rng, "single-layer", task, 5000, t, [layer], metric=metric, status=status,
                                 value=full - drop * (full - metric[1]) + rng.normal(0, 0.008), layer=layer))
    # permutations (Figure 4, Table 1): a shared quality per permutation makes the tasks correlate
    for p in range(10):
        quality = rng.normal(0, 1)
        order = [int(x) for x in np.random.RandomState(p + 1).permutation(L) + 1]
        for task, metric in TASKS.items():
            floor, full = _curve(metric, 0.0, 5000), _curve(metric, 1.0, 5000)
            value = floor + (full - floor) * (0.18 + 0.07 * quality) + rng.normal(0, 0.006)
            rows.append(_row(rng, "permutation", task, 5000, p, [], metric=metric, value=value,
                             permutation_index=p, permutation_seed=p + 1, permutation=order))
    # higher LR for reinitialized layers (Figure 7): more variance, no gain
    for task, metric in TASKS.items():
        for k in range(L + 1):
            for t in range(3):
                value = _curve(metric, k / L, 5000) - 0.01 + rng.normal(0, 0.03 * (1 - k / L) + 0.005)
                rows.append(_row(rng, "reinit-lr", task, 5000, t, range(k + 1, L + 1), metric=metric,
                                 value=value, k=k, lr_multiplier=5.0))
    # preserved LayerNorm (Figure 8): slightly worse
    for task, metric in TASKS.items():
        for k in range(L + 1):
            for t in range(3):
                value = _curve(metric, k / L, 5000) - 0.015 * (1 - k / L) + rng.normal(0, 0.012)
                rows.append(_row(rng, "layernorm", task, 5000, t, range(k + 1, L + 1), metric=metric,
                                 value=value, k=k, keep_layernorm=True))
    # one attention head reinitialized, in layers 1, 2, 11, 12; head=None rows are the baseline
    for task in ("cola", "sst2"):
        metric = TASKS[task]
        base = _curve(metric, 1.0, 5000)
        for t in range(3):
            rows.append(_row(rng, "heads", task, 5000, t, [], metric=metric, value=base + rng.normal(0, 0.005),
                             layer=None, head=None))
        for layer in (1, 2, 11, 12):
            for head in range(1, 13):
                shift = (-0.02 if layer <= 2 else 0.004) - (0.02 if head in (4, 9) else 0.0)
                value = base + shift + rng.normal(0, 0.006)
                rows.append(_row(rng, "heads", task, 5000, 0, [], metric=metric, value=value, layer=layer, head=head))
    # sequential finetuning: intermediate task, then the final task; None = direct (the diagonal)
    for final, metric in SEQ_TASKS.items():
        for inter in SEQ_TASKS:
            for t in range(2):
                value = metric[2] + (0 if inter == final else rng.normal(-0.01, 0.02)) + rng.normal(0, 0.004)
                rows.append(_row(rng, "sequential", final, 2000, t, [], metric=metric, value=value,
                                 intermediate_task=None if inter == final else inter))
    # the per-layer learning-rate multiplier search
    for cell in range(6):
        multipliers = [float(x) for x in np.round(rng.uniform(0.5, 5, L), 2)]
        value = _curve(TASKS["sst2"], 1.0, 5000) + rng.normal(0, 0.01)
        rows.append(_row(rng, "lr-multipliers", "sst2", 5000, 0, [], metric=TASKS["sst2"], value=value,
                         multipliers=multipliers, cell=cell, val_objective=value + rng.normal(0, 0.005)))
    # the attention or feed-forward block of one layer reset; sublayer null: the full model
    for task in ("sst2", "cola"):
        metric = TASKS[task]
        base = _curve(metric, 1.0, 5000)
        for t in range(2):
            rows.append(_row(rng, "sublayer", task, 5000, t, [], metric=metric, value=base + rng.normal(0, 0.005),
                             layer=None, sublayer=None))
            for layer in (1, 12):
                for part, shift in (("attention", -0.01), ("feed-forward", -0.02)):
                    rows.append(_row(rng, "sublayer", task, 5000, t, [], metric=metric, layer=layer, sublayer=part,
                                     value=base + shift * (layer == 1) + rng.normal(0, 0.005)))
    # every other layer reset
    for task in ("sst2", "cola"):
        for t in range(2):
            for parity, first in (("odd", 1), ("even", 2)):
                rows.append(_row(rng, "alternate", task, 5000, t, range(first, L + 1, 2), metric=TASKS[task],
                                 value=_curve(TASKS[task], 0.5, 5000) + rng.normal(0, 0.01), parity=parity))
    # everything reset, the embeddings too
    for task in ("sst2", "cola"):
        for t in range(2):
            rows.append(_row(rng, "scratch", task, 5000, t, range(1, L + 1), metric=TASKS[task],
                             value=_curve(TASKS[task], 0.0, 5000) - 0.01 + rng.normal(0, 0.01), reinit_embeddings=True))
    rows += registered_rows(rng, {row["experiment"] for row in rows})
    # a precision-targeted sweep ran the alternate rows (a pilot of 2, at most 2: Stein's interval of two values is
    # the t-interval's, so no other table's numbers move): the precision table has them
    for row in rows:
        if row["experiment"] == "alternate":
            row.update(target_ci=0.05, target_on="mean", pilot_trials=2, max_trials=2)
    # an experiment no table knows: still reported
    for t in range(2):
        rows.append(_row(rng, "mystery", "sst2", 500, t, [1], metric=TASKS["sst2"], value=0.8 + 0.01 * t))
    return rows


def registered_rows(rng, written: set[str]) -> list[dict]:
    """Rows of every registered experiment with a generic table and figure that the records above leave out,
    made from its own grid (trialrows.experiments), so a new experiment is in the report tests untouched."""
    from sweep.experiments import EXPERIMENTS, GridSettings
    from trialrows.experiments import GENERIC

    grid = GridSettings.of(model=MODEL, tasks=("sst2", "cola"), sizes=(5000,), trials=((0, 2),), max_length=128,
                           precision="fp32")
    rows = []
    for name in GENERIC:
        if name in written:
            continue
        for spec in EXPERIMENTS[name].build(grid, L, 12)[:48]:
            metric = TASKS[spec.task]
            value = float(np.clip(_curve(metric, 0.5, 5000) + rng.normal(0, 0.01), -1, 1))
            rows.append({**spec.row(), "status": "ok", "error": None, "metric_name": metric[0], "dev_metric": value,
                         "dev_metrics_by_epoch": [value], f"dev_{metric[0]}": value, "train_seconds": 60.0,
                         "eval_seconds": 5.0, "wall_seconds": 66.0, "finished_at": "2026-11-21T04:00:00+0000"})
    return rows


def write_results(folder: Path, records: list[dict] | None = None) -> Path:
    """One Parquet file per (experiment, task), a few single-row files like a live store, and a stray
    temporary file a reader must skip."""
    records = make_records() if records is None else records
    folder = Path(folder)
    groups: dict = {}
    for record in records:
        groups.setdefault((record["experiment"], record["task"]), []).append(record)
    for (experiment, task), group in groups.items():
        out = folder / experiment / "rows"
        out.mkdir(parents=True, exist_ok=True)
        keys = list(dict.fromkeys(k for r in group for k in r))
        group = [{k: r.get(k) for k in keys} for r in group]
        for record in group[:2]:
            pq.write_table(pa.Table.from_pylist([record]), out / f"{record['trial_id']}.parquet")
        if len(group) > 2:
            pq.write_table(pa.Table.from_pylist(group[2:]), out / f"{experiment}-{task}-rest.parquet")
    (folder / "rows").mkdir(parents=True, exist_ok=True)
    (folder / "rows" / ".half-written.tmp.parquet").write_bytes(b"PAR1 not really")
    return folder
