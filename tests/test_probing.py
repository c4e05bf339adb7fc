"""Probing the frozen model: masked mean-pooling, a frozen encoder, one encoder pass per training subset,
early stopping, a real Ray sweep writing one row per (probe, layer), and the probing figure."""
from __future__ import annotations

import dataclasses

import datasets
import numpy as np
import pandas as pd
import pytest
import torch

from analysis import figures as F
from analysis.results import prepare, read_results
from sweep.cli import main
from trainables.data import TokenizedTask, collate, tokenize_split
from trainables import probing
from trainables.models import load_pretrained, load_tokenizer
from trainables.probing import (
    PROBES, ProbeConfig, extract_features, frozen_encoder, make_head, predict, probe_subset, train_probe,
)  # fmt: skip

LAYERS = 4  # the tiny_bert fixture's


@pytest.fixture(scope="module")
def pretrained(tiny_bert):
    return load_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def task(tiny_bert) -> TokenizedTask:
    """A small two-class task of real sentences: 'good'/'bad' words decide the label."""
    rng = np.random.default_rng(0)
    words = {1: ["good", "great", "lovely", "fine"], 0: ["bad", "awful", "poor", "sad"]}

    def split(n):
        labels = rng.integers(0, 2, n)
        texts = [" ".join(["the film was", rng.choice(words[y])] + ["and long"] * int(rng.integers(0, 4)))
                 for y in labels]
        return tokenize_split(datasets.Dataset.from_dict({"text_a": texts, "label": labels}),
                              load_tokenizer(tiny_bert), 32)

    return TokenizedTask(task="sst2", num_labels=2, metric="accuracy", source="local", tokenizer=tiny_bert,
                         max_length=32, train=split(40), validation=split(30))


def test_mean_pool_ignores_padding(pretrained, tiny_bert):
    tokenizer = load_tokenizer(tiny_bert)
    texts = ["a short one", "a much longer sentence, padded to nothing at all since it sets the batch width"]
    split = tokenize_split(datasets.Dataset.from_dict({"text_a": texts, "label": [0, 1]}), tokenizer, 64)
    encoder = frozen_encoder(pretrained)
    args = dict(features={"mean", "cls"}, device=torch.device("cpu"), pad_id=0)
    alone = extract_features(encoder, split, np.array([0]), batch_size=1, **args)
    padded = extract_features(encoder, split, np.array([0, 1]), batch_size=2, **args)  # row 0 padded
    assert split.lengths[1] > split.lengths[0] + 10
    torch.testing.assert_close(padded["mean"][0], alone["mean"][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded["cls"][0], alone["cls"][0], atol=1e-5, rtol=1e-5)
    assert padded["mean"].shape == (2, LAYERS + 1, 64)
    # The same batch's hidden states averaged over every position (padding too) are something else.
    batch = {k: v for k, v in collate(split, np.array([0, 1]), 0).items() if k != "labels"}
    with torch.inference_mode():
        hidden = encoder(**batch, output_hidden_states=True).hidden_states
    naive = torch.stack(hidden, 1)[0].mean(dim=1)
    assert not torch.allclose(naive, alone["mean"][0], atol=1e-3)


def test_encoder_stays_frozen_and_features_are_computed_once_per_subset(pretrained, task):
    before = {k: v.clone() for k, v in pretrained.state_dict.items()}
    seen = []  # examples through the embeddings, over every forward of every module
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, kwargs, out: seen.append(out.shape[0]) if type(module).__name__.endswith("Embeddings")
        else None, with_kwargs=True)
    cfg = ProbeConfig(task="sst2", train_size=30, subset_seed=1, seed=1, max_epochs=3, patience=2, val_fraction=0.2)
    todo = [(probe, layer) for probe in PROBES for layer in range(LAYERS + 1)]
    reported = []
    probing._DEV_FEATURES.clear()  # as in a fresh worker process
    try:
        results = probe_subset(cfg, task, pretrained, todo, report=reported.append)
        first_pass = sum(seen)
        # The next subset in the same (reused) worker encodes its own examples only: the dev split's
        # features do not depend on the subset.
        other = probe_subset(dataclasses.replace(cfg, subset_seed=2), task, pretrained, todo[:2])
    finally:
        hook.remove()
    # 15 probes, one encoder pass: the 30 subset examples and the 30 dev examples, each once.
    assert first_pass == 30 + len(task.validation)
    assert sum(seen) - first_pass == 30
    assert not results[0]["dev_features_reused"] and all(r["dev_features_reused"] for r in other)
    assert [(r["probe"], r["layer"]) for r in reported] == todo and reported == results
    for name, value in pretrained.state_dict.items():
        assert torch.equal(value, before[name]), name
    assert not any(p.requires_grad for p in frozen_encoder(pretrained).parameters())
    assert {r["fit_size"] for r in results} == {24} and {r["val_size"] for r in results} == {6}
    assert {r["group_rows"] for r in results} == {15} and len({r["feature_seconds"] for r in results}) == 1
    assert all(r["status"] == "ok" and 0 <= r["dev_metric"] <= 1 and 1 <= r["stop_epoch"] <= 3 for r in results)
    # The same config gives the same numbers.
    again = probe_subset(cfg, task, pretrained, todo[:3])
    for first, second in zip(results[:3], again):
        assert first["dev_metric"] == second["dev_metric"] and first["val_losses"] == second["val_losses"]


