"""Finetuning one (partially reinitialized) model on one task subset: a plain function, no Ray.

The loop reads top to bottom: build the model from the shared pretrained weights, apply the ablation,
optionally finetune on an intermediate task first (sequential finetuning), train for a few epochs on the
subset, evaluate on the full validation split after every epoch, and hand each epoch's figures to `report`.
The last report also says how far each layer's weights moved from where finetuning started (after the
surgery). Ray Tune only wraps it (trainables.tune_trainable).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from trainables.ablations import Reinit, apply_ablation, reinitialized_layers
from trainables.cost import cost_fields, non_embedding_params, peak_flops, sequence_flops
from trainables.data import TokenizedSplit, TokenizedTask, collate, draw_subset, eval_batches, train_batches
from trainables.metrics import compute_metrics
from trainables.models import Pretrained, build_classifier, layer_stack

LR_SCHEDULES = ("linear", "constant")


def default_epochs(train_size: int) -> int:
    """The paper's rule: 5 epochs for subsets of 500 or fewer examples, 3 for larger ones."""
    return 5 if train_size <= 500 else 3


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    task: str
    train_size: int
    subset_seed: int
    seed: int  # classifier head, dropout, batch order and reinitialized weights
    ablation: Reinit = Reinit()  # any ablation value of trainables.ablations
    lr_multiplier: float = 1.0  # the reinitialized layers' learning rate over every other parameter's
    # lr-multipliers search: encoder layer i (1..L) at lr * layer_lr_multipliers[i-1]; embeddings, pooler and
    # head stay at lr. None: the `lr_multiplier` rule above.
    layer_lr_multipliers: tuple[float, ...] | None = None
    val_size: int = 0  # examples of the drawn subset held out of training for `val_metric`; 0: none
    intermediate_task: str | None = None  # sequential finetuning: train on this task first
    epochs: int | None = None  # None: default_epochs(train_size)
    lr: float = 2e-5
    batch_size: int = 8
    weight_decay: float = 0.0
    lr_schedule: str = "linear"
    eval_batch_size: int = 128
    gpu_fraction: float = 0.0  # the share of a GPU Ray gave this trial; 0 = CPU
    threads: int = 1  # CPU threads for torch

    def __post_init__(self):
        if self.epochs is None:
            object.__setattr__(self, "epochs", default_epochs(self.train_size))
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule '{self.lr_schedule}' is not one of {', '.join(LR_SCHEDULES)}")
        if not self.lr_multiplier > 0:
            raise ValueError(f"lr_multiplier {self.lr_multiplier} must be positive")
        if self.layer_lr_multipliers is not None:
            multipliers = tuple(float(m) for m in self.layer_lr_multipliers)  # a Tune config carries a list
            object.__setattr__(self, "layer_lr_multipliers", multipliers)
            if not all(m > 0 for m in multipliers):
                raise ValueError(f"layer_lr_multipliers {list(multipliers)} must all be positive")
            if self.lr_multiplier != 1.0:
                raise ValueError("give lr_multiplier or layer_lr_multipliers, not both")
        if not 0 <= self.val_size < self.train_size:
            raise ValueError(f"val_size={self.val_size} must be in 0..{self.train_size - 1} "
                             f"(train_size={self.train_size})")


def param_groups(model: torch.nn.Module, reinit_layers, lr: float, multiplier: float) -> list[dict]:
    """Optimizer groups: the reinitialized layers' parameters at lr * multiplier, every other parameter at lr.
    Every parameter of the model is in exactly one group (the original code left one layer out)."""
    stack = layer_stack(model)
    fast = {id(p) for i in reinit_layers for p in stack[i - 1].parameters()}
    groups = [
        {"name": "base", "params": [p for p in model.parameters() if id(p) not in fast], "lr": lr},
        {"name": "reinit", "params": [p for p in model.parameters() if id(p) in fast], "lr": lr * multiplier},
    ]
    return [g for g in groups if g["params"]]


