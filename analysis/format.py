"""Tables for reading: numbers rounded, the interval in one column, empty columns dropped; as Markdown,
LaTeX (booktabs) or HTML. The CSV files keep the raw numbers; these are for people."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

from trialrows.readable import number as _number, p_value as _p_value, readable  # noqa: F401 (re-exported)

FIGURE_FORMATS = ("png", "pdf")  # the figure files a report writes unless told (--formats)


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
