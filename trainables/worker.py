"""What a trial's Ray worker process sets up for itself before it trains."""
from __future__ import annotations

import sys


def quiet_stop_in_callbacks() -> None:
    """Ray ends a trial's idle process with SIGTERM when the sweep is done, and Ray's handler raises SystemExit
    wherever the process happens to be. Inside a weakref or finalizer callback (the garbage collector's) Python
    cannot raise it, so it printed "Exception ignored in: <function WeakSet...>", a traceback and "SystemExit:
    1", which the driver forwarded to the end of a sweep that had just succeeded (two runs of three of the
    4-trial sweep). Python ignores that exception either way; only its printout goes. Every other exception
    that cannot be raised is reported as before. Safe to call more than once."""
    if getattr(sys.unraisablehook, "quiet_stop", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, SystemExit):
            return
        previous(unraisable)

    hook.quiet_stop = True
    sys.unraisablehook = hook
