"""Many trials, one computation: a pack of finetuning trials trained as one batched encoder, no Ray.

Trials that share model, task, subset size, epochs, batch size, schedule and precision step in lock step.
Each trial is still built as `finetune` builds it (`build_classifier`, then `apply_ablation`: surgery is never
reimplemented here); its weights are then stacked with its pack-mates' into tensors of shape [P, ...], and a
compact BERT-layout encoder runs all P trials with batched matmuls. Everything else stays per trial: the
subset, the batch order, the dropout stream (a torch.Generator of its own, masks drawn at the trial's own
batch shape), the learning rate of every parameter group (taken from the trial's own `make_optimizer`),
weight decay, gradient clipping and divergence (a trial whose loss turns non-finite stops updating; its
pack-mates never see it).

Layout: the linear layers run on each trial's tokens packed end to end ([P, N, H], N = the most tokens any
trial has in this step), so short sentences cost no padding there; attention gathers the tokens into
[P * B, heads, T, d] padded to the longest sequence among the pack's batches, with per-sequence masks.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from trainables.ablations import apply_ablation
from trainables.cost import cost_fields, non_embedding_params, peak_flops
from trainables.data import TokenizedSplit, TokenizedTask, draw_subset, eval_batches, train_batches
from trainables.finetune import (RECIPE_VERSION, Compute, FinetuneConfig, evaluated_at, hold_out, make_optimizer,
                                 pick_device)
from trainables.metrics import chance_figures, compute_metrics
from trainables.models import Pretrained, build_classifier, embeddings, layer_stack, pooler
from trainables.tasks import SQUAD_V2

# Model types whose encoder has BERT's layout (post-LayerNorm layers, absolute positions, pooler + linear
# head); RoBERTa, ELECTRA and XLM-R share most of it but differ in positions or heads: they run unfused.
FUSED_MODEL_TYPES = ("bert",)
# What every trial of a pack shares: they run in lock step over the same number of equally sized batches.
PACK_FIELDS = ("task", "train_size", "val_size", "epochs", "batch_size", "lr_schedule", "eval_every",
               "eval_batch_size", "precision", "gpu_fraction")
LINEAR_WEIGHTS = ("qkv_w", "attn_out_w", "ffn_in_w", "ffn_out_w")  # weight_distance's nn.Linear weights
# Stacked as [P, in, out], nn.Linear's weight transposed: the batched matmul's weight gradient then comes out in
# the parameter's own layout (nn.Linear's [out, in] made autograd copy every weight gradient at every step).
TRANSPOSED = (*LINEAR_WEIGHTS, "pool_w", "head_w")


def unfused_reason(cfg: FinetuneConfig, pretrained: Pretrained) -> str | None:
    """Why this trial cannot join a pack (None: it can)."""
    config = pretrained.config
    if config.model_type not in FUSED_MODEL_TYPES:
        return f"model_type '{config.model_type}' has no fused encoder (fused: {', '.join(FUSED_MODEL_TYPES)})"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"position_embedding_type '{config.position_embedding_type}' is not absolute"
    if cfg.task == SQUAD_V2:
        return "question answering (squad_v2) has a span head and runs unfused"
    if cfg.intermediate_task is not None:
        return "sequential finetuning (intermediate_task) runs unfused"
    if cfg.val_size:
        return "a held-out search objective (val_size > 0) runs unfused"
    return None


def pack_key(cfg: FinetuneConfig) -> tuple:
    """Trials with equal keys can share a pack."""
    return tuple(getattr(cfg, name) for name in PACK_FIELDS)


def hf_parameters(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """The Hugging Face parameters behind each stacked tensor (query, key and value share one, in that order),
    in the order the encoder uses them. Every parameter of the model is in exactly one entry."""
    emb = embeddings(model)
    named = {"word": [emb.word_embeddings.weight], "position": [emb.position_embeddings.weight],
             "token_type": [emb.token_type_embeddings.weight],
             "emb_ln_w": [emb.LayerNorm.weight], "emb_ln_b": [emb.LayerNorm.bias]}
    for i, layer in enumerate(layer_stack(model), start=1):
        attention, qkv = layer.attention, (layer.attention.self.query, layer.attention.self.key,
                                           layer.attention.self.value)
        named.update({
            f"{i}.qkv_w": [m.weight for m in qkv], f"{i}.qkv_b": [m.bias for m in qkv],
            f"{i}.attn_out_w": [attention.output.dense.weight], f"{i}.attn_out_b": [attention.output.dense.bias],
            f"{i}.attn_ln_w": [attention.output.LayerNorm.weight], f"{i}.attn_ln_b": [attention.output.LayerNorm.bias],
            f"{i}.ffn_in_w": [layer.intermediate.dense.weight], f"{i}.ffn_in_b": [layer.intermediate.dense.bias],
            f"{i}.ffn_out_w": [layer.output.dense.weight], f"{i}.ffn_out_b": [layer.output.dense.bias],
            f"{i}.ffn_ln_w": [layer.output.LayerNorm.weight], f"{i}.ffn_ln_b": [layer.output.LayerNorm.bias],
        })
    named.update({"pool_w": [pooler(model).dense.weight], "pool_b": [pooler(model).dense.bias],
                  "head_w": [model.classifier.weight], "head_b": [model.classifier.bias]})
    covered = {id(p) for params in named.values() for p in params}
    if covered != {id(p) for p in model.parameters()} or len(covered) != sum(map(len, named.values())):
        raise ValueError(f"model of type {type(model).__name__} does not have BERT's parameter layout")
    return named


@dataclasses.dataclass(frozen=True)
class TrialSetup:
    """One trial as `finetune` would start it: its weights after surgery, keyed as `hf_parameters`, and for
    each key its (learning rate, weight decay) from the trial's own optimizer groups."""

    weights: dict[str, torch.Tensor]
    hyper: dict[str, tuple[float, float]]
    schedule: Callable[[int], float]  # the lr factor at optimizer step s (LambdaLR's lambda)
    betas: tuple[float, float]
    eps: float
    rows: np.ndarray
    n_params: int


