"""What a person watching a sweep sees while its trials run, as a Ray Tune callback in the driver.

On a terminal: one line, redrawn in place every second, with trials done / running / pending, the running
trials' epochs, the time so far and an ETA; each trial that ends leaves a line above it. In a log (or under
`ray job logs`, where a line redrawn in place would pile up): the same status as plain lines, one per ended
trial and one every `interval` seconds in between.

The ETA counts work, not trials: a trial's work is its subset size times its epochs (twice that with an
intermediate task), and every reported epoch counts, so the ETA is there from the first epochs on, long before
the first trial ends, and a grid of mixed subset sizes does not read small trials' pace as large ones'.
"""
from __future__ import annotations

import collections
import math
import shutil
import sys
import time

from ray.tune import Callback

from sweep.packs import pack_results

SHOWN_RUNNING = 3  # running trials named on the line; the rest are counted


def trial_work(spec) -> float:
    """A trial's work: its subset size x epochs, twice that for sequential finetuning, whose intermediate round
    trains a subset of the same size for as many epochs before its first report."""
    return spec.train_size * spec.epochs * (2 if spec.intermediate_task else 1)


def short_name(trial_id: str) -> str:
    """A trial_id without its experiment and digest: `incremental-sst2-n500-k3-t0-1a2b3c4d5e` -> `sst2-n500-k3-t0`."""
    return trial_id.split("-", 1)[-1].rsplit("-", 1)[0]


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


