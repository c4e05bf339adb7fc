"""An experiment's table and figure made from its trialrows.experiments entry alone: all a new experiment needs
to appear in the report."""
from __future__ import annotations

import pandas as pd

from trialrows.experiments import (  # noqa: F401
    CELL, EXPERIMENT_COLUMNS, FINETUNE_EXPERIMENTS, GENERIC, KNOWN_EXPERIMENTS, RESET_COLUMNS, VIEWS, View,
)


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
            F._task_axes(ax, task, F._metric(here), rows)
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
