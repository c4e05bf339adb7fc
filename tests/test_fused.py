"""Fused packs (trainables.fused): each trial of a pack trains exactly as it would alone."""
from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trainables.finetune
from trainables.ablations import HeadReinit, Permute, Reinit
from trainables.data import tokenize_task
from trainables.finetune import FinetuneConfig, finetune
from trainables.fused import Pack, finetune_pack
from trainables.models import load_pretrained, load_tokenizer
from trainables.tasks import load_task

LAYERS = 4


def without_dropout(pretrained):
    config = copy.deepcopy(pretrained.config)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return dataclasses.replace(pretrained, config=config)


@pytest.fixture(scope="module")
def pretrained(tiny_bert):
    return load_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def quiet(pretrained):
    return without_dropout(pretrained)


@pytest.fixture(scope="module")
def synthetic(tiny_bert):
    return tokenize_task(load_task("synthetic"), load_tokenizer(tiny_bert), "tiny", 128)


def trial(seed: int, ablation=Reinit(), **fields) -> FinetuneConfig:
    base = dict(task="synthetic", train_size=20, subset_seed=seed % 3, seed=seed, epochs=2, lr=1e-3,
                weight_decay=0.01)
    return FinetuneConfig(**{**base, **fields}, ablation=ablation)


# Different k, layer orders, a head, reinit and per-layer learning rates, a reinitialized pooler, LayerNorm kept,
# no clipping, a clip that always bites, no weight decay: everything a trial may own.
MIXED = [
    trial(0, Reinit.incremental(2, LAYERS)),
    trial(1, Permute.from_seed(5, LAYERS)),
    trial(2, HeadReinit(layer=3, head=1)),
    trial(3, Reinit.incremental(1, LAYERS, reinit_pooler=True), lr_multiplier=4.0),
    trial(4, layer_lr_multipliers=(0.5, 1.0, 2.0, 3.0)),
    trial(5, Reinit.incremental(3, LAYERS, keep_layernorm=True), max_grad_norm=0.0),
    trial(6, Reinit(layers=(2,)), max_grad_norm=0.05, weight_decay=0.0),
    trial(7, Permute.from_seed(9, LAYERS), lr=3e-4),
]


class LossRecorder:
    """Stands in for torch.nn.functional inside trainables.finetune: records every training loss."""

    def __init__(self):
        self.losses: list[float] = []

    def __getattr__(self, name):
        return getattr(F, name)

    def cross_entropy(self, *args, **kwargs):
        loss = F.cross_entropy(*args, **kwargs)
        self.losses.append(float(loss.detach()))
        return loss


def alone(cfg, data, pretrained, monkeypatch) -> tuple[list[float], dict]:
    recorder = LossRecorder()
    monkeypatch.setattr(trainables.finetune, "F", recorder)
    result = finetune(cfg, data, pretrained)
    monkeypatch.undo()
    return recorder.losses, result


def packed_losses(cfgs, data, pretrained) -> np.ndarray:
    """[steps over all epochs, trials] of one pack."""
    pack = Pack(cfgs, data, pretrained)
    return torch.cat([pack.train_epoch()[0] for _ in range(cfgs[0].epochs)]).numpy()


@pytest.mark.parametrize("members", [[3], [0, 2, 4], list(range(8))], ids=["pack1", "pack3", "pack8"])
def test_each_trial_of_a_pack_trains_as_it_would_alone(members, quiet, synthetic, monkeypatch):
    cfgs = [MIXED[i] for i in members]
    losses = packed_losses(cfgs, synthetic, quiet)
    results = finetune_pack(cfgs, synthetic, quiet)
    for column, cfg in enumerate(cfgs):
        expected_losses, expected = alone(cfg, synthetic, quiet, monkeypatch)
        assert len(expected_losses) == len(losses) == 6  # 20 examples in batches of 8, 2 epochs
        np.testing.assert_allclose(losses[:, column], expected_losses, rtol=2e-4, atol=1e-5)
        got = results[column]
        assert got["status"] == expected["status"] == "ok"
        assert got["dev_metric"] == pytest.approx(expected["dev_metric"], abs=1e-9)
        assert got["train_loss"] == pytest.approx(expected["train_loss"], rel=2e-4)
        assert got["clipped_steps"] == expected["clipped_steps"]
        assert got["lr_last"] == pytest.approx(expected["lr_last"])
        np.testing.assert_allclose(got["weight_distance"], expected["weight_distance"], rtol=1e-3)
        assert got["dev_epochs"] == expected["dev_epochs"] == [2]  # dev after the last epoch only
        np.testing.assert_allclose(got["dev_metrics_by_epoch"], expected["dev_metrics_by_epoch"], atol=1e-9)
        assert set(expected) - {"intermediate_weight_distance"} <= set(got)
        assert got["pack_size"] == len(cfgs) and got["pack_id"] == results[0]["pack_id"]
    # the clip that always bites did bite, and a trial without clipping never counts
    by_seed = {cfg.seed: r for cfg, r in zip(cfgs, results)}
    if 6 in by_seed:
        assert by_seed[6]["clipped_steps"] == 6 and by_seed[5]["clipped_steps"] == 0


def test_over_three_epochs_a_packs_trials_see_each_epochs_batches_as_they_would_alone(quiet, synthetic, monkeypatch):
    """The pack draws an epoch's batch orders while the epoch before runs (Trainer); each draw must still be
    the next of the trial's stream, as `finetune` makes it at the epoch's start. Two epochs cannot tell: a
    stream left behind by one draw shows in the third epoch's batches."""
    cfgs = [dataclasses.replace(MIXED[i], epochs=3, eval_every=1) for i in (0, 2)]
    for got, cfg in zip(finetune_pack(cfgs, synthetic, quiet), cfgs):
        _, expected = alone(cfg, synthetic, quiet, monkeypatch)
        assert got["train_loss"] == pytest.approx(expected["train_loss"], rel=2e-4)
        np.testing.assert_allclose(got["dev_metrics_by_epoch"], expected["dev_metrics_by_epoch"], atol=1e-9)
        np.testing.assert_allclose(got["weight_distance"], expected["weight_distance"], rtol=1e-3)


