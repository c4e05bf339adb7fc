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
import re

import numpy as np
import pandas as pd

from scipy import stats

from analysis.results import CORE_COLUMNS, as_list
from analysis.schema import ROLES, settings
from analysis.stats import (condition_columns, condition_table, correlation, split_settings, stein_outcomes,
                            summarize, with_stein_intervals)
from trialrows.summaries import STATISTICS

# Experiments this module knows, what keeps their conditions apart and which finetune with parts reset:
# the registry (trialrows.experiments), one entry each; rows of any other experiment still get a table
# (`other_table`), so nothing a sweep wrote is silently dropped.
from trialrows.experiments import (  # noqa: E402,F401
    EXPERIMENT_COLUMNS, FINETUNE_EXPERIMENTS, GENERIC, KNOWN_EXPERIMENTS, RESET_COLUMNS, VIEWS,
)
# Which rows are the full model and what conditions pair with it on: shared with the sweep's precision targets.
from trialrows.pairing import (  # noqa: E402,F401
    FULL_MODEL_NEUTRAL, PAIR_COLUMNS, computation_columns, full_model_rows,
)
from trialrows.pairing import full_model_mask as _full_model_mask  # noqa: E402
from trialrows.pairing import no_items as _no_items  # noqa: E402,F401

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

SUMMARY_COLUMNS = STATISTICS
# Columns the tables make (never row settings), so figures do not split by them.
MADE_COLUMNS = (*SUMMARY_COLUMNS, "block", "baseline", "delta", "direct", "source", "reference", "trials",
                "mean_stop_epoch", "final_task", "weight_layer", "pairs", "mean_difference", "wilcoxon_p")


def setting_columns(columns) -> list[str]:
    """The settings among a table's `columns` (not the columns the tables make themselves)."""
    return [c for c in settings(columns) if c not in MADE_COLUMNS and not str(c).startswith("_")]


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

    def key(column: pd.Series) -> pd.Series:
        if column.name in tasks:
            return column.map(lambda v: (1, (0, "")) if v is None or v is pd.NA or v != v else (0, task_key(v)))
        if column.dtype == object:  # a None beside strings must not raise
            return column.map(lambda v: (1, "") if v is None or v is pd.NA or v != v else (0, str(v)))
        return column

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
    """The two reference lines of Figures 3, 4 and 6, per task, model and size (and any setting that
    varies): 'full model' (every layer pretrained: `full_model_rows`, each computation once whatever the
    reinit mode or experiment that ran it) and 'embeddings only' (incremental k=0, per reinit_mode)."""
    columns = ["task", "model", "train_size", "reference", "reinit_mode", "source", "metric_name", *SUMMARY_COLUMNS]
    if rows.empty or "reinit_layers" not in rows.columns:
        return pd.DataFrame(columns=columns)
    parts = []
    full = full_model_rows(rows)
    if len(full):
        table = summarize(full, ["task", "model", "train_size", "metric_name"], pooled=FULL_MODEL_NEUTRAL)
        cell = [c for c in table.columns if c not in SUMMARY_COLUMNS]
        sources = full.groupby(cell, dropna=False, sort=False)["experiment"].agg(lambda e: ", ".join(sorted(set(e))))
        table = table.merge(sources.rename("source").reset_index(), on=cell, how="left")
        parts.append(table.assign(reference="full model", reinit_mode=pd.NA))
    embeddings = rows[(rows["experiment"] == "incremental") & (_col(rows, "k") == 0).fillna(False)]
    if len(embeddings):
        table = summarize(embeddings, ["task", "model", "train_size", "reinit_mode", "metric_name"])
        parts.append(table.assign(reference="embeddings only", source="incremental"))
    if not parts:
        return pd.DataFrame(columns=columns)
    table = pd.concat(parts, ignore_index=True)
    extra = [c for c in table.columns if c not in columns]
    table = table[[*columns[:3], *extra, *columns[3:]]]
    return _sort(table, ["task", "model", "train_size", *extra, "reference", "reinit_mode"])


