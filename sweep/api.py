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

from sweep.config import Refused, Sweep, options_of, read_config, resolve
from sweep.experiments import TASK_FILE_DEFAULTS


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


def with_settings(sweep: Sweep, *, config: str | Path | None = None, preset: str | None = None,
                  **settings) -> Sweep:
    """A resolved Sweep with `settings` over its own, read as `--config <its sweep.yaml>` reads its options (an
    unchanged Sweep when none are given)."""
    if config is not None:
        raise Refused([f"config: give a config file or a resolved Sweep, not both (given {config})"])
    if not settings and preset is None:
        return sweep
    own = {k: v for k, v in sweep.settings().items() if k not in ("experiment", "preset")}
    # what to do this time is not a setting the resolved config holds: a dry run stays one
    own.update((o.name, getattr(sweep, o.name)) for o in options_of(sweep.experiment)
               if not o.saved and o not in TASK_FILE_DEFAULTS)
    return resolve(sweep.experiment, {**own, **settings}, preset or sweep.preset)


def run(experiment: str | Sweep | None = None, /, *, config: str | Path | None = None, preset: str | None = None,
        callbacks=(), **settings) -> Outcome:
    """Run a sweep (what is not done yet) and return its rows and Tune's results."""
    from sweep.cli import execute, quiet_console

    quiet_console()
    if isinstance(experiment, Sweep):
        sweep = with_settings(experiment, config=config, preset=preset, **settings)
    else:
        sweep = configure(experiment, config=config, preset=preset, **settings)
    rows, results, _ = execute(sweep, callbacks=callbacks)
    return Outcome(rows, results, sweep)
