"""One function per table, each taking the rows (`analysis.load(path)`) and returning a DataFrame.

Every table is computed from whatever the rows hold: a partial sweep gives a partial table, an experiment
that is absent gives an empty one. Means use finished trials only (status 'ok'); `excluded` says how many
diverged or failed trials each condition left out. Intervals are t-intervals (n-1 degrees of freedom);
the paper's +-2 std columns are there too (`mean_minus_2std`, `mean_plus_2std`).

    from analysis import load, tables
    rows = load("results/incremental")
    tables.incremental_table(rows)
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from analysis.results import CORE_COLUMNS, as_list
from analysis.stats import condition_table, correlation, describe, summarize

# Experiments this module knows (docs/results-schema.md); rows of any other experiment still get a table
# (`other_table`), so nothing a sweep wrote is silently dropped.
KNOWN_EXPERIMENTS = (
    "incremental", "layernorm", "reinit-lr", "localized", "single-layer", "permutation", "heads",
    "sequential", "probing", "lr-multipliers",
)  # fmt: skip
# Experiments whose rows finetune the whole model from pretrained weights with some layers reset.
FINETUNE_EXPERIMENTS = ("incremental", "layernorm", "reinit-lr", "localized", "single-layer", "heads")

TASK_ORDER = ["sst2", "qnli", "cola", "mnli", "qqp", "rte", "mrpc", "stsb", "wnli", "squad", "squad_v2", "synthetic"]
TASK_NAMES = {
    "sst2": "SST-2", "qnli": "QNLI", "cola": "CoLA", "mnli": "MNLI", "qqp": "QQP", "rte": "RTE",
    "mrpc": "MRPC", "stsb": "STS-B", "wnli": "WNLI", "squad": "SQuAD", "squad_v2": "SQuAD 2.0",
    "synthetic": "synthetic",
}  # fmt: skip
METRIC_NAMES = {
    "accuracy": "accuracy", "matthews_correlation": "Matthews corr.", "f1": "F1", "pearson": "Pearson r",
    "spearman": "Spearman r", "exact_match": "exact match", "exact": "exact match",
}  # fmt: skip

SUMMARY_COLUMNS = ["n", "excluded", "diverged", "failed", "mean", "std", "ci95_low", "ci95_high",
                   "mean_minus_2std", "mean_plus_2std", "note"]


# --- selecting rows ---------------------------------------------------------------------------------


def task_key(task) -> tuple:
    task = str(task)
    return (TASK_ORDER.index(task), task) if task in TASK_ORDER else (len(TASK_ORDER), task)


def tasks_in(rows: pd.DataFrame) -> list[str]:
    return sorted(rows["task"].dropna().unique(), key=task_key) if "task" in rows.columns else []


def of(rows: pd.DataFrame, *experiments: str) -> pd.DataFrame:
    """The rows of the given experiments (all columns; ones no row of them sets are dropped)."""
    if rows.empty or "experiment" not in rows.columns:
        return rows.iloc[0:0]
    picked = rows[rows["experiment"].isin(experiments)]
    empty = [c for c in picked.columns if c not in CORE_COLUMNS and picked[c].isna().all()]
    return picked.drop(columns=empty) if len(picked) else picked


def _col(rows: pd.DataFrame, column: str, default=pd.NA) -> pd.Series:
    return rows[column] if column in rows.columns else pd.Series(default, index=rows.index, dtype=object)


def _sort(table: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    columns = [c for c in columns if c in table.columns]
    if table.empty or not columns:
        return table.reset_index(drop=True)
    tasks = ("task", "task_a", "task_b", "final_task", "intermediate_task")
    key = lambda s: s.map(task_key) if s.name in tasks else s  # noqa: E731
    return table.sort_values(columns, key=key, kind="stable", na_position="last").reset_index(drop=True)


def num_layers(rows: pd.DataFrame) -> dict:
    """Layers per model, as far as the rows tell: the largest layer number any row names."""
    out = {}
    for model, group in rows.groupby("model", dropna=False) if "model" in rows.columns else []:
        best = 0
        for column in ("k", "layer"):
            if column in group.columns and group[column].notna().any():
                best = max(best, int(pd.to_numeric(group[column], errors="coerce").max()))
        if "block_start" in group.columns and group["block_start"].notna().any():
            ends = pd.to_numeric(group["block_start"], errors="coerce") + pd.to_numeric(
                _col(group, "block_size", 1), errors="coerce").fillna(1) - 1
            best = max(best, int(ends.max()))
        for column in ("reinit_layers", "permutation", "weight_distance"):
            if column in group.columns:
                for value in group[column]:
                    items = as_list(value)
                    if items:
                        best = max(best, int(max(items)) if column == "reinit_layers" else len(items))
        out[model] = best
    return out


def _full_model_mask(rows: pd.DataFrame) -> pd.Series:
    """Rows that finetune the whole pretrained model with nothing reset."""
    mask = rows["experiment"].isin(FINETUNE_EXPERIMENTS) & rows["reinit_layers"].map(lambda v: len(as_list(v)) == 0)
    for column in ("head", "permutation_index"):
        if column in rows.columns:
            mask &= rows[column].isna()
    if "reinit_pooler" in rows.columns:
        mask &= ~rows["reinit_pooler"].fillna(False).astype(bool)
    return mask


# --- the tables ---------------------------------------------------------------------------------------


def status_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Trials per experiment, task, model and size by status (ok, diverged, error) and in all."""
    by = [c for c in ("experiment", "task", "model", "train_size") if c in rows.columns]
    if rows.empty:
        return pd.DataFrame(columns=[*by, "ok", "diverged", "error", "total"])
    counts = rows.groupby([*by, "status"], dropna=False).size().unstack("status", fill_value=0)
    for status in ("ok", "diverged", "error"):
        if status not in counts.columns:
            counts[status] = 0
    extra = [c for c in counts.columns if c not in ("ok", "diverged", "error")]
    counts = counts[["ok", "diverged", "error", *extra]].astype(int)
    counts["total"] = counts.sum(axis=1)
    return _sort(counts.reset_index().rename_axis(columns=None), by)


