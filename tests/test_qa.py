"""SQuAD 2.0 (issue 19): the official metrics, windows and answers mapped back to text, subsets of questions,
bad files, the span model under every ablation and sequential finetuning, and a real sweep on the shared
slices."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from trainables.ablations import HeadReinit, Permute, Reinit
from trainables.finetune import FinetuneConfig, draw_rows, finetune
from trainables.models import load_pretrained, load_tokenizer
from trainables.tasks import TaskData, load_squad, read_squad_file
from trainables.qa import (QASplit, best_answers, example_count, select_questions, squad_metrics,
                           tokenize_qa_task)

SQUAD_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2"


@pytest.fixture(scope="module")
def squad_dir() -> Path:
    if not (SQUAD_DIR / "dev-v2.0.json").exists():
        pytest.skip(f"the shared SQuAD 2.0 slices are not at {SQUAD_DIR}")
    return SQUAD_DIR


@pytest.fixture(scope="module")
def squad(squad_dir, tiny_bert):
    """The shared slices tokenized as a sweep does, in windows of 128 tokens (the tiny model's limit)."""
    return tokenize_qa_task(load_squad(str(squad_dir)), load_tokenizer(tiny_bert), tiny_bert, 128)


def test_metrics_are_the_official_definition_on_hand_made_predictions():
    answers = [("the Normans", "Normans"), ("in the 10th and 11th centuries",), (), (), ("Rollo",)]
    predictions = ["normans.", "10th century", "", "France", ""]
    metrics = squad_metrics(predictions, answers)
    # By hand: 1) "normans." normalizes to "normans" = gold: EM 1, F1 1. 2) gold tokens "in 10th and 11th
    # centuries" (the article removed), predicted "10th century": 1 token in common, precision 1/2, recall 1/5,
    # F1 2/7, EM 0. 3) unanswerable, no answer: 1, 1. 4) unanswerable, an answer: 0, 0. 5) answerable, none: 0, 0.
    expected = {"exact": 2 / 5, "f1": (2 + 2 / 7) / 5, "has_ans_exact": 1 / 3, "has_ans_f1": (1 + 2 / 7) / 3,
                "no_ans_exact": 1 / 2, "no_ans_f1": 1 / 2}
    assert metrics == pytest.approx(expected)
    assert math.isnan(squad_metrics(["x"], [("x",)])["no_ans_f1"])  # no unanswerable question: undefined
    # The script's corners: EM and F1 each take their own best gold (F1 0.8 from the longer one here); a gold
    # that normalizes to nothing ("the") leaves an answerable question that only an empty answer matches, as does
    # an unanswerable one ("The !" is empty once normalized); whitespace collapses; "—" is no ASCII punctuation.
    answers = [("France", "northern France region"), ("the",), (), ("Rollo  of\nNormandy",), ("Zürich",)]
    predictions = ["northern France", "An.", "The !", " rollo of normandy ", "Zürich—"]
    assert squad_metrics(predictions, answers) == pytest.approx({
        "exact": 3 / 5, "f1": 3.8 / 5, "has_ans_exact": 2 / 4, "has_ans_f1": 2.8 / 4, "no_ans_exact": 1.0,
        "no_ans_f1": 1.0})


def test_windows_overlap_and_their_labels_map_back_to_the_gold_text(squad):
    dev = squad.validation
    assert dev.num_questions == 208 and len(dev) > 208  # long contexts make several windows
    assert max(dev.lengths) <= 128
    for row in np.flatnonzero(dev.labels[:, 0] != dev.cls_positions):
        start, end = dev.labels[row]
        first = dev.offsets[row]
        text = dev.contexts[dev.feature_question[row]][dev.char_starts[first + start] : dev.char_ends[first + end]]
        assert text == dev.answers[dev.feature_question[row]][0]
    # Logits that point at each window's label: the decoded answers are the gold ones, unanswerable ones "".
    logits = []
    for row in range(len(dev)):
        window = np.zeros((dev.lengths[row], 2))
        window[dev.labels[row, 0], 0] = window[dev.labels[row, 1], 1] = 10.0
        logits.append(window)
    assert squad_metrics(best_answers(dev, logits), dev.answers) == pytest.approx(dict.fromkeys(
        ["exact", "f1", "has_ans_exact", "has_ans_f1", "no_ans_exact", "no_ans_f1"], 1.0))
    # Neighbouring windows of one question share context: the second starts before the first ends.
    two = [r for r in range(len(dev) - 1) if dev.feature_question[r] == dev.feature_question[r + 1]][0]
    starts = [dev.char_starts[dev.offsets[r] : dev.offsets[r + 1]] for r in (two, two + 1)]
    assert starts[1][starts[1] >= 0].min() < starts[0].max()


def test_subsets_count_questions_and_take_all_their_windows(squad):
    train = squad.train
    assert example_count(train) == train.num_questions == 4719
    rows = draw_rows(train, 50, subset_seed=7)
    questions = np.unique(train.feature_question[rows])
    assert len(questions) == 50
    assert set(rows) == set(np.flatnonzero(np.isin(train.feature_question, questions)))
    assert np.array_equal(rows, draw_rows(train, 50, subset_seed=7))
    held = select_questions(train, questions[:5])
    assert isinstance(held, QASplit) and held.num_questions == 5 and held.ids == tuple(train.ids[q] for q in questions[:5])


def write(path: Path, document) -> Path:
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return path


def test_bad_files_get_one_clear_line(tmp_path):

    with pytest.raises(ValueError, match="not SQuAD JSON .no top-level 'data' list."):
        read_squad_file(write(tmp_path / "a.json", [{"sentence": "glue?", "label": 1}]))
    with pytest.raises(ValueError, match="not SQuAD JSON .not JSON at all"):
        read_squad_file(write(tmp_path / "b.json", "sentence\tlabel\nhello\t1\n"))
    context = "The Normans were a people in Normandy."
    bad = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q-17", "question": "Who?", "is_impossible": False, "answers": [{"text": "Normans", "answer_start": 3}]}]}]}]}
    with pytest.raises(ValueError, match=r"question q-17: answer_start 3 does not point at its answer 'Normans' "
                                         r"\(the context there reads ' Norman'\)"):
        read_squad_file(write(tmp_path / "c.json", bad))


def test_an_answer_with_no_text_is_refused_not_labelled_as_the_next_word(tmp_path):
    # Some SQuAD-style conversions mark a question unanswerable with {"text": "", "answer_start": 0} and no
    # is_impossible: read as answerable, its windows were labelled with the word at answer_start (and an
    # empty context crashed every trial), while the metrics scored it as unanswerable.
    qa = {"id": "q-9", "question": "Who?", "answers": [{"text": "", "answer_start": 4}]}
    blank = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "The Normans.", "qas": [qa]}]}]}
    with pytest.raises(ValueError, match=r"question q-9: answer_start 4 holds an empty answer ''; an unanswerable "
                                         r"question has \"answers\": \[\]"):
        read_squad_file(write(tmp_path / "blank.json", blank))


