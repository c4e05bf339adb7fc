"""The Python API: the same sweep as the command line, from a notebook or a script.

    from sweep import run
    rows, results, sweep = run("incremental", model="minilm", tasks=["sst2"], data_dir="../shared/data/glue",
                               sizes=[500], k=[0, 3, 6], trials=3)
    rows, results, _ = run(config="sweep.yaml", lr=1e-4)          # a config file, with overrides

Settings are the command line's, by name (`max_grad_norm=0.5`, `task_files=["own=./data,text=review"]`),
values as a config file holds them; presets and declared defaults fill the rest, exactly as on the command
line. `callbacks` are Ray Tune callbacks added to the sweep's own (a `tune.Callback`, Ray's
`WandbLoggerCallback`, ...). A request that cannot run raises `Refused` (a ValueError) naming every problem.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from sweep.config import Refused, Sweep, read_config, resolve


class Outcome(NamedTuple):
    rows: object  # pandas.DataFrame: the grid's rows in the store (a dry run: the planned rows)
    results: object  # what the experiment's runner returned: Tune's ResultGrid; None when nothing ran
    sweep: Sweep  # the value that ran, resolved


def configure(experiment: str | None = None, *, config: str | Path | None = None, preset: str | None = None,
              **settings) -> Sweep:
    """The resolved Sweep for an experiment's settings (and a config file's, which `settings` override)."""
    given = {}
    if config is not None:
        named, file_preset, given = read_config(config)
        if experiment is not None and named is not None and named != experiment:
            raise Refused([f"config: {config} is a '{named}' sweep, not '{experiment}'"])
        experiment, preset = experiment or named, preset or file_preset
    if experiment is None:
        raise Refused(["experiment: name one (run('incremental', ...)) or give a config file that does"])
    return resolve(experiment, {**given, **settings}, preset)


def run(experiment: str | Sweep | None = None, /, *, config: str | Path | None = None, preset: str | None = None,
        callbacks=(), **settings) -> Outcome:
    """Run a sweep (what is not done yet) and return its rows and Tune's results."""
    from sweep.cli import execute, quiet_console

    quiet_console()
    sweep = experiment if isinstance(experiment, Sweep) else configure(experiment, config=config, preset=preset,
                                                                       **settings)
    rows, results, _ = execute(sweep, callbacks=callbacks)
    return Outcome(rows, results, sweep)
