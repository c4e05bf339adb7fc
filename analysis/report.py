"""`python -m analysis report RESULTS --out DIR`: every table and figure the rows support, and an index.

DIR/
  index.md, index.html      every table and figure, with the command that made it
  tables/<name>.csv         raw numbers (full precision, every column)
  tables/<name>.md          the same table for reading (and <name>.tex with --latex)
  figures/<name>.png, .pdf
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import html
import shlex
from pathlib import Path

import matplotlib
import pandas as pd

from analysis import figures as F
from analysis import format as fmt
from analysis import search as S
from analysis import tables as T
from analysis.results import prepare, read_results, result_files
from trialrows.precision import precision_table, targeted

# PDF and PS figures embed their fonts as TrueType (Type 42), which journals and conference checkers accept,
# instead of matplotlib's default Type 3 fonts (glyphs as drawing procedures), which publishers' checks refuse.
EMBEDDED_FONTS = {"pdf.fonttype": 42, "ps.fonttype": 42}

INLINE_ROWS = 40  # longer tables are shown in part on the index page, whole in their files


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    title: str
    function: object
    kind: str = "summary"  # summary | plain | correlations | matrix
    two_std: bool = False
    note: str = ""


TABLES = (
    TableSpec("status", "Trials by status", T.status_table, "plain",
              note="Every row read, by experiment and status; only 'ok' trials enter the means below."),
    TableSpec("references", "Reference models", T.reference_table, two_std=True,
              note="Full model (nothing reinitialized) and embeddings only (incremental k = 0): the reference "
                   "lines of Figures 3, 4 and 6."),
    TableSpec("paired-differences", "Each condition against the full model, paired by trial index",
              T.paired_differences, "plain",
              note="Every condition of a trial index trains on the same subset with the same seeds as the full "
                   "model of that index: mean paired difference (condition minus full model), its paired 95% "
                   "t-interval (n-1 df) and the two-sided Wilcoxon signed-rank p-value (scipy.stats.wilcoxon), "
                   "over the indices where both finished."),
    TableSpec("precision", "Precision targets: the trials each condition took, and whether it reached W",
              precision_table, "plain",
              note="Conditions of precision-targeted sweeps (`--target-ci W`), by Stein's two-stage procedure: a "
                   "pilot of n0 trials (`pilot_trials`), then N = max(n0, ceil((t s0 / W)^2)) in all (`needed`; t: "
                   "Student's 97.5% quantile on n0-1 df, s0: the pilot's standard deviation), at most `max_trials`. "
                   "The interval is the mean of the N values +- t s0 / sqrt(N): at most W wide on each side, with "
                   "exactly 95% coverage for normally distributed values (`reached`); a condition stopped at "
                   "`max_trials` or short of values (diverged trials) says so in `state`. `paired`: each trial "
                   "index's difference against the full model of the same index, which runs the largest N of its "
                   "conditions."),
    TableSpec("incremental", "Incremental reinitialization (Figure 2)", T.incremental_table,
              note="Layers 1..k pretrained, k+1..L reinitialized."),
    TableSpec("localized", "Localized reinitialization (Figure 3)", T.localized_table),
    TableSpec("permutation", "Layer permutations (Figure 4)", T.permutation_table,
              note="A permutation is its layer order; its repeats are averaged first, so n counts permutations "
                   "(`trials`: the finished trials behind them)."),
    TableSpec("permutation-correlations", "Table 1: paired correlations between tasks over permutations",
              T.permutation_correlations, "correlations",
              note="Spearman and Pearson correlation between two tasks' outcomes of the same permutation "
                   "(paired by layer order, repeats averaged), two-sided p-value in parentheses, N pairs."),
    TableSpec("probing", "Probing (dashed lines of Figure 2)", T.probing_table,
              note="Frozen model, a classifier on one layer (0 = embeddings)."),
    TableSpec("single-layer", "Single-layer reinitialization (Figure 6)", T.single_layer_table, two_std=True),
    TableSpec("reinit-lr", "Higher learning rate for reinitialized layers (Figure 7)", T.lr_multiplier_table,
              two_std=True),
    TableSpec("layernorm", "Preserved LayerNorm (Figure 8)", T.layernorm_table, two_std=True),
    TableSpec("weight-distance", "Weight change by layer", T.weight_distance_table,
              note="Frobenius distance per layer (weight_layer: positions, after a permutation) between the weights "
                   "where finetuning started (after the surgery; sequential rows: after the intermediate task) and "
                   "where it ended."),
    TableSpec("sequential-matrix", "Sequential finetuning: final task x intermediate task", T.sequential_matrix,
              "matrix", note="Mean dev metric of the final task (row) after finetuning on the intermediate task "
                             "(column) first; the diagonal is direct finetuning."),
    TableSpec("sequential", "Sequential finetuning, per cell", T.sequential_table),
    TableSpec("heads", "One attention head reinitialized", T.heads_table),
    TableSpec("lr-search", "Per-layer learning-rate multiplier search: best against baseline, per cell",
              S.best_table, "plain",
              note="Best trial by the search's objective (val_objective: examples held out of the training subset) "
                   "among those that ran every epoch, against the same cell's baseline (every multiplier 1); "
                   "dev metrics are reported, never used to choose. Multipliers are layers 1..L."),
    TableSpec("lr-search-importances", "Per-layer learning-rate multiplier search: parameter importances",
              S.importance_table, "plain",
              note="PED-ANOVA (optuna.importance.PedAnovaImportanceEvaluator, deterministic: no random draw) on "
                   "each cell's completed trials (study rebuilt from the rows): how much each multiplier explains "
                   "of the top 10% of the validation objective."),
    *(TableSpec(name, T.VIEWS[name].title, functools.partial(T.experiment_table, experiment=name),
                note=T.VIEWS[name].note) for name in T.GENERIC),
    TableSpec("other", "Other experiments", T.other_table,
              note="Experiments without a dedicated table: the generic per-condition summary."),
)


@dataclasses.dataclass
class Item:
    kind: str  # "table" | "figure"
    name: str
    title: str
    files: list[str]  # relative to the report folder
    api: str
    caption: str = ""
    readable: pd.DataFrame | None = None
    rows: int = 0


@dataclasses.dataclass
class Report:
    folder: Path
    command: str
    header: list[str]
    items: list[Item]

    @property
    def tables(self):
        return [i for i in self.items if i.kind == "table"]

    @property
    def figures(self):
        return [i for i in self.items if i.kind == "figure"]


def readable_table(spec: TableSpec, table: pd.DataFrame) -> pd.DataFrame:
    if spec.kind == "correlations":
        return fmt.correlations_readable(table)
    if spec.kind == "matrix":
        return fmt.matrix_readable(table)
    return fmt.readable(table, two_std=spec.two_std)


def build_report(results, out, *, latex: bool = False, formats=fmt.FIGURE_FORMATS, command: str | None = None,
                 dpi: int = 150, raw: pd.DataFrame | None = None) -> Report:
    """Write the report of the rows under `results` into `out` (`raw`: those rows, when already read);
    returns what it wrote."""
    out = Path(out)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    raw = read_results(results) if raw is None else raw  # the store is read once, for every table and figure
    rows = prepare(raw)
    command = command or " ".join(["python -m analysis report", shlex.quote(str(results)), "--out",
                                   shlex.quote(str(out))] + (["--latex"] if latex else [])
                                  + (["--formats", *formats] if tuple(formats) != fmt.FIGURE_FORMATS else []))
    load = f"analysis.load({str(results)!r})"
    items = []
    for spec in TABLES:
        table = spec.function(rows)
        if table.empty:
            continue
        readable = readable_table(spec, table)
        stem = out / "tables" / spec.name
        (table.reset_index() if spec.kind == "matrix" else table).to_csv(stem.with_suffix(".csv"), index=False)
        note = f"{spec.note}\n\n" if spec.note else ""
        stem.with_suffix(".md").write_text(f"# {spec.title}\n\n{note}{fmt.to_markdown(readable)}")
        files = [f"tables/{spec.name}.csv", f"tables/{spec.name}.md"]
        if latex:
            stem.with_suffix(".tex").write_text(fmt.to_latex(readable, caption=spec.title, label=f"tab:{spec.name}"))
            files.append(f"tables/{spec.name}.tex")
        api = _api(spec.function, load)
        items.append(Item("table", spec.name, spec.title, files, api,
                          spec.note, readable, len(table)))
    taken: set[str] = set()
    for plot in [*F.all_figures(rows), *F.probing_figure(rows)]:  # probing beside finetuning, when probed
        # A file stem keeps only the end of a model's name (figures.slug): `org/bert` and `/models/bert` would
        # write one file, the second figure over the first, shown twice.
        plot.name = _unique(plot.name, taken)
        files = []
        for ext in formats:
            path = out / "figures" / f"{plot.name}.{ext}"
            with matplotlib.rc_context(EMBEDDED_FONTS):
                plot.figure.savefig(path, dpi=dpi, bbox_inches="tight")  # legends below narrow figures stay whole
            files.append(f"figures/{plot.name}.{ext}")
        items.append(Item("figure", plot.name, plot.title or plot.name, files,
                          f"analysis.figures.{plot.function}({load}{plot.arguments})", plot.caption))
    report = Report(out, command, _header(results, raw, rows), items)
    (out / "index.md").write_text(index_markdown(report))
    (out / "index.html").write_text(index_html(report))
    return report


def _shown_image(files: list[str]) -> str | None:
    """The figure file a page shows: the PNG, else the SVG (`--formats svg`); a PDF cannot be an image."""
    return next((f for ext in (".png", ".svg") for f in files if f.endswith(ext)), None)


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or `name-2`, `name-3`, ... where it is taken; the one returned is taken from then on."""
    stem, i = name, 1
    while stem in taken:
        i += 1
        stem = f"{name}-{i}"
    taken.add(stem)
    return stem