def reference_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The two reference lines of Figures 3 and 4, per task, model and size: 'full model' (every layer
    pretrained: incremental k=L, or another finetuning experiment's row with nothing reset when the
    incremental grid has none) and 'embeddings only' (incremental k=0, per reinit_mode)."""
    columns = ["task", "model", "train_size", "reference", "reinit_mode", "source", "metric_name", *SUMMARY_COLUMNS]
    if rows.empty or "reinit_layers" not in rows.columns:
        return pd.DataFrame(columns=columns)
    parts = []
    full = rows[_full_model_mask(rows)]
    if len(full):
        # Prefer the incremental grid's k=L cell where it exists.
        cell = ["task", "model", "train_size"]
        has_incremental = full.groupby(cell, dropna=False)["experiment"].transform(lambda e: (e == "incremental").any())
        full = full[~has_incremental | (full["experiment"] == "incremental")]
        table = summarize(full, [*cell, "metric_name"])
        sources = full.groupby(cell, dropna=False)["experiment"].agg(lambda e: ", ".join(sorted(set(e))))
        table["source"] = [sources.loc[tuple(r)] for r in table[cell].itertuples(index=False)]
        parts.append(table.assign(reference="full model", reinit_mode=pd.NA))
    embeddings = rows[(rows["experiment"] == "incremental") & (_col(rows, "k") == 0).fillna(False)]
    if len(embeddings):
        table = summarize(embeddings, ["task", "model", "train_size", "reinit_mode", "metric_name"])
        parts.append(table.assign(reference="embeddings only", source="incremental"))
    if not parts:
        return pd.DataFrame(columns=columns)
    table = pd.concat(parts, ignore_index=True)[columns]
    return _sort(table, ["task", "model", "train_size", "reference", "reinit_mode"])


def reference_values(refs: pd.DataFrame, task, model, train_size, reinit_mode=None) -> dict:
    """From `reference_table(rows)`: {'full model': its row as a dict, 'embeddings only': ...} for one
    cell; a reference the rows do not have is absent."""
    out = {}
    if refs.empty:
        return out
    cell = refs[(refs["task"] == task) & (refs["model"] == model) & (refs["train_size"] == train_size)]
    for name, group in cell.groupby("reference"):
        if name == "embeddings only" and reinit_mode is not None and (group["reinit_mode"] == reinit_mode).any():
            group = group[group["reinit_mode"] == reinit_mode]
        out[name] = group.iloc[0].to_dict()
    return out


def _experiment_table(rows, experiments, by):
    picked = of(rows, *experiments)
    if picked.empty:
        return pd.DataFrame(columns=[*by, *SUMMARY_COLUMNS])
    by = [c for c in by if c in picked.columns]
    return _sort(summarize(picked, by), by)


def incremental_table(rows: pd.DataFrame, experiment: str = "incremental") -> pd.DataFrame:
    """Figure 2's numbers: per task, model, size, reinit mode and k (layers 1..k kept)."""
    return _experiment_table(rows, [experiment], ["experiment", "task", "model", "train_size", "reinit_mode",
                                                  "k", "metric_name"])


