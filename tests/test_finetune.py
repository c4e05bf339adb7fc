"""The finetuning function on its own (no Ray): subsets, per-epoch reports, determinism, divergence."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from trainables.ablations import Reinit
from trainables.data import draw_subset
from trainables.finetune import FinetuneConfig, default_epochs, finetune


def test_paper_epoch_rule():
    assert default_epochs(500) == 5 and default_epochs(501) == 3 and default_epochs(50000) == 3
    assert FinetuneConfig(task="sst2", train_size=500, subset_seed=0, seed=0).epochs == 5
    assert FinetuneConfig(task="sst2", train_size=5000, subset_seed=0, seed=0, epochs=1).epochs == 1


def test_subsets_depend_only_on_their_seed():
    a, b, c = draw_subset(1000, 50, 3), draw_subset(1000, 50, 3), draw_subset(1000, 50, 4)
    assert np.array_equal(a, b)
    assert len(set(a)) == 50 and not np.array_equal(a, c)
    with pytest.raises(ValueError, match="train_size=2000 is larger than the train split"):
        draw_subset(1000, 2000, 0)
    with pytest.raises(ValueError, match="train_size=0 must be a positive"):
        draw_subset(1000, 0, 0)


def test_tokenized_once_into_flat_arrays(synthetic):
    split = synthetic.train
    assert split.offsets[-1] == len(split.input_ids) and len(split.offsets) == len(split) + 1
    assert split.lengths.max() <= 128 and split.lengths.min() > 2
    assert synthetic.metric == "accuracy" and synthetic.num_labels == 2


def test_reports_every_epoch_and_is_deterministic(pretrained, synthetic):
    cfg = FinetuneConfig(task="synthetic", train_size=48, subset_seed=1, seed=1, epochs=2, eval_every=1,
                         ablation=Reinit(layers=(3, 4)))
    reports = []
    first = finetune(cfg, synthetic, pretrained, report=reports.append)
    assert [r["epoch"] for r in reports] == [1, 2]
    assert first["status"] == "ok" and first["metric_name"] == "accuracy"
    assert len(first["dev_metrics_by_epoch"]) == 2 and first["dev_metric"] == first["dev_metrics_by_epoch"][-1]
    assert 0.0 <= first["dev_metric"] <= 1.0 and first["dev_accuracy"] == first["dev_metric"]
    assert first["train_seconds"] > 0 and first["model_flops"] > 0 and 0 < first["mfu"] < 1.5
    again = finetune(cfg, synthetic, pretrained)
    assert again["dev_metrics_by_epoch"] == first["dev_metrics_by_epoch"]
    assert again["train_loss"] == first["train_loss"]


def test_divergence_stops_the_trial_and_says_so(pretrained, synthetic):
    cfg = FinetuneConfig(task="synthetic", train_size=32, subset_seed=0, seed=0, epochs=3, lr=float("inf"))
    result = finetune(cfg, synthetic, pretrained)
    assert result["status"] == "diverged"
    assert result["epoch"] == 1 and not math.isfinite(result["train_loss"])
    # With a held-out part (the lr-multipliers search's objective), the diverged model gives no objective: its
    # predictions' accuracy would be a made-up figure that Optuna learned from as a result.
    held = finetune(dataclasses.replace(cfg, val_size=8), synthetic, pretrained)
    assert held["status"] == "diverged" and math.isnan(held["val_metric"])
    assert math.isnan(held["val_metrics_by_epoch"][0])


def test_a_model_left_with_non_finite_weights_is_diverged_though_its_loss_was_finite(pretrained, synthetic):
    # One step an epoch: its loss is the start weights' (finite), and the update it makes leaves inf weights.
    # Reported ok, the row held the accuracy of argmax over nan logits (a constant guess) as a result.
    cfg = FinetuneConfig(task="synthetic", train_size=8, subset_seed=0, seed=0, epochs=2, eval_every=1,
                         lr=float("inf"))
    reports = []
    result = finetune(cfg, synthetic, pretrained, report=reports.append)
    assert math.isfinite(reports[0]["train_loss"])
    assert [r["status"] for r in reports] == ["diverged"] and result["epoch"] == 1
    assert "dev_metric" not in result and result["dev_metrics_by_epoch"] == []


def test_a_sequential_matrix_over_fractions_has_a_row_per_final_task_and_one_figure():
    # --fractions gives each final task its own share of its own train split, so its own train_size. The matrix
    # was the product of every size with every final task (rows of nothing but blanks, cola "at" sst2's size),
    # and the figure one single-row strip per final task instead of the task x task matrix.
    import pandas as pd

    from analysis import figures as F
    from analysis import tables as T
    from analysis.results import prepare

    sizes = {"sst2": 673, "cola": 86}
    rows = prepare(pd.DataFrame([
        {"trial_id": f"{task}-{via}-{t}", "experiment": "sequential", "task": task, "model": "m", "data_source": "hub",
         "train_size": sizes[task], "train_fraction": 0.01, "trial_index": t, "subset_seed": t, "seed": t,
         "reinit_layers": [], "epochs": 3, "lr": 2e-5, "intermediate_task": None if via == task else via,
         "status": "ok", "metric_name": "accuracy", "dev_metric": 0.6 + 0.1 * (via == "cola") + 0.01 * t}
        for task in sizes for via in sizes for t in range(2)]))
    matrix = T.sequential_matrix(rows)
    assert len(matrix) == 2 and matrix.notna().all().all()
    (plot,) = F.sequential_figure(rows)
    assert "0.01" in plot.title
