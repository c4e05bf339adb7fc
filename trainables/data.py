"""Tokenized task data, training subsets and padded batches.

A task is tokenized once per (task, tokenizer, max length), in the sweep's driver, into flat arrays that Ray
ships to every trial through its object store; no trial tokenizes. The sweep keeps the tokenized splits in
`datasets`' cache, keyed on the data's content, the tokenizer and the max length, so a second sweep on the
same task does not tokenize again. Sequences stay unpadded: each batch is
padded only to its own longest sequence, which on GLUE's short sentences is most of the compute saved.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import torch

from trainables.tasks import Task, get_task


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
    input_ids: np.ndarray  # all sequences concatenated, int32
    token_type_ids: np.ndarray  # same layout, int8
    offsets: np.ndarray  # sequence i is [offsets[i], offsets[i+1])
    labels: np.ndarray  # int64 classes, or float32 for regression

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclasses.dataclass(frozen=True)
class TokenizedTask:
    task: str
    num_labels: int
    metric: str
    source: str
    tokenizer: str
    max_length: int
    train: TokenizedSplit
    validation: TokenizedSplit
    # How to score it: compute_metrics takes this, not the name (a user's task is known to the driver only).
    # None: the built-in task of that name.
    definition: Task | None = None

    def __post_init__(self):
        if self.definition is None:
            object.__setattr__(self, "definition", get_task(self.task))

    def columns(self) -> dict:
        """What a trial's row records of the task beside its identity: the label mapping and the user's file."""
        columns = {"label_names": list(self.definition.label_names)} if self.definition.label_names else {}
        if self.source.startswith(("file:", "hub:")):
            columns["task_file"] = self.source.removeprefix("file:")
        return columns


# Part of every cache key: bump it when what a cached file holds changes.
TOKENIZED_FORMAT = 1


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of what the tokenizer does (its class, vocabulary, normalizer, pre- and post-processing, and the
    side it truncates from), not of its object: the truncation and padding state it keeps from its last call
    are left out."""
    # The side lives on the Python object (tokenizer_config.json's truncation_side), not in the backend's state.
    kind = f"{type(tokenizer).__name__}/truncation-{getattr(tokenizer, 'truncation_side', 'right')}"
    return serialized_tokenizer_fingerprint(kind, tokenizer.backend_tokenizer.to_str())


@functools.lru_cache(maxsize=8)
def serialized_tokenizer_fingerprint(kind: str, serialized: str) -> str:
    """tokenizer_fingerprint of a tokenizer serialized: hashed once (0.1 s for BERT's vocabulary), not once for
    each split of each task."""
    state = json.loads(serialized)
    for volatile in ("truncation", "padding"):
        state.pop(volatile, None)
    from datasets.fingerprint import Hasher  # here: trial workers, which get tokenized tasks, never load datasets

    return Hasher.hash([kind, state])


def tokenize_split(dataset, tokenizer, max_length: int, cache_dir: str | Path | None = None) -> TokenizedSplit:
    """Tokenize a split with `datasets.Dataset.map`. With `cache_dir`, the result is an Arrow file there named
    by the hash of the split's content, the tokenizer and the max length: a later sweep on the same data
    reads it back instead of tokenizing again."""
    pair = "text_b" in dataset.column_names

    def encode(batch: dict) -> dict:
        encoded = tokenizer(batch["text_a"], batch["text_b"] if pair else None, truncation=True,
                            max_length=max_length, return_token_type_ids=True, return_attention_mask=False)
        return {"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"]}

    from datasets.fingerprint import Hasher

    key = Hasher.hash([TOKENIZED_FORMAT, dataset.data.table, tokenizer_fingerprint(tokenizer), max_length])
    cache_file = str(Path(cache_dir) / f"tokenized-{key}.arrow") if cache_dir is not None else None
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
    encoded = dataset.map(encode, batched=True, batch_size=10_000, remove_columns=[c for c in dataset.column_names
                                                                                   if c != "label"],
                          new_fingerprint=key, cache_file_name=cache_file, keep_in_memory=cache_file is None,
                          load_from_cache_file=cache_file is not None)
    table = encoded.data.table
    ids, types = (table.column(name).combine_chunks() for name in ("input_ids", "token_type_ids"))
    offsets = ids.offsets.to_numpy().astype(np.int64)
    labels = table.column("label").to_numpy()
    return TokenizedSplit(
        input_ids=ids.flatten().to_numpy().astype(np.int32),
        token_type_ids=types.flatten().to_numpy().astype(np.int8),
        offsets=offsets - offsets[0],
        labels=labels.astype(np.float32 if labels.dtype.kind == "f" else np.int64),
    )


def tokenize_task(task_data, tokenizer, tokenizer_name: str, max_length: int,
                  cache_dir: str | Path | None = None) -> TokenizedTask:
    task = task_data.task
    return TokenizedTask(
        task=task.name,
        num_labels=task.num_labels,
        metric=task.metric,
        source=task_data.source,
        tokenizer=tokenizer_name,
        max_length=max_length,
        train=tokenize_split(task_data.train, tokenizer, max_length, cache_dir),
        validation=tokenize_split(task_data.validation, tokenizer, max_length, cache_dir),
        definition=task,
    )


def draw_subset(n_available: int, size: int, subset_seed: int) -> np.ndarray:
    """Indices of a training subset: depends only on (n_available, size, subset_seed), so every condition of
    one trial index trains on the same examples (the paper's paired design)."""
    if size <= 0:
        raise ValueError(f"train_size={size} must be a positive number of examples")
    if size > n_available:
        raise ValueError(f"train_size={size} is larger than the train split ({n_available} examples)")
    return np.sort(np.random.default_rng(subset_seed).choice(n_available, size=size, replace=False))


def collate(split: TokenizedSplit, rows: np.ndarray, pad_id: int) -> dict[str, torch.Tensor]:
    lengths = split.lengths[rows]
    width = int(lengths.max())
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    types = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for j, (row, n) in enumerate(zip(rows, lengths)):
        start = split.offsets[row]
        ids[j, :n] = split.input_ids[start : start + n]
        types[j, :n] = split.token_type_ids[start : start + n]
        mask[j, :n] = 1
    return {
        "input_ids": torch.from_numpy(ids),
        "token_type_ids": torch.from_numpy(types),
        "attention_mask": torch.from_numpy(mask),
        "labels": torch.from_numpy(split.labels[rows]),
    }


def train_batches(rows: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(rows)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def eval_batches(split: TokenizedSplit, batch_size: int) -> list[np.ndarray]:
    # Sorted by length: evaluation order does not change any metric, and similar lengths waste no padding.
    order = np.argsort(split.lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
