"""One function per paper figure; each takes the rows (`analysis.load(path)`) and returns a list of `Plot`
(a name, a matplotlib Figure, a caption): one per model, size or mode the figure has to be split by, none
when the rows hold nothing the figure needs. Figures are plain `matplotlib.figure.Figure` objects on the
Agg canvas (no pyplot state), so they render in notebooks and save from scripts alike.

    from analysis import load, figures
    for plot in figures.incremental_figure(load("results/incremental")):
        plot.figure.savefig(plot.name + ".png")
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator
from scipy import stats

from analysis import tables as T
from analysis.results import as_list
from analysis.stats import split_settings, summarize

PANEL = (3.7, 2.9)  # inches per task panel
MAX_COLUMNS = 3
FULL_COLOR, EMBEDDINGS_COLOR, CHANCE_COLOR = "black", "tab:red", "tab:gray"
PROBE_COLOR = "tab:orange"
PROBE_STYLES = {"mean-pool": "--", "cls-pooler": "-.", "truncated": ":"}
SERIES_COLORS = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:brown"]


@dataclasses.dataclass
class Plot:
    name: str  # file stem, e.g. "fig2-incremental"
    figure: Figure
    caption: str
    function: str  # the analysis.figures function that made it
    title: str = ""
    arguments: str = ""  # what that function takes after the rows, as Python source


# --- helpers ------------------------------------------------------------------------------------------


def slug(value) -> str:
    text = str(value).rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "x"


def _split(table: pd.DataFrame, columns: list[str], drawn=None):
    """(file-name suffix, {column: value} of the columns that vary, sub-table) per value of those columns;
    one piece, with no suffix, when none varies. With `drawn` (the columns one piece draws: its x axis,
    its lines), every other setting the table carries splits it too (a table shows a setting only where
    the rows mix it), so a figure never pools what its table keeps apart."""
    if drawn is not None:
        columns = [*columns, *(c for c in T.setting_columns(table.columns)
                               if c not in columns and c not in drawn and c not in ("task", "experiment"))]
    varying = [c for c in columns if c in table.columns and table[c].nunique(dropna=False) > 1]
    if not varying:
        yield "", {}, table
        return
    for key, sub in table.groupby(varying, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        suffix = "-" + "-".join(slug(_short(c, v)) for c, v in zip(varying, key))
        yield suffix, dict(zip(varying, key)), sub


def _lines(table: pd.DataFrame, columns: list[str], drawn=()):
    """(key of `columns`, label suffix, sub-table) per line: by `columns` and by every other setting the table
    carries, as `_split` does for whole figures, for lines drawn beside another table's (the probes beside
    finetuning): one line is one condition at each x, never two settings joined in a zigzag."""
    shown = (*columns, *drawn, "task", "model", "experiment")
    extra = [c for c in T.setting_columns(table.columns) if c not in shown and table[c].nunique(dropna=False) > 1]
    for key, sub in table.groupby([*columns, *extra], dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        suffix = "".join(f", {_short(c, v)}" for c, v in zip(extra, key[len(columns):]))
        yield key[:len(columns)], suffix, sub


def _context(table: pd.DataFrame, varying: dict) -> str:
    """'model, N examples' (and whatever else the split varies) for titles on the index page."""
    parts = [_short("model", table["model"].iloc[0])] if "model" in table.columns else []
    sizes = sorted(table["train_size"].dropna().unique()) if "train_size" in table.columns else []
    if len(sizes) == 1:
        parts.append(f"{int(sizes[0]):,} examples")
    parts += [_short(c, v) for c, v in varying.items() if c not in ("model", "train_size")]
    return ", ".join(parts)


def _extra(varying: dict, shown=("model", "train_size")) -> str:
    """What the title does not already say about this piece of a split figure."""
    rest = [_short(c, v) for c, v in varying.items() if c not in shown]
    return f" ({', '.join(rest)})" if rest else ""


def _short(column, value) -> str:
    if column == "train_size":
        return f"n{int(value)}" if pd.notna(value) else "n?"
    if column == "model":
        return str(value).rstrip("/").split("/")[-1]
    return f"{column}={value}"


def _panels(n: int, *, width=PANEL[0], height=PANEL[1], columns=MAX_COLUMNS, min_width=5.4):
    columns = min(columns, max(n, 1))
    rows = int(np.ceil(n / columns))
    figure = Figure(figsize=(max(width * columns, min_width), height * rows + 0.9), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return figure, list(axes[:n])


def _legend(figure: Figure, axes, columns: int | None = None) -> None:
    handles, labels = {}, []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles and not label.startswith("_"):
                handles[label] = handle
                labels.append(label)
    if labels:
        figure.legend([handles[x] for x in labels], labels, loc="outside lower center",
                      ncol=columns or min(len(labels), 4), frameon=False, fontsize=8.5)


def _title(figure: Figure, text: str) -> None:
    figure.suptitle(text, fontsize=11)


def _task_axes(ax, task, metric, rows: pd.DataFrame | None = None) -> None:
    """A task's panel; with `rows`, the score of a constant prediction drawn across it (`_chance`)."""
    ax.set_title(T.TASK_NAMES.get(task, task), fontsize=10)
    ax.set_ylabel(f"dev {T.METRIC_NAMES.get(metric, metric)}" if metric else "dev metric", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.25, linewidth=0.6)
    chance = _chance(rows, task, metric)
    if chance is not None:
        ax.axhline(chance, color=CHANCE_COLOR, linestyle=(0, (1, 2)), linewidth=1.1, zorder=0.5,
                   label=_chance_label(task, metric))


def _chance_label(task, metric) -> str:
    """What the constant behind the chance line is (trainables.metrics.chance_figures, trainables.qa): a
    majority class only where the metric is accuracy."""
    if task in ("squad", "squad_v2"):
        return "no answer to any question (a constant prediction)"
    if metric == "accuracy":
        return "majority class (a constant prediction)"
    if metric in ("f1", "macro_f1"):
        return "best single class (a constant prediction)"
    return "a constant prediction (0 by convention)"


