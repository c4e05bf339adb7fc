"""`python -m analysis summary RESULTS` prints the per-condition table; `python -m analysis report RESULTS
--out DIR` writes every table and figure the rows support, with an index page."""
import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis.format import FIGURE_FORMATS, readable
from analysis.results import prepare, read_results
from analysis.stats import condition_table
from analysis.tables import mixed_lines
from trialrows.precision import precision_table, targeted


def rows_under(path):
    """The rows under `path`, or None (said on stderr) where there is no store to read: one line, no traceback."""
    try:
        return read_results(path)
    except FileNotFoundError as err:
        print(f"{err}: give a storage folder, one sweep's folder or one Parquet file", file=sys.stderr)
        return None


def summary(args) -> int:
    raw = rows_under(args.results)
    if raw is None:
        return 1
    rows = prepare(raw)
    if rows.empty:
        print(f"no trial rows under {args.results}", file=sys.stderr)
        return 1
    table = condition_table(rows)
    stats_columns = {"n", "diverged", "failed", "mean", "std", "ci95_low", "ci95_high", "note"}
    # dropna=False: rows that name no experiment (another tool's Parquet file) are printed, not skipped.
    parts = table.groupby("experiment", sort=True, dropna=False) if "experiment" in table.columns else [("", table)]
    for experiment, part in parts:
        experiment = "" if pd.isna(experiment) else experiment
        # Each experiment with its own condition columns: one it leaves empty, or sets to one value while
        # another experiment varies it, would only widen the print.
        unused = [c for c in part.columns if c not in stats_columns and c not in ("task", "metric_name")
                  and part[c].nunique(dropna=False) <= 1]
        shown = part.drop(columns=[*unused, "excluded", "mean_minus_2std", "mean_plus_2std"], errors="ignore")
        print(f"\n{experiment}" if experiment else "")
        print(readable(shown).to_string(index=False))  # as the report's tables read: no <NA>, counts as counts
    for line in mixed_lines(rows):
        print(f"\n{line}")
    if targeted(rows):
        print("\nprecision targets (Stein's two-stage procedure):")
        print(readable(precision_table(rows)).to_string(index=False))
    # As the table counts them (trialrows.summaries.summarize): a finished trial without a value is failed.
    usable = rows["status"].eq("ok") & rows["dev_metric"].notna()
    left = int((~usable).sum())
    if left:
        diverged = int(rows["status"].eq("diverged").sum())
        # stopped early by a search's scheduler, not failed: counted apart, as the report's header does
        pruned = int(rows["status"].eq("pruned").sum())
        valueless = int((rows["status"].eq("ok") & ~usable).sum())
        print(f"\nleft out of the means: {diverged} diverged, {left - diverged - pruned} failed"
              + (f" ({valueless} of them finished without a dev metric)" if valueless else "")
              + (f", {pruned} pruned by the search's scheduler (the table's `failed` counts them)" if pruned else ""))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


def report(args) -> int:
    from analysis.report import build_report

    raw = rows_under(args.results)
    if raw is None:
        return 1
    if raw.empty:
        print(f"no trial rows under {args.results}", file=sys.stderr)
        return 1
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"--out: {args.out} is a file; give a folder for the report (made if missing)", file=sys.stderr)
        return 1
    made = build_report(args.results, args.out, latex=args.latex, formats=args.formats, raw=raw)
    tables, figures = len(made.tables), len(made.figures)
    print(f"{tables} table{'s' * (tables != 1)} and {figures} figure{'s' * (figures != 1)} in {made.folder}; open "
          f"{made.folder / 'index.html'} (or index.md)")
    for line in made.header[1:3]:
        print(line)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summary", help="per-condition n, mean, std and 95%% t-interval")
    s.add_argument("results", help="a results folder (or one Parquet file)")
    s.add_argument("--csv", help="also write the table to this CSV file")
    s.set_defaults(run=summary)
    r = sub.add_parser("report", help="tables (Markdown, CSV, LaTeX), figures (PNG, PDF) and an index page")
    r.add_argument("results", help="a results folder (a storage folder, one sweep's folder, or one Parquet file)")
    r.add_argument("--out", required=True, help="the folder to write the report into")
    r.add_argument("--latex", action="store_true", help="also write every table as LaTeX (booktabs)")
    r.add_argument("--formats", nargs="+", default=list(FIGURE_FORMATS), choices=["png", "pdf", "svg"],
                   help=f"figure file formats (default: {' '.join(FIGURE_FORMATS)})")
    r.set_defaults(run=report)
    args = p.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
