"""A finished result is final (issue 24): only a trial's last report carries its row; a landed final row is
never replaced, by a retry, a stale report, a rerun or a second writer; readers keep the first; the store
reads past damaged files; a row that cannot be written is said and counted; a model that learned nothing
is shown as such. Multi-node kills and resumes are in tests/test_final_rows_cluster.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweep.runner import RowWriter
from sweep.store import put_file, write_row
from trainables.rows import ENDED_ROWS, ended_rows, make_row
from trialrows.read import QUARANTINE, read_results
from trialrows.schema import rows_table

ROOT = Path(__file__).resolve().parents[1]


def row(trial_id: str, status: str, dev_metric: float, when: str | None = None) -> dict:
    made = make_row({"trial_id": trial_id, "experiment": "incremental", "task": "synthetic"},
                    {"dev_metric": dev_metric}, status, "boom" if status == "error" else None)
    return {**made, "finished_at": when or made["finished_at"]}


# --- the store and its readers -------------------------------------------------------------------------


def test_a_final_row_is_never_replaced_and_an_error_row_is(tmp_path):
    folder = tmp_path / "rows"
    assert write_row(folder, row("t", "error", float("nan"))) is not None
    assert write_row(folder, row("t", "ok", 0.9)) is not None, "a failed trial's next attempt replaces its error row"
    landed = (folder / "t.parquet").read_bytes()
    for later in (row("t", "ok", 0.5), row("t", "diverged", float("nan")), row("t", "error", float("nan"))):
        assert write_row(folder, later) is None
    assert (folder / "t.parquet").read_bytes() == landed
    assert read_results(folder).loc[0, "dev_metric"] == 0.9
    assert [p.name for p in folder.iterdir()] == ["t.parquet"], "no temporary file is left behind"


def test_readers_keep_the_first_finished_row_of_a_trial_stored_twice(tmp_path):
    # The same trial in two files (a compaction cut short, a folder copied in): the later finished row is a
    # stale copy, never a correction; an error row never hides a finished one.
    put_file(tmp_path / "a", "part-0-x.parquet", rows_table([row("t", "ok", 0.7, "2026-11-24T10:00:00+0000"),
                                                             row("u", "error", float("nan"), "2026-11-24T12:00:00+0000")]))
    put_file(tmp_path / "b", "part-0-y.parquet", rows_table([row("t", "ok", 0.2, "2026-11-24T11:00:00+0000"),
                                                             row("u", "ok", 0.4, "2026-11-24T09:00:00+0000")]))
    table = read_results(tmp_path).set_index("trial_id")
    assert table.loc["t", "dev_metric"] == 0.7 and table.loc["u", "dev_metric"] == 0.4
    assert table.attrs["repeated_rows"] == 2


# --- what the trainables report, and what the writer lands ----------------------------------------------


def trained_reports(tiny_bert, synthetic, pretrained, epochs: int = 3, lr: float = 2e-5) -> tuple[dict, list]:
    """A trial of the sweep as the Tune trainable reports it, run here without Ray."""
    from sweep.experiments import GridSettings
    from trialrows.experiments import incremental
    from trainables.finetune import finetune
    from trainables.tune_trainable import finetune_config, trial_reporter

    settings = GridSettings.of(model=tiny_bert, tasks=("synthetic",), sizes=(24,), trials=((0, 1),), k=(2,),
                            epochs=epochs, lr=lr)
    (spec,) = incremental(settings, 4)
    config = spec.to_config()
    reports = []
    finetune(finetune_config(config, 0.0, 1), synthetic, pretrained, report=trial_reporter(config, epochs, reports.append))
    return config, reports


class Trial:
    """What the row writer reads of a Tune trial."""

    def __init__(self, config: dict, last_result: dict | None = None):
        self.config, self.last_result, self.error_file = {"trial": config}, last_result or {}, None


def test_only_the_last_report_carries_the_row_and_nothing_replaces_it(tiny_bert, synthetic, pretrained, tmp_path):
    config, reports = trained_reports(tiny_bert, synthetic, pretrained)
    assert [bool(ended_rows(r)) for r in reports] == [False, False, True]
    assert not any("status" in r for r in reports), "no per-epoch report says how a trial ended"
    (landed,) = ended_rows(reports[-1])
    assert landed["status"] == "ok" and landed["trial_id"] == config["trial_id"] and landed["epochs_run"] == 3
    assert landed["host"] and landed["node_id"] is None, "where it ran, recorded by the trainable (no Ray here)"

    folder = tmp_path / "rows"
    writer = RowWriter(folder)
    trial = Trial(config)
    for report in reports:
        writer.on_trial_result(0, [], trial, report)
    written = (folder / f"{config['trial_id']}.parquet").read_bytes()
    # What a restored or retried attempt, or a late callback, would hand the writer afterwards: a stale epoch
    # report ending the trial, the same final report again, a second attempt's final row, an error.
    trial.last_result = reports[0]
    writer.on_trial_complete(1, [], trial)
    writer.on_trial_result(2, [], trial, reports[-1])
    again = {**reports[-1], ENDED_ROWS: json.dumps([{**landed, "dev_metric": 0.0}])}
    writer.on_trial_result(3, [], trial, again)
    writer.on_trial_error(4, [], trial)
    assert (folder / f"{config['trial_id']}.parquet").read_bytes() == written
    assert writer.written == [config["trial_id"]] and list(folder.iterdir()) == [folder / f"{config['trial_id']}.parquet"]


def test_a_diverged_trial_ends_with_its_row_at_the_epoch_it_diverged(tiny_bert, synthetic, pretrained):
    _, reports = trained_reports(tiny_bert, synthetic, pretrained, lr=float("inf"))
    assert len(reports) == 1 and ended_rows(reports[0])[0]["status"] == "diverged"


# --- damaged files --------------------------------------------------------------------------------------


def test_damaged_row_and_plan_files_are_set_aside_and_every_good_row_is_read(tmp_path, capsys):
    from sweep.status import status

    rows = tmp_path / "sweep" / "rows"
    for name, metric in (("good", 0.8), ("cut", 0.7), ("noise", 0.6)):
        write_row(rows, row(name, "ok", metric))
    cut = (rows / "cut.parquet").read_bytes()
    (rows / "cut.parquet").write_bytes(cut[: len(cut) // 2])
    (rows / "noise.parquet").write_bytes(np.random.default_rng(0).bytes(3000))
    pq.write_table(pa.table({"trial_id": [1, 2], "score": [0.1, 0.2]}), rows / "foreign.parquet")
    plans = tmp_path / "sweep" / "plans"
    plans.mkdir()
    (plans / "cut.json").write_text('{"command": "python -m sweep incremental", "trials": [{"trial_id": "go')

    report = status(str(tmp_path), "sweep")
    err = capsys.readouterr().err
    assert "1 trials; done 1" in report
    for name in ("cut.parquet", "noise.parquet", "foreign.parquet", "cut.json"):
        assert f"set aside {rows.parent / ('plans' if name.endswith('json') else 'rows') / name}" in err
    assert sorted(p.name for p in (tmp_path / "sweep" / QUARANTINE).iterdir()) == [
        "plans-cut.json", "rows-cut.parquet", "rows-foreign.parquet", "rows-noise.parquet"]
    assert list(read_results(tmp_path)["trial_id"]) == ["good"], "set aside once, read past from then on"
    assert write_row(rows, row("cut", "ok", 0.75)) is not None, "its trial lands anew (a rerun trains it again)"

    summary = subprocess.run([sys.executable, "-m", "analysis", "summary", str(tmp_path / "sweep")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert summary.returncode == 0 and "Traceback" not in summary.stderr


# --- rows that cannot be written ------------------------------------------------------------------------


def test_a_row_that_cannot_be_written_is_named_and_the_trial_stays_unlanded(tmp_path, capsys):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    writer = RowWriter(blocked / "rows")
    config = {"trial_id": "t", "row": {"trial_id": "t"}}
    writer.on_trial_result(0, [], Trial(config), {ENDED_ROWS: json.dumps([row("t", "ok", 0.9)])})
    assert f"cannot write the row of t to {blocked / 'rows'}" in capsys.readouterr().err
    assert writer.unwritten and writer.written == []
    writer.on_trial_error(1, [], Trial(config))  # its error row cannot land either, and is not attempted twice
    assert list(writer.unwritten) == ["t"]


# --- learned nothing ------------------------------------------------------------------------------------


def test_the_score_of_a_constant_prediction_is_known_per_task():
    from trainables.metrics import chance_figures

    labels = np.array([0, 0, 0, 1, 1])
    assert chance_figures("sst2", [1, 1, 1, 1, 1], labels) == {"chance_metric": 0.6, "constant_prediction": 1.0}
    assert chance_figures("sst2", [0, 1, 0, 1, 1], labels)["constant_prediction"] == 0.0
    assert chance_figures("cola", [0, 1, 0, 1, 1], labels)["chance_metric"] == 0.0, "a constant's MCC"
    assert chance_figures("stsb", [0.5, 1.0], np.array([1.0, 4.0]))["chance_metric"] == 0.0


def test_tables_and_figures_show_chance_and_count_the_trials_at_it():
    from analysis import figures
    from analysis.format import readable
    from analysis.tables import paired_differences
    from trialrows.summaries import summarize

    rows = pd.DataFrame({
        "trial_id": [f"t{i}" for i in range(6)], "experiment": "incremental", "task": "sst2", "model": "m",
        "train_size": 200, "k": [0, 0, 0, 4, 4, 4], "trial_index": [0, 1, 2, 0, 1, 2], "subset_seed": [0, 1, 2] * 2,
        "seed": [5, 6, 7] * 2, "reinit_layers": [(1, 2, 3, 4)] * 3 + [()] * 3, "reinit_mode": "intended",
        "status": "ok", "metric_name": "accuracy", "dev_metric": [0.4908, 0.5092, 0.61, 0.80, 0.82, 0.79],
        "dev_chance_metric": 0.5092, "dev_constant_prediction": [1.0, 1.0, 0.0, 0.0, 0.0, 0.0],
    })
    table = summarize(rows, ["task", "k"]).set_index("k")
    assert table.loc[0, "chance"] == 0.5092 and table.loc[0, "at_chance"] == 2 and table.loc[4, "at_chance"] == 0
    (plot,) = figures.incremental_figure(rows)
    labels = [line.get_label() for ax in plot.figure.axes for line in ax.get_lines()]
    assert "majority class (a constant prediction)" in labels

    one_pair = paired_differences(rows[rows["trial_index"] == 0])
    assert one_pair.loc[0, "pairs"] == 1 and np.isnan(one_pair.loc[0, "wilcoxon_p"])
    assert one_pair.loc[0, "note"].startswith("one pair: no test")
    assert readable(one_pair).loc[0, "wilcoxon_p"] == "n/a"
    three = paired_differences(rows)
    assert three.loc[0, "pairs"] == 3 and three.loc[0, "note"] == "3 pairs: no p below 0.25 is possible"


def test_the_sweeps_closing_table_reads_as_the_reports_does(tmp_path, capsys):
    # It printed the raw table: counts as floats ("at_chance 2.0000"), the interval as two columns beside ±2 std's
    # two, and the statuses as a Python dict.
    from sweep.cli import report

    metrics = [0.4908, 0.5092, 0.61, 0.80, 0.82, 0.79]
    for i, metric in enumerate(metrics):
        write_row(tmp_path, make_row({"trial_id": f"t{i}", "experiment": "incremental", "task": "sst2", "model": "m",
                                      "train_size": 200, "k": 4 * (i >= 3), "metric_name": "accuracy"},
                                     {"dev_metric": metric, "dev_chance_metric": 0.5092,
                                      "dev_constant_prediction": float(i < 2)}, "ok"))
    assert report(tmp_path, {f"t{i}" for i in range(6)})[1] == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"results: {tmp_path} (6 of 6 trials; ok 6)"
    header, k0 = out[2].split(), out[3].split()
    assert "ci95_low" not in header and header[-4:] == ["95%", "CI", "chance", "at_chance"]
    assert k0[-1] == "2" and k0[-6] == f"{np.mean(metrics[:3]):.4f}"
