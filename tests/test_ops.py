"""Operations: a killed driver loses no finished trial and a rerun completes the sweep; multi-node runs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from analysis.results import read_results
from sweep.cli import main


def sweep_argv(model: str, storage, name: str, *extra: str) -> list[str]:
    return ["incremental", "--model", model, "--tasks", "synthetic", "--sizes", "48", "--epochs", "2",
            "--storage", str(storage), "--name", name, *extra]


def test_sigkilled_driver_then_rerun_finishes_with_each_trial_once(tiny_bert, tmp_path):
    argv = [sys.executable, "-m", "sweep", *sweep_argv(tiny_bert, tmp_path, "kill", "--trials", "3", "--k", "0", "2", "4")]
    rows = tmp_path / "kill" / "rows"
    # Its own session, so the kill takes the driver's local Ray (GCS, raylet, workers) down with it.
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(rows.glob("*.parquet"))) < 2 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p.name: p.stat().st_mtime_ns for p in rows.glob("*.parquet")}
    assert 2 <= len(before) < 9, f"the kill should land mid-sweep; {len(before)} rows were written"
    # A row killed mid-write stays a hidden .tmp that readers skip; every visible file reads whole.
    assert len(read_results(rows)) == len(before)

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"{len(before)} already done, {9 - len(before)} to run" in rerun.stdout
    table = read_results(tmp_path / "kill")
    assert len(table) == 9 and table["trial_id"].is_unique and set(table["status"]) == {"ok"}
    assert {name: (rows / name).stat().st_mtime_ns for name in before} == before, "finished rows were rewritten"


def test_sweep_on_a_two_node_cluster_gets_every_row(tiny_bert, tmp_path):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    assert len(cluster.list_all_nodes()) == 2
    try:
        # One CPU a node and a trial: two trials at a time means one runs on the worker node.
        assert main(sweep_argv(tiny_bert, tmp_path, "multi", "--trials", "2", "--k", "0", "4",
                               "--address", cluster.address)) == 0
    finally:
        ray.shutdown()
        cluster.shutdown()
    table = read_results(tmp_path / "multi")
    assert len(table) == 4 and table["trial_id"].is_unique and set(table["status"]) == {"ok"}
