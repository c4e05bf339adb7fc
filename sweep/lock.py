"""One writer at a time per sweep: `<storage>/<name>/LOCK` names the sweep command writing the sweep's rows.

A second command for the same sweep (the same --storage and --name, from this machine or another) says who
holds it and waits until it is done, then plans from the rows it finds: it runs only what is still missing,
and no trial trains twice. The holder rewrites the file every `HEARTBEAT` seconds; a lock whose holder is
gone (a dead process of this host and PID namespace, or no heartbeat for `STALE` seconds from any other: a
container sharing the host's name numbers its processes anew) is taken over, with one line saying so, so a
killed driver never blocks its own `--resume`. Another host's heartbeat is stamped by its own clock, which may
run minutes apart from this one's, so its lock is gone only once it has stayed unchanged for `STALE` seconds
as this command watched it.

On a local or network file system the lock file is created exclusively (atomic); an object store has no
create-if-absent, so there a writer uploads its claim and reads it back before going on (two claims in the
same second can still both win; the store refuses a second row of a finished trial all the same). Taking over
a gone holder's lock is one command at a time (an flock beside the lock, on a local or network file system),
and removes the lock only if it is still the one judged gone: two commands that both found it gone otherwise
both took it, the second deleting the first's fresh claim.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import threading
import time
import uuid

import pyarrow.fs

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None

from sweep.store import OBJECT_STORES, filesystem

LOCK = "LOCK"
HEARTBEAT = 20.0  # seconds between two rewrites of the lock by its holder
STALE = 120.0  # seconds without a heartbeat after which a holder on another host counts as gone


@contextlib.contextmanager
def sweep_lock(sweep: str, command: str, poll: float = 2.0, clock=time.time, watch=time.monotonic):
    """Hold the sweep's lock for the body of the `with`, waiting (and saying so) while another command holds it.
    `clock` stamps heartbeats and judges this host's; `watch` times how long another host's lock stays unchanged."""
    fs, folder = filesystem(sweep)
    path = f"{folder}/{LOCK}"
    made = _missing_folders(fs, folder)  # removed again if left empty: a refused command leaves no trace
    claim = {"host": platform.node(), "pid": os.getpid(), "pid_namespace": pid_namespace(), "command": command,
             "token": uuid.uuid4().hex,
             "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    announced, watched = False, {}
    try:
        while not _claim(fs, folder, path, {**claim, "heartbeat": clock()}):
            announced = _wait_for(fs, path, announced, poll, clock, watched, watch)
    except BaseException:
        _remove_empty(made)
        raise
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(fs, path, claim, stop, clock), daemon=True)
    beat.start()
    try:
        yield path
    finally:
        stop.set()
        beat.join()
        held = read_lock(fs, path)
        if held is not None and held.get("token") == claim["token"]:
            _delete(fs, path)
        _remove_empty(made)


def _wait_for(fs, path: str, announced: bool, poll: float, clock, watched: dict, watch) -> bool:
    """One look at the lock held by another command: take it over if its holder is gone, else wait a moment
    (saying so once). `watched` keeps another host's lock as last seen, and since when. Returns whether the
    wait has been announced."""
    holder = read_lock(fs, path)
    if holder is None:
        return announced  # released (or unreadable and removed) in between: try again at once
    gone = _gone(holder, clock(), watched, watch)
    if gone:
        with _one_taker(fs, path):
            if read_lock(fs, path) != holder:
                return announced  # taken over or renewed since it was judged: look again
            print(f"taking over the sweep's lock {path} from `{holder.get('command')}` on {holder.get('host')} "
                  f"(pid {holder.get('pid')}): {gone}", flush=True)
            try:
                fs.delete_file(path)
            except FileNotFoundError:
                pass
            except OSError as err:  # left in place it would be taken over again and again, without a pause
                raise OSError(f"the lock {path} of a holder that is gone cannot be removed ({err}); remove it by "
                              "hand") from None
        return announced
    if not announced:
        print(f"waiting: `{holder.get('command')}` on {holder.get('host')} (pid {holder.get('pid')}, since "
              f"{holder.get('started_at')}) is writing this sweep ({path}); this command plans and runs what is "
              f"left once it ends, or once its lock goes {STALE:.0f} s unrenewed (Ctrl-C to stop waiting)",
              flush=True)
    time.sleep(poll)
    return True


def _gone(holder: dict, now: float, watched: dict, watch) -> str | None:
    """Why the lock's holder no longer writes the sweep, judged by this command as it waits (None: it may)."""
    if holder.get("host") == platform.node():  # this host's clock stamped its heartbeat
        return why_gone(holder, now)
    # Another host's (or an unreadable lock's) time is not this one's: only a lock that stops changing is gone.
    seen = json.dumps(holder, sort_keys=True, default=str)
    if watched.get("seen") != seen:
        watched.update(seen=seen, since=watch())
        return None
    unchanged = watch() - watched["since"]
    return f"it has not renewed the lock for {unchanged:.0f} s" if unchanged > STALE else None