def _api(function, load: str) -> str:
    """The Python call that makes a table."""
    if isinstance(function, functools.partial):
        arguments = "".join(f", {k}={v!r}" for k, v in function.keywords.items())
        return f"{function.func.__module__}.{function.func.__name__}({load}{arguments})"
    return f"{function.__module__}.{function.__name__}({load})"


def _header(results, raw: pd.DataFrame, rows: pd.DataFrame) -> list[str]:
    counts = rows["status"].value_counts().to_dict() if len(rows) else {}
    shown_pruned = ("pruned",) if counts.get("pruned") else ()
    lines = [
        f"Source: `{results}` ({len(result_files(results))} Parquet files, {len(rows)} trials), read "
        f"{datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}. A sweep still running adds "
        "rows: run the command again.",
        "Trials: " + (", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "diverged", *shown_pruned, "error"))
                      if counts else "none") + ".",
    ]
    pruned = counts.get("pruned", 0)  # lr-multipliers: stopped early by the search's scheduler, not failed
    # what the tables average (trialrows.summaries.summarize): a finished trial without a value counts as failed
    usable = int(((rows["status"] == "ok") & rows["dev_metric"].notna()).sum()) if len(rows) else 0
    valueless = counts.get("ok", 0) - usable
    left = len(rows) - usable - pruned
    if left:
        lines.append(f"Left out of every mean, interval and figure: {counts.get('diverged', 0)} diverged and "
                     f"{left - counts.get('diverged', 0)} failed trials"
                     + (f" ({valueless} of them finished without a dev metric)" if valueless else "")
                     + "; each table counts them per condition (`diverged`, `failed`).")
    repeated = raw.attrs.get("repeated_rows", 0)
    if repeated:
        lines.append(f"{repeated} rows repeated a trial_id already read (the same trial in two folders, or "
                     "run again after it failed) and were counted once.")
    if "experiment" in rows.columns and len(rows):
        # dropna=False: rows naming no experiment (another tool's file) are in the tables, so they are counted here.
        counts = rows["experiment"].value_counts(dropna=False).sort_index(na_position="last")
        lines.append("Experiments: " + ", ".join(f"{'(none named)' if pd.isna(e) else e} ({n})"
                                                 for e, n in counts.items()) + ".")
    lines += T.mixed_lines(rows)
    lines.append("Intervals: 95% t-intervals with n-1 degrees of freedom (scipy.stats.t); ±2 std where the paper "
                 "used it (Figures 4, 6, 7, 8). A condition with one finished trial has a mean and no interval.")
    if targeted(rows):
        lines.append("Conditions of precision-targeted sweeps (--target-ci) have Stein's two-stage interval instead "
                     "(mean of the N trials the procedure chose +- t_{n0-1} s0 / sqrt(N)), said so in their `note`; "
                     "see the precision table.")
    return lines


