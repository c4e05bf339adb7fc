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

from trialrows.declare import arrow_type
from trialrows.experiments import COLUMN_OWNERS, NEW_COLUMNS
from trialrows.recipe import RECIPE, Recipe

SETTING, REPLICATE, RESULT = "setting", "replicate", "result"

_INT, _FLOAT, _STR, _BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()
_INTS, _FLOATS, _STRS = pa.list_(pa.int64()), pa.list_(pa.float64()), pa.list_(pa.string())



def _recipe_columns(identity: bool) -> tuple:
    """The training settings' columns, typed and placed by their declaration: a setting that changes no number
    (identity=False) is a result, how the trial ran."""
    return tuple((o.name, pa.type_for_alias(arrow_type(Recipe, o.name)), SETTING if identity else RESULT)
                 for o in RECIPE if o.identity == identity)


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
    *_recipe_columns(identity=True),  # epochs, lr, batch_size, max_length, ... (trialrows.recipe)
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
    ("task_metric", _STR, SETTING),  # its --metric, where given: another headline metric is another condition
    # Hashes of the data and the weights the trial read: rows of changed data or weights are other conditions.
    # Null in rows written before fingerprints existed (trialrows.summaries.groupable pools those with the
    # one fingerprint their task or model has, if it has only one).
    ("data_fingerprint", _STR, SETTING),
    ("model_fingerprint", _STR, SETTING),
    # Which repeat of the condition.
    ("trial_index", _INT, REPLICATE),
    ("subset_seed", _INT, REPLICATE),
    ("seed", _INT, REPLICATE),
    ("permutation_index", _INT, REPLICATE),
    ("permutation_seed", _INT, REPLICATE),
    ("cell", _STR, REPLICATE),
    ("sample", _INT, REPLICATE),
    ("search_seed", _INT, REPLICATE),
    ("settings_id", _STR, REPLICATE),  # the trial id without fingerprints: the same trial on other data shares it
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
    # What a model that learned nothing scores (trainables.metrics.chance_figures): the best constant
    # prediction's headline metric, and 1.0 where this trial's dev predictions were one constant.
    ("dev_chance_metric", _FLOAT, RESULT),
    ("dev_constant_prediction", _FLOAT, RESULT),
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
    *_recipe_columns(identity=False),  # eval_every
    # How its sweep planned it: a precision target (trialrows.precision.PLAN_COLUMNS). Never a setting: trial
    # index i is the same trial whatever the target, so a fixed-count and a targeted sweep share their rows.
    ("target_ci", _FLOAT, RESULT),
    ("target_on", _STR, RESULT),
    ("pilot_trials", _INT, RESULT),
    ("max_trials", _INT, RESULT),
    ("pack_size", _INT, RESULT),
    # It trained with CUDA graphs on (the default on GPUs; REINIT_SWEEP_CUDA_GRAPHS=0 turns them off): its learning rates were read from a
    # float32 table on the device, so its numbers differ from op by op's by that rounding.
    ("cuda_graphs", _BOOL, RESULT),
    # Its pack's update and dropout masks ran as trainables.triton_kernels' kernels (the default on GPUs;
    # REINIT_SWEEP_TRITON=0 turns them off): within an ulp of torch's ops a step, which training can grow.
    ("triton_kernels", _BOOL, RESULT),
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
    ("host", _STR, RESULT),  # the node the trial trained on (recorded by the trainable, not the driver)
    ("node_id", _STR, RESULT),  # Ray's id of that node
    ("torch_version", _STR, RESULT),
    ("transformers_version", _STR, RESULT),
    ("ray_version", _STR, RESULT),
    ("python_version", _STR, RESULT),
    ("finished_at", _STR, RESULT),  # ISO 8601 with its UTC offset; compared as timestamps (results.prepare)
)

_BASE = {name for name, _, _ in COLUMNS}
for _name, _ in NEW_COLUMNS:  # an experiment may not declare a column again at another type
    if _name in _BASE:
        raise ValueError(f"row column '{_name}' is declared by trialrows.schema already; experiment "
                         f"'{COLUMN_OWNERS.get(_name, '?')}' declares it again: write it without declaring it")
# The columns of experiments added since, each declared in its own trialrows.experiments entry.
COLUMNS += tuple((name, pa.type_for_alias(kind), SETTING) for name, kind in NEW_COLUMNS)
# A name held twice (a column listed twice above, a recipe field named like a column) makes a schema no file can
# be read with: every row file of a store would be set aside as damaged.
_NAMES = [name for name, _, _ in COLUMNS]
for _name in dict.fromkeys(n for n in _NAMES if _NAMES.count(n) > 1):
    raise ValueError(f"row column '{_name}' is declared twice in trialrows.schema; declare it once")
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
