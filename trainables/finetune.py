"""Finetuning one (partially reinitialized) model on one task subset: a plain function, no Ray.

The loop reads top to bottom: build the model from the shared pretrained weights, apply the ablation,
optionally finetune on an intermediate task first (sequential finetuning), train for a few epochs on the
subset with the paper's recipe (Hugging Face run_glue of its time: AdamW, linear decay without warmup,
gradients clipped at norm 1.0, weight decay on weights only), evaluate on the full validation split after the
last epoch (or every `eval_every` epochs), and hand each epoch's figures to `report`. The last report also
says how far each layer's weights moved from where finetuning of the final task started (after the surgery).
Ray Tune only wraps it (trainables.tune_trainable).
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
from trainables.cost import FlopShape, cost_fields, flop_shape, peak_flops, sequence_flops
from trainables.data import TokenizedSplit, TokenizedTask, collate, draw_subset, eval_batches, train_batches
from trainables.metrics import chance_figures, compute_metrics
from trainables.models import Pretrained, build_classifier, layer_stack, pooler
from trainables.qa import QASplit, build_span_model, evaluate_qa, example_count, example_rows, select_questions
from trainables.tasks import Task
from trialrows.recipe import LR_SCHEDULES, PRECISIONS, Recipe, default_epochs, recipe_version, resolve_precision


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinetuneConfig(Recipe):
    """One finetuning run: the recipe (trialrows.recipe, every training setting declared there) and the
    trial's own subset, seeds and surgery."""

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
    eval_batch_size: int = 128
    gpu_fraction: float = 0.0  # the share of a GPU Ray gave this trial; 0 = CPU
    threads: int = 1  # CPU threads for torch

    def __post_init__(self):
        if self.epochs is None:
            object.__setattr__(self, "epochs", default_epochs(self.train_size))
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.gpu_fraction))
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule '{self.lr_schedule}' is not one of {', '.join(LR_SCHEDULES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision '{self.precision}' is not one of {', '.join(PRECISIONS)}")
        if not 0 <= self.max_grad_norm < math.inf:
            raise ValueError(f"max_grad_norm {self.max_grad_norm} must be a finite number >= 0 (0: no clipping)")
        if self.eval_every < 0:
            raise ValueError(f"eval_every {self.eval_every} must be >= 0 (0: after the last epoch only)")
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


def param_groups(model: torch.nn.Module, reinit_layers, lr: float, multiplier: float,
                 reinit_pooler: bool = False) -> list[dict]:
    """Optimizer groups: the reinitialized layers' parameters (and a reinitialized pooler's) at lr * multiplier,
    every other parameter at lr. Every parameter of the model is in exactly one group (the original code left
    one layer out)."""
    stack = layer_stack(model)
    fast = {id(p) for i in reinit_layers for p in stack[i - 1].parameters()}
    if reinit_pooler and pooler(model) is not None:  # fresh weights, like the reinitialized layers'
        fast |= {id(p) for p in pooler(model).parameters()}
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


def not_decayed(model: torch.nn.Module) -> set[int]:
    """Ids of the parameters weight decay must skip: biases and LayerNorm weights (as run_glue and the
    Trainer do); embeddings and every other weight matrix are decayed."""
    skip = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters(recurse=False)}
    return skip | {id(p) for name, p in model.named_parameters() if name.endswith("bias")}


def with_weight_decay(groups: list[dict], model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Each learning-rate group split into its decayed part and its `<name>/no-decay` part. Without weight
    decay nothing is split: the groups (and the optimizer's state layout) stay as they are."""
    if weight_decay == 0:
        return [{**g, "weight_decay": 0.0} for g in groups]
    skip = not_decayed(model)
    split = []
    for group in groups:
        decayed = [p for p in group["params"] if id(p) not in skip]
        kept = [p for p in group["params"] if id(p) in skip]
        split += [{**group, "params": decayed, "weight_decay": weight_decay}] if decayed else []
        split += [{**group, "name": f"{group['name']}/no-decay", "params": kept, "weight_decay": 0.0}] if kept else []
    return split


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


@dataclasses.dataclass(frozen=True)
class Compute:
    """Where and how a trial computes: its device, its precision, the tokenizer's padding id, and the model's
    shape for counting FLOPs."""

    device: torch.device
    precision: str
    pad_id: int
    shape: FlopShape

    def autocast(self, cache: bool = True):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16",
                              cache_enabled=cache)

    def flops(self, lengths, train: bool, batch_size: int) -> float:
        return sequence_flops(lengths, self.shape, train, batch_size)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def build_model(pretrained: Pretrained, data: TokenizedTask, seed: int) -> torch.nn.Module:
    """The task's model around the pretrained encoder: a span model for question answering, else a sequence
    classifier; its head drawn from `seed`."""
    if isinstance(data.train, QASplit):
        return build_span_model(pretrained, seed)
    return build_classifier(pretrained, data.num_labels, seed)


def draw_rows(split: TokenizedSplit, train_size: int, subset_seed: int) -> np.ndarray:
    """The rows a subset of `train_size` examples trains on (for question answering: questions, all their windows)."""
    return example_rows(split, draw_subset(example_count(split), train_size, subset_seed))


def evaluate(model, split, metric_task: Task, batch_size: int, compute: Compute) -> dict:
    if isinstance(split, QASplit):
        return evaluate_qa(model, split, batch_size, compute)
    model.eval()
    preds = []
    batches = eval_batches(split, batch_size)
    with torch.inference_mode(), compute.autocast():
        for rows in batches:
            batch = {k: v.to(compute.device) for k, v in collate(split, rows, compute.pad_id).items() if k != "labels"}
            logits = model(**batch).logits.float()
            preds.append((logits.squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1)).cpu().numpy())
    order = np.concatenate(batches)
    predictions = np.empty(len(split), dtype=preds[0].dtype)
    predictions[order] = np.concatenate(preds)
    return {**compute_metrics(metric_task, predictions, split.labels),
            **chance_figures(metric_task, predictions, split.labels)}


def schedule_steps(rows: int, cfg: FinetuneConfig) -> int:
    """Optimizer steps of a whole run on `rows` training rows: the span of the lr schedule."""
    return math.ceil(rows / cfg.batch_size) * cfg.epochs


def make_optimizer(model, cfg: FinetuneConfig, rows: np.ndarray):
    """AdamW over every parameter (reinitialized layers at lr * lr_multiplier; weight decay on weights only)
    and its lr schedule: linear decay to 0 without warmup, or constant."""
    total_steps = schedule_steps(len(rows), cfg)
    if cfg.layer_lr_multipliers is not None:
        groups = layer_param_groups(model, cfg.lr, cfg.layer_lr_multipliers)
    else:
        groups = param_groups(model, reinitialized_layers(cfg.ablation), cfg.lr, cfg.lr_multiplier,
                              reinit_pooler=getattr(cfg.ablation, "reinit_pooler", False))
    groups = with_weight_decay(groups, model, cfg.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, fused=True)
    schedule = (lambda s: 1.0 - s / total_steps) if cfg.lr_schedule == "linear" else (lambda s: 1.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


@dataclasses.dataclass
class EpochStats:
    loss: float  # mean training loss
    flops: float
    clipped_steps: int  # steps whose gradient norm exceeded max_grad_norm and was cut to it


def train_epoch(model, split: TokenizedSplit, rows, cfg: FinetuneConfig, optimizer, scheduler, rng,
                compute: Compute) -> EpochStats:
    """One pass over the subset in a seeded batch order. Nothing in a step waits for the device: losses and
    the clipped-step count stay there until the epoch ends."""
    model.train()
    losses, flops, clipped = [], 0.0, torch.zeros((), dtype=torch.long, device=compute.device)
    regression = getattr(model.config, "problem_type", None) == "regression"
    pin = compute.device.type == "cuda"  # a copy from pageable memory blocks; from pinned memory it does not
    for batch_rows in train_batches(rows, cfg.batch_size, rng):
        batch = {k: (v.pin_memory() if pin else v).to(compute.device, non_blocking=pin)
                 for k, v in collate(split, batch_rows, compute.pad_id).items()}
        labels = batch.pop("labels")
        with compute.autocast():
            logits = model(**batch).logits.float()
        loss = F.mse_loss(logits.squeeze(-1), labels.float()) if regression else F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            clipped += norm > cfg.max_grad_norm
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach())
        flops += compute.flops(split.lengths[batch_rows], True, cfg.batch_size)
    return EpochStats(float(torch.stack(losses).mean()), flops, int(clipped))


def finite_weights(model: torch.nn.Module) -> bool:
    # Sums: a nan or inf weight makes its tensor's sum one, at a tenth of isfinite's time (no mask); a sum of
    # finite weights overflows only past 3e38, which no model that still computes holds.
    return bool(torch.isfinite(torch.stack([p.detach().sum() for p in model.parameters()])).all())


@dataclasses.dataclass
class Progress:
    """A run's figures so far: what each epoch adds to, a checkpoint saves and a resumed run starts from."""

    flops: float = 0.0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    wall_seconds: float = 0.0  # of the run before it was resumed (the current stretch is timed separately)
    clipped_steps: int = 0
    # The dev metric at each epoch it was evaluated, and those epochs. No nan placeholders: every logger
    # (TensorBoard's among them) would warn about them at every report.
    by_epoch: list[float] = dataclasses.field(default_factory=list)
    dev_epochs: list[int] = dataclasses.field(default_factory=list)
    val_by_epoch: list[float] = dataclasses.field(default_factory=list)  # the search's held-out objective
    phase_one: dict = dataclasses.field(default_factory=dict)  # sequential finetuning's intermediate phase

    @classmethod
    def from_state(cls, state: dict) -> "Progress":
        by_epoch = list(state["by_epoch"])
        return cls(state["flops"], state["train_seconds"], state["eval_seconds"], state["wall_seconds"],
                   state.get("clipped_steps", 0), by_epoch,
                   list(state.get("dev_epochs", range(1, len(by_epoch) + 1))),  # older states: every epoch
                   list(state["val_by_epoch"]), state.get("phase_one", {}))

    def figures(self, wall_seconds: float, device: torch.device, precision: str) -> dict:
        """The columns of a row that this record holds, `wall_seconds` the run's in all, its MFU against the
        peak of `precision`."""
        return {"dev_metrics_by_epoch": list(self.by_epoch), "dev_epochs": list(self.dev_epochs),
                "clipped_steps": self.clipped_steps, "train_seconds": self.train_seconds,
                "eval_seconds": self.eval_seconds, "wall_seconds": wall_seconds,
                **cost_fields(self.flops, self.train_seconds + self.eval_seconds, device, precision),
                **self.phase_one}


def timed_epoch(model, split: TokenizedSplit, rows, cfg: FinetuneConfig, optimizer, scheduler, rng, compute: Compute,
                progress: Progress) -> EpochStats:
    """`train_epoch`, its seconds and FLOPs added to `progress`: each epoch timed on its own, so that a
    checkpoint's writing (and Tune's copy of it before its report returns) is no training time."""
    tick = time.perf_counter()
    stats = train_epoch(model, split, rows, cfg, optimizer, scheduler, rng, compute)
    compute.synchronize()
    progress.train_seconds += time.perf_counter() - tick
    progress.flops += stats.flops
    return stats


def saved_start(state: dict, device) -> list[list[torch.Tensor]]:
    """The layers' weights a saved run measures its weight change from (`training_state`'s start_weights)."""
    return [[w.to(device) for w in layer] for layer in state["start_weights"]]


def training_state(epoch: int, model, optimizer, scheduler, rng, progress: Progress,
                   start_weights: list[list[torch.Tensor]] | None = None) -> dict:
    """All a run needs to continue after `epoch` as if it had never stopped: weights, optimizer and schedule,
    the batch-order and dropout random streams, the figures so far. Tensors are the live ones (no copy):
    write them out before training goes on. `start_weights`: the layers' weights the final task started from,
    which only a sequential trial needs saved (a resumed one skips the intermediate phase that made them)."""
    return {
        **({"start_weights": start_weights} if start_weights is not None else {}),
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "batch_rng": rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        # Only a trial on a GPU draws from CUDA's streams. A CPU trial on a GPU node sees every card (Ray narrows
        # CUDA_VISIBLE_DEVICES only for a GPU share): reading their streams would open a context on each.
        "cuda_rng": torch.cuda.get_rng_state_all() if next(model.parameters()).is_cuda else [],
        **dataclasses.asdict(progress),  # copies of its lists: the run goes on appending to its own
    }


def load_training_state(state: dict, model, optimizer, scheduler, rng) -> tuple[int, Progress]:
    """Put a `training_state` back into a freshly built model, optimizer, schedule and batch-order stream;
    returns the epoch it was saved after and the figures up to it."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rng.bit_generator.state = state["batch_rng"]
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return int(state["epoch"]), Progress.from_state(state)


def evaluated_at(epoch: int, cfg: FinetuneConfig) -> bool:
    """Whether the dev split is evaluated after `epoch`: the last epoch always, and every `eval_every`-th."""
    return epoch == cfg.epochs or (cfg.eval_every > 0 and epoch % cfg.eval_every == 0)


# A state saved during sequential finetuning's first phase says so (`training_state` of the intermediate model):
# a resume goes on in that phase, then runs the final task from its start.
INTERMEDIATE = "intermediate"


def finetune_intermediate(model, cfg: FinetuneConfig, intermediate: TokenizedTask, pretrained: Pretrained,
                          compute: Compute, save: Callable[[dict], bool | None] | None = None,
                          report: Callable[[dict], None] | None = None, resume: dict | None = None) -> Progress:
    """Sequential finetuning's first phase: the whole recipe on the intermediate task (its own subset of the
    same size, its own head), then its encoder goes on in `model`, under the final task's fresh head.
    Returns the phase's figures: FLOPs, training seconds, the wall seconds of the runs before a resume, and the
    per-layer weight change of this phase (`phase_one`). `save`, if given, receives at every epoch end but the
    last the phase's state, and when it says it wrote it, `report` then an epoch-0 result naming the phase's epoch
    (Tune keeps a checkpoint only with a report; without one the report would only be Tune's first result, whose
    keys fix the trial's progress.csv columns): an intermediate round of a large subset takes hours, which a lost
    node no longer costs.
    `resume`: such a state, to go on from."""
    if intermediate is None or intermediate.task != cfg.intermediate_task:
        raise ValueError(f"intermediate_task '{cfg.intermediate_task}' needs its tokenized data")
    started = time.perf_counter()
    first = build_model(pretrained, intermediate, cfg.seed)
    first.base_model.load_state_dict(model.base_model.state_dict())
    first.to(compute.device)
    start = layer_weights(first)
    rows = draw_rows(intermediate.train, cfg.train_size, cfg.subset_seed)
    optimizer, scheduler = make_optimizer(first, cfg, rows)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 2]))
    torch.manual_seed(cfg.seed)
    done, progress = 0, Progress()
    if resume is not None:
        done, progress = load_training_state(resume, first, optimizer, scheduler, rng)
        start = saved_start(resume, compute.device)
    for epoch in range(done + 1, cfg.epochs + 1):
        stats = timed_epoch(first, intermediate.train, rows, cfg, optimizer, scheduler, rng, compute, progress)
        if not (math.isfinite(stats.loss) and finite_weights(first)):
            break  # diverged: the final task's first epoch finds its weights so and stops the trial there
        if save is not None and epoch < cfg.epochs:
            kept = dataclasses.replace(progress, wall_seconds=progress.wall_seconds + time.perf_counter() - started)
            state = {**training_state(epoch, first, optimizer, scheduler, rng, kept, start), "phase": INTERMEDIATE}
            if save(state) and report is not None:
                report({"status": "ok", "epoch": 0, "intermediate_epoch": epoch, "intermediate_train_loss": stats.loss})
    model.base_model.load_state_dict(first.base_model.state_dict())
    progress.phase_one = {"intermediate_weight_distance": weight_distance(start, first)}
    return progress


def training_split(cfg: FinetuneConfig, data: TokenizedTask):
    """(rows the trial trains on, its held-out examples, those as a split or None): the subset drawn by
    `subset_seed`, less the part a search holds out for its objective (which never reads data.validation)."""
    examples = draw_subset(example_count(data.train), cfg.train_size, cfg.subset_seed)
    examples, held = hold_out(examples, cfg.val_size, cfg.subset_seed)
    select = select_questions if isinstance(data.train, QASplit) else select_rows
    return example_rows(data.train, examples), held, select(data.train, held) if len(held) else None


def finetune(
    cfg: FinetuneConfig,
    data: TokenizedTask,
    pretrained: Pretrained,
    report: Callable[[dict], None] | None = None,
    intermediate: TokenizedTask | None = None,
    save: Callable[[dict], bool | None] | None = None,
    resume: dict | None = None,
) -> dict:
    """Finetune and evaluate; returns the last epoch's figures (the same dict last passed to `report`).
    `intermediate` is the tokenized intermediate task when `cfg.intermediate_task` is set.
    `save`, if given, receives at every epoch end but the last, just before `report`, the training state
    (`training_state`) from which `resume=` continues the run exactly as if it had never stopped; it returns
    whether it wrote it (a sequential trial's intermediate round reports only then: finetune_intermediate)."""
    started = time.perf_counter()
    torch.set_num_threads(max(1, cfg.threads))
    model = build_model(pretrained, data, cfg.seed)
    apply_ablation(cfg.ablation, model, cfg.seed)
    compute = Compute(pick_device(cfg.gpu_fraction), cfg.precision, int(pretrained.config.pad_token_id or 0),
                      flop_shape(model))
    progress, restarted_at = Progress(), 0
    if resume is not None and resume.get("phase") == INTERMEDIATE:  # saved in the first phase: it goes on there
        # The row's resumed_from_epoch counts it back from the final task's start (that round's epoch e of E is
        # e - E): 0 says a run never restarted, and progress views read the share done before from it.
        restarted_at = int(resume["epoch"]) - cfg.epochs
        progress, resume = finetune_intermediate(model, cfg, intermediate, pretrained, compute, save, report,
                                                 resume), None
    elif cfg.intermediate_task is not None and resume is None:  # a final task's saved state is past that phase
        progress = finetune_intermediate(model, cfg, intermediate, pretrained, compute, save, report)
    model.to(compute.device)
    start_weights = layer_weights(model)  # weight change is measured from here: the final task's start
    rows, held, held_split = training_split(cfg, data)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1]))  # batch order, independent of the subset
    optimizer, scheduler = make_optimizer(model, cfg, rows)
    # a CPU peak is measured now (then cached), outside every timed stretch
    peak_flops(str(compute.device), compute.precision)
    torch.manual_seed(cfg.seed)  # dropout draws from the global stream: start it at the same place every run
    resumed_from = 0
    if resume is not None:
        resumed_from, progress = load_training_state(resume, model, optimizer, scheduler, rng)
        restarted_at = resumed_from
        if "start_weights" in resume:  # rebuilt above without the intermediate phase: not where the task started
            start_weights = saved_start(resume, compute.device)
    fixed = {"epochs": cfg.epochs, "metric_name": data.metric, "model_type": pretrained.model_type, **data.columns(),
             "max_grad_norm": cfg.max_grad_norm, "eval_every": cfg.eval_every, "precision": cfg.precision,
             "cuda_graphs": False, "triton_kernels": False,
             "recipe_version": recipe_version((cfg.task, cfg.intermediate_task)),
             "resumed_from_epoch": restarted_at}
    if cfg.layer_lr_multipliers is not None:  # what the optimizer really got, layers 1..L
        fixed["layer_lrs"] = [g["initial_lr"] for g in optimizer.param_groups
                              if g["name"].startswith("layer_") and not g["name"].endswith("/no-decay")]
    result: dict = {}
    for epoch in range(resumed_from + 1, cfg.epochs + 1):
        stats = timed_epoch(model, data.train, rows, cfg, optimizer, scheduler, rng, compute, progress)
        progress.clipped_steps += stats.clipped_steps
        # Then its dev metric would mean nothing. An epoch's last update can leave inf or nan weights after a
        # finite loss (a non-finite gradient, an overflowing step), which no loss of this epoch shows.
        status = "ok" if math.isfinite(stats.loss) and finite_weights(model) else "diverged"

        tick, metrics = time.perf_counter(), {}
        if status == "ok" and evaluated_at(epoch, cfg):
            metrics = evaluate(model, data.validation, data.definition, cfg.eval_batch_size, compute)
            progress.flops += compute.flops(data.validation.lengths, False, cfg.eval_batch_size)
            progress.by_epoch.append(float(metrics[data.metric]))
            progress.dev_epochs.append(epoch)
        if held_split is not None and status == "ok":  # the search's objective: every epoch, for ASHA
            val = evaluate(model, held_split, data.definition, cfg.eval_batch_size, compute)
            progress.flops += compute.flops(held_split.lengths, False, cfg.eval_batch_size)
            progress.val_by_epoch.append(float(val[data.metric]))
        elif held_split is not None:  # a diverged model's figure would be its constant guess's: Optuna fails a nan
            progress.val_by_epoch.append(float("nan"))
        progress.eval_seconds += time.perf_counter() - tick

        wall_seconds = progress.wall_seconds + time.perf_counter() - started
        result = {**fixed, "status": status, "epoch": epoch, "epochs_run": epoch, "train_loss": stats.loss,
                  "lr_last": float(scheduler.get_last_lr()[0]),
                  **progress.figures(wall_seconds, compute.device, compute.precision),
                  **({"dev_metric": progress.by_epoch[-1]} if metrics else {}),
                  **{f"dev_{name}": float(value) for name, value in metrics.items()}}
        if held_split is not None:
            result.update(val_metric=progress.val_by_epoch[-1], val_metrics_by_epoch=list(progress.val_by_epoch),
                          val_size=len(held))
        if epoch == cfg.epochs or status != "ok":
            result["weight_distance"] = weight_distance(start_weights, model)
        if save is not None and epoch < cfg.epochs and status == "ok":
            save(training_state(epoch, model, optimizer, scheduler, rng,
                                dataclasses.replace(progress, wall_seconds=wall_seconds),
                                start_weights if cfg.intermediate_task is not None else None))
        if report is not None:
            report(result)
        if status != "ok":
            break  # a diverged model only wastes the rest of its budget
    return result
