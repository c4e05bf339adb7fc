"""One trial of a sweep as a value: its identity, its id, and the config dict Ray Tune carries."""
from __future__ import annotations

import dataclasses
import hashlib
import json

from trainables.ablations import Reinit, ablation_to_dict
from trialrows.recipe import NOT_IDENTITY as RECIPE_NOT_IDENTITY
from trialrows.recipe import Recipe


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrialSpec(Recipe):
    """A trial: its recipe (every training setting, declared in trialrows.recipe) and what else defines it."""

    experiment: str
    task: str
    model: str
    data_source: str
    train_size: int
    trial_index: int
    subset_seed: int
    seed: int
    ablation: Reinit
    recipe_version: int = 2  # trialrows.recipe.recipe_version: trials of another recipe are other trials
    k: int | None = None  # incremental experiments: layers 1..k kept
    # Fields added after the first sweeps ran: they join a trial's identity only when set, so the ids of
    # trials that do not use them stay what they were.
    lr_multiplier: float | None = None  # reinit-lr: the reinitialized layers' lr over the base lr
    intermediate_task: str | None = None  # sequential: finetuned on this task before `task`
    own_columns: tuple[tuple[str, object], ...] = ()  # the experiment's own row columns (block_mode, head, ...)
    # What the trial reads: a hash of its task's data (both tasks' for sequential finetuning) and of the
    # model's weights (trainables.tasks.data_fingerprint, trainables.models.weights_fingerprint). Changed data
    # or weights make other trials, never "already done" ones. None: not known (a dry run), or a trial that
    # continues rows written before fingerprints existed (sweep.fingerprints).
    data_fingerprint: str | None = None
    model_fingerprint: str | None = None
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

    @property
    def settings_id(self) -> str:
        """The trial id its settings alone give, without the fingerprints: the id this trial had before
        fingerprints existed, shared by its runs on other data or weights."""
        return dataclasses.replace(self, data_fingerprint=None, model_fingerprint=None).trial_id

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
            **self.recipe(),  # epochs, lr, batch_size, max_length, ... (trialrows.recipe)
            "recipe_version": self.recipe_version,
        }
        if self.lr_multiplier is not None:
            row["lr_multiplier"] = self.lr_multiplier
        if self.data_fingerprint is not None or self.model_fingerprint is not None:
            row.update(settings_id=self.settings_id, data_fingerprint=self.data_fingerprint,
                       model_fingerprint=self.model_fingerprint)
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
            "finetune": {  # trainables.finetune.FinetuneConfig's fields
                "task": self.task,
                "train_size": self.train_size,
                "subset_seed": self.subset_seed,
                "seed": self.seed,
                **self.recipe(),
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


OPTIONAL_IDENTITY = ("lr_multiplier", "intermediate_task", "own_columns", "data_fingerprint", "model_fingerprint")
# The ablation joins as its dict; row_fields only shows fields; plan_columns say how a sweep chose the trial, not
# what it computes; the recipe's settings that change no number (eval_every) are declared so there.
NOT_IDENTITY = ("ablation", "row_fields", "plan_columns", *RECIPE_NOT_IDENTITY)


def data_key(task: str, max_length: int) -> str:
    return f"{task}@{max_length}"
