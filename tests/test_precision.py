"""Precision targets (--target-ci): Stein's two-stage counts and interval, the driver's second stage, and a
resumed precision sweep through real Ray Tune."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sweep.config import resolve
from sweep.experiments import EXPERIMENTS, GridSettings
from sweep.precision import option_problems, paired_problems, stage_two, targeted
from trialrows.precision import (CAPPED, NO_SPREAD, PAIRED, PILOT, REACHED, REFERENCE, SHORT, STAGE_TWO, Target,
                                 expected_trials, needed_trials, outcome, precision_table, stein_interval)

# Student's t, 97.5% quantile, from a printed table: 4 and 2 degrees of freedom.
T4, T2 = 2.776445, 4.302653


def test_two_stage_counts_match_a_hand_computation():
    pilot = [0.80, 0.84, 0.78, 0.86, 0.82]  # mean 0.82, squared deviations sum 0.004: s0^2 = 0.001
    s0 = float(np.std(pilot, ddof=1))
    assert s0 == pytest.approx(math.sqrt(0.001))
    # N = max(n0, ceil((t4 s0 / W)^2)): (2.776445^2 * 0.001 / 0.02^2) = 19.27 -> 20
    assert needed_trials(s0, 5, Target(0.02, pilot=5, max_trials=50)) == (20, 20)
    # W = 0.05: 3.08 -> 4, below the pilot: N = n0 = 5
    assert needed_trials(s0, 5, Target(0.05, pilot=5, max_trials=50)) == (5, 5)
    # capped: 12 run, 20 needed
    assert needed_trials(s0, 5, Target(0.02, pilot=5, max_trials=12)) == (12, 20)
    # three usable pilot values (two diverged): t on 2 df; 4.302653^2 * s^2 / W^2
    s3 = float(np.std(pilot[:3], ddof=1))
    assert needed_trials(s3, 3, Target(0.02, pilot=5, max_trials=50))[0] == math.ceil(T2**2 * s3**2 / 0.02**2)
    assert T4**2 * 0.001 / 0.02**2 == pytest.approx(19.27, abs=0.01)


def test_outcome_follows_a_condition_through_both_stages():
    target = Target(0.02, pilot=5, max_trials=50)
    pilot = dict(enumerate([0.80, 0.84, 0.78, 0.86, 0.82]))
    assert outcome({0: 0.8, 1: 0.84}, target).state == PILOT
    waiting = outcome(pilot, target)
    assert (waiting.state, waiting.needed, waiting.trials) == (STAGE_TWO, 20, 5)
    values = [*pilot.values(), *[0.81, 0.83] * 7, 0.82]
    done = outcome(dict(enumerate(values)), target)
    assert (done.state, done.needed, done.values) == (REACHED, 20, 20)
    # Stein's interval: the mean of all 20 +- t4 s0 / sqrt(20), not the t-interval on 19 df of all 20
    assert done.mean == pytest.approx(np.mean(values))
    assert done.half_width == pytest.approx(T4 * math.sqrt(0.001) / math.sqrt(20), rel=1e-5)
    naive = stats.t.ppf(0.975, 19) * np.std(values, ddof=1) / math.sqrt(20)
    assert abs(done.half_width - naive) > 1e-3 and done.reached
    capped = outcome(dict(enumerate(values[:12])), Target(0.02, pilot=5, max_trials=12))
    assert capped.state == CAPPED and capped.needed == 12 and capped.uncapped == 20 and capped.reached is False
    assert "--max-trials 12" in capped.note
    short = outcome({**dict(enumerate(values)), 7: float("nan")}, target)
    assert short.state == SHORT and short.values == 19 and short.half_width > 0.02
    assert outcome({**pilot, 1: np.nan, 2: np.nan, 3: np.nan, 4: np.nan}, target).state == NO_SPREAD


def simulate(rng, mu, sigma, target: Target, reps: int):
    """Stein's procedure on normal data, `reps` times at once: (covered, N) per repetition."""
    pilot = rng.normal(mu, sigma, (reps, target.pilot))
    s0 = pilot.std(axis=1, ddof=1)
    n = np.array([needed_trials(s, target.pilot, target)[0] for s in s0])
    rest = rng.normal(mu, sigma, (reps, target.max_trials - target.pilot))
    covered = np.empty(reps, dtype=bool)
    for i in range(reps):
        values = np.concatenate([pilot[i], rest[i, : n[i] - target.pilot]])
        _, low, high = stein_interval(values, s0[i], target.pilot)
        covered[i] = low <= mu <= high
    return covered, n


