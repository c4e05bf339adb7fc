"""GLUE tasks and where their raw text comes from: the Hugging Face hub, a local GLUE download, or the
built-in synthetic task.

Whatever the source, a task's splits come out alike: `text_a` (and `text_b` for sentence pairs) and `label`,
with the label ids of the hub's `nyu-mll/glue` datasets, so that results from a local GLUE folder and from the
hub are comparable row for row.
"""
from __future__ import annotations

import csv
import dataclasses
from collections.abc import Mapping
from pathlib import Path

import datasets

from trainables.synthetic import make_synthetic

HUB_DATASET = "nyu-mll/glue"
SYNTHETIC = "synthetic"
SQUAD_V2 = "squad_v2"  # question answering: trainables.qa


@dataclasses.dataclass(frozen=True)
class Task:
    name: str  # the hub's GLUE config name, or "synthetic"
    text_fields: tuple[str, ...]  # the hub's text columns: one sentence, or a sentence pair
    num_labels: int  # 1 for regression
    metric: str  # the headline metric, a key of trainables.metrics.compute_metrics' result
    glue_dir: str | None  # the task's folder in a GLUE download; None when it has none

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @property
    def is_pair(self) -> bool:
        return len(self.text_fields) == 2


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("sst2", ("sentence",), 2, "accuracy", "SST-2"),
        Task("cola", ("sentence",), 2, "matthews_correlation", "CoLA"),
        Task("qnli", ("question", "sentence"), 2, "accuracy", "QNLI"),
        Task("rte", ("sentence1", "sentence2"), 2, "accuracy", "RTE"),
        Task("mrpc", ("sentence1", "sentence2"), 2, "f1", "MRPC"),
        Task("stsb", ("sentence1", "sentence2"), 1, "pearson", "STS-B"),
        Task("wnli", ("sentence1", "sentence2"), 2, "accuracy", "WNLI"),
        Task(SYNTHETIC, ("text_a", "text_b"), 2, "accuracy", None),
        Task(SQUAD_V2, ("question", "context"), 2, "f1", None),  # 2 "labels": a start and an end per token
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"task '{name}' is not known; allowed: {', '.join(TASKS)}")
    return TASKS[name]


@dataclasses.dataclass(frozen=True)
class TaskData:
    """A task's raw text, before tokenization."""

    task: Task
    train: datasets.Dataset
    validation: datasets.Dataset  # the official GLUE validation split, never used for training
    source: str  # "hub", "local:<absolute data_dir>" or "synthetic"


def load_task(name: str, data_dir: str | None = None, *, synthetic_seed: int = 0) -> TaskData:
    """A task's train and validation splits: the synthetic task if asked for, else the GLUE files under
    `data_dir` when given, else the hub."""
    task = get_task(name)
    if task.name == SYNTHETIC:
        train, validation = make_synthetic(seed=synthetic_seed)
        return TaskData(task, train, validation, "synthetic")
    if task.name == SQUAD_V2:
        from trainables.qa import load_squad  # qa builds on this module

        return load_squad(data_dir)
    if data_dir is not None:
        root = Path(data_dir).resolve()
        train, validation = (read_glue_split(task, root, split) for split in ("train", "validation"))
        return TaskData(task, train, validation, f"local:{root}")
    train, validation = load_hub_splits(task)
    return TaskData(task, train, validation, "hub")


def split_features(task: Task) -> datasets.Features:
    columns = {"text_a": datasets.Value("string")}
    if task.is_pair:
        columns["text_b"] = datasets.Value("string")
    # A plain value rather than the hub's ClassLabel, so hub and local splits share one schema.
    columns["label"] = datasets.Value("float32" if task.is_regression else "int64")
    return datasets.Features(columns)


# --- the hub ---------------------------------------------------------------------------------------------


def load_hub_splits(task: Task) -> tuple[datasets.Dataset, datasets.Dataset]:
    glue = datasets.load_dataset(HUB_DATASET, task.name)
    return tuple(to_task_columns(task, glue[split]) for split in ("train", "validation"))


def to_task_columns(task: Task, dataset: datasets.Dataset) -> datasets.Dataset:
    renames = dict(zip(task.text_fields, ("text_a", "text_b")))
    dataset = dataset.select_columns([*task.text_fields, "label"]).rename_columns(renames)
    return dataset.cast(split_features(task))


