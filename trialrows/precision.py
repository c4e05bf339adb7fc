"""Precision targets: how many trials a condition needs for a 95% interval of half-width at most W, by
Stein's two-stage procedure (Stein 1945, "A two-sample test for a linear hypothesis whose power is independent
of the variance"); pure functions, no Ray, no files.

Stage 1 runs n0 pilot trials of a condition (trial indices 0..n0-1). Their sample standard deviation s0 sets
the count

    N = max(n0, ceil((t * s0 / W)^2)),   t = the 97.5% quantile of Student's t with n0 - 1 degrees of freedom,

and stage 2 runs indices n0..N-1. The interval is the mean of all N values +- t * s0 / sqrt(N): its half-width
is at most W by construction, and for normally distributed values it covers the true mean with probability
exactly 95% whatever the variance. That holds because N depends on the data only through s0: given s0, the
mean of the N values is normal around the true mean with variance sigma^2 / N (the pilot mean of normal data
is independent of s0), so sqrt(N) (mean - mu) / s0 is Student's t with n0 - 1 degrees of freedom. The naive
t-interval on N - 1 degrees of freedom, or "add trials until the interval is narrow", has no such guarantee:
the stopping rule then depends on the values being averaged.

A cap (`max_trials`) keeps the coverage (N is still a function of s0 alone) but not the width: a condition
stopped there says so. On paired differences (`on="paired"`) the values are each trial index's difference
against the full model of the same index (same subset, same seeds); the full model runs as many indices as
the largest count of the conditions paired with it.

Trials that diverge give no value (they are counted, never averaged): a condition with fewer values than N
has a wider interval than W and says so. A pilot is complete when each of its indices has a finished row
(ok or diverged); a failed trial (error) is rerun by the next sweep, so its condition waits for it. Rows of
sweeps with different `--seed` (other trials at the same indices) in one condition are no single two-stage
sample: such a condition says so (`mixed seeds`) and keeps the ordinary interval.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pandas as pd

from trialrows.pairing import PAIR_COLUMNS, computation_columns, full_model_mask, full_model_rows
from trialrows.read import FINISHED, finished_times

CONFIDENCE = 0.95
MEAN, PAIRED = "mean", "paired"
# The columns a precision-targeted sweep writes into each of its rows (declared in trialrows.schema as how a
# trial was planned, never as settings: the same trial index is the same trial whatever the target).
PLAN_COLUMNS = ("target_ci", "target_on", "pilot_trials", "max_trials")
# States of a targeted condition.
PILOT, STAGE_TWO, REACHED, CAPPED, SHORT, NO_SPREAD, REFERENCE, MIXED = (
    "pilot", "stage 2", "reached", "max-trials", "short", "no spread", "reference", "mixed seeds")


@dataclasses.dataclass(frozen=True)
class Target:
    """A 95% interval of half-width at most `half_width` on a condition's mean or its paired difference."""

    half_width: float
    on: str = MEAN
    pilot: int = 5
    max_trials: int = 50
    confidence: float = CONFIDENCE

    def columns(self) -> dict:
        """The row columns that record it (`PLAN_COLUMNS`)."""
        return {"target_ci": float(self.half_width), "target_on": self.on, "pilot_trials": int(self.pilot),
                "max_trials": int(self.max_trials)}

    @classmethod
    def of_row(cls, row) -> "Target | None":
        """The target a row records; None for a row of a sweep without one."""
        value = row.get("target_ci")
        if value is None or pd.isna(value):
            return None
        return cls(float(value), str(row.get("target_on") or MEAN), int(row.get("pilot_trials")),
                   int(row.get("max_trials")))


@functools.lru_cache(maxsize=None)
def t_quantile(pilot_values: int, confidence: float = CONFIDENCE) -> float:
    """Student's t quantile of a two-sided interval with `pilot_values` - 1 degrees of freedom."""
    from scipy import stats  # here, as every scipy import of trialrows: a second of every command's start

    return float(stats.t.ppf((1 + confidence) / 2, pilot_values - 1))


def needed_trials(s0: float, pilot_values: int, target: Target) -> tuple[int, int]:
    """(N capped at `target.max_trials`, N uncapped) from the pilot's standard deviation `s0` over
    `pilot_values` values (at least 2): N = max(n0, ceil((t_{n-1} s0 / W)^2))."""
    ratio = (t_quantile(pilot_values, target.confidence) * s0 / target.half_width) ** 2
    # Rounded first: (t s0 / W)^2 that is 9 in exact arithmetic must not come out as 9.000000000000002 -> 10.
    uncapped = max(target.pilot, math.ceil(round(ratio, 9)))
    return min(uncapped, max(target.max_trials, target.pilot)), uncapped


def stein_interval(values, s0: float, pilot_values: int, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): the mean of every value +- t_{n0-1} s0 / sqrt(number of values)."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    half = t_quantile(pilot_values, confidence) * s0 / math.sqrt(len(values)) if s0 > 0 else 0.0
    return mean, mean - half, mean + half


