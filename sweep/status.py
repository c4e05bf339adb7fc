"""`python -m sweep status [--storage S] NAME`: what a sweep's store holds, per cell, and what a rerun would
do; read from the store alone (rows and the recorded grids), without starting Ray.

Every sweep command records its grid before it runs anything: `<storage>/<name>/plans/<digest>.json`, the
command and each planned trial's identity row (the digest is of the trial ids, so running the same command
again rewrites the same file). A trial is then done, diverged, failed (its row says so) or not yet run (a
recorded grid holds it and no row does). A sweep still running shows its running trials as not yet run:
rows land when trials end.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import shlex
import time

import pandas as pd
import pyarrow.fs

from sweep.estimate import remaining_line
from sweep.lock import HEARTBEAT, LOCK, STALE, read_lock, why_gone
from sweep.store import filesystem, join, location, rows_dir, sweep_dir
from trialrows.precision import PILOT, precision_outcomes
from trialrows.read import QUARANTINE, quarantine_file

PLANS = "plans"
NOT_RUN = "not yet run"
# Column titles of the row statuses; any other status (lr-multipliers' `pruned`) is shown under its own name.
SHOWN = {"ok": "done", "diverged": "diverged", "error": "failed"}
ALWAYS_SHOWN = ("task", "train_size")  # the cell columns shown even where every cell shares them


def record_plan(sweep: str, argv: list[str], experiment: str, rows: list[dict], rerun_skips) -> None:
    """Write the grid a command asks for, before it runs: its command, the statuses a rerun skips, and the
    identity row of every planned trial."""
    ids = sorted(row["trial_id"] for row in rows)
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12]
    plan = {
        "command": "python -m sweep " + shlex.join(argv),
        "experiment": experiment,
        # Microseconds: a precision sweep records its pilot and then its whole grid within the same second.
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
        "rerun_skips": sorted(rerun_skips),
        "trials": rows,
    }
    fs, path = filesystem(join(sweep, PLANS))
    fs.create_dir(path)
    with fs.open_output_stream(f"{path}/{digest}.json") as out:
        out.write(json.dumps(plan).encode())


def read_plans(sweep: str) -> list[dict]:
    """Every grid recorded for the sweep, oldest first."""
    fs, path = filesystem(join(sweep, PLANS))
    found = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    plans = []
    for info in found:
        if info.is_file and info.base_name.endswith(".json"):
            with fs.open_input_stream(info.path) as handle:
                text = handle.read()
            try:
                plan = json.loads(text)
                plans.append({"written_at": plan["written_at"], "trials": plan["trials"], "command": plan["command"],
                              "rerun_skips": plan["rerun_skips"],
                              "at": aware(datetime.datetime.fromisoformat(plan["written_at"]))})
            except (ValueError, KeyError, TypeError) as err:  # cut short or not a plan: set aside, one line
                quarantine_file(fs, info.path, f"{type(err).__name__}: {err}")
    return sorted(plans, key=lambda plan: plan["at"])


def aware(at: datetime.datetime) -> datetime.datetime:
    """A plan's time with its zone; one written by hand without a zone is read as UTC (ours are), so that
    plans sort together."""
    return at if at.tzinfo is not None else at.replace(tzinfo=datetime.timezone.utc)


def trial_table(plans: list[dict], stored: pd.DataFrame) -> pd.DataFrame:
    """One line per trial a recorded grid plans or a row holds: its identity columns and `state` (a row's
    status, or 'not yet run')."""
    planned = pd.DataFrame([row for plan in plans for row in plan["trials"]])
    if len(planned):
        planned = planned.drop_duplicates("trial_id", keep="last")
        unplanned = stored[~stored["trial_id"].isin(planned["trial_id"])]
        trials = pd.concat([planned.merge(stored[["trial_id", "status"]], on="trial_id", how="left"), unplanned])
    else:
        trials = stored
    trials = trials.reset_index(drop=True)
    trials["state"] = trials["status"].astype(object).where(trials["status"].notna(), NOT_RUN)
    return trials


def cell_columns(trials: pd.DataFrame) -> list[str]:
    """The condition columns (trialrows.summaries') that tell the sweep's cells apart: task and size always, the
    others where they vary."""
    from trialrows.conditions import groupable
    from trialrows.summaries import condition_columns

    # `state` is this table's own column, not a setting (the schema counts an undeclared column as one).
    columns = [c for c in condition_columns(trials.drop(columns="state")) if c != "metric_name"]
    trials = groupable(trials)  # a permutation's layer order is a list, which pandas cannot count
    return [c for c in columns if c in ALWAYS_SHOWN or trials[c].nunique(dropna=False) > 1]


def cell_counts(trials: pd.DataFrame) -> pd.DataFrame:
    """Per cell: its trials, and how many are done, diverged, failed (and any other status) or not yet run."""
    from trialrows.conditions import groupable

    trials = groupable(trials)  # list cells as tuples, which group
    by = cell_columns(trials)
    keys = trials[by].astype(object).where(trials[by].notna(), "-")
    keys = keys.map(lambda v: int(v) if isinstance(v, float) and v.is_integer() else v)
    counts = pd.crosstab([keys[c] for c in by], trials["state"]).reindex(columns=states(trials), fill_value=0)
    counts.insert(0, "trials", counts.sum(axis=1))
    counts = counts.rename(columns=SHOWN).reset_index()
    counts.columns.name = None
    return counts


def states(trials: pd.DataFrame) -> list[str]:
    """The states in the order shown: done, diverged, failed, any other status, not yet run."""
    return [*SHOWN, *sorted(set(trials["state"]) - {*SHOWN, NOT_RUN}), NOT_RUN]


def tally(states_seen: pd.Series, order: list[str]) -> str:
    """'done 3, failed 1' in the order shown, naming only the states met."""
    counts = states_seen.value_counts()
    return ", ".join(f"{SHOWN.get(state, state)} {counts[state]}" for state in order if state in counts)


def set_aside_plans(sweep: str) -> list[str]:
    """The sweep's recorded grids that a read set aside as damaged (trialrows.read.quarantine_file)."""
    fs, path = filesystem(join(sweep, QUARANTINE))
    found = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    return sorted(f.path for f in found if f.is_file and f.base_name.startswith(f"{PLANS}-"))


def no_grid(damaged: list[str]) -> str:
    """Why a sweep has no readable grid: its grid was damaged, or it ran before grids were recorded."""
    if damaged:
        return (f"its recorded grid was set aside as damaged ({', '.join(damaged)}): trials it never ran are not "
                "counted; running its command again records it anew")
    return "no grid is recorded for this sweep (it ran before `status` existed): trials it never ran are not counted"


def rerun_line(plans: list[dict], trials: pd.DataFrame, damaged=()) -> str:
    """What running the newest recorded command again would do (`damaged`: the grids set aside, when none is
    left to read)."""
    if not plans:
        return f"{no_grid(damaged)}; a rerun retries its failed trials and runs the grid's missing ones"
    latest = plans[-1]
    mine = trials[trials["trial_id"].isin({row["trial_id"] for row in latest["trials"]})]
    skipped = mine["state"].isin(latest["rerun_skips"])
    run, skip = (tally(mine.loc[which, "state"], states(trials)) for which in (~skipped, skipped))
    written = latest["at"].isoformat(timespec="seconds")
    return (f"rerunning `{latest['command']}` ({written}) would run {(~skipped).sum()} "
            f"trials{f' ({run})' if run else ''} and skip {skipped.sum()}{f' ({skip})' if skip else ''}")


def status(storage: str, name: str) -> str:
    """The report `python -m sweep status` prints."""
    sweep = sweep_dir(storage, name)
    fs, path = filesystem(sweep)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
        raise SystemExit(f"NAME: no sweep '{name}' under --storage {storage} ({sweep} does not exist); "
                         f"sweeps there: {', '.join(sweep_names(storage)) or 'none'}")
    from trialrows.read import read_results

    plans = read_plans(sweep)
    damaged = [] if plans else set_aside_plans(sweep)
    stored = read_results(rows_dir(storage, name)) if is_dir(rows_dir(storage, name)) else pd.DataFrame(
        columns=["trial_id", "status"])
    trials = trial_table(plans, stored)
    if not len(trials):
        return f"{sweep}: no rows; {no_grid(damaged)}" if damaged else f"{sweep}: no rows and no recorded grid yet"
    lines = [
        f"{sweep}: {len(trials)} trials; {tally(trials['state'], states(trials))}",
        cell_counts(trials).to_string(index=False),
        rerun_line(plans, trials, damaged),
        *precision_lines(trials, stored),
        remaining_line(trials, stored, NOT_RUN),
    ]
    unchecked = unfingerprinted(stored)
    if unchecked:
        lines.append(f"{unchecked} rows predate fingerprints: the data and weights they read were not recorded, so a "
                     "change to them since is not detected for those trials")
    holder = read_lock(fs, f"{path}/{LOCK}")
    if holder is not None:
        lines.append(lock_line(holder, fs.get_file_info(f"{path}/{LOCK}").mtime, time.time()))
    return "\n".join(lines)


def lock_line(holder: dict, renewed: datetime.datetime | None, now: float) -> str:
    """Who holds the sweep's lock, or that its holder is gone: a killed driver leaves its lock behind, and that
    sweep is not running, whatever the file says (the next command takes it over, sweep.lock). `renewed`: the
    lock file's last change, by the storage's clock."""
    since = f", since {holder['started_at']}" if holder.get("started_at") else ""
    who = f"`{holder.get('command')}` on {holder.get('host')} (pid {holder.get('pid')}{since})"
    if holder.get("host") != platform.node():
        # Its heartbeat is stamped by its own clock, which may run minutes apart from this one's: one look cannot
        # tell a live holder from a gone one, and a command for the sweep waits for the lock to stop changing.
        age = "" if renewed is None else (f"; its lock was last renewed {now - renewed.timestamp():.0f} s ago by the "
                                          f"storage's clock (every {HEARTBEAT:.0f} s while it runs)")
        return (f"held by {who}, another host{age}: the next command for this sweep waits for it, and takes the lock "
                f"over once it stays unrenewed for {STALE:.0f} s")
    gone = why_gone(holder, now)
    if gone:
        return (f"a lock left by {who}: {gone}; nothing writes this sweep now, and the next command for it takes the "
                "lock over")
    return f"being written now by {who}"


def unfingerprinted(stored: pd.DataFrame) -> int:
    """How many rows were written before fingerprints existed (neither fingerprint recorded)."""
    if stored.empty:
        return 0
    missing = [stored[c].isna() if c in stored.columns else pd.Series(True, index=stored.index)
               for c in ("data_fingerprint", "model_fingerprint")]
    return int((missing[0] & missing[1]).sum())


def precision_lines(trials: pd.DataFrame, stored: pd.DataFrame) -> list[str]:
    """For a precision-targeted sweep (--target-ci): per condition, the trials it needs and has, and whether
    its interval reached W (trialrows.precision), from the planned trials and the rows landed so far."""
    from trialrows.precision import targeted

    if not targeted(trials):
        return []
    results = [c for c in ("dev_metric", "finished_at") if c in stored.columns]
    frame = trials.drop(columns=["state", *[c for c in results if c in trials.columns]])
    frame = frame.merge(stored[["trial_id", *results]].drop_duplicates("trial_id"), on="trial_id", how="left")
    table, line = precision_outcomes(frame)
    keep = [c for c in cell_columns(trials) if c in table.columns]
    shown = table[[*keep, "target_on", "target_ci", "needed", "trials", "half_width", "state", "note"]]
    lines = ["precision targets (Stein's two-stage procedure; needed: N from each pilot's spread, once it is in):",
             shown.to_string(index=False, na_rep="-", float_format=lambda x: f"{x:.4f}")]
    piloting = table[table["state"] == PILOT]
    if len(piloting):
        most = int((piloting["max_trials"] - piloting["pilot_trials"]).sum())
        lines.append(f"stage 2 of {len(piloting)} conditions is planned once their pilots are in: at most {most} "
                     "more trials, not counted below")
    # A grid is recorded for the pilot, and for stage 2 only once every pilot has run: while the pilot runs (or
    # after it was cut short) a condition whose pilot is in needs indices n0..N-1 that no recorded grid lists.
    unlisted = {}
    for position, needed in table["needed"].items():
        if table.at[position, "state"] != PILOT and not pd.isna(needed):
            listed = set(frame.loc[line == position, "trial_index"].astype(int))
            unlisted[position] = len(set(range(int(needed))) - listed)
    if sum(unlisted.values()):
        lines.append(f"stage 2 of {sum(n > 0 for n in unlisted.values())} conditions whose pilots are in: "
                     f"{sum(unlisted.values())} more trials, not yet in a recorded grid (a rerun runs them; not "
                     "counted below)")
    return lines


def is_dir(where) -> bool:
    fs, path = filesystem(where)
    return fs.get_file_info(path).type == pyarrow.fs.FileType.Directory


def sweep_names(storage: str) -> list[str]:
    """The sweeps under a storage location: its folders holding rows or a recorded grid."""
    fs, path = filesystem(location(storage))
    found = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    return sorted(f.base_name for f in found if f.type == pyarrow.fs.FileType.Directory
                  and (is_dir(join(location(storage), f.base_name, "rows"))
                       or is_dir(join(location(storage), f.base_name, PLANS))))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m sweep status",
                                description="What a sweep's store holds per cell and what a rerun would do; "
                                            "reads the store alone (no Ray).")
    p.add_argument("name", metavar="NAME", help="the sweep's name (its --name, default the experiment)")
    p.add_argument("--storage", default="./results", help="the sweep's --storage (default ./results; s3://... too)")
    args = p.parse_args(argv)
    print(status(args.storage, args.name))
    return 0
