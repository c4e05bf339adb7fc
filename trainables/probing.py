"""Probing the frozen pretrained encoder: a small classifier on one layer's representation. No Ray here
but the thin Tune wrapper at the bottom.

The paper's dashed lines (section 3): each layer's hidden states are averaged, "then passed through a linear
layer and softmax", with the encoder's parameters frozen. Since nothing below the classifier trains, the
encoder runs once per training subset (and once over the dev split) with every hidden state returned; each
layer's pooled features are kept, and every probe of that subset trains on those cached tensors. Probing a
layer costs a small classifier's training, never an encoder pass per epoch.

Three probes, named in each row's `probe` column; layer 0 is the embeddings output, 1..L the layers:

- `mean-pool` (the paper's text): layer j's hidden states averaged over the real tokens ([CLS] and [SEP]
  included, padding masked out) -> dropout -> linear.
- `cls-pooler` (the original code): layer j's [CLS] vector through the pretrained pooler (dense + tanh),
  frozen like the rest -> dropout -> linear.
- `truncated` (course report 003, "probing by truncation"): the model cut to the embeddings and layers
  1..j, all frozen, under the usual sequence-classification head: layer j's [CLS] vector -> the pooler,
  initialised from the pretrained pooler and *trained* (it is part of the head: the report freezes the kept
  layers and trains "only a classifier") -> dropout -> linear. Layers above j never touch layer j's output,
  so the truncated model's output is the full model's hidden state j and the cached [CLS] features serve.
  It differs from `cls-pooler` in that its pooler adapts to the layer it sits on (the pretrained pooler
  only ever saw the last layer).

At layer 0 the [CLS] vector is the same for every input (one token, position 0, segment 0), so both [CLS]
probes sit at chance there by construction.

Every probe's head is the finetuning head's (dropout at the model's classifier dropout, a linear layer drawn
from N(0, initializer_range), bias 0), seeded by the trial's seed alone, so the probes of one trial index
differ only in the features they read. Early stopping: a seeded validation part (`val_fraction` of the
training subset; the official dev split is never used for any decision) measures the loss after every
epoch; training stops once it has not improved for `patience` epochs (at most `max_epochs`), and the
weights of the best epoch are the ones evaluated on the dev split.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainables.cost import cost_fields, flop_shape, peak_flops, sequence_flops
from trainables.data import TokenizedSplit, TokenizedTask, collate, draw_subset, train_batches
from trainables.finetune import pick_device
from trainables.metrics import chance_figures, compute_metrics
from trainables.models import Pretrained, build_classifier, pooler, pretrained_pooler
from trainables.rows import make_row, where_it_runs, with_ended
from trainables.worker import quiet_worker
from trialrows.experiments import PROBE_KINDS as PROBES  # the row vocabulary, declared once
from trialrows.recipe import PRECISIONS, resolve_precision
# Which cached feature each probe reads: the two [CLS] probes differ in their head, not their input.
FEATURE_OF = {"mean-pool": "mean", "cls-pooler": "pooled-cls", "truncated": "cls"}
# The dev split's features depend on the frozen model and the split, not on the training subset: a worker
# process that Tune reuses for the next subset (reuse_actors) takes them from here instead of re-encoding.
_DEV_FEATURES: dict = {}
# Seed streams, so that the validation carve and the batch order never share draws with each other.
VALIDATION_STREAM, BATCH_ORDER_STREAM = 3, 4


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    task: str
    train_size: int
    subset_seed: int  # the same subset as the finetuning trials of this trial index
    seed: int  # validation carve, probe initialisation, dropout and batch order
    max_epochs: int = 40  # the paper's limit
    patience: int = 5  # epochs without a better validation loss before stopping
    val_fraction: float = 0.1  # share of the training subset held out for early stopping
    lr: float = 1e-3
    batch_size: int = 8
    weight_decay: float = 0.0
    eval_batch_size: int = 128
    gpu_fraction: float = 0.0
    threads: int = 1
    precision: str = "auto"  # of the frozen encoder's pass, as the row records it; auto: as for finetuning

    def __post_init__(self):
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.gpu_fraction))
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision '{self.precision}' is not one of {', '.join(PRECISIONS)}")
        if self.max_epochs < 1:
            raise ValueError(f"max_epochs={self.max_epochs} must be at least 1")
        if self.patience < 1:
            raise ValueError(f"patience={self.patience} must be at least 1")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction={self.val_fraction} must lie in (0, 1)")
        if self.train_size < 2:
            raise ValueError(f"train_size={self.train_size}: probing needs at least 2 examples (train + validation)")


def validation_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit, validation) positions into a subset of n examples: a seeded share `fraction` (at least one
    example, and at least one left to fit on) is held out."""
    n_val = min(max(1, round(fraction * n)), n - 1)
    order = np.random.default_rng(np.random.SeedSequence([seed, VALIDATION_STREAM])).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def frozen_encoder(pretrained: Pretrained) -> nn.Module:
    """The pretrained base model (embeddings, layers, pooler), in eval mode with no trainable parameter."""
    encoder = build_classifier(pretrained, num_labels=2, seed=0).base_model  # checks the weights fit
    return encoder.requires_grad_(False).eval()