class ProgressView(Callback):
    """`work`: trial_id -> `trial_work` of every trial this run may train. `interval`: seconds
    between two plain status lines when nothing ends. Holds no stream (Tune pickles its callbacks with the
    experiment)."""

    def __init__(self, work: dict[str, float], interval: float = 30.0, clock=time.monotonic):
        self.work, self.interval, self.clock = dict(work), interval, clock
        self.setup()

    def setup(self, **info):
        self.started = self.clock()
        self.fraction: dict[str, float] = {}  # trial_id -> share of its work trained, as its reports say
        self.first_fraction: dict[str, float] = {}  # the share done before this run (a resumed trial's epochs)
        self.epochs: dict[str, int] = {}  # trial_id -> epochs done, of a running trial
        self.ended: dict[str, str] = {}  # trial_id -> its row's status, or "unwritten" (see `end`)
        self.trials: list = []
        self.last_shown = -math.inf

    # Tune's events

    def on_step_end(self, iteration, trials, **info):
        self.see(trials)
        self.show()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.see(trials)
        for trial_id, epochs, report, rounds in member_reports(trial, result):
            epoch = report.get("epoch")
            if epoch and epochs:
                # A sequential trial reports its final task's epochs, each after its intermediate round (and a
                # saved state is past that round).
                before = report.get("resumed_from_epoch", 0)
                self.first_fraction.setdefault(trial_id, (before + (rounds - 1) * epochs) / (rounds * epochs)
                                               if before else 0.0)
                self.fraction[trial_id] = (epoch + (rounds - 1) * epochs) / (rounds * epochs)
                # Not shown as running once ended: its last report reaches this view after its row, and a pack
                # repeats a diverged member's last report at every epoch after.
                if trial_id not in self.ended:
                    self.epochs[trial_id] = epoch
        self.show()

    # How each trial ended comes from the row writer (sweep.runner.RowWriter calls `end`): the rows it lands,
    # and the rows it could not write, are what the counts say.

    def on_experiment_end(self, trials, **info):
        self.see(trials)
        self.show(force=True)
        if sys.stdout.isatty():
            sys.stdout.write("\n")  # what the sweep prints next starts below the live line
            sys.stdout.flush()

    # State

    def see(self, trials) -> None:
        self.trials = trials

    def end(self, trial_id: str, status: str, metric) -> None:
        """A trial ended: `status` is its row's, or "unwritten" (its row could not be written: counted as
        failed)."""
        if trial_id in self.ended:
            return  # an error row after a final one is never written; counted once either way
        self.ended[trial_id] = status
        self.epochs.pop(trial_id, None)
        # An ok trial ran every epoch; the report that says so (and, for a trial resumed at its last epoch, where
        # it resumed from: `first_fraction`) reaches this view after its row.
        if status == "ok":
            self.fraction[trial_id] = 1.0
        shown = f" dev_metric={metric:.4f}" if isinstance(metric, float) and math.isfinite(metric) else ""
        self.show(ended=f"{trial_id} {status}{shown}")

    def running(self) -> list[tuple[str, int]]:
        """(trial_id, epochs) of the trials running now; a running pack's members each count."""
        return [(m["trial_id"], m["finetune"]["epochs"]) for t in self.trials if t.status == "RUNNING"
                for m in members(t) if m["trial_id"] not in self.ended]

    def eta(self) -> float | None:
        """Seconds left at this run's pace: work left over work done per second; None before any epoch. The pace
        counts the epochs trials reported (a trial that failed before its first trained nothing, one that
        diverged at its second of five trained two); an ended trial leaves no work."""
        left = sum(w * (1 - self.fraction.get(t, 0.0)) for t, w in self.work.items() if t not in self.ended)
        done = sum(self.work.get(t, 0) * (f - self.first_fraction.get(t, 0.0)) for t, f in self.fraction.items())
        if left <= 0:
            return 0.0  # every trial ended, those that failed before their first epoch too
        if done <= 0:
            return None
        return left * (self.clock() - self.started) / done

    def line(self) -> str:
        """`[done/total] ok · diverged · failed · running · pending · elapsed · eta | running trials' epochs`."""
        states = collections.Counter(self.ended.values())
        total = len(self.work)
        done = sum(1 for t in self.ended if t in self.work)
        running = self.running()
        eta = self.eta()
        failed = states["error"] + states["unwritten"]
        line = (f"[{done}/{total}] ok {states['ok']} · diverged {states['diverged']} · failed {failed} · "
                f"running {len(running)} · pending {max(total - done - len(running), 0)} · "
                f"elapsed {minutes(self.clock() - self.started)} · "
                f"eta {minutes(eta) if eta is not None else 'after the first epochs'}")
        if running:
            named = [f"{short_name(trial_id)} {self.epochs.get(trial_id, 0)}/{epochs} epochs"
                     for trial_id, epochs in running[:SHOWN_RUNNING]]
            more = f", +{len(running) - SHOWN_RUNNING} more" if len(running) > SHOWN_RUNNING else ""
            line += " | " + ", ".join(named) + more
        return line

    # Output

    def show(self, ended: str | None = None, force: bool = False) -> None:
        """On a terminal: redraw the live line (at most once a second), printing an ended trial's line above
        it. Elsewhere: a line per ended trial, and a status line every `interval` seconds."""
        out, now = sys.stdout, self.clock()
        live = out.isatty()
        due = now - self.last_shown >= (1.0 if live else self.interval)
        if not (ended or force or due):
            return
        self.last_shown = now
        if not live:
            out.write(f"{self.line()}{f' | ended: {ended}' if ended else ''}\n")
        else:
            width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be redrawn in place
            if ended:
                out.write(f"\r\x1b[K{ended}\n")
            out.write(f"\r\x1b[K{self.line()[:width]}")
        out.flush()


def members(trial) -> list[dict]:
    """The trial configs a Tune trial runs: a pack's members (sweep.packs), or its own."""
    return trial.config["trial"].get("pack", [trial.config["trial"]])


def member_reports(trial, result: dict) -> list[tuple[str, int, dict, int]]:
    """(trial_id, epochs, latest report, rounds of training: 2 with an intermediate task) of each trial a Tune
    trial runs; a pack reports its members' under `pack_results` (trainables.tune_trainable.run_pack)."""
    by_id = pack_results(result) if "pack" in trial.config["trial"] else {trial.config["trial"]["trial_id"]: result}
    return [(m["trial_id"], m["finetune"]["epochs"], by_id.get(m["trial_id"], {}),
             2 if m["finetune"].get("intermediate_task") else 1) for m in members(trial)]
