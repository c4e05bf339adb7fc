"""What a person watching a sweep sees while its trials run, as a Ray Tune callback in the driver.

On a terminal: one line, redrawn in place every second, with trials done / running / pending, the running
trials' epochs, the time so far and an ETA; each trial that ends leaves a line above it. In a log (or under
`ray job logs`, where a line redrawn in place would pile up): the same status as plain lines, one per ended
trial and one every `interval` seconds in between.

The ETA counts work, not trials: a trial's work is its subset size times its epochs (twice that with an
intermediate task), and every reported epoch counts, so the ETA is there from the first epochs on, long before
the first trial ends, and a grid of mixed subset sizes does not read small trials' pace as large ones'.

A probe (sweep.probing) counts as its subset size (`probe_work`), done when it reports. A search's studies
(sweep.search) run their Tuners in Ray tasks: a `ProgressRelay` there hands each Tune event to the driver's one
view (`follow`). Members of a fused pack that wait for an earlier group of it to finish (a GPU pack's later
groups) are pending, not running, once a report of the pack says so (`pack_waiting`, sweep.packs.pack_results).
"""
from __future__ import annotations

import collections
import math
import re
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


def probe_work(spec) -> float:
    """A probe's work: its subset size. Its epochs are no measure of it: early stopping ends a probe anywhere up to
    --max-probe-epochs, it reports only once done, and what its subset's trial spends is mostly the frozen
    encoder's pass over the subset (trainables.probing.probe_subset), shared by the subset's probes, beside which
    a head's epochs on the cached features are small. So each probe counts as one pass over its subset, done when
    its row lands; the first probes of a subset carry its encoder pass, the pace evens out over the subsets."""
    return spec.train_size


def short_name(trial_id: str) -> str:
    """A trial_id without its experiment and digest: `incremental-sst2-n500-k3-t0-1a2b3c4d5e` -> `sst2-n500-k3-t0`;
    a search's sample keeps its number: `lr-multipliers-sst2-n500-k2-t0-1a2b3c4d5e-s3` -> `sst2-n500-k2-t0-s3`
    (experiment names hold hyphens too: the task is what comes before `-n<size>`)."""
    found = re.fullmatch(r".*?-([^-]+-n\d+(?:-.*?)?)-[0-9a-f]{10}(-s\d+)?", trial_id)
    return "".join(part or "" for part in found.groups()) if found else trial_id


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
        self.waiting: set[str] = set()  # pack members waiting for an earlier group of their pack (`pack_waiting`)
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
            if report.get("waiting"):
                self.waiting.add(trial_id)
            else:
                self.waiting.discard(trial_id)
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

    def end(self, trial_id: str, status: str, metric, detail: str | None = None) -> None:
        """A trial ended: `status` is its row's, or "unwritten" (its row could not be written: counted as
        failed); `detail`, the line that says so, if the row writer has one of its own."""
        if trial_id in self.ended:
            return  # an error row after a final one is never written; counted once either way
        self.ended[trial_id] = status
        self.epochs.pop(trial_id, None)
        # An ok trial ran every epoch; the report that says so (and, for a trial resumed at its last epoch, where
        # it resumed from: `first_fraction`) reaches this view after its row.
        if status == "ok":
            self.fraction[trial_id] = 1.0
        shown = f" dev_metric={metric:.4f}" if isinstance(metric, float) and math.isfinite(metric) else ""
        self.show(ended=detail or f"{trial_id} {status}{shown}")

    def running(self) -> list[tuple[str, int | None]]:
        """(trial_id, epochs or None) of the trials running now (`running_named`)."""
        return [(trial_id, epochs) for trial_id, epochs, _ in self.running_named()]

    def running_named(self) -> list[tuple[str, int | None, str]]:
        """(trial_id, epochs or None, name) of the trials running now: a running pack's members each count, but
        not those waiting for an earlier group of it; of a probing subset's probes, which train one after
        another in its config's order (trainables.probing.probe_subset), the first not ended. A trial this view
        was not given (a search's replayed trial, which trains nothing) is none of its business."""
        found = []
        for trial in self.trials:
            if trial.status != "RUNNING":
                continue
            for trial_id, epochs, name in members(trial):
                if trial_id in self.ended or trial_id in self.waiting or trial_id not in self.work:
                    continue
                found.append((trial_id, epochs, name))
                if "probes" in trial.config["trial"]:
                    break
        return found

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
        running = self.running_named()
        eta = self.eta()
        failed = states["error"] + states["unwritten"]
        pruned = f"pruned {states['pruned']} · " if states["pruned"] else ""  # a search's ASHA stopped them
        line = (f"[{done}/{total}] ok {states['ok']} · diverged {states['diverged']} · {pruned}failed {failed} · "
                f"running {len(running)} · pending {max(total - done - len(running), 0)} · "
                f"elapsed {minutes(self.clock() - self.started)} · "
                f"eta {minutes(eta) if eta is not None else 'after the first epochs'}")
        if running:
            named = [f"{name} {self.epochs.get(trial_id, 0)}/{epochs} epochs" if epochs else name
                     for trial_id, epochs, name in running[:SHOWN_RUNNING]]
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