def naive_sequential_coverage(rng, mu, sigma, target: Target, reps: int) -> float:
    """What the procedure replaces: add trials one at a time until the t-interval on n-1 df is W wide."""
    values = rng.normal(mu, sigma, (reps, target.max_trials))
    n = np.arange(1, target.max_trials + 1)
    means = values.cumsum(axis=1) / n
    sds = np.sqrt(np.maximum((np.square(values).cumsum(axis=1) - n * means**2) / np.maximum(n - 1, 1), 0))
    halves = stats.t.ppf(0.975, np.maximum(n - 1, 1)) * sds / np.sqrt(n)
    narrow = (halves <= target.half_width) & (n >= target.pilot)
    narrow[:, -1] = True  # or the cap
    stop = narrow.argmax(axis=1)
    rows = np.arange(reps)
    return float((np.abs(means[rows, stop] - mu) <= halves[rows, stop]).mean())


def test_stein_interval_covers_the_true_mean_at_least_95_percent_of_the_time():
    rng = np.random.default_rng(20261124)
    reps, target = 4000, Target(0.5, pilot=5, max_trials=60)
    covered, counts = [], []
    for mu, sigma in [(0.8, 0.4), (-2.0, 1.0), (10.0, 2.5)]:  # N around 5, 20 and 60 (the cap bites)
        hits, n = simulate(rng, mu, sigma, target, reps)
        covered.append(hits)
        counts.append(n)
    covered = np.concatenate(covered)
    share = covered.mean()
    # Exactly 95% in theory, for any variance and with the cap: the data must not say it is lower.
    assert stats.binomtest(int(covered.sum()), len(covered), 0.95, alternative="less").pvalue > 0.01, share
    assert share >= 0.94
    assert counts[2].max() == 60 and (counts[2] == 60).mean() > 0.3  # the cap was hit, and coverage held
    # The rule it replaces covers less: stopping when the interval looks narrow favours narrow-looking samples.
    naive = naive_sequential_coverage(np.random.default_rng(1), 0.0, 1.0, Target(0.5, pilot=5, max_trials=60), 2000)
    assert naive < 0.93, naive


def test_expected_count_is_the_mean_of_n_over_the_pilot_spread():
    rng = np.random.default_rng(3)
    target = Target(0.5, pilot=5, max_trials=60)
    _, n = simulate(rng, 0.0, 1.0, target, 3000)
    assert expected_trials(1.0, target) == pytest.approx(n.mean(), rel=0.05)
    assert expected_trials(0.0, target) == 5


# --- the driver's second stage ---------------------------------------------------------------------------------


def grid(k=(0, 2, 4), max_trials=8, target=None, **options):
    settings = GridSettings.of(model="m", tasks=("sst2",), sizes=(500,), trials=((0, max_trials),), data_dir="/x", k=k,
                               **options)
    specs = EXPERIMENTS["incremental"].build(settings, 4, 4)
    return targeted(specs, target) if target else specs


def stored(specs, values: dict) -> pd.DataFrame:
    """Rows as the store holds them: `values[(k, trial_index)]` for the trials that ran."""
    rows = []
    for spec in specs:
        if (spec.k, spec.trial_index) in values:
            value = values[(spec.k, spec.trial_index)]
            rows.append({**spec.row(), "status": "ok" if value == value else "diverged",
                         "dev_metric": value, "finished_at": "2026-11-24T01:00:00+0000"})
    return pd.DataFrame(rows)