def pool(hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, features, encoder_pooler) -> dict:
    """Every layer's pooled features of one batch, {feature: [batch, L + 1, hidden]} for the features asked."""
    stack = torch.stack(tuple(hidden_states), dim=1).float()  # [batch, L + 1, tokens, hidden]
    out = {}
    if "mean" in features:
        mask = attention_mask[:, None, :, None].to(stack.dtype)  # padding contributes nothing, nor counts
        out["mean"] = (stack * mask).sum(dim=2) / mask.sum(dim=2)
    if "cls" in features:
        out["cls"] = stack[:, :, 0]
    if "pooled-cls" in features:
        out["pooled-cls"] = torch.stack([encoder_pooler(h).float() for h in hidden_states], dim=1)
    return out


def extract_features(encoder: nn.Module, split: TokenizedSplit, rows: np.ndarray, features, batch_size: int,
                     device, pad_id: int, precision: str = "fp32") -> dict[str, torch.Tensor]:
    """One frozen pass over `rows` of a split: {feature: float32 [len(rows), L + 1, hidden]} on the CPU, in
    the order of `rows`. Batches go by length, so little compute is spent on padding."""
    by_length = np.argsort(split.lengths[rows], kind="stable")
    out: dict[str, torch.Tensor] = {}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.inference_mode(), autocast:
        for start in range(0, len(rows), batch_size):
            positions = by_length[start : start + batch_size]
            batch = {k: v.to(device) for k, v in collate(split, rows[positions], pad_id).items() if k != "labels"}
            hidden = encoder(**batch, output_hidden_states=True).hidden_states
            for name, value in pool(hidden, batch["attention_mask"], features, pooler(encoder)).items():
                if name not in out:
                    out[name] = torch.empty((len(rows), *value.shape[1:]), dtype=torch.float32)
                out[name][torch.from_numpy(positions)] = value.cpu()
    return out


class ProbeHead(nn.Module):
    """Dropout and a linear layer on a pooled feature; with `trained_pooler`, that pooler (a copy, trained)
    first turns a [CLS] vector into the pooled one, as the classification head of a truncated model does."""

    def __init__(self, hidden: int, num_labels: int, dropout: float, init_std: float, trained_pooler=None):
        super().__init__()
        self.pooler = trained_pooler
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_labels)
        nn.init.normal_(self.classifier.weight, std=init_std)  # as BERT initialises its classification head
        nn.init.zeros_(self.classifier.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.pooler is not None:
            features = self.pooler(features[:, None, :])  # the pooler reads token 0 of a sequence
        return self.classifier(self.dropout(features))


def make_head(probe: str, encoder: nn.Module, num_labels: int, seed: int) -> ProbeHead:
    config = encoder.config
    dropout = getattr(config, "classifier_dropout", None)
    dropout = dropout if dropout is not None else getattr(config, "hidden_dropout_prob", 0.1)
    trained_pooler = copy.deepcopy(pooler(encoder)).requires_grad_(True) if probe == "truncated" else None
    torch.manual_seed(seed)  # the head's draw, and the dropout stream from here on
    return ProbeHead(int(config.hidden_size), num_labels, float(dropout),
                     float(getattr(config, "initializer_range", 0.02)), trained_pooler)


def probe_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] == 1:  # regression (STS-B)
        return F.mse_loss(logits.squeeze(-1), labels.float())
    return F.cross_entropy(logits, labels)


def predict(head: nn.Module, features: torch.Tensor, batch_size: int = 1024) -> tuple[torch.Tensor, np.ndarray]:
    """(logits, predictions: class ids, or scores for regression) of a head on cached features."""
    head.eval()
    with torch.inference_mode():
        logits = torch.cat([head(features[i : i + batch_size]) for i in range(0, len(features), batch_size)])
    predictions = logits.squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1)
    return logits, predictions.cpu().numpy()


