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


FAKE_SRUN = r"""#!/usr/bin/env bash
# srun as Slurm >= 22.05 runs a step: its CPUs are --cpus-per-task or SRUN_CPUS_PER_TASK, else 1 (it no longer
# reads SLURM_CPUS_PER_TASK, which sbatch sets); the step's processes are confined to them.
node=standin-0 cpus="${SRUN_CPUS_PER_TASK:-1}"
while [[ "${1:-}" == -* ]]; do
  case "$1" in
    -w) node="$2"; shift ;;
    --cpus-per-task=*) cpus="${1#*=}" ;;
    -c) cpus="$2"; shift ;;
  esac
  shift
done
echo "step node=$node cpus=$cpus: $*" >> "$FAKE_LOG"
exec "$@"
"""
FAKE_RAY = r"""#!/usr/bin/env bash
# `ray start ... --block` stays until it is stopped, as a node would (its stop in hand before it says it started);
# nothing else is asked of it here.
if [ "${1:-}" = start ]; then
  trap 'echo "ray stopped" >> "$FAKE_LOG"; exit 0' TERM
  echo "ray $*" >> "$FAKE_LOG"
  while :; do sleep 0.05; done
fi
echo "ray $*" >> "$FAKE_LOG"
"""
FAKE_PYTHON = r"""#!/usr/bin/env bash
# The script's wait for its nodes (a program on stdin) returns once that many have started, as Ray's does once
# they are alive (an at-once answer let the script stop a node whose srun had not yet started it, on a busy
# machine); the sweep is recorded.
if [ "${1:-}" = - ]; then
  cat > /dev/null
  for _ in $(seq 600); do
    [ "$(grep -c '^ray start' "$FAKE_LOG" 2> /dev/null)" -ge "$3" ] && break
    sleep 0.05
  done
  echo "$3 nodes alive in the Ray cluster at $2"; exit 0
fi
echo "python $*" >> "$FAKE_LOG"
"""


def test_each_ray_node_is_told_the_cpus_its_slurm_step_has(tmp_path):
    """Since Slurm 22.05 a job step gets one CPU unless srun is told --cpus-per-task (or SRUN_CPUS_PER_TASK): a Ray
    node told `--num-cpus 8` in a one-CPU step runs its 8 trials on one core. No Ray here: srun, ray and python are
    stand-ins that record what the script asks of them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": FAKE_SRUN, "ray": FAKE_RAY, "python": FAKE_PYTHON,
                       "hostname": "#!/usr/bin/env bash\necho 10.0.0.1\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for name in ("sbatch", "scontrol"):
        (bin_dir / name).symlink_to(STANDIN / name)
    log = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM", "SRUN_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", FAKE_LOG=str(log), HOME=str(tmp_path), RAY_AUTH_TOKEN="x" * 32)
    done = subprocess.run(["sbatch", "--nodes=2", "--cpus-per-task=8", "--gpus-per-task=1",
                           "scripts/slurm/sweep.sbatch", "incremental", "--storage", "/shared/x"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    lines = log.read_text().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    starts = [line for line in lines if line.startswith("step ") and ": ray start" in line]
    assert len(starts) == 2, lines
    for line in starts:
        words = line.split()
        told = words[words.index("--num-cpus") + 1]
        assert f"cpus={told}:" in line, f"Ray is told {told} CPUs, but its step has: {line}"
        assert words[words.index("--num-gpus") + 1] == "1", line
    assert "python -m sweep incremental --storage /shared/x --address 10.0.0.1:6379" in lines, lines
    assert lines.count("ray stopped") == 2, lines
