"""A precision-targeted sweep (`--target-ci W`): Stein's two-stage procedure (trialrows.precision), planned by
the driver around the ordinary runner.

Stage 1 runs trial indices 0..n0-1 of every condition (`--pilot-trials n0`) through the experiment's runner, as
any sweep runs its trials. The driver then reads their rows back from the store, computes each condition's N
from its pilot's spread, and runs indices n0..N-1 (at most `--max-trials`) as stage 2; on paired differences the
full model runs as many indices as the largest N of the conditions paired with it. Trial index i is the same
trial in every condition (the same subset and seeds: sweep.experiments.trial_seeds) and in every sweep whatever
its target (the target is in its row, not in its id): a rerun skips every trial that has landed and computes the
same N from the same pilot rows, so no trial runs twice.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from sweep.grid import TrialSpec
from trialrows.precision import MEAN, PAIRED, PILOT, Target, expected_trials, precision_outcomes, precision_table
from trialrows.read import FINISHED

DEFAULT_PILOT, DEFAULT_MAX_TRIALS = 5, 50
# What the end of a precision-targeted sweep prints per condition (beside its condition columns).
SHOWN = ["target_on", "target_ci", "needed", "trials", "values", "mean", "ci95_low", "ci95_high", "half_width",
         "state", "note"]


def target_of(sweep) -> Target | None:
    """The sweep's precision target; None for a sweep of fixed counts."""
    run = sweep.run
    if run.target_ci is None:
        return None
    return Target(float(run.target_ci), run.target_on or MEAN, run.pilot_trials or DEFAULT_PILOT,
                  run.max_trials or DEFAULT_MAX_TRIALS)


def option_problems(sweep, experiment) -> list[str]:
    """What the precision settings refuse together (each one's own range is checked where it is declared)."""
    from sweep.experiments import trial_word

    run = sweep.run
    given = [(flag, value) for flag, value in (("--target-on", run.target_on), ("--pilot-trials", run.pilot_trials),
                                               ("--max-trials", run.max_trials)) if value is not None]
    if run.target_ci is None:
        return [f"{flag}: only means something with --target-ci W (given: {value})" for flag, value in given]
    target, problems = target_of(sweep), []
    if target.pilot > target.max_trials:
        problems.append(f"--pilot-trials: {target.pilot} is more than --max-trials {target.max_trials}; the pilot "
                        "is part of each condition's trials")
    if "trials" in sweep.given:
        problems.append(f"--trials: {' '.join(map(trial_word, sweep.grid.trials))} fixes the count that --target-ci "
                        "sets per condition; give --pilot-trials and --max-trials instead")
    if experiment.plan is not None:
        problems.append(f"--target-ci: {run.target_ci:g} asks for trial counts per condition, but "
                        f"{sweep.experiment}'s units are searches, not repeated trials")
    return problems


def grid_settings(grid, sweep):
    """The grid that holds every trial a target may need: `--max-trials` indices per cell."""
    target = target_of(sweep)
    return grid if target is None else dataclasses.replace(grid, trials=((0, target.max_trials),))


def targeted(specs: list[TrialSpec], target: Target) -> list[TrialSpec]:
    """The specs with the target in their rows (not in their ids)."""
    columns = tuple(target.columns().items())
    return [dataclasses.replace(spec, plan_columns=columns) for spec in specs]