@dataclasses.dataclass
class ProbeFit:
    stop_epoch: int  # the last epoch trained
    best_epoch: int  # the epoch whose weights the head now holds
    val_losses: list[float]
    train_loss: float  # mean training loss of the best epoch
    diverged: bool = False


def probe_optimizer(head: nn.Module, cfg: ProbeConfig) -> torch.optim.AdamW:
    """AdamW at the probe's lr; the recipe's weight decay on weights only, never on biases (run_glue's
    no_decay, as finetuning applies it)."""
    params = dict(head.named_parameters())
    decayed = [p for name, p in params.items() if not name.endswith("bias")]
    spared = [p for name, p in params.items() if name.endswith("bias")]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": cfg.weight_decay},
                              {"params": spared, "weight_decay": 0.0}], lr=cfg.lr)


def train_probe(head: ProbeHead, fit_x, fit_y, val_x, val_y, cfg: ProbeConfig, device) -> ProbeFit:
    """AdamW on the head alone over cached features, in minibatches of a seeded order, with early stopping
    on the validation loss; the head ends holding its best epoch's weights."""
    head.to(device)
    fit_x, fit_y, val_x, val_y = (t.to(device) for t in (fit_x, fit_y, val_x, val_y))
    optimizer = probe_optimizer(head, cfg)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, BATCH_ORDER_STREAM]))
    best = ProbeFit(stop_epoch=0, best_epoch=0, val_losses=[], train_loss=float("nan"))
    best_loss, best_state = float("inf"), copy.deepcopy(head.state_dict())
    for epoch in range(1, cfg.max_epochs + 1):
        head.train()
        losses = []
        for batch in train_batches(np.arange(len(fit_x)), cfg.batch_size, rng):
            batch = torch.from_numpy(batch).to(device)
            loss = probe_loss(head(fit_x[batch]), fit_y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        train_loss = float(torch.stack(losses).mean())
        val_loss = float(probe_loss(predict(head, val_x)[0], val_y))
        best.stop_epoch = epoch
        best.val_losses.append(val_loss)
        if not (math.isfinite(train_loss) and math.isfinite(val_loss)):
            best.diverged = True
            break
        if val_loss < best_loss:
            best_loss, best_state = val_loss, copy.deepcopy(head.state_dict())
            best.best_epoch, best.train_loss = epoch, train_loss
        elif epoch - best.best_epoch >= cfg.patience:
            break
    head.load_state_dict(best_state)
    return best


def probe_subset(
    cfg: ProbeConfig,
    data: TokenizedTask,
    pretrained: Pretrained,
    todo: Sequence[tuple[str, int]],
    report: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Probe the frozen encoder at each (probe, layer) of `todo` on one training subset: one encoder pass
    over the subset and one over the dev split, then one small head per (probe, layer) on the cached
    features. Each probe's figures go to `report` as soon as it is done; returns them all."""
    started = time.perf_counter()
    torch.set_num_threads(max(1, cfg.threads))
    device = pick_device(cfg.gpu_fraction)
    unknown = sorted({p for p, _ in todo} - set(PROBES))
    if unknown:
        raise ValueError(f"probe {unknown[0]!r} is not one of {', '.join(PROBES)}")
    encoder = frozen_encoder(pretrained).to(device)
    num_layers = int(encoder.config.num_hidden_layers)
    needs_pooler = sorted({p for p, _ in todo if p != "mean-pool"})
    if needs_pooler and pretrained_pooler(encoder) is None:  # a pooler drawn fresh is no pretrained one
        raise ValueError(f"probe '{needs_pooler[0]}' reads the pooler, and model '{pretrained.name}' has none; "
                         "use the mean-pool probe")
    for _, layer in todo:
        if not 0 <= layer <= num_layers:
            raise ValueError(f"layer {layer} is outside 0..{num_layers} for model '{pretrained.name}'")
    pad_id = int(pretrained.config.pad_token_id or 0)

    rows = draw_subset(len(data.train), cfg.train_size, cfg.subset_seed)
    fit, val = validation_split(len(rows), cfg.val_fraction, cfg.seed)
    labels = torch.from_numpy(data.train.labels[rows])
    features = {FEATURE_OF[p] for p, _ in todo}
    tick = time.perf_counter()
    train_features = extract_features(encoder, data.train, rows, features, cfg.eval_batch_size, device, pad_id,
                                      cfg.precision)
    dev_key = (pretrained.name, data.task, data.source, data.tokenizer, data.max_length, str(device), cfg.precision)
    dev_cached = _DEV_FEATURES.get("key") == dev_key and features <= _DEV_FEATURES["features"].keys()
    if not dev_cached:
        _DEV_FEATURES.clear()  # one entry: a BERT-base dev split's features can take hundreds of MB
        _DEV_FEATURES.update(key=dev_key, features=extract_features(
            encoder, data.validation, np.arange(len(data.validation)), features, cfg.eval_batch_size, device, pad_id,
            cfg.precision))
    dev_features = _DEV_FEATURES["features"]
    if device.type == "cuda":
        torch.cuda.synchronize()
    feature_seconds = time.perf_counter() - tick
    encoded, shape = [data.train.lengths[rows]] + ([] if dev_cached else [data.validation.lengths]), flop_shape(encoder)
    feature_flops = sum(sequence_flops(lengths, shape, False, cfg.eval_batch_size) for lengths in encoded)
    # Each row carries an equal share of the set-up (model build, encoder passes), so rows sum to the total.
    shared_seconds = (time.perf_counter() - started) / len(todo)
    peak_flops(str(device), cfg.precision)  # a CPU peak is measured now (then cached), outside every timed stretch

    results = []
    for probe, layer in todo:
        feature = FEATURE_OF[probe]
        x, dev_x = train_features[feature][:, layer], dev_features[feature][:, layer]
        head = make_head(probe, encoder, data.num_labels, cfg.seed)
        tick = time.perf_counter()
        fitted = train_probe(head, x[fit], labels[fit], x[val], labels[val], cfg, device)
        train_seconds = time.perf_counter() - tick

        tick = time.perf_counter()
        _, val_predictions = predict(head, x[val].to(device))
        _, dev_predictions = predict(head, dev_x.to(device))
        val_metrics = compute_metrics(data.definition, val_predictions, data.train.labels[rows][val])
        metrics = {**compute_metrics(data.definition, dev_predictions, data.validation.labels),
                   **chance_figures(data.definition, dev_predictions, data.validation.labels)}
        eval_seconds = time.perf_counter() - tick

        n_head = sum(p.numel() for p in head.parameters())
        epochs = fitted.stop_epoch
        probe_flops = 2.0 * n_head * (3 * len(fit) * epochs + len(val) * (epochs + 1) + len(data.validation))
        wall = shared_seconds + train_seconds + eval_seconds
        flops = feature_flops / len(todo) + probe_flops
        result = {
            "status": "diverged" if fitted.diverged else "ok",
            "probe": probe,
            "layer": int(layer),
            "metric_name": data.metric,
            "model_type": pretrained.model_type,
            **data.columns(),
            "dev_metric": float(metrics[data.metric]),
            **{f"dev_{name}": float(value) for name, value in metrics.items()},
            "val_metric": float(val_metrics[data.metric]),
            "val_loss": min(fitted.val_losses),
            "val_losses": list(fitted.val_losses),
            "stop_epoch": fitted.stop_epoch,
            "best_epoch": fitted.best_epoch,
            "train_loss": fitted.train_loss,
            "fit_size": len(fit),
            "val_size": len(val),
            "train_seconds": train_seconds,
            "eval_seconds": eval_seconds,
            "feature_seconds": feature_seconds,
            "dev_features_reused": dev_cached,
            "feature_flops": feature_flops,
            "group_rows": len(todo),
            "wall_seconds": wall,
            **cost_fields(flops, wall, device, cfg.precision),
        }
        results.append(result)
        if report is not None:
            report(result)
    return results


def probing_trainable(config: dict, data: dict, pretrained: dict) -> None:
    """The Ray Tune function trainable: one trial per training subset, one report per (probe, layer), each
    carrying that probe's row (trainables.rows) and `row_id`, its trial_id."""
    from ray import tune

    quiet_worker()
    group = config["trial"]
    resources = tune.get_context().get_trial_resources().required_resources
    cfg = ProbeConfig(**group["probe"], gpu_fraction=resources.get("GPU", 0.0), threads=int(resources.get("CPU", 1)))
    entries = {(p["probe"], p["layer"]): p for p in group["probes"]}
    where = where_it_runs()

    def report(result: dict) -> None:
        entry = entries[(result["probe"], result["layer"])]
        figures = {**{k: v for k, v in result.items() if k != "status"}, **where, "row_id": entry["trial_id"]}
        tune.report(with_ended(figures, [make_row(entry["row"], figures, result["status"])]))

    probe_subset(cfg, data[group["data_key"]], pretrained[group["model_key"]], list(entries), report=report)
