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
