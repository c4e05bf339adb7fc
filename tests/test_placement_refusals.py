"""Placement on a cluster: runners whose trials no node can hold are refused rather than left
pending, and a local --storage that other nodes cannot see is refused before trials write checkpoints there.

The cluster is real Ray nodes on this machine (ray.cluster_utils.Cluster: a head without CPUs, as cluster.yaml's,
and one worker declaring 1 CPU, 1 GPU and 100 MiB; no real GPU is needed to place trials), kept apart from any other Ray
here by a temp folder of its own (RAY_TMPDIR)."""
from __future__ import annotations

import shutil
import tempfile

import pytest

from sweep.config import Refused


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    patch = pytest.MonkeyPatch()
    folder = tempfile.mkdtemp(prefix="rp-", dir="/tmp")  # short: Unix socket paths stay under 108 bytes
    patch.setenv("RAY_TMPDIR", folder)
    node = {"object_store_memory": 200 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **node})
    try:
        # 100 MiB for tasks: a tiny BERT trial (2.1M parameters, 40 MiB to train) fits twice, not three times.
        cluster.add_node(num_cpus=1, num_gpus=1, memory=100 * 2**20, **node)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        patch.undo()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def connected(cluster):
    import ray

    if not ray.is_initialized():
        ray.init(address=cluster.address, include_dashboard=False, configure_logging=False)
    return cluster


def _train(config):
    return None


def test_a_runner_with_fixed_resources_no_node_holds_is_refused_not_left_pending(connected, tmp_path):
    # Probing and the lr-multipliers search give Tune fixed resources (not pack_resources'): Tune only warns,
    # forever, about a trial no node can hold.
    from ray import tune

    from sweep.runner import refuse_unplaceable

    def tuner(resources):  # what probing's runner and the search check once, before their Tuners
        refuse_unplaceable(tune.with_resources(_train, resources))
        return resources

    with pytest.raises(Refused, match=r"--cpus-per-trial: 4 asked, but the largest node .* has 1 CPUs"):
        tuner({"cpu": 4})
    with pytest.raises(Refused, match=r"--gpus-per-trial: 2 asked, but no node of this Ray cluster has more than 1"):
        tuner({"cpu": 1, "gpu": 2})
    assert tuner({"cpu": 1, "gpu": 1}) is not None
    # A search refuses before it records any cell's budget: a refused command leaves no study behind.
    from sweep.experiments import EXPERIMENTS, GridSettings
    from sweep.search import run_searches

    settings = GridSettings.of(model="m", tasks=("synthetic",), sizes=(16,), trials=((0, 1),), k=(0,))
    specs = EXPERIMENTS["lr-multipliers"].build(settings, 4)
    with pytest.raises(Refused, match="--cpus-per-trial: 4 asked"):
        run_searches(specs, data={}, pretrained={}, folder=tmp_path / "rows", tune_dir=tmp_path / "tune",
                     cpus_per_trial=4, gpus_per_trial=0)
    assert not list(tmp_path.rglob("search.json"))


def test_a_local_storage_every_node_sees_passes_and_leaves_nothing(connected, tmp_path):
    import sweep.checks as checks

    asked = []
    seeing = checks.nodes_seeing

    def recorded(path, nodes, timeout=60.0):
        answers = seeing(path, nodes, timeout)
        asked.append(answers)
        return answers

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checks, "nodes_seeing", recorded)
        assert checks.unshared_storage_problems(tmp_path) == []  # these nodes share this machine's disk
    [answers] = asked
    assert list(answers.values()) == [True], "the one worker was asked (not the driver's own head)"
    assert list(tmp_path.iterdir()) == []
    assert checks.unshared_storage_problems("s3://bucket/prefix") == []


def test_a_local_storage_other_nodes_do_not_see_is_refused_before_any_trial(connected, tiny_bert, tmp_path,
                                                                            monkeypatch, capsys):
    # On a real cluster each node has its own disk: a worker looking for the folder finds nothing there, and Ray
    # fails each of its trials at its first checkpoint (the row of a trial whose last epoch checkpointed is lost).
    import sweep.checks as checks
    from sweep.cli import main

    monkeypatch.setattr(checks, "nodes_seeing", lambda path, nodes, timeout=60.0: {n: False for n in nodes})
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "48", "--k", "0",
            "--storage", str(tmp_path), "--address", connected.address]
    assert main(argv) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(f"  - --storage: {tmp_path / 'incremental'} is a folder of this machine that 1 of the Ray "
                           "cluster's other nodes (")
    assert line.endswith("give a bucket (s3://bucket/prefix, gs://bucket/prefix) or a folder every node mounts at "
                         "the same path (NFS)")
    assert not list(tmp_path.glob("*/rows/*.parquet")) and not list(tmp_path.glob("*/tune-*"))


