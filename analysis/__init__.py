"""Statistics, tables and figures from the Parquet results store alone (no sweep, no trainables).

    import analysis
    rows = analysis.load("results/incremental")      # every trial row, ready for the functions below
    analysis.tables.incremental_table(rows)          # one function per table, each a DataFrame
    analysis.tables.permutation_correlations(rows)   # Table 1
    analysis.figures.incremental_figure(rows)        # one function per figure, each a list of Plot
    analysis.build_report("results", "report")       # what `python -m analysis report` writes

The submodules load on first use, so `from analysis.results import read_results` (the sweep's results
store does this) does not pull in matplotlib or scipy.
"""
import importlib

from analysis.results import load, prepare, read_results

_LAZY = {"figures": "analysis.figures", "tables": "analysis.tables", "report": "analysis.report",
         "format": "analysis.format", "stats": "analysis.stats", "results": "analysis.results",
         "schema": "analysis.schema", "search": "analysis.search"}

__all__ = [
    "build_report", "condition_table", "correlation", "describe", "figures", "load", "prepare", "read_results",
    "report", "stats", "summarize", "t_interval", "tables",
]  # fmt: skip


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(_LAZY[name])
    if name == "build_report":
        return importlib.import_module("analysis.report").build_report
    if name in ("condition_table", "correlation", "describe", "summarize", "t_interval"):
        return getattr(importlib.import_module("analysis.stats"), name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