def test_truncated_probe_trains_its_pooler_copy_not_the_encoders(pretrained, task):
    encoder = frozen_encoder(pretrained)
    original = encoder.pooler.dense.weight.clone()
    head = make_head("truncated", encoder, num_labels=2, seed=0)
    x, y = torch.randn(32, 64), torch.randint(0, 2, (32,))
    cfg = ProbeConfig(task="sst2", train_size=32, subset_seed=0, seed=0, max_epochs=2, patience=5, lr=1e-2)
    train_probe(head, x[:24], y[:24], x[24:], y[24:], cfg, torch.device("cpu"))
    assert not torch.equal(head.pooler.dense.weight, original)  # the head's pooler trained
    assert torch.equal(encoder.pooler.dense.weight, original)  # the model's did not


def test_early_stopping_stops_when_validation_stops_improving():
    # Noise features with noise labels: a fast-learning probe memorises the fit part and the validation loss
    # climbs after an epoch or two.
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(80, 32, generator=g), torch.randint(0, 2, (80,), generator=g)
    cfg = ProbeConfig(task="sst2", train_size=80, subset_seed=0, seed=0, max_epochs=40, patience=3, lr=0.05)
    head = make_head("mean-pool", _config_only(hidden=32), num_labels=2, seed=0)
    fit = train_probe(head, x[:60], y[:60], x[60:], y[60:], cfg, torch.device("cpu"))
    assert fit.stop_epoch < cfg.max_epochs
    assert fit.stop_epoch == fit.best_epoch + cfg.patience and len(fit.val_losses) == fit.stop_epoch
    assert min(fit.val_losses[fit.best_epoch:]) >= fit.val_losses[fit.best_epoch - 1]
    # The head holds its best epoch's weights, not the last epoch's.
    loss = torch.nn.functional.cross_entropy(predict(head, x[60:])[0], y[60:])
    assert float(loss) == pytest.approx(fit.val_losses[fit.best_epoch - 1], rel=1e-6)


def _config_only(hidden: int):
    """A stand-in encoder for make_head: the config is all a mean-pool head reads."""
    from transformers import BertConfig

    module = torch.nn.Module()
    module.config = BertConfig(hidden_size=hidden)
    return module


def test_probing_sweep_writes_a_row_per_probe_and_layer_and_reruns_nothing(ray_local, tiny_bert, tmp_path, capsys):
    argv = ["probing", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--trials", "1",
            "--probes", "mean-pool", "cls-pooler", "--max-probe-epochs", "3", "--storage", str(tmp_path)]
    assert main(argv) == 0
    rows = read_results(tmp_path / "probing")
    assert len(rows) == 2 * (LAYERS + 1) and rows["trial_id"].is_unique
    assert set(rows["experiment"]) == {"probing"} and set(rows["status"]) == {"ok"}
    assert sorted(zip(rows["probe"], rows["layer"])) == sorted(
        (p, j) for p in ("mean-pool", "cls-pooler") for j in range(LAYERS + 1))
    for column in ["dev_metric", "dev_accuracy", "stop_epoch", "best_epoch", "val_loss", "feature_seconds",
                   "feature_flops", "wall_seconds", "model_flops", "mfu", "torch_version"]:
        assert rows[column].notna().all(), column
    assert (rows["stop_epoch"] <= 3).all() and set(rows["epochs"]) == {3}
    assert "probes in 1 Tune trials" in capsys.readouterr().out  # one encoder pass for the subset
    files = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "probing" / "rows").iterdir()}

    assert main(argv) == 0  # finished: runs nothing, rewrites nothing
    assert "10 already done, 0 to run" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "probing" / "rows").iterdir()} == files


def test_probing_options_are_checked_before_any_work(tiny_bert, tmp_path, capsys):
    code = main(["probing", "--model", tiny_bert, "--layers", "0", "5", "--patience", "0", "--probe-lr", "-1",
                 "--probe-val-fraction", "1.5", "--storage", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and not any(tmp_path.iterdir())
    assert "--layers: 5 is outside 0..4" in err and "--layers: 0" not in err
    assert "--patience: 0" in err and "--probe-lr: -1.0" in err and "--probe-val-fraction: 1.5" in err


def test_probing_figure_overlays_probes_on_the_incremental_curve():
    records = []
    for t in range(3):
        for j in range(LAYERS + 1):
            base = {"task": "sst2", "model": "m", "train_size": 500, "trial_index": t, "reinit_layers": [],
                    "reinit_mode": "intended", "metric_name": "accuracy", "status": "ok"}
            records.append({**base, "trial_id": f"i{t}{j}", "experiment": "incremental", "k": j,
                            "dev_metric": 0.6 + 0.05 * j + 0.01 * t})
            records.append({**base, "trial_id": f"p{t}{j}", "experiment": "probing", "layer": j,
                            "probe": "mean-pool", "stop_epoch": 5, "dev_metric": 0.5 + 0.02 * j + 0.01 * t})
    (plot,) = F.probing_figure(prepare(pd.DataFrame.from_records(records)))
    (ax,) = [a for a in plot.figure.axes if a.get_visible()]
    assert ax.get_title() == "SST-2, 500 examples"
    lines = {line.get_label(): line for line in ax.get_lines()}
    probe, tuned = lines["probe (mean-pool), frozen model at layer k"], lines["finetuned, layers 1..k pretrained"]
    assert probe.get_linestyle() == "--" and list(probe.get_xdata()) == list(range(LAYERS + 1))
    assert list(probe.get_ydata()) == pytest.approx([0.51 + 0.02 * j for j in range(LAYERS + 1)])
    assert list(tuned.get_ydata()) == pytest.approx([0.61 + 0.05 * j for j in range(LAYERS + 1)])
    assert F.probing_figure(prepare(pd.DataFrame.from_records([r for r in records if "k" in r]))) == []


# --- settings applied as the rows record them -------------------------------------------------------------


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