def test_the_best_span_of_any_window_beats_the_lowest_null_score(tiny_bert):
    # Hand-made logits on real windows: the answer lies in the last window only, and higher sums elsewhere are
    # no spans (a start in the question, an end before its start, 31 tokens); the null score is each
    # question's lowest over its windows, as the official example compares it.
    import datasets

    context = "Café naïve résumé\u00a0— “word”. " * 12 + "It lies in Zürich  city, they say."
    answer = "Zürich  city"
    rows = datasets.Dataset.from_dict({"id": ["a"], "question": ["Where?"], "context": [context],
                                       "answers": [{"text": [answer], "answer_start": [context.index(answer)]}]})
    split = tokenize_qa_task(TaskData(None, rows, rows, "x"), load_tokenizer(tiny_bert), "tiny", 64).validation
    assert len(split) >= 3 and (split.labels[:-1] == split.cls_positions[:-1, None]).all()
    logits = [np.full((n, 2), -100.0) for n in split.lengths]
    for window, cls in zip(logits, split.cls_positions):
        window[cls] = 50.0  # a null far above the answer in every window but the first
    start, end = split.labels[-1]
    logits[-1][start, 0] = logits[-1][end, 1] = 5.0
    first = logits[0]
    context_tokens = np.flatnonzero(split.char_starts[: split.lengths[0]] >= 0)
    c = context_tokens[0]
    first[split.cls_positions[0]] = 4.0
    first[1, :] = 20.0  # a question token
    first[c + 5, 0] = first[c + 2, 1] = 8.0  # end before start
    first[c + 10, 0] = first[c + 41, 1] = 9.0  # 32 tokens long
    assert c + 41 <= context_tokens[-1]
    assert best_answers(split, logits) == [answer]
    first[split.cls_positions[0]] = 6.0  # the lowest null (12) now beats the answer (10)
    assert best_answers(split, logits) == [""]


