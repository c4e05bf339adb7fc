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


# Ray Tune's function trainables persist checkpoints through Ray Train's storage module, which logs a line per
# checkpoint at INFO from the trial's process; the driver forwards each one. With a checkpoint every epoch that is
# one line per trial-epoch (thousands in a paper grid) between the sweep's own progress lines, which already say
# how far each trial got. Warnings and errors of the same loggers still show.
CHECKPOINT_LOGGERS = ("ray.train._internal.storage", "ray.train.v2._internal.execution.storage")


def quiet_worker() -> None:
    """What a trial's process quiets before it trains: SystemExit in callbacks, and the per-checkpoint lines."""
    quiet_stop_in_callbacks()
    quiet_loggers(CHECKPOINT_LOGGERS)


def quiet_loggers(names) -> None:
    """Only warnings and errors from these loggers (a Ray worker logs INFO, and the driver forwards it)."""
    import logging

    for name in names:
        logging.getLogger(name).setLevel(logging.WARNING)
