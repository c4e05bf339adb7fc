"""Checks of the running environment a sweep asks for (storage, cluster address, GPUs, local data files),
made before any work starts. Each returns problems as lines naming the option, the value and what to do;
an empty list means go ahead."""
from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from urllib.parse import urlsplit


def cannot_start(problems: list[str]) -> str:
    """The one message a refused sweep prints: a line per problem."""
    return "cannot start the sweep:\n" + "\n".join(f"  - {p}" for p in problems)


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


def address_problems(address: str | None, timeout: float = 5.0) -> list[str]:
    """Whether a Ray cluster answers at `address`. 'auto' and no address are left to ray.init, which fails
    fast for them; a host:port that does not answer would make ray.init retry for minutes instead."""
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
            return []
    except OSError as err:
        return [f"--address: no Ray cluster answers at {host}:{port} ({err.strerror or err}); start one with "
                "`ray start --head` or `ray up cluster.yaml`, or leave --address out to run locally"]


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
    import yaml

    path = Path(os.path.expanduser(bootstrap))
    if not path.is_file():
        return 0.0
    config = yaml.safe_load(path.read_text()) or {}
    return max((float((t.get("resources") or {}).get("GPU", 0)) for t in (config.get("available_node_types") or {}).values()
                if t.get("max_workers", 0) > 0), default=0.0)
