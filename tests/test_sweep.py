"""The sweep end to end: grids, dry runs, and a real Ray Tune run writing Parquet rows."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.results import read_results
from sweep.cli import main, parse_trials
from sweep.experiments import GridSettings
from trialrows.experiments import incremental


def test_paper_dry_run_counts_the_papers_grid(capsys):
    assert main(["incremental", "--preset", "paper", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "bert-base-uncased (12 layers)" in out
    assert "500: 1,950" in out  # 3 tasks x 13 k x 50 trials
    assert "5000: 117" in out and "50000: 78" in out  # CoLA has no 50k cell
    assert "total: 2,145 trials" in out


def test_grid_pairs_conditions_by_trial_index():
    settings = GridSettings.of(model="m", tasks=("sst2",), sizes=(500,), trials=((0, 3),), data_dir="/x")
    specs = incremental(settings, num_layers=4)
    assert len(specs) == 3 * 5 and len({s.trial_id for s in specs}) == 15
    for t in range(3):
        same_index = [s for s in specs if s.trial_index == t]
        assert len({s.subset_seed for s in same_index}) == 1 and len({s.seed for s in same_index}) == 1
        assert sorted(s.k for s in same_index) == [0, 1, 2, 3, 4]
    assert {s.data_source for s in specs} == {"local"}
    # Ids come from the identity alone: rebuilding the grid gives the same ids.
    assert [s.trial_id for s in incremental(settings, 4)] == [s.trial_id for s in specs]


def test_trials_option_parses_counts_per_size():
    assert parse_trials(["500=50", "3"]) == ((500, 50), (0, 3))
    with pytest.raises(SystemExit, match="neither a count nor SIZE=COUNT"):
        parse_trials(["lots"])


def test_bad_options_are_refused_before_any_work(tiny_bert, tmp_path, capsys):
    code = main(["incremental", "--model", tiny_bert, "--tasks", "sst3", "--k", "9", "--sizes", "-5",
                 "--storage", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "--tasks: unknown task 'sst3'" in err and "--k: 9 is outside 0..4" in err
    assert "--sizes: -5 is not a positive" in err
    assert not any(tmp_path.iterdir()), "nothing may be written before the request is valid"


def test_real_sweep_writes_rows_skips_done_and_runs_only_new_cells(ray_local, tiny_bert, tmp_path):
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--k", "0", "4",
            "--epochs", "2", "--eval-every", "1", "--storage", str(tmp_path), "--name", "t"]
    assert main([*argv, "--trials", "2"]) == 0
    rows = read_results(tmp_path / "t")
    assert len(rows) == 4 and set(rows["status"]) == {"ok"}
    assert sorted(rows["k"]) == [0, 0, 4, 4]
    assert set(map(tuple, rows["reinit_layers"])) == {(1, 2, 3, 4), ()}
    assert rows["trial_id"].is_unique
    for column in ["experiment", "task", "model", "train_size", "trial_index", "subset_seed", "seed",
                   "reinit_mode", "epochs", "lr", "metric_name", "dev_metric", "dev_metrics_by_epoch",
                   "train_seconds", "mfu", "torch_version", "transformers_version", "ray_version",
                   "max_grad_norm", "clipped_steps", "precision", "recipe_version"]:
        assert column in rows.columns and rows[column].notna().all(), column
    assert all(len(x) == 2 for x in rows["dev_metrics_by_epoch"])
    assert set(rows["pack_size"]) == {1} and (rows["pack_id"] == rows["trial_id"]).all(), \
        "the default on a CPU (--pack auto): each trial a fused pack of its own, named by it"
    assert (rows.groupby("trial_index")["subset_seed"].nunique() == 1).all()
    files = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "t" / "rows").iterdir()}

    # TensorBoard: each trial's per-epoch scalars, in a folder named by its trial_id (k and trial index).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted((tmp_path / "t").glob("tune-*/*/events.out.tfevents*"))
    assert sorted(e.parent.name for e in events) == sorted(rows["trial_id"])
    accumulator = EventAccumulator(str(events[0]))
    accumulator.Reload()
    logged = [e.value for e in accumulator.Scalars("ray/tune/dev_metric")]
    stored = rows.set_index("trial_id").loc[events[0].parent.name, "dev_metrics_by_epoch"]
    assert logged == pytest.approx(list(stored))

    assert main([*argv, "--trials", "2"]) == 0  # finished: runs nothing, rewrites nothing
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "t" / "rows").iterdir()} == files

    assert main([*argv, "--trials", "3"]) == 0  # widened: only trial index 2 runs
    after = read_results(tmp_path / "t")
    assert len(after) == 6 and after["trial_id"].is_unique
    new = after[~after["trial_id"].isin(rows["trial_id"])]
    assert set(new["trial_index"]) == {2}
    old = after[after["trial_id"].isin(rows["trial_id"])].set_index("trial_id").sort_index()
    pd.testing.assert_series_equal(old["dev_metric"], rows.set_index("trial_id").sort_index()["dev_metric"])


def test_sweep_on_real_glue_files(ray_local, tiny_bert, glue_dir, tmp_path):
    argv = ["incremental", "--model", tiny_bert, "--tasks", "sst2", "cola", "--data-dir", str(glue_dir),
            "--sizes", "16", "--trials", "1", "--k", "4", "--epochs", "1", "--storage", str(tmp_path)]
    assert main(argv) == 0
    rows = read_results(tmp_path / "incremental").set_index("task")
    assert rows.loc["sst2", "metric_name"] == "accuracy" and rows.loc["cola", "metric_name"] == "matthews_correlation"
    assert set(rows["data_source"]) == {"local"}
    assert 0 <= rows.loc["sst2", "dev_metric"] <= 1 and -1 <= rows.loc["cola", "dev_metric"] <= 1


def test_missing_split_is_reported_before_ray_starts(tiny_bert, glue_dir, tmp_path, capsys):
    # QNLI's train split is absent from the shared GLUE folder.
    assert main(["incremental", "--model", tiny_bert, "--tasks", "qnli", "--data-dir", str(glue_dir),
                 "--sizes", "16", "--trials", "1", "--k", "4", "--storage", str(tmp_path)]) == 2
    assert f"--data-dir: {glue_dir} has no QNLI/train.tsv for task 'qnli'" in capsys.readouterr().err


def test_same_trial_through_the_sweep_twice_gives_the_same_numbers(ray_local, tiny_bert, tmp_path):
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--k", "2",
            "--epochs", "2", "--trials", "1", "--storage", str(tmp_path)]
    assert main([*argv, "--name", "first"]) == 0 and main([*argv, "--name", "second"]) == 0
    first, second = (read_results(tmp_path / n).set_index("trial_id") for n in ("first", "second"))
    assert list(first.index) == list(second.index)  # same identity, same trial_id
    for column in ["dev_metric", "train_loss"]:
        assert first[column].tolist() == second[column].tolist(), column
    assert first["dev_metrics_by_epoch"].map(list).tolist() == second["dev_metrics_by_epoch"].map(list).tolist()


def test_the_command_exits_with_its_code_after_its_threads_and_exit_handlers_finish(tmp_path):
    """`python -m sweep` leaves without the interpreter's teardown (sweep.cli.exit_now), but never before a
    thread still writing, or an exit handler, is done."""
    import subprocess
    import sys

    script = (f"import atexit, pathlib, threading, time\n"
              f"from sweep.cli import exit_now\n"
              f"folder = pathlib.Path({str(tmp_path)!r})\n"
              f"atexit.register(lambda: (folder / 'handler').write_text('ran'))\n"
              f"threading.Thread(target=lambda: (time.sleep(0.5), (folder / 'thread').write_text('done'))).start()\n"
              f"print('printed', end='')\n"
              f"exit_now(3)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout == "printed", done.stderr
    assert (tmp_path / "thread").read_text() == "done" and (tmp_path / "handler").read_text() == "ran"


def test_a_ray_of_the_commands_own_has_the_v2_monitor_and_no_idle_workers_unless_the_user_says():
    """A local Ray started for the trials runs the autoscaler's v2 monitor (v1's, on SIGTERM, waits on the GCS
    that ray.shutdown has already stopped: a second of every sweep's end) and starts no idle workers ahead of
    tasks (Tune's trial actors, with a runtime_env of their own, never use them), set for Ray's processes alone:
    the command's own environment is left as it was. Settings the user gave stand."""
    import os
    import subprocess
    import sys

    script = ("import os, pathlib, time, ray\n"
              "from ray.autoscaler.v2.utils import is_autoscaler_v2\n"
              "from sweep.cli import start_ray\n"
              "start_ray(None)\n"
              "def children(name, parent):\n"
              "    for stat in pathlib.Path('/proc').glob('[0-9]*/stat'):\n"
              "        try:\n"
              "            fields = stat.read_text().rsplit(')', 1)\n"
              "        except OSError:  # a process that ended meanwhile\n"
              "            continue\n"
              "        if fields[0].endswith('(' + name) and int(fields[1].split()[1]) == parent:\n"
              "            yield stat.parent\n"
              "raylet = next(children('raylet', os.getpid()))\n"
              "environ = dict(v.split('=', 1) for v in (raylet / 'environ').read_text().split('\\0') if '=' in v)\n"
              "deadline = time.time() + 10  # workers Ray starts ahead of tasks are up within a second or two\n"
              "while not (idle := len(list(children('ray::IDLE', int(raylet.name))))) and time.time() < deadline:\n"
              "    time.sleep(0.2)\n"
              "print(environ.get('RAY_enable_autoscaler_v2'), is_autoscaler_v2(fetch_from_server=True),\n"
              "      os.environ.get('RAY_enable_autoscaler_v2'), idle > 0)\n"
              "ray.shutdown()\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_enable_autoscaler_v2", "RAY_prestart_worker_first_driver", "RAY_ADDRESS")}
    # The two Rays run at once: the first waits out its whole deadline for the idle workers it should not have
    theirs = {**env, "RAY_enable_autoscaler_v2": "0", "RAY_prestart_worker_first_driver": "1"}
    ours, users = (subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=settings) for settings in (env, theirs))
    try:
        for done, expected in ((ours, ["1", "True", "None", "False"]), (users, ["0", "False", "0", "True"])):
            out, err = done.communicate(timeout=120)
            assert done.returncode == 0, err
            assert out.splitlines()[-1].split() == expected
    finally:  # as subprocess.run's timeout would
        for process in (ours, users):
            process.kill()
            process.wait()


