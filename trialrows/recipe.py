"""How a trial trains: every training setting, declared once.

`Recipe` is the one declaration of each training setting (its type, default, help and allowed values). The
sweep's command line, its config file and the Python API read them from here (sweep.experiments.GridSettings
is a Recipe); a trial (sweep.grid.TrialSpec) and the trainable's config (trainables.finetune.FinetuneConfig)
are Recipes too, so the Tune config, the trial's identity and its row's columns (trialrows.schema) are made
from the same fields. A new training setting is one field here.
"""
from __future__ import annotations

import dataclasses

from trialrows.declare import Limits, at_least, declared, non_negative, positive, setting

LR_SCHEDULES = ("linear", "constant")
PRECISIONS = ("fp32", "bf16")
# The default --max-length: question answering's windows are Hugging Face's example's (384 tokens);
# sentences fit in 128. Batches are padded to their own longest sequence, so a sentence task run beside
# squad_v2 at 384 costs the same as at 128.
DEFAULT_MAX_LENGTH, QA_MAX_LENGTH = 128, 384
# Below this a sequence holds little of a sentence beside its special tokens ([CLS], [SEP]): the trial would
# train and report `ok` on next to nothing.
MIN_MAX_LENGTH = 8
TRAIN = "finetuning"


def default_epochs(train_size: int) -> int:
    """The paper's rule: 5 epochs for subsets of 500 or fewer examples, 3 for larger ones."""
    return 5 if train_size <= 500 else 3


QA_TASK = "squad_v2"  # question answering (trainables.qa): its windows take QA_MAX_LENGTH by default

# Rows of a recipe say so (docs/results-schema.md): 2 = gradient clipping, weight decay on weights only, a
# reinitialized pooler in the reinitialized group, seeds drawn from (base seed, trial index), sequential weight
# change from the final task's start. Rows without the column were written by recipe 1. 3 = recipe 2 with the span
# model's head drawn from the trial's seed alone: before, it came from the global stream after Hugging Face's
# random init of the whole encoder, which the pretrained weights then overwrote (1.0 s of a BERT-base trial's
# set-up). Other head weights make other trials; a trial that reads no question-answering task keeps recipe 2,
# its id and its numbers.
RECIPE_VERSION, SPAN_RECIPE_VERSION = 2, 3


def recipe_version(tasks) -> int:
    """The recipe of a trial that reads `tasks` (its task and any intermediate task; None for none)."""
    return SPAN_RECIPE_VERSION if QA_TASK in tasks else RECIPE_VERSION


def default_max_length(tasks) -> int:
    return QA_MAX_LENGTH if QA_TASK in tasks else DEFAULT_MAX_LENGTH


def resolve_precision(precision: str, gpu_share: float) -> str:
    """`auto`: bf16 where the trial gets a GPU (tensor cores; the Trainer's usual choice there), fp32 on CPUs,
    where bf16 autocast is faster only on CPUs with bf16 instructions and the paper's numbers are fp32."""
    if precision != "auto":
        return precision
    return "bf16" if gpu_share > 0 else "fp32"


def _max_length(length, limits: Limits) -> list[str]:
    if MIN_MAX_LENGTH <= length and (limits.max_positions is None or length <= limits.max_positions):
        return []
    most = f"{MIN_MAX_LENGTH}..{limits.max_positions}: {limits.model} has {limits.max_positions} positions" \
        if limits.max_positions else f"at least {MIN_MAX_LENGTH} (the special tokens and a few of each text)"
    return [f"{length} is outside {most}"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The paper's recipe (Hugging Face run_glue of its time: AdamW, linear decay without warmup, gradients
    clipped at norm 1.0) and what a sweep may vary of it."""

    epochs: int | None = setting(None, "default: 5 for subsets of <=500 examples, else 3", check=at_least(1),
                                 bad=("0",), group=TRAIN)
    lr: float = setting(2e-5, "learning rate (default 2e-5)", check=positive, bad=("0",), group=TRAIN)
    batch_size: int = setting(8, "examples per step (default 8)", check=at_least(1), bad=("0",), group=TRAIN)
    max_length: int | None = setting(
        None, f"tokens per sequence, {MIN_MAX_LENGTH} up to the model's positions (default {DEFAULT_MAX_LENGTH}; "
        f"{QA_MAX_LENGTH} when a task is squad_v2, whose contexts are split into windows of this length sharing a "
        "third of it)", check=_max_length, bad=("100000",), group=TRAIN)
    weight_decay: float = setting(0.0, "AdamW weight decay, on weights only (default 0)", check=non_negative,
                                  bad=("-1",), group=TRAIN)
    lr_schedule: str = setting("linear", "learning-rate schedule (default linear)", choices=LR_SCHEDULES,
                               bad=("cosine",), group=TRAIN)
    max_grad_norm: float = setting(1.0, "clip each step's gradient to this global norm, as the paper's code "
                                   "(run_glue) did; 0: no clipping (default 1.0)", check=non_negative, bad=("-1",),
                                   group=TRAIN)
    precision: str = setting("auto", "bf16: bfloat16 autocast; auto: bf16 when trials get a GPU, else fp32 "
                             "(default auto)", choices=("auto", *PRECISIONS), bad=("fp16",), group=TRAIN)
    eval_every: int = setting(0, "evaluate the dev split every N epochs for per-epoch curves; 0: after the last "
                              "epoch only, as the paper reports (default 0)", check=at_least(0), bad=("-1",),
                              metavar="N", group=TRAIN, identity=False)  # changes no number a trial computes

    def recipe(self) -> dict:
        """The recipe's fields of this value, by name (a trial's Tune config carries them)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Recipe)}


RECIPE = declared(Recipe)
NOT_IDENTITY = tuple(o.name for o in RECIPE if not o.identity)