def test_in_bf16_each_trial_of_a_pack_trains_as_it_would_alone(quiet, synthetic, monkeypatch):
    # bf16 is what GPUs run: the pack casts its weights once per update (PackEncoder.refresh), a lone trial
    # at every use under autocast. A pack that kept its first cast drifts by 8-16% here.
    cfgs = [dataclasses.replace(MIXED[i], precision="bf16") for i in (0, 6, 1)]
    losses = packed_losses(cfgs, synthetic, quiet)
    for column, cfg in enumerate(cfgs):
        expected_losses, _ = alone(cfg, synthetic, quiet, monkeypatch)
        np.testing.assert_allclose(losses[:, column], expected_losses, rtol=2e-3)


def test_the_vocabulary_gradient_read_by_rows_on_cpu_equals_the_whole_table_read_on_gpus(quiet, synthetic):
    cfgs = [MIXED[i] for i in (0, 5, 6)]  # seed 6 is clipped at every step, seed 5 never
    by_rows, whole = Pack(cfgs, synthetic, quiet), Pack(cfgs, synthetic, quiet)
    whole.words.sparse = False  # what a CUDA pack does
    assert by_rows.words.sparse
    rows_losses, rows_flops = by_rows.train_epoch()
    whole_losses, whole_flops = whole.train_epoch()
    np.testing.assert_allclose(rows_losses.numpy(), whole_losses.numpy(), rtol=1e-5)
    assert by_rows.clipped.tolist() == whole.clipped.tolist() and by_rows.clipped.tolist()[1:] == [0, 3]
    np.testing.assert_allclose(by_rows.weights["word"].detach().numpy(), whole.weights["word"].detach().numpy(),
                               rtol=1e-5, atol=1e-7)
    assert not torch.equal(by_rows.weights["word"], Pack(cfgs, synthetic, quiet).weights["word"]), "the table trained"


def test_with_dropout_a_trial_gives_the_same_numbers_whatever_its_neighbours(pretrained, synthetic):
    assert pretrained.config.hidden_dropout_prob > 0 and pretrained.config.attention_probs_dropout_prob > 0
    me = MIXED[1]
    alone_losses = packed_losses([me], synthetic, pretrained)[:, 0]
    with_three = packed_losses([MIXED[0], me, MIXED[5]], synthetic, pretrained)[:, 1]
    others = [MIXED[7], MIXED[2], MIXED[4], me]
    with_others = packed_losses(others, synthetic, pretrained)[:, 3]
    np.testing.assert_allclose(with_three, alone_losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(with_others, alone_losses, rtol=1e-5, atol=1e-6)
    # dropout is really on: the same trial without it trains to other losses
    quiet_losses = packed_losses([me], synthetic, without_dropout(pretrained))[:, 0]
    assert np.abs(quiet_losses - alone_losses).max() > 1e-3


def test_a_diverging_trial_is_masked_and_spoils_no_pack_mate(quiet, synthetic):
    calm = [MIXED[0], MIXED[2]]
    wild = trial(11, Reinit.incremental(2, LAYERS), lr=float("inf"))
    before = finetune_pack(calm, synthetic, quiet)
    reports = []
    mixed = finetune_pack([calm[0], wild, calm[1]], synthetic, quiet, report=reports.append)
    assert mixed[1]["status"] == "diverged" and not math.isfinite(mixed[1]["train_loss"])
    assert mixed[1]["epoch"] == 1 and "dev_metric" not in mixed[1]
    assert [sorted(epoch) for epoch in reports] == [[0, 1, 2], [0, 2]]  # no report of it after it diverged
    assert reports[0][1]["status"] == "diverged" and reports[1][0]["epoch"] == 2
    for got, expected in zip([mixed[0], mixed[2]], before):
        assert got["status"] == "ok"
        assert got["dev_metric"] == expected["dev_metric"]
        assert got["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)


def test_a_member_left_with_non_finite_weights_is_diverged_though_its_loss_was_finite(quiet, synthetic):
    # One step an epoch: its loss is the start weights' (finite), and the update it makes leaves inf weights.
    # Reported ok, the member's row held the accuracy of argmax over nan logits (a constant guess) as a result.
    calm, wild = (trial(seed, Reinit.incremental(2, LAYERS), train_size=8, eval_every=1, **extra)
                  for seed, extra in ((0, {}), (11, {"lr": float("inf")})))
    reports = []
    calm_row, wild_row = finetune_pack([calm, wild], synthetic, quiet, report=reports.append)
    assert math.isfinite(reports[0][1]["train_loss"]) and reports[0][1]["status"] == "diverged"
    assert wild_row["epoch"] == 1 and "dev_metric" not in wild_row
    assert calm_row["status"] == "ok" and calm_row["epoch"] == 2


def test_trials_that_cannot_share_a_pack_are_refused(quiet, synthetic):
    with pytest.raises(ValueError, match="these differ: epochs"):
        Pack([MIXED[0], dataclasses.replace(MIXED[1], epochs=3)], synthetic, quiet)
    with pytest.raises(ValueError, match="sequential finetuning"):
        Pack([dataclasses.replace(MIXED[0], intermediate_task="synthetic")], synthetic, quiet)
