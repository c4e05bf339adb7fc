"""Issue 24 on a real multi-node Ray cluster on this machine: a head that runs no trial and a worker node
whose hostname differs (its own UTS namespace), then a second worker. The sweep's driver is killed after
rows have landed while other trials run, resumed, killed and resumed again: every landed row stays byte for
byte as it landed, and rows name the node the trial trained on. A worker node lost mid-trial: Tune retries
the trial on the other node, from its checkpoint, and it lands once. Bounded in time; stops only the nodes
it started."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_then_sigkill
from trialrows.read import read_results
from trainables.tune_trainable import STATE_FILE

ROOT = Path(__file__).resolve().parents[1]
WORKER_HOST = "reinit-worker"
EPOCHS = 4
pytestmark = pytest.mark.slow


def start_worker(address: str, cpus: int, hostname: str | None = None) -> subprocess.Popen:
    """A worker node (`ray start --block`) in a session of its own, so that killing its group stops exactly it;
    with `hostname`, in a UTS namespace of its own under that name."""
    ray = str(Path(sys.executable).with_name("ray"))
    command = f"exec {ray} start --address={address} --num-cpus={cpus} --block"
    if hostname:
        command = f"hostname {hostname} && {command}"
        argv = ["unshare", "--uts", "sh", "-c", command]
    else:
        argv = ["sh", "-c", command]
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for_nodes(address: str, count: int, timeout: float = 120) -> None:
    code = ("import ray, time, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); deadline = time.time() + "
            f"{timeout}\nwhile len([n for n in ray.nodes() if n['Alive']]) < {count} and time.time() < deadline: "
            "time.sleep(0.5)\nprint(len([n for n in ray.nodes() if n['Alive']]))")
    alive = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True, timeout=timeout + 60)
    assert alive.stdout.strip().endswith(str(count)), alive.stderr[-2000:]


def stop(node: subprocess.Popen) -> None:
    """Lose a node as a machine is lost: SIGKILL its process group and every process under it (Ray starts the
    raylet and the trial's worker processes in sessions of their own; a trial actor left alive goes on
    reporting straight to the driver for seconds before the lost raylet is noticed)."""
    import psutil

    if node.poll() is not None:  # stopped already: its pid may be another process's by now
        return
    try:
        under = psutil.Process(node.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        under = []
    try:
        os.killpg(node.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for process in under:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    node.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster():
    """(address, the renamed worker's process): a head without CPUs, so every trial trains on a worker."""
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a UTS namespace here (unshare --uts): no worker with a hostname of its own")
    from ray.cluster_utils import Cluster

    head = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    worker = start_worker(head.address, 2, WORKER_HOST)
    started = [worker]
    try:
        wait_for_nodes(head.address, 2)
        yield head.address, worker, started
    finally:
        for node in started:
            stop(node)
        head.shutdown()


def sweep(tiny_bert: str, storage, address: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sweep", "incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes",
            "160", "--trials", "1", "--k", "0", "1", "2", "3", "4", "--epochs", str(EPOCHS), "--checkpoint-every", "0",
            "--address", address, "--storage", str(storage), "--name", "fleet", *extra]


def well_before_its_end(results: Path, epochs: int) -> bool:
    """Whether the newest report in a trial's result.json (written by the driver, a moment after the
    checkpoint) came from the renamed worker with at least two epochs still to run: the last epoch's report
    carries a checkpoint too, and its row may land between this look and the kill."""
    try:
        last = json.loads(results.read_text().strip().splitlines()[-1])
    except (OSError, IndexError, ValueError):  # not written yet, or caught mid-line
        return False
    return last.get("host") == WORKER_HOST and last.get("epoch", epochs) <= epochs - 2


def landed(rows: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in rows.glob("*.parquet")}


def test_kills_and_resumes_of_the_driver_never_change_a_landed_row(cluster, tiny_bert, tmp_path):
    address, _, _ = cluster
    rows = tmp_path / "fleet" / "rows"
    argv = sweep(tiny_bert, tmp_path, address)

    def rows_landed_and_another_mid_run(at_least: int):
        def ready() -> bool:
            done = {p.stem for p in rows.glob("*.parquet")}
            # A trial with a checkpoint and epochs still to go: one at its last epoch may land its row between
            # this look and the kill, and leave no trial to resume (the assertion below would then fail).
            states = (tmp_path / "fleet").glob(f"tune-*/*/checkpoint_*/{STATE_FILE}")
            running = {state.parents[1].name for state in states
                       if well_before_its_end(state.parents[1] / "result.json", EPOCHS)}
            return len(done) >= at_least and bool(running - done)
        return ready

    kept: dict[str, bytes] = {}
    for round_, extra in enumerate(([], ["--resume"])):
        run_then_sigkill([*argv, *extra], ready=rows_landed_and_another_mid_run(len(kept) + 1), poll=0.05)
        now = landed(rows)
        assert {name: now[name] for name in kept} == kept, f"round {round_}: a landed row changed"
        kept = now
    assert 1 <= len(kept) < 5, "the kills should land mid-sweep"

    done = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # Ray's settings for a Ray of the command's own stay out of a driver that joins a cluster: with
    # RAY_enable_autoscaler_v2 set, the driver parses the cluster's v1 autoscaler lines as v2 events and prints
    # a traceback for each (25 in a 12 s sweep), enough to fill a pipe nobody reads and stall the sweep.
    assert "Failed to parse event" not in done.stdout + done.stderr, done.stderr[-3000:]
    final = landed(rows)
    assert {name: final[name] for name in kept} == kept, "the last resume changed a landed row"
    table = read_results(tmp_path / "fleet")
    assert len(table) == 5 and table["trial_id"].is_unique and set(table["status"]) == {"ok"}
    assert table.attrs["repeated_rows"] == 0
    assert (table["resumed_from_epoch"] >= 1).any(), "a trial cut short went on from its checkpoint"
    assert set(table["host"]) == {WORKER_HOST}, "rows name the node the trial trained on, not the driver's"
    assert table["node_id"].notna().all() and table["node_id"].nunique() == 1


def test_a_trial_whose_worker_node_is_lost_is_retried_elsewhere_and_lands_once(cluster, tiny_bert, tmp_path):
    address, worker, started = cluster
    second = start_worker(address, 1)  # this machine's own hostname
    started.append(second)
    wait_for_nodes(address, 3)
    argv = sweep(tiny_bert, tmp_path, address, "--max-failures", "2")
    driver = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    fleet = tmp_path / "fleet"
    lost = None
    while time.monotonic() < deadline and driver.poll() is None and lost is None:
        done = {p.stem for p in (fleet / "rows").glob("*.parquet")}
        for state in fleet.glob(f"tune-*/*/checkpoint_*/{STATE_FILE}"):
            trial = state.parents[1]
            if trial.name not in done and well_before_its_end(trial / "result.json", EPOCHS):
                lost = trial.name  # mid-run on the renamed worker, with a checkpoint and an epoch still to go
        time.sleep(0.05)
    assert lost is not None, "no trial was caught mid-run on the renamed worker"
    stop(worker)  # the renamed worker node is lost, with the trials it was training
    out, _ = driver.communicate(timeout=900)
    assert driver.returncode == 0, out[-4000:]
    table = read_results(fleet).set_index("trial_id")
    assert len(table) == 5 and set(table["status"]) == {"ok"}, out[-3000:]
    assert table.attrs["repeated_rows"] == 0, "a retried trial lands exactly once"
    assert len(list((fleet / "rows").glob("*.parquet"))) == 5
    assert table.loc[lost, "host"] != WORKER_HOST and table.loc[lost, "resumed_from_epoch"] >= 1, \
        "the lost trial went on elsewhere, from its checkpoint"
