"""What the analysis knows of each experiment, in one entry per experiment: the columns that tell its
conditions apart, whether its rows finetune the pretrained model with parts reset (so they pair against the
full model), and the column set only where something is reset. Experiments the paper has get their own table
and figure (analysis.tables, analysis.figures); an entry with a `title` gets a table and a figure made from
the entry alone, which is all a new experiment needs.

Rows of an experiment without an entry still get a table (`tables.other_table`)."""
from __future__ import annotations

import dataclasses

import pandas as pd

CELL = ["task", "model", "train_size"]


@dataclasses.dataclass(frozen=True)
class View:
    columns: tuple[str, ...]  # what the experiment's table keeps apart
    finetunes: bool = False  # rows finetune the pretrained model with some part reset (paired with the full model)
    reset_column: str | None = None  # set only where something is reset: null marks the full model
    title: str = ""  # set: a table and a figure made from this entry (`table`, `figure`)
    note: str = ""
    x: str | None = None  # the figure's x axis (None: one point per condition)
    series: str | None = None  # one line per value of this column
    # Row columns only this experiment writes, with their Arrow type (analysis.schema declares them as
    # settings): a store opens at one type whichever file comes first.
    new_columns: tuple[tuple[str, str], ...] = ()


VIEWS: dict[str, View] = {
    "incremental": View((*CELL, "reinit_mode", "k"), finetunes=True),
    "layernorm": View((*CELL, "reinit_mode", "keep_layernorm", "k"), finetunes=True),
    "reinit-lr": View((*CELL, "reinit_mode", "lr_multiplier", "k"), finetunes=True),
    "localized": View((*CELL, "reinit_mode", "block_mode", "block_size", "block_start"), finetunes=True),
    "single-layer": View((*CELL, "reinit_mode", "layer"), finetunes=True),
    "permutation": View((*CELL, "permutation")),
    "heads": View((*CELL, "reinit_mode", "layer", "head"), finetunes=True, reset_column="head"),
    "sequential": View((*CELL, "intermediate_task")),
    "probing": View((*CELL, "probe", "layer")),
    "lr-multipliers": View((*CELL, "k", "group", "multipliers")),
    "sublayer": View((*CELL, "reinit_mode", "sublayer", "layer"), finetunes=True, reset_column="sublayer",
                     title="Attention or feed-forward block of one layer reinitialized",
                     note="Only the named block of the layer (with its LayerNorm) is reinitialized; the full model "
                          "(sublayer empty) is the same grid's baseline.", x="layer", series="sublayer",
                     new_columns=(("sublayer", "string"),)),
    "alternate": View((*CELL, "reinit_mode", "parity"), finetunes=True,
                      title="Every other layer reinitialized (odd or even layers)", x="parity",
                      new_columns=(("parity", "string"),)),
    "scratch": View((*CELL, "reinit_mode"), finetunes=True,
                    title="From scratch: every layer and the embeddings reinitialized",
                    note="The floor: against incremental k = 0 (embeddings only, the reference lines), what the "
                         "pretrained embeddings alone carry.", new_columns=(("reinit_embeddings", "bool"),)),
}

KNOWN_EXPERIMENTS = tuple(VIEWS)
FINETUNE_EXPERIMENTS = tuple(name for name, view in VIEWS.items() if view.finetunes)
EXPERIMENT_COLUMNS = {name: list(view.columns) for name, view in VIEWS.items()}
RESET_COLUMNS = tuple(dict.fromkeys(v.reset_column for v in VIEWS.values() if v.reset_column))
GENERIC = tuple(name for name, view in VIEWS.items() if view.title)  # tables and figures made from the entry


def table(rows: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """The experiment's conditions, summarized (n, mean, 95% t-interval, ...) by its columns."""
    from analysis import tables as T

    return T._experiment_table(rows, [experiment], [*VIEWS[experiment].columns, "metric_name"])


def figure(rows: pd.DataFrame, experiment: str) -> list:
    """Per model, size and reinit mode, a panel per task: each condition's mean and 95% t-interval along
    the entry's x axis (one line per `series` value), the full model and embeddings-only references as lines."""
    import numpy as np

    from analysis import figures as F
    from analysis import tables as T

    view = VIEWS[experiment]
    summary = F._drawable(table(rows, experiment))
    if view.reset_column and view.reset_column in summary.columns:  # the baseline is a reference line
        summary = summary[summary[view.reset_column].notna()]
    if summary.empty:
        return []
    refs = T.reference_table(rows)
    plots = []
    for suffix, part, sub in F._split(summary, ["model", "train_size", "reinit_mode"], drawn=tuple(c for c in (view.x, view.series) if c)):
        tasks = sorted(sub["task"].unique(), key=T.task_key)
        fig, axes = F._panels(len(tasks))
        first = sub.iloc[0]
        ticks = sorted(sub[view.x].dropna().unique(), key=str) if view.x else [experiment]
        for ax, task in zip(axes, tasks):
            here = sub[sub["task"] == task]
            groups = here.groupby(view.series, sort=True) if view.series else [(experiment, here)]
            for i, (name, group) in enumerate(groups):
                x = [ticks.index(v) for v in group[view.x]] if view.x else [0] * len(group)
                F._errorline(ax, x, group, color=F.SERIES_COLORS[i % len(F.SERIES_COLORS)], label=str(name),
                             offset=0.1 * i)
            F._reference_lines(ax, T.reference_values(refs, task, first["model"], first["train_size"],
                                                      first.get("reinit_mode"), condition=first.to_dict()))
            F._task_axes(ax, task, F._metric(here))
            ax.set_xticks(np.arange(len(ticks)), [str(t) for t in ticks])
            ax.set_xlabel(view.x or "", fontsize=8.5)
        F._legend(fig, axes)
        F._title(fig, f"{view.title}, {F._short('model', first['model'])}, {int(first['train_size']):,} examples"
                 + F._extra(part))
        plots.append(F.Plot(f"{experiment}{suffix}", fig,
                            f"{view.title}. Means with 95% t-intervals; dashed: the full model, dotted: embeddings "
                            "only (incremental k = 0)." + F._one_trial_note(sub) + F._excluded_note(sub),
                            "experiment_figure", f"{view.title} ({F._context(sub, part)})", f", {experiment!r}"))
    return plots
