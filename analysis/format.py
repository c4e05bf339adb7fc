"""Tables for reading: numbers rounded, the interval in one column, empty columns dropped; as Markdown,
LaTeX (booktabs) or HTML. The CSV files keep the raw numbers; these are for people."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

FIGURE_FORMATS = ("png", "pdf")  # the figure files a report writes unless told (--formats)
# Columns of the raw tables that the readable form folds into others or leaves to the CSV.
_FOLDED = {"ci95_low", "ci95_high", "mean_minus_2std", "mean_plus_2std", "excluded"}
_P_VALUES = {"spearman_p", "pearson_p", "wilcoxon_p"}
_QUIET = ("keep_layernorm", "reinit_pooler", "reinit_mode")


def _number(value, digits: int = 4) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (tuple, list, np.ndarray)):  # a search's multipliers were printed to 17 digits each
        return "(" + ", ".join(f"{v:.3g}" if isinstance(v, (float, np.floating)) else str(v) for v in value) + ")"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if float(value).is_integer() and abs(value) < 1e6 and digits == 0:
            return str(int(value))
        return f"{value:.{digits}f}"
    return str(value)


def _p_value(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "n/a"  # no test could be made: the note says why
    return "<0.0001" if value < 1e-4 else f"{value:.4f}"


def readable(table: pd.DataFrame, two_std: bool = False) -> pd.DataFrame:
    """The table as strings: n, diverged and failed counts beside 'mean', 'std', '95% CI' as [low, high],
    '±2 std' (when `two_std`); columns empty everywhere, and reinit_mode / keep_layernorm where constant,
    left out."""
    if table.empty:
        return table.astype(str)
    table = table.copy()
    out = pd.DataFrame(index=table.index)
    # The interval goes beside the spread it comes from: a condition's std, or a paired table's mean difference
    # (which has no std column of its own), else beside the mean (a precision target's Stein interval).
    anchor = next((c for c in ("std", "mean_difference", "mean") if c in table.columns), None)
    for column in table.columns:
        if column in _FOLDED:
            continue
        series = table[column]
        if (series.isna().all() or (series.astype(str) == "").all()) and column not in _P_VALUES:
            continue  # a test that could not be made stays, as "n/a" beside the note that says why
        if column in _QUIET and series.nunique(dropna=False) <= 1:
            continue
        if column in _P_VALUES:
            out[column] = series.map(_p_value)
        elif column in ("mean", "std", "mean_difference", "spearman", "pearson", "baseline", "delta", "direct",
                        "mean_val_objective", "chance"):
            out[column] = series.map(_number)
        elif column in ("train_size", "n", "diverged", "failed", "k", "layer", "head", "block_start", "block_size",
                        "pairs", "permutations", "at_chance", "needed", "trials", "values", "pilot_trials",
                        "max_trials", "best_sample", "completed", "pruned"):  # float where one row has none
            out[column] = series.map(lambda v: _number(v, 0))
        elif column == "lr_multiplier":
            out[column] = series.map(lambda v: "" if pd.isna(v) else f"{v:g}x")
        elif column == "mean_stop_epoch":
            out[column] = series.map(lambda v: _number(v, 1))
        else:
            out[column] = series.map(lambda v: _number(v))
        if column == anchor and "ci95_low" in table.columns:
            out["95% CI"] = [
                "" if np.isnan(lo) else f"[{lo:.4f}, {hi:.4f}]" for lo, hi in zip(table["ci95_low"], table["ci95_high"])
            ]
            if two_std and "std" in table.columns:
                out["±2 std"] = ["" if np.isnan(s) else f"±{2 * s:.4f}" for s in table["std"].astype(float)]
    if "note" in out.columns and (out["note"] == "").all():
        out = out.drop(columns="note")
    return out.reset_index(drop=True)


def correlations_readable(table: pd.DataFrame) -> pd.DataFrame:
    """Table 1 as the paper prints it: 'Spearman (p)' and 'Pearson (p)' per task pair, with N."""
    if table.empty:
        return table.astype(str)
    # Settings that split Table 1 (epochs 3 and 10, a --fractions share): without them its lines read as repeats.
    made = ("model", "train_size", "task_a", "task_b", "n", "spearman", "spearman_p", "pearson", "pearson_p", "note")
    splits = [c for c in table.columns if c not in made]
    out = pd.DataFrame({
        "model": table["model"].astype(str),
        "train_size": table["train_size"].map(lambda v: _number(v, 0)),
        **{c: table[c].map(_number) for c in splits},
        "tasks": [f"{a}, {b}" for a, b in zip(table["task_a"], table["task_b"])],
        "Spearman (p)": [_pair(r, p) for r, p in zip(table["spearman"], table["spearman_p"])],
        "Pearson (p)": [_pair(r, p) for r, p in zip(table["pearson"], table["pearson_p"])],
        "N": table["n"].map(lambda v: _number(v, 0)),
        "note": table["note"].fillna(""),
    })
    for column in ("model", "train_size"):
        if out[column].nunique() <= 1:
            out = out.drop(columns=column)
    if (out["note"] == "").all():
        out = out.drop(columns="note")
    return out


def _pair(r, p) -> str:
    return "" if np.isnan(r) else f"{r:.2f} ({p:.2f})" if p >= 0.005 else f"{r:.2f} ({_p_value(p)})"


def matrix_readable(matrix: pd.DataFrame) -> pd.DataFrame:
    """The sequential-finetuning matrix with its index as columns and numbers rounded."""
    if matrix.empty:
        return pd.DataFrame()
    out = matrix.reset_index()
    for column in matrix.columns:
        out[column] = out[column].map(_number)
    out["train_size"] = out["train_size"].map(lambda v: _number(v, 0))
    out.columns = [str(c) if c != "final_task" else "final \\ intermediate" for c in out.columns]
    if out["model"].nunique() <= 1:
        out = out.drop(columns="model")
    return out


def to_markdown(table: pd.DataFrame) -> str:
    if table.empty:
        return "_(no rows)_\n"
    cells = [[str(c) for c in table.columns]] + [[str(v) for v in row] for row in table.itertuples(index=False)]
    cells = [[c.replace("|", "\\|") for c in row] for row in cells]
    numeric = [all(_looks_numeric(r[i]) for r in cells[1:]) for i in range(len(cells[0]))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = []
    for j, row in enumerate(cells):
        padded = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)]
        lines.append("| " + " | ".join(padded) + " |")
        if j == 0:
            lines.append("|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2))
                                        for w, num in zip(widths, numeric)) + "|")
    return "\n".join(lines) + "\n"


def _looks_numeric(text: str) -> bool:
    text = text.strip().lstrip("±<")
    if text == "":
        return True
    try:
        float(text)
        return True
    except ValueError:
        return False


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "±": r"$\pm$", "<": r"$<$"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def to_latex(table: pd.DataFrame, caption: str = "", label: str = "") -> str:
    """A booktabs table (needs \\usepackage{booktabs})."""
    if table.empty:
        return "% (no rows)\n"
    align = "".join("r" if all(_looks_numeric(str(v)) for v in table[c]) else "l" for c in table.columns)
    lines = [r"\begin{table}[t]", r"\centering", rf"\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(_latex_escape(c) for c in table.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(_latex_escape(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(rf"\caption{{{_latex_escape(caption)}}}")
    if label:
        lines.append(rf"\label{{{label}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def to_html(table: pd.DataFrame) -> str:
    if table.empty:
        return "<p><em>(no rows)</em></p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in table.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