def same_settings(frame: pd.DataFrame, condition) -> pd.Series:
    """Rows of `frame` whose settings equal `condition`'s (a dict or Series), on the columns both carry."""
    mask = pd.Series(True, index=frame.index)
    for column, value in dict(condition).items():
        if column in frame.columns and column in setting_columns([column]):
            mask &= frame[column].isna() if _is_missing(value) else (frame[column] == value).fillna(False)
    return mask


def _is_missing(value) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (np.isscalar(value) and pd.isna(value))


def shared_settings(behind: pd.DataFrame) -> dict:
    """The settings every row of `behind` shares: a table shows a setting only where its rows mix it, so its
    row alone would let a full model of 3 epochs stand beside trials of 10."""
    return {c: behind[c].iloc[0] for c in setting_columns(behind.columns)
            if len(behind) and behind[c].nunique(dropna=False) == 1}


def reference_settings(condition: dict) -> dict:
    """Of a condition's settings, those its references must share (reference_values matches task, model and
    size itself; a full model is the same computation whatever the experiment or reinit mode that ran it)."""
    free = ("task", "model", "train_size", "reinit_mode", *FULL_MODEL_NEUTRAL)
    return {c: v for c, v in condition.items() if c not in free and not isinstance(v, (tuple, list, np.ndarray))}


def reference_values(refs: pd.DataFrame, task, model, train_size, reinit_mode=None, condition=None) -> dict:
    """From `reference_table(rows)`: {'full model': its row as a dict, 'embeddings only': ...} for one
    cell; a reference the rows do not have is absent. `condition` (a row of a table: its settings) picks,
    where the references differ in a setting (epochs 3 and 10), the one of the same setting."""
    out = {}
    if refs.empty:
        return out
    cell = refs[(refs["task"] == task) & (refs["model"] == model) & (refs["train_size"] == train_size)]
    for column, value in (condition or {}).items():
        if column in cell.columns and column not in ("reinit_mode", "task", "model", "train_size") \
                and column in setting_columns([column]) and column not in FULL_MODEL_NEUTRAL:
            cell = cell[(cell[column] == value) | (cell[column].isna() & pd.isna(value))]
    for name, group in cell.groupby("reference"):
        if name == "embeddings only" and reinit_mode is not None and (group["reinit_mode"] == reinit_mode).any():
            group = group[group["reinit_mode"] == reinit_mode]
        out[name] = group.iloc[0].to_dict()
    return out


def paired_differences(rows: pd.DataFrame) -> pd.DataFrame:
    """Every condition of the finetuning experiments against the full model, trial index by trial index
    (each index trains every condition on the same subset, with the same seeds): the mean paired difference
    (condition minus full model), its paired 95% t-interval (n-1 df) and the two-sided Wilcoxon signed-rank
    p-value (scipy.stats.wilcoxon), over the indices where both finished. A condition a sweep targeted on its
    paired difference (`--target-on paired`) gets Stein's interval over the indices the procedure chose."""
    columns = ["experiment", "task", "model", "train_size", "pairs", "mean_difference", "ci95_low", "ci95_high",
               "wilcoxon_p", "note"]
    if rows.empty or "reinit_layers" not in rows.columns:
        return pd.DataFrame(columns=columns)
    outcomes, lines = stein_outcomes(rows)
    ok = rows[(rows["status"] == "ok") & rows["dev_metric"].notna()]
    full = full_model_rows(ok)
    picked = ok[ok["experiment"].isin(FINETUNE_EXPERIMENTS) & ~_full_model_mask(ok)]
    picked = picked.assign(_line=lines.loc[picked.index])  # (a whole Series would give an empty frame its rows)
    if full.empty or picked.empty:
        return pd.DataFrame(columns=columns)
    on = [*computation_columns(full), *[c for c in PAIR_COLUMNS if c in full.columns]]
    on = [c for c in on if c in picked.columns]
    reference = full[[*on, "dev_metric"]].rename(columns={"dev_metric": "_full"})
    pairs = picked.reset_index(drop=True).merge(reference, on=on, how="left")
    pairs["_difference"] = pairs["dev_metric"] - pairs["_full"]
    records = []
    for experiment, part in pairs.groupby("experiment", sort=False):
        own = condition_columns(part.drop(columns=["_full", "_difference", "_line"]))
        by = [*dict.fromkeys([*own, *EXPERIMENT_COLUMNS.get(experiment, [])])]
        by = [c for c in by if c in part.columns and c != "metric_name"] + ["metric_name"]
        for key, group in part[[*by, "_difference", "_line"]].groupby(by, dropna=False, sort=False):
            records.append({**dict(zip(by, key)), "_differences": group["_difference"].dropna().to_numpy(float),
                            "_first": group["_line"].min(), "_last": group["_line"].max()})
    table = pd.DataFrame.from_records(records)
    table = pd.concat([table.drop(columns="_differences"), _paired(table["_differences"])], axis=1)
    table = with_stein_intervals(table, outcomes, "pairs", "mean_difference", on="paired")
    order = [c for c in table.columns if c not in columns[4:]] + columns[4:]
    return _sort(table[order], [c for c in order if c not in columns[4:]])