@contextlib.contextmanager
def _one_taker(fs, path: str):
    """One command at a time takes over a lock (an flock the kernel drops with its process, so a killed taker
    leaves none). The guard file stays: removing it would let a command lock a file the next one no longer
    opens. An object store has no such lock: there the look again just before the removal is all there is."""
    if not isinstance(fs, pyarrow.fs.LocalFileSystem) or fcntl is None:
        yield
        return
    with open(f"{path}.takeover", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def _remove_empty(folders: list[str]) -> None:
    for folder in folders:
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only when empty


def _missing_folders(fs, folder: str) -> list[str]:
    """The local folders the lock's file will create, deepest first (an object store has no folders)."""
    if not isinstance(fs, pyarrow.fs.LocalFileSystem):
        return []
    missing, here = [], folder
    while here and not os.path.exists(here):
        missing.append(here)
        parent = os.path.dirname(here)
        here = parent if parent != here else ""
    return missing


def read_lock(fs, path: str) -> dict | None:
    """The lock's holder; None when there is no lock. A lock that cannot be read counts as held by an unknown
    writer since the file's last change (so it goes stale like any other)."""
    try:
        with fs.open_input_stream(path) as handle:
            text = handle.read()
        holder = json.loads(text)
        if not isinstance(holder, dict):  # valid JSON, but no claim (null, a list): as unreadable as garbage
            raise ValueError(f"{path} holds no claim")
        return holder
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        info = fs.get_file_info(path)
        if info.type != pyarrow.fs.FileType.File:
            return None
        return {"host": "an unknown host", "pid": 0, "command": "an unknown command",
                "heartbeat": info.mtime.timestamp() if info.mtime else 0.0}


def why_gone(holder: dict, now: float) -> str | None:
    """Why the lock's holder no longer writes the sweep (None: it may)."""
    # A pid names a process only in its own namespace: containers with host networking share this host's name.
    # A lock written before namespaces were recorded counts as this one's.
    here = pid_namespace()
    if holder.get("host") == platform.node() and holder.get("pid_namespace", here) == here \
            and not _alive(int(holder.get("pid", 0))):
        return "that process is gone"
    age = now - float(holder.get("heartbeat", 0))
    if age > STALE:
        return f"it has not renewed the lock for {age:.0f} s"
    return None


def pid_namespace() -> str | None:
    """This process's PID namespace (Linux), e.g. "pid:[4026531836]"; None where there is none to read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _claim(fs, folder: str, path: str, claim: dict) -> bool:
    fs.create_dir(folder)
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        return _write_local(path, claim, replace=False)
    if fs.get_file_info(path).type == pyarrow.fs.FileType.File:
        return False
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(claim).encode())
    if fs.type_name in OBJECT_STORES:
        time.sleep(0.5)  # a competing upload in the same moment: the last one wins, and reads back its own
    held = read_lock(fs, path)
    return held is not None and held.get("token") == claim["token"]


def _write_local(path: str, claim: dict, replace: bool) -> bool:
    """Write the claim whole (aside, then linked or moved into place): a reader never meets half of it.
    Without `replace`, only if no lock is there (atomically); returns whether it was written."""
    aside = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(aside, "w") as out:
        out.write(json.dumps(claim))
    try:
        if replace:
            os.replace(aside, path)
        else:
            os.link(aside, path)
        return True
    except FileExistsError:
        return False
    finally:
        if os.path.exists(aside):
            os.unlink(aside)


def _heartbeat(fs, path: str, claim: dict, stop: threading.Event, clock) -> None:
    while not stop.wait(HEARTBEAT):
        held = read_lock(fs, path)
        if held is None or held.get("token") != claim["token"]:
            return  # taken over (we were thought gone): the store still refuses second rows
        beat = {**claim, "heartbeat": clock()}
        try:
            if isinstance(fs, pyarrow.fs.LocalFileSystem):
                _write_local(path, beat, replace=True)
            else:
                with fs.open_output_stream(path) as out:
                    out.write(json.dumps(beat).encode())
        except OSError:
            pass  # a full disk: the next beat tries again


def _delete(fs, path: str) -> None:
    try:
        fs.delete_file(path)
    except (FileNotFoundError, OSError):
        pass
