"""The one declaration of the results rows: every column's Arrow type and its role.

Every row file is written with exactly `SCHEMA` (a column a row does not set is null), so any Parquet reader
(`pandas.read_parquet(folder)`, `pyarrow.dataset`, DuckDB's `read_parquet('folder/*.parquet')`) opens a
store whatever file it meets first: a k = L row (empty `reinit_layers`), an error row, a probing row.

A column's role says what the analysis does with it:

- `setting`: it changes what a trial computes (the row form of `TrialSpec.identity()`; a test checks that
  every identity field of every experiment is one). Two rows are the same *condition* when every setting is
  equal; so a new option can never be merged silently, a column this file does not declare counts as a
  setting too.
- `replicate`: it tells the repeats of one condition apart (trial index, the seeds it draws, which
  permutation or search sample); never part of a condition.
- `result`: what the trial measured, and where and when (never part of a condition).
"""
from __future__ import annotations

import pyarrow as pa

from trialrows.experiments import VIEWS

SETTING, REPLICATE, RESULT = "setting", "replicate", "result"

_INT, _FLOAT, _STR, _BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()
_INTS, _FLOATS, _STRS = pa.list_(pa.int64()), pa.list_(pa.float64()), pa.list_(pa.string())

# (column, Arrow type, role), in the order the files hold them.
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("trial_id", _STR, REPLICATE),
    # What the trial is: the fields of TrialSpec.identity() as row columns.
    ("experiment", _STR, SETTING),
    ("task", _STR, SETTING),
    ("model", _STR, SETTING),
    ("data_source", _STR, SETTING),
    ("train_size", _INT, SETTING),
    ("train_fraction", _FLOAT, SETTING),
    ("k", _INT, SETTING),
    ("reinit_layers", _INTS, SETTING),
    ("reinit_mode", _STR, SETTING),
    ("keep_layernorm", _BOOL, SETTING),
    ("reinit_pooler", _BOOL, SETTING),
    ("epochs", _INT, SETTING),
    ("lr", _FLOAT, SETTING),
    ("batch_size", _INT, SETTING),
    ("max_length", _INT, SETTING),
    ("weight_decay", _FLOAT, SETTING),
    ("lr_schedule", _STR, SETTING),
    ("max_grad_norm", _FLOAT, SETTING),
    ("precision", _STR, SETTING),
    ("recipe_version", _INT, SETTING),
    ("lr_multiplier", _FLOAT, SETTING),
    ("intermediate_task", _STR, SETTING),
    ("block_mode", _STR, SETTING),
    ("block_start", _INT, SETTING),
    ("block_size", _INT, SETTING),
    ("layer", _INT, SETTING),
    ("head", _INT, SETTING),
    ("permutation", _INTS, SETTING),  # a permutation is its layer order
    ("probe", _STR, SETTING),
    ("patience", _INT, SETTING),
    ("val_fraction", _FLOAT, SETTING),
    ("group", _STR, SETTING),
    ("multiplier_low", _FLOAT, SETTING),
    ("multiplier_high", _FLOAT, SETTING),
    ("multipliers", _FLOATS, SETTING),
    ("text_columns", _STRS, SETTING),  # a --task-file's definition: known when planned, part of the identity
    ("label_column", _STR, SETTING),
    # Which repeat of the condition.
    ("trial_index", _INT, REPLICATE),
    ("subset_seed", _INT, REPLICATE),
    ("seed", _INT, REPLICATE),
    ("permutation_index", _INT, REPLICATE),
    ("permutation_seed", _INT, REPLICATE),
    ("cell", _STR, REPLICATE),
    ("sample", _INT, REPLICATE),
    ("search_seed", _INT, REPLICATE),
    # What it measured.
    ("status", _STR, RESULT),
    ("error", _STR, RESULT),
    ("metric_name", _STR, RESULT),
    ("dev_metric", _FLOAT, RESULT),
    ("dev_metrics_by_epoch", _FLOATS, RESULT),
    ("dev_epochs", _INTS, RESULT),  # the epochs dev_metrics_by_epoch was evaluated at (--eval-every)
    ("dev_accuracy", _FLOAT, RESULT),
    ("dev_f1", _FLOAT, RESULT),
    ("dev_matthews_correlation", _FLOAT, RESULT),
    ("dev_pearson", _FLOAT, RESULT),
    ("dev_spearman", _FLOAT, RESULT),
    ("dev_macro_f1", _FLOAT, RESULT),
    ("dev_exact", _FLOAT, RESULT),
    ("dev_has_ans_exact", _FLOAT, RESULT),
    ("dev_has_ans_f1", _FLOAT, RESULT),
    ("dev_no_ans_exact", _FLOAT, RESULT),
    ("dev_no_ans_f1", _FLOAT, RESULT),
    ("train_loss", _FLOAT, RESULT),
    ("lr_last", _FLOAT, RESULT),
    ("clipped_steps", _INT, RESULT),
    ("weight_distance", _FLOATS, RESULT),
    ("intermediate_weight_distance", _FLOATS, RESULT),
    ("resumed_from_epoch", _INT, RESULT),
    ("stop_epoch", _INT, RESULT),
    ("best_epoch", _INT, RESULT),
    ("val_metric", _FLOAT, RESULT),
    ("val_loss", _FLOAT, RESULT),
    ("val_losses", _FLOATS, RESULT),
    ("fit_size", _INT, RESULT),
    ("val_size", _INT, RESULT),
    ("group_rows", _INT, RESULT),
    ("dev_features_reused", _BOOL, RESULT),
    ("val_objective", _FLOAT, RESULT),
    ("val_metrics_by_epoch", _FLOATS, RESULT),
    ("epochs_run", _INT, RESULT),
    ("layer_lrs", _FLOATS, RESULT),
    # What the model and task files turned out to hold: implied by the settings model, task, data_source and
    # the task's columns, and only known once a trial reported; a trial that failed before its first report
    # has none, so as settings they would split it off into a condition of its own.
    ("model_type", _STR, RESULT),
    ("label_names", _STRS, RESULT),
    ("task_file", _STR, RESULT),
    # How it ran: changes no number.
    ("eval_every", _INT, RESULT),
    # How its sweep planned it: a precision target (trialrows.precision.PLAN_COLUMNS). Never a setting: trial
    # index i is the same trial whatever the target, so a fixed-count and a targeted sweep share their rows.
    ("target_ci", _FLOAT, RESULT),
    ("target_on", _STR, RESULT),
    ("pilot_trials", _INT, RESULT),
    ("max_trials", _INT, RESULT),
    ("pack_size", _INT, RESULT),
    ("pack_id", _STR, RESULT),
    ("train_seconds", _FLOAT, RESULT),
    ("eval_seconds", _FLOAT, RESULT),
    ("wall_seconds", _FLOAT, RESULT),
    ("feature_seconds", _FLOAT, RESULT),
    ("feature_flops", _FLOAT, RESULT),
    ("model_flops", _FLOAT, RESULT),
    ("mfu", _FLOAT, RESULT),
    ("peak_flops", _FLOAT, RESULT),
    ("peak_flops_source", _STR, RESULT),
    ("device", _STR, RESULT),
    ("torch_threads", _INT, RESULT),
    ("host", _STR, RESULT),
    ("torch_version", _STR, RESULT),
    ("transformers_version", _STR, RESULT),
    ("ray_version", _STR, RESULT),
    ("python_version", _STR, RESULT),
    ("finished_at", _STR, RESULT),  # ISO 8601 with its UTC offset; compared as timestamps (results.prepare)
)