def set_up_trial(cfg: FinetuneConfig, data: TokenizedTask, pretrained: Pretrained) -> TrialSetup:
    model = build_classifier(pretrained, data.num_labels, cfg.seed)
    apply_ablation(cfg.ablation, model, cfg.seed)
    rows, _ = hold_out(draw_subset(len(data.train), cfg.train_size, cfg.subset_seed), cfg.val_size, cfg.subset_seed)
    optimizer, scheduler = make_optimizer(model, cfg, rows)
    group_of = {id(p): (g["initial_lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    weights, hyper = {}, {}
    for name, params in hf_parameters(model).items():
        settings = {group_of[id(p)] for p in params}
        if len(settings) != 1:
            raise ValueError(f"parameters stacked as '{name}' have different optimizer settings {settings}")
        weights[name] = torch.cat([p.detach() for p in params]) if len(params) > 1 else params[0].detach()
        if name.split(".")[-1] in TRANSPOSED:
            weights[name] = weights[name].t().contiguous()
        hyper[name] = settings.pop()
    return TrialSetup(weights, hyper, scheduler.lr_lambdas[0], optimizer.defaults["betas"],
                      optimizer.defaults["eps"], rows, non_embedding_params(model))


@dataclasses.dataclass(frozen=True)
class PackBatch:
    """One step's batches of all P trials (B sequences each) in the packed-token layout."""

    ids: torch.Tensor  # [P, N] token ids, each trial's sequences end to end, then padding
    types: torch.Tensor  # [P, N]
    positions: torch.Tensor  # [P, N] position within its sequence
    gather: torch.Tensor  # [P * B * T] row of [P * N] each padded attention slot reads
    scatter: torch.Tensor  # [P * N] slot of [P * B * T] each packed token reads back
    first: torch.Tensor  # [P * B] row of [P * N] holding each sequence's first token
    keys: torch.Tensor  # [P * B, 1, 1, T] bool: which key slots hold real tokens
    lengths: np.ndarray  # [P, B]


def pack_batch(split: TokenizedSplit, rows: list[np.ndarray], pad_id: int, device) -> PackBatch:
    lengths = np.stack([split.lengths[r] for r in rows])
    P, B = lengths.shape
    width, n = int(lengths.max()), int(lengths.sum(1).max())
    ids = np.full((P, n), pad_id, dtype=np.int64)
    types, positions = np.zeros((P, n), dtype=np.int64), np.zeros((P, n), dtype=np.int64)
    gather = np.zeros((P, B, width), dtype=np.int64)
    scatter, first = np.zeros((P, n), dtype=np.int64), np.zeros((P, B), dtype=np.int64)
    for p, (trial_rows, lens) in enumerate(zip(rows, lengths)):
        k = int(lens.sum())
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        seq = np.repeat(np.arange(B), lens)
        pos = np.arange(k) - np.repeat(starts, lens)
        spans = [slice(split.offsets[r], split.offsets[r + 1]) for r in trial_rows]
        ids[p, :k] = np.concatenate([split.input_ids[s] for s in spans])
        types[p, :k] = np.concatenate([split.token_type_ids[s] for s in spans])
        positions[p, :k] = pos
        gather[p] = p * n  # padded slots read any row of their own trial: they are masked as keys
        gather[p, seq, pos] = p * n + np.arange(k)
        scatter[p, :k] = (p * B + seq) * width + pos
        scatter[p, k:] = p * B * width  # padding tokens read a real slot of their own trial; never used
        first[p] = p * n + starts
    as_tensor = lambda a: torch.from_numpy(a).to(device, non_blocking=True)  # noqa: E731
    keys = np.arange(width) < lengths[..., None]
    return PackBatch(as_tensor(ids), as_tensor(types), as_tensor(positions), as_tensor(gather.reshape(-1)),
                     as_tensor(scatter.reshape(-1)), as_tensor(first.reshape(-1)),
                     as_tensor(keys.reshape(P * B, 1, 1, width)), lengths)


class Dropout:
    """Per-trial dropout: trial p's masks come from its own generator at its own batch's shape (its real
    tokens; its own longest sequence for attention), then are padded, so neighbours never change them."""

    def __init__(self, seeds, hidden: float, attention: float, classifier: float, device):
        self.generators = [torch.Generator(device).manual_seed(int(s)) for s in seeds]
        self.hidden_p, self.attention_p, self.classifier_p = hidden, attention, classifier

    def _masks(self, like: torch.Tensor, p: float, own_shapes) -> torch.Tensor:
        masks = torch.zeros(like.shape, dtype=like.dtype, device=like.device)
        for i, (generator, shape) in enumerate(zip(self.generators, own_shapes)):
            draw = torch.empty(shape, dtype=like.dtype, device=like.device).bernoulli_(1 - p, generator=generator)
            masks[i][tuple(slice(0, s) for s in shape)] = draw
        return masks / (1 - p)

    def hidden(self, x: torch.Tensor, batch: PackBatch) -> torch.Tensor:  # x [P, N, H]
        if self.hidden_p == 0:
            return x
        return x * self._masks(x, self.hidden_p, [(int(k), x.shape[-1]) for k in batch.lengths.sum(1)])

    def attention(self, probs: torch.Tensor, batch: PackBatch) -> torch.Tensor:  # probs [P * B, heads, T, T]
        P, B = batch.lengths.shape
        view = probs.view(P, B, *probs.shape[1:])
        own = [(B, probs.shape[1], int(w), int(w)) for w in batch.lengths.max(1)]
        return (view * self._masks(view, self.attention_p, own)).view_as(probs)

    def classifier(self, x: torch.Tensor) -> torch.Tensor:  # x [P, B, H]
        if self.classifier_p == 0:
            return x
        return x * self._masks(x, self.classifier_p, [x.shape[1:]] * x.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Each trial's x [P, N, in] through its own weight [P, in, out] (TRANSPOSED) and bias [P, out]."""
    return torch.baddbmm(bias.unsqueeze(1), x, weight)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=eps) * weight.unsqueeze(1) + bias.unsqueeze(1)


def embed(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each trial's rows of its own table [P, V, H] for ids [P, N]."""
    P, V, H = table.shape
    offsets = torch.arange(P, device=ids.device).unsqueeze(1) * V
    return F.embedding(ids + offsets, table.reshape(P * V, H))


class RowGradient:
    """The gradient of a large embedding table (the vocabulary's), kept in `table.grad` from step to step: a
    step's batches touch a few hundred of its rows, and on a CPU a dense gradient built afresh each step
    (autograd's) cost more than the step's matmuls (zeroing [P, 30522, H] on newly mapped memory, then reading
    it whole for the clipping norm). `lookup` reads rows; backward adds into the rows it read; `clear` zeroes
    the rows the last step touched. On a CPU (`sparse`) the clipping norm and scale read only those rows; on a
    GPU they read the whole table, which is fast there, since listing the distinct rows would make every step
    wait for the device. The optimizer sees the whole table's gradient, zeros included, as torch's AdamW over
    nn.Embedding does."""

    def __init__(self, table: torch.Tensor, sparse: bool | None = None):
        self.table, self.sparse = table, (table.device.type == "cpu") if sparse is None else sparse
        P, V, H = table.shape
        table.grad = torch.zeros_like(table)
        self.rows = table.grad.view(P * V, H)
        self.offsets = torch.arange(P, device=table.device).unsqueeze(1) * V
        self.touched: list[torch.Tensor] = []  # flat rows [P * V] read since the last clear, repeats included

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        flat = (ids + self.offsets).reshape(-1)
        self.touched.append(flat)
        return _RowLookup.apply(self.table, flat, self).view(*ids.shape, self.table.shape[-1])

    def clear(self) -> None:
        if self.touched:
            self.rows.index_fill_(0, torch.cat(self.touched), 0.0)
            self.touched = []

    def _distinct(self) -> torch.Tensor:
        return torch.unique(torch.cat(self.touched)) if self.touched else self.offsets.new_zeros(0)

    def squared_norms(self) -> torch.Tensor:
        """[P]: each trial's squared gradient norm over its table."""
        P, V, _ = self.table.shape
        if not self.sparse:
            return torch.linalg.vector_norm(self.table.grad.flatten(1), dim=1, dtype=torch.float32).pow(2)
        rows = self._distinct()
        norms = torch.zeros(P, dtype=torch.float32, device=self.table.device)
        return norms.index_add_(0, torch.div(rows, V, rounding_mode="floor"), self.rows[rows].float().pow(2).sum(1))

    def scale(self, coef: torch.Tensor) -> None:
        """Trial p's gradient times coef[p]."""
        P, V, _ = self.table.shape
        if not self.sparse:
            self.table.grad.mul_(coef.view(P, 1, 1).to(self.rows.dtype))
            return
        rows = self._distinct()
        factor = coef[torch.div(rows, V, rounding_mode="floor")].unsqueeze(1).to(self.rows.dtype)
        self.rows.index_copy_(0, rows, self.rows[rows] * factor)


class _RowLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, flat, owner):
        ctx.flat, ctx.owner = flat, owner
        return table.detach().view(-1, table.shape[-1]).index_select(0, flat)

    @staticmethod
    def backward(ctx, grad):
        ctx.owner.rows.index_add_(0, ctx.flat, grad.reshape(-1, grad.shape[-1]).to(ctx.owner.rows.dtype))
        return None, None, None


class PackEncoder:
    """BERT's sequence classifier, every parameter stacked over the pack's trials."""

    def __init__(self, weights: dict[str, torch.Tensor], config, words: RowGradient):
        from transformers.activations import ACT2FN

        self.w, self.words = weights, words
        self.heads = int(config.num_attention_heads)
        self.eps = float(config.layer_norm_eps)
        self.num_layers = int(config.num_hidden_layers)
        self.act = ACT2FN[config.hidden_act]

    def __call__(self, batch: PackBatch, dropout: Dropout | None) -> torch.Tensor:
        """Logits [P, B, labels]; dropout None: evaluation."""
        w, (P, B) = self.w, batch.lengths.shape
        H, T = w["emb_ln_w"].shape[-1], batch.keys.shape[-1]
        drop = dropout.hidden if dropout is not None else (lambda x, _: x)
        words = self.words.lookup(batch.ids) if torch.is_grad_enabled() else embed(w["word"], batch.ids)
        x = words + embed(w["token_type"], batch.types) + embed(w["position"], batch.positions)
        x = drop(layer_norm(x, w["emb_ln_w"], w["emb_ln_b"], self.eps), batch)
        for i in range(1, self.num_layers + 1):
            qkv = linear(x, w[f"{i}.qkv_w"], w[f"{i}.qkv_b"]).reshape(-1, 3 * H)[batch.gather]
            q, k, v = qkv.view(P * B, T, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
            context = self.attention(q, k, v, batch, dropout).transpose(1, 2).reshape(P * B * T, H)
            context = context[batch.scatter].view(P, -1, H)
            x = layer_norm(x + drop(linear(context, w[f"{i}.attn_out_w"], w[f"{i}.attn_out_b"]), batch),
                           w[f"{i}.attn_ln_w"], w[f"{i}.attn_ln_b"], self.eps)
            h = self.act(linear(x, w[f"{i}.ffn_in_w"], w[f"{i}.ffn_in_b"]))
            x = layer_norm(x + drop(linear(h, w[f"{i}.ffn_out_w"], w[f"{i}.ffn_out_b"]), batch),
                           w[f"{i}.ffn_ln_w"], w[f"{i}.ffn_ln_b"], self.eps)
        pooled = torch.tanh(linear(x.reshape(-1, H)[batch.first].view(P, B, H), w["pool_w"], w["pool_b"]))
        if dropout is not None:
            pooled = dropout.classifier(pooled)
        return linear(pooled, w["head_w"], w["head_b"])

    @staticmethod
    def attention(q, k, v, batch: PackBatch, dropout: Dropout | None) -> torch.Tensor:
        if dropout is None or dropout.attention_p == 0:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=batch.keys)
        # Attention dropout drawn per trial: SDPA's own dropout would draw from the global stream.
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        probs = scores.masked_fill(~batch.keys, float("-inf")).softmax(-1)
        return dropout.attention(probs, batch) @ v


class PackOptimizer:
    """AdamW over the stacked tensors, each trial at its own learning rates and weight decay: torch's fused
    AdamW kernel runs on each trial's slices, one call per (trial, lr, weight decay), with the update skipped
    (found_inf) for trials no longer active, so no step waits for the device."""

    def __init__(self, weights: dict[str, torch.Tensor], setups: list[TrialSetup]):
        self.weights, self.setups = weights, setups
        self.exp_avg = {n: torch.zeros_like(t) for n, t in weights.items()}
        self.exp_avg_sq = {n: torch.zeros_like(t) for n, t in weights.items()}
        device = next(iter(weights.values())).device
        self.steps = torch.zeros(len(setups), dtype=torch.float32, device=device)
        self.step_count = 0
        self.groups = []  # (trial, lr, weight decay, [names])
        for p, setup in enumerate(setups):
            by_setting: dict[tuple[float, float], list[str]] = {}
            for name in weights:
                by_setting.setdefault(setup.hyper[name], []).append(name)
            self.groups += [(p, lr, wd, names) for (lr, wd), names in by_setting.items()]

    def step(self, active: torch.Tensor) -> None:
        self.steps += active.float()
        skip = (~active).float()
        with torch.no_grad():
            for p, lr, wd, names in self.groups:
                setup = self.setups[p]
                views = lambda d: [d[n][p] for n in names]  # noqa: E731
                torch._fused_adamw_(
                    [self.weights[n].detach()[p] for n in names], [self.weights[n].grad[p] for n in names],
                    views(self.exp_avg), views(self.exp_avg_sq), [], [self.steps[p]] * len(names),
                    amsgrad=False, lr=lr * setup.schedule(self.step_count), beta1=setup.betas[0],
                    beta2=setup.betas[1], weight_decay=wd, eps=setup.eps, maximize=False, found_inf=skip[p])
        self.step_count += 1

    def lr_last(self, p: int) -> float:
        """Trial p's base group learning rate now, as LambdaLR.get_last_lr()[0] says after the last step."""
        first = next(lr for q, lr, _, _ in self.groups if q == p)
        return first * self.setups[p].schedule(self.step_count)


def clip_per_trial(weights: dict[str, torch.Tensor], words: RowGradient, max_norms: torch.Tensor) -> torch.Tensor:
    """Each trial's gradient scaled to at most its max norm (0: not clipped), as clip_grad_norm_ over its own
    parameters (the word table's through `words`); returns which trials were clipped."""
    grads = [t.grad for t in weights.values() if t is not words.table]
    per_tensor = [torch.linalg.vector_norm(g.flatten(1), dim=1, dtype=torch.float32) for g in grads]
    norms = (torch.stack(per_tensor).pow(2).sum(0) + words.squared_norms()).sqrt()
    coef = torch.where(max_norms > 0, (max_norms / (norms + 1e-6)).clamp(max=1.0), torch.ones_like(norms))
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)).to(g.dtype))
    words.scale(coef)
    return (max_norms > 0) & (norms > max_norms)


