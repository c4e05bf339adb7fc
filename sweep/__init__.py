"""reinit-sweep: partial-reinitialization sweeps on Ray Tune. `from sweep import run` runs one from Python
(sweep.api); `python -m sweep` or `reinit-sweep` from the command line (sweep.cli)."""


def __getattr__(name: str):  # the API on first use: `import sweep.store` stays light
    if name in ("run", "configure", "Outcome"):
        from sweep import api

        return getattr(api, name)
    if name in ("Sweep", "Refused"):
        from sweep import config

        return getattr(config, name)
    raise AttributeError(name)
