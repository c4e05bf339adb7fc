"""Task registry and the three data sources: real GLUE files, GLUE-layout fixtures, the hub (monkeypatched)."""
from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from trainables import tasks
from trainables.tasks import TASKS, get_task, load_task, read_glue_split

SHARED_GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"


@pytest.fixture(scope="module")
def shared_glue() -> Path:
    if not SHARED_GLUE.is_dir():
        pytest.skip(f"the shared GLUE files are not at {SHARED_GLUE} (see ../shared/data/glue/README.md)")
    return SHARED_GLUE


@pytest.fixture(scope="module")
def sst2(shared_glue):
    return load_task("sst2", str(shared_glue))


@pytest.fixture(scope="module")
def cola(shared_glue):
    return load_task("cola", str(shared_glue))


def write_task_file(root: Path, glue_dir: str, split_file: str, lines: list[str], newline: str = "\n",
                    final_newline: bool = True, prefix: str = "") -> Path:
    folder = root / glue_dir
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / split_file
    path.write_bytes((prefix + newline.join(lines) + (newline if final_newline else "")).encode("utf-8"))
    return path


# --- the registry ------------------------------------------------------------------------------------------


def test_registry_covers_the_glue_tasks_and_synthetic():
    assert set(TASKS) == {"sst2", "cola", "qnli", "rte", "mrpc", "stsb", "wnli", "synthetic", "squad_v2"}
    assert [name for name, task in TASKS.items() if task.is_regression] == ["stsb"]
    assert get_task("qnli").text_fields == ("question", "sentence") and get_task("qnli").glue_dir == "QNLI"
    assert get_task("sst2").text_fields == ("sentence",) and get_task("synthetic").glue_dir is None
    assert {name: task.metric for name, task in TASKS.items()} == {
        "sst2": "accuracy", "cola": "matthews_correlation", "qnli": "accuracy", "rte": "accuracy",
        "mrpc": "f1", "stsb": "pearson", "wnli": "accuracy", "synthetic": "accuracy", "squad_v2": "f1",
    }


def test_unknown_task_names_the_field_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"task 'sst3' is not known; allowed: sst2, cola, .*synthetic"):
        get_task("sst3")


def test_synthetic_ignores_data_dir(tmp_path):
    data = load_task("synthetic", str(tmp_path))
    assert data.source == "synthetic" and data.task.name == "synthetic"
    assert data.train.column_names == ["text_a", "text_b", "label"]


# --- the real GLUE files -----------------------------------------------------------------------------------


def test_sst2_rows_and_labels(sst2, shared_glue):
    assert (len(sst2.train), len(sst2.validation)) == (67_349, 872)
    assert sst2.source == f"local:{shared_glue.resolve()}"
    assert sst2.train.column_names == ["text_a", "label"]
    assert sst2.train.features["label"].dtype == "int64"
    assert set(sst2.validation["label"]) == {0, 1}
    assert sst2.train[0] == {"text_a": "hide new secretions from the parental units", "label": 0}


def test_cola_has_no_header_and_a_dev_file_without_final_newline(cola):
    assert (len(cola.train), len(cola.validation)) == (8_551, 1_043)
    assert cola.train[0] == {
        "text_a": "Our friends won't buy this analysis, let alone the next one we propose.", "label": 1
    }
    assert cola.validation[-1] == {"text_a": "John talked to Bill about himself.", "label": 1}
    assert set(cola.train["label"]) == {0, 1}


def test_quote_characters_are_read_as_text(cola):
    # With csv's default quoting, a sentence opening with a quote would swallow the lines after it.
    assert 'Susan whispered "Shut up".' in cola.train["text_a"]
    assert 'Susan whispered "Shut up" at them.' in cola.train["text_a"]


def test_qnli_dev_has_string_labels_mapped_to_hub_ids(shared_glue):
    dev = read_glue_split(get_task("qnli"), shared_glue, "validation")
    assert len(dev) == 5_463 and dev.column_names == ["text_a", "text_b", "label"]
    assert dev[0]["text_a"] == "What came into force after the new constitution was herald?"
    assert dev[0]["label"] == 0 and dev[1]["label"] == 1  # entailment, not_entailment
    assert 'He paraphrased the Te Deum as "Herr Gott, dich loben wir" with a simplified form of the melody.' in (
        dev["text_b"]
    )


def test_missing_split_names_the_task_the_split_and_the_path(shared_glue):
    expected = shared_glue.resolve() / "QNLI" / "train.tsv"
    with pytest.raises(FileNotFoundError, match="task 'qnli' has no train split") as error:
        load_task("qnli", str(shared_glue))
    assert str(expected) in str(error.value)


# --- GLUE layouts, written as fixtures ---------------------------------------------------------------------


def test_rte_with_crlf_and_no_final_newline(tmp_path):
    lines = ["index\tsentence1\tsentence2\tlabel", '0\tHe said "no.\tHe spoke.\tentailment',
             "1\tA cat sat.\tA dog sat.\tnot_entailment"]
    write_task_file(tmp_path, "RTE", "train.tsv", lines, newline="\r\n", final_newline=False)
    write_task_file(tmp_path, "RTE", "dev.tsv", lines, newline="\r\n")
    data = load_task("rte", str(tmp_path))
    for split in (data.train, data.validation):
        assert split.to_list() == [
            {"text_a": 'He said "no.', "text_b": "He spoke.", "label": 0},
            {"text_a": "A cat sat.", "text_b": "A dog sat.", "label": 1},
        ]