def planned_frame(specs: list[TrialSpec], stored: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per spec, as it will be written, with what the store holds of it (status, dev_metric,
    finished_at; null where it has not landed)."""
    frame = pd.DataFrame([spec.row() for spec in specs])
    results = ["status", "dev_metric", "finished_at"]
    if stored is None or stored.empty or "status" not in stored:
        return frame.assign(**{c: None for c in results})
    held = stored[["trial_id", *[c for c in results if c in stored]]]
    if "settings_id" in stored:
        # A spec without fingerprints (a dry run reads no data or weights) is its settings: the rows that ran
        # them hold its results under their fingerprinted ids, as a dry run counts done trials (estimate.done_ids).
        loose = {s.trial_id for s in specs if s.data_fingerprint is None and s.model_fingerprint is None}
        alias = stored[stored["settings_id"].isin(loose)].assign(trial_id=lambda r: r["settings_id"])
        alias = alias.sort_values("status", key=lambda s: ~s.isin(FINISHED), kind="stable")  # a finished one first
        held = pd.concat([held, alias[held.columns]], ignore_index=True)
    return frame.merge(held.drop_duplicates("trial_id"), on="trial_id", how="left")


def paired_problems(specs: list[TrialSpec], target: Target) -> list[str]:
    """Paired targets need, for every condition, the full model of the same recipe in the grid."""
    from trialrows.pairing import computation_columns, full_model_mask
    from trialrows.summaries import groupable

    if target.on != PAIRED or not specs:
        return []
    frame = groupable(planned_frame([s for s in specs if s.trial_index == 0]))
    full = full_model_mask(frame)
    if not full.any():
        pooler = "reinit_pooler" in frame and frame["reinit_pooler"].eq(True).all()
        how = ("--reinit-pooler resets the pooler in every condition, k = L too: drop it, or give --target-on mean"
               if pooler else "incremental: include k = L in --k")
        return [f"--target-on: paired needs the full model (nothing reset) in the grid, to pair each condition with; "
                f"this {specs[0].experiment} grid has none ({how})"]
    on = [c for c in computation_columns(frame) if frame[c].notna().any()]
    keys = frame.loc[full, on].drop_duplicates()
    alone = frame.loc[~full, on].merge(keys, on=on, how="left", indicator=True)["_merge"].eq("left_only").sum()
    if alone:
        return [f"--target-on: paired: {alone} conditions have no full model of the same recipe in the grid"]
    return []


def stage_two(specs: list[TrialSpec], stored: pd.DataFrame | None, target: Target):
    """(the specs stage 2 runs: indices n0..N-1 of each condition whose pilot is complete, the per-condition
    table): N from the pilot rows the store holds (trialrows.precision)."""
    frame = planned_frame(specs, stored)
    table, line = precision_outcomes(frame)
    needed = line.map(table["needed"].to_dict() if len(table) else {}).to_numpy(dtype=object)
    chosen = [spec for spec, n in zip(specs, needed)
              if n is not None and not pd.isna(n) and target.pilot <= spec.trial_index < int(n)]
    return chosen, table, frame, line


def describe_target(specs: list[TrialSpec], target: Target) -> str:
    conditions = sum(spec.trial_index == 0 for spec in specs)
    on = "mean" if target.on == MEAN else "paired difference against the full model (same trial index)"
    return (f"precision target: a 95% interval of half-width <= {target.half_width:g} on each condition's {on}, by "
            f"Stein's two-stage procedure: a pilot of {target.pilot} trials per condition, then the count its spread "
            f"needs, at most {target.max_trials}; {conditions} conditions")


# --- a dry run's cost: the pilot stage, then the expected total ----------------------------------------------


def expected_counts(table: pd.DataFrame, frame: pd.DataFrame, line: pd.Series, target: Target) -> dict[int, float]:
    """Per line of `table` whose pilot is not in yet, the trials it is expected to need in all: the expectation
    of N (trialrows.precision.expected_trials) from the spread of whatever values of it the store holds (an
    earlier sweep's); conditions without two such values (or on paired differences) are left out."""
    values = pd.to_numeric(frame["dev_metric"], errors="coerce").where(frame["status"] == "ok")
    out = {}
    for position in table.index[table["state"] == PILOT] if len(table) and target.on == MEAN else []:
        mine = values[line == position].dropna()
        if len(mine) >= 2:
            out[position] = expected_trials(float(mine.std(ddof=1)), target)
    return out


def two_stage_seconds(first: list[float], second: list[float], rate) -> float:
    """Wall time of the two stages: the start, the pilot's trials, then stage 2's once every pilot is in."""
    from sweep.estimate import STAGE_SECONDS, sweep_seconds

    if not first and not second:
        return 0.0
    gap = STAGE_SECONDS if first and second else 0.0
    return rate.startup + sweep_seconds(first, rate, started=True) + gap + sweep_seconds(second, rate, started=True)


def cost_text(specs, settings, options, num_layers: int, folder, target: Target, stored, raw=None) -> str:
    """The pilot stage's cost, then stage 2's: at most (every condition to --max-trials) and expected."""
    from sweep import estimate

    pilot = [s for s in specs if s.trial_index < target.pilot]
    flops, rate, note = estimate.dry_run_estimate(specs, settings, options, num_layers, folder, raw, stored)
    by_id = dict(zip((s.trial_id for s in specs), flops))
    done = estimate.done_ids(stored)  # by settings id too: a dry run's specs carry no fingerprints
    first = [by_id[s.trial_id] for s in pilot if s.trial_id not in done]
    rest = [by_id[s.trial_id] for s in specs if s.trial_index >= target.pilot and s.trial_id not in done]
    lines = [estimate.header(rate, note), estimate.cost_table(pilot, [by_id[s.trial_id] for s in pilot], rate),
             estimate.summary_line(f"pilot stage ({len(pilot) - len(first)} of {len(pilot)} done)", first, rate),
             estimate.summary_line("stage 2 at most (every condition to --max-trials)", rest, rate, started=bool(first))]
    second, table, frame, line = stage_two(specs, stored, target)
    planned = [by_id[s.trial_id] for s in second if s.trial_id not in done]  # pilots in: N known
    expected = expected_counts(table, frame, line, target)
    waiting = int((table["state"] == PILOT).sum()) if len(table) else 0
    if waiting > len(expected):
        lines.append(f"stage 2 expected: not known for {waiting - len(expected)} of {len(table)} conditions until "
                     "their pilots are in (no earlier values of them in the store)")
        if not planned and not expected:
            return "\n".join(lines)
    mean_flops = float(np.mean(flops))
    extra = planned + [mean_flops] * int(round(sum(max(0.0, n - target.pilot) for n in expected.values())))
    total = two_stage_seconds(first, extra, rate)
    hours = estimate.device_hours(first + extra, rate)
    sources = [f"{len(planned)} planned from the pilots that are in" if planned else "",
               f"{len(extra) - len(planned)} expected from earlier values of {len(expected)} conditions" if expected else ""]
    lines.append(f"stage 2 expected: {len(extra)} more trials ({'; '.join(filter(None, sources))}); both stages "
                 f"{estimate.hours(total)} wall, {hours:.2f} {'GPU' if rate.gpu else 'core'}-hours")
    return "\n".join(lines)


# --- the run ---------------------------------------------------------------------------------------------------


def stage_two_text(table: pd.DataFrame, second: list, todo: list, target: Target) -> str:
    waiting = int((table["state"] == PILOT).sum()) if len(table) else 0
    text = (f"stage 2: {len(second)} trials beyond the pilots ({len(second) - len(todo)} already done, {len(todo)} "
            f"to run), from each condition's pilot spread")
    if waiting:
        text += (f"; {waiting} conditions wait for pilot trials that failed (run the command again to retry them; "
                 "their stage 2 follows)")
    return text


def end_table(rows: pd.DataFrame, target: Target | None = None) -> pd.DataFrame:
    """What the sweep prints when it ends: per condition, its count, Stein's interval and whether it reached W.
    `target`: the sweep's, for every one of its trials (`rows`); a trial an earlier sweep had already finished
    carries that sweep's target, or none, in its row, yet this sweep planned its conditions with its own."""
    if target is not None and len(rows):
        rows = rows.assign(**target.columns())
    table = precision_table(rows)
    keep = [c for c in table.columns if c not in SHOWN and c not in ("pilot_trials", "max_trials", "pilot_sd",
                                                                     "reached") and table[c].nunique(dropna=False) > 1]
    return table[[*keep, *[c for c in SHOWN if c in table.columns]]]
