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
    k: int | None = None  # incremental experiments: layers 1..k kept

    def identity(self) -> dict:
        """Every field that changes what the trial computes; two specs with the same identity are the same
        trial, so a rerun can recognise it as done."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "ablation"}
        return {**fields, "ablation": ablation_to_dict(self.ablation)}

    @property
    def trial_id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:10]
        k = "" if self.k is None else f"-k{self.k}"
        return f"{self.experiment}-{self.task}-n{self.train_size}{k}-t{self.trial_index}-{digest}"

    def row(self) -> dict:
        """The identity columns of this trial's Parquet row."""
        ablation = self.ablation
        return {
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
            "reinit_layers": list(ablation.layers),
            "reinit_mode": ablation.mode,
            "keep_layernorm": ablation.keep_layernorm,
            "reinit_pooler": ablation.reinit_pooler,
            "epochs": self.epochs,
            "lr": self.lr,
            "batch_size": self.batch_size,
            "max_length": self.max_length,
            "weight_decay": self.weight_decay,
            "lr_schedule": self.lr_schedule,
        }

    def to_config(self) -> dict:
        return {
            "trial_id": self.trial_id,
            "data_key": data_key(self.task, self.max_length),
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
            },
            "ablation": ablation_to_dict(self.ablation),
            "row": self.row(),
        }


def data_key(task: str, max_length: int) -> str:
    return f"{task}@{max_length}"
