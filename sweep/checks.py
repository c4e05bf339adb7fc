"""Checks of the running environment a sweep asks for (storage, cluster address, GPUs, local data files),
made before any work starts. Each returns problems as lines naming the option, the value and what to do;
an empty list means go ahead."""
from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit


def cannot_start(problems: list[str]) -> str:
    """The one message a refused sweep prints: a line per problem."""
    return "cannot start the sweep:\n" + "\n".join(f"  - {p}" for p in problems)


class Refused(ValueError):
    """A sweep that cannot start: every problem, each one line naming the setting, the value and what is
    allowed."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(cannot_start(self.problems))


def storage_problems(storage: str) -> list[str]:
    """Whether rows can be written under `storage` (a local folder or a pyarrow.fs URI such as s3://...),
    found by writing and deleting a probe file; nothing is left behind, not even the folder."""
    if "://" in storage:
        return _uri_storage_problems(storage)
    path = Path(storage).expanduser().absolute()
    existing = path
    while not existing.exists():  # the folders still to be made will be made inside this one
        existing = existing.parent
    if not existing.is_dir():
        return [f"--storage: '{storage}' cannot be created: {existing} is a file, not a folder"]
    probe = existing / f".reinit-sweep-write-probe-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return [f"--storage: '{storage}' is not writable ({existing}: {err.strerror or err}); "
                "give a folder you can write to, or an s3:// / gs:// URI"]
    return []


def storage_access_problems(storage: str) -> list[str]:
    """storage_problems without writing (for a dry run): whether the file system lets this user write where
    the folders would be made. A URI's store is reached only by a real run."""
    if "://" in storage:
        return []
    path = Path(storage).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return [f"--storage: '{storage}' cannot be created: {existing} is a file, not a folder"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"--storage: '{storage}' is not writable ({existing} does not let this user write); give a folder "
                "you can write to, or an s3:// / gs:// URI"]
    return []


def _uri_storage_problems(storage: str) -> list[str]:
    from sweep.store import filesystem

    try:
        fs, root = filesystem(storage)
        probe = f"{root.rstrip('/')}/.reinit-sweep-write-probe-{uuid.uuid4().hex}"
        with fs.open_output_stream(probe) as handle:
            handle.write(b"")
        fs.delete_file(probe)
    except Exception as err:  # pyarrow raises OSError, ValueError or ArrowInvalid depending on the scheme
        return [f"--storage: cannot write to '{storage}' ({type(err).__name__}: {err}); check the URI "
                "(s3://bucket/prefix, gs://bucket/prefix) and this machine's credentials for it"]
    return []


def address_problems(address: str | None, timeout: float = 5.0, gcs_timeout: float = 15.0) -> list[str]:
    """Whether a Ray cluster answers at `address` and lets this machine in. 'auto' and no address are left to
    ray.init, which fails fast for them; a host:port that does not answer, or answers without this machine's
    token, would make ray.init retry for 20 s or more, burying the cause in Ray's warnings."""
    if address in (None, "", "auto", "local"):
        return []
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None:
        return [f"--address: '{address}' is not HOST:PORT (e.g. 10.0.0.5:6379), ray://HOST:10001 or 'auto'"]
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as err:
        return [f"--address: no Ray cluster answers at {host}:{port} ({err.strerror or err}); start one with "
                "`ray start --head` or `ray up cluster.yaml`, or leave --address out to run locally"]
    if "://" in address:  # the Ray Client's server (ray://) speaks its own protocol: ray.init asks it
        return []
    return gcs_problems(f"{host}:{port}", gcs_timeout)


def gcs_problems(address: str, timeout: float) -> list[str]:
    """Ask the cluster's GCS at `address` for its id, as ray.init does first: a missing or wrong token is
    refused at once; a port where something else listens (the dashboard's 8265) never replies. The question
    runs in a thread (Ray's client lets go of the interpreter while it waits) so that silence costs `timeout`."""
    outcome: dict = {}

    def ask() -> None:
        from ray._raylet import GcsClient

        try:
            GcsClient(address=address)
            outcome["ok"] = True
        except Exception as err:  # Ray raises AuthenticationError, RpcError or RuntimeError by cause
            outcome["error"] = err

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(timeout)
    if "error" in outcome:
        return [connection_problem(address, outcome["error"])]
    if "ok" not in outcome:
        return [f"--address: something answers at {address}, but no Ray cluster (no reply from a GCS in "
                f"{timeout:g} s); give the port `ray start --head` printed (6379 by default; 8265 is the "
                "dashboard's, for `ray job submit`)"]
    return []


def connection_problem(address: str | None, err: BaseException) -> str:
    """The one line for a failed connection to a Ray cluster (GcsClient's or ray.init's error, whose cause
    Ray keeps only as text in a chain of exceptions): a token refused, or no cluster there."""
    causes, seen = [], err
    while seen is not None and len(causes) < 10:
        causes.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    text = " ".join(causes)
    where = f"at {address}" if address not in (None, "", "auto") else "on this machine (--address auto)"
    if "AuthenticationError" in text or "InvalidAuthToken" in text:
        mode = os.environ.get("RAY_AUTH_MODE")
        here = f"RAY_AUTH_MODE={mode}" if mode else "RAY_AUTH_MODE is unset"
        return (f"--address: the Ray cluster {where} refused this machine's auth token ({here}); copy the "
                "cluster's token (`ray get-auth-token` on its head) to ~/.ray/auth_token or RAY_AUTH_TOKEN here "
                "and export RAY_AUTH_MODE=token")
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    return (f"--address: no Ray cluster answers {where} ({first}); start one with `ray start --head` or "
            "`ray up cluster.yaml`, or leave --address out to run locally")


def data_dir_problems(data_dir: str | None, tasks) -> list[str]:
    """Whether a local GLUE folder holds the train and dev file of every task asked for."""
    from trainables.tasks import SQUAD_FILES
    from trainables.tasks import GLUE_FILES, SQUAD_V2, TASKS, get_task

    if data_dir is None:
        return []
    root = Path(data_dir)
    if not root.is_dir():
        return [f"--data-dir: '{data_dir}' is not a folder; give a GLUE folder holding SST-2/train.tsv, ..."]
    problems = []
    for name in dict.fromkeys(t for t in tasks if t in TASKS and t != "synthetic"):
        task = get_task(name)
        if name == SQUAD_V2:
            missing = [f for f in SQUAD_FILES.values() if not (root / f).is_file()]
            if missing:
                problems.append(f"--data-dir: {data_dir} has no {' or '.join(missing)} for task '{name}' (the "
                                f"official SQuAD 2.0 files); expected {root / missing[0]}")
            continue
        missing = [f for f in GLUE_FILES.values() if not (root / task.glue_dir / f).is_file()]
        if missing:
            problems.append(f"--data-dir: {data_dir} has no {task.glue_dir}/{' or '.join(missing)} for task "
                            f"'{name}'; expected {root / task.glue_dir / missing[0]}")
    return problems


BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"  # written by `ray up` on the head node of a launched cluster


def gpu_problems(gpus_per_trial: float, cluster_resources: dict, bootstrap: str = BOOTSTRAP_CONFIG) -> list[str]:
    """Whether trials asking for GPUs can ever be placed: the cluster has GPUs now, or it was launched with
    an autoscaler configuration whose worker types bring GPUs (they start on demand)."""
    if gpus_per_trial <= 0:
        return []
    have = float(cluster_resources.get("GPU", 0))
    if have >= gpus_per_trial:
        return []
    if autoscaler_gpus(bootstrap) >= gpus_per_trial:
        return []
    where = f"this Ray cluster has {have:g} GPUs" if have else "this Ray cluster has no GPU"
    return [f"--gpus-per-trial: {gpus_per_trial:g} asked, but {where} and no autoscaler that adds GPU workers; "
            "use --gpus-per-trial 0 to train on CPUs, or run on a GPU cluster (--address)"]


def autoscaler_gpus(bootstrap: str = BOOTSTRAP_CONFIG) -> float:
    """The most GPUs one worker type of the launched cluster's autoscaler can bring (0 without one)."""
    return max((float(t.get("GPU", 0)) for t in autoscaler_node_types(bootstrap)), default=0.0)


def autoscaler_node_types(bootstrap: str = BOOTSTRAP_CONFIG) -> list[dict]:
    """The declared resources of each node type the launched cluster's autoscaler may add (none without one)."""
    import yaml

    path = Path(os.path.expanduser(bootstrap))
    if not path.is_file():
        return []
    config = yaml.safe_load(path.read_text()) or {}
    return [dict(t.get("resources") or {}) for t in (config.get("available_node_types") or {}).values()
            if t.get("max_workers", 0) > 0]


def node_shapes(nodes: list[dict], bootstrap: str = BOOTSTRAP_CONFIG) -> list[dict]:
    """What one node can give a trial, {CPU, GPU, memory}: each alive node that Ray reports (`ray.nodes()`), and
    each node type the launched cluster's autoscaler may add (their memory is not declared: None)."""
    def shape(resources: dict, memory) -> dict:
        return {"CPU": float(resources.get("CPU", 0)), "GPU": float(resources.get("GPU", 0)), "memory": memory}

    alive = [shape(n.get("Resources") or {}, (n.get("Resources") or {}).get("memory")) for n in nodes if n.get("Alive")]
    return alive + [shape(t, None) for t in autoscaler_node_types(bootstrap)]


def holds(shape: dict, cpus: float, gpus: float, memory: float = 0.0) -> bool:
    """Whether one node of `shape` can hold a request of `cpus`, `gpus` and `memory` bytes."""
    return (shape["CPU"] >= cpus and shape["GPU"] >= gpus
            and (not memory or shape["memory"] is None or shape["memory"] >= memory))


def placement_problems(cpus_per_trial: float, gpus_per_trial: float, shapes: list[dict],
                       memory_per_trial: float = 0.0) -> list[str]:
    """Whether one trial fits on one node (Ray places a trial's resources on a single node; one that fits
    nowhere waits forever): the nearest miss, with every node's numbers."""
    if any(holds(s, cpus_per_trial, gpus_per_trial, memory_per_trial) for s in shapes):
        return []
    nodes = "; ".join(describe_shape(s) for s in shapes) or "no node alive"
    with_gpus = [s for s in shapes if s["GPU"] >= gpus_per_trial]
    if not with_gpus:
        most = max((s["GPU"] for s in shapes), default=0.0)
        return [f"--gpus-per-trial: {gpus_per_trial:g} asked, but no node of this Ray cluster has more than "
                f"{most:g} GPUs (nodes: {nodes}); give at most {most:g}, or add nodes with more GPUs"]
    if not any(s["CPU"] >= cpus_per_trial for s in with_gpus):
        most = max(s["CPU"] for s in with_gpus)
        which = "the largest node" if not gpus_per_trial else f"the largest node with {gpus_per_trial:g} GPUs"
        return [f"--cpus-per-trial: {cpus_per_trial:g} asked, but {which} of this Ray cluster has {most:g} CPUs "
                f"(nodes: {nodes}); give at most {most:g}, or add larger nodes"]
    most = max(s["memory"] for s in with_gpus if s["CPU"] >= cpus_per_trial)
    return [f"--model: a trial needs at least {memory_per_trial / 2**30:.1f} GiB of memory (weights, gradients, "
            f"Adam moments and the reference copy), but a node of this Ray cluster with {cpus_per_trial:g} CPUs "
            f"gives tasks at most {most / 2**30:.1f} GiB (nodes: {nodes}); use a smaller model, nodes with more "
            "memory, or --gpus-per-trial"]


def describe_shape(shape: dict) -> str:
    memory = "" if shape["memory"] is None else f", {shape['memory'] / 2**30:.1f} GiB"
    return f"{shape['CPU']:g} CPU, {shape['GPU']:g} GPU{memory}"


# What every node sees: where trials' checkpoints and rows can go.
SHARED_STORAGE = ("give a bucket (s3://bucket/prefix, gs://bucket/prefix) or a folder every node mounts at the same "
                  "path (NFS)")


def unshared_storage_problems(tune_dir, bootstrap: str = BOOTSTRAP_CONFIG) -> list[str]:
    """Whether the other nodes of the Ray cluster that can run trials see a local storage folder, found by a
    probe file made here and looked for there. Trials write their checkpoints to it from their own node, and Ray
    fails a trial whose node does not see the folder the driver made: a trial that trained to a checkpoint is lost
    (its row with it, when that was its last epoch), on every retry. A bucket's URI is seen from everywhere; a
    node that does not answer in time is given the benefit of the doubt. With no such node up yet, but a launched
    cluster's autoscaler that adds them (`ray up cluster.yaml`: no worker until trials ask for one), there is none
    to ask: a folder on this machine's own disk is refused, one on a network file system let through."""
    if "://" in str(tune_dir):
        return []
    import ray

    here = ray.get_runtime_context().get_node_id()
    others = {n["NodeID"]: n.get("NodeManagerAddress", n["NodeID"]) for n in ray.nodes()
              if n.get("Alive") and n["NodeID"] != here
              and any((n.get("Resources") or {}).get(r, 0) > 0 for r in ("CPU", "GPU"))}
    folder = Path(tune_dir).expanduser().absolute()
    if not others:
        added = any(t.get(r, 0) > 0 for t in autoscaler_node_types(bootstrap) for r in ("CPU", "GPU"))
        if not added or on_network_file_system(folder):
            return []
        return [f"--storage: {folder} is a folder of this machine's own disk ({file_system_type(folder)}), and the "
                "nodes this Ray cluster's autoscaler adds to run the trials will not see it: Ray fails a trial "
                f"there (a finished one's row with it); {SHARED_STORAGE}"]
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f".reinit-sweep-shared-probe-{uuid.uuid4().hex}"
    marker.write_bytes(b"")
    try:
        seen = nodes_seeing(str(marker), list(others))
    finally:
        marker.unlink(missing_ok=True)
    blind = sorted(others[node] for node, sees in seen.items() if sees is False)
    if not blind:
        return []
    return [f"--storage: {folder} is a folder of this machine that {len(blind)} of the Ray cluster's other nodes "
            f"({', '.join(blind)}) do not see, and trials there write their checkpoints to it, which Ray refuses "
            f"(the trial fails, a finished one's row with it); {SHARED_STORAGE}"]


# File system types (/proc/mounts) of storage that other machines can mount too; fuse.*: s3fs, gcsfuse, JuiceFS, ...
NETWORK_FILE_SYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "efs"}