def test_a_cpu_pack_larger_than_any_nodes_memory_is_refused_naming_the_pack_that_fits(connected, tiny_bert, tmp_path,
                                                                                      capsys):
    # On CPUs a fused pack trains all its members at once on one node: three tiny trials need 120 MiB where the
    # only node with a CPU gives 100. Unrefused, Ray's memory monitor kills the pack on every retry.
    from sweep.cli import main

    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "48", "--trials", "1",
            "--k", "0", "2", "4", "--pack", "3", "--storage", str(tmp_path), "--address", connected.address]
    assert main(argv) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("  - --pack: 3 trials a pack on CPUs need 0.1 GiB of memory on one node (0.04 GiB each")
    assert "that holds its 1 CPUs gives tasks at most 0.1 GiB (nodes: " in line and "1 CPU, 1 GPU, 0.1 GiB" in line
    assert line.endswith("give --pack 2 or less, or nodes with more memory")
    assert not list(tmp_path.glob("*/rows/*.parquet")) and not list(tmp_path.glob("*/tune-*"))


def test_a_cpu_packs_memory_is_checked_on_the_nodes_its_bundle_fits(tmp_path):
    # A pack of 8 one-CPU trials asks for 8 CPUs: only the 16-CPU node takes it, whatever the 4-CPU node's memory.
    from sweep.packs import pack_memory_problems
    from trainables.fused import PEAK_BYTES_PER_PARAMETER

    gib = 2**30
    nodes = [{"Alive": True, "Resources": {"CPU": 16.0, "memory": 8.0 * gib}},
             {"Alive": True, "Resources": {"CPU": 4.0, "memory": 64.0 * gib}}]
    parameters = 2 * gib // PEAK_BYTES_PER_PARAMETER  # 2 GiB a trial
    pack = [{"pack": [{}] * 8}]
    [line] = pack_memory_problems(pack, 1.0, nodes, parameters, bootstrap=str(tmp_path / "none"))
    assert line.startswith("--pack: 8 trials a pack on CPUs need 16.0 GiB of memory on one node (2.00 GiB each")
    assert "that holds its 8 CPUs gives tasks at most 8.0 GiB" in line
    assert line.endswith("give --pack 4 or less, or nodes with more memory")
    assert pack_memory_problems([{"pack": [{}] * 4}], 1.0, nodes, parameters, bootstrap=str(tmp_path / "none")) == []
    assert pack_memory_problems(pack, 0.5, nodes, parameters, bootstrap=str(tmp_path / "none")) == [], \
        "4 CPUs' bundle: the 64 GiB node takes it"
    assert pack_memory_problems([{}] * 3, 1.0, nodes, parameters * 100, bootstrap=str(tmp_path / "none")) == []


def held_card():
    """An actor holding one whole GPU (declared, not real) until killed: a card other work has taken."""
    import ray

    @ray.remote(num_cpus=0, num_gpus=1)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()
    ray.get(holder.ready.remote(), timeout=60)
    return holder


def test_auto_pack_sizing_does_not_wait_for_a_cpu_on_a_gpu_node_that_declares_none(connected):
    # A GPU node started with no CPUs (a GPU head kept free of trials, as cluster.yaml's head) is asked for its
    # card's free memory like every GPU node: a question that also asks for a CPU cannot be placed there, and Ray
    # fails it, so a --pack auto sweep stops with a traceback before its first trial. Without CUDA here every
    # answer that runs is torch's error; the worker's card is held, so the first answer is the CPU-less node's.
    import threading

    import ray

    from sweep.packs import gpu_memory

    holder = held_card()  # on the worker: the only GPU node yet
    extra = connected.add_node(num_cpus=0, num_gpus=1, object_store_memory=200 * 2**20)
    connected.wait_for_nodes()
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["free"] = gpu_memory(0.25)
        except Exception as err:  # noqa: BLE001 (no CUDA on this machine: torch's error)
            outcome["error"] = err

    try:
        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(120)  # a fresh worker importing torch on a loaded machine: seconds, not the minutes of a hang
        assert outcome, "gpu_memory waits on the GPU node without CPUs"
        assert not isinstance(outcome.get("error"), ray.exceptions.TaskUnschedulableError), outcome["error"]
        if "error" in outcome:  # no CUDA here: the question reached the node and torch answered it
            assert "CUDA" in str(outcome["error"]) or "NVIDIA" in str(outcome["error"]), "asked there, by torch"
    finally:
        ray.kill(holder)
        connected.remove_node(extra)


def test_auto_pack_sizing_refuses_with_what_to_do_when_no_card_answers_in_time(connected):
    # Every card held by other work (or no GPU node ever coming up) left `--pack auto` waiting without a word, for
    # ever; now it says what it waits for, and after its bound refuses, naming --pack N as the way round.
    import time

    import ray

    from sweep.packs import gpu_memory

    holder = held_card()  # the worker's only card
    said: list[str] = []
    try:
        tick = time.monotonic()
        with pytest.raises(Refused, match=r"--pack N") as refused:
            gpu_memory(1.0, timeout_s=3.0, say=lambda text, **_: said.append(text))
        assert time.monotonic() - tick < 30, "refused at its bound, not left waiting"
        assert "1 of 1 GPU node" in str(refused.value) and "3 s" in str(refused.value)
    finally:
        ray.kill(holder)
    assert not said, "under a minute: no waiting notice yet"