def test_trials_waiting_for_a_core_of_the_commands_own_ray_are_not_called_infeasible():
    """v2's monitor on a Ray that cannot grow calls every waiting trial infeasible ("No available node types can
    fulfill placement group requests ... Add suitable node types to this cluster"), a line per trial every 5 s:
    not forwarded while the command's own Ray runs, though the monitor has logged it. The same Ray with
    forwarding on shows the next one (so this test can see them), and the setting found before is back once
    that Ray is shut down."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = ("import sys, time, ray\n"
              "from ray._private import ray_constants\n"
              "from ray.util.placement_group import placement_group\n"
              "from sweep.cli import shutdown_ray, start_ray\n"
              "class Shown:  # what the driver printed (Ray forwards the events to stdout), to wait for an event\n"
              "    def __init__(self, stream):\n"
              "        self.stream, self.text = stream, ''\n"
              "    def write(self, text):\n"
              "        self.text += text\n"
              "        return self.stream.write(text)\n"
              "    def __getattr__(self, name):\n"
              "        return getattr(self.stream, name)\n"
              "sys.stdout = Shown(sys.stdout)\n"
              "start_ray(None)\n"
              "log = ray._private.worker._global_node.get_logs_dir_path() + '/events/event_AUTOSCALER.log'\n"
              "def logged():\n"
              "    try:\n"
              "        return open(log).read().count('No available node types')\n"
              "    except OSError:\n"
              "        return 0\n"
              "def one_more(seen):  # the monitor's next such event, then time for the driver to be sent it\n"
              "    deadline = time.time() + 60\n"
              "    while logged() <= seen and time.time() < deadline:\n"
              "        time.sleep(0.2)\n"
              "    time.sleep(3)\n"
              "    return logged()\n"
              "cores = int(ray.cluster_resources()['CPU'])\n"
              "waiting = [placement_group([{'CPU': 1}]) for _ in range(cores + 2)]\n"
              "seen = one_more(0)\n"
              "print('FORWARDING ON', ray_constants.AUTOSCALER_EVENTS, seen > 0, flush=True)\n"
              "shown = len(sys.stdout.text)\n"
              "ray_constants.AUTOSCALER_EVENTS = 1\n"
              # Until the driver has printed one: a fixed 3 s for it to be sent one failed whenever it came later (a
              # loaded machine), filtered out then as forwarding was off again.
              "deadline = time.time() + 60\n"
              "while 'No available node types' not in sys.stdout.text[shown:] and time.time() < deadline:\n"
              "    time.sleep(0.2)\n"
              "ray_constants.AUTOSCALER_EVENTS = 0\n"
              "shutdown_ray()\n"
              "print('AFTER', ray_constants.AUTOSCALER_EVENTS, flush=True)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_SCHEDULER_EVENTS", "RAY_ADDRESS")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    before, marker, after = output.partition("FORWARDING ON 0 True")
    assert marker, output
    assert "No available node types" not in before, before
    assert "No available node types can fulfill placement group requests" in after, after
    assert "AFTER 1" in after


def test_autoscaler_events_are_quieted_only_for_a_ray_started_here_and_only_if_the_user_said_nothing(monkeypatch):
    import ray
    from ray._private import ray_constants

    from sweep.cli import quiet_autoscaler_events, shutdown_ray, started_here

    monkeypatch.setattr(ray_constants, "AUTOSCALER_EVENTS", 1)
    monkeypatch.delenv("RAY_SCHEDULER_EVENTS", raising=False)
    monkeypatch.setattr(ray._private.worker, "_global_node", type("Node", (), {"head": False})())
    assert not started_here()  # a Ray joined (a cluster's head, which can grow): its events stay on
    monkeypatch.setattr(ray._private.worker, "_global_node", type("Node", (), {"head": True})())
    assert started_here()
    monkeypatch.setenv("RAY_SCHEDULER_EVENTS", "1")
    quiet_autoscaler_events()
    assert ray_constants.AUTOSCALER_EVENTS == 1
    monkeypatch.delenv("RAY_SCHEDULER_EVENTS")
    quiet_autoscaler_events()
    assert ray_constants.AUTOSCALER_EVENTS == 0
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # no Ray runs here: only the setting is put back
    shutdown_ray()
    assert ray_constants.AUTOSCALER_EVENTS == 1
