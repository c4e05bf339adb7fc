"""A trial's worker process stopped by Ray at a sweep's end prints nothing (trainables.worker)."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys, weakref
    from trainables.worker import quiet_stop_in_callbacks

    class Thing:
        pass

    def stop(_):  # what Ray's SIGTERM handler raises, landing in a weakref callback
        raise SystemExit(1)

    def broken(_):
        raise ValueError("a real bug in a callback")

    if sys.argv[1] == "quiet":
        quiet_stop_in_callbacks()
        quiet_stop_in_callbacks()  # twice: one hook
    thing = Thing()
    ref = weakref.ref(thing, stop if sys.argv[2] == "stop" else broken)
    del thing
    print("went on")
""")


def run(mode: str, what: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode, what], capture_output=True, text=True, timeout=60)


def test_a_systemexit_in_a_callback_no_longer_prints_a_traceback():
    loud, quiet = run("plain", "stop"), run("quiet", "stop")
    assert "Exception ignored" in loud.stderr and "SystemExit" in loud.stderr  # what users saw
    assert quiet.stderr == "" and quiet.stdout == "went on\n"


def test_other_exceptions_in_callbacks_are_still_reported():
    quiet = run("quiet", "broken")
    assert "Exception ignored" in quiet.stderr and "a real bug in a callback" in quiet.stderr
    assert quiet.stdout == "went on\n"


CHECKPOINT_SCRIPT = textwrap.dedent("""
    import importlib, inspect, logging, sys
    from trainables.worker import CHECKPOINT_LOGGERS, quiet_worker

    logging.basicConfig(level=logging.INFO)  # as a trial's process logs
    modules = [importlib.import_module(name) for name in CHECKPOINT_LOGGERS]
    # The loggers quieted are the ones Ray's checkpoint line comes from: a Ray that moved it fails here.
    assert all(m.logger.name == m.__name__ and "Checkpoint successfully created" in inspect.getsource(m)
               for m in modules)
    if sys.argv[1] == "quiet":
        quiet_worker()
    for m in modules:
        m.logger.info("Checkpoint successfully created at: somewhere")
        m.logger.warning("a real warning")
""")


def test_a_trials_checkpoints_log_no_line_each_and_warnings_still_show():
    # A line per checkpoint per trial, forwarded by the driver: thousands in a paper grid between the progress lines.
    loud, quiet = (subprocess.run([sys.executable, "-c", CHECKPOINT_SCRIPT, mode], capture_output=True, text=True,
                                  timeout=120) for mode in ("plain", "quiet"))
    assert loud.returncode == 0 and loud.stderr.count("Checkpoint successfully created") == 2, loud.stderr
    assert quiet.returncode == 0 and "Checkpoint successfully created" not in quiet.stderr, quiet.stderr
    assert quiet.stderr.count("a real warning") == 2