def localized_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Figure 3's numbers: block reinitialized / block preserved, per block start and size."""
    table = _experiment_table(rows, ["localized"], ["task", "model", "train_size", "reinit_mode", "block_mode",
                                                    "block_size", "block_start", "metric_name"])
    if len(table) and "block_start" in table.columns:
        size = table["block_size"] if "block_size" in table.columns else 1
        sizes = np.broadcast_to(size, len(table))
        table.insert(table.columns.get_loc("block_start") + 1, "block",
                     [f"{int(s)}-{int(s) + int(b) - 1}" for s, b in zip(table["block_start"], sizes)])
    return table


def single_layer_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Figure 6's numbers: exactly one layer reinitialized (the paper shows +-2 std)."""
    by = ["task", "model", "train_size", "reinit_mode", "layer", "metric_name"]
    return _experiment_table(rows, ["single-layer"], by)


def permutation_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Figure 4's numbers: the spread of outcomes over layer permutations, per task."""
    return _experiment_table(rows, ["permutation"], ["task", "model", "train_size", "metric_name"])


def permutation_correlations(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 1: for every pair of tasks, Spearman and Pearson correlation (two-sided p-values, N) between
    the two tasks' outcomes of the same permutation. Rows are paired by `permutation_index` (the n-th
    permutation is the same for every task), never by row order; several trials of one permutation and
    task are averaged first. A permutation whose layer order differs between the two tasks is named in
    `note`."""
    columns = ["model", "train_size", "task_a", "task_b", "n", "spearman", "spearman_p", "pearson", "pearson_p", "note"]
    picked = of(rows, "permutation")
    if picked.empty:
        return pd.DataFrame(columns=columns)
    key = "permutation_index" if "permutation_index" in picked.columns else "trial_index"
    ok = picked[(picked["status"] == "ok") & picked["dev_metric"].notna() & picked[key].notna()]
    records = []
    for (model, size), group in picked.groupby(["model", "train_size"], dropna=False, sort=True):
        cell = ok[(ok["model"] == model) & (ok["train_size"] == size)]
        wide = cell.groupby([key, "task"])["dev_metric"].mean().unstack("task")
        orders = _permutation_orders(cell, key)
        for task_a, task_b in itertools.combinations(tasks_in(group), 2):
            if task_a not in wide.columns or task_b not in wide.columns:
                pair = pd.DataFrame(columns=[task_a, task_b])
            else:
                pair = wide[[task_a, task_b]].dropna()
            result = correlation(pair[task_a].to_numpy(float), pair[task_b].to_numpy(float))
            notes = [result["note"]] if result["note"] else []
            if key != "permutation_index":
                notes.append("no permutation_index column: paired by trial_index")
            mismatched = [i for i in pair.index if orders.get((i, task_a)) is not None
                          and orders.get((i, task_b)) is not None and orders[(i, task_a)] != orders[(i, task_b)]]
            if mismatched:
                notes.append(f"layer order differs between the tasks for permutation {', '.join(map(str, mismatched))}")
            records.append({"model": model, "train_size": size, "task_a": task_a, "task_b": task_b,
                            **result, "note": "; ".join(notes)})
    return pd.DataFrame.from_records(records, columns=columns)


def _permutation_orders(rows: pd.DataFrame, key: str) -> dict:
    if "permutation" not in rows.columns:
        return {}
    return {(i, t): tuple(as_list(p)) for i, t, p in zip(rows[key], rows["task"], rows["permutation"])
            if len(as_list(p))}


def probing_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Probing (frozen model, a classifier on one layer; layer 0 = embeddings): per probe and layer, with
    the mean early-stopping epoch."""
    picked = of(rows, "probing")
    by = ["task", "model", "train_size", "probe", "layer", "metric_name"]
    table = _experiment_table(rows, ["probing"], by)
    if len(table) and "stop_epoch" in picked.columns:
        by = [c for c in by if c in picked.columns]
        ok = picked[picked["status"] == "ok"]
        stop = ok.groupby(by, dropna=False)["stop_epoch"].mean().rename("mean_stop_epoch").reset_index()
        table = table.merge(stop, on=by, how="left")
    return table


