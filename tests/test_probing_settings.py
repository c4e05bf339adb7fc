"""Settings a probing trial must apply as its row records them: the precision of the frozen pass, weight decay
on weights only."""
from __future__ import annotations

import dataclasses

import datasets
import numpy as np
import pytest
import torch

from trainables import probing
from trainables.data import TokenizedTask, tokenize_split
from trainables.models import load_pretrained, load_tokenizer
from trainables.probing import ProbeConfig, make_head, probe_subset, train_probe


@pytest.fixture(scope="module")
def pretrained(tiny_bert):
    return load_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def task(tiny_bert) -> TokenizedTask:
    rng = np.random.default_rng(0)
    words = {1: ["good", "great", "lovely"], 0: ["bad", "awful", "poor"]}

    def split(n):
        labels = rng.integers(0, 2, n)
        texts = [f"the film was {rng.choice(words[y])} and long" for y in labels]
        return tokenize_split(datasets.Dataset.from_dict({"text_a": texts, "label": labels}),
                              load_tokenizer(tiny_bert), 32)

    return TokenizedTask(task="sst2", num_labels=2, metric="accuracy", source="local", tokenizer=tiny_bert,
                         max_length=32, train=split(24), validation=split(16))


def test_probing_applies_the_precision_its_row_records(pretrained, task):
    # The row's `precision` is the sweep's (--precision, auto resolved by the trial's GPU share); the frozen
    # pass must run in it, on a CPU as on a GPU, and a dev split encoded in another precision is not reused.
    cfg = ProbeConfig(task="sst2", train_size=20, subset_seed=0, seed=0, max_epochs=2, precision="fp32")
    todo = [("mean-pool", 2)]
    probing._DEV_FEATURES.clear()
    fp32 = probe_subset(cfg, task, pretrained, todo)[0]
    bf16 = probe_subset(dataclasses.replace(cfg, precision="bf16"), task, pretrained, todo)[0]
    assert not bf16["dev_features_reused"]
    assert bf16["val_losses"] != fp32["val_losses"]
    again = probe_subset(cfg, task, pretrained, todo)[0]
    assert not again["dev_features_reused"] and again["val_losses"] == fp32["val_losses"]
    # auto on a trial without a GPU share is fp32, as for finetuning.
    assert ProbeConfig(task="sst2", train_size=2, subset_seed=0, seed=0).precision == "fp32"


def test_probing_trials_carry_the_precision_to_the_trainable():
    from sweep.experiments import EXPERIMENTS, GridSettings
    from sweep.probing import group_specs

    for precision in ("fp32", "bf16"):
        settings = GridSettings.of(model="m", tasks=("synthetic",), sizes=(24,), trials=((0, 1),),
                                   precision=precision, layers=(0, 1))
        (group,) = group_specs(EXPERIMENTS["probing"].build(settings, 2, 4))
        assert group["probe"]["precision"] == precision
        ProbeConfig(**group["probe"])  # the trainable builds its config from it


def test_probe_weight_decay_spares_biases(pretrained):
    # The recipe's weight decay is on weights only, never on biases (run_glue's no_decay). On all-zero features
    # the weight gets no gradient and the bias's path does not depend on it: with the bias spared, it is the
    # same with and without decay.
    encoder = probing.frozen_encoder(pretrained)
    x, y = torch.zeros(16, 64), torch.tensor([0, 1] * 8)
    heads = {}
    for decay in (0.0, 0.5):
        cfg = ProbeConfig(task="sst2", train_size=16, subset_seed=0, seed=0, max_epochs=3, patience=5, lr=1e-2,
                          weight_decay=decay)
        head = make_head("mean-pool", encoder, num_labels=2, seed=0)
        train_probe(head, x[:12], y[:12], x[12:], y[12:], cfg, torch.device("cpu"))
        heads[decay] = head
    torch.testing.assert_close(heads[0.5].classifier.bias, heads[0.0].classifier.bias, rtol=0, atol=0)
    assert not torch.equal(heads[0.5].classifier.weight, heads[0.0].classifier.weight)
    # The truncated probe's trained pooler: its bias spared too, its weight decayed.
    head = make_head("truncated", encoder, num_labels=2, seed=0)
    groups = probing.probe_optimizer(head, ProbeConfig(task="sst2", train_size=2, subset_seed=0, seed=0,
                                                       weight_decay=0.5)).param_groups
    decay_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert {name: decay_of[id(p)] for name, p in head.named_parameters()} == {
        "pooler.dense.weight": 0.5, "pooler.dense.bias": 0.0, "classifier.weight": 0.5, "classifier.bias": 0.0}
