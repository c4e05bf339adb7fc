"""SQuAD 2.0 as a task: extractive question answering with unanswerable questions.

Its raw data comes from the hub (`rajpurkar/squad_v2`) or from the official JSON files, checked before any
work. Questions are tokenized with their context into overlapping windows ("features"; Hugging Face's
question-answering example: the context only is truncated, `doc_stride` tokens shared between neighbours),
each feature labelled with the start and end token of the answer (the [CLS] token when the window holds no
answer). A span head (start and end logits per token) sits on any encoder the surgery code works on. At
evaluation the best span of a question over all its windows is mapped back to context text through the
tokenizer's character offsets, and the question is predicted unanswerable when the null score ([CLS] start +
[CLS] end) beats it. Metrics are the official SQuAD 2.0 evaluation's (exact match and F1 of normalized
answers, over all questions and split into answerable / unanswerable), as fractions in [0, 1] like every
other metric of the project (the official script prints them times 100).

Training subsets count questions: a subset of n questions trains on all of their windows.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import re
import string
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from trainables.data import TokenizedSplit, TokenizedTask, collate, eval_batches
from trainables.models import Pretrained, init_fresh_parts, load_encoder_weights
from trainables.tasks import SQUAD_V2, TaskData, get_task

if TYPE_CHECKING:  # an annotation only: trial workers never load datasets
    import datasets

TASK = get_task(SQUAD_V2)
N_BEST = 20  # start and end candidates per window, as the example's postprocessing
MAX_ANSWER_TOKENS = 30


# --- windows ---------------------------------------------------------------------------------------------


def doc_stride(max_length: int) -> int:
    """Tokens two neighbouring windows share: 128 at the example's 384, the same third at other lengths."""
    return max_length // 3


@dataclasses.dataclass(frozen=True)
class QASplit(TokenizedSplit):
    """Windows (rows, as a TokenizedSplit's) and the questions they come from. `labels` holds each window's
    (start, end) answer token; (cls, cls) where the window holds no answer."""

    feature_question: np.ndarray  # per window, the index of its question
    char_starts: np.ndarray  # per token (laid out as input_ids), its context character span; -1 outside
    char_ends: np.ndarray
    cls_positions: np.ndarray  # per window, where its [CLS] token is
    ids: tuple[str, ...]  # per question
    contexts: tuple[str, ...]
    answers: tuple[tuple[str, ...], ...]  # gold answer texts; () for an unanswerable question

    @property
    def num_questions(self) -> int:
        return len(self.ids)


def window_room_problem(task_data: TaskData, tokenizer, max_length: int) -> str | None:
    """Why `max_length` leaves a window no room for context (the longest question, the special tokens and the
    stride shared with the next window take it all), or None. Checked before any work: the tokenizer would
    otherwise fail inside every trial."""
    questions = [q.lstrip() for split in (task_data.train, task_data.validation) for q in split["question"]]
    longest = max((len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]), default=0)
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    if max_length - longest - specials > doc_stride(max_length):
        return None
    enough = next(n for n in range(max_length + 1, 100 * (longest + specials + 2))
                  if n - longest - specials > doc_stride(n))
    return (f"--max-length: {max_length} leaves no room for context in a {SQUAD_V2} window: its longest question is "
            f"{longest} tokens, {specials} more are special, and a window shares a third ({doc_stride(max_length)}) "
            f"with the next; give at least {enough}")


def tokenize_qa_split(dataset: datasets.Dataset, tokenizer, max_length: int) -> QASplit:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"task '{SQUAD_V2}' needs a fast tokenizer (character offsets); {type(tokenizer).__name__} is not")
    columns = dataset.to_dict()  # whole columns at once: a datasets Column iterates row by row
    contexts = columns["context"]
    encoded = tokenizer(
        [q.lstrip() for q in columns["question"]],  # some questions start with spaces that only waste the window
        contexts,
        truncation="only_second",
        max_length=max_length,
        stride=doc_stride(max_length),
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_token_type_ids=True,
        return_attention_mask=False,
    )
    answers = columns["answers"]
    question_of = np.asarray(encoded["overflow_to_sample_mapping"], dtype=np.int64)
    labels, cls_positions, char_starts, char_ends = [], [], [], []
    for i, offsets in enumerate(encoded["offset_mapping"]):
        in_context = np.asarray([s == 1 for s in encoded.sequence_ids(i)])
        spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        spans[~in_context] = -1
        cls = encoded["input_ids"][i].index(tokenizer.cls_token_id)
        answer = answers[question_of[i]]
        labels.append(answer_tokens(spans, answer["answer_start"][:1], answer["text"][:1], cls))
        cls_positions.append(cls)
        char_starts.append(spans[:, 0])
        char_ends.append(spans[:, 1])
    lengths = np.fromiter((len(s) for s in encoded["input_ids"]), dtype=np.int64)
    return QASplit(
        input_ids=np.concatenate(encoded["input_ids"]).astype(np.int32),
        token_type_ids=np.concatenate(encoded["token_type_ids"]).astype(np.int8),
        offsets=np.concatenate([[0], np.cumsum(lengths)]),
        labels=np.asarray(labels, dtype=np.int64).reshape(-1, 2),
        feature_question=question_of,
        char_starts=np.concatenate(char_starts).astype(np.int32),
        char_ends=np.concatenate(char_ends).astype(np.int32),
        cls_positions=np.asarray(cls_positions, dtype=np.int64),
        ids=tuple(columns["id"]),
        contexts=tuple(contexts),
        answers=tuple(tuple(a["text"]) for a in answers),
    )