def lr_multiplier_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Figure 7's numbers: reinitialized layers at `lr_multiplier` times the learning rate ('reinit-lr'),
    beside the incremental grid of the same cells (multiplier 1)."""
    return _beside_incremental(rows, "reinit-lr", "lr_multiplier", 1.0)


def layernorm_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Figure 8's numbers: reinitialized layers keep their pretrained LayerNorm ('layernorm',
    keep_layernorm true) beside the incremental grid of the same cells (LayerNorm reset)."""
    return _beside_incremental(rows, "layernorm", "keep_layernorm", False)


def _beside_incremental(rows, experiment, column, incremental_value):
    by = ["task", "model", "train_size", "reinit_mode", column, "k", "metric_name"]
    picked = of(rows, experiment)
    if picked.empty:
        return pd.DataFrame(columns=["experiment", *by, *SUMMARY_COLUMNS])
    cells = set(zip(picked["task"], picked["model"], picked["train_size"], picked["reinit_mode"]))
    base = of(rows, "incremental")
    if len(base):
        base = base[[c in cells for c in zip(base["task"], base["model"], base["train_size"], base["reinit_mode"])]]
        values = _col(base, column).astype(object)
        base = base.assign(**{column: values.where(values.notna(), incremental_value)})
    both = pd.concat([base, picked], ignore_index=True) if len(base) else picked
    table = summarize(both, ["experiment", *[c for c in by if c in both.columns]])
    return _sort(table, ["task", "model", "train_size", "reinit_mode", column, "k"])


