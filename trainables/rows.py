"""A trial's result row, made in one place for every trainable, and how it travels to the driver.

A trainable (finetuning, a fused pack, probing) makes the row of each trial it finishes, where the trial ran,
and hands it to Tune inside its report as `ENDED_ROWS`; the sweep's driver only lands the rows it is handed
(sweep.runner.RowWriter). Per-epoch reports carry figures and no row and no status, so nothing in them can
be taken for the end of a trial: a stale report (a retried or restarted trial, a late callback) never lands.
The driver makes only non-final rows itself (an `error` row for a trial that failed before it ended; a
search's `pruned` row for a trial its scheduler stopped) with the same `make_row`.
"""
from __future__ import annotations

import json
import platform
import time

from trialrows.schema import RESULT, ROLES

FINAL = ("ok", "diverged", "pruned")  # a landed row with one of these is final: nothing replaces it
ENDED_ROWS = "ended_rows"  # the report key holding the rows of the trials that ended with this report

# What a trial's figures contribute to its row besides every `dev_*` metric: the columns trialrows.schema
# declares as results, read there (a column declared in one place and filtered out here was once lost from
# every row). Tune's own bookkeeping in a report stays out.
RESULT_COLUMNS = frozenset(name for name, role in ROLES.items() if role == RESULT)


def library_versions() -> dict:
    import ray
    import torch
    import transformers

    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "ray_version": ray.__version__,
        "python_version": platform.python_version(),
    }


def where_it_runs() -> dict:
    """`host` and `node_id` of this process: called by a trainable, the node the trial trains on (the
    driver's hostname would name the head node for every row of a fleet)."""
    node_id = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # no Ray (a trial run by hand): the host alone says where
        pass
    return {"host": platform.node(), "node_id": node_id}


def result_fields(figures: dict) -> dict:
    return {k: v for k, v in figures.items() if k in RESULT_COLUMNS or k.startswith("dev_")}


def make_row(planned: dict, figures: dict, status: str, error: str | None = None, **columns) -> dict:
    """A trial's row: its planned identity row (TrialSpec.row()), what its figures measured, the caller's own
    `columns`, the library versions, its status and when it ended."""
    row = {**planned, **result_fields(figures), **columns, **library_versions()}
    row.update(status=status, error=error, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return row


def with_ended(report: dict, rows: list[dict]) -> dict:
    """`report` carrying the rows of the trials that ended with it (JSON: Tune's loggers skip a string, where
    a nested row would become a TensorBoard curve per column)."""
    return {**report, ENDED_ROWS: json.dumps(rows, default=_plain)} if rows else report


def ended_rows(result: dict | None) -> list[dict]:
    """The rows a report carries (none for a per-epoch report)."""
    payload = (result or {}).get(ENDED_ROWS)
    return json.loads(payload) if payload else []


def _plain(value):
    """numpy scalars and arrays as JSON values (a float's NaN and infinities JSON carries as such)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a row value")