def test_target_changes_no_trial_id_and_is_carried_in_rows():
    plain, target = grid(), Target(0.02, pilot=3, max_trials=8)
    marked = targeted(plain, target)
    assert [s.trial_id for s in marked] == [s.trial_id for s in plain]
    assert marked[0].row()["target_ci"] == 0.02 and marked[0].row()["pilot_trials"] == 3
    assert "target_ci" not in plain[0].row()


def test_stage_two_runs_each_condition_to_its_own_count_on_paired_indices():
    target = Target(0.02, pilot=3, max_trials=8)
    specs = grid(target=target)
    pilot = {(0, i): v for i, v in enumerate([0.50, 0.56, 0.53])}  # s0 0.03: (4.3027 * 0.03 / 0.02)^2 = 41.7: capped
    pilot |= {(2, i): v for i, v in enumerate([0.70, 0.71, 0.72])}  # s0 0.01: 4.63 -> 5
    pilot |= {(4, i): v for i, v in enumerate([0.80, 0.80, 0.80])}  # s0 0: the pilot alone
    second, table, _, _ = stage_two(specs, stored(specs, pilot), target)
    by_k = {k: sorted(s.trial_index for s in second if s.k == k) for k in (0, 2, 4)}
    assert by_k == {0: [3, 4, 5, 6, 7], 2: [3, 4], 4: []}
    assert dict(zip(table["k"], table["needed"])) == {0: 8, 2: 5, 4: 3}
    # Pairing: index i of every condition trains on the same subset with the same seeds.
    for i in (3, 4):
        same = [s for s in second if s.trial_index == i]
        assert len({(s.subset_seed, s.seed) for s in same}) == 1 and len(same) == 2
    # A failed pilot trial holds its condition back (a rerun retries it); the others go on.
    held = {**pilot}
    del held[(2, 1)]
    second, table, _, _ = stage_two(specs, stored(specs, held), target)
    assert {s.k for s in second} == {0} and table.set_index("k").loc[2, "state"] == PILOT


def test_paired_target_runs_the_full_model_as_far_as_its_conditions_need():
    target = Target(0.02, on=PAIRED, pilot=3, max_trials=8)
    specs = grid(target=target)
    full = [0.80, 0.83, 0.78]
    pilot = {(4, i): v for i, v in enumerate(full)}
    pilot |= {(0, i): v - 0.3 + d for i, (v, d) in enumerate(zip(full, [0.0, 0.005, -0.005]))}  # sd of diff 0.005
    pilot |= {(2, i): v - 0.1 + d for i, (v, d) in enumerate(zip(full, [0.0, 0.012, -0.012]))}  # sd 0.012
    second, table, _, _ = stage_two(specs, stored(specs, pilot), target)
    table = table.set_index("k")
    assert table.loc[0, "needed"] == 3  # (4.3027 * 0.005 / 0.02)^2 = 1.2: the pilot
    assert table.loc[2, "needed"] == math.ceil(T2**2 * 0.012**2 / 0.02**2)  # 6.7 -> 7
    assert table.loc[4, "state"] == REFERENCE and table.loc[4, "needed"] == 7
    assert sorted(s.trial_index for s in second if s.k == 4) == [3, 4, 5, 6]
    assert sorted(s.trial_index for s in second if s.k == 0) == []
    # k = 2's pilot waits for a failed trial: the full model goes as far as the others need, no further yet.
    del pilot[(2, 1)]
    second, table, _, _ = stage_two(specs, stored(specs, pilot), target)
    assert second == [] and table.set_index("k").loc[4, "needed"] == 3
    assert "1 of them still in their pilot" in table.set_index("k").loc[4, "note"]


