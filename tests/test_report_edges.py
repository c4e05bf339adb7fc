"""What a reader meets on stores the report tests' hand-made results do not cover: a path that is not there,
an --out that is a file, two models whose names end alike, rows without an experiment, a finished trial
without a metric in `summary`, SVG figures, a sweep with only its baseline done; and the sweep's progress line
when trials end early, fail before reporting or resume at their last epoch."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.__main__ import main
from analysis.report import build_report
from sweep.progress import ProgressView
from sweep.runner import RowWriter
from tests.test_progress import Clock, FakeTrial, ending
from tests.test_report_data import TASKS, _row, make_records, write_results
from trainables.rows import make_row, with_ended


def incremental(model: str = "bert-base-uncased", k: int = 6, t: int = 0, value: float = 0.8, **changes) -> dict:
    row = _row(np.random.default_rng(t), "incremental", "sst2", 500, t, list(range(k + 1, 13)),
               metric=TASKS["sst2"], value=value, k=k)
    row.update(model=model, trial_id=f"{row['trial_id']}-{model.replace('/', '_')}")
    return {**row, **changes}


# --- the analysis command ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["report", "summary"])
def test_a_results_path_that_does_not_exist_is_named_in_one_line_not_a_traceback(command, tmp_path, capsys):
    missing = tmp_path / "results" / "incremntal"
    argv = [command, str(missing)] + (["--out", str(tmp_path / "out")] if command == "report" else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists(), "nothing is written for rows that are not there"


def test_an_out_that_is_a_file_is_refused_in_one_line(tmp_path, capsys):
    results = write_results(tmp_path / "results", [incremental(t=0), incremental(t=1, value=0.82)])
    taken = tmp_path / "report.html"
    taken.write_text("something else")
    assert main(["report", str(results), "--out", str(taken), "--formats", "png"]) == 1
    err = capsys.readouterr().err
    assert f"--out: {taken} is a file" in err
    assert taken.read_text() == "something else"


def test_summary_counts_a_finished_trial_without_a_metric_as_left_out_as_its_table_does(tmp_path, capsys):
    results = write_results(tmp_path / "results", [incremental(t=0), incremental(t=1, dev_metric=float("nan"))])
    assert main(["summary", str(results)]) == 0
    out = capsys.readouterr().out
    header, row = next((line, out.splitlines()[i + 1]) for i, line in enumerate(out.splitlines())
                       if line.startswith("task "))
    assert row.split()[2:5] == ["1", "0", "1"] and header.split()[2:5] == ["n", "diverged", "failed"], out
    assert "left out of the means: 0 diverged, 1 failed (1 of them finished without a dev metric)" in out


def test_summary_reads_as_the_reports_tables_do(tmp_path, capsys):
    # It printed the raw table: at_chance 2.0000, the interval as two columns, an empty note column.
    results = write_results(tmp_path / "results", [
        incremental(k=k, t=t, value=0.5 + 0.1 * k + 0.01 * t, dev_constant_prediction=float(k == 0),
                    dev_chance_metric=0.5) for k in (0, 6) for t in range(2)])
    assert main(["summary", str(results)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("task "))
    assert lines[header].split() == ["task", "k", "metric_name", "n", "diverged", "failed", "mean", "std", "95%", "CI",
                                     "at_chance"], lines[header]
    assert [lines[header + i].split()[-1] for i in (1, 2)] == ["2", "0"] and "<NA>" not in "\n".join(lines)


def test_rows_that_name_no_experiment_are_printed_and_counted(tmp_path, capsys):
    rows = [incremental(t=t, experiment=None) for t in range(2)]
    (tmp_path / "rows").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows" / "part.parquet")
    assert main(["summary", str(tmp_path / "rows")]) == 0
    out = capsys.readouterr().out
    assert "sst2" in out and "0.8000" in out, out
    made = build_report(tmp_path / "rows", tmp_path / "out", formats=("png",))
    assert "Experiments: (none named) (2)." in made.header, "the header counts what the tables show"


def test_figures_of_two_models_whose_names_end_alike_are_both_kept(tmp_path):
    """`org/bert` from the hub and `/models/bert` on disk: each its own figure file, never one over the other."""
    records = [incremental(model, k, t, value) for model, value in (("org-a/bert", 0.6), ("/models/bert", 0.9))
               for k in (0, 6) for t in range(2)]
    made = build_report(write_results(tmp_path / "results", records), tmp_path / "out", formats=("png",))
    files = [f for item in made.figures for f in item.files]
    assert len(made.figures) >= 2 and len(set(files)) == len(files), files
    assert len({item.name for item in made.items}) == len(made.items)
    assert all((tmp_path / "out" / f).exists() for f in files)
    html = (tmp_path / "out" / "index.html").read_text()
    assert all(html.count(f'id="figure-{item.name}"') == 1 for item in made.figures)


# --- the sweep's progress line -------------------------------------------------------------------------


IDS = ["incremental-sst2-n100-k0-t0-aaaaaaaaaa", "incremental-sst2-n100-k6-t0-bbbbbbbbbb"]


def a_view(tmp_path, epochs: int = 2):
    clock = Clock()
    trials = [FakeTrial(t, epochs) for t in IDS]
    view = ProgressView({t: 100 * epochs for t in IDS}, interval=30, clock=clock)
    return view, trials, clock, RowWriter(tmp_path, progress=view)


def test_a_trial_that_diverged_before_its_last_epoch_leaves_no_work_behind(tmp_path, capsys):
    view, (a, b), clock, writer = a_view(tmp_path)
    a.status, clock.now = "RUNNING", 30
    last = ending(a, "diverged", float("nan"), epoch=1, epochs=2)  # it stopped after its first of two epochs
    for callback in (writer, view):  # in the order run_trials gives them to Tune
        callback.on_trial_result(0, [a, b], a, last)
    # a trained 100 in 30 s and is done; b's 200 are left: 60 s at that pace.
    assert view.eta() == pytest.approx(200 * 30 / 100)
    b.status = "RUNNING"
    clock.now = 90
    last = ending(b, "ok", 0.9, epoch=2, epochs=2)
    for callback in (writer, view):
        callback.on_trial_result(1, [a, b], b, last)
    assert view.eta() == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("[2/2] ok 1 · diverged 1 · failed 0 · running 0 · "
                                                               "pending 0 · elapsed 1.5 min · eta 0.0 min")


def test_a_trial_that_failed_before_reporting_does_not_speed_up_the_eta(tmp_path, capsys):
    view, (a, b), clock, writer = a_view(tmp_path)
    a.status = b.status = "RUNNING"
    clock.now = 1
    writer.on_trial_error(0, [a, b], a)  # it failed loading, before its first epoch
    clock.now = 61
    view.on_trial_result(1, [a, b], b, {"epoch": 1, "epochs": 2})
    # b trained 100 in 61 s; its other 100 are all that is left: 61 s more, whatever a's planned work was.
    assert view.eta() == pytest.approx(100 * 61 / 100)
    assert "[1/2] ok 0 · diverged 0 · failed 1 · running 1 · pending 0" in capsys.readouterr().out


def test_a_pack_member_that_diverged_is_not_counted_again_by_the_packs_later_reports(tmp_path):
    pack = FakeTrial("pack-incremental-sst2-n100-cccccccccc", 3, status="RUNNING")
    pack.config["trial"]["pack"] = [{"trial_id": t, "finetune": {"epochs": 3}, "row": {"trial_id": t}} for t in IDS]
    clock = Clock()
    view = ProgressView({t: 100 * 3 for t in IDS}, interval=30, clock=clock)
    writer = RowWriter(tmp_path, progress=view)
    diverged = make_row(pack.config["trial"]["pack"][1]["row"], {"dev_metric": float("nan")}, "diverged")
    clock.now = 30
    first = {"epoch": 1, "pack_results": {t: {"trial_id": t, "epoch": 1} for t in IDS}}
    for callback in (writer, view):
        callback.on_trial_result(0, [pack], pack, with_ended(first, [diverged]))
    clock.now = 60  # the diverged member's report stays as it was when it stopped (run_pack)
    second = {"epoch": 2, "pack_results": {IDS[0]: {"trial_id": IDS[0], "epoch": 2}, IDS[1]: {"trial_id": IDS[1],
                                                                                               "epoch": 1}}}
    for callback in (writer, view):
        callback.on_trial_result(1, [pack], pack, second)
    # 300 trained in 60 s (200 + 100); only the running member's last 100 are left.
    assert view.eta() == pytest.approx(100 * 60 / 300)
    assert [trial_id for trial_id, _ in view.running()] == [IDS[0]]


def test_a_sweep_whose_trials_all_failed_before_reporting_ends_with_nothing_left(tmp_path, capsys):
    view, (a, b), clock, writer = a_view(tmp_path)
    a.status = b.status = "RUNNING"
    for trial in (a, b):
        writer.on_trial_error(0, [a, b], trial)
    view.on_experiment_end([a, b])
    assert capsys.readouterr().out.splitlines()[-1].endswith("failed 2 · running 0 · pending 0 · elapsed 0.0 min · "
                                                             "eta 0.0 min")


def test_a_report_of_svg_figures_shows_them_and_its_command_makes_them_again(tmp_path, capsys):
    results = write_results(tmp_path / "results", [incremental(k=k, t=t) for k in (0, 6) for t in range(2)])
    assert main(["report", str(results), "--out", str(tmp_path / "out"), "--formats", "svg"]) == 0
    page, markdown = (tmp_path / "out" / "index.html").read_text(), (tmp_path / "out" / "index.md").read_text()
    svgs = sorted(p.name for p in (tmp_path / "out" / "figures").glob("*.svg"))
    assert svgs and all(f'<img src="figures/{name}"' in page and f"(figures/{name})" in markdown for name in svgs)
    assert f"--out {tmp_path / 'out'} --formats svg" in page


def test_a_trial_resumed_at_its_last_epoch_counts_one_epoch_of_pace_not_all(tmp_path):
    view, (a, b), clock, writer = a_view(tmp_path, epochs=4)
    a.status, clock.now = "RUNNING", 60
    last = ending(a, "ok", 0.9, epoch=4, epochs=4, resumed_from_epoch=3)  # its only report in this run
    for callback in (writer, view):
        callback.on_trial_result(0, [a, b], a, last)
    # a trained 100 (its fourth epoch) in 60 s; b's 400 are left.
    assert view.eta() == pytest.approx(400 * 60 / 100)


def test_a_sublayer_sweep_with_only_its_full_model_finished_is_reported(tmp_path):
    """A sweep still running: the full model (sublayer and layer null) is its only row so far."""
    full = next(r for r in make_records() if r["experiment"] == "sublayer" and r.get("sublayer") is None)
    made = build_report(write_results(tmp_path / "results", [full]), tmp_path / "out", formats=("png",))
    assert "sublayer" in {item.name for item in made.tables}
    assert not [item for item in made.figures if item.name.startswith("sublayer")], "a baseline alone draws nothing"
