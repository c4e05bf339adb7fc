"""Tokenized task data, training subsets and padded batches.

A task is tokenized once per (task, tokenizer, max length), in the sweep's driver, into flat arrays that Ray
ships to every trial through its object store; no trial tokenizes. Sequences stay unpadded: each batch is
padded only to its own longest sequence, which on GLUE's short sentences is most of the compute saved.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch


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


def tokenize_split(dataset, tokenizer, max_length: int) -> TokenizedSplit:
    pair = "text_b" in dataset.column_names
    encoded = tokenizer(
        list(dataset["text_a"]),
        list(dataset["text_b"]) if pair else None,
        truncation=True,
        max_length=max_length,
        return_token_type_ids=True,
        return_attention_mask=False,
    )
    ids = encoded["input_ids"]
    lengths = np.fromiter((len(s) for s in ids), dtype=np.int64, count=len(ids))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = lambda rows, dtype: np.fromiter((t for s in rows for t in s), dtype=dtype, count=int(offsets[-1]))  # noqa: E731
    labels = np.asarray(dataset["label"])
    return TokenizedSplit(
        input_ids=flat(ids, np.int32),
        token_type_ids=flat(encoded["token_type_ids"], np.int8),
        offsets=offsets,
        labels=labels.astype(np.float32 if labels.dtype.kind == "f" else np.int64),
    )


def tokenize_task(task_data, tokenizer, tokenizer_name: str, max_length: int) -> TokenizedTask:
    task = task_data.task
    return TokenizedTask(
        task=task.name,
        num_labels=task.num_labels,
        metric=task.metric,
        source=task_data.source,
        tokenizer=tokenizer_name,
        max_length=max_length,
        train=tokenize_split(task_data.train, tokenizer, max_length),
        validation=tokenize_split(task_data.validation, tokenizer, max_length),
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