def test_paired_target_needs_the_full_model_and_options_go_together():
    target = Target(0.02, on=PAIRED, pilot=3, max_trials=8)
    assert paired_problems(grid(k=(0, 2), target=target), target)[0].startswith("--target-on: paired needs the full")
    assert paired_problems(grid(target=target), target) == []

    def options(**given):
        return resolve("incremental", given)

    plain, search = EXPERIMENTS["incremental"], EXPERIMENTS["lr-multipliers"]
    assert option_problems(options(pilot_trials=3), plain) == [
        "--pilot-trials: only means something with --target-ci W (given: 3)"]
    found = option_problems(options(target_ci=0.02, pilot_trials=9, max_trials=6, trials=["5"]), plain)
    assert any(p.startswith("--pilot-trials: 9 is more than --max-trials 6") for p in found)
    assert any(p.startswith("--trials: 5 fixes the count") for p in found)
    assert not any(p.startswith("--trials") for p in option_problems(options(target_ci=0.02), plain)), \
        "the demo preset's --trials is not the user's"
    assert option_problems(options(target_ci=0.02), search)


def test_rows_of_a_finished_precision_sweep_give_steins_interval_in_every_table(tmp_path, capsys):
    from analysis.__main__ import main
    from analysis.results import prepare
    from analysis.stats import condition_table

    target = Target(0.02, pilot=3, max_trials=8)
    specs = grid(target=target)
    values = {(2, i): v for i, v in enumerate([0.70, 0.71, 0.72, 0.70, 0.715])}  # N = 5
    values |= {(0, i): v for i, v in enumerate([0.5, 0.5, 0.5])}
    values |= {(4, i): v for i, v in enumerate([0.8, 0.8])}  # pilot still running
    rows = prepare(stored(specs, values))
    table = precision_table(rows).set_index("k")
    assert table.loc[2, "state"] == REACHED and table.loc[2, "trials"] == 5
    assert table.loc[4, "state"] == PILOT
    summary = condition_table(rows).set_index("k")
    half = (summary.loc[2, "ci95_high"] - summary.loc[2, "ci95_low"]) / 2
    assert half == pytest.approx(T2 * 0.01 / math.sqrt(5), rel=1e-5)
    assert summary.loc[2, "note"].startswith("Stein two-stage interval (n0 3, W 0.02): reached")
    assert summary.loc[4, "note"] == ""  # still running: the ordinary interval, no claim
    # `analysis summary` prints it as the report does: a pilot still running made the counts float (5.0000)
    (tmp_path / "rows").mkdir()
    stored(specs, values).to_parquet(tmp_path / "rows" / "part.parquet")
    assert main(["summary", str(tmp_path / "rows")]) == 0
    printed = capsys.readouterr().out.split("precision targets")[1]
    assert "5.0000" not in printed and "95% CI" in printed, printed
    # A later fixed-count sweep over the same trials (rows without a target) makes it an ordinary condition.
    later = stored(specs, {(2, i): 0.7 for i in range(5, 8)}).drop(columns=["target_ci", "target_on",
                                                                          "pilot_trials", "max_trials"])
    later["finished_at"] = "2026-11-24T02:00:00+0000"
    mixed = prepare(pd.concat([stored(specs, values), later], ignore_index=True))
    assert 2 not in set(precision_table(mixed)["k"])
    assert condition_table(mixed).set_index("k").loc[2, "n"] == 8


# --- through real Ray Tune ---------------------------------------------------------------------------------------


