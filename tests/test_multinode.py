"""Sweeps on multi-node Ray clusters: packs sized to fit one node and refused when none can hold them, packs
placed on several nodes, a worker node lost mid-pack, and the one-line errors for a cluster that refuses this
machine's token or is not there.

The cluster is real Ray nodes on this machine (ray.cluster_utils.Cluster), shared by the tests that need one and
kept apart from every other Ray here: its temp folder is its own (RAY_TMPDIR), so the address file a plain
`ray.init()` elsewhere would join (/tmp/ray/ray_current_cluster) is never written, and its nodes are stopped by
their own processes' ids."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from analysis.results import read_results
from sweep.checks import connection_problem, node_shapes, placement_problems
from sweep.cli import main
from sweep.config import Refused
from sweep.packs import pack_resources
from trainables.fused import PEAK_BYTES_PER_PARAMETER

GIB = 2**30


def alive(resources: dict) -> dict:
    """A node as ray.nodes() reports it."""
    return {"Alive": True, "Resources": resources}


# --- what one node can hold (no cluster needed) ---------------------------------------------------------------

def test_a_pack_asks_for_no_more_than_one_node_has(tmp_path):
    # The cluster once warm: a CPU head and g5.xlarge workers (4 vCPUs, 1 GPU), 8+ CPUs in all.
    nodes = [alive({"CPU": 0.0, "memory": 8 * GIB}), *[alive({"CPU": 4.0, "GPU": 1.0, "memory": 12 * GIB})] * 3,
             {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}]  # a dead node holds nothing
    resources = pack_resources(1, 0.25, nodes, bootstrap=str(tmp_path / "none"))
    pack = {"trial": {"pack": [{}] * 8}}
    assert resources(pack).bundles == [{"CPU": 4.0, "GPU": 1.0}]
    assert resources({"trial": {"pack": [{}] * 2}}).bundles == [{"CPU": 2.0, "GPU": 0.5}]
    assert resources({"trial": {}}).bundles == [{"CPU": 1.0, "GPU": 0.25}]
    # On CPUs a pack takes at most the largest node's CPUs, not the cluster's.
    cpus = pack_resources(2, 0, [alive({"CPU": 16.0, "memory": 64 * GIB}), alive({"CPU": 4.0, "memory": 8 * GIB})],
                          bootstrap=str(tmp_path / "none"))
    assert cpus({"trial": {"pack": [{}] * 64}}).bundles == [{"CPU": 16.0}]


def test_a_cold_launched_cluster_sizes_packs_by_the_workers_its_autoscaler_adds(tmp_path):
    import yaml

    bootstrap = tmp_path / "ray_bootstrap_config.yaml"  # what `ray up cluster.yaml` leaves on the head
    bootstrap.write_text(yaml.safe_dump(yaml.safe_load((Path(__file__).parents[1] / "cluster.yaml").read_text())))
    head_only = [alive({"CPU": 0.0, "memory": 10 * GIB})]
    assert node_shapes(head_only, str(bootstrap))[1:] == [{"CPU": 4.0, "GPU": 1.0, "memory": None}]
    resources = pack_resources(1, 0.25, head_only, bootstrap=str(bootstrap))
    assert resources({"trial": {"pack": [{}] * 8}}).bundles == [{"CPU": 4.0, "GPU": 1.0}]


def test_a_trial_no_node_can_hold_is_refused_with_the_numbers(tmp_path):
    nodes = [alive({"CPU": 2.0, "memory": 4 * GIB}), alive({"CPU": 1.0, "GPU": 1.0, "memory": 4 * GIB})]
    shapes = node_shapes(nodes, str(tmp_path / "none"))
    [line] = placement_problems(1000, 0, shapes)
    assert line == ("--cpus-per-trial: 1000 asked, but the largest node of this Ray cluster has 2 CPUs (nodes: "
                    "2 CPU, 0 GPU, 4.0 GiB; 1 CPU, 1 GPU, 4.0 GiB); give at most 2, or add larger nodes")
    [line] = placement_problems(2, 1, shapes)  # 3 CPUs and a GPU in all, but not on one node
    assert line.startswith("--cpus-per-trial: 2 asked, but the largest node with 1 GPUs of this Ray cluster has 1 CPUs")
    [line] = placement_problems(1, 2, shapes)
    assert line.startswith("--gpus-per-trial: 2 asked, but no node of this Ray cluster has more than 1 GPUs")
    [line] = placement_problems(1, 0, shapes, memory_per_trial=6 * GIB)
    assert line.startswith("--model: a trial needs at least 6.0 GiB of memory") and "at most 4.0 GiB" in line
    assert placement_problems(2, 0, shapes, memory_per_trial=3 * GIB) == []
    assert placement_problems(1, 1, shapes) == []
    # Refused where the runner asks for resources, before any trial starts; a GPU trial's weights are on the card.
    with pytest.raises(Refused, match="--cpus-per-trial: 1000 asked"):
        pack_resources(1000, 0, nodes, bootstrap=str(tmp_path / "none"))
    with pytest.raises(Refused, match="--model: a trial needs at least"):
        pack_resources(1, 0, nodes, parameters=GIB // PEAK_BYTES_PER_PARAMETER * 5, bootstrap=str(tmp_path / "none"))
    assert pack_resources(1, 1, nodes, parameters=GIB, bootstrap=str(tmp_path / "none"))


def test_ray_inits_refused_token_is_one_line_naming_the_fix(monkeypatch):
    # What ray.init raises when the cluster refuses the token: the cause survives only as text in the chain.
    cause = RuntimeError("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
                         "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is "
                         "missing or incorrect.")
    try:
        try:
            raise cause
        except RuntimeError as err:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from err
    except ConnectionError as err:
        refused = err
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    line = connection_problem("10.0.0.5:6379", refused)
    assert line == ("--address: the Ray cluster at 10.0.0.5:6379 refused this machine's auth token (RAY_AUTH_MODE "
                    "is unset); copy the cluster's token (`ray get-auth-token` on its head) to ~/.ray/auth_token or "
                    "RAY_AUTH_TOKEN here and export RAY_AUTH_MODE=token")
    line = connection_problem("auto", ConnectionError("Could not find any running Ray instance. Please specify ..."))
    assert line.startswith("--address: no Ray cluster answers on this machine (--address auto) (Could not find any")
    assert "\n" not in line and "ray start --head" in line


# --- a cluster of three nodes on this machine: a CPU-only head, two workers declaring a GPU each ---------------

def test_a_port_where_something_else_answers_is_refused_in_one_line():
    from sweep.checks import address_problems

    with socket.socket() as listener:  # answers TCP, never speaks Ray's protocol (as the dashboard's 8265)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = "127.0.0.1:%d" % listener.getsockname()[1]
        [line] = address_problems(address, gcs_timeout=1.0)
    assert line.startswith(f"--address: something answers at {address}, but no Ray cluster (no reply from a GCS")
    assert "6379 by default" in line


@pytest.fixture(scope="module")
def gpu_cluster():
    """A head without CPUs (it runs no trial, as cluster.yaml's) and two workers with 1 CPU and 1 GPU each. Ray
    schedules on declared resources; the trials train on CPU since torch sees no CUDA here. Token
    authentication is on, as on a launched cluster: this process sends the token, as a local ray.init() would
    have made it do (Ray 2.60)."""
    ray = pytest.importorskip("ray")
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray._raylet import Config
    from ray.cluster_utils import Cluster

    patch = pytest.MonkeyPatch()
    # A short folder of its own (Unix socket paths stay under 108 bytes): the cluster's address file goes here.
    folder = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    patch.setenv("RAY_TMPDIR", folder)
    patch.setenv("RAY_AUTH_MODE", "token")
    Config.initialize("")  # what ray.init does on turning token authentication on
    ensure_token_if_auth_enabled()  # ~/.ray/auth_token, made only where it is missing (as ray.init does)
    node = {"object_store_memory": 200 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **node})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, num_gpus=1, **node)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()  # each process: SIGTERM, 1 s, then SIGKILL
        patch.undo()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_plain_ray_init_elsewhere_would_not_join_this_cluster(gpu_cluster):
    # Another process's ray.init() with no address looks for RAY_ADDRESS, then /tmp/ray/ray_current_cluster
    # (what `ray start` and a default Cluster write); it starts a Ray of its own when neither names a cluster.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    found = subprocess.run([sys.executable, "-c", "from ray._private.services import canonicalize_bootstrap_address; "
                            "print(canonicalize_bootstrap_address(None))"],
                           env=env, capture_output=True, text=True, timeout=120, check=True)
    assert found.stdout.strip() != gpu_cluster.address
    assert (Path(os.environ["RAY_TMPDIR"]) / "ray" / "ray_current_cluster").read_text() == gpu_cluster.address


def test_a_cluster_refusing_this_machines_token_is_named_in_one_line(gpu_cluster, tiny_bert, tmp_path):
    # The common slip: a token in ~/.ray, but RAY_AUTH_MODE unset, so the driver sends none. Refused at the
    # cluster's first answer (ray.init would retry for 20 s, then say only "Failed to connect"), in one line.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    refused = subprocess.run([sys.executable, "-m", "sweep", "incremental", "--model", tiny_bert, "--dry-run",
                              "--storage", str(tmp_path), "--address", gpu_cluster.address],
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr[-2000:]
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("  - ")]
    assert line == (f"  - --address: the Ray cluster at {gpu_cluster.address} refused this machine's auth token "
                    "(RAY_AUTH_MODE is unset); copy the cluster's token (`ray get-auth-token` on its head) to "
                    "~/.ray/auth_token or RAY_AUTH_TOKEN here and export RAY_AUTH_MODE=token")


def test_a_sweep_asking_more_cpus_than_any_node_has_is_refused_not_left_waiting(gpu_cluster, tiny_bert, tmp_path,
                                                                               capsys):
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "48", "--k", "0",
            "--cpus-per-trial", "1000", "--storage", str(tmp_path), "--address", gpu_cluster.address]
    assert main(argv) == 2
    head, line = capsys.readouterr().err.splitlines()[-2:]
    assert head == "cannot start the sweep:" and line.startswith(
        "  - --cpus-per-trial: 1000 asked, but the largest node of this Ray cluster has 1 CPUs (nodes: ")
    assert line.endswith("); give at most 1, or add larger nodes") and line.count("1 CPU, 1 GPU") == 2
    assert not list(tmp_path.glob("*/rows/*.parquet")) and not list(tmp_path.glob("*/tune-*"))


def raylet_pid(node) -> int:
    import ray

    return node.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def node_running(cluster, pid: int):
    """The worker node whose raylet started process `pid` (Ray's workers are its raylet's children)."""
    import psutil

    parents = {p.pid for p in psutil.Process(pid).parents()}
    return next(node for node in cluster.worker_nodes if raylet_pid(node) in parents)


@pytest.fixture(scope="module")
def lost_node_sweep(gpu_cluster, tiny_bert, tmp_path_factory) -> dict:
    """One sweep for the two tests below: four trials fused two a pack, each pack a whole worker (1 CPU, 1 GPU).
    Once both packs have reported their first epoch, the node of one of them is removed (its raylet, object
    store and workers killed, as a reclaimed spot instance loses them)."""
    storage = tmp_path_factory.mktemp("lost")
    sweep = storage / "lost"
    workers = {node.node_id: node for node in gpu_cluster.worker_nodes}
    seen: dict = {}

    def remove_a_node_mid_pack() -> None:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            firsts = {}
            for results in sweep.glob("tune-*/pack-*/result.json"):
                lines = results.read_text().splitlines()
                if lines:
                    firsts[results.parent.name] = json.loads(lines[0])
            if len(firsts) == 2:
                seen["nodes"] = {node_running(gpu_cluster, first["pid"]).node_id for first in firsts.values()}
                pack, first = sorted(firsts.items())[0]
                seen.update(pack=pack, pid=first["pid"], epoch=first["epoch"])
                gpu_cluster.remove_node(node_running(gpu_cluster, first["pid"]), allow_graceful=False)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=remove_a_node_mid_pack, daemon=True)
    killer.start()
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--trials", "2", "--k", "0", "4",
            "--sizes", "160", "--epochs", "6", "--pack", "2", "--cpus-per-trial", "1", "--gpus-per-trial", "0.5",
            "--precision", "fp32", "--checkpoint-every", "0", "--max-failures", "2",
            "--storage", str(storage), "--name", "lost", "--address", gpu_cluster.address]
    assert main(argv) == 0
    killer.join(5)
    assert seen, "both packs should have reported an epoch while running"
    return {**seen, "sweep": sweep, "workers": set(workers), "left": {n.node_id for n in gpu_cluster.worker_nodes}}


def test_packs_run_on_several_nodes_at_once_and_land(lost_node_sweep):
    assert lost_node_sweep["nodes"] == lost_node_sweep["workers"], "one pack on each GPU worker, none on the head"
    table = read_results(lost_node_sweep["sweep"])
    assert len(table) == 4 and table["trial_id"].is_unique and set(table["status"]) == {"ok"}
    assert set(table["pack_size"]) == {2} and table["pack_id"].nunique() == 2


def test_a_worker_node_lost_mid_pack_goes_on_elsewhere_from_its_checkpoint_and_lands_each_member_once(lost_node_sweep):
    sweep, killed = lost_node_sweep["sweep"], lost_node_sweep
    assert killed["epoch"] < 6, "the node should be lost while its pack was still training"
    assert len(killed["left"]) == 1 and killed["left"] < killed["workers"]
    table = read_results(sweep)
    assert len(table) == 4 and table["trial_id"].is_unique and set(table["status"]) == {"ok"}, table
    lost = table[table["pack_id"] == killed["pack"]]
    assert len(lost) == 2 and (lost["epochs_run"] == 6).all()
    # Tune recorded the pack's failure and ran it again, to its end, in another worker process on the node left.
    [state] = sweep.glob("tune-*/experiment_state-*.json")
    failures = {json.loads(trial)["config"]["trial"]["trial_id"]: json.loads(run)["num_failures"]
                for trial, run in json.loads(state.read_text())["trial_data"]}
    assert failures[killed["pack"]] == 1 and sum(failures.values()) == 1
    [results] = sweep.glob(f"tune-*/{killed['pack']}/result.json")
    reports = [json.loads(line) for line in results.read_text().splitlines()]
    assert reports[-1]["pid"] != killed["pid"] and reports[-1]["epoch"] == 6
    # ...from the checkpoint the pack left before its node went (not from its start): no member's epochs lost.
    assert (lost["resumed_from_epoch"] >= 1).all(), lost["resumed_from_epoch"]
    assert (table.loc[table["pack_id"] != killed["pack"], "resumed_from_epoch"].fillna(0) == 0).all()
