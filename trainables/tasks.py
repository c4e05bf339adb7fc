"""Tasks and where their raw text comes from: GLUE (the Hugging Face hub or a local GLUE download), the
built-in synthetic task, or the user's own (`TaskSource`: a folder holding a train and a dev file, or any
hub dataset, with the text and label columns named).

Whatever the source, a task's splits come out alike: `text_a` (and `text_b` for sentence pairs) and `label`,
with the label ids of the hub's `nyu-mll/glue` datasets, so that results from a local GLUE folder and from the
hub are comparable row for row.
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from trialrows.recipe import QA_TASK as SQUAD_V2  # question answering: trainables.qa

if TYPE_CHECKING:  # the functions that read data import datasets themselves: trial workers never load it
    import datasets

HUB_DATASET = "nyu-mll/glue"
SYNTHETIC = "synthetic"


@dataclasses.dataclass(frozen=True)
class Task:
    name: str  # the hub's GLUE config name, or "synthetic"
    text_fields: tuple[str, ...]  # the hub's text columns: one sentence, or a sentence pair
    num_labels: int  # 1 for regression
    metric: str  # the headline metric, a key of trainables.metrics.compute_metrics' result
    glue_dir: str | None  # the task's folder in a GLUE download; None when it has none
    metrics: tuple[str, ...] = ()  # every metric reported; () for GLUE's (trainables.metrics.TASK_METRICS)
    label_names: tuple[str, ...] = ()  # a user's task: class id i is label_names[i]; () for GLUE and regression

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


def data_fingerprint(task_data: TaskData) -> str:
    """A hash of what a task's trials read: its train and validation splits' content (whichever source they
    came from: files, the hub, the built-in generator). Another revision of a hub dataset, an edited file or
    a different folder of the same content give other, or the same, fingerprints accordingly.

    It hashes the column names and values as JSON, nothing a library chooses: datasets' Hasher also hashed
    the schema metadata datasets writes, its pickling scheme and Python's bytecode of its helper, so another
    Python or datasets changed every fingerprint and a rerun redid every finished trial."""
    import hashlib

    digest = hashlib.blake2b(digest_size=8)
    for split in (task_data.train, task_data.validation):
        table = split.data.table
        digest.update(json.dumps([table.num_rows, table.column_names]).encode())
        for column in table.columns:
            for start in range(0, len(column), 10_000):  # bounded memory: a split's texts are never one string
                values = column.slice(start, 10_000).to_pylist()
                digest.update(json.dumps(values, ensure_ascii=False, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def legacy_data_fingerprint(task_data: TaskData) -> str:
    """data_fingerprint as rows written up to 2026-11-28 recorded it (datasets' Hasher: the same only under the
    same Python, datasets and dill); sweep.fingerprints keeps it for a store whose rows carry it."""
    from datasets.fingerprint import Hasher

    return Hasher.hash([task_data.train.data.table, task_data.validation.data.table])[:16]


def load_task(name: str, data_dir: str | None = None, *, synthetic_seed: int = 0,
              sources: Mapping[str, "TaskSource"] | None = None) -> TaskData:
    """A task's train and validation splits: the user's task if `sources` defines `name`, else the synthetic
    task if asked for, else the GLUE files under `data_dir` when given, else the hub."""
    if sources and name in sources:
        return load_task_source(sources[name])
    task = get_task(name)
    if task.name == SYNTHETIC:
        from trainables.synthetic import make_synthetic  # it imports datasets, which trial workers never need

        train, validation = make_synthetic(seed=synthetic_seed)
        return TaskData(task, train, validation, "synthetic")
    if task.name == SQUAD_V2:
        return load_squad(data_dir)
    if data_dir is not None:
        root = Path(data_dir).resolve()
        train, validation = (read_glue_split(task, root, split) for split in ("train", "validation"))
        return TaskData(task, train, validation, f"local:{root}")
    train, validation = load_hub_splits(task)
    return TaskData(task, train, validation, "hub")


def split_features(task: Task) -> datasets.Features:
    import datasets

    columns = {"text_a": datasets.Value("string")}
    if task.is_pair:
        columns["text_b"] = datasets.Value("string")
    # A plain value rather than the hub's ClassLabel, so hub and local splits share one schema.
    columns["label"] = datasets.Value("float32" if task.is_regression else "int64")
    return datasets.Features(columns)


# --- the hub ---------------------------------------------------------------------------------------------


def load_hub_splits(task: Task) -> tuple[datasets.Dataset, datasets.Dataset]:
    import datasets

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
    import datasets

    path = glue_file(task, data_dir, split)
    layout = GLUE_LAYOUTS[task.name]
    texts: list[list[str]] = [[] for _ in layout.text_columns]
    labels: list[float | int] = []
    # GLUE's sentences hold unbalanced quote characters, so a quote is plain text, never a field delimiter.
    # newline="" lets csv take CRLF as a line end; utf-8-sig drops the byte-order mark MRPC's files carry.
    with io.StringIO(read_text(path), newline="") as handle:
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


def read_text(path: Path) -> str:
    """A data file's text; a file that is not UTF-8 is refused with the line of its first bad byte (a byte-order
    mark is dropped, as MRPC's files carry one)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not UTF-8 text (byte {data[err.start]:#04x}); save the file as "
                         "UTF-8") from None


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