def _paired(samples: pd.Series) -> pd.DataFrame:
    """Per sample of paired differences: n, mean, 95% t-interval, Wilcoxon p (two-sided), note. Samples of
    one size go to scipy together (along axis 1), not one call each."""
    n = samples.map(len).to_numpy()
    mean = np.array([d.mean() if len(d) else np.nan for d in samples])
    std = np.array([d.std(ddof=1) if len(d) > 1 else np.nan for d in samples])
    half = stats.t.ppf(0.975, np.maximum(n - 1, 1)) * std / np.sqrt(np.maximum(n, 1))
    half = np.where(std == 0, 0.0, half)
    zero = np.array([len(d) > 0 and not np.any(d) for d in samples])
    out = pd.DataFrame({"pairs": n, "mean_difference": mean, "ci95_low": mean - half, "ci95_high": mean + half,
                        "wilcoxon_p": np.nan}, index=samples.index)
    out["note"] = np.where(n == 0, "no trial index where both this condition and the full model finished",
                           np.where(n == 1, "one pair: no test (a signed-rank p of one pair is 1 whatever it is)",
                                    np.where(zero, "every difference is zero", "")))
    # Below 6 pairs no two-sided signed-rank p can fall under 0.05: shown, and said.
    few = (n > 1) & (n < 6) & ~zero
    out.loc[few, "note"] = [f"{k} pairs: no p below {2 / 2 ** k:.4g} is possible" for k in n[few]]
    testable = (n > 1) & ~zero
    for _, same in out[testable].groupby("pairs"):
        matrix = np.stack(samples.loc[same.index].to_list())
        out.loc[same.index, "wilcoxon_p"] = np.atleast_1d(stats.wilcoxon(matrix, axis=1).pvalue)
    return out


def mixed_settings(rows: pd.DataFrame) -> dict[str, dict[str, list]]:
    """{experiment: {setting: its values}} for settings that vary beyond what the experiment's own table
    keeps apart (epochs 3 and 10 in one store): every table and figure keeps them apart too."""
    out = {}
    for experiment, part in rows.groupby("experiment", sort=True) if "experiment" in rows.columns else []:
        mixed = experiment_splits(part, experiment)
        if mixed:
            out[experiment] = {c: sorted(map(str, part[c].dropna().unique())) for c in mixed}
    return out


def experiment_splits(part: pd.DataFrame, experiment: str) -> list[str]:
    """The settings that split an experiment's rows beyond its own table's columns, looked for across its
    samples (View.sample: a permutation sweep's orders) rather than within one."""
    by = [c for c in EXPERIMENT_COLUMNS.get(experiment, condition_columns(part)) if c in part.columns]
    sample = VIEWS[experiment].sample if experiment in VIEWS else None
    return split_settings(part, [c for c in by if c != sample], pooled=(sample,) if sample else ())


def mixed_settings_lines(rows: pd.DataFrame) -> list[str]:
    """One sentence for the report and `summary` when the rows mix settings; none when they do not."""
    mixed = mixed_settings(rows)
    if not mixed:
        return []
    parts = ["; ".join(f"{experiment} has {c} = {', '.join(v)}" for c, v in by.items())
             for experiment, by in mixed.items()]
    return ["This store mixes settings (" + "; ".join(parts) + "): each value is its own condition in every "
            "table and figure, which show the column."]