def set_up_pack(cfgs: list[FinetuneConfig], data: TokenizedTask, pretrained: Pretrained,
                device) -> tuple[list[TrialSetup], dict[str, torch.Tensor]]:
    """Every trial set up as `finetune` would, its weights copied into the pack's stacked tensors on `device` as
    soon as it is built: one trial's model at a time in host memory, not P of them (31 BERT-base trials would
    hold 27 GB). The setups come back without their weights."""
    setups, stacked = [], {}
    for p, cfg in enumerate(cfgs):
        setup = set_up_trial(cfg, data, pretrained)
        for name, weight in setup.weights.items():
            if name not in stacked:
                stacked[name] = torch.empty((len(cfgs), *weight.shape), dtype=weight.dtype, device=device)
            stacked[name][p].copy_(weight)
        setups.append(dataclasses.replace(setup, weights={}))
    return setups, {name: t.requires_grad_(True) for name, t in stacked.items()}


def pack_weight_distance(start: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], num_layers: int):
    """Per trial, per layer, the Frobenius distance of its nn.Linear weights from `start` (weight_distance)."""
    per_layer = [sum((weights[f"{i}.{n}"].detach().float() - start[f"{i}.{n}"].float()).pow(2).flatten(1).sum(1)
                     for n in LINEAR_WEIGHTS).sqrt() for i in range(1, num_layers + 1)]
    return torch.stack(per_layer, dim=1).cpu().tolist()