def index_markdown(report: Report) -> str:
    parts = [f"# Results report\n\n```bash\n{report.command}\n```\n"]
    parts += [f"- {line}" for line in report.header]
    parts.append("\nIn Python (a notebook), every table and figure below comes from the call printed with it:\n\n"
                 "```python\nimport analysis\nrows = analysis.load(...)  # the same rows as this report\n```\n")
    parts.append("## Contents\n")
    parts += [f"- [{i.title}](#{i.kind}-{i.name}) ({i.kind})" for i in report.items]
    for item in report.items:
        parts.append(f'\n<a id="{item.kind}-{item.name}"></a>\n\n## {item.title}\n')
        if item.kind == "figure":
            image = _shown_image(item.files)
            if image:
                parts.append(f"![{item.name}]({image})\n")
            parts.append(f"{item.caption}\n")
        else:
            if item.caption:
                parts.append(f"{item.caption}\n")
            shown = item.readable.head(INLINE_ROWS)
            parts.append(fmt.to_markdown(shown))
            if len(item.readable) > INLINE_ROWS:
                parts.append(f"\n_First {INLINE_ROWS} of {len(item.readable)} rows; all of them in the files below._\n")
        parts.append("Files: " + ", ".join(f"[{f}]({f})" for f in item.files) + "  ")
        parts.append(f"Made by: `{report.command}`  \nPython: `{item.api}`\n")
    return "\n".join(parts) + "\n"


_STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}
img{max-width:100%;border:1px solid #eee}code,pre{background:#f6f6f6;padding:1px 4px}
.scroll{max-height:420px;overflow:auto}section{border-top:1px solid #ddd;margin-top:1.5em}
.cmd{font-size:12px;color:#555}"""


def index_html(report: Report) -> str:
    e = html.escape
    body = [f"<h1>Results report</h1><pre>{e(report.command)}</pre><ul>"]
    body += [f"<li>{e(line).replace('`', '')}</li>" for line in report.header]
    body.append("</ul><h2>Contents</h2><ul>")
    body += [f'<li><a href="#{i.kind}-{i.name}">{e(i.title)}</a> ({i.kind})</li>' for i in report.items]
    body.append("</ul>")
    for item in report.items:
        body.append(f'<section id="{item.kind}-{item.name}"><h2>{e(item.title)}</h2>')
        if item.kind == "figure":
            image = _shown_image(item.files)
            if image:
                body.append(f'<img src="{e(image)}" alt="{e(item.name)}">')
            body.append(f"<p>{e(item.caption)}</p>")
        else:
            if item.caption:
                body.append(f"<p>{e(item.caption)}</p>")
            body.append(f'<div class="scroll">{fmt.to_html(item.readable)}</div>')
        links = ", ".join(f'<a href="{e(f)}">{e(f)}</a>' for f in item.files)
        body.append(f'<p class="cmd">Files: {links}<br>Made by: <code>{e(report.command)}</code><br>'
                    f"Python: <code>{e(item.api)}</code></p></section>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Results report</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n")