@dataclasses.dataclass(frozen=True)
class Outcome:
    state: str  # PILOT, STAGE_TWO, REACHED, CAPPED, SHORT, NO_SPREAD
    trials: int  # finished trials among the indices it needs (the pilot's while the pilot runs)
    needed: int | None = None  # N; None until the pilot is complete
    uncapped: int | None = None  # N without --max-trials
    pilot_sd: float = float("nan")
    values: int = 0  # of those trials, the ones with a value (not diverged)
    mean: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    note: str = ""
    std: float = float("nan")  # of the values (ddof 1): the spread the tables' ±2 std columns show

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def reached(self) -> bool | None:
        """Whether its interval is at most W wide on each side; None while trials are missing."""
        return {REACHED: True, STAGE_TWO: None, PILOT: None}.get(self.state, False)


def outcome(finished: dict[int, float], target: Target) -> Outcome:
    """Where a condition stands: `finished` maps each trial index with a finished row to its value (nan for
    a trial that diverged); an index not in it has not run, or failed and is rerun by the next sweep."""
    pilot = range(target.pilot)
    done = [i for i in pilot if i in finished]
    if len(done) < target.pilot:
        return Outcome(PILOT, len(done), note=f"pilot: {len(done)} of {target.pilot} trials finished")
    pilot_values = np.array([finished[i] for i in pilot], dtype=float)
    pilot_values = pilot_values[np.isfinite(pilot_values)]
    if len(pilot_values) < 2:
        # No interval, but the tables print this mean in place of their own: the one value there is, not nan.
        return Outcome(NO_SPREAD, target.pilot, target.pilot, target.pilot, values=len(pilot_values),
                       mean=float(pilot_values.mean()) if len(pilot_values) else float("nan"),
                       note=f"{len(pilot_values)} of {target.pilot} pilot trials gave a value: no spread to plan from")
    s0 = float(pilot_values.std(ddof=1))
    needed, uncapped = needed_trials(s0, len(pilot_values), target)
    trials = [i for i in range(needed) if i in finished]
    if len(trials) < needed:
        return Outcome(STAGE_TWO, len(trials), needed, uncapped, s0,
                       note=f"{len(trials)} of {needed} trials finished")
    values = np.array([finished[i] for i in range(needed)], dtype=float)
    values = values[np.isfinite(values)]
    mean, low, high = stein_interval(values, s0, len(pilot_values), target.confidence)
    spread = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    result = Outcome(REACHED, needed, needed, uncapped, s0, len(values), mean, low, high,
                     "" if s0 > 0 else "every pilot value is the same: a zero-width interval (the normal model "
                                       "behind it does not hold)", spread)
    if result.half_width <= target.half_width * (1 + 1e-9):
        return result
    if uncapped > needed:
        return dataclasses.replace(result, state=CAPPED, note=f"stopped at --max-trials {needed}: W needs {uncapped}")
    return dataclasses.replace(result, state=SHORT, note=f"{needed - len(values)} of {needed} trials diverged")


def expected_trials(sigma: float, target: Target, points: int = 2000) -> float:
    """The expected N of a condition whose values have standard deviation `sigma` (normal data): N averaged
    over the pilot variance's distribution, s0^2 ~ sigma^2 chi2(n0 - 1) / (n0 - 1), cap included."""
    from scipy import stats

    df = target.pilot - 1
    chi2 = stats.chi2.ppf((np.arange(points) + 0.5) / points, df)
    s0 = sigma * np.sqrt(chi2 / df)
    ratio = (t_quantile(target.pilot, target.confidence) * s0 / target.half_width) ** 2
    return float(np.minimum(np.maximum(target.pilot, np.ceil(np.round(ratio, 9))), target.max_trials).mean())


# --- from rows -----------------------------------------------------------------------------------------

OUTCOME_COLUMNS = ["target_on", "target_ci", "pilot_trials", "max_trials", "pilot_sd", "needed", "trials",
                   "values", "mean", "std", "ci95_low", "ci95_high", "half_width", "reached", "state", "note"]


def targeted(rows: pd.DataFrame) -> bool:
    return "target_ci" in rows.columns and bool(rows["target_ci"].notna().any())