# --- the user's own task: a folder of files, or any hub dataset -----------------------------------------

DATA_SUFFIXES = {".csv": ",", ".tsv": "\t", ".jsonl": None, ".parquet": None}
CLASS_METRICS = ("accuracy", "macro_f1", "f1", "matthews_correlation")
REGRESSION_METRICS = ("pearson", "spearman")
HUB_PREFIX = "hub:"


@dataclasses.dataclass(frozen=True)
class TaskSource:
    """A task the user defines (`--task-file NAME=DIR` or `NAME=hub:DATASET[:CONFIG]`). Its label column
    holds class names (strings or integers) or, for regression, numbers; which one is read from the metric
    when given, else from the labels (a number with a fraction makes it regression).

    Another kind of task (question answering, say) would be another source value with its own loader,
    dispatched in `load_task` like this one; every loader returns a TaskData whose Task says how to score it."""

    name: str
    location: str  # a folder (absolute), or "hub:DATASET" / "hub:DATASET:CONFIG"
    text_columns: tuple[str, ...]  # one text, or a pair
    label_column: str
    splits: tuple[str, str] | None = None  # (train, dev): file stems or hub split names; None: the defaults
    metric: str | None = None  # the headline metric; None: accuracy for classes, pearson for regression

    @property
    def is_hub(self) -> bool:
        return self.location.startswith(HUB_PREFIX)

    @property
    def split_names(self) -> tuple[str, str]:
        return self.splits or (("train", "validation") if self.is_hub else ("train", "dev"))

    def columns(self) -> dict:
        """What a trial's row (and identity) records of the task's definition (a metric only where given: the
        ids of trials planned before it was recorded stay as they were)."""
        return {"text_columns": list(self.text_columns), "label_column": self.label_column,
                **({"task_metric": self.metric} if self.metric else {})}


def load_task_source(source: TaskSource) -> TaskData:
    """The user's task, checked whole before any work: every problem is one line naming the file (and line)."""
    train_name, dev_name = source.split_names
    train, dev = (read_records(source, split) for split in (train_name, dev_name))
    regression = is_regression(source, train)
    label_names = () if regression else class_names(source, train)
    metric = source.metric or ("pearson" if regression else "accuracy")
    if metric == "f1" and len(label_names) != 2:
        raise ValueError(f"--metric f1 scores the second of two classes; task '{source.name}' has "
                         f"{len(label_names)} ({', '.join(label_names)}); use macro_f1")
    reported = REGRESSION_METRICS if regression else ("accuracy", "macro_f1")
    task = Task(source.name, source.text_columns, 1 if regression else len(label_names), metric, None,
                metrics=tuple(dict.fromkeys([metric, *reported])), label_names=label_names)
    train_set, dev_set = (task_split(source, task, records) for records in (train, dev))
    return TaskData(task, train_set, dev_set, source.location if source.is_hub else f"file:{source.location}")


