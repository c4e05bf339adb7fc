"""scripts/slurm/sweep.sbatch, run under stand-ins for sbatch, srun and scontrol (tests/slurm/) that start its
nodes on this machine: each node a `ray start` of its own (own temporary folder, the head on a free port, the
caller's token), the sweep's driver connected to them, every node stopped at the end by the script itself.

Ray advertises a node by the machine's own address even when told 127.0.0.1; every port here is on this
machine. Nothing is written to /tmp/ray, so no plain `ray.init()` elsewhere finds these nodes."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from analysis.results import read_results

ROOT = Path(__file__).resolve().parents[1]
STANDIN = Path(__file__).resolve().parent / "slurm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_session(session: int) -> list[int]:
    """The processes of a session (the stand-in job and whatever it started, Ray's nodes and workers included:
    Ray gives its workers process groups of their own, within the session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    found.append(int(entry.name))
            except OSError:
                pass  # gone meanwhile
    return found


def command_line(pid: int) -> str:
    try:
        return f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"{pid}: gone"


def test_the_sbatch_script_runs_a_sweep_across_the_nodes_it_starts_and_stops_them(tiny_bert, tmp_path):
    if sys.platform != "linux":
        pytest.skip("the stand-in finds what it started through /proc")
    root = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))  # short: Ray's Unix socket paths stay < 108 bytes
    token = root / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PATH=f"{STANDIN}:{Path(sys.executable).parent}:{env['PATH']}", STANDIN_ROOT=str(root),
               RAY_AUTH_TOKEN_PATH=str(token), RAY_PORT=str(free_port()), RAY_NODES_WAIT_S="240",
               RAY_HEAD_ARGS=f"--include-dashboard=false --ray-client-server-port={free_port()}",
               RAY_NODE_ARGS="--object-store-memory=200000000 --disable-usage-stats")
    argv = ["sbatch", "--nodes=2", "--cpus-per-task=1", "scripts/slurm/sweep.sbatch",
            "incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "48", "--epochs", "1",
            "--trials", "1", "--k", "0", "4", "--storage", str(tmp_path), "--name", "slurm"]
    job = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = job.communicate(timeout=480)
        # The script stopped its nodes on its way out; their last workers may take a moment to go (each node
        # stops its processes one by one, a second's grace each, longer on a loaded machine).
        deadline = time.monotonic() + 60
        while in_session(job.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = [command_line(pid) for pid in in_session(job.pid)]
        own_address_file = (root / "standin-0" / "ray" / "ray_current_cluster").is_file()
    finally:
        for pid in in_session(job.pid):  # only what this job started: its session
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        job.kill()
        job.wait()
        shutil.rmtree(root, ignore_errors=True)
    assert job.returncode == 0, out[-5000:]
    assert "1 nodes alive" in out and "2 nodes alive" in out, out[-5000:]
    assert left == [], f"the script left processes running: {left}\n{out[-3000:]}"
    assert own_address_file, "the head writes its address in its own folder, not /tmp/ray"
    table = read_results(tmp_path / "slurm")
    assert len(table) == 2 and table["trial_id"].is_unique and set(table["status"]) == {"ok"}