def _chance(rows: pd.DataFrame | None, task, metric) -> float | None:
    """The dev score of the best constant prediction for `task` and `metric` (trials record it as
    dev_chance_metric): where a model that learned nothing lands. None when the rows do not say."""
    if rows is None or metric is None or "dev_chance_metric" not in rows.columns:
        return None
    mine = rows[(rows["task"] == task) & (rows.get("metric_name", metric) == metric)]["dev_chance_metric"].dropna()
    return float(mine.median()) if len(mine) else None


def _layer_ticks(ax, low: int, high: int) -> None:
    ax.set_xlim(low - 0.5, high + 0.5)
    if high - low <= 14:
        ax.set_xticks(range(low, high + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _size_colors(sizes) -> dict:
    import matplotlib

    sizes = sorted(set(int(s) for s in pd.Series(sizes).dropna()))
    shades = [0.75] if len(sizes) == 1 else np.linspace(0.45, 0.95, len(sizes))
    cmap = matplotlib.colormaps["Blues"]
    return {s: cmap(v) for s, v in zip(sizes, shades)}


def _bounds(table: pd.DataFrame, interval: str):
    mean = table["mean"].to_numpy(float)
    if interval == "2std":
        std = table["std"].to_numpy(float)
        return mean, mean - 2 * std, mean + 2 * std
    return mean, table["ci95_low"].to_numpy(float), table["ci95_high"].to_numpy(float)


def _errorline(ax, x, table: pd.DataFrame, *, interval="ci", color, label, marker="o", linestyle="-",
               offset=0.0, linewidth=1.6) -> None:
    """Means joined by a line, with error bars where there is an interval; a condition with one finished
    trial is a hollow marker without a bar."""
    order = np.argsort(np.asarray(x, dtype=float), kind="stable")
    x = np.asarray(x, dtype=float)[order] + offset
    mean, low, high = (v[order] for v in _bounds(table, interval))
    ax.plot(x, mean, color=color, linestyle=linestyle, marker=marker, markersize=3.5, linewidth=linewidth, label=label)
    bars = np.isfinite(low) & np.isfinite(high) & np.isfinite(mean)
    if bars.any():
        yerr = np.clip([mean[bars] - low[bars], high[bars] - mean[bars]], 0, None)  # float noise at zero spread
        ax.errorbar(x[bars], mean[bars], yerr=yerr, fmt="none", ecolor=color, elinewidth=1.0, capsize=2.5, alpha=0.85)
    single = ~bars & np.isfinite(mean)
    if single.any():
        ax.plot(x[single], mean[single], linestyle="none", marker=marker, markersize=5, markerfacecolor="white",
                markeredgecolor=color, label="_one trial")


def _reference_lines(ax, refs: dict, band: bool = False) -> None:
    styles = {"full model": (FULL_COLOR, "--", "full model (all layers pretrained)"),
              "embeddings only": (EMBEDDINGS_COLOR, ":", "embeddings only (all layers reinitialized)")}
    for name, (color, style, label) in styles.items():
        ref = refs.get(name)
        if not ref or not np.isfinite(ref["mean"]):
            continue
        ax.axhline(ref["mean"], color=color, linestyle=style, linewidth=1.2, label=label, zorder=1)
        if band and np.isfinite(ref["std"]):
            ax.axhspan(ref["mean"] - 2 * ref["std"], ref["mean"] + 2 * ref["std"], color=color, alpha=0.1,
                       linewidth=0, label=f"{name} ±2 std", zorder=0)


def _metric(table: pd.DataFrame):
    names = table["metric_name"].dropna().unique() if "metric_name" in table.columns else []
    return names[0] if len(names) else None


def _sizes_text(sizes) -> str:
    sizes = sorted(set(int(s) for s in sizes))
    return ", ".join(f"{s:,}" for s in sizes) + (" examples" if sizes else "")


def _drawable(table: pd.DataFrame) -> pd.DataFrame:
    """The table, or an empty one when no condition has a finished trial (nothing to draw)."""
    return table if len(table) and (table["n"] > 0).any() else table.iloc[0:0]


def _one_trial_note(table: pd.DataFrame) -> str:
    return " Hollow markers: one finished trial, no interval." if (table["n"] == 1).any() else ""


def _missing_note(table: pd.DataFrame, x: str, label: str) -> str:
    """Conditions that have rows but no finished trial, so no point in the figure."""
    if "n" not in table.columns or x not in table.columns:
        return ""
    empty = table[table["n"] == 0]
    if empty.empty:
        return ""
    names = [f"{T.TASK_NAMES.get(t, t)} {label} {v}" for t, v in zip(empty["task"], empty[x])]
    return f" No finished trial (not drawn): {', '.join(dict.fromkeys(names))}."


def _references(rows: pd.DataFrame, experiment: str, line: pd.Series, cache: dict) -> dict:
    """`T.reference_values` for the trials behind `line` (a row of `experiment`'s table), taken from rows at
    every setting those trials share: a table shows a setting only where its rows mix it, so `line` alone
    would let a full model of 3 epochs stand beside trials of 10. Empty where no run at those settings exists.
    `cache` (one per figure) keeps the reference table of each set of rows: panels mostly share one."""
    picked = T.of(rows, experiment)
    behind = picked[T.same_settings(picked, line)]
    condition = {**T.shared_settings(behind), **line.to_dict()}
    mask = T.same_settings(rows, T.reference_settings(condition)).to_numpy()
    key = mask.tobytes()
    if key not in cache:
        cache[key] = T.reference_table(rows[mask])
    refs = cache[key]
    return T.reference_values(refs, line["task"], line["model"], line["train_size"], line.get("reinit_mode"),
                              condition=condition)


def _tick_order(value) -> tuple:
    """Numbers in numeric order (layer 2 before 10), anything else after them by its text."""
    number = isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
    return (0, float(value), "") if number else (1, 0.0, str(value))


def _stein_note(table: pd.DataFrame) -> str:
    """Said where a bar is not the caption's t-interval on n-1 df (trialrows.summaries.with_stein_intervals)."""
    stein = "note" in table.columns and table["note"].astype(str).str.startswith("Stein").any()
    return (" Conditions a precision-targeted sweep ran (--target-ci; their table's note): Stein's two-stage "
            "interval instead, t on n0-1 df of the pilot's spread." if stein else "")


def _no_reference_note(tasks: list) -> str:
    return f" No reference runs at these settings for {', '.join(map(str, tasks))}." if tasks else ""


def _excluded_note(table: pd.DataFrame) -> str:
    left = int(table["excluded"].sum()) if "excluded" in table.columns else 0
    return f" {left} diverged or failed trial{'s' if left != 1 else ''} left out." if left else ""


# --- the figures ----------------------------------------------------------------------------------------


def incremental_figure(rows: pd.DataFrame) -> list[Plot]:
    """Figure 2: incremental reinitialization by task, one line per subset size (darker = larger) with
    95% t-intervals, and the probing curve at each layer dashed on the same axes."""
    table = _drawable(T.incremental_table(rows))
    probes = _drawable(T.probing_table(rows))
    if table.empty and probes.empty:
        return []
    layers = T.num_layers(rows)
    models = sorted(set(table["model"] if len(table) else []) | set(probes["model"] if len(probes) else []), key=str)
    plots = []
    for model in models:
        mine = table[table["model"] == model] if len(table) else table
        modes = [("", {}, mine)] if mine.empty else list(_split(mine, ["reinit_mode"], drawn=("model", "train_size", "k")))
        for suffix, part, sub in modes:
            probe = probes[probes["model"] == model] if len(probes) else probes
            tasks = sorted(set(sub.get("task", [])) | set(probe.get("task", [])), key=T.task_key)
            colors = _size_colors(sub["train_size"]) if len(sub) else {}
            figure, axes = _panels(len(tasks))
            for ax, task in zip(axes, tasks):
                here = sub[sub["task"] == task] if len(sub) else sub
                several = here["metric_name"].nunique() > 1 if len(here) else False
                for (size, metric), line in (here.groupby(["train_size", "metric_name"]) if len(here) else []):
                    _errorline(ax, line["k"], line, color=colors[int(size)],
                               marker="os^Dv"[sorted(here["metric_name"].unique()).index(metric) % 5],
                               label=f"finetuned, {int(size):,} examples" + (f" ({metric})" if several else ""))
                there = probe[probe["task"] == task] if len(probe) else probe
                probe_lines = _lines(there, ["probe", "train_size"], ("layer",)) if len(there) else []
                for (kind, size), more, line in probe_lines:
                    _errorline(ax, line["layer"], line, color=PROBE_COLOR, linestyle=PROBE_STYLES.get(kind, "--"),
                               marker=".", linewidth=1.3, label=f"probe ({kind}), {int(size):,} examples{more}")
                _task_axes(ax, task, _metric(here) or _metric(there), rows)
                _layer_ticks(ax, 0, layers.get(model, 12))
                ax.set_xlabel("k (layers 1..k pretrained, k+1..L reinitialized)" if len(sub) else
                              "layer probed (0 = embeddings)", fontsize=8.5)
            _legend(figure, axes, columns=3)
            _title(figure, ("Incremental reinitialization" if len(sub) else "Probing the frozen model")
                   + f", {_short('model', model)}" + _extra(part))
            both = pd.concat([x for x in (sub, probe) if len(x)])
            if not len(sub):  # a store that probed only: the figure holds the dashed lines alone
                what = ("Figure 2, its dashed lines only: probing the frozen model at layer k (0 = embeddings). (No "
                        "incremental rows yet: the finetuning curves appear once the incremental experiment has run.)")
            else:
                what = ("Figure 2. Finetuning after keeping layers 1..k pretrained and reinitializing the rest "
                        "(k = 0: embeddings only; k = L: the full model)"
                        + ("; line darkness shows the subset size." if sub["train_size"].nunique() > 1 else ".")
                        + (" Dashed: probing the frozen model at layer k (0 = embeddings)." if len(probe) else
                           " (No probing rows yet: the dashed probing curve appears once the probing experiment has "
                           "run.)"))
            plots.append(Plot(
                f"fig2-incremental{'-' + slug(model) if len(models) > 1 else ''}{suffix}", figure, what
                + " Error bars: 95% t-intervals (n-1 df)." + _stein_note(both)
                + _one_trial_note(both) + _missing_note(sub, "k", "k =") + _excluded_note(both),
                "incremental_figure", f"Figure 2: incremental reinitialization ({_short('model', model)}"
                + "".join(f", {_short(c, v)}" for c, v in part.items()) + ")"))
    return plots


def localized_figure(rows: pd.DataFrame) -> list[Plot]:
    """Figure 3: block reinitialized vs block preserved per block, with the full-model and
    embeddings-only reference lines."""
    table = _drawable(T.localized_table(rows))
    if table.empty:
        return []
    plots, cache = [], {}
    for suffix, part, sub in _split(table, ["model", "train_size", "reinit_mode", "block_size"],
                                    drawn=("block_mode", "block_start", "block")):
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        figure, axes = _panels(len(tasks))
        missing = []
        styles = {"block-reinit": ("tab:red", "v", "block reinitialized (others pretrained)"),
                  "block-preserve": ("tab:blue", "^", "block preserved (others reinitialized)")}
        for ax, task in zip(axes, tasks):
            here = sub[sub["task"] == task]
            for mode, line in here.groupby("block_mode"):
                color, marker, label = styles.get(mode, ("tab:gray", "o", mode))
                _errorline(ax, line["block_start"], line, color=color, marker=marker, label=label)
            refs = _references(rows, "localized", here.iloc[0], cache)
            missing += [] if refs else [task]
            _reference_lines(ax, refs)
            _task_axes(ax, task, _metric(here), rows)
            starts = sorted(here["block_start"].unique())
            blocks = here.drop_duplicates("block_start").set_index("block_start")["block"]
            ax.set_xticks(starts, [blocks[s] for s in starts], rotation=45 if len(starts) > 6 else 0, fontsize=7.5)
            ax.set_xlabel("block of layers", fontsize=8.5)
        _legend(figure, axes, columns=2)
        first = sub.iloc[0]
        _title(figure, f"Localized reinitialization, {_short('model', first['model'])}, "
                       f"{int(first['train_size']):,} examples" + _extra(part))
        plots.append(Plot(
            f"fig3-localized{suffix}", figure,
            f"Figure 3. Reinitializing one block of {int(first.get('block_size', 3))} consecutive layers (the "
            "others pretrained) vs preserving it (the others reinitialized). Dashed: the full model; dotted: "
            "embeddings only (incremental k = 0), same task and size. Error bars: 95% t-intervals."
            + _stein_note(sub)
            + _no_reference_note(missing)
            + _one_trial_note(sub) + _missing_note(sub, "block", "block") + _excluded_note(sub),
            "localized_figure", f"Figure 3: localized reinitialization ({_context(sub, part)})"))
    return plots


def permutation_figure(rows: pd.DataFrame) -> list[Plot]:
    """Figure 4: each permutation's outcome as a point, a kernel density of the outcomes, their mean with
    its 95% t-interval, and the original and all-reinitialized models (±2 std bands)."""
    means = T.permutation_means(rows)
    summary = _drawable(T.permutation_table(rows))
    if summary.empty:
        return []
    ok = means[means["status"] == "ok"]
    plots, cache = [], {}
    for suffix, part, sub in _split(summary, ["model", "train_size"], drawn=()):
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        figure, axes = _panels(len(tasks), width=2.9)
        for ax, task in zip(axes, tasks):
            line = sub[sub["task"] == task].iloc[0]
            values = ok.loc[T.same_settings(ok, line[[c for c in sub.columns if c in ok.columns]]), "dev_metric"]
            values = values.to_numpy(float)
            _reference_lines(ax, _references(rows, "permutation", line, cache), band=True)
            if len(values) >= 3 and np.ptp(values) > 0:
                kde = stats.gaussian_kde(values)
                reach = 2 * kde.factor * values.std()
                grid = np.linspace(values.min() - reach, values.max() + reach, 200)
                density = kde(grid)
                width = 0.32 * density / density.max()
                ax.fill_betweenx(grid, -width, width, color="tab:blue", alpha=0.18, linewidth=0, label="kernel density")
            jitter = np.random.default_rng(0).uniform(-0.07, 0.07, len(values))
            ax.scatter(jitter, values, s=16, facecolor="white", edgecolor="tab:blue", linewidth=1, zorder=3,
                       label="one permutation (its trials averaged)")
            if np.isfinite(line["mean"]):
                ax.hlines(line["mean"], -0.34, 0.34, color="tab:blue", linewidth=2, zorder=4,
                          label="mean of permutations")
            if np.isfinite(line["ci95_low"]):
                yerr = [[line["mean"] - line["ci95_low"]], [line["ci95_high"] - line["mean"]]]
                ax.errorbar([0.42], [line["mean"]], yerr=yerr, fmt="none", ecolor="tab:blue", capsize=3,
                            elinewidth=1.2, label="95% t-interval of the mean (n = permutations)")
            ax.set_xlim(-0.6, 0.6)
            ax.set_xticks([])
            _task_axes(ax, task, line["metric_name"], rows)
            ax.set_xlabel(f"{int(line['n'])} permutations, {int(line['trials'])} trials", fontsize=8.5)
        _legend(figure, axes, columns=3)
        first = sub.iloc[0]
        _title(figure, f"Layer permutations, {_short('model', first['model'])}, {int(first['train_size']):,} examples"
               + _extra(part))
        plots.append(Plot(
            f"fig4-permutation{suffix}", figure,
            "Figure 4. Finetuning with all layers pretrained but in a shuffled order: one circle per "
            "permutation (a layer order; its trials averaged first), the shaded region a kernel density of the "
            "outcomes, the solid line their mean (with its 95% t-interval over permutations). Dashed: the original model; dotted: all layers reinitialized (incremental "
            "k = 0); bands ±2 std." + _excluded_note(sub),
            "permutation_figure", f"Figure 4: layer permutations ({_context(sub, part)})"))
    return plots


def scatter_figure(rows: pd.DataFrame, size: int = 500) -> list[Plot]:
    """Figure 5: every incremental trial at `size` examples, one point per trial, the mean dotted; per model
    without `size`, its smallest share of each train split (--fractions: each task at its own size) or else its
    smallest size."""
    picked = T.of(rows, "incremental")
    if picked.empty:
        return []
    share = picked["train_fraction"] if "train_fraction" in picked.columns else pd.Series(np.nan, index=picked.index)
    chosen = []
    for _, mine in picked.groupby("model", dropna=False, sort=False):
        sizes = set(mine["train_size"].dropna().astype(int))
        if size in sizes:
            chosen.append(mine[mine["train_size"] == size])
        elif share[mine.index].notna().any():  # one size would keep one task of a share: 0.01 is 673 and 86
            chosen.append(mine[share[mine.index] == share[mine.index].min()])
        elif sizes:
            chosen.append(mine[mine["train_size"] == min(sizes)])
    picked = pd.concat(chosen) if chosen else picked.iloc[0:0]
    ok = picked[(picked["status"] == "ok") & picked["dev_metric"].notna()]
    if ok.empty:
        return []
    layers = T.num_layers(rows)
    plots = []
    mixed = split_settings(picked, ["task", "model", "train_size", "reinit_mode", "k"])
    for suffix, part, sub in _split(picked, ["model", "reinit_mode", *mixed]):
        if not ok.index.isin(sub.index).any():
            continue
        model = sub["model"].iloc[0]
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        figure, axes = _panels(len(tasks))
        for ax, task in zip(axes, tasks):
            here = ok[(ok["task"] == task) & ok.index.isin(sub.index)]
            jitter = np.random.default_rng(1).uniform(-0.18, 0.18, len(here))
            ax.scatter(here["k"].astype(float) + jitter, here["dev_metric"], s=13, alpha=0.6, color="tab:blue",
                       linewidth=0, label="one trial")
            means = here.groupby("k")["dev_metric"].mean()
            ax.plot(means.index.astype(float), means.values, linestyle=":", color="black", marker="_", markersize=10,
                    linewidth=1.4, label="mean")
            _task_axes(ax, task, _metric(here) or _metric(sub), rows)
            _layer_ticks(ax, 0, layers.get(model, 12))
            ax.set_xlabel("k (layers 1..k pretrained)", fontsize=8.5)
        _legend(figure, axes)
        per = ok[ok.index.isin(sub.index)].groupby(["task", "k"]).size()
        trials = f"{per.min()}-{per.max()}" if per.min() != per.max() else str(per.max())
        fraction = share[sub.index]
        if fraction.notna().all() and fraction.nunique() == 1:
            scale, stem = f"{fraction.iloc[0]:g} of each train split", f"f{fraction.iloc[0]:g}"
            scale += " (" + ", ".join(f"{T.TASK_NAMES.get(t, t)} {int(n):,}" for t, n in sub.groupby(
                "task")["train_size"].first().sort_index(key=lambda i: i.map(T.task_key)).items()) + " examples)"
        else:
            scale, stem = f"{int(sub['train_size'].iloc[0]):,} training examples", f"n{int(sub['train_size'].iloc[0])}"
        _title(figure, f"Every incremental trial at {scale.replace('training ', '')}, {_short('model', model)}"
               + _extra(part))
        plots.append(Plot(
            f"fig5-scatter-{stem}{suffix}", figure,
            f"Figure 5. Every finished incremental trial with {scale} ({trials} per k), "
            "jittered horizontally; the dotted line joins the means." + _excluded_note(T.incremental_table(sub)),
            "scatter_figure", f"Figure 5: every incremental trial ({_context(sub, part)}"
            + (f", {stem[1:]} of each train split" if stem.startswith("f") else "") + ")"))
    return plots


def single_layer_figure(rows: pd.DataFrame) -> list[Plot]:
    """Figure 6: exactly one layer reinitialized, error bars ±2 std, the full model dashed."""
    table = _drawable(T.single_layer_table(rows))
    if table.empty:
        return []
    layers = T.num_layers(rows)
    plots, cache = [], {}
    for suffix, part, sub in _split(table, ["model", "train_size", "reinit_mode"], drawn=("layer",)):
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        figure, axes = _panels(len(tasks))
        first, missing = sub.iloc[0], []
        for ax, task in zip(axes, tasks):
            here = sub[sub["task"] == task]
            _errorline(ax, here["layer"], here, interval="2std", color="tab:blue", label="one layer reinitialized")
            full = _references(rows, "single-layer", here.iloc[0], cache).get("full model")
            missing += [] if full else [task]
            _reference_lines(ax, {"full model": full})
            _task_axes(ax, task, _metric(here), rows)
            _layer_ticks(ax, 1, layers.get(first["model"], 12))
            ax.set_xlabel("reinitialized layer", fontsize=8.5)
        _legend(figure, axes)
        _title(figure, f"Single-layer reinitialization, {_short('model', first['model'])}, "
                       f"{int(first['train_size']):,} examples" + _extra(part))
        plots.append(Plot(
            f"fig6-single-layer{suffix}", figure,
            "Figure 6. Finetuning after reinitializing one layer (all others pretrained). Error bars: ±2 "
            "standard deviations, as in the paper. Dashed: the full model." + _no_reference_note(missing)
            + _one_trial_note(sub)
            + _missing_note(sub, "layer", "layer") + _excluded_note(sub),
            "single_layer_figure", f"Figure 6: single-layer reinitialization ({_context(sub, part)})"))
    return plots


def _beside_incremental_figure(table, rows, column, labels, name, title, caption, function, compared) -> list[Plot]:
    """`compared`: the value of `column` the caption compares with (the incremental grid's)."""
    table = _drawable(table)
    if table.empty:
        return []
    layers = T.num_layers(rows)
    plots = []
    for suffix, part, sub in _split(table, ["model", "train_size", "reinit_mode"], drawn=(column, "k")):
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        figure, axes = _panels(len(tasks))
        first = sub.iloc[0]
        values = sorted(sub[column].dropna().unique())
        for ax, task in zip(axes, tasks):
            here = sub[sub["task"] == task]
            for i, value in enumerate(values):
                line = here[here[column] == value]
                offset = (i - (len(values) - 1) / 2) * 0.15
                _errorline(ax, line["k"], line, interval="2std", color=SERIES_COLORS[i % len(SERIES_COLORS)],
                           offset=offset, label=labels(value))
            _task_axes(ax, task, _metric(here), rows)
            _layer_ticks(ax, 0, layers.get(first["model"], 12))
            ax.set_xlabel("k (layers 1..k pretrained, k+1..L reinitialized)", fontsize=8.5)
        _legend(figure, axes)
        _title(figure, f"{title}, {_short('model', first['model'])}, {int(first['train_size']):,} examples"
               + _extra(part))
        # the caption promises the grid it is compared with; a store may hold this one alone
        alone = (f" Not drawn: {labels(compared)} (the store has no such rows at these settings)."
                 if compared not in values else "")
        plots.append(Plot(f"{name}{suffix}", figure,
                          caption + alone + _one_trial_note(sub) + _missing_note(sub, "k", "k =") + _excluded_note(sub),
                          function, f"{caption.split('.')[0]}: {title[0].lower() + title[1:]} ({_context(sub, part)})"))
    return plots


def lr_multiplier_figure(rows: pd.DataFrame) -> list[Plot]:
    """Figure 7: incremental reinitialization with the reinitialized layers at a higher learning rate,
    beside the same grid at the base rate; error bars ±2 std."""
    return _beside_incremental_figure(
        T.lr_multiplier_table(rows), rows, "lr_multiplier",
        lambda v: "same learning rate" if v == 1 else f"reinitialized layers at {v:g}x the learning rate",
        "fig7-reinit-lr", "Higher learning rate for reinitialized layers",
        "Figure 7. Incremental reinitialization with the reinitialized layers trained at a multiple of the "
        "learning rate, beside the same cells at one rate (points offset sideways to keep the bars apart). "
        "Error bars: ±2 standard deviations, as in the paper.",
        "lr_multiplier_figure", compared=1.0)


def layernorm_figure(rows: pd.DataFrame) -> list[Plot]:
    """Figure 8: incremental reinitialization keeping the pretrained LayerNorm of reinitialized layers,
    beside the grid that resets it; error bars ±2 std."""
    return _beside_incremental_figure(
        T.layernorm_table(rows), rows, "keep_layernorm",
        lambda v: "LayerNorm preserved" if v else "LayerNorm reset",
        "fig8-layernorm", "Preserved LayerNorm in reinitialized layers",
        "Figure 8. Incremental reinitialization that keeps the pretrained LayerNorm parameters of the "
        "reinitialized layers, beside the grid that resets them (points offset sideways). Error bars: ±2 "
        "standard deviations, as in the paper.",
        "layernorm_figure", compared=False)


def weight_distance_figure(rows: pd.DataFrame) -> list[Plot]:
    """Weight change by layer: Frobenius distance between the pretrained and the finetuned weights of each
    layer of the full model, one line per subset size (darker = larger), 95% t-intervals."""
    if "weight_distance" not in rows.columns or "reinit_layers" not in rows.columns:
        return []
    full = T.full_model_rows(rows)
    full = full[full["weight_distance"].map(lambda v: len(as_list(v)) > 0)]
    if full.empty:
        return []
    # Nothing is reinitialized in these rows, so the reinit mode (or which experiment ran them) is moot.
    long = full.assign(weight_layer=full["weight_distance"].map(lambda v: list(range(1, len(as_list(v)) + 1))),
                       distance=full["weight_distance"].map(as_list)).explode(["weight_layer", "distance"])
    long["distance"] = pd.to_numeric(long["distance"], errors="coerce")
    long["weight_layer"] = long["weight_layer"].astype(int)
    by = ["model", "task", "train_size", "weight_layer"]
    table = _drawable(summarize(long.reset_index(drop=True), by, "distance", pooled=T.FULL_MODEL_NEUTRAL))
    if table.empty:
        return []
    plots = []
    for suffix, part, sub in _split(table, ["model"], drawn=("train_size", "weight_layer")):
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        figure, axes = _panels(len(tasks))
        colors = _size_colors(sub["train_size"])
        for ax, task in zip(axes, tasks):
            here = sub[sub["task"] == task]
            for size, line in here.groupby("train_size"):
                _errorline(ax, line["weight_layer"], line, color=colors[int(size)], label=f"{int(size):,} examples")
            _task_axes(ax, task, None)
            ax.set_ylabel(r"$\|W_{\mathrm{finetuned}} - W_{\mathrm{pretrained}}\|_F$", fontsize=9)
            _layer_ticks(ax, 1, int(sub["weight_layer"].max()))
            ax.set_xlabel("layer", fontsize=8.5)
        _legend(figure, axes)
        _title(figure, f"Weight change during finetuning, {_short('model', sub['model'].iloc[0])}" + _extra(part))
        plots.append(Plot(
            f"weight-distance{suffix}", figure,
            "Weight change by layer: Frobenius distance between each layer's pretrained and finetuned weights, "
            "full model (no layer reinitialized), one line per subset size. Error bars: 95% t-intervals."
            + _one_trial_note(sub), "weight_distance_figure", f"Weight change by layer ({_context(sub, part)})"))
    return plots


def sequential_figure(rows: pd.DataFrame) -> list[Plot]:
    """The task x task matrix of sequential finetuning: cell = mean dev metric of the final task (row)
    after an intermediate task (column); colour = difference from direct finetuning (the diagonal)."""
    table = _drawable(T.sequential_table(rows))
    if table.empty:
        return []
    plots = []
    # --fractions: each final task trained on its own size, the same share of its split; one matrix a share
    fraction = table["train_fraction"] if "train_fraction" in table.columns else pd.Series(np.nan, index=table.index)
    table = table.assign(_size=table["train_size"], train_size=table["train_size"].where(fraction.isna()))
    for suffix, part, sub in _split(table, ["model", "train_size", "train_fraction"],
                                    drawn=("final_task", "intermediate_task")):
        finals = sorted(sub["final_task"].unique(), key=T.task_key)
        inters = sorted(sub["intermediate_task"].unique(), key=T.task_key)
        delta = np.full((len(finals), len(inters)), np.nan)
        text = np.full(delta.shape, "", dtype=object)
        for _, r in sub.iterrows():
            i, j = finals.index(r["final_task"]), inters.index(r["intermediate_task"])
            delta[i, j] = r["delta"]
            text[i, j] = "" if np.isnan(r["mean"]) else f"{r['mean']:.3f}\n(n={int(r['n'])})"
        figure = Figure(figsize=(1.1 * len(inters) + 2.6, 0.8 * len(finals) + 1.6), layout="constrained")
        FigureCanvasAgg(figure)
        ax = figure.subplots()
        limit = np.nanmax(np.abs(delta)) if np.isfinite(delta).any() and np.nanmax(np.abs(delta)) > 0 else 1.0
        import matplotlib

        cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#eeeeee")
        image = ax.imshow(np.ma.masked_invalid(delta), cmap=cmap, norm=TwoSlopeNorm(0, -limit, limit), aspect="auto")
        for i in range(len(finals)):
            for j in range(len(inters)):
                shade = abs(delta[i, j]) / limit if np.isfinite(delta[i, j]) else 0
                ax.text(j, i, text[i, j], ha="center", va="center", fontsize=8,
                        color="white" if shade > 0.6 else "black")
                if finals[i] == inters[j]:
                    ax.add_patch(matplotlib.patches.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, linewidth=1.6,
                                                              edgecolor="black"))
        ax.set_xticks(range(len(inters)), [T.TASK_NAMES.get(t, t) for t in inters], fontsize=9)
        share = sub["train_fraction"].iloc[0] if "train_fraction" in sub.columns else np.nan
        sizes = sub.groupby("final_task")["_size"].first()
        ax.set_yticks(range(len(finals)), [T.TASK_NAMES.get(t, t) + ("" if pd.isna(share) else f" ({int(sizes[t]):,})")
                                           for t in finals], fontsize=9)
        ax.set_xlabel("intermediate task (finetuned first)", fontsize=9)
        ax.set_ylabel("final task", fontsize=9)
        figure.colorbar(image, ax=ax, shrink=0.9).set_label("difference from direct finetuning", fontsize=8.5)
        first = sub.iloc[0]
        scale = f"{int(first['train_size']):,} examples" if pd.isna(share) else f"{share:g} of each train split"
        context = _context(sub, {c: v for c, v in part.items() if c != "train_fraction"})
        context += "" if pd.isna(share) else f", {scale}"
        _title(figure, f"Sequential finetuning, {_short('model', first['model'])}, {scale}"
               + _extra(part, ("model", "train_size", "train_fraction")))
        plots.append(Plot(
            f"sequential-matrix{suffix}", figure,
            "Sequential finetuning: finetune on the intermediate task (column), then on the final task (row). "
            "Cells: mean dev metric of the final task (its own metric) and the number of finished trials; "
            "framed: direct finetuning on the final task; colour: difference from it (blue better, red worse)."
            + _excluded_note(sub), "sequential_figure", f"Sequential finetuning matrix ({context})"))
    return plots


def heads_figure(rows: pd.DataFrame) -> list[Plot]:
    """One attention head reinitialized: difference from the unablated model per layer and head."""
    table = _drawable(T.heads_table(rows))
    if table.empty:
        return []
    plots = []
    for suffix, part, sub in _split(table, ["model", "train_size", "reinit_mode"], drawn=("layer", "head")):
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        heads = sorted(sub["head"].dropna().astype(int).unique())
        layers = sorted(sub["layer"].dropna().astype(int).unique())
        figure, axes = _panels(len(tasks), width=0.42 * len(heads) + 1.6, height=0.45 * len(layers) + 1.3, columns=2)
        finite = sub["delta"].abs()
        limit = float(finite.max()) if finite.notna().any() and finite.max() > 0 else 1.0
        import matplotlib

        cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#eeeeee")
        image = None
        for ax, task in zip(axes, tasks):
            here = sub[sub["task"] == task]
            grid = np.full((len(layers), len(heads)), np.nan)
            for layer, head, value in zip(here["layer"], here["head"], here["delta"]):
                grid[layers.index(int(layer)), heads.index(int(head))] = value
            image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=TwoSlopeNorm(0, -limit, limit), aspect="auto")
            for i in range(len(layers)):
                for j in range(len(heads)):
                    if np.isfinite(grid[i, j]):
                        ax.text(j, i, f"{100 * grid[i, j]:+.1f}", ha="center", va="center", fontsize=6,
                                color="white" if abs(grid[i, j]) / limit > 0.6 else "black")
            ax.set_xticks(range(len(heads)), heads, fontsize=7)
            ax.set_yticks(range(len(layers)), layers, fontsize=7)
            ax.set_xlabel("head", fontsize=8.5)
            ax.set_ylabel("layer", fontsize=8.5)
            metric = T.METRIC_NAMES.get(_metric(here), _metric(here))
            baseline = here["baseline"].iloc[0]
            ax.set_title(f"{T.TASK_NAMES.get(task, task)} ({metric}; baseline {baseline:.3f})", fontsize=9)
        if image is not None:  # in the cells' unit: hundredths of the metric
            bar = figure.colorbar(image, ax=axes, shrink=0.9, fraction=0.03, pad=0.02,
                                  format=FuncFormatter(lambda value, _: f"{100 * value:+.1f}"))
            bar.set_label("difference from baseline (hundredths)", fontsize=8.5)
        first = sub.iloc[0]
        _title(figure, f"One attention head reinitialized, {_short('model', first['model'])}, "
                       f"{int(first['train_size']):,} examples" + _extra(part))
        plots.append(Plot(
            f"heads{suffix}", figure,
            "Reinitializing one attention head (its query, key and value slices and its slice of the output "
            "projection): difference of the mean dev metric from the model with no head reset, in hundredths "
            "(points, for accuracy); blue better, red worse." + _excluded_note(sub), "heads_figure",
            f"One attention head reinitialized ({_context(sub, part)})"))
    return plots


