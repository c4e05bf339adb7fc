"""The paper's recipe, exactly (issue 14): clipping, weight decay on weights only, the reinitialized pooler's
group, independent seeds per base seed, sequential weight change, the evaluation policy, probing on full
splits."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import trainables.finetune as ft
from sweep.cli import main
from sweep.experiments import GridSettings, trial_seeds
from trialrows.experiments import incremental
import trialrows.recipe as recipe
from trainables.ablations import Reinit, apply_ablation
from trainables.finetune import FinetuneConfig, finetune, make_optimizer, not_decayed
from trainables.models import build_classifier, layer_stack, pooler


def grad_norms_seen_by_the_optimizer(cfg, synthetic, pretrained) -> tuple[list[float], dict]:
    norms = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    handle = register_optimizer_step_pre_hook(record)
    try:
        result = finetune(cfg, synthetic, pretrained)
    finally:
        handle.remove()
    return norms, result


def test_gradients_above_the_norm_are_cut_and_counted(pretrained, synthetic):
    base = FinetuneConfig(task="synthetic", train_size=32, subset_seed=0, seed=0, epochs=2, lr=1e-3)
    free, unclipped = grad_norms_seen_by_the_optimizer(
        FinetuneConfig(**{**base.__dict__, "max_grad_norm": 0.0}), synthetic, pretrained)
    limit = float(np.median(free))  # about half of the steps have a gradient above it
    clipped, result = grad_norms_seen_by_the_optimizer(
        FinetuneConfig(**{**base.__dict__, "max_grad_norm": limit}), synthetic, pretrained)

    assert len(clipped) == len(free) == 8  # 32 examples, batch 8, 2 epochs
    assert max(free) > limit and unclipped["clipped_steps"] == 0 and unclipped["max_grad_norm"] == 0
    assert max(clipped) <= limit * (1 + 1e-5), "no step went through with a gradient above max_grad_norm"
    assert 1 <= result["clipped_steps"] <= 8 and result["max_grad_norm"] == limit
    assert result["recipe_version"] == recipe.RECIPE_VERSION == 2
    # Only the steps above the limit were touched: the first step (same weights, same batch) had its gradient cut
    # exactly when it was above the limit.
    assert math.isclose(clipped[0], min(free[0], limit), rel_tol=1e-5)


def test_weight_decay_skips_biases_and_layernorm_and_the_fresh_pooler_learns_at_the_reinit_rate(pretrained):
    model = build_classifier(pretrained, 2, seed=0)
    ablation = Reinit(layers=(3, 4), reinit_pooler=True)
    apply_ablation(ablation, model, 0)
    cfg = FinetuneConfig(task="synthetic", train_size=32, subset_seed=0, seed=0, ablation=ablation,
                         weight_decay=0.01, lr_multiplier=5.0, lr=1e-4)
    optimizer, _ = make_optimizer(model, cfg, np.arange(32))
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    assert len(group_of) == len(list(model.parameters())), "every parameter in exactly one group"

    for name, p in model.named_parameters():
        layernorm = "LayerNorm" in name
        expected = 0.0 if name.endswith("bias") or layernorm else 0.01
        assert group_of[id(p)]["weight_decay"] == expected, name
    assert group_of[id(model.bert.embeddings.word_embeddings.weight)]["weight_decay"] == 0.01  # embeddings decay
    skipped = [n for n, _ in model.named_parameters() if n.endswith("bias") or n.endswith("LayerNorm.weight")]
    assert len(not_decayed(model)) == len(skipped)

    fresh = [*layer_stack(model)[2].parameters(), *layer_stack(model)[3].parameters(), *pooler(model).parameters()]
    assert {group_of[id(p)]["lr"] for p in fresh} == {5e-4}
    kept = [*layer_stack(model)[0].parameters(), *model.bert.embeddings.parameters(), *model.classifier.parameters()]
    assert {group_of[id(p)]["lr"] for p in kept} == {1e-4}


def test_two_base_seeds_share_no_trial_seed_and_every_index_pairs():
    first = {trial_seeds(0, i) for i in range(200)}
    second = {trial_seeds(1, i) for i in range(200)}
    assert len(first) == len(second) == 200
    assert not ({s for pair in first for s in pair} & {s for pair in second for s in pair}), "no shared seed at all"
    assert all(0 <= s < 2**32 for pair in first for s in pair)

    a = incremental(GridSettings.of(model="m", tasks=("synthetic",), sizes=(24,), trials=((0, 3),), seed=0), num_layers=4)
    b = incremental(GridSettings.of(model="m", tasks=("synthetic",), sizes=(24,), trials=((0, 3),), seed=1), num_layers=4)
    for specs in (a, b):  # the paired design: every k of one index on one subset, head and batch order
        for index in range(3):
            same = [s for s in specs if s.trial_index == index]
            assert len(same) == 5 and len({(s.subset_seed, s.seed) for s in same}) == 1
    assert not {(s.subset_seed, s.seed) for s in a} & {(s.subset_seed, s.seed) for s in b}
    assert not {s.trial_id for s in a} & {s.trial_id for s in b}


def test_sequential_weight_change_is_measured_from_the_final_tasks_start(pretrained, synthetic, monkeypatch):
    after_first_phase, starts = [], []
    original_intermediate, original_distance = ft.finetune_intermediate, ft.weight_distance

    def intermediate(model, *args):
        out = original_intermediate(model, *args)
        after_first_phase.append(ft.layer_weights(model))
        return out

    def distance(start, model):
        starts.append(start)
        return original_distance(start, model)

    monkeypatch.setattr(ft, "finetune_intermediate", intermediate)
    monkeypatch.setattr(ft, "weight_distance", distance)
    cfg = FinetuneConfig(task="synthetic", train_size=32, subset_seed=0, seed=0, epochs=1, lr=1e-3,
                         intermediate_task="synthetic")
    result = finetune(cfg, synthetic, pretrained, intermediate=synthetic)

    (phase_one,) = after_first_phase
    final_start = starts[-1]  # the call that gives the row's weight_distance
    assert all(torch.equal(a, b) for layer_a, layer_b in zip(phase_one, final_start) for a, b in zip(layer_a, layer_b))
    assert len(result["intermediate_weight_distance"]) == len(result["weight_distance"]) == 4
    assert all(d > 0 for d in result["intermediate_weight_distance"])


def test_dev_is_evaluated_after_the_last_epoch_unless_asked_and_that_changes_no_number(pretrained, synthetic,
                                                                                       monkeypatch):
    import types

    # A clock that moves 1 s an evaluation: one evaluation stalled on a loaded machine took longer than three.
    clock, evaluate = [0.0], ft.evaluate

    def timed_evaluation(*args, **kwargs):
        clock[0] += 1.0
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(ft, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(ft, "evaluate", timed_evaluation)
    base = dict(task="synthetic", train_size=32, subset_seed=0, seed=0, epochs=3, lr=1e-3)
    last = finetune(FinetuneConfig(**base), synthetic, pretrained)
    every = finetune(FinetuneConfig(**base, eval_every=1), synthetic, pretrained)
    second = finetune(FinetuneConfig(**base, eval_every=2), synthetic, pretrained)
    assert last["dev_epochs"] == [3] and every["dev_epochs"] == [1, 2, 3] and second["dev_epochs"] == [2, 3]
    assert last["dev_metrics_by_epoch"] == [every["dev_metrics_by_epoch"][-1]] == [last["dev_metric"]]
    assert second["dev_metrics_by_epoch"] == every["dev_metrics_by_epoch"][1:]
    assert last["train_loss"] == every["train_loss"] and last["weight_distance"] == every["weight_distance"]
    assert (last["eval_seconds"], every["eval_seconds"]) == (1.0, 3.0)


def test_probing_paper_preset_probes_full_training_splits(tiny_bert, capsys):
    assert main(["probing", "--preset", "paper", "--model", tiny_bert, "--dry-run"]) == 0
    out = capsys.readouterr().out
    # The paper's grid on the whole training split of each task: 3 tasks x (embeddings + 4 layers) x 8 trials.
    for task, size in [("cola", 8551), ("qnli", 104743), ("sst2", 67349)]:
        assert any(line.split()[:3] == [task, str(size), "40"] for line in out.splitlines()), out
    assert "total: 120 trials" in out
    assert "500" not in out.split("total by size")[1]