def precision_outcomes(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """(one line per precision-targeted condition, the line each row belongs to: -1 for rows of a condition
    without a target). A condition is targeted when its newest row (by finished_at) carries a target: the
    sweep that last ran it decides. `rows` may hold planned trials without a result (status null: not run)."""
    from trialrows.conditions import condition_columns, groupable

    line = pd.Series(-1, index=rows.index)
    if rows.empty or not targeted(rows):
        return pd.DataFrame(columns=OUTCOME_COLUMNS), line
    rows = groupable(rows)
    by = [c for c in condition_columns(rows) if c in rows.columns]
    finished = rows["status"].isin(FINISHED)
    value = pd.to_numeric(rows["dev_metric"], errors="coerce").where(rows["status"] == "ok")
    order = finished_times(rows)
    records, members, references = [], [], {}
    full = full_model_mask(rows)
    reference = full_model_rows(rows[finished])
    for key, group in rows.groupby(by, dropna=False, sort=False) if by else [((), rows)]:
        newest = group.loc[order.loc[group.index].sort_values(na_position="first").index[-1]]
        target = Target.of_row(newest)
        if target is None:
            continue
        condition = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        if not (target.on == PAIRED and full.loc[group.index].all()) and (series := _series(group)) > 1:
            # Index i of two sweeps with different --seed is two trials: keyed by index, one would silently
            # stand for the other. No single two-stage sample: its rows keep the tables' ordinary interval.
            records.append({**condition, **_line(target, None), **_mixed(series, group, finished, value)})
            members.append(group.index[:0])
            continue
        if target.on == PAIRED and full.loc[group.index].all():
            references[len(records)] = group  # the full model: as many indices as its partners need
            result = None
        elif target.on == PAIRED:
            result = outcome(_differences(reference, group, finished, value), target)
        else:
            result = outcome({int(i): float(v) for i, v, f in zip(group["trial_index"], value.loc[group.index],
                                                                 finished.loc[group.index]) if f}, target)
        records.append({**condition, **_line(target, result)})
        members.append(group.index)
    for position, group in references.items():
        records[position].update(_reference_line(rows, group, records, members, finished))
    for position, index in enumerate(members):
        line.loc[index] = position
    table = pd.DataFrame.from_records(records, columns=[*by, *OUTCOME_COLUMNS]) if records else \
        pd.DataFrame(columns=[*by, *OUTCOME_COLUMNS])
    counts = ["pilot_trials", "max_trials", "needed", "trials", "values"]
    return table.astype({c: "Int64" for c in counts}), line


def precision_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per precision-targeted condition: its target, the pilot's spread, the trials it needs (N) and has,
    Stein's interval once every one of them finished, and whether it reached W (`state`)."""
    return precision_outcomes(rows)[0]


def _line(target: Target, result: Outcome | None) -> dict:
    line = {"target_on": target.on, "target_ci": target.half_width, "pilot_trials": target.pilot,
            "max_trials": target.max_trials}
    if result is None:
        return line
    return {**line, "pilot_sd": result.pilot_sd, "needed": result.needed, "trials": result.trials,
            "values": result.values, "mean": result.mean, "std": result.std, "ci95_low": result.low,
            "ci95_high": result.high, "half_width": result.half_width, "reached": result.reached,
            "state": result.state, "note": result.note}


def _series(group: pd.DataFrame) -> int:
    """How many different trials (seeds) the condition's rows hold at one trial index, at most."""
    seeds = [c for c in ("subset_seed", "seed") if c in group.columns]
    if not seeds:
        return 1
    counts = group[["trial_index", *seeds]].drop_duplicates()["trial_index"].value_counts()
    return int(counts.max()) if len(counts) else 1


def _mixed(series: int, group, finished, value) -> dict:
    return {"trials": int(finished.loc[group.index].sum()), "values": int(value.loc[group.index].notna().sum()),
            "state": MIXED, "note": f"{series} different trials at one trial index (sweeps with different --seed): no "
                                    "single two-stage sample, so no Stein interval (the tables give the t-interval "
                                    "of all its trials)"}


def _differences(reference, group, finished, value) -> dict[int, float]:
    """A condition's trial indices where it and the full model of the same index (`reference`: its finished
    rows) both finished, with their difference (nan where either gave no value)."""
    on = [c for c in [*computation_columns(reference), *PAIR_COLUMNS] if c in group.columns]
    mine = group[finished.loc[group.index]].assign(_value=value.loc[group.index])
    theirs = reference[on].assign(_full=value.loc[reference.index])
    pairs = mine[[*on, "_value"]].merge(theirs, on=on, how="inner")
    return {int(i): float(a - b) for i, a, b in zip(pairs["trial_index"], pairs["_value"], pairs["_full"])}


def _reference_line(rows, group, records, members, finished) -> dict:
    """The full model under paired targets: it needs the largest N of the conditions paired with it (of those
    whose pilot is in: one still waiting may ask for more later)."""
    on = [c for c in computation_columns(rows) if c in group.columns]
    mine = group[on].drop_duplicates()
    partners = [i for i, index in enumerate(members) if records[i].get("state") not in (None, REFERENCE)
                and records[i]["target_on"] == PAIRED and len(rows.loc[index, on].drop_duplicates().merge(mine, on=on))]
    needs = [int(records[i]["needed"]) for i in partners if not pd.isna(records[i]["needed"])]
    needed = max(needs) if needs else None
    indices = set(group.loc[finished.loc[group.index], "trial_index"].astype(int))
    trials = len(indices & set(range(needed))) if needed else len(indices)
    note = (f"the full model: runs as many trial indices as the {len(partners)} conditions paired with it need"
            if partners else "the full model: no condition is paired with it")
    if len(needs) < len(partners):
        note += f" ({len(partners) - len(needs)} of them still in their pilot)"
    return {"needed": needed, "trials": trials, "state": REFERENCE, "note": note}