def test_sweep_refuses_a_folder_without_the_squad_files(tiny_bert, tmp_path, capsys):
    from sweep.cli import main

    assert main(["incremental", "--model", tiny_bert, "--tasks", "squad_v2", "--data-dir", str(tmp_path),
                 "--sizes", "8", "--storage", str(tmp_path)]) == 2
    assert f"--data-dir: {tmp_path} has no train-v2.0.json or dev-v2.0.json for task 'squad_v2'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny(tiny_bert):
    return load_pretrained(tiny_bert)


@pytest.mark.parametrize("ablation", [Reinit.incremental(2, 4), Reinit((1, 2), keep_layernorm=True),
                                      Permute((4, 3, 2, 1)), HeadReinit(2, 1)])
def test_every_ablation_finetunes_the_span_model(squad, tiny, ablation):
    cfg = FinetuneConfig(task="squad_v2", train_size=12, subset_seed=0, seed=0, epochs=1, ablation=ablation)
    result = finetune(cfg, squad, tiny)
    assert result["status"] == "ok" and result["metric_name"] == "f1"
    assert result["dev_metric"] == result["dev_f1"]
    for name in ("exact", "f1", "has_ans_exact", "has_ans_f1", "no_ans_exact", "no_ans_f1"):
        assert 0 <= result[f"dev_{name}"] <= 1
    again = finetune(cfg, squad, tiny)
    assert [again[k] for k in ("train_loss", "dev_exact", "dev_f1")] == [result[k] for k in ("train_loss", "dev_exact", "dev_f1")]


def test_held_out_questions_feed_the_search_objective(squad, tiny):
    cfg = FinetuneConfig(task="squad_v2", train_size=12, subset_seed=0, seed=0, epochs=1, val_size=4,
                         layer_lr_multipliers=(1.0, 2.0, 1.0, 1.0))
    result = finetune(cfg, squad, tiny)
    assert result["val_size"] == 4 and 0 <= result["val_metric"] <= 1


def test_sequential_finetuning_takes_squad_first_or_last(squad, tiny, tiny_bert, glue_dir):
    from trainables.data import tokenize_task
    from trainables.tasks import load_task

    sst2 = tokenize_task(load_task("sst2", str(glue_dir)), load_tokenizer(tiny_bert), tiny_bert, 128)
    for final, first in ((sst2, squad), (squad, sst2)):
        cfg = FinetuneConfig(task=final.task, train_size=12, subset_seed=0, seed=0, epochs=1,
                             intermediate_task=first.task)
        result = finetune(cfg, final, tiny, intermediate=first)
        assert result["status"] == "ok" and len(result["intermediate_weight_distance"]) == 4
        assert max(result["intermediate_weight_distance"]) > 0  # the first task did train the shared encoder


def test_real_sweep_on_the_shared_slices(ray_local, tiny_bert, squad_dir, tmp_path):
    from analysis.results import read_results
    from sweep.cli import main

    argv = ["incremental", "--model", tiny_bert, "--tasks", "squad_v2", "--data-dir", str(squad_dir),
            "--sizes", "16", "--trials", "1", "--k", "0", "4", "--epochs", "1", "--max-length", "128",
            "--storage", str(tmp_path)]
    assert main(argv) == 0
    rows = read_results(tmp_path / "incremental").set_index("k").sort_index()
    assert list(rows.index) == [0, 4] and set(rows["metric_name"]) == {"f1"}
    assert (rows["max_length"] == 128).all() and set(rows["data_source"]) == {"local"}
    assert rows["subset_seed"].nunique() == 1  # one trial index: the same questions for every k
    for name in ("exact", "f1", "has_ans_exact", "has_ans_f1", "no_ans_exact", "no_ans_f1"):
        assert rows[f"dev_{name}"].between(0, 1).all(), name
    assert (rows["dev_metric"] == rows["dev_f1"]).all()
    assert set(rows["recipe_version"]) == {3}, "the span head's recipe, as the trials' ids say"
    # The analysis summarizes exact match (or any other SQuAD column) as it does the headline metric.
    from analysis.stats import condition_table

    exact = condition_table(rows.reset_index(), value="dev_exact").set_index("k")["mean"]
    assert exact.to_dict() == pytest.approx(rows["dev_exact"].to_dict())