Records = list[tuple[str, dict]]  # (where: "FILE, line N", the example's columns)


def task_split(source: TaskSource, task: Task, records: Records) -> datasets.Dataset:
    """Records as a split of the common schema: text_a (text_b), label (a class id, or a float)."""
    import datasets

    texts = [[text_value(where, record, column) for where, record in records] for column in source.text_columns]
    for column, values in zip(source.text_columns, texts):
        if not any(v.strip() for v in values):  # every example would train on its special tokens alone
            raise ValueError(f"{records[0][0].rpartition(',')[0]}: text column '{column}' is empty in all "
                             f"{len(values)} examples of task '{source.name}'")
    labels = [label_value(source, where, record[source.label_column], task.is_regression, task.label_names)
              for where, record in records]
    return datasets.Dataset.from_dict({**dict(zip(("text_a", "text_b"), texts)), "label": labels},
                                      features=split_features(task))


def read_records(source: TaskSource, split: str) -> Records:
    if source.is_hub:
        records = read_hub_split(source, split)
        where = f"{source.location} split '{split}'"
    else:
        path = split_file(source, split)
        records = read_file(path)
        where = str(path)
    if not records:
        raise ValueError(f"{where}: holds no examples")
    have = records[0][1].keys()
    for column in (*source.text_columns, source.label_column):
        if column not in have:
            option = "--label-column" if column == source.label_column else "--text-columns"
            raise ValueError(f"{where}: {option} '{column}' is not one of its columns ({', '.join(map(str, have))})")
    for place, record in records:
        label = record.get(source.label_column)
        # NaN too: JSON lines and Parquet's float columns give it for a missing value (a class "nan", or a
        # regression target that makes every step's loss nan); blanks too, which became a class "" of their own
        blank = isinstance(label, str) and not label.strip()
        if label is None or blank or isinstance(label, float) and math.isnan(label):
            raise ValueError(f"{place}: no label in column '{source.label_column}'")
    return records


def split_file(source: TaskSource, split: str) -> Path:
    folder = Path(source.location)
    found = [folder / f"{split}{suffix}" for suffix in DATA_SUFFIXES if (folder / f"{split}{suffix}").is_file()]
    if len(found) != 1:
        names = ", ".join(f"{split}{suffix}" for suffix in DATA_SUFFIXES)
        problem = "has no" if not found else f"has {len(found)} files for the"
        raise ValueError(f"--task-file {source.name}: {folder} {problem} {split} split; expected one of {names}")
    return found[0]


def read_file(path: Path) -> Records:
    if path.suffix == ".parquet":
        import pyarrow.parquet

        try:
            rows = pyarrow.parquet.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
            raise ValueError(f"{path}: not a readable Parquet file ({err})") from None
        return [(f"{path}, row {i}", row) for i, row in enumerate(rows, start=1)]
    if path.suffix == ".jsonl":
        return read_json_lines(path)
    return read_delimited(path, DATA_SUFFIXES[path.suffix])