FIGURES = (
    incremental_figure, localized_figure, permutation_figure, scatter_figure, single_layer_figure,
    lr_multiplier_figure, layernorm_figure, weight_distance_figure, sequential_figure, heads_figure,
)  # fmt: skip


def all_figures(rows: pd.DataFrame) -> list[Plot]:
    """Every figure the rows support, in paper order, then those of the registry's entries with a title."""
    return [*(plot for make in FIGURES for plot in make(rows)),
            *(plot for name in T.GENERIC for plot in experiment_figure(rows, name))]


def experiment_figure(rows: pd.DataFrame, experiment: str) -> list[Plot]:
    """Per model, size and reinit mode, a panel per task: each condition's mean and 95% t-interval along
    the entry's x axis (one line per `series` value), the full model and embeddings-only references as lines:
    all a registered experiment (trialrows.experiments) with a `title` needs for its figure."""
    view = T.VIEWS[experiment]
    summary = _drawable(T.experiment_table(rows, experiment))
    if view.reset_column:  # the baseline is a reference line; a column the table leaves out is null: all baseline
        reset = view.reset_column
        summary = summary[summary[reset].notna()] if reset in summary.columns else summary.iloc[:0]
    if summary.empty:
        return []
    plots, cache = [], {}
    for suffix, part, sub in _split(summary, ["model", "train_size", "reinit_mode"], drawn=tuple(c for c in (view.x, view.series) if c)):
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        fig, axes = _panels(len(tasks))
        first = sub.iloc[0]
        ticks = sorted(sub[view.x].dropna().unique(), key=_tick_order) if view.x else [experiment]
        series = [name for name, _ in sub.groupby(view.series, sort=True)] if view.series else [experiment]
        # a line says the x axis is ordered (layers): categories (odd or even layers) stand as points alone
        ordered = all(isinstance(t, (int, float, np.integer, np.floating)) for t in ticks)
        missing = []
        for ax, task in zip(axes, tasks):
            here = sub[sub["task"] == task]
            groups = here.groupby(view.series, sort=True) if view.series else [(experiment, here)]
            for name, group in groups:
                # colour and offset by the series' place in the whole figure: a panel that lacks one of them
                # must not draw the next in the colour the legend gives the missing one
                i = series.index(name)
                x = [ticks.index(v) for v in group[view.x]] if view.x else [0] * len(group)
                _errorline(ax, x, group, color=SERIES_COLORS[i % len(SERIES_COLORS)], label=str(name),
                           offset=0.1 * i, linestyle="-" if ordered else "none")
            refs = _references(rows, experiment, here.iloc[0], cache)
            missing += [] if refs else [task]
            _reference_lines(ax, refs)
            _task_axes(ax, task, _metric(here), rows)
            ax.set_xticks(np.arange(len(ticks)), [str(t) for t in ticks])
            # a tick's width whatever their number: one tick alone left the axis as wide as the series' offsets
            ax.set_xlim(-0.5, len(ticks) - 0.5 + 0.1 * (len(series) - 1))
            ax.set_xlabel(view.x or "", fontsize=8.5)
        _legend(fig, axes)
        _title(fig, f"{view.title}, {_short('model', first['model'])}, {int(first['train_size']):,} examples"
                 + _extra(part))
        plots.append(Plot(f"{experiment}{suffix}", fig,
                            f"{view.title}. Means with 95% t-intervals; dashed: the full model, dotted: embeddings "
                            "only (incremental k = 0)." + _no_reference_note(missing) + _stein_note(sub)
                            + _one_trial_note(sub) + _excluded_note(sub),
                            "experiment_figure", f"{view.title} ({_context(sub, part)})", f", {experiment!r}"))
    return plots


