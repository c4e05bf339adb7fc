"""One trial of a sweep as a value: its identity, its id, and the config dict Ray Tune carries."""
from __future__ import annotations

import dataclasses
import hashlib
import json

from trainables.ablations import Reinit, ablation_to_dict


@dataclasses.dataclass(frozen=True)
class TrialSpec:
    experiment: str
    task: str
    model: str
    data_source: str
    train_size: int
    trial_index: int
    subset_seed: int
    seed: int
    ablation: Reinit
    epochs: int
    lr: float
    batch_size: int
    max_length: int
    weight_decay: float
    lr_schedule: str
    max_grad_norm: float = 1.0  # 0: no clipping
    precision: str = "fp32"
    recipe_version: int = 2  # trainables.finetune.RECIPE_VERSION: trials of another recipe are other trials
    eval_every: int = 0  # how often the dev split is evaluated: changes no number a trial computes, so no identity
    k: int | None = None  # incremental experiments: layers 1..k kept
    # Fields added after the first sweeps ran: they join a trial's identity only when set, so the ids of
    # trials that do not use them stay what they were.
    lr_multiplier: float | None = None  # reinit-lr: the reinitialized layers' lr over the base lr
    intermediate_task: str | None = None  # sequential: finetuned on this task before `task`
    own_columns: tuple[tuple[str, object], ...] = ()  # the experiment's own row columns (block_mode, head, ...)
    # Fields its rows carry even where unset (sequential's intermediate_task: null is direct finetuning);
    # implied by the experiment, so no identity.
    row_fields: tuple[str, ...] = ()
    # How the sweep planned it (a precision target: target_ci, ...): row columns only, so no identity.
    plan_columns: tuple[tuple[str, object], ...] = ()

    def identity(self) -> dict:
        """Every field that changes what the trial computes; two specs with the same identity are the same
        trial, so a rerun can recognise it as done."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in NOT_IDENTITY}
        for name in OPTIONAL_IDENTITY:
            if fields[name] in (None, ()):
                del fields[name]
        if "own_columns" in fields:  # hashed under the field's first name, "labels", so that no trial id changed
            fields["labels"] = {key: list(v) if isinstance(v, tuple) else v for key, v in fields.pop("own_columns")}
        return {**fields, "ablation": ablation_to_dict(self.ablation)}

    @property
    def trial_id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:10]
        k = "" if self.k is None else f"-k{self.k}"
        return f"{self.experiment}-{self.task}-n{self.train_size}{k}-t{self.trial_index}-{digest}"

    def row(self) -> dict:
        """The identity columns of this trial's Parquet row."""
        row = {
            "trial_id": self.trial_id,
            "experiment": self.experiment,
            "task": self.task,
            "model": self.model,
            "data_source": self.data_source,
            "train_size": self.train_size,
            "trial_index": self.trial_index,
            "subset_seed": self.subset_seed,
            "seed": self.seed,
            "k": self.k,
            **self.ablation.columns(),  # reinit_layers, reinit_mode, keep_layernorm, reinit_pooler, ...
            "epochs": self.epochs,
            "lr": self.lr,
            "batch_size": self.batch_size,
            "max_length": self.max_length,
            "weight_decay": self.weight_decay,
            "lr_schedule": self.lr_schedule,
            "max_grad_norm": self.max_grad_norm,
            "precision": self.precision,
            "recipe_version": self.recipe_version,
            "eval_every": self.eval_every,
        }
        if self.lr_multiplier is not None:
            row["lr_multiplier"] = self.lr_multiplier
        row.update((name, getattr(self, name)) for name in self.row_fields)
        row.update((key, list(v) if isinstance(v, tuple) else v) for key, v in self.own_columns)
        row.update(self.plan_columns)
        return row

    def to_config(self) -> dict:
        config = {
            "trial_id": self.trial_id,
            "data_key": data_key(self.task, self.max_length),
            "intermediate_data_key": (
                data_key(self.intermediate_task, self.max_length) if self.intermediate_task else None
            ),
            "model_key": self.model,
            "finetune": {
                "task": self.task,
                "train_size": self.train_size,
                "subset_seed": self.subset_seed,
                "seed": self.seed,
                "epochs": self.epochs,
                "lr": self.lr,
                "batch_size": self.batch_size,
                "weight_decay": self.weight_decay,
                "lr_schedule": self.lr_schedule,
                "max_grad_norm": self.max_grad_norm,
                "eval_every": self.eval_every,
                "precision": self.precision,
            },
            "ablation": ablation_to_dict(self.ablation),
            "row": self.row(),
        }
        if self.lr_multiplier is not None:
            config["finetune"]["lr_multiplier"] = self.lr_multiplier
        if self.intermediate_task is not None:
            config["finetune"]["intermediate_task"] = self.intermediate_task
        return config

    @property
    def tasks(self) -> tuple[str, ...]:
        """Every task this trial trains or evaluates on."""
        return (self.task,) if self.intermediate_task is None else (self.intermediate_task, self.task)


OPTIONAL_IDENTITY = ("lr_multiplier", "intermediate_task", "own_columns")
# The ablation joins as its dict; eval_every changes no number; row_fields only shows fields; plan_columns say
# how a sweep chose the trial, not what it computes.
NOT_IDENTITY = ("ablation", "eval_every", "row_fields", "plan_columns")


def data_key(task: str, max_length: int) -> str:
    return f"{task}@{max_length}"