# The columns of experiments added since, each declared in its own trialrows.experiments entry.
COLUMNS += tuple((name, pa.type_for_alias(kind), SETTING) for view in VIEWS.values() for name, kind in view.new_columns)
SCHEMA = pa.schema([pa.field(name, kind) for name, kind, _ in COLUMNS])
ROLES = {name: role for name, _, role in COLUMNS}


def role(column: str) -> str:
    """A column's role; an undeclared `dev_*` column is a result, any other undeclared one a setting."""
    if column in ROLES:
        return ROLES[column]
    return RESULT if column.startswith("dev_") else SETTING


def settings(columns) -> list[str]:
    """The setting columns among `columns`, in their order."""
    return [c for c in columns if role(c) == SETTING]


def undeclared(columns) -> list[str]:
    return [c for c in columns if c not in ROLES]


def rows_table(rows: list[dict]) -> pa.Table:
    """Rows as one Arrow table with every declared column at its declared type (null where unset), then
    any undeclared column a row carries, typed as pyarrow infers it (a `dev_*` metric as float64)."""
    extra = list(dict.fromkeys(c for row in rows for c in row if c not in ROLES))
    fields = list(SCHEMA)
    for column in extra:
        values = [row.get(column) for row in rows]
        fields.append(pa.field(column, _FLOAT if column.startswith("dev_") else pa.array(values).type))
    schema = pa.schema(fields)
    return pa.Table.from_pylist([{c: row.get(c) for c in schema.names} for row in rows], schema=schema)