def heads_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One attention head reinitialized: per layer and head, with the difference from the model with no
    head reset (`baseline`: the heads experiment's own rows without a head, else the full-model
    reference)."""
    by = ["task", "model", "train_size", "reinit_mode", "layer", "head", "metric_name"]
    picked = of(rows, "heads")
    if picked.empty or "head" not in picked.columns:
        return pd.DataFrame(columns=[*by, *SUMMARY_COLUMNS, "baseline", "delta"])
    table = _experiment_table(rows[rows.index.isin(picked.index[picked["head"].notna()])], ["heads"], by)
    own = picked[picked["head"].isna()]
    refs = reference_table(rows)
    baselines = []
    for task, model, size in zip(table["task"], table["model"], table["train_size"]):
        same = own[(own["task"] == task) & (own["model"] == model) & (own["train_size"] == size)]
        if len(same):
            baselines.append(describe(same.loc[same["status"] == "ok", "dev_metric"].dropna())["mean"])
        else:
            baselines.append(reference_values(refs, task, model, size).get("full model", {}).get("mean", np.nan))
    table["baseline"] = baselines
    table["delta"] = table["mean"] - table["baseline"]
    return table


def sequential_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Sequential finetuning, long form: finetune on `intermediate_task`, then on the final task. The
    diagonal (intermediate = final, or no intermediate) is direct finetuning; `delta` is the difference
    from it."""
    by = ["model", "train_size", "final_task", "intermediate_task", "metric_name"]
    picked = of(rows, "sequential")
    if picked.empty:
        return pd.DataFrame(columns=[*by, *SUMMARY_COLUMNS, "direct", "delta"])
    picked = picked.assign(final_task=picked["task"],
                           intermediate_task=_col(picked, "intermediate_task").astype(object).where(
                               _col(picked, "intermediate_task").notna(), picked["task"]))
    table = _sort(summarize(picked, by), by)
    cell = ["model", "train_size", "final_task"]
    direct = table[table["final_task"] == table["intermediate_task"]].set_index(cell)["mean"]
    table["direct"] = [direct.get(key, np.nan) for key in table[cell].itertuples(index=False, name=None)]
    table["delta"] = table["mean"] - table["direct"]
    return table


def sequential_matrix(rows: pd.DataFrame) -> pd.DataFrame:
    """The task x task matrix of sequential finetuning: rows are final tasks, columns intermediate tasks,
    cells mean dev metric (the diagonal: direct finetuning); one block of rows per model and size."""
    table = sequential_table(rows)
    if table.empty:
        return pd.DataFrame()
    matrix = table.pivot_table(index=["model", "train_size", "final_task"], columns="intermediate_task",
                               values="mean", aggfunc="first", dropna=False)
    order = sorted(matrix.columns, key=task_key)
    matrix = matrix[order]
    matrix = matrix.loc[sorted(matrix.index, key=lambda i: (str(i[0]), i[1], task_key(i[2])))]
    matrix.columns.name = "intermediate_task"
    return matrix


def weight_distance_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Frobenius distance between pretrained and finetuned weights, per layer (`weight_layer`, 1..L), for
    every condition whose rows carry `weight_distance`."""
    if "weight_distance" not in rows.columns:
        return pd.DataFrame(columns=["experiment", "task", "weight_layer", *SUMMARY_COLUMNS])
    carrying = rows[rows["weight_distance"].map(lambda v: len(as_list(v)) > 0)]
    if carrying.empty:
        return pd.DataFrame(columns=["experiment", "task", "weight_layer", *SUMMARY_COLUMNS])
    carrying = carrying.dropna(axis=1, how="all")
    long = carrying.assign(
        weight_layer=carrying["weight_distance"].map(lambda v: list(range(1, len(as_list(v)) + 1))),
        distance=carrying["weight_distance"].map(as_list),
    ).explode(["weight_layer", "distance"])
    long["weight_layer"] = long["weight_layer"].astype("Int64")
    long["distance"] = pd.to_numeric(long["distance"], errors="coerce")
    from analysis.stats import condition_columns

    by = [c for c in condition_columns(carrying) if c != "metric_name"] + ["weight_layer"]
    return _sort(summarize(long.reset_index(drop=True), by, value="distance"), by)


def other_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Experiments this module has no dedicated table for: the generic per-condition table."""
    if rows.empty or "experiment" not in rows.columns:
        return condition_table(rows)
    unknown = rows[~rows["experiment"].isin(KNOWN_EXPERIMENTS)]
    if unknown.empty:
        return pd.DataFrame(columns=["experiment", *SUMMARY_COLUMNS])
    return condition_table(unknown.dropna(axis=1, how="all"))