class Pack:
    """P trials' state: stacked weights, optimizer, batch orders, dropout streams; one step trains them all."""

    def __init__(self, cfgs: list[FinetuneConfig], data: TokenizedTask, pretrained: Pretrained):
        check_pack(cfgs, pretrained)
        cfg = cfgs[0]
        self.cfgs, self.data = cfgs, data
        device = pick_device(cfg.gpu_fraction)
        self.setups, self.weights = set_up_pack(cfgs, data, pretrained, device)
        config = pretrained.config
        self.compute = Compute(device, cfg.precision, int(config.pad_token_id or 0),
                               (self.setups[0].n_params, int(config.num_hidden_layers), int(config.hidden_size)))
        self.start = {n: self.weights[n].detach().clone() for n in self.weights if n.split(".")[-1] in LINEAR_WEIGHTS}
        self.words = RowGradient(self.weights["word"])
        self.encoder = PackEncoder(self.weights, config, self.words)
        self.optimizer = PackOptimizer(self.weights, self.setups)
        self.rngs = [np.random.default_rng(np.random.SeedSequence([c.seed, 1])) for c in cfgs]
        classifier_p = config.classifier_dropout if getattr(config, "classifier_dropout", None) is not None \
            else config.hidden_dropout_prob
        self.dropout = Dropout([c.seed for c in cfgs], float(config.hidden_dropout_prob),
                               float(config.attention_probs_dropout_prob), float(classifier_p), device)
        self.max_norms = torch.tensor([c.max_grad_norm for c in cfgs], dtype=torch.float32, device=device)
        self.active = torch.ones(len(cfgs), dtype=torch.bool, device=device)
        self.clipped = torch.zeros(len(cfgs), dtype=torch.long, device=device)

    def step(self, rows: list[np.ndarray]) -> torch.Tensor:
        """One optimizer step of every trial on its own batch; returns the per-trial losses [P]."""
        for t in self.weights.values():
            if t is not self.words.table:
                t.grad = None
        self.words.clear()
        batch = pack_batch(self.data.train, rows, self.compute.pad_id, self.compute.device)
        labels = torch.from_numpy(np.stack([self.data.train.labels[r] for r in rows])).to(self.compute.device)
        with self.compute.autocast():
            logits = self.encoder(batch, self.dropout).float()
        if self.data.num_labels == 1:
            losses = F.mse_loss(logits.squeeze(-1), labels.float(), reduction="none").mean(1)
        else:
            losses = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(1)
        self.active &= torch.isfinite(losses)
        torch.where(self.active, losses, torch.zeros_like(losses)).sum().backward()
        self.clipped += clip_per_trial(self.weights, self.words, self.max_norms) & self.active
        self.optimizer.step(self.active)
        return losses.detach()

    def train_epoch(self) -> tuple[torch.Tensor, float]:
        """One pass of every trial over its subset in its own seeded order: (losses [steps, P], FLOPs)."""
        orders = [train_batches(s.rows, self.cfgs[0].batch_size, rng) for s, rng in zip(self.setups, self.rngs)]
        losses, flops = [], 0.0
        for rows in zip(*orders):
            losses.append(self.step(list(rows)))
            flops += sum(self.compute.flops(self.data.train.lengths[r], train=True) for r in rows)
        return torch.stack(losses), flops

    @torch.inference_mode()
    def evaluate(self, split: TokenizedSplit) -> list[dict]:
        """Every trial's metrics on the whole split (the same length-sorted batches for all)."""
        P, preds = len(self.cfgs), []
        batches = eval_batches(split, self.cfgs[0].eval_batch_size)
        with self.compute.autocast():
            for rows in batches:
                batch = pack_batch(split, [rows] * P, self.compute.pad_id, self.compute.device)
                logits = self.encoder(batch, None).float()
                preds.append((logits.squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1)).cpu().numpy())
        order, predictions = np.concatenate(batches), np.concatenate(preds, axis=1)
        ordered = np.empty_like(predictions)
        ordered[:, order] = predictions
        return [{**compute_metrics(self.data.definition, ordered[p], split.labels),
                 **chance_figures(self.data.definition, ordered[p], split.labels)} for p in range(P)]

    def weight_distance(self) -> list[list[float]]:
        return pack_weight_distance(self.start, self.weights, self.encoder.num_layers)