def test_mrpc_label_is_the_quality_column_and_a_byte_order_mark_is_dropped(tmp_path):
    lines = [
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
        '1\t702876\t702977\tAmrozi accused "his brother"\tHe blamed him',
        "0\t2108705\t2108831\tYucaipa owned it\tIt was sold",
    ]
    for name in ("train.tsv", "dev.tsv"):
        write_task_file(tmp_path, "MRPC", name, lines, prefix="\ufeff")
    data = load_task("mrpc", str(tmp_path))
    assert data.validation["label"] == [1, 0]
    assert data.train["text_a"] == ['Amrozi accused "his brother"', "Yucaipa owned it"]
    assert data.train["text_b"] == ["He blamed him", "It was sold"]


def test_stsb_score_is_the_last_column_and_a_float(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    lines = [
        header,
        "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane takes off.\tAn air plane is taking off.\t5.000",
        "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man plays.\tA woman sings.\t0.5",
    ]
    for name in ("train.tsv", "dev.tsv"):
        write_task_file(tmp_path, "STS-B", name, lines)
    data = load_task("stsb", str(tmp_path))
    assert data.train.features["label"].dtype == "float32"
    assert data.validation["label"] == [5.0, 0.5]
    assert data.train["text_b"] == ["An air plane is taking off.", "A woman sings."]


def test_wnli_int_labels_are_the_hub_ids(tmp_path):
    lines = ["index\tsentence1\tsentence2\tlabel", "0\tI stuck a pin.\tThe pin stuck.\t1", "1\tA.\tB.\t0"]
    for name in ("train.tsv", "dev.tsv"):
        write_task_file(tmp_path, "WNLI", name, lines)
    assert load_task("wnli", str(tmp_path)).train["label"] == [1, 0]  # 1 = entailment, as on the hub


def test_unknown_label_names_the_file_and_the_line(tmp_path):
    lines = ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tentailment", "1\tA.\tB.\tcontradiction"]
    path = write_task_file(tmp_path, "RTE", "train.tsv", lines)
    write_task_file(tmp_path, "RTE", "dev.tsv", lines[:2])
    with pytest.raises(ValueError, match=r"line 3: label 'contradiction' is not one of entailment, not_entailment"):
        load_task("rte", str(tmp_path))
    with pytest.raises(ValueError, match=str(path)):
        load_task("rte", str(tmp_path))


def test_short_row_and_missing_header_column_are_reported(tmp_path):
    write_task_file(tmp_path, "SST-2", "train.tsv", ["sentence\tlabel", "good\t1", "no label here"])
    with pytest.raises(ValueError, match=r"line 3: 1 tab-separated fields; this layout needs 2"):
        read_glue_split(get_task("sst2"), tmp_path, "train")
    write_task_file(tmp_path, "SST-2", "dev.tsv", ["text\tlabel", "good\t1"])
    with pytest.raises(ValueError, match=r"the header has no column 'sentence'; it has text, label"):
        read_glue_split(get_task("sst2"), tmp_path, "validation")


# --- the hub, monkeypatched --------------------------------------------------------------------------------


def hub_split(columns: dict, label_names: list[str] | None) -> datasets.Dataset:
    features = {name: datasets.Value("string") for name in columns if name not in ("label", "idx")}
    features["label"] = datasets.ClassLabel(names=label_names) if label_names else datasets.Value("float32")
    features["idx"] = datasets.Value("int32")
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


@pytest.fixture
def fake_hub(monkeypatch):
    calls = []
    splits = {
        "qnli": ({"question": ["Who?", "When?"], "sentence": ["Him.", "Then."], "label": [0, 1], "idx": [0, 1]},
                 ["entailment", "not_entailment"]),
        "sst2": ({"sentence": ["fine", "bad"], "label": [1, 0], "idx": [0, 1]}, ["negative", "positive"]),
        "stsb": ({"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [4.5, 0.0], "idx": [0, 1]}, None),
    }

    def load_dataset(path, name, **kwargs):
        calls.append((path, name))
        columns, label_names = splits[name]
        split = hub_split(columns, label_names)
        return datasets.DatasetDict({"train": split, "validation": split, "test": split})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_hub_pair_task_is_renamed_to_text_a_text_b(fake_hub):
    data = load_task("qnli")
    assert fake_hub == [("nyu-mll/glue", "qnli")] and data.source == "hub"
    assert data.train.to_list() == [
        {"text_a": "Who?", "text_b": "Him.", "label": 0}, {"text_a": "When?", "text_b": "Then.", "label": 1}
    ]
    assert data.validation.features == tasks.split_features(get_task("qnli"))


def test_hub_single_sentence_and_regression(fake_hub):
    assert load_task("sst2").validation.column_names == ["text_a", "label"]
    stsb = load_task("stsb")
    assert stsb.train.features["label"].dtype == "float32" and stsb.train["label"] == [4.5, 0.0]