def probing_figure(rows: pd.DataFrame) -> list[Plot]:
    """Probing beside finetuning, per model: one panel per task and subset size, the dev metric of each
    probe at layer j (the frozen model, 0 = embeddings) on the same axis as incremental finetuning with layers
    1..k kept pretrained, both with 95% t-intervals: what the layers hold against what they transfer."""
    probes = _drawable(T.probing_table(rows))
    if probes.empty:
        return []
    finetuned = _drawable(T.incremental_table(rows))
    layers = T.num_layers(rows)
    models = sorted(probes["model"].unique(), key=str)
    plots = []
    for model in models:
        probe = probes[probes["model"] == model]
        tuned = finetuned[finetuned["model"] == model] if len(finetuned) else finetuned
        cells = sorted({(t, int(n)) for t, n in zip(probe["task"], probe["train_size"])},
                       key=lambda c: (T.task_key(c[0]), c[1]))
        figure, axes = _panels(len(cells))
        for ax, (task, size) in zip(axes, cells):
            here = tuned[(tuned["task"] == task) & (tuned["train_size"] == size)] if len(tuned) else tuned
            several = len(here) and here["reinit_mode"].nunique() > 1
            # (not `finetuned`: the next model's lines are picked from that table)
            tuned_lines = _lines(here, ["reinit_mode", "metric_name"], ("k", "train_size")) if len(here) else []
            for i, ((mode, _), more, line) in enumerate(tuned_lines):
                _errorline(ax, line["k"], line, color=SERIES_COLORS[0], marker="os^Dv"[i % 5],
                           label="finetuned, layers 1..k pretrained" + (f" ({mode})" if several else "") + more)
            there = probe[(probe["task"] == task) & (probe["train_size"] == size)]
            for (kind,), more, line in _lines(there, ["probe"], ("layer", "train_size")):
                _errorline(ax, line["layer"], line, color=PROBE_COLOR, linestyle=PROBE_STYLES.get(kind, "--"),
                           marker=".", linewidth=1.3, label=f"probe ({kind}), frozen model at layer k{more}")
            _task_axes(ax, task, _metric(there) or _metric(here), rows)
            ax.set_title(f"{T.TASK_NAMES.get(task, task)}, {size:,} examples", fontsize=10)
            _layer_ticks(ax, 0, layers.get(model, 12))
            ax.set_xlabel("k: layers kept (finetuned) / layer probed (0 = embeddings)", fontsize=8.5)
        _legend(figure, axes, columns=2)
        _title(figure, f"Probing vs finetuning, {_short('model', model)}")
        both = pd.concat([x for x in (probe, tuned) if len(x)])
        plots.append(Plot(
            f"probing-vs-incremental{'-' + slug(model) if len(models) > 1 else ''}", figure,
            ("Probing the frozen model at each layer (orange; 0 = the embeddings output) beside finetuning with "
             "layers 1..k pretrained and the rest reinitialized (blue), on the same tasks and subset sizes; the "
             "paper's claim is that the two agree more as data gets scarcer." if len(tuned) else
             "Probing the frozen model at each layer (orange; 0 = the embeddings output). (No incremental rows "
             "yet: the finetuning curves to compare with appear once the incremental experiment has run.)")
            + " Error bars: 95% t-intervals (n-1 df)."
            + _stein_note(both) + _one_trial_note(both) + _missing_note(probe, "layer", "layer") + _excluded_note(both),
            "probing_figure", f"Probing vs finetuning by layer ({_short('model', model)})"))
    return plots