def test_a_resumed_precision_sweep_runs_no_trial_twice(ray_local, tiny_bert, glue_dir, tmp_path):
    from analysis.results import read_results
    from sweep.cli import main
    from sweep.status import status

    argv = ["incremental", "--model", tiny_bert, "--tasks", "sst2", "--data-dir", str(glue_dir), "--sizes", "16",
            "--k", "4", "--epochs", "1", "--target-ci", "0.001", "--pilot-trials", "2", "--storage", str(tmp_path),
            "--name", "p"]
    rows_dir = tmp_path / "p" / "rows"

    def runs() -> dict[str, int]:
        """How many times Tune ran each trial, over every Tune experiment of the sweep (a folder each)."""
        found = [d.name for d in (tmp_path / "p").glob("tune-*/*") if d.is_dir()]
        return {trial: found.count(trial) for trial in set(found)}

    def files() -> dict[str, int]:
        return {p.stem: p.stat().st_mtime_ns for p in rows_dir.glob("*.parquet")}

    assert main([*argv, "--max-trials", "3"]) == 0
    rows = read_results(rows_dir).sort_values("trial_index")
    assert list(rows["trial_index"]) == [0, 1, 2]  # the pilot's spread asks for far more: capped at 3
    assert set(rows["target_ci"]) == {0.001} and set(rows["max_trials"]) == {3} and set(rows["pilot_trials"]) == {2}
    assert set(runs().values()) == {1}
    before = files()

    # Stage 2 interrupted (its row never landed), then the command again with a larger cap: the same N from the
    # same pilot rows, so the lost index 2 and the new index 3 run, and nothing else.
    lost = rows.loc[rows["trial_index"] == 2, "trial_id"].item()
    (rows_dir / f"{lost}.parquet").unlink()
    assert main([*argv, "--max-trials", "4"]) == 0
    after = files()
    assert {t: after[t] for t in before if t != lost} == {t: before[t] for t in before if t != lost}
    rows = read_results(rows_dir)
    assert sorted(rows["trial_index"]) == [0, 1, 2, 3]
    assert {t: n for t, n in runs().items() if n > 1} == {lost: 2} and sum(runs().values()) == 3 + 2

    assert main([*argv, "--max-trials", "4"]) == 0  # all done: runs nothing, rewrites nothing
    assert files() == after
    text = status(str(tmp_path), "p")
    assert "precision targets" in text and "max-trials" in text and "stopped at --max-trials 4" in text
    assert "remaining: nothing planned is left to run" in text


def test_two_seeds_in_one_store_are_not_one_stein_sample():
    from analysis.stats import condition_table

    target = Target(0.02, pilot=3, max_trials=8)
    first = stored(grid(k=(4,), target=target), {(4, i): v for i, v in enumerate([0.70, 0.71, 0.72, 0.70, 0.715])})
    other = stored(grid(k=(4,), target=target, seed=1), {(4, i): v for i, v in enumerate([0.60, 0.61, 0.62])})
    rows = pd.concat([first, other.assign(finished_at="2026-11-24T02:00:00+0000")], ignore_index=True)
    # Keyed by index, the second sweep's three trials had stood for the first's indices 0..2: all eight count.
    summary = condition_table(rows).iloc[0]
    assert summary["n"] == 8 and summary["mean"] == pytest.approx(rows["dev_metric"].mean())
    assert summary["ci95_high"] - summary["mean"] == pytest.approx(
        stats.t.ppf(0.975, 7) * rows["dev_metric"].std(ddof=1) / math.sqrt(8))
    line = precision_table(rows).iloc[0]
    assert line["state"] == "mixed seeds" and line["trials"] == 8 and "--seed" in line["note"]


def test_a_dry_run_plans_stage_two_from_pilots_that_ran_with_fingerprints():
    import dataclasses

    target = Target(0.02, pilot=3, max_trials=8)
    specs = grid(k=(0, 4), target=target)  # a dry run's: it reads no data or weights, so no fingerprints
    ran = [dataclasses.replace(s, data_fingerprint="d" * 16, model_fingerprint="m" * 16) for s in specs]
    values = {(0, i): v for i, v in enumerate([0.50, 0.56, 0.53])} | {(4, i): 0.8 for i in range(3)}
    second, table, _, _ = stage_two(specs, stored(ran, values), target)
    assert list(table["state"]) == [STAGE_TWO, REACHED]
    assert sorted((s.k, s.trial_index) for s in second) == [(0, i) for i in range(3, 8)]
    # A real run's specs carry their fingerprints: rows of other data or weights are other trials.
    mine = [dataclasses.replace(s, data_fingerprint="e" * 16, model_fingerprint="m" * 16) for s in specs]
    assert set(stage_two(mine, stored(ran, values), target)[1]["state"]) == {PILOT}


