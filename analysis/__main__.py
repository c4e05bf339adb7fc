"""`python -m analysis summary RESULTS`: the per-condition table of whatever RESULTS holds."""
import argparse
import sys

from analysis.results import read_results
from analysis.stats import condition_table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis")
    sub = p.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="per-condition n, mean, std and 95%% t-interval")
    summary.add_argument("results", help="a results folder (or one Parquet file)")
    summary.add_argument("--csv", help="also write the table to this CSV file")
    args = p.parse_args(argv)
    rows = read_results(args.results)
    if rows.empty:
        print(f"no trial rows under {args.results}", file=sys.stderr)
        return 1
    table = condition_table(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


sys.exit(main())
