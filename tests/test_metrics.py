"""Metrics against scipy and hand-computed confusion matrices."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from trainables.metrics import chance_figures, compute_metrics, headline_metric, matthews_correlation
from trainables.tasks import TASKS, Task


@pytest.mark.parametrize("seed", range(5))
def test_binary_mcc_is_the_phi_coefficient(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 200)
    predictions = np.where(rng.random(200) < 0.7, labels, 1 - labels)
    expected = scipy.stats.pearsonr(predictions, labels).statistic
    assert compute_metrics("cola", predictions, labels)["matthews_correlation"] == pytest.approx(expected)


def test_mcc_extremes_and_undefined():
    labels = [0, 1, 1, 0, 1]
    assert compute_metrics("cola", labels, labels)["matthews_correlation"] == pytest.approx(1.0)
    assert compute_metrics("cola", [1 - y for y in labels], labels)["matthews_correlation"] == pytest.approx(-1.0)
    # A constant predictor (or constant labels) leaves MCC undefined: reported as 0.0, not nan.
    assert compute_metrics("cola", [1] * 5, labels) == {"matthews_correlation": 0.0}
    assert compute_metrics("cola", labels, [0] * 5) == {"matthews_correlation": 0.0}


def test_multiclass_mcc_is_the_general_formula():
    # Gorodkin's R_K equals the covariance of one-hot coded predictions and labels, summed over classes,
    # over the square root of the summed variances: an independent route to the same number.
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 300)
    predictions = np.where(rng.random(300) < 0.6, labels, rng.integers(0, 3, 300))
    one_hot = np.eye(3)
    x, y = one_hot[predictions], one_hot[labels]
    cov = lambda a, b: sum(np.cov(a[:, k], b[:, k], bias=True)[0, 1] for k in range(3))  # noqa: E731
    expected = cov(x, y) / np.sqrt(cov(x, x) * cov(y, y))
    assert matthews_correlation(predictions, labels) == pytest.approx(expected)
    three_classes = Task("nli3", ("premise", "hypothesis"), 3, "matthews_correlation", None)
    assert compute_metrics(three_classes, predictions, labels) == {"matthews_correlation": pytest.approx(expected)}


def test_mrpc_accuracy_and_f1_of_a_hand_counted_confusion_matrix():
    # TP = 3, FN = 2, FP = 1, TN = 4: precision 3/4, recall 3/5, F1 = 2PR / (P + R) = 2/3.
    labels = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    predictions = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
    assert compute_metrics("mrpc", predictions, labels) == pytest.approx({"accuracy": 0.7, "f1": 2 / 3})
    assert compute_metrics("mrpc", [0, 0], [0, 0]) == {"accuracy": 1.0, "f1": 0.0}  # no positives at all


def test_stsb_pearson_and_spearman_with_ties_match_scipy():
    labels = np.array([0.0, 1.0, 1.0, 2.5, 4.0, 4.0, 5.0, 3.2])
    predictions = np.array([0.4, 1.1, 1.1, 2.0, 4.4, 3.9, 3.9, 3.0])
    result = compute_metrics("stsb", predictions, labels)
    assert set(result) == {"pearson", "spearman"}
    assert result["pearson"] == pytest.approx(scipy.stats.pearsonr(predictions, labels).statistic)
    assert result["spearman"] == pytest.approx(scipy.stats.spearmanr(predictions, labels).statistic)
    assert compute_metrics("stsb", [2.0] * 8, labels) == {"pearson": 0.0, "spearman": 0.0}


@pytest.mark.parametrize("task", ["sst2", "qnli", "rte", "wnli", "synthetic"])
def test_accuracy_tasks(task):
    assert compute_metrics(task, np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1])) == {"accuracy": 0.75}


def test_every_headline_metric_is_computed():
    for name, task in TASKS.items():
        labels = [0.5, 1.0, 3.0] if task.is_regression else [0, 1, 1]
        assert headline_metric(name) == headline_metric(task) == task.metric
        if name == "squad_v2":  # scored on answer texts (tests/test_qa.py), never on class ids
            with pytest.raises(ValueError, match="squad_metrics"):
                compute_metrics(task, labels, labels)
            continue
        assert task.metric in compute_metrics(task, labels, labels)
    assert [headline_metric(n) for n in ("sst2", "cola", "mrpc", "stsb")] == [
        "accuracy", "matthews_correlation", "f1", "pearson"
    ]


def test_bad_inputs_name_the_field_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"predictions must be one value per example; got shape \(2, 2\).*argmax"):
        compute_metrics("sst2", [[0.1, 0.9], [0.8, 0.2]], [1, 0])
    with pytest.raises(ValueError, match=r"predictions holds 2; allowed: class ids 0..1"):
        compute_metrics("sst2", [2, 0], [1, 0])
    with pytest.raises(ValueError, match=r"labels holds 0.5; allowed: class ids 0..1"):
        compute_metrics("mrpc", [1, 0], [0.5, 0])
    with pytest.raises(ValueError, match=r"predictions has 3 values but labels has 2"):
        compute_metrics("sst2", [1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match=r"predictions is empty"):
        compute_metrics("stsb", [], [])
    with pytest.raises(ValueError, match=r"task 'glue' is not known"):
        compute_metrics("glue", [1], [1])


def test_every_metric_and_its_chance_figure_against_the_textbook():
    # By hand, not through scipy's correlations (which metrics.py itself calls): F1 from precision and recall,
    # macro F1 as the mean over the classes seen, Pearson as covariance over the standard deviations, Spearman as
    # Pearson of tie-averaged ranks; chance as the closed form of the best constant answer.
    def f1_by_hand(p, y, c):
        tp, fp, fn = np.sum((p == c) & (y == c)), np.sum((p == c) & (y != c)), np.sum((p != c) & (y == c))
        return 0.0 if tp == 0 else 2 * (tp / (tp + fp)) * (tp / (tp + fn)) / (tp / (tp + fp) + tp / (tp + fn))

    def ranks(x):  # 1-based, ties take the mean of the ranks they span
        return np.array([np.sum(x < v) + (np.sum(x == v) + 1) / 2 for v in x])

    pearson = lambda a, b: np.mean((a - a.mean()) * (b - b.mean())) / (a.std() * b.std())  # noqa: E731
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 3, 90)
    predictions = np.where(rng.random(90) < 0.5, labels, rng.integers(0, 3, 90))
    nli3 = Task("nli3", ("a", "b"), 3, "macro_f1", None, metrics=("macro_f1", "accuracy", "matthews_correlation"))
    result = compute_metrics(nli3, predictions, labels)
    assert result["accuracy"] == pytest.approx(np.mean(predictions == labels))
    assert result["macro_f1"] == pytest.approx(np.mean([f1_by_hand(predictions, labels, c) for c in range(3)]))
    counts = np.bincount(labels, minlength=3)
    # A constant answer c scores F1 2n_c / (n + n_c) on its own class and 0 on the two others.
    best_macro = max(2 * counts / (90 + counts)) / 3
    assert chance_figures(nli3, predictions, labels) == {"chance_metric": pytest.approx(best_macro),
                                                         "constant_prediction": 0.0}
    binary = labels % 2
    for metric, chance in [("accuracy", max(binary.mean(), 1 - binary.mean())),
                           ("f1", 2 * binary.sum() / (90 + binary.sum())), ("matthews_correlation", 0.0),
                           ("macro_f1", max(2 * np.bincount(binary) / (90 + np.bincount(binary))) / 2)]:
        task = Task("two", ("a",), 2, metric, None, metrics=(metric,))
        assert chance_figures(task, np.ones(90, int), binary) == {"chance_metric": pytest.approx(chance),
                                                                 "constant_prediction": 1.0}, metric
    assert compute_metrics("mrpc", predictions % 2, binary)["f1"] == pytest.approx(f1_by_hand(predictions % 2,
                                                                                               binary, 1))

    scores = np.round(rng.uniform(0, 5, 60), 1)  # rounded: ties on both sides
    guesses = np.round(scores + rng.normal(0, 1.5, 60), 0)
    result = compute_metrics("stsb", guesses, scores)
    assert result["pearson"] == pytest.approx(pearson(guesses, scores))
    assert result["spearman"] == pytest.approx(pearson(ranks(guesses), ranks(scores)))
    assert chance_figures("stsb", guesses, scores)["chance_metric"] == 0.0
