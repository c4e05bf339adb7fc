"""The experiment registry: an experiment's name maps to a function that builds its grid of trials."""
from __future__ import annotations

import dataclasses
from typing import Callable

from sweep.grid import TrialSpec
from trainables.ablations import Reinit
from trainables.finetune import default_epochs


@dataclasses.dataclass(frozen=True)
class GridSettings:
    """What a user chose on the command line (after presets), independent of any experiment."""

    model: str
    tasks: tuple[str, ...]
    sizes: tuple[int, ...]
    trials: tuple[tuple[int, int], ...]  # (train size, trials at that size); size 0 = every other size
    data_dir: str | None = None  # a local GLUE folder; None: the hub (the synthetic task is built in)
    k: tuple[int, ...] | None = None  # None: 0..L
    skip: frozenset = frozenset()  # (task, size) cells left out, as the paper left out CoLA at 50k
    epochs: int | None = None  # None: the paper's rule by subset size
    lr: float = 2e-5
    batch_size: int = 8
    max_length: int = 128
    weight_decay: float = 0.0
    lr_schedule: str = "linear"
    reinit_mode: str = "intended"
    reinit_pooler: bool = False
    seed: int = 0  # base of every trial's seeds

    def trials_for(self, size: int) -> int:
        counts = dict(self.trials)
        return counts.get(size, counts.get(0, 0))

    def source_for(self, task: str) -> str:
        # The kind of source, not the folder, is part of a trial's identity: moving the data keeps ids.
        return "synthetic" if task == "synthetic" else ("local" if self.data_dir else "hub")

    def cells(self):
        """(task, size, trial_index) in a stable order."""
        for task in self.tasks:
            for size in self.sizes:
                if (task, size) in self.skip:
                    continue
                for trial_index in range(self.trials_for(size)):
                    yield task, size, trial_index


def trial(settings: GridSettings, experiment: str, task: str, size: int, trial_index: int, ablation, **extra):
    """A trial with the settings' common fields; the trial index alone sets both seeds, so every condition
    of one index trains on the same subset with the same head and batch order (a paired design)."""
    return TrialSpec(
        experiment=experiment,
        task=task,
        model=settings.model,
        data_source=settings.source_for(task),
        train_size=size,
        trial_index=trial_index,
        subset_seed=settings.seed + trial_index,
        seed=settings.seed + trial_index,
        ablation=ablation,
        epochs=settings.epochs or default_epochs(size),
        lr=settings.lr,
        batch_size=settings.batch_size,
        max_length=settings.max_length,
        weight_decay=settings.weight_decay,
        lr_schedule=settings.lr_schedule,
        **extra,
    )


def incremental(settings: GridSettings, num_layers: int) -> list[TrialSpec]:
    """Keep layers 1..k pretrained, reinitialize the rest, for every k (paper section 4.1)."""
    ks = settings.k if settings.k is not None else tuple(range(num_layers + 1))
    options = dict(mode=settings.reinit_mode, reinit_pooler=settings.reinit_pooler)
    return [
        trial(settings, "incremental", task, size, t, Reinit.incremental(k, num_layers, **options), k=k)
        for task, size, t in settings.cells()
        for k in ks
    ]


EXPERIMENTS: dict[str, Callable[[GridSettings, int], list[TrialSpec]]] = {
    "incremental": incremental,
}