def layer_param_groups(model: torch.nn.Module, lr: float, multipliers) -> list[dict]:
    """Optimizer groups for per-layer learning rates: encoder layer i's parameters at lr * multipliers[i-1],
    every other parameter (embeddings, pooler, classifier head) at lr; each parameter in exactly one group."""
    stack = layer_stack(model)
    if len(multipliers) != len(stack):
        raise ValueError(f"{len(multipliers)} layer learning-rate multipliers for a model of {len(stack)} layers")
    in_layers = {id(p) for layer in stack for p in layer.parameters()}
    groups = [{"name": "base", "params": [p for p in model.parameters() if id(p) not in in_layers], "lr": lr}]
    groups += [{"name": f"layer_{i}", "params": list(layer.parameters()), "lr": lr * m}
               for i, (layer, m) in enumerate(zip(stack, multipliers), start=1)]
    return groups


def hold_out(rows: np.ndarray, val_size: int, subset_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows to train on, rows held out): `val_size` examples of the drawn training subset, chosen by
    SeedSequence([subset_seed, 3]), are never trained on; the search's objective is measured on them, so
    the official dev split never feeds back into a search."""
    if val_size == 0:
        return rows, rows[:0]
    rng = np.random.default_rng(np.random.SeedSequence([subset_seed, 3]))
    held = np.sort(rng.choice(rows, val_size, replace=False))
    return np.setdiff1d(rows, held), held


def select_rows(split: TokenizedSplit, rows: np.ndarray) -> TokenizedSplit:
    """The examples `rows` of a split as a split of their own."""
    spans = [slice(split.offsets[r], split.offsets[r + 1]) for r in rows]
    return TokenizedSplit(
        input_ids=np.concatenate([split.input_ids[s] for s in spans]),
        token_type_ids=np.concatenate([split.token_type_ids[s] for s in spans]),
        offsets=np.concatenate([[0], np.cumsum(split.lengths[rows])]),
        labels=split.labels[rows],
    )


def layer_weights(model: torch.nn.Module) -> list[list[torch.Tensor]]:
    """A copy of every nn.Linear weight of each layer, layers 1..L in order."""
    return [[m.weight.detach().clone() for m in layer.modules() if isinstance(m, torch.nn.Linear)]
            for layer in layer_stack(model)]


def weight_distance(start: list[list[torch.Tensor]], model: torch.nn.Module) -> list[float]:
    """Per layer, the Frobenius distance between its nn.Linear weights now and at `start` (all of a layer's
    linear weights taken together: the square root of the summed squared differences)."""
    now = layer_weights(model)
    return [float(torch.sqrt(sum(((a.float() - b.float().to(a.device)) ** 2).sum() for a, b in zip(then, here))))
            for then, here in zip(start, now)]


def pick_device(gpu_fraction: float) -> torch.device:
    if gpu_fraction > 0 and torch.cuda.is_available():
        device = torch.device("cuda", 0)  # Ray narrows CUDA_VISIBLE_DEVICES to the GPU it assigned
        # Fractional trials share one card with no isolation: cap ours so a neighbour cannot OOM us.
        torch.cuda.set_per_process_memory_fraction(min(1.0, gpu_fraction), device)
        return device
    return torch.device("cpu")


def evaluate(model, split, metric_task: str, batch_size: int, device, pad_id: int, autocast) -> dict:
    model.eval()
    preds = []
    batches = eval_batches(split, batch_size)
    with torch.inference_mode(), autocast():
        for rows in batches:
            batch = {k: v.to(device) for k, v in collate(split, rows, pad_id).items() if k != "labels"}
            logits = model(**batch).logits.float()
            preds.append((logits.squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1)).cpu().numpy())
    order = np.concatenate(batches)
    predictions = np.empty(len(split), dtype=preds[0].dtype)
    predictions[order] = np.concatenate(preds)
    return compute_metrics(metric_task, predictions, split.labels)


def make_optimizer(model, cfg: FinetuneConfig, rows: np.ndarray):
    """AdamW over every parameter (reinitialized layers at lr * lr_multiplier) and its lr schedule."""
    total_steps = math.ceil(len(rows) / cfg.batch_size) * cfg.epochs
    if cfg.layer_lr_multipliers is not None:
        groups = layer_param_groups(model, cfg.lr, cfg.layer_lr_multipliers)
    else:
        groups = param_groups(model, reinitialized_layers(cfg.ablation), cfg.lr, cfg.lr_multiplier)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    schedule = (lambda s: 1.0 - s / total_steps) if cfg.lr_schedule == "linear" else (lambda s: 1.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def train_epoch(model, data: TokenizedTask, rows, cfg, optimizer, scheduler, rng, device, autocast, pad_id, shape):
    """One pass over the subset in a seeded batch order; returns (mean training loss, model FLOPs)."""
    model.train()
    losses, flops = [], 0.0
    for batch_rows in train_batches(rows, cfg.batch_size, rng):
        batch = {k: v.to(device, non_blocking=True) for k, v in collate(data.train, batch_rows, pad_id).items()}
        labels = batch.pop("labels")
        with autocast():
            logits = model(**batch).logits.float()
        if data.num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1), labels.float())
        else:
            loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach())
        flops += sequence_flops(data.train.lengths[batch_rows], *shape, train=True)
    return float(torch.stack(losses).mean()), flops


def training_state(epoch: int, model, optimizer, scheduler, rng, by_epoch, val_by_epoch, **counters) -> dict:
    """All a run needs to continue after `epoch` as if it had never stopped: weights, optimizer and schedule,
    the batch-order and dropout random streams, the figures so far. Tensors are the live ones (no copy):
    write them out before training goes on."""
    return {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "batch_rng": rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "by_epoch": list(by_epoch),
        "val_by_epoch": list(val_by_epoch),
        **counters,  # flops, train_seconds, eval_seconds, wall_seconds so far
    }


def load_training_state(state: dict, model, optimizer, scheduler, rng) -> int:
    """Put a `training_state` back into a freshly built model, optimizer, schedule and batch-order stream;
    returns the epoch it was saved after."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rng.bit_generator.state = state["batch_rng"]
    torch.set_rng_state(state["torch_rng"])
    if torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return int(state["epoch"])


