"""What a trial reads is part of what it is: fingerprints of each task's data and of the model's weights join
every trial's identity (sweep.grid.TrialSpec), so a rerun after a task file was edited, a hub dataset got a
new revision or a model folder's weights changed runs those trials as new ones, and says so in one line,
instead of counting the old rows as done.

Stores written before fingerprints existed keep working: a trial whose settings match a row without
fingerprints continues that row's identity (its id as it was; its data and weights unchecked), and
`python -m sweep status` counts such rows.
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from sweep.grid import TrialSpec

FINGERPRINTS = ("data_fingerprint", "model_fingerprint")


def with_fingerprints(settings, raw: dict, pretrained, stored: pd.DataFrame | None = None):
    """`settings` with the fingerprints of the loaded tasks (`raw`: name -> TaskData) and weights. A task whose
    rows in `stored` carry the fingerprint its data had under the earlier formula keeps that one: those rows stay
    done, and the trials still to run stay one condition with them."""
    from trainables.models import weights_fingerprint
    from trainables.tasks import data_fingerprint, legacy_data_fingerprint

    recorded = set()
    if stored is not None and "data_fingerprint" in stored.columns:
        recorded = {part for value in stored["data_fingerprint"].dropna().unique() for part in value.split("+")}

    def fingerprint(data) -> str:
        now = data_fingerprint(data)
        if now in recorded or not recorded:
            return now
        legacy = legacy_data_fingerprint(data)
        return legacy if legacy in recorded else now

    return dataclasses.replace(settings, data_fingerprints=tuple((t, fingerprint(d)) for t, d in raw.items()),
                               model_fingerprint=weights_fingerprint(pretrained))


def reconcile(specs: list[TrialSpec], stored: pd.DataFrame) -> tuple[list[TrialSpec], list[str]]:
    """The specs as this sweep runs them, against the rows its store holds (`stored`: trial_id, cell,
    settings_id and the fingerprint columns), and one line for each thing the user must know:
    - a spec whose settings match a row written before fingerprints continues that row's identity;
    - rows of the same settings with other fingerprints mean changed data or weights: the spec is a new trial,
      and the line says what changed."""
    if stored.empty:
        return specs, []
    for column in ("cell", "settings_id", *FINGERPRINTS):
        if column not in stored.columns:
            stored = stored.assign(**{column: None})
    unchecked = stored[stored["data_fingerprint"].isna() & stored["model_fingerprint"].isna()]
    old_ids = set(unchecked["trial_id"]) | set(unchecked["cell"].dropna())
    checked = stored[stored["settings_id"].notna()]
    by_settings = checked.groupby("settings_id")[list(FINGERPRINTS)].first().to_dict("index")
    stored_ids = set(stored["trial_id"])
    changed: dict[tuple[str, str], list] = {}
    result = []
    for spec in specs:
        if spec.data_fingerprint is None and spec.model_fingerprint is None:
            result.append(spec)
            continue
        if spec.settings_id in old_ids:
            result.append(dataclasses.replace(spec, data_fingerprint=None, model_fingerprint=None))
            continue
        before = by_settings.get(spec.settings_id)
        if before is not None and spec.trial_id not in stored_ids:
            if before["data_fingerprint"] != spec.data_fingerprint:
                changed.setdefault(("data of " + "+".join(spec.tasks), before["data_fingerprint"],
                                    spec.data_fingerprint), []).append(spec)
            if before["model_fingerprint"] != spec.model_fingerprint:
                changed.setdefault((f"weights of {spec.model}", before["model_fingerprint"],
                                    spec.model_fingerprint), []).append(spec)
        result.append(spec)
    lines = [f"the {what} changed since this sweep's rows of {len(found)} of these trials were written (fingerprint "
             f"{old} -> {new}): they run again as new trials; the old rows stay, as other conditions"
             for (what, old, new), found in changed.items()]
    kept = sum(1 for before, after in zip(specs, result) if before is not after)
    if kept:
        lines.append(f"{kept} trials continue rows written before fingerprints: their data and weights are not "
                     "checked (`python -m sweep status` counts such rows)")
    return result, lines


def stored_fingerprints(folder) -> pd.DataFrame:
    """The columns `reconcile` reads, of every row under `folder` (none when it holds no rows yet)."""
    import pyarrow.fs

    from sweep.store import filesystem
    from trialrows.read import read_results

    fs, path = filesystem(folder)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
        return pd.DataFrame(columns=["trial_id", "cell", "settings_id", *FINGERPRINTS])
    return read_results(folder, columns=["trial_id", "cell", "settings_id", *FINGERPRINTS])
