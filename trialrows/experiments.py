"""What each experiment's rows hold, in one entry per experiment: the columns that tell its
conditions apart, whether its rows finetune the pretrained model with parts reset (so they pair against the
full model), and the column set only where something is reset. Experiments the paper has get their own table
and figure (analysis.tables, analysis.figures); an entry with a `title` gets a table and a figure made from
the entry alone (analysis.experiments), which is all a new experiment needs.

Rows of an experiment without an entry still get a table (`tables.other_table`)."""
from __future__ import annotations

import dataclasses

CELL = ["task", "model", "train_size"]


@dataclasses.dataclass(frozen=True)
class View:
    columns: tuple[str, ...]  # what the experiment's table keeps apart
    finetunes: bool = False  # rows finetune the pretrained model with some part reset (paired with the full model)
    reset_column: str | None = None  # set only where something is reset: null marks the full model
    title: str = ""  # set: a table and a figure made from this entry (`table`, `figure`)
    note: str = ""
    x: str | None = None  # the figure's x axis (None: one point per condition)
    series: str | None = None  # one line per value of this column
    # Row columns only this experiment writes, with their Arrow type (trialrows.schema declares them as
    # settings): a store opens at one type whichever file comes first.
    new_columns: tuple[tuple[str, str], ...] = ()


VIEWS: dict[str, View] = {
    "incremental": View((*CELL, "reinit_mode", "k"), finetunes=True),
    "layernorm": View((*CELL, "reinit_mode", "keep_layernorm", "k"), finetunes=True),
    "reinit-lr": View((*CELL, "reinit_mode", "lr_multiplier", "k"), finetunes=True),
    "localized": View((*CELL, "reinit_mode", "block_mode", "block_size", "block_start"), finetunes=True),
    "single-layer": View((*CELL, "reinit_mode", "layer"), finetunes=True),
    "permutation": View((*CELL, "permutation")),
    "heads": View((*CELL, "reinit_mode", "layer", "head"), finetunes=True, reset_column="head"),
    "sequential": View((*CELL, "intermediate_task")),
    "probing": View((*CELL, "probe", "layer")),
    "lr-multipliers": View((*CELL, "k", "group", "multipliers")),
    "sublayer": View((*CELL, "reinit_mode", "sublayer", "layer"), finetunes=True, reset_column="sublayer",
                     title="Attention or feed-forward block of one layer reinitialized",
                     note="Only the named block of the layer (with its LayerNorm) is reinitialized; the full model "
                          "(sublayer empty) is the same grid's baseline.", x="layer", series="sublayer",
                     new_columns=(("sublayer", "string"),)),
    "alternate": View((*CELL, "reinit_mode", "parity"), finetunes=True,
                      title="Every other layer reinitialized (odd or even layers)", x="parity",
                      new_columns=(("parity", "string"),)),
    "scratch": View((*CELL, "reinit_mode"), finetunes=True,
                    title="From scratch: every layer and the embeddings reinitialized",
                    note="The floor: against incremental k = 0 (embeddings only, the reference lines), what the "
                         "pretrained embeddings alone carry.", new_columns=(("reinit_embeddings", "bool"),)),
}

KNOWN_EXPERIMENTS = tuple(VIEWS)
FINETUNE_EXPERIMENTS = tuple(name for name, view in VIEWS.items() if view.finetunes)
EXPERIMENT_COLUMNS = {name: list(view.columns) for name, view in VIEWS.items()}
RESET_COLUMNS = tuple(dict.fromkeys(v.reset_column for v in VIEWS.values() if v.reset_column))
GENERIC = tuple(name for name, view in VIEWS.items() if view.title)  # tables and figures made from the entry