def answer_tokens(spans: np.ndarray, starts: list[int], texts: list[str], cls: int) -> tuple[int, int]:
    """The first and last token of the (first) answer within one window; (cls, cls) when it is unanswerable
    or not wholly inside this window, as the example labels them."""
    if not starts:
        return cls, cls
    first_char, end_char = starts[0], starts[0] + len(texts[0])
    context = np.flatnonzero(spans[:, 0] >= 0)
    if spans[context[0], 0] > first_char or spans[context[-1], 1] < end_char:
        return cls, cls
    start = context[spans[context, 0] <= first_char][-1]
    end = context[spans[context, 1] >= end_char][0]
    return int(start), int(end)


def tokenize_qa_task(task_data: TaskData, tokenizer, tokenizer_name: str, max_length: int) -> TokenizedTask:
    return TokenizedTask(
        task=SQUAD_V2, num_labels=2, metric=TASK.metric, source=task_data.source, tokenizer=tokenizer_name,
        max_length=max_length, train=tokenize_qa_split(task_data.train, tokenizer, max_length),
        validation=tokenize_qa_split(task_data.validation, tokenizer, max_length),
    )


# --- subsets: they count questions --------------------------------------------------------------------------


def example_count(split: TokenizedSplit) -> int:
    """What a subset draws from: questions for question answering, else examples (rows)."""
    return split.num_questions if isinstance(split, QASplit) else len(split)


def example_rows(split: TokenizedSplit, examples: np.ndarray) -> np.ndarray:
    """The rows that train on the drawn examples: every window of the drawn questions."""
    if not isinstance(split, QASplit):
        return examples
    return np.flatnonzero(np.isin(split.feature_question, examples))


def select_questions(split: QASplit, questions: np.ndarray) -> QASplit:
    """The questions `questions` of a split, with all their windows, as a split of their own."""
    rows = example_rows(split, questions)
    tokens = np.concatenate([np.arange(split.offsets[r], split.offsets[r + 1]) for r in rows])
    renumber = np.full(split.num_questions, -1, dtype=np.int64)
    renumber[questions] = np.arange(len(questions))
    pick = lambda values: tuple(values[q] for q in questions)  # noqa: E731
    return QASplit(
        input_ids=split.input_ids[tokens], token_type_ids=split.token_type_ids[tokens],
        offsets=np.concatenate([[0], np.cumsum(split.lengths[rows])]), labels=split.labels[rows],
        feature_question=renumber[split.feature_question[rows]], char_starts=split.char_starts[tokens],
        char_ends=split.char_ends[tokens], cls_positions=split.cls_positions[rows],
        ids=pick(split.ids), contexts=pick(split.contexts), answers=pick(split.answers),
    )


# --- the model ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SpanLogits:
    # (batch, tokens, 2): start and end logits. Laid out so that cross_entropy(logits, labels) with labels
    # (batch, 2) is the mean of the start and end losses, as Hugging Face's QA heads compute theirs.
    logits: torch.Tensor


class SpanModel(nn.Module):
    """An encoder (`base_model`, the same module a sequence classifier has, its pooler or none, so surgery and
    sequential finetuning treat both alike) and a linear start/end head on its last hidden states."""

    def __init__(self, config):
        from transformers import AutoModel, AutoModelForSequenceClassification

        super().__init__()
        self.config = config
        self.base_model = AutoModel.from_config(config)
        # RoBERTa-style classifiers build their encoder without the pooler a bare model has. Dropped here too (after
        # its draw, so the head's draw is unchanged), else sequential finetuning's strict hand-over of the encoder
        # between this model and a classifier fails on the pooler's keys.
        with torch.device("meta"):
            classifier_encoder = AutoModelForSequenceClassification.from_config(copy.deepcopy(config)).base_model
        if getattr(classifier_encoder, "pooler", None) is None and getattr(self.base_model, "pooler", None) is not None:
            self.base_model.pooler = None
        self.qa_outputs = nn.Linear(int(config.hidden_size), 2)
        self.init_head()

    def init_head(self) -> None:
        nn.init.normal_(self.qa_outputs.weight, std=float(getattr(self.config, "initializer_range", 0.02)))
        nn.init.zeros_(self.qa_outputs.bias)

    def forward(self, input_ids, attention_mask, **inputs) -> SpanLogits:
        hidden = self.base_model(input_ids=input_ids, attention_mask=attention_mask, **inputs).last_hidden_state
        logits = self.qa_outputs(hidden)
        # Padding is never an answer: masked, so a window's logits do not depend on its batch's padding.
        return SpanLogits(logits.masked_fill(attention_mask.unsqueeze(-1) == 0, torch.finfo(logits.dtype).min))