# Library versions that can change a trial's numbers for the same configuration and seed, and for some the
# release known to change them: (its major.minor, what changed).
NUMBERS_VERSIONS = {
    "torch_version": ("torch", ((2, 12), "torch 2.12 changed how `nn.init.trunc_normal_` draws reinitialized "
                                         "weights")),
    "transformers_version": ("transformers", None),
}
if set(NUMBERS_VERSIONS) - set(ROLES):  # a misspelled column would never say anything
    raise ValueError(f"NUMBERS_VERSIONS names {sorted(set(NUMBERS_VERSIONS) - set(ROLES))}, not row columns")


def _release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as '2.13.0+cpu'; None where it has none."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else None


def mixed_versions_lines(rows: pd.DataFrame) -> list[str]:
    """One sentence per library whose version differs among the rows: trials that share a seed pair as the
    same draws (one layer's fresh weights whichever others are reset) only under one version."""
    lines = []
    for column, (library, change) in NUMBERS_VERSIONS.items():
        counts = rows[column].dropna().value_counts().sort_index() if column in rows.columns else {}
        if len(counts) > 1:
            releases = [r for r in map(_release, counts.index) if r is not None]
            straddled = change is not None and len({r >= change[0] for r in releases}) > 1
            lines.append(f"The rows come from {len(counts)} {library} versions ("
                         + ", ".join(f"{version}: {n} trials" for version, n in counts.items())
                         + "): one configuration and seed can give other numbers under another version"
                         + (f" ({change[1]})" if straddled else "")
                         + f", so trials that share a seed across them are not the same draws; `{column}` tells "
                         "them apart.")
    return lines


def mixed_lines(rows: pd.DataFrame) -> list[str]:
    """What the report's header and `summary` say of a store that mixes settings or library versions."""
    return mixed_settings_lines(rows) + mixed_versions_lines(rows)