# --- a local GLUE download -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GlueLayout:
    """How one task's TSV files are laid out in GLUE's own download."""

    text_columns: tuple[str | int, ...]  # header names, or positions when the file has no header
    label_column: str | int  # header name or position (negative counts from the end)
    label_ids: Mapping[str, int] | None  # the file's label strings -> the hub's ids; None for a float score
    has_header: bool = True


BINARY = {"0": 0, "1": 1}
# The hub's ClassLabel order for qnli and rte: entailment=0, not_entailment=1.
ENTAILMENT = {"entailment": 0, "not_entailment": 1}

GLUE_LAYOUTS: dict[str, GlueLayout] = {
    "sst2": GlueLayout(("sentence",), "label", BINARY),
    # CoLA has no header: source, label, original acceptability mark, sentence.
    "cola": GlueLayout((3,), 1, BINARY, has_header=False),
    "qnli": GlueLayout(("question", "sentence"), "label", ENTAILMENT),
    "rte": GlueLayout(("sentence1", "sentence2"), "label", ENTAILMENT),
    # MRPC's label is its "Quality" column: 1 = equivalent, as the hub's ClassLabel.
    "mrpc": GlueLayout(("#1 String", "#2 String"), "Quality", BINARY),
    # STS-B's score is its last column, whatever the metadata columns before it.
    "stsb": GlueLayout(("sentence1", "sentence2"), -1, None),
    # WNLI's file uses the hub's ids already: 1 = entailment.
    "wnli": GlueLayout(("sentence1", "sentence2"), "label", BINARY),
}

GLUE_FILES = {"train": "train.tsv", "validation": "dev.tsv"}


def glue_file(task: Task, data_dir: Path, split: str) -> Path:
    path = data_dir / task.glue_dir / GLUE_FILES[split]
    if not path.is_file():
        raise FileNotFoundError(f"task '{task.name}' has no {split} split in {data_dir}: expected the file {path}")
    return path


def read_glue_split(task: Task, data_dir: Path, split: str) -> datasets.Dataset:
    path = glue_file(task, data_dir, split)
    layout = GLUE_LAYOUTS[task.name]
    texts: list[list[str]] = [[] for _ in layout.text_columns]
    labels: list[float | int] = []
    # GLUE's sentences hold unbalanced quote characters, so a quote is plain text, never a field delimiter.
    # newline="" lets csv take CRLF as a line end; utf-8-sig drops the byte-order mark MRPC's files carry.
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, []) if layout.has_header else None
        if header == []:
            raise ValueError(f"{path}: the file is empty; expected a header line, then one example per line")
        positions = [column_position(c, header, path) for c in (*layout.text_columns, layout.label_column)]
        needed = max(max(positions) + 1, -min(positions))
        for fields in reader:
            if not fields:  # a blank line, such as a doubled final newline
                continue
            if len(fields) < needed:
                raise ValueError(
                    f"{path}, line {reader.line_num}: {len(fields)} tab-separated fields; this layout needs {needed}"
                )
            for column, position in zip(texts, positions):
                column.append(fields[position])
            labels.append(parse_label(fields[positions[-1]], layout.label_ids, path, reader.line_num))
    if not labels:  # an empty split would only fail later, inside every trial
        raise ValueError(f"{path}: the file holds no examples" + (" after its header" if header else ""))
    columns = dict(zip(("text_a", "text_b"), texts))
    return datasets.Dataset.from_dict({**columns, "label": labels}, features=split_features(task))


def column_position(column: str | int, header: list[str] | None, path: Path) -> int:
    if isinstance(column, int):
        return column
    if column not in header:
        raise ValueError(f"{path}: the header has no column '{column}'; it has {', '.join(header)}")
    return header.index(column)


def parse_label(text: str, label_ids: Mapping[str, int] | None, path: Path, line: int) -> float | int:
    value = text.strip()
    if label_ids is None:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{path}, line {line}: label '{value}' is not a number") from None
    if value not in label_ids:
        raise ValueError(f"{path}, line {line}: label '{value}' is not one of {', '.join(label_ids)}")
    return label_ids[value]