def finetune(
    cfg: FinetuneConfig,
    data: TokenizedTask,
    pretrained: Pretrained,
    report: Callable[[dict], None] | None = None,
    intermediate: TokenizedTask | None = None,
    save: Callable[[dict], None] | None = None,
    resume: dict | None = None,
) -> dict:
    """Finetune and evaluate; returns the last epoch's figures (the same dict last passed to `report`).
    `intermediate` is the tokenized intermediate task when `cfg.intermediate_task` is set.
    `save`, if given, receives at every epoch end but the last, just before `report`, the training state
    (`training_state`) from which `resume=` continues the run exactly as if it had never stopped."""
    started = time.perf_counter()
    torch.set_num_threads(max(1, cfg.threads))
    device = pick_device(cfg.gpu_fraction)
    autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")  # noqa: E731

    model = build_classifier(pretrained, data.num_labels, cfg.seed)
    apply_ablation(cfg.ablation, model, cfg.seed)
    start_weights = layer_weights(model)  # weight change is measured from here: after the surgery
    pad_id = int(pretrained.config.pad_token_id or 0)
    n_params = non_embedding_params(model)
    num_layers, hidden = len(layer_stack(model)), int(pretrained.config.hidden_size)
    flops = train_seconds = eval_seconds = 0.0

    if cfg.intermediate_task is not None and resume is None:  # a saved state is past the intermediate task
        # Sequential finetuning: the whole recipe on the intermediate task (its own subset of the same size,
        # its own head), then its encoder goes on under a fresh head for the final task.
        if intermediate is None or intermediate.task != cfg.intermediate_task:
            raise ValueError(f"intermediate_task '{cfg.intermediate_task}' needs its tokenized data")
        first = build_classifier(pretrained, intermediate.num_labels, cfg.seed)
        first.base_model.load_state_dict(model.base_model.state_dict())
        first.to(device)
        first_rows = draw_subset(len(intermediate.train), cfg.train_size, cfg.subset_seed)
        optimizer, scheduler = make_optimizer(first, cfg, first_rows)
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 2]))
        torch.manual_seed(cfg.seed)
        tick = time.perf_counter()
        for _ in range(cfg.epochs):
            _, epoch_flops = train_epoch(first, intermediate, first_rows, cfg, optimizer, scheduler, rng, device,
                                         autocast, pad_id, (n_params, num_layers, hidden))
            flops += epoch_flops
        train_seconds += time.perf_counter() - tick  # the intermediate task's training counts as training
        model.base_model.load_state_dict(first.base_model.state_dict())
        del first, optimizer, scheduler
    model.to(device)

    rows = draw_subset(len(data.train), cfg.train_size, cfg.subset_seed)
    rows, held = hold_out(rows, cfg.val_size, cfg.subset_seed)
    # The search's objective reads this part of the training split alone: never data.validation.
    held_split = select_rows(data.train, held) if len(held) else None
    val_by_epoch: list[float] = []
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1]))  # batch order, independent of the subset
    optimizer, scheduler = make_optimizer(model, cfg, rows)

    peak_flops(str(device))  # a CPU peak is measured now (then cached), outside every timed stretch
    by_epoch: list[float] = []
    result: dict = {}
    status = "ok"
    torch.manual_seed(cfg.seed)  # dropout draws from the global stream: start it at the same place every run
    resumed_from = 0
    if resume is not None:
        resumed_from = load_training_state(resume, model, optimizer, scheduler, rng)
        by_epoch, val_by_epoch = list(resume["by_epoch"]), list(resume["val_by_epoch"])
        flops, train_seconds, eval_seconds = resume["flops"], resume["train_seconds"], resume["eval_seconds"]
        started -= resume["wall_seconds"]
    for epoch in range(resumed_from + 1, cfg.epochs + 1):
        tick = time.perf_counter()
        train_loss, epoch_flops = train_epoch(model, data, rows, cfg, optimizer, scheduler, rng, device, autocast,
                                              pad_id, (n_params, num_layers, hidden))
        flops += epoch_flops
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_seconds += time.perf_counter() - tick
        if not math.isfinite(train_loss):
            status = "diverged"

        tick = time.perf_counter()
        metrics = evaluate(model, data.validation, data.task, cfg.eval_batch_size, device, pad_id, autocast)
        eval_seconds += time.perf_counter() - tick
        flops += sequence_flops(data.validation.lengths, n_params, num_layers, hidden, train=False)
        by_epoch.append(float(metrics[data.metric]))
        if held_split is not None:  # the search's objective, on the held-out part of the training subset
            tick = time.perf_counter()
            val = evaluate(model, held_split, data.task, cfg.eval_batch_size, device, pad_id, autocast)
            eval_seconds += time.perf_counter() - tick
            flops += sequence_flops(held_split.lengths, n_params, num_layers, hidden, train=False)
            val_by_epoch.append(float(val[data.metric]))

        result = {
            "status": status,
            "epoch": epoch,
            "epochs": cfg.epochs,
            "train_loss": train_loss,
            "lr_last": float(scheduler.get_last_lr()[0]),
            "metric_name": data.metric,
            "dev_metric": by_epoch[-1],
            "dev_metrics_by_epoch": list(by_epoch),
            **{f"dev_{name}": float(value) for name, value in metrics.items()},
            "train_seconds": train_seconds,
            "eval_seconds": eval_seconds,
            "wall_seconds": time.perf_counter() - started,
            **cost_fields(flops, train_seconds + eval_seconds, device),
        }
        if held_split is not None:
            result.update(val_metric=val_by_epoch[-1], val_metrics_by_epoch=list(val_by_epoch), val_size=len(held))
        if cfg.layer_lr_multipliers is not None:  # what the optimizer really got, layers 1..L
            result["layer_lrs"] = [g["initial_lr"] for g in optimizer.param_groups if g["name"].startswith("layer_")]
        if epoch == cfg.epochs or status != "ok":
            result["weight_distance"] = weight_distance(start_weights, model)
        result["resumed_from_epoch"] = resumed_from
        if save is not None and epoch < cfg.epochs and status == "ok":
            save(training_state(epoch, model, optimizer, scheduler, rng, by_epoch, val_by_epoch, flops=flops,
                                train_seconds=train_seconds, eval_seconds=eval_seconds,
                                wall_seconds=time.perf_counter() - started))
        if report is not None:
            report(result)
        if status != "ok":
            break  # a diverged model only wastes the rest of its budget
    return result