def members(trial) -> list[tuple[str, int | None, str]]:
    """(trial_id, epochs it reports or None, name to show) of each trial a Tune trial runs: a pack's members
    (sweep.packs), a probing subset's probes (sweep.probing: no epochs, a probe reports once, when done; they
    share the subset's short name), or its own."""
    config = trial.config["trial"]
    if "probes" in config:
        return [(p["trial_id"], None, f"{short_name(p['trial_id'])} {p['probe']} layer {p['layer']}")
                for p in config["probes"]]
    return [(m["trial_id"], m["finetune"]["epochs"], short_name(m["trial_id"]) + what_it_changes(m.get("row", {})))
            for m in config.get("pack", [config])]


def what_it_changes(row: dict) -> str:
    """What tells a trial from the others of its cell and index, which its id names only by a digest: a
    localized sweep's blocks, a heads sweep's heads, ... (` layer 3 head 5`; "" for an incremental trial, whose
    id names its k)."""
    parts = []
    if row.get("block_start") is not None:
        last = row["block_start"] + row["block_size"] - 1
        parts.append(f"{row.get('block_mode')} {row['block_start']}..{last}")  # as its table names it
    parts += [f"{name} {row[key]}" for key, name in (("layer", "layer"), ("head", "head")) if row.get(key) is not None]
    parts += [str(row[key]) for key in ("sublayer", "probe") if row.get(key) is not None]
    if row.get("parity") is not None:
        parts.append(f"{row['parity']} layers")
    if row.get("permutation_index") is not None:
        parts.append(f"order {row['permutation_index']}")
    if row.get("intermediate_task") is not None:
        parts.append(f"after {row['intermediate_task']}")
    if row.get("lr_multiplier") is not None:
        parts.append(f"lr x{row['lr_multiplier']:g}")
    return "".join(f" {p}" for p in parts)


def member_reports(trial, result: dict) -> list[tuple[str, int, dict, int]]:
    """(trial_id, epochs, latest report, rounds of training: 2 with an intermediate task) of each trial a Tune
    trial runs; a pack reports its members' under `pack_results` (trainables.tune_trainable.run_pack), a
    probing subset the probe each report is of (`row_id`), as one epoch of one: its work is done."""
    config = trial.config["trial"]
    if "probes" in config:
        return [(result["row_id"], 1, {"epoch": 1}, 1)] if result.get("row_id") else []
    by_id = pack_results(result) if "pack" in config else {config["trial_id"]: result}
    return [(m["trial_id"], m["finetune"]["epochs"], by_id.get(m["trial_id"], {}),
             2 if m["finetune"].get("intermediate_task") else 1) for m in config.get("pack", [config])]


# A search's studies (sweep.search) each run a Tuner in a Ray task of their own: the view lives in the driver, where
# the terminal is, and hears of their trials through a Ray queue.

RELAYED = ("epoch", "resumed_from_epoch")  # what the view reads of a single trial's report


class ProgressRelay(Callback):
    """A Tune callback (and a row writer's `progress`) in a process other than the driver's: hands what the view
    reads of each event to `queue` (a ray.util.queue.Queue), in order, for the driver's view (`follow`)."""

    def __init__(self, queue):
        self.queue = queue

    def send(self, *event) -> None:
        self.queue.put_nowait(event)

    def on_trial_start(self, iteration, trials, trial, **info):
        self.send("status", relayed_config(trial), "RUNNING")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.send("result", relayed_config(trial), {k: result[k] for k in RELAYED if k in result})

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.send("status", relayed_config(trial), "TERMINATED")

    def on_trial_error(self, iteration, trials, trial, **info):
        self.send("status", relayed_config(trial), "ERROR")

    def end(self, trial_id: str, status: str, metric, detail: str | None = None) -> None:
        self.send("end", trial_id, status, metric, detail)


def relayed_config(trial) -> dict:
    """What the view reads of a single trial's config (a search's trials are never packed)."""
    config = trial.config["trial"]
    return {"trial_id": config["trial_id"], "finetune": {k: config["finetune"].get(k)
                                                         for k in ("epochs", "intermediate_task")}}


class RelayedTrial:
    """A Tune trial of another process, as the driver's view sees it."""

    def __init__(self, config: dict, status: str = "PENDING"):
        self.config, self.status = {"trial": config}, status


def feed(view: ProgressView, events, trials: dict) -> None:
    """Give `view` the events a ProgressRelay sent; `trials`: the RelayedTrials so far, by trial_id."""
    for kind, *event in events:
        if kind == "end":
            view.end(*event)
            continue
        config, what = event
        trial = trials.setdefault(config["trial_id"], RelayedTrial(config))
        if kind == "status":
            trial.status = what
            view.see(list(trials.values()))
        else:
            view.on_trial_result(0, list(trials.values()), trial, what)


def follow(view: ProgressView, refs: list, queue, poll_s: float = 1.0) -> list:
    """Wait for the Ray tasks `refs` (a search's studies), showing on `view` what their ProgressRelays put on
    `queue` (at least every `poll_s` seconds); returns their results. A task's error is raised as it comes."""
    import ray

    trials: dict = {}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=poll_s)
            feed(view, queue.get_nowait_batch(queue.qsize()), trials)
            ray.get(done)
            view.on_step_end(0, list(trials.values()))
        feed(view, queue.get_nowait_batch(queue.qsize()), trials)  # a task's events are queued before it returns
    finally:
        view.on_experiment_end(list(trials.values()))
    return ray.get(refs)