def read_json_lines(path: Path) -> Records:
    records = []
    with io.StringIO(read_text(path)) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: not valid JSON ({err.msg}, column {err.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}, line {number}: a JSON object per line is expected, got {type(record).__name__}")
            records.append((f"{path}, line {number}", record))
    return records


# A field wholly in CSV's quotes, its inner quotes doubled: how csv.writer and pandas write a text holding a quote.
CSV_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


def read_delimited(path: Path, delimiter: str) -> Records:
    records = []
    tsv = delimiter == "\t"
    # In a TSV, as in GLUE's own files, a quote opening a sentence is text: csv's quoting would run the field on
    # to the next quote, lines later, and merge the examples between. A field quoted whole is still unquoted.
    unquote = csv_unquoted if tsv else str
    with io.StringIO(read_text(path), newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter, quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
        try:
            header = next(reader, None)
            header = None if header is None else [unquote(c) for c in header]
            twice = sorted({c for c in header or () if header.count(c) > 1})
            if twice:
                raise ValueError(f"{path}, line 1: column '{twice[0]}' appears {header.count(twice[0])} times in the "
                                 "header; each column needs its own name")
            for fields in reader:
                if not fields:
                    continue
                if len(fields) != len(header):
                    hint = "; a .tsv's quotes are text: a text holding a tab or a line break needs .csv or .jsonl" \
                        if tsv else ""
                    raise ValueError(f"{path}, line {reader.line_num}: {len(fields)} fields; the header has "
                                     f"{len(header)} ({', '.join(header)}){hint}")
                records.append((f"{path}, line {reader.line_num}", dict(zip(header, map(unquote, fields)))))
        except csv.Error as err:
            raise ValueError(f"{path}, line {reader.line_num}: does not parse ({err})") from None
    if header is None:
        raise ValueError(f"{path}: the file is empty; expected a header line, then one example per line")
    return records


def csv_unquoted(field: str) -> str:
    quoted = CSV_QUOTED.fullmatch(field)
    return quoted[1].replace('""', '"') if quoted else field


def read_hub_split(source: TaskSource, split: str) -> Records:
    import datasets

    dataset, _, config = source.location[len(HUB_PREFIX):].partition(":")
    loaded = datasets.load_dataset(dataset, config or None, split=split)
    return [(f"{source.location} split '{split}', row {i}", row) for i, row in enumerate(loaded.to_list(), start=1)]


def text_value(where: str, record: dict, column: str) -> str:
    value = record.get(column)
    if not isinstance(value, str):
        raise ValueError(f"{where}: text column '{column}' holds {value!r}, not text")
    return value


def as_number(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def is_regression(source: TaskSource, train: Records) -> bool:
    """Regression when the metric says so, or (no metric) when a train label is a number with a fraction."""
    if source.metric is not None:
        return source.metric in REGRESSION_METRICS
    numbers = (as_number(record[source.label_column]) for _, record in train)
    return any(n is not None and math.isfinite(n) and not n.is_integer() for n in numbers)


def class_name(value) -> str:
    """A label's class name: integers (also written 1.0 or "1") by their digits, strings stripped."""
    number = as_number(value)
    if number is not None and math.isfinite(number) and number.is_integer():
        return str(int(number))
    return str(value).strip()


def class_names(source: TaskSource, train: Records) -> tuple[str, ...]:
    """The train split's classes, in a stable order: numerically when all are integers, else by name."""
    names = {class_name(record[source.label_column]) for _, record in train}
    if len(names) < 2:
        raise ValueError(f"--label-column '{source.label_column}': the {source.split_names[0]} split of task "
                         f"'{source.name}' has one class ({', '.join(names)}); classification needs two or more")
    numeric = all(n.lstrip("-").isdigit() for n in names)
    return tuple(sorted(names, key=int if numeric else str))


def label_value(source: TaskSource, where: str, value, regression: bool, names: tuple[str, ...]) -> float | int:
    if regression:
        number = as_number(value)
        if number is None or not math.isfinite(number):
            raise ValueError(f"{where}: label {value!r} in column '{source.label_column}' is not a number, and task "
                             f"'{source.name}' is a regression task (--metric {source.metric or 'by its labels'})")
        return number
    name = class_name(value)
    if name not in names:
        raise ValueError(f"{where}: label '{name}' never occurs in the {source.split_names[0]} split; "
                         f"its labels are {', '.join(names)}")
    return names.index(name)


SQUAD_HUB_DATASET = "rajpurkar/squad_v2"
SQUAD_FILES = {"train": "train-v2.0.json", "validation": "dev-v2.0.json"}
SHAPE = '{"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}'


# --- SQuAD 2.0 (question answering: trainables.qa tokenizes and scores it) --------------------------------------------------------------------------------------------


def load_squad(data_dir: str | None = None) -> TaskData:
    """SQuAD 2.0's train and dev splits, from the official files under `data_dir` or from the hub; one row
    per question: id, question, context, answers {text, answer_start} (empty lists: unanswerable)."""
    import datasets

    if data_dir is not None:
        root = Path(data_dir).resolve()
        train, validation = (read_squad_file(root / SQUAD_FILES[split]) for split in ("train", "validation"))
        return TaskData(get_task(SQUAD_V2), train, validation, f"local:{root}")
    hub = datasets.load_dataset(SQUAD_HUB_DATASET)
    train, validation = (hub[split].select_columns(["id", "question", "context", "answers"])
                         for split in ("train", "validation"))
    for split, source in ((train, f"{SQUAD_HUB_DATASET} train"), (validation, f"{SQUAD_HUB_DATASET} validation")):
        for row in split:
            check_answers(source, row["id"], row["context"], row["answers"])
    return TaskData(get_task(SQUAD_V2), train, validation, "hub")


def read_squad_file(path: Path) -> datasets.Dataset:
    import datasets

    if not path.is_file():
        raise FileNotFoundError(f"task '{SQUAD_V2}': expected the official file {path}")
    try:
        document = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not SQuAD JSON (not JSON at all: {err}); expected {SHAPE}") from None
    rows = collections.defaultdict(list)
    for qa, context in squad_questions(document, path):
        answers = qa.get("answers")
        if not isinstance(answers, list) or not all(isinstance(a, dict) and isinstance(a.get("text"), str)
                                                    and isinstance(a.get("answer_start"), int) for a in answers):
            raise ValueError(f"{path}: question {qa['id']}: 'answers' must be a list of {{\"text\", \"answer_start\"}}")
        if bool(qa.get("is_impossible", not answers)) == bool(answers):
            raise ValueError(f"{path}: question {qa['id']}: is_impossible={qa.get('is_impossible')} but it has "
                             f"{len(answers)} answers; an unanswerable question has none, an answerable one some")
        answers = {"text": [a["text"] for a in answers], "answer_start": [a["answer_start"] for a in answers]}
        check_answers(str(path), qa["id"], context, answers)
        for name, value in (("id", qa["id"]), ("question", qa["question"]), ("context", context), ("answers", answers)):
            rows[name].append(value)
    if not rows:
        raise ValueError(f"{path}: the file holds no questions")
    return datasets.Dataset.from_dict(dict(rows))


def squad_questions(document, path: Path):
    """(question, its context) for every question of a SQuAD JSON document; a clear error where the shape
    is not SQuAD's."""
    def fail(where: str) -> None:
        raise ValueError(f"{path}: not SQuAD JSON ({where}); expected {SHAPE}")

    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        fail("no top-level 'data' list")
    for i, article in enumerate(document["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            fail(f"data[{i}] has no 'paragraphs' list")
        for j, paragraph in enumerate(article["paragraphs"]):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str) \
                    or not isinstance(paragraph.get("qas"), list):
                fail(f"data[{i}].paragraphs[{j}] has no 'context' text and 'qas' list")
            for qa in paragraph["qas"]:
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str) or not isinstance(qa.get("question"), str):
                    fail(f"data[{i}].paragraphs[{j}] has a question without an 'id' and 'question' text")
                yield qa, paragraph["context"]


def check_answers(source: str, question_id: str, context: str, answers: dict) -> None:
    for text, start in zip(answers["text"], answers["answer_start"]):
        # A blank answer is no span: its windows would be labelled with the word at answer_start, while the
        # official metrics score the question as unanswerable.
        if not text.strip():
            raise ValueError(f"{source}: question {question_id}: answer_start {start} holds an empty answer {text!r}; "
                             "an unanswerable question has \"answers\": [] (and \"is_impossible\": true), an "
                             "answerable one the text of its span")
        if start < 0 or context[start : start + len(text)] != text:
            raise ValueError(f"{source}: question {question_id}: answer_start {start} does not point at its answer "
                             f"{text!r} (the context there reads {context[max(start, 0) : max(start, 0) + len(text)]!r})")