def check_pack(cfgs: list[FinetuneConfig], pretrained: Pretrained) -> None:
    if not cfgs:
        raise ValueError("a pack needs at least one trial")
    for cfg in cfgs:
        reason = unfused_reason(cfg, pretrained)
        if reason is not None:
            raise ValueError(f"trial (seed {cfg.seed}, subset_seed {cfg.subset_seed}) cannot be fused: {reason}")
        differing = [f for f, a, b in zip(PACK_FIELDS, pack_key(cfg), pack_key(cfgs[0])) if a != b]
        if differing:
            raise ValueError(f"trials of one pack must share {', '.join(PACK_FIELDS)}; these differ: "
                             f"{', '.join(differing)}")


def finetune_pack(cfgs: list[FinetuneConfig], data: TokenizedTask, pretrained: Pretrained,
                  report: Callable[[dict[int, dict]], None] | None = None, pack_id: str | None = None) -> list[dict]:
    """Finetune and evaluate P trials as one computation; returns one dict per trial with the keys `finetune`
    returns, plus pack_size and pack_id (default: a random one). After each epoch `report({i: result})` gets the
    figures of every trial i that trained in it (a diverged trial's last report says so; it is in no later one).
    Seconds are each trial's share of the pack's: train_seconds and eval_seconds are the pack's divided by its
    size, so rows add up to the machine time."""
    started = time.perf_counter()
    torch.set_num_threads(max(1, max(c.threads for c in cfgs)))
    pack = Pack(cfgs, data, pretrained)
    cfg, P, pack_id = cfgs[0], len(cfgs), pack_id or uuid.uuid4().hex[:12]
    peak_flops(str(pack.compute.device))  # measured (CPU) outside every timed stretch
    eval_flops = pack.compute.flops(data.validation.lengths, train=False)
    flops, by_epoch, dev_epochs = np.zeros(P), [[] for _ in range(P)], [[] for _ in range(P)]
    train_seconds = eval_seconds = 0.0
    results: list[dict] = [{} for _ in range(P)]
    running = np.ones(P, dtype=bool)
    for epoch in range(1, cfg.epochs + 1):
        tick = time.perf_counter()
        step_losses, epoch_flops = pack.train_epoch()
        losses = step_losses.mean(0).cpu().numpy()
        pack.compute.synchronize()
        train_seconds += (time.perf_counter() - tick) / P
        flops[running] += epoch_flops / P
        metrics = [{} for _ in range(P)]
        diverging = running & ~np.isfinite(losses)
        tick = time.perf_counter()
        if evaluated_at(epoch, cfg) and (running & ~diverging).any():
            metrics = pack.evaluate(data.validation)
            flops[running & ~diverging] += eval_flops
        eval_seconds += (time.perf_counter() - tick) / P
        clipped = pack.clipped.cpu().tolist()
        distances = pack.weight_distance() if epoch == cfg.epochs or diverging.any() else None
        for p in np.flatnonzero(running):
            own = metrics[p] if not diverging[p] else {}
            if own:  # as finetune: only evaluated epochs are listed, no nan placeholders
                by_epoch[p].append(float(own[data.metric]))
                dev_epochs[p].append(epoch)
            results[p] = {
                "status": "diverged" if diverging[p] else "ok",
                "epoch": epoch,
                "epochs": cfg.epochs,
                "epochs_run": epoch,
                "train_loss": float(losses[p]),
                "lr_last": pack.optimizer.lr_last(p),
                "metric_name": data.metric,
                "model_type": pretrained.model_type,
                **data.columns(),
                **({"dev_metric": by_epoch[p][-1]} if own else {}),
                "dev_metrics_by_epoch": list(by_epoch[p]),
                "dev_epochs": list(dev_epochs[p]),
                **{f"dev_{name}": float(value) for name, value in own.items()},
                "max_grad_norm": cfgs[p].max_grad_norm,
                "clipped_steps": int(clipped[p]),
                "eval_every": cfg.eval_every,
                "precision": cfg.precision,
                "recipe_version": RECIPE_VERSION,
                "train_seconds": train_seconds,
                "eval_seconds": eval_seconds,
                "wall_seconds": time.perf_counter() - started,
                **cost_fields(flops[p], train_seconds + eval_seconds, pack.compute.device),
                "resumed_from_epoch": 0,
                "pack_size": P,
                "pack_id": pack_id,
            }
            if cfgs[p].layer_lr_multipliers is not None:
                results[p]["layer_lrs"] = [cfgs[p].lr * m for m in cfgs[p].layer_lr_multipliers]
            if distances is not None and (epoch == cfg.epochs or diverging[p]):
                results[p]["weight_distance"] = distances[p]
        if report is not None:
            report({int(p): results[p] for p in np.flatnonzero(running)})
        running &= ~diverging
        if not running.any():
            break
    return results