def test_the_span_model_draws_its_head_alone_from_its_seed(tiny, tiny_family):
    """Nothing random is drawn for the pretrained encoder (Hugging Face's random init of it, then overwritten,
    was 1.0 s of a BERT-base trial's set-up on one CPU thread); the head comes from the seed alone, the global
    stream untouched."""
    import torch

    from tests.test_fused_engine import Calls
    from trainables.qa import build_span_model

    def drawn(calls: Calls) -> int:  # random numbers drawn into real tensors (on the meta device nothing is)
        return sum(args[0].numel() for op, args in calls.calls if args and isinstance(args[0], torch.Tensor)
                   and op.__name__.rstrip("_") in ("normal", "uniform", "bernoulli", "random", "exponential")
                   and args[0].device.type != "meta")

    for pretrained in (tiny, load_pretrained(tiny_family("roberta"))):
        state = torch.get_rng_state()
        with Calls() as calls:
            model = build_span_model(pretrained, 7)
        assert drawn(calls) == model.qa_outputs.weight.numel(), "the head's weights alone are drawn"
        assert torch.equal(torch.get_rng_state(), state)
        for name, value in model.base_model.state_dict().items():
            assert torch.equal(value, pretrained.state_dict[name]), name
        positions = torch.arange(model.config.max_position_embeddings)[None]
        assert torch.equal(model.base_model.embeddings.position_ids, positions), "buffers made again"
        # the head, drawn after the encoder's fresh parts as a classifier's is, differs by seed alone (the encoders
        # hand over to a classifier's as before: the test below)
        assert torch.equal(build_span_model(pretrained, 7).qa_outputs.weight, model.qa_outputs.weight)
        assert not torch.equal(build_span_model(pretrained, 8).qa_outputs.weight, model.qa_outputs.weight)


def test_trials_that_read_squad_are_of_the_span_heads_recipe_and_the_rest_keep_theirs():
    from sweep.experiments import GridSettings
    from trialrows.experiments import incremental, sequential

    settings = GridSettings.of(model="bert-base-uncased", tasks=("sst2", "squad_v2"), sizes=(500,),
                               trials=((0, 1),), k=(12,), max_length=128)  # as with sst2 alone
    assert {s.task: s.recipe_version for s in incremental(settings, 12)} == {"sst2": 2, "squad_v2": 3}
    (sst2,) = [s for s in incremental(settings, 12) if s.task == "sst2"]
    assert sst2.trial_id == "incremental-sst2-n500-k12-t0-6937124c60", "a trial reading no squad keeps its id"
    by_tasks = {(s.intermediate_task, s.task): s.recipe_version for s in sequential(settings, 12)}
    assert by_tasks == {(None, "sst2"): 2, ("squad_v2", "sst2"): 3, ("sst2", "squad_v2"): 3, (None, "squad_v2"): 3}


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_span_and_classifier_encoders_hand_over_for_sequential_finetuning(tiny_family, family):
    # Sequential finetuning loads one task's encoder into the other's (strictly): a RoBERTa span model with the
    # bare model's pooler, which the RoBERTa classifier lacks, crashed squad_v2 first or last.
    from trainables.models import build_classifier
    from trainables.qa import build_span_model

    pretrained = load_pretrained(tiny_family(family))
    span, classifier = build_span_model(pretrained, 0), build_classifier(pretrained, 2, 0)
    span.base_model.load_state_dict(classifier.base_model.state_dict())
    classifier.base_model.load_state_dict(span.base_model.state_dict())


def test_reinit_pooler_is_refused_for_squad_v2_whose_span_head_never_reads_it(tiny_bert, tmp_path, capsys):
    # The BERT span model keeps a pooler it never reads: the flag reset it for nothing (but the draws after it).
    from sweep.cli import main

    argv = ["incremental", "--model", tiny_bert, "--tasks", "squad_v2", "--sizes", "16", "--trials", "1",
            "--storage", str(tmp_path), "--dry-run"]
    assert main([*argv, "--reinit-pooler"]) == 2
    assert "--reinit-pooler: squad_v2's span head reads every token's state, never the pooler" in \
        capsys.readouterr().err
    main(argv)
    assert "--reinit-pooler" not in capsys.readouterr().err