def test_the_end_table_plans_with_the_sweeps_target_over_rows_an_earlier_sweep_finished():
    from sweep.precision import end_table

    target = Target(0.02, pilot=3, max_trials=8)
    values = {(k, i): v for k in (0, 4) for i, v in enumerate([0.70, 0.71, 0.72, 0.70, 0.715])}
    rows = stored(grid(k=(0, 4)), values)  # a fixed-count sweep's rows: no target in them
    second, _, _, _ = stage_two(grid(k=(0, 4), target=target), rows, target)
    assert len(second) == 4  # indices 3 and 4 of both: done already, so the precision sweep ran nothing
    table = end_table(rows, target)
    assert list(table["state"]) == [REACHED, REACHED] and list(table["needed"]) == [5, 5]


def test_a_paired_target_with_the_pooler_reset_says_why_no_condition_is_the_full_model():
    target = Target(0.02, on=PAIRED, pilot=3, max_trials=8)
    problems = paired_problems(grid(target=target, reinit_pooler=True), target)
    assert len(problems) == 1 and "--reinit-pooler resets the pooler in every condition" in problems[0]
    assert "include k = L" in paired_problems(grid(k=(0, 2), target=target), target)[0]


def test_a_stein_conditions_spread_columns_are_of_its_n_values_not_of_rows_past_them():
    # Rows past N (an earlier plan of a wider --max-trials, say) are not in Stein's sample: the summary's n, mean
    # and interval left them out, while its std and ±2 std columns still spread over them around the N's mean
    from analysis.results import prepare
    from analysis.stats import condition_table

    specs = grid(target=Target(0.02, pilot=3, max_trials=8))
    first = [0.70, 0.71, 0.72, 0.70, 0.715]  # s0 0.01: N = 5
    rows = prepare(stored(specs, {(2, i): v for i, v in enumerate([*first, 0.95, 0.96, 0.97])}))
    (summary,) = [r for _, r in condition_table(rows).iterrows()]
    assert summary["n"] == 5 and summary["mean"] == pytest.approx(np.mean(first))
    assert summary["std"] == pytest.approx(np.std(first, ddof=1))
    assert summary["mean_plus_2std"] == pytest.approx(np.mean(first) + 2 * np.std(first, ddof=1))


def test_status_during_the_pilot_counts_the_stage_two_trials_a_finished_pilot_asks_for(tmp_path):
    # While the pilot runs (or after it was cut short), the recorded grid holds the pilot alone: a condition whose
    # pilot is in needs N - n0 more trials that no grid lists yet, and status must not say nothing is left.
    from sweep.status import record_plan, status
    from sweep.store import rows_dir, sweep_dir, write_row
    from trialrows.read import FINISHED

    target = Target(0.02, pilot=3, max_trials=8)
    specs = grid(k=(0, 4), target=target)
    record_plan(sweep_dir(str(tmp_path), "p"), ["incremental"], "incremental",
                [s.row() for s in specs if s.trial_index < 3], FINISHED)
    pilot = [0.70, 0.71, 0.72]
    needed = max(3, math.ceil((stats.t.ppf(0.975, 2) * np.std(pilot, ddof=1) / 0.02) ** 2))  # 5
    for row in stored(specs, {(0, i): v for i, v in enumerate(pilot)} | {(4, 0): 0.8}).to_dict("records"):
        write_row(rows_dir(str(tmp_path), "p"), row)
    text = status(str(tmp_path), "p")
    assert f"{needed - 3} more trials" in text and "not yet in a recorded grid" in text
    assert "remaining: nothing planned is left to run" not in text