def build_span_model(pretrained: Pretrained, seed: int) -> SpanModel:
    """A span model with the pretrained encoder and a fresh head drawn from `seed` (recipe 3), as
    `build_classifier` builds its model: on the meta device, so that nothing random is drawn for what the
    checkpoint holds; the encoder's initializer then draws just what it lacks (a pooler, for some checkpoints),
    and the head is drawn after it, from torch's generator seeded with `seed`, leaving the global stream as it
    was."""
    with torch.device("meta"):
        model = SpanModel(copy.deepcopy(pretrained.config))
    model.to_empty(device="cpu")
    load_encoder_weights(model.base_model, pretrained)
    init_fresh_parts(model.base_model, seed, then=model.init_head)
    return model


# --- evaluation --------------------------------------------------------------------------------------------


def evaluate_qa(model, split: QASplit, batch_size: int, compute) -> dict[str, float]:
    """The official SQuAD 2.0 metrics of the model's best answers to the split's questions."""
    model.eval()
    logits: list[np.ndarray] = [None] * len(split)
    with torch.inference_mode(), compute.autocast():
        for rows in eval_batches(split, batch_size):
            batch = {k: v.to(compute.device) for k, v in collate(split, rows, compute.pad_id).items() if k != "labels"}
            out = model(**batch).logits.float().cpu().numpy()
            for j, row in enumerate(rows):
                logits[row] = out[j, : split.lengths[row]]
    answers = best_answers(split, logits)
    # Chance, as for classes (trainables.metrics.chance_figures): the score of answering no question at all.
    return {**squad_metrics(answers, split.answers), "chance_metric": squad_metrics([""] * len(answers),
                                                                                   split.answers)["f1"],
            "constant_prediction": float(not any(answers))}


def best_answers(split: QASplit, logits: list[np.ndarray]) -> list[str]:
    """Per question, the highest-scoring span over all its windows (start + end logit; within the context,
    end not before start, at most MAX_ANSWER_TOKENS), or "" (unanswerable) when the lowest null score of its
    windows is higher."""
    best = [(-np.inf, "") for _ in range(split.num_questions)]
    null = np.full(split.num_questions, np.inf)
    for row, window in enumerate(logits):
        question, first = split.feature_question[row], split.offsets[row]
        starts, ends = split.char_starts[first : first + len(window)], split.char_ends[first : first + len(window)]
        cls = split.cls_positions[row]
        null[question] = min(null[question], window[cls, 0] + window[cls, 1])
        for s in np.argsort(window[:, 0])[::-1][:N_BEST]:
            for e in np.argsort(window[:, 1])[::-1][:N_BEST]:
                if starts[s] < 0 or starts[e] < 0 or e < s or e - s + 1 > MAX_ANSWER_TOKENS:
                    continue
                score = window[s, 0] + window[e, 1]
                if score > best[question][0]:
                    best[question] = (score, split.contexts[question][starts[s] : ends[e]])
    return [text if score >= null[q] else "" for q, (score, text) in enumerate(best)]


# --- the official metrics --------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """The official normalization: lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text, flags=re.UNICODE)
    return " ".join(text.split())


def exact_score(gold: str, prediction: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(prediction))


def f1_score(gold: str, prediction: str) -> float:
    gold_tokens, predicted_tokens = normalize_answer(gold).split(), normalize_answer(prediction).split()
    if not gold_tokens or not predicted_tokens:  # an empty answer (no answer) scores 1 against an empty one only
        return float(gold_tokens == predicted_tokens)
    common = sum((collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: list[str], answers) -> dict[str, float]:
    """Exact match and F1 (each question's best over its gold answers), over all questions and over the
    answerable (`has_ans_*`) and unanswerable (`no_ans_*`) ones; nan for a part with no question."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} questions")
    exact, f1, answerable = [], [], []
    for prediction, texts in zip(predictions, answers):
        golds = [t for t in texts if normalize_answer(t)] or [""]  # as the official script: no answer is ""
        exact.append(max(exact_score(g, prediction) for g in golds))
        f1.append(max(f1_score(g, prediction) for g in golds))
        answerable.append(bool(texts))  # as the official script: by the raw answers, before normalization
    exact, f1, answerable = np.asarray(exact), np.asarray(f1), np.asarray(answerable, dtype=bool)
    mean = lambda values, part: float(values[part].mean()) if part.any() else float("nan")  # noqa: E731
    everything = np.ones_like(answerable)
    return {
        "exact": mean(exact, everything), "f1": mean(f1, everything),
        "has_ans_exact": mean(exact, answerable), "has_ans_f1": mean(f1, answerable),
        "no_ans_exact": mean(exact, ~answerable), "no_ans_f1": mean(f1, ~answerable),
    }