def experiment_table(rows: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """A registered experiment's conditions, summarized (n, mean, 95% t-interval, ...) by its view's columns."""
    return _experiment_table(rows, [experiment], [*VIEWS[experiment].columns, "metric_name"])


def _experiment_table(rows, experiments, by):
    picked = of(rows, *experiments)
    if picked.empty:
        return pd.DataFrame(columns=[*by, *SUMMARY_COLUMNS])
    by = [c for c in by if c in picked.columns]
    table = summarize(picked, by)
    return _sort(table, [c for c in table.columns if c not in SUMMARY_COLUMNS])


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


def permutation_means(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per permutation (its layer order), task and setting: its finished trials averaged
    (`dev_metric`, `trials`), so that a permutation run several times counts once. Status 'ok' when at
    least one of its trials finished, else its trials' worst."""
    picked = of(rows, "permutation")
    if picked.empty or "permutation" not in picked.columns:
        return picked.iloc[0:0]
    by = [c for c in [*EXPERIMENT_COLUMNS["permutation"], *experiment_splits(picked, "permutation")]
          if c in picked.columns] + ["metric_name"]
    ok = (picked["status"] == "ok") & picked["dev_metric"].notna()
    grouped = picked.assign(_ok=ok, _value=picked["dev_metric"].where(ok)).groupby(by, dropna=False, sort=False)
    means = grouped.agg(dev_metric=("_value", "mean"), trials=("_ok", "sum"),
                        diverged=("status", lambda s: (s == "diverged").any())).reset_index()
    means["status"] = np.where(means["trials"] > 0, "ok", np.where(means["diverged"], "diverged", "error"))
    return means.drop(columns="diverged")


def permutation_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Figure 4's numbers: the spread of outcomes over layer permutations, per task: n is the number of
    permutations (each one's repeats averaged first, `permutation_means`), `trials` the trials behind them."""
    means = permutation_means(rows)
    if means.empty:
        return pd.DataFrame(columns=["task", "model", "train_size", "metric_name", *SUMMARY_COLUMNS, "trials"])
    by = [c for c in means.columns if c not in ("permutation", "dev_metric", "trials", "status")]
    table = summarize(means, by, pooled=("permutation", "trials"))
    trials = means.groupby(by, dropna=False, sort=False)["trials"].sum().reset_index()
    return _sort(table.merge(trials, on=by, how="left"), by)


def permutation_correlations(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 1: for every pair of tasks, Spearman and Pearson correlation (two-sided p-values, N) between
    the two tasks' outcomes of the same permutation. A permutation is its layer order (`permutation`): two
    sweeps' n-th permutations are different permutations, and one order drawn twice is one permutation;
    its trials are averaged first (`permutation_means`). Never paired by row order or trial index."""
    columns = ["model", "train_size", "task_a", "task_b", "n", "spearman", "spearman_p", "pearson", "pearson_p", "note"]
    means = permutation_means(rows)
    if means.empty:
        return pd.DataFrame(columns=columns)
    means = _at_their_share(means, of(rows, "permutation"))
    cell = [c for c in means.columns if c not in ("task", "permutation", "dev_metric", "trials", "status",
                                                  "metric_name")]
    records = []
    for key, group in means.groupby(cell, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        here = group[group["status"] == "ok"]
        wide = here.pivot_table(index="permutation", columns="task", values="dev_metric", aggfunc="mean")
        for task_a, task_b in itertools.combinations(tasks_in(group), 2):
            if task_a not in wide.columns or task_b not in wide.columns:
                pair = pd.DataFrame(columns=[task_a, task_b])
            else:
                pair = wide[[task_a, task_b]].dropna()
            result = correlation(pair[task_a].to_numpy(float), pair[task_b].to_numpy(float))
            records.append({**dict(zip(cell, key)), "task_a": task_a, "task_b": task_b, **result})
    extra = [c for c in cell if c not in columns]
    return pd.DataFrame.from_records(records, columns=[*columns[:2], *extra, *columns[2:]])


def _at_their_share(means: pd.DataFrame, picked: pd.DataFrame) -> pd.DataFrame:
    """`means` keyed, where a row's size is a share of its task's split (--fractions: 673 SST-2 and 86 CoLA
    examples at 0.01), by that share instead of the size, so the tasks of one share pair; no size is shown."""
    if "train_fraction" not in picked.columns:
        return means
    if "train_fraction" not in means.columns:  # one share per task and size: it split nothing further
        keys = ["task", "model", "train_size"]
        means = means.merge(picked[[*keys, "train_fraction"]].drop_duplicates(keys), on=keys, how="left")
    return means.assign(train_size=means["train_size"].mask(means["train_fraction"].notna()))


def probing_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Probing (frozen model, a classifier on one layer; layer 0 = embeddings): per probe and layer, with
    the mean early-stopping epoch."""
    picked = of(rows, "probing")
    by = ["task", "model", "train_size", "probe", "layer", "metric_name"]
    table = _experiment_table(rows, ["probing"], by)
    if len(table) and "stop_epoch" in picked.columns:
        # per row of the table: by its every setting (two patiences are two rows, each with its own epochs)
        by = [c for c in table.columns if c in picked.columns and c not in MADE_COLUMNS]
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
    extra = [c for c in table.columns if c not in SUMMARY_COLUMNS and c not in by and c != "experiment"]
    return _sort(table, ["task", "model", "train_size", *extra, "reinit_mode", column, "k"])


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
    keys = [c for c in table.columns if c not in MADE_COLUMNS and c not in ("layer", "head", "metric_name")]
    if len(own):
        baseline = summarize(own, [c for c in keys if c in own.columns], pooled=("layer", "head"))
        on = [c for c in baseline.columns if c in keys]
        table = table.merge(baseline[[*on, "mean"]].rename(columns={"mean": "baseline"}), on=on, how="left")
    else:
        table["baseline"] = np.nan
    # The full models at the heads trials' own settings: another recipe's (epochs 3 beside 10) is no baseline.
    refs = reference_table(rows[same_settings(rows, reference_settings(shared_settings(picked)))])
    full = refs[refs["reference"] == "full model"]
    on = [c for c in full.columns if c in keys and c not in ("reinit_mode", "source", "reference")]
    if len(full) and table["baseline"].isna().any():  # no baseline of its own: the full-model reference
        reference = full[[*on, "mean"]].rename(columns={"mean": "_full"}).drop_duplicates(on)
        table = table.merge(reference, on=on, how="left")
        table["baseline"] = table["baseline"].fillna(table.pop("_full"))
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
    # --fractions: each final task at its own size, the same share; the figure draws one matrix a share
    by += ["train_fraction"] if "train_fraction" in picked.columns else []
    picked = picked.assign(final_task=picked["task"],
                           intermediate_task=_col(picked, "intermediate_task").astype(object).where(
                               _col(picked, "intermediate_task").notna(), picked["task"]))
    table = _sort(summarize(picked, by), by)
    # a cell is everything but the intermediate task: a setting that splits the rows (epochs 3 and 10) too
    cell = [c for c in table.columns if c not in (*SUMMARY_COLUMNS, "intermediate_task")]
    direct = table.loc[table["final_task"] == table["intermediate_task"], [*cell, "mean"]]
    table = table.merge(direct.rename(columns={"mean": "direct"}), on=cell, how="left")
    table["delta"] = table["mean"] - table["direct"]
    return table


def sequential_matrix(rows: pd.DataFrame) -> pd.DataFrame:
    """The task x task matrix of sequential finetuning: rows are final tasks (with the metric each row's cells
    are in: a final task's own, MCC for CoLA), columns intermediate tasks, cells mean dev metric (the diagonal:
    direct finetuning); one block of rows per model and size."""
    table = sequential_table(rows)
    if table.empty:
        return pd.DataFrame()
    # one block of rows per model, size and any setting that splits the rows (sequential_table's cells)
    index = [c for c in table.columns if c not in (*SUMMARY_COLUMNS, "intermediate_task", "direct", "delta")]
    index.insert(index.index("final_task") + 1, index.pop(index.index("metric_name")))  # model, size, task, metric
    # the cells that ran only: a pivot's product of sizes and tasks adds blank rows where sizes differ by task
    # (--fractions) or by model, or a cell was skipped
    matrix = table.groupby([*index, "intermediate_task"], dropna=False, sort=False)["mean"].first().unstack(
        "intermediate_task")
    order = sorted(matrix.columns, key=task_key)
    matrix = matrix[order]
    setting = lambda v: (0, v, "") if isinstance(v, (int, float, np.number)) else (1, 0, str(v))  # noqa: E731
    matrix = matrix.loc[sorted(matrix.index, key=lambda i: (str(i[0]), i[1], task_key(i[2]), *map(setting, i[3:])))]
    matrix.columns.name = "intermediate_task"
    return matrix


def weight_distance_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Frobenius distance between each layer's weights where finetuning started (after the surgery: a
    reinitialized layer's fresh draw; for sequential rows, after the intermediate task) and where it ended, per
    layer (`weight_layer`, 1..L: positions, after a permutation), for every condition whose rows carry
    `weight_distance`."""
    if "weight_distance" not in rows.columns:
        return pd.DataFrame(columns=["experiment", "task", "weight_layer", *SUMMARY_COLUMNS])
    carrying = rows[rows["weight_distance"].map(lambda v: len(as_list(v)) > 0)]
    if carrying.empty:
        return pd.DataFrame(columns=["experiment", "task", "weight_layer", *SUMMARY_COLUMNS])
    carrying = carrying.dropna(axis=1, how="all")
    by = [c for c in condition_columns(carrying) if c != "metric_name"]
    distances = [np.asarray(v, dtype=float) for v in carrying["weight_distance"]]
    lengths = np.array([len(d) for d in distances])
    # One row per (trial, layer), of the columns the table needs only: L times the trials.
    long = carrying[[*by, "status"]].loc[carrying.index.repeat(lengths)]
    long["weight_layer"] = pd.array(np.concatenate([np.arange(1, n + 1) for n in lengths]), dtype="Int64")
    long["distance"] = np.concatenate(distances)
    by = [*by, "weight_layer"]
    return _sort(summarize(long.reset_index(drop=True), by, value="distance"), by)


def other_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Experiments this module has no dedicated table for: the generic per-condition table."""
    if rows.empty or "experiment" not in rows.columns:
        return condition_table(rows)
    unknown = rows[~rows["experiment"].isin(KNOWN_EXPERIMENTS)]
    if unknown.empty:
        return pd.DataFrame(columns=["experiment", *SUMMARY_COLUMNS])
    return condition_table(unknown.dropna(axis=1, how="all"))
