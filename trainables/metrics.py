"""Task metrics (GLUE's, and macro-F1 for the user's classification tasks) from predictions and gold labels.

Classification tasks take predicted class ids (argmax of the logits), regression (stsb) takes the predicted
scores. Undefined values (a correlation with a constant side) are reported as 0.0, "no measurable
association", so that means and t-intervals over trials stay finite when a trial collapses to one answer.
"""
from __future__ import annotations

import math

import numpy as np

from trainables.tasks import SQUAD_V2, Task, get_task

# The metrics reported for each task; a Task not listed here gets its headline metric alone.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "sst2": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "synthetic": ("accuracy",),
    "cola": ("matthews_correlation",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearman"),
}


def headline_metric(task: Task | str) -> str:
    return as_task(task).metric


def compute_metrics(task: Task | str, predictions, labels) -> dict[str, float]:
    task = as_task(task)
    if task.name == SQUAD_V2:  # answers are texts, not class ids
        raise ValueError(f"task '{SQUAD_V2}' is scored on answer texts by trainables.qa.squad_metrics, not on class ids")
    predictions, labels = check_inputs(task, predictions, labels)
    names = task.metrics or TASK_METRICS.get(task.name, (task.metric,))
    return {name: float(METRICS[name](predictions, labels)) for name in names}


def chance_figures(task: Task | str, predictions, labels) -> dict[str, float]:
    """What a model that learned nothing scores, beside what this one did: `chance_metric`, the headline
    metric of the best constant prediction (accuracy: the majority class; F1: the positive class, whichever
    is the majority; 0.0 for MCC and a correlation, by the convention above), and `constant_prediction`, 1.0
    when these predictions are one value for every example (a trial that fell back to it scores exactly a
    constant's share, which reads like a result unless it is shown)."""
    task = as_task(task)
    predictions, labels = check_inputs(task, predictions, labels)
    score = METRICS[task.metric]
    if task.is_regression:
        best = score(np.zeros_like(labels), labels)
    else:
        best = max(score(np.full_like(labels, c), labels) for c in range(task.num_labels))
    return {"chance_metric": float(best), "constant_prediction": float(np.all(predictions == predictions[0]))}


def as_task(task: Task | str) -> Task:
    return task if isinstance(task, Task) else get_task(task)


def check_inputs(task: Task, predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    for field, values in (("predictions", predictions), ("labels", labels)):
        if values.ndim != 1:
            hint = " (class ids: take the argmax of the logits)" if values.ndim == 2 else ""
            raise ValueError(f"{field} must be one value per example; got shape {values.shape}{hint}")
        if len(values) == 0:
            raise ValueError(f"{field} is empty; metrics need at least one example")
        if not task.is_regression:
            check_class_ids(field, values, task.num_labels)
    if len(predictions) != len(labels):
        raise ValueError(f"predictions has {len(predictions)} values but labels has {len(labels)}")
    if task.is_regression:
        return predictions.astype(np.float64), labels.astype(np.float64)
    return predictions.astype(np.int64), labels.astype(np.int64)


def check_class_ids(field: str, values: np.ndarray, num_labels: int) -> None:
    allowed = f"class ids 0..{num_labels - 1}"
    if values.dtype.kind == "f" and not np.all(values == np.round(values)):
        bad = values[values != np.round(values)][0]
        raise ValueError(f"{field} holds {bad.item()!r}; allowed: {allowed}")
    outside = values[(values < 0) | (values >= num_labels)]
    if len(outside):
        raise ValueError(f"{field} holds {outside[0].item()!r}; allowed: {allowed}")


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predictions == labels))


def matthews_correlation(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Gorodkin's multi-class MCC from the confusion matrix; for two classes it is the phi coefficient."""
    from scipy.stats.contingency import crosstab  # here: scipy.stats is half a second of every worker's start

    classes = np.union1d(predictions, labels)
    confusion = crosstab(labels, predictions, levels=(classes, classes)).count.astype(np.float64)
    true_counts, predicted_counts = confusion.sum(axis=1), confusion.sum(axis=0)
    total, correct = confusion.sum(), np.trace(confusion)
    covariance = correct * total - predicted_counts @ true_counts
    denominator = math.sqrt((total**2 - predicted_counts @ predicted_counts) * (total**2 - true_counts @ true_counts))
    # Zero when either side is constant: MCC is undefined there, and 0.0 is the usual convention.
    return covariance / denominator if denominator > 0 else 0.0


def f1(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    true_positive = np.sum((predictions == positive) & (labels == positive))
    predicted, actual = np.sum(predictions == positive), np.sum(labels == positive)
    # 2TP / (2TP + FP + FN); with no positive predicted nor present, F1 is undefined and reported as 0.0.
    return 2 * true_positive / (predicted + actual) if predicted + actual > 0 else 0.0


def macro_f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """The unweighted mean of each class's F1, over the classes in either labels or predictions."""
    return float(np.mean([f1(predictions, labels, positive=c) for c in np.union1d(predictions, labels)]))


def correlation(name: str):
    """scipy.stats' `name` correlation, imported when first computed."""
    def compute(predictions: np.ndarray, labels: np.ndarray) -> float:
        if np.all(predictions == predictions[0]) or np.all(labels == labels[0]):
            return 0.0  # undefined: scipy would warn and return nan
        import scipy.stats

        return float(getattr(scipy.stats, name)(predictions, labels).statistic)

    compute.__name__ = name
    return compute


METRICS = {
    "accuracy": accuracy,
    "matthews_correlation": matthews_correlation,
    "f1": f1,
    "macro_f1": macro_f1,
    "pearson": correlation("pearsonr"),
    "spearman": correlation("spearmanr"),
}