def file_system_type(path: Path) -> str | None:
    """The type of the file system `path` lies on, from the longest mount point above it (None: no /proc/mounts)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target, best, kind = os.path.realpath(path), "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def on_network_file_system(path: Path) -> bool:
    """Whether other machines may mount `path` too (unknown, without /proc/mounts: given the benefit of the doubt)."""
    kind = file_system_type(path)
    return kind is None or kind in NETWORK_FILE_SYSTEMS or kind.startswith("fuse.")


def nodes_seeing(path: str, node_ids: list[str], timeout: float = 60.0) -> dict[str, bool | None]:
    """Per node, whether `path` exists there (None: no answer within `timeout`, or the node went away)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)  # on a node whose cores trials hold, too
    def exists(where: str) -> bool:
        return os.path.exists(where)

    asked = {node: exists.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(path)
             for node in node_ids}
    ready, late = ray.wait(list(asked.values()), num_returns=len(asked), timeout=timeout)
    for ref in late:
        ray.cancel(ref, force=True)
    answers: dict[str, bool | None] = {}
    for node, ref in asked.items():
        try:
            answers[node] = bool(ray.get(ref)) if ref in ready else None
        except Exception:  # noqa: BLE001 (the node died meanwhile: it runs no trial to lose)
            answers[node] = None
    return answers
