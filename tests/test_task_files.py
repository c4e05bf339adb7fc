"""The user's own tasks: folders of CSV, TSV, JSON Lines or Parquet files (and hub datasets, faked here),
through the loader, the CLI's checks and a real sweep."""
from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.results import read_results
from sweep.cli import main
from trainables.metrics import compute_metrics
from trainables.tasks import TaskSource, load_task_source

WORDS = {"pos": "good great fine lovely", "neg": "bad awful poor dreadful", "mid": "plain usual common"}


def examples(n: int, seed: int, labels=("pos", "neg")) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = labels[i % len(labels)]
        words = rng.choice(WORDS[label].split(), size=3)
        out.append({"review": " ".join(words), "title": f"item {i}", "sentiment": label,
                    "score": round(float(rng.uniform(0, 5)), 2)})
    return out


def write(folder, split: str, rows: list[dict], suffix: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{split}{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter="\t" if suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(rows)


def make_task(folder, suffix: str, train: list[dict] | None = None, dev: list[dict] | None = None):
    write(folder, "train", train if train is not None else examples(40, 0), suffix)
    write(folder, "dev", dev if dev is not None else examples(20, 1), suffix)
    return folder


def source(folder, text=("review",), label="sentiment", metric=None, **options) -> TaskSource:
    return TaskSource("mine", str(folder), tuple(text), label, metric=metric, **options)


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_string_labels_become_classes_in_name_order(tmp_path, suffix):
    data = load_task_source(source(make_task(tmp_path, suffix), text=("review", "title")))
    task = data.task
    assert task.label_names == ("neg", "pos") and task.num_labels == 2 and task.is_pair
    assert task.metric == "accuracy" and task.metrics == ("accuracy", "macro_f1")
    assert data.train["label"][:2] == [1, 0]  # pos, neg
    assert data.train["text_a"][0] == examples(40, 0)[0]["review"] and data.train["text_b"][0] == "item 0"
    assert len(data.validation) == 20 and data.source == f"file:{tmp_path}"


def test_integer_labels_keep_numeric_order_and_floats_make_regression(tmp_path):
    rows = [{**r, "sentiment": i % 3 * 5} for i, r in enumerate(examples(30, 0))]  # 0, 5, 10: not 0, 10, 5
    data = load_task_source(source(make_task(tmp_path / "ints", ".jsonl", rows, rows[:9])))
    assert data.task.label_names == ("0", "5", "10") and data.train["label"][:3] == [0, 1, 2]
    reg = load_task_source(source(make_task(tmp_path / "floats", ".csv"), label="score"))
    assert reg.task.is_regression and reg.task.metrics == ("pearson", "spearman") and reg.task.label_names == ()
    assert reg.train["label"][0] == pytest.approx(examples(40, 0)[0]["score"])
    # Integers scored as regression because the user says so.
    chosen = load_task_source(source(tmp_path / "ints", metric="spearman"))
    assert chosen.task.is_regression and chosen.task.metric == "spearman"


def test_macro_f1_is_the_mean_of_per_class_f1(tmp_path):
    data = load_task_source(source(make_task(tmp_path, ".csv", examples(30, 0, ("pos", "neg", "mid")))))
    labels = np.array([0, 0, 1, 1, 2, 2])
    predictions = np.array([0, 1, 1, 1, 2, 0])
    metrics = compute_metrics(data.task, predictions, labels)
    # per class F1: 2*1/(2+2)=0.5, 2*2/(3+2)=0.8, 2*1/(1+2)=0.667
    assert metrics["macro_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert metrics["accuracy"] == pytest.approx(4 / 6)


def test_hub_dataset_reads_its_named_splits(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(examples(12 if split == "tr" else 6, 0))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = load_task_source(TaskSource("h", "hub:someone/reviews:en", ("review",), "sentiment", splits=("tr", "te")))
    assert calls == [("someone/reviews", "en", "tr"), ("someone/reviews", "en", "te")]
    assert len(data.train) == 12 and data.task.label_names == ("neg", "pos") and data.source == "hub:someone/reviews:en"


def refused(tmp_path, capsys, folder, *options) -> str:
    """Run a sweep on a task file; it must be refused before any work. Its one problem line."""
    argv = ["incremental", "--model", "minilm", "--task-file", f"mine={folder}", "--tasks", "mine",
            "--sizes", "8", "--trials", "1", "--storage", str(tmp_path / "out"), *options]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "cannot start the sweep:" and len(lines) == 2, lines
    assert not (tmp_path / "out").exists()
    return lines[1]


TEXT = ("--text-columns", "review")


def test_bad_task_files_are_refused_in_one_line(tmp_path, capsys):
    folder = make_task(tmp_path / "ok", ".csv")
    assert "--label-column 'stars' is not one of its columns (review, title, sentiment, score)" in refused(
        tmp_path, capsys, folder, *TEXT, "--label-column", "stars")
    empty = make_task(tmp_path / "empty", ".tsv")
    (empty / "dev.tsv").write_text("")
    assert f"{empty / 'dev.tsv'}: the file is empty" in refused(tmp_path, capsys, empty, *TEXT, "--label-column", "sentiment")
    unseen = make_task(tmp_path / "unseen", ".jsonl", dev=examples(6, 1, ("pos", "mid")))
    line = refused(tmp_path, capsys, unseen, *TEXT, "--label-column", "sentiment")
    assert f"{unseen / 'dev.jsonl'}, line 2: label 'mid' never occurs in the train split; its labels are neg, pos" in line
    rows = examples(10, 0)
    rows[3]["score"] = "n/a"
    words = make_task(tmp_path / "words", ".csv", train=rows)
    line = refused(tmp_path, capsys, words, *TEXT, "--label-column", "score", "--metric", "pearson")
    assert f"{words / 'train.csv'}, line 5: label 'n/a' in column 'score' is not a number" in line
    broken = make_task(tmp_path / "broken", ".jsonl")
    with open(broken / "train.jsonl", "a") as handle:
        handle.write('{"review": "good", "sentiment": \n')
    assert f"{broken / 'train.jsonl'}, line 41: not valid JSON" in refused(
        tmp_path, capsys, broken, *TEXT, "--label-column", "sentiment")
    ragged = make_task(tmp_path / "ragged", ".csv")
    with open(ragged / "dev.csv", "a") as handle:
        handle.write("only,three,fields\n")
    assert f"{ragged / 'dev.csv'}, line 22: 3 fields; the header has 4" in refused(
        tmp_path, capsys, ragged, *TEXT, "--label-column", "sentiment")
    assert "--label-column: which column holds the labels" in refused(tmp_path, capsys, folder, *TEXT)
    assert "--label-column: 'sentiment' is also one of the --text-columns of task 'mine'" in refused(
        tmp_path, capsys, folder, "--text-columns", "review", "sentiment", "--label-column", "sentiment")
    for suffix, missing in ((".jsonl", float("nan")), (".parquet", float("nan"))):  # a missing value, as written
        rows = examples(10, 0)
        rows[4]["score"] = missing
        gap = make_task(tmp_path / f"gap{suffix}", suffix, train=rows)
        assert "5: no label in column 'score'" in refused(tmp_path, capsys, gap, *TEXT, "--label-column", "score")
    (tmp_path / "no-files").mkdir()
    assert "has no train split; expected one of train.csv, train.tsv, train.jsonl, train.parquet" in refused(
        tmp_path, capsys, tmp_path / "no-files", *TEXT, "--label-column", "sentiment")


def test_missing_folder_and_lonely_options_are_refused(tmp_path, capsys):
    line = refused(tmp_path, capsys, tmp_path / "nowhere", *TEXT, "--label-column", "x")
    assert f"--task-file: '{tmp_path / 'nowhere'}' (task 'mine') is not a folder" in line
    argv = ["incremental", "--model", "minilm", "--tasks", "synthetic", "--label-column", "x", "--dry-run"]
    assert main(argv) == 2
    assert "--label-column: only means something with --task-file" in capsys.readouterr().err


def test_real_sweep_on_a_csv_task_and_a_json_lines_task(ray_local, tiny_bert, tmp_path):
    relabel = lambda rows, column: [{"review": r["review"], "label": r[column]} for r in rows]  # noqa: E731
    reviews = make_task(tmp_path / "reviews", ".csv", relabel(examples(40, 0), "sentiment"),
                        relabel(examples(20, 1), "sentiment"))  # string classes
    scores = make_task(tmp_path / "scores", ".jsonl", relabel(examples(40, 0), "score"),
                       relabel(examples(20, 1), "score"))  # float scores: regression
    assert main(["incremental", "--model", tiny_bert, "--sizes", "16", "--trials", "1", "--epochs", "1", "--k", "4",
                 "--storage", str(tmp_path / "out"), "--name", "own", "--task-file", f"reviews={reviews}",
                 f"scores={scores}", "--tasks", "reviews", "scores", "--text-columns", "review",
                 "--label-column", "label"]) == 0
    rows = read_results(tmp_path / "out" / "own").set_index("task")
    assert set(rows["status"]) == {"ok"}
    row = rows.loc["reviews"]
    assert row["data_source"] == "file" and row["metric_name"] == "accuracy"
    assert list(row["label_names"]) == ["neg", "pos"] and list(row["text_columns"]) == ["review"]
    assert row["label_column"] == "label" and row["task_file"] == str(reviews)
    assert 0 <= row["dev_macro_f1"] <= 1 and row["dev_metric"] == row["dev_accuracy"]
    row = rows.loc["scores"]
    assert row["metric_name"] == "pearson" and row["dev_metric"] == row["dev_pearson"]
    assert -1 <= row["dev_spearman"] <= 1 and row["task_file"] == str(scores)


def test_a_second_load_reads_the_cached_tokens_instead_of_tokenizing(tiny_bert, tmp_path, monkeypatch):
    from trainables.data import tokenize_task
    from trainables.models import load_tokenizer

    data = load_task_source(source(make_task(tmp_path / "task", ".csv"), text=("review", "title")))
    tokenizer, cache = load_tokenizer(tiny_bert), tmp_path / "cache"
    first = tokenize_task(data, tokenizer, tiny_bert, 32, cache)
    assert len(list(cache.glob("tokenized-*.arrow"))) == 2  # train and dev

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again although the cache holds this split")

    monkeypatch.setattr(type(tokenizer), "__call__", no_tokenizing)
    again = tokenize_task(load_task_source(source(tmp_path / "task", text=("review", "title"))), tokenizer,
                          tiny_bert, 32, cache)
    for split in ("train", "validation"):
        for field in ("input_ids", "token_type_ids", "offsets", "labels"):
            assert np.array_equal(getattr(getattr(first, split), field), getattr(getattr(again, split), field))
    # Another max length, or other content, is another key: tokenized anew (and here, refused to).
    with pytest.raises(AssertionError, match="tokenized again"):
        tokenize_task(data, tokenizer, tiny_bert, 16, cache)
    rows = examples(40, 0)
    rows[0]["review"] = "changed"
    with pytest.raises(AssertionError, match="tokenized again"):
        tokenize_task(load_task_source(source(make_task(tmp_path / "other", ".csv", rows), text=("review", "title"))),
                      tokenizer, tiny_bert, 32, cache)


def test_the_tokenizer_is_hashed_once_and_its_calls_leave_its_key_alone(tiny_bert, monkeypatch):
    """The tokenizer's part of a tokenized split's cache key: what the tokenizer does, hashed once (not again
    for every split of every task), and the same after a call has left its truncation state on it."""
    from datasets.fingerprint import Hasher

    from trainables.data import serialized_tokenizer_fingerprint, tokenizer_fingerprint
    from trainables.models import load_tokenizer

    serialized_tokenizer_fingerprint.cache_clear()
    tokenizer = load_tokenizer(tiny_bert)
    first, hashed, real = tokenizer_fingerprint(tokenizer), [], Hasher.hash
    monkeypatch.setattr(Hasher, "hash", lambda value: (hashed.append(value), real(value))[1])
    assert tokenizer_fingerprint(tokenizer) == first and not hashed
    tokenizer(["one two three four five six"], truncation=True, max_length=4)
    assert '"truncation":null' not in tokenizer.backend_tokenizer.to_str().replace(" ", "")
    assert tokenizer_fingerprint(tokenizer) == first


def test_another_headline_metric_is_another_trial(tmp_path):
    """A rerun with another --metric trains again: the rows record the metric it was planned with, and a trial
    scored one way is not done under another."""
    import dataclasses

    from sweep.api import configure
    from sweep.data import load_raw_tasks
    from sweep.experiments import EXPERIMENTS
    from trainables.tasks import data_fingerprint

    folder = make_task(tmp_path / "reviews", ".csv")
    planned = {}
    for metric in (None, "accuracy", "macro_f1"):
        grid = configure("incremental", model="minilm", task_files=[f"reviews={folder}"], tasks=["reviews"],
                         text_columns=["review"], label_column="sentiment", sizes=[8], trials=["1"], k=[6],
                         **({"metric": metric} if metric else {})).grid
        raw = load_raw_tasks(grid, ["reviews"])
        grid = dataclasses.replace(grid, data_fingerprints=(("reviews", data_fingerprint(raw["reviews"])),),
                                   model_fingerprint="the same weights")
        (spec,) = EXPERIMENTS["incremental"].build(grid, 6, 12)
        planned[metric] = (spec.trial_id, spec.row().get("task_metric"))
    assert len({trial_id for trial_id, _ in planned.values()}) == 3
    assert [m for _, m in planned.values()] == [None, "accuracy", "macro_f1"]
