"""Many trials, one computation: a pack of finetuning trials trained as one batched encoder, no Ray.

Trials that share model, task, subset size, epochs, batch size, schedule and precision step in lock step.
Everything a trial owns stays its own: its weights after surgery, its subset and batch order, its dropout
stream, its learning rate for every parameter, its weight decay, its gradient clipping, its divergence (a
trial whose loss turns non-finite is reported diverged and left out of every later report; its pack-mates
never see it).

What a GPU needs, and why the code is shaped so (measured on a CPU, docs/benchmarks.md "Fused engine"):
- The host's work per step does not grow with the pack. The weights of all P trials live in two buffers
  ("banks") of shape [P, D]: the vocabulary's table alone in bank 0 (so its rows can be read and updated
  sparsely on CPUs), every other tensor in bank 1; each named tensor is a view. AdamW, clipping and the
  gradient bookkeeping are a few ops over the banks, with every trial's (and every layer's) learning rate a
  tensor, as HFTA does. The one per-trial loop is the clipping multiply's on GPUs, one vectorized launch a
  trial, as a broadcast multiply over the pack ran at half the memory's speed (scale_rows).
- Dropout is drawn once per site for the whole pack by a counter-based hash (SplitMix64's finalizer) of
  (the trial's key, the optimizer step, the site, the element's coordinates within the trial's own batch), so
  a trial's masks are the same in any pack, and resumable from the step count alone.
- A whole epoch's batches go to the device in one copy; nothing in a step waits for the device. On GPUs,
  sequence widths are bucketed to a few sizes (CUDA graphs and torch.compile need few shapes).
- Setup: the pretrained weights are laid out once per pack; each trial's head and surgery are drawn straight
  into its row of the banks, by Hugging Face's own initializer and by `apply_ablation` itself on a skeleton
  model whose parameters are views of that row (surgery is never reimplemented here; tests hold the result
  equal to `finetune`'s model). Trials are set up in threads.
- Memory: a pack measures its own peak (`Pack.peak_memory`: one step and one evaluation batch at its
  largest shapes); gradients and moments are freed before the last evaluation; an out-of-memory error splits
  the pack in two, each half going on from the step where it stopped.
- Checkpoints: `finetune_pack(save=...)` hands out, at epoch ends, a state (banks, moments, batch-order
  streams, step counts, figures so far) from which `resume=` goes on to the same numbers.

Layout: the linear layers run on each trial's tokens packed end to end ([P, N, H], N = the most tokens any
trial has in this step), so short sentences cost no padding there; attention gathers the tokens into
[P * B, heads, T, d] padded to the longest sequence among the pack's batches, with per-sequence masks.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import gc
import math
import os
import time
import uuid
import warnings
from typing import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from trainables.ablations import apply_ablation
from trainables.cost import FlopShape, cost_fields, flop_shape, peak_flops
from trainables.data import TokenizedSplit, TokenizedTask, draw_subset, eval_batches, train_batches
from trainables.finetune import (Compute, FinetuneConfig, evaluated_at, hold_out, make_optimizer,
                                 pick_device, schedule_steps)
from trainables.memory import peak_bytes
from trainables.metrics import chance_figures, compute_metrics
from trainables.models import (Pretrained, classifier_skeleton, embeddings, encoder_state, init_fresh_parts,
                               layer_stack, mark_loaded, pooler)
from trainables.switches import CUDA_GRAPHS, switch_on
from trainables.tasks import SQUAD_V2
from trainables.triton_kernels import adamw_clipped, dropout_masks, step_scalars, use_triton
from trialrows.recipe import recipe_version

# Model types whose encoder has BERT's layout (post-LayerNorm layers, absolute positions, pooler + linear
# head); RoBERTa, ELECTRA and XLM-R share most of it but differ in positions or heads: they run unfused.
FUSED_MODEL_TYPES = ("bert",)
# What every trial of a pack shares: they run in lock step over the same number of equally sized batches.
PACK_FIELDS = ("task", "train_size", "val_size", "epochs", "batch_size", "lr_schedule", "eval_every",
               "eval_batch_size", "precision", "gpu_fraction")
LINEAR_WEIGHTS = ("qkv_w", "attn_out_w", "ffn_in_w", "ffn_out_w")  # weight_distance's nn.Linear weights
LINEARS = ("qkv", "attn_out", "ffn_in", "ffn_out")  # per layer; then "pool" and "head"
# Tensors whose gradients autograd adds up (small: LayerNorms, the position and token-type tables). They
# lead bank 1, so one op zeroes their gradients; every linear layer's gradient is written whole each step.
ACCUMULATED = ("position", "token_type", "emb_ln_w", "emb_ln_b", "attn_ln_w", "attn_ln_b", "ffn_ln_w", "ffn_ln_b")
# Bytes a trial holds at its peak per parameter on a GPU (benchmarks/engine_bench.py; docs/benchmarks.md,
# "Fused engine"): 4 each for its weights, gradients and Adam's two moments, plus the activations and bf16
# weight copies of a step of BERT-base at batch 8 on GLUE's sentences. How many trials train at once is planned
# with it, in this share of a card's free memory (the rest for what the caching allocator keeps around them);
# a group that still does not fit splits itself.
PEAK_BYTES_PER_PARAMETER = 20
MEMORY_SHARE = 0.9
# Test-only fault injection: "N" or "N:STEP": a pack of more than N trials runs out of memory (at its optimizer
# step STEP, default 0), as a card too small for it would, so tests can watch the pack split and go on.
OOM_ABOVE = "REINIT_SWEEP_OOM_ABOVE"
# On GPUs each batch shape's pack-step is recorded as a CUDA graph and replayed (StepGraphs), so that the host
# issues one launch a step instead of about 1,500: on an H200 a pack-of-1 step took 7.0 ms instead of 28.0, a
# pack of 8's 25.5 instead of 63.7 (docs/benchmarks.md). CUDA_GRAPHS=0 runs every step op by op.
# bmm with out_dtype (torch 2.8 on, CUDA): a bf16 product written as float32.
FLOAT32_OUT_BMM = "dtype_out" in torch.ops.aten.bmm.overloads()
# On GPUs each stacked tensor of bank 1 starts, and each trial's row is as long as, a multiple of this many
# elements (zeros between, which stay zero in a trial that stays finite: Layout.of), so that every trial's views are 256-byte aligned (128 in bf16) and a
# row's length a multiple of 4. CUDA's vectorized multi-tensor kernels (the clipping multiply over each trial's
# row, AdamW over a bank) need both, and cuBLAS picks its fastest kernels for aligned batch strides. Unpadded,
# a BERT-base row of bank 1 is 86,042,882 floats: no trial's row met the second and odd trials' not the first.
# CPUs keep rows unpadded: padding changes the rounding of a few ops there (by about 1e-6), and a CPU pack gives
# the bits it always gave.
BANK_ALIGNMENT = 64
# The ACCUMULATED tensors' gradients are views of one buffer (Pack.small_grad), strided over the pack on purpose;
# autograd adds into them in place and warns that a strided gradient "may impair performance" (they are small).
LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"


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


def parameter_count(pretrained: Pretrained) -> int:
    return sum(t.numel() for t in pretrained.state_dict.values())


def kind(name: str) -> str:
    return name.rsplit(".", 1)[-1]


# --- where each tensor lives -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each stacked tensor lives in a trial's row of the banks: (bank, offset) and its shape (nn.Linear's
    own [out, in], query, key and value stacked along out), so that every Hugging Face parameter of a trial is
    a contiguous view of its row."""

    shapes: dict[str, tuple[int, ...]]
    places: dict[str, tuple[int, int]]
    widths: tuple[int, int]  # elements of one trial in bank 0 and bank 1
    accumulated: int  # bank 1's leading elements: the ACCUMULATED tensors
    align: int = 1  # of bank 1's tensors and rows, in elements (BANK_ALIGNMENT on GPUs)

    @classmethod
    def of(cls, model: torch.nn.Module, align: int = 1) -> "Layout":
        """In bank 1 every tensor starts, and every row is as long as, a multiple of `align` elements (zeros
        between). Bank 0 is the word table alone, [P, V, H] whole (RowGradient's rows), as it comes."""
        named = hf_parameters(model)
        shapes = {n: (sum(p.shape[0] for p in ps), *ps[0].shape[1:]) for n, ps in named.items()}
        padded = lambda n: -(-n // align) * align  # noqa: E731
        places, widths = {"word": (0, 0)}, [math.prod(shapes["word"]), 0]
        leading = [n for n in named if kind(n) in ACCUMULATED]
        for name in leading + [n for n in named if n != "word" and kind(n) not in ACCUMULATED]:
            places[name] = (1, widths[1])
            widths[1] = padded(widths[1] + math.prod(shapes[name]))
        accumulated = max((places[n][1] + math.prod(shapes[n]) for n in leading), default=0)
        return cls(shapes, places, tuple(widths), accumulated, align)

    def view(self, banks, name: str) -> torch.Tensor:
        """Tensor `name` in `banks` ([P, D] each: [P, *shape]; one trial's rows [D]: [*shape])."""
        bank, offset = self.places[name]
        flat = banks[bank][..., offset:offset + math.prod(self.shapes[name])]
        return flat.view(*flat.shape[:-1], *self.shapes[name])

    def names(self, bank: int) -> list[str]:
        return sorted((n for n in self.shapes if self.places[n][0] == bank), key=lambda n: self.places[n][1])

    def sizes(self, bank: int) -> list[int]:
        return [math.prod(self.shapes[n]) for n in self.names(bank)]


# --- setting trials up -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrialSetup:
    """One trial as `finetune` would start it, less its weights (drawn into the banks): for each stacked tensor
    its (learning rate, weight decay) from the trial's own optimizer groups, its schedule and subset."""

    hyper: dict[str, tuple[float, float]]
    base_lr: float  # its first optimizer group's learning rate (what LambdaLR.get_last_lr()[0] scales)
    schedule: Callable[[int], float]  # the lr factor at optimizer step s (LambdaLR's lambda)
    betas: tuple[float, float]
    eps: float
    rows: np.ndarray
    shape: FlopShape  # its model's, for counting FLOPs as `finetune` counts them


def bind(model: torch.nn.Module, layout: Layout, rows) -> None:
    """Point every parameter of `model` (a skeleton on the meta device) at its place in one trial's `rows` of
    the banks, and give its buffers real memory (the initializer rebuilds them)."""
    qualified = {id(p): name for name, p in model.named_parameters()}
    for name, params in hf_parameters(model).items():
        whole, start = layout.view(rows, name), 0
        for param in params:
            module_name, _, attribute = qualified[id(param)].rpartition(".")
            piece = whole[start:start + param.shape[0]]
            setattr(model.get_submodule(module_name), attribute, torch.nn.Parameter(piece, requires_grad=False))
            start += param.shape[0]
    for name, buffer in list(model.named_buffers()):
        module_name, _, attribute = name.rpartition(".")
        model.get_submodule(module_name)._buffers[attribute] = torch.empty_like(buffer, device=rows[0].device)


def settle(model: torch.nn.Module, layout: Layout, rows) -> None:
    """After surgery, write every tensor that no longer sits in its own place (a permutation moves layers; an
    ablation may swap in new modules) to where the encoder reads it. All are read before any is written."""
    moved = {}
    for name, params in hf_parameters(model).items():
        whole, start, in_place = layout.view(rows, name), 0, True
        for param in params:
            piece = whole[start:start + param.shape[0]]
            in_place &= param.data_ptr() == piece.data_ptr() and param.shape == piece.shape
            start += param.shape[0]
        if not in_place:
            moved[name] = torch.cat([p.detach().reshape(-1) for p in params]).clone()
    for name, values in moved.items():
        layout.view(rows, name).view(-1).copy_(values)


def set_up_trial(cfg: FinetuneConfig, data: TokenizedTask, pretrained: Pretrained, template: torch.nn.Module,
                 layout: Layout, rows) -> TrialSetup:
    """Trial `cfg` drawn straight into its `rows` of the banks (which hold the pretrained weights on entry),
    with the very draws `finetune` makes: the head by Hugging Face's initializer from the trial's seed
    (build_classifier), then apply_ablation, both on a copy of `template` bound to those rows."""
    model = copy.deepcopy(template)
    bind(model, layout, rows)
    mark_loaded(model.base_model, encoder_state(model.base_model, pretrained))
    init_fresh_parts(model, cfg.seed)
    apply_ablation(cfg.ablation, model, cfg.seed)
    settle(model, layout, rows)
    subset, _ = hold_out(draw_subset(len(data.train), cfg.train_size, cfg.subset_seed), cfg.val_size, cfg.subset_seed)
    optimizer, scheduler = make_optimizer(model, cfg, subset)
    group_of = {id(p): (g["initial_lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    hyper = {}
    for name, params in hf_parameters(model).items():
        settings = {group_of[id(p)] for p in params}
        if len(settings) != 1:
            raise ValueError(f"parameters stacked as '{name}' have different optimizer settings {settings}")
        hyper[name] = settings.pop()
    return TrialSetup(hyper, optimizer.param_groups[0]["initial_lr"], scheduler.lr_lambdas[0],
                      tuple(optimizer.defaults["betas"]), optimizer.defaults["eps"], subset, flop_shape(model))


def pretrained_rows(layout: Layout, template: torch.nn.Module, pretrained: Pretrained) -> list[torch.Tensor]:
    """One trial's rows of the banks holding the pretrained weights (zeros where the checkpoint has none):
    laid out once per pack."""
    rows = [torch.zeros(width) for width in layout.widths]  # the padding between tensors stays zero
    state = encoder_state(template.base_model, pretrained)
    key = {id(p): name for name, p in template.base_model.named_parameters()}
    for name, params in hf_parameters(template).items():
        pieces = [state.get(key.get(id(p), "")) for p in params]
        if all(piece is not None for piece in pieces):
            layout.view(rows, name).copy_(torch.cat(pieces) if len(pieces) > 1 else pieces[0])
        else:
            layout.view(rows, name).zero_()
    return rows


@dataclasses.dataclass
class StartWeights:
    """Each trial's nn.Linear weights where finetuning began, for weight_distance; in host memory when the
    banks are on a GPU. A weight that surgery left as the checkpoint has it is kept once for the pack, not once
    a trial: in the paper's grid (k of 12 layers reinitialized) a trial keeps k layers' weights, not 12, and on
    a GPU the copies in and out of host memory shrink with them."""

    pretrained: dict[str, torch.Tensor]  # name -> [out, in], the checkpoint's, where some trial starts from it
    own: dict[str, dict[int, torch.Tensor]]  # name -> {trial: its [out, in]}, where it differs from the checkpoint's

    @classmethod
    def of(cls, layout: Layout, source: list[torch.Tensor]) -> "StartWeights":
        """Empty, but for the checkpoint's weights (copied: a view would hold the whole pretrained rows)."""
        names = [n for n in layout.shapes if kind(n) in LINEAR_WEIGHTS]
        return cls({n: layout.view(source, n).clone() for n in names}, {n: {} for n in names})

    def keep(self, p: int, layout: Layout, rows: list[torch.Tensor]) -> None:
        """Trial p's weights, from its rows of the banks (host memory) as set up."""
        for name, checkpoint in self.pretrained.items():
            weight = layout.view(rows, name)
            if not torch.equal(weight, checkpoint):
                self.own[name][p] = weight.clone()

    def settle(self, size: int) -> None:
        """After the set-up of `size` trials: the checkpoint's copy of a weight no trial starts from is dropped
        (a pack of one k = 12 trial keeps one copy, as before, not two)."""
        for name, own in self.own.items():
            if len(own) == size:
                self.pretrained.pop(name, None)

    def select(self, members: list[int]) -> "StartWeights":
        """Those of some members only (in this order)."""
        return StartWeights(self.pretrained, {n: {i: own[m] for i, m in enumerate(members) if m in own}
                                              for n, own in self.own.items()})

    def stacked(self, name: str, size: int, device) -> torch.Tensor:
        """[size, out, in] on `device`: every trial's start of `name`, each copied straight into its row (no
        stack in host memory first)."""
        own = self.own[name]
        if name in self.pretrained:
            checkpoint = self.pretrained[name].to(device)
            stacked = checkpoint.expand(size, *checkpoint.shape).clone()
        else:  # every trial has its own
            stacked = torch.empty((size, *own[0].shape), device=device)
        for p, weight in own.items():
            stacked[p].copy_(weight)
        return stacked

    def pin(self) -> None:
        """Move the trials' own weights into one page-locked buffer, from which a GPU reads them at the copy
        engine's speed (pageable memory is staged through a bounce buffer at about a quarter of it: 8.5 against
        about 34 GB/s on the H100's host)."""
        owned = [(name, p, w) for name, own in self.own.items() for p, w in own.items()]
        buffer = page_locked(sum(w.numel() for _, _, w in owned))
        at = 0
        for name, p, weight in owned:
            self.own[name][p] = buffer[at:at + weight.numel()].view_as(weight).copy_(weight)
            at += weight.numel()

    def own_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for own in self.own.values() for w in own.values())

    def tensors(self) -> list[torch.Tensor]:
        return [*self.pretrained.values(), *(w for own in self.own.values() for w in own.values())]


def bank_alignment(device) -> int:
    """The Layout's alignment for a pack that trains on `device` (BANK_ALIGNMENT on GPUs)."""
    return BANK_ALIGNMENT if torch.device(device).type == "cuda" else 1


def host_memory_available() -> int:
    """Bytes the kernel says could be given out now without swapping (MemAvailable; 0 where unknown), within
    what this process's control group may still take: a container (Ray on Kubernetes) sees the host's
    /proc/meminfo, but locked pages count against its own limit."""
    available = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    headroom = cgroup_headroom()
    return available if headroom is None else min(available, headroom)


UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as about 2**63


def cgroup_headroom(root: str = "/sys/fs/cgroup") -> int | None:
    """The memory limit less the usage of the control group at `root` (v2's memory.max and memory.current, or
    v1's memory/memory.limit_in_bytes and usage_in_bytes); None where there is no limit or none is readable."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            with open(os.path.join(root, limit_file)) as f:
                limit = f.read().strip()
            with open(os.path.join(root, usage_file)) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= UNLIMITED:
            return None
        return max(0, int(limit) - usage)
    return None


def worth_pinning(nbytes: int, available: int) -> bool:
    """Whether `nbytes` of host tensors bound for a GPU go into page-locked memory: when twice that is free
    (torch's pinned allocator rounds each buffer up to a power of two and keeps it for reuse, and what is
    locked cannot be swapped out: a small host keeps its pageable copies)."""
    return 0 < 2 * nbytes <= available


ALLOCATOR_SETTINGS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch's: where a user set one, it stands


def pinned_allocator_settings(environ: Mapping[str, str], cores: int, configured: str = "") -> str | None:
    """The settings torch's page-locked allocator takes before a pack's host banks are pinned; None where the
    user configured torch's allocators, by environment or in this process (`configured`: torch's current
    settings, which a new setting would replace). Pages malloc'ed, touched by up to 8 threads, then registered
    (cudaHostRegister), instead of one cudaHostAlloc that locks and zeroes a group's 16 GiB under the driver's
    global lock: allocated in the background, that lock held up the training thread's CUDA calls. On an H100
    (with the setting given by environment) the first group of 34 took 38.9-41.4 s instead of 58.5, and a call's
    page-locked allocations 5.4-5.7 s instead of 22.6 (docs/benchmarks.md, "Page-locked pages registered")."""
    if configured or any(environ.get(name) for name in ALLOCATOR_SETTINGS):
        return None
    threads = 1 << (max(1, min(8, cores // 2)).bit_length() - 1)  # torch takes a power of two
    return f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}"


@functools.cache
def register_pinned_pages() -> None:
    """Apply pinned_allocator_settings to this process, once: from finetune_pack's own thread, before the next
    group's set-up pins its banks in the background. Torch reads them at each page-locked allocation."""
    current = getattr(torch._C, "_accelerator_getAllocatorSettings", str)()
    settings = pinned_allocator_settings(os.environ, len(os.sched_getaffinity(0)), current)
    if settings is None:
        return
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # torch 2.9 on; before, CUDA's own
    try:
        (setter or torch.cuda.memory._set_allocator_settings)(settings)
    except (RuntimeError, AttributeError) as error:  # a torch that takes no such setting: cudaHostAlloc it is
        warnings.warn(f"page-locked host memory is allocated by CUDA, not registered: torch refused '{settings}' "
                      f"({error})")


def page_locked(numel: int) -> torch.Tensor:
    """A float32 buffer in page-locked host memory, from torch's page-locked allocator."""
    return torch.empty(numel, pin_memory=True)


class HostBanks:
    """A call's page-locked buffer for the host banks its groups are set up in, held from one group's set-up to
    the next. torch.cuda.graph empties torch's page-locked cache as each recording begins (its `__enter__` calls
    `torch._C._host_emptyCache()`: torch 2.13's source; reported of 2.11 too), so a group's banks, left to that
    cache once copied to the card, were unlocked and freed early in the group's own first epoch, on the training
    thread after a synchronization, and the next group's set-up locked its banks anew beside training (15 GB for
    34 BERT-base trials). Held here, they are neither. A set-up writes into the buffer once the group before is
    on the GPU (finetune_pack prepares the next run after materializing the current one: no run then holds it)."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def holds(self, numel: int) -> bool:
        """Whether the buffer held has room for `numel` elements already (locking it took that memory from what
        the host reads as available: worth_pinning's check is for new locks)."""
        return self.buffer is not None and self.buffer.numel() >= numel

    def take(self, numel: int) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < numel:
            self.buffer = None  # a smaller one goes back before the larger is locked
            self.buffer = page_locked(numel)
        return self.buffer[:numel]


def bank_starts(size: int, widths: list[int]) -> np.ndarray:
    """Where each of `size`-row banks of these widths starts in one page-locked buffer, each at a multiple of
    BANK_ALIGNMENT elements; the last entry is the buffer's length."""
    return np.cumsum([0, *(-(-size * w // BANK_ALIGNMENT) * BANK_ALIGNMENT for w in widths)])


def empty_banks(size: int, widths: list[int], device, pin: bool = False,
                held: HostBanks | None = None) -> list[torch.Tensor]:
    """Banks [size, width] on `device`. `pin`: in host memory, page-locked, as views of one buffer (one
    allocation, rounded up to a power of two once rather than once a bank; `held`'s, where given), each starting
    at a multiple of BANK_ALIGNMENT elements."""
    if not pin:
        return [torch.empty((size, width), device=device) for width in widths]
    starts = bank_starts(size, widths)
    buffer = page_locked(int(starts[-1])) if held is None else held.take(int(starts[-1]))
    return [buffer[int(at):int(at) + size * w].view(size, w) for at, w in zip(starts, widths)]


def set_up_pack(cfgs: list[FinetuneConfig], data: TokenizedTask, pretrained: Pretrained, device,
                workers: int | None = None, staged: bool | None = None, align: int | None = None,
                pin: bool = False, held: HostBanks | None = None
                ) -> tuple[Layout, list[TrialSetup], list[torch.Tensor], StartWeights]:
    """(layout, setups, banks [P, D] on `device`, their start weights): every trial set up as `finetune` would,
    `workers` trials at a time in threads (default: the CPU threads torch uses). On a CPU each trial is drawn in
    place in its row of the banks; on a GPU (`staged`) into a host copy of the pretrained rows, then copied
    over. The start weights are taken from the host rows (no copy back from a GPU). `align`: the layout's
    (default: bank_alignment(device); a pack set up in host memory for a GPU gives the GPU's). `pin`: host
    banks and start weights bound for a GPU are page-locked, where the host has the memory (worth_pinning): a
    pack of 34 BERT-base trials moved its 15 GB of banks at 8.5 GB/s from pageable memory. `held`: the call's
    buffer for them (HostBanks), where the call sets several groups up."""
    template = classifier_skeleton(pretrained, data.num_labels)
    layout = Layout.of(template, bank_alignment(device) if align is None else align)
    source = pretrained_rows(layout, template, pretrained)
    start = StartWeights.of(layout, source)
    numel = int(bank_starts(len(cfgs), layout.widths)[-1])
    pin = pin and torch.device(device).type == "cpu" and torch.cuda.is_available() and \
        ((held is not None and held.holds(numel)) or worth_pinning(4 * numel, host_memory_available()))
    try:
        banks = empty_banks(len(cfgs), layout.widths, device, pin, held)
    except RuntimeError as error:  # CUDA would not lock that much (its error is not an OutOfMemoryError)
        warnings.warn(f"host banks of {len(cfgs)} trials stay pageable: page-locking them failed ({error})")
        pin, banks = False, empty_banks(len(cfgs), layout.widths, device)
    on_host = banks[0].device.type == "cpu" if staged is None else not staged
    if on_host:
        for bank, row in zip(banks, source):
            bank.copy_(row.expand_as(bank))

    def one(p: int) -> TrialSetup:
        rows = [bank[p] for bank in banks] if on_host else [row.clone() for row in source]
        setup = set_up_trial(cfgs[p], data, pretrained, template, layout, rows)
        start.keep(p, layout, rows)
        if not on_host:
            for bank, row in zip(banks, rows):
                bank[p].copy_(row)
        return setup

    workers = max(1, min(len(cfgs), workers or torch.get_num_threads()))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        setups = list(pool.map(one, range(len(cfgs))))
    start.settle(len(cfgs))
    if pin and worth_pinning(start.own_bytes(), host_memory_available()):
        try:
            start.pin()
        except RuntimeError as error:  # the start weights stay as they are, pageable
            warnings.warn(f"start weights stay pageable: page-locking them failed ({error})")
    return layout, setups, banks, start


# --- batches -----------------------------------------------------------------------------------------------


def bucket(n: int) -> int:
    """The smallest of 8, 12, 16, 24, 32, 48, ... (2^k and 3 * 2^(k-1)) at least n: at most a third of padding,
    and few enough distinct shapes for CUDA graphs or torch.compile."""
    size = 8
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


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
    blocked: torch.Tensor | None = None  # ~keys (made once per move, not once per layer)


INDEX_FIELDS = ("ids", "types", "positions", "gather", "scatter", "first")


def batch_arrays(split: TokenizedSplit, rows: list[np.ndarray], pad_id: int, bucketed: bool) -> dict:
    """The host arrays of one PackBatch (see PackBatch), widths bucketed or not. Every index is computed for all
    P * B sequences at once: a loop over the trials took 91 ms an epoch at a pack of 34 (10 now), time in which a
    GPU waits at each epoch's start."""
    rows = np.stack(rows)
    lengths = split.lengths[rows]  # [P, B]
    P, B = lengths.shape
    width, n = int(lengths.max()), int(lengths.sum(1).max())
    if bucketed:
        width, n = bucket(width), bucket(n)
    flat = lengths.reshape(-1)
    starts = np.cumsum(lengths, axis=1) - lengths  # each sequence's first token within its trial's packed row
    within = np.arange(int(flat.sum())) - np.repeat(np.cumsum(flat) - flat, flat)  # each token's position
    token = np.repeat(np.repeat(np.arange(P), B) * n + starts.reshape(-1), flat) + within  # its row of [P * N]
    slot = np.repeat(np.arange(P * B) * width, flat) + within  # its padded attention slot of [P * B * T]
    source = np.repeat(split.offsets[rows.reshape(-1)], flat) + within
    ids = np.full(P * n, pad_id, dtype=np.int64)
    types, positions = np.zeros(P * n, dtype=np.int64), np.zeros(P * n, dtype=np.int64)
    ids[token], types[token], positions[token] = split.input_ids[source], split.token_type_ids[source], within
    gather = np.repeat(np.arange(P) * n, B * width)  # padded slots read any row of their own trial: masked as keys
    gather[slot] = token
    scatter = np.repeat(np.arange(P) * B * width, n)  # padding tokens read a real slot of their own trial; unused
    scatter[token] = slot
    keys = (np.arange(width) < lengths[..., None]).reshape(P * B, 1, 1, width)
    return {"ids": ids.reshape(P, n), "types": types.reshape(P, n), "positions": positions.reshape(P, n),
            "gather": gather, "scatter": scatter, "first": (np.arange(P)[:, None] * n + starts).reshape(-1),
            "keys": keys, "lengths": lengths}


def to_device(arrays: list[dict], labels: list[np.ndarray], device) -> tuple[list[PackBatch], list[torch.Tensor]]:
    """Many steps' batches moved in three copies (indices, key masks, labels), then cut into per-step views:
    on a GPU from pinned memory, so the copies overlap the device's work and no step waits for them."""
    pin = torch.device(device).type == "cuda"

    def move(parts: list[np.ndarray]) -> list[torch.Tensor]:
        flat = torch.from_numpy(np.concatenate([a.reshape(-1) for a in parts]))
        moved = (flat.pin_memory() if pin else flat).to(device, non_blocking=pin)
        return list(torch.split(moved, [a.size for a in parts]))

    if not arrays:
        return [], []
    indices = move([a[f] for a in arrays for f in INDEX_FIELDS])
    keys = move([a["keys"] for a in arrays])
    blocked = torch.split(~torch.cat(keys), [k.numel() for k in keys])
    batches = []
    for i, a in enumerate(arrays):
        fields = {f: t.view(a[f].shape) for f, t in zip(INDEX_FIELDS, indices[i * 6:(i + 1) * 6])}
        batches.append(PackBatch(**fields, keys=keys[i].view(a["keys"].shape), lengths=a["lengths"],
                                 blocked=blocked[i].view(a["keys"].shape)))
    return batches, [t.view(y.shape) for t, y in zip(move(labels), labels)]


def pack_batch(split: TokenizedSplit, rows: list[np.ndarray], pad_id: int, device, bucketed: bool = False) -> PackBatch:
    """One step's batch, moved on its own."""
    return to_device([batch_arrays(split, rows, pad_id, bucketed)], [np.zeros(0)], device)[0][0]


# --- dropout -----------------------------------------------------------------------------------------------


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


GAMMA = _signed(0x9E3779B97F4A7C15)  # SplitMix64's increment: consecutive counters land far apart
MIX = (_signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB))
DROPOUT_STREAM = 0xD80  # keeps the dropout keys apart from every other use of a trial's seed
SPAN = 1 << 10  # attention elements are numbered (sequence, head, query, key) as if the batch were 1024 wide
LANES = 4  # one 64-bit hash gives the uniforms of 4 neighbouring elements, 16 bits each


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 tensors (two's-complement products wrap as on uint64; the right shifts
    are made logical by masking)."""
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * MIX[0]
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * MIX[1]
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def lane_groups(width: int) -> int:
    """Hashes a row of `width` elements needs, LANES elements each."""
    return -(-width // LANES)


def dropout_keys(seeds) -> np.ndarray:
    return np.array([_signed(int(np.random.SeedSequence([int(s), DROPOUT_STREAM]).generate_state(1, np.uint64)[0]))
                     for s in seeds], dtype=np.int64)


class Dropout:
    """Per-trial dropout, drawn for the whole pack at once: element e of trial p's mask at optimizer step t,
    site s, is kept when 16-bit lane e mod 4 of mix64(key(p, t, s) + (e div 4) * GAMMA), read as a signed
    integer, falls below (1 - rate) * 2^16 - 2^15, with e numbered within the trial's own batch along its last
    axis in groups of 4 (its packed tokens x ceil(H / 4) groups; its sequences, heads and queries on a fixed
    1024-wide grid x 256 groups of keys; its pooled sequences), so neither its pack-mates nor padding change
    its masks. One hash serves 4 elements: the hash's integer passes were most of a CPU step's dropout time
    and, on a GPU, 8 bytes of traffic an element. Lanes are read in memory order (little-endian, as every
    device torch runs on). The hidden sites' masks of a whole step (the embeddings' and two a layer, all of one
    shape) are drawn by one hash at the first of them; each attention site and the classifier's draw their own."""

    def __init__(self, seeds, hidden: float, attention: float, classifier: float, num_layers: int, device,
                 triton: bool = False):
        self.keys = torch.from_numpy(dropout_keys(seeds)).to(device)
        self.hidden_p, self.attention_p, self.classifier_p = hidden, attention, classifier
        self.hidden_sites = 2 * num_layers + 1  # then num_layers attention sites, then the classifier's
        self.sites = torch.arange(self.hidden_sites + num_layers + 1, device=device)
        self.site_keys = self.keys[:, None]
        self._ids: dict[object, tuple[tuple, torch.Tensor]] = {}
        self.every_shape = False  # each shape's coordinates kept, not the last one's (StepGraphs)
        self.triton = triton  # the masks made by one kernel (triton_kernels), the same bits
        self.begin(0)

    def keep_every_shape(self, on: bool) -> None:
        self.every_shape = on
        self._ids.clear()

    def begin(self, step: "int | torch.Tensor") -> None:
        """The keys of every site at optimizer step `step` (one small computation a step). `step` may be the
        optimizer's count on the device (int64), so that a recorded step (a CUDA graph) draws anew each time."""
        self.site_keys = mix64(self.keys[:, None] + (self.sites + step * len(self.sites)) * GAMMA)
        self.hidden_masks, self.hidden_site, self.attention_site = None, 0, 0

    def _coordinates(self, kind: str, shape: tuple, make) -> torch.Tensor:
        """The group ids (times GAMMA) of a site kind's elements at `shape`, kept while the shape repeats."""
        key = (kind, shape) if self.every_shape else kind
        cached = self._ids.get(key)
        if cached is None or cached[0] != shape:
            cached = self._ids[key] = (shape, make() * GAMMA)
        return cached[1]

    def _masks(self, groups: torch.Tensor, keys: torch.Tensor, rate: float, dtype, width: int) -> torch.Tensor:
        """Masks from the hashes of `groups` (ids of 4 elements each along the last axis) under `keys` (the
        leading dimensions, then ones), the last axis cut to `width`."""
        keep = round((1 - rate) * (1 << 16))  # lane values kept, of 2^16; the bound below always fits an int16
        if self.triton and groups.numel() // groups.shape[-1] * width < 2**31:  # the kernel's offsets are int32
            return dropout_masks(groups, keys.reshape(keys.shape[:keys.dim() - groups.dim()]), keep - (1 << 15) - 1,
                                 1.0 / (1 - rate) if keep > 0 else 0.0, width, dtype, *MIX)
        lanes = mix64(groups + keys).view(torch.int16)[..., :width]
        kept = lanes <= keep - (1 << 15) - 1 if keep > 0 else torch.zeros_like(lanes, dtype=torch.bool)
        return (kept * (1.0 / (1 - rate))).to(dtype)

    @staticmethod
    def _rows(count: int, width: int, device) -> torch.Tensor:
        """Group ids of a [count, width] grid numbered row by row, ceil(width / 4) groups a row."""
        return torch.arange(count * lane_groups(width), device=device).view(count, lane_groups(width))

    def hidden(self, x: torch.Tensor, batch: PackBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """x [P, N, H], all of the batch's packed tokens; or, with `rows` (of [P * N]), those tokens alone."""
        if self.hidden_p == 0:
            return x
        if self.hidden_masks is None:  # [sites, P, N, H], drawn at the embeddings' site, where x is whole
            N, H = x.shape[1:]
            ids = self._coordinates("hidden", (N, H), lambda: self._rows(N, H, x.device))
            keys = self.site_keys[:, :self.hidden_sites].T[:, :, None, None]
            self.hidden_masks = self._masks(ids, keys, self.hidden_p, x.dtype, H)
        mask = self.hidden_masks[self.hidden_site]
        self.hidden_site += 1
        if rows is not None:
            mask = mask.reshape(-1, mask.shape[-1])[rows].view_as(x)
        return x * mask

    def attention(self, probs: torch.Tensor, batch: PackBatch) -> torch.Tensor:
        """probs [P * B, heads, Q, T]: every query (Q = T), or the first alone (Q = 1)."""
        P, B = batch.lengths.shape
        heads, Q, T = probs.shape[1:]

        def make():
            row = SPAN // LANES  # key groups a query row
            queries = torch.arange(Q, device=probs.device).view(Q, 1) * row
            sequence_head = torch.arange(B * heads, device=probs.device).view(B, heads, 1, 1) * (SPAN * row)
            return sequence_head + queries + torch.arange(lane_groups(T), device=probs.device)

        ids = self._coordinates("attention" if Q > 1 else "attention-first", (B, heads, Q, T), make)
        keys = self.site_keys[:, self.hidden_sites + self.attention_site].view(P, 1, 1, 1, 1)
        self.attention_site += 1
        view = probs.view(P, B, heads, Q, T)
        return (view * self._masks(ids, keys, self.attention_p, probs.dtype, T)).view_as(probs)

    def classifier(self, x: torch.Tensor) -> torch.Tensor:  # x [P, B, H]
        if self.classifier_p == 0:
            return x
        B, H = x.shape[1:]
        ids = self._coordinates("classifier", (B, H), lambda: self._rows(B, H, x.device))
        return x * self._masks(ids, self.site_keys[:, -1].view(-1, 1, 1), self.classifier_p, x.dtype, H)


# --- the encoder -------------------------------------------------------------------------------------------


class _Linear(torch.autograd.Function):
    """Each trial's x [P, N, in] through its own weight [P, out, in] and bias [P, out]. The weight's and
    bias's gradients are written straight into their places in the gradient bank: returned to autograd, they
    would be added into it (a zeroed buffer, an extra pass) or copied from the transposed layout the batched
    matmul makes."""

    @staticmethod
    def forward(ctx, x, weight, bias, grad_weight, grad_bias):
        x = x.to(weight.dtype)
        ctx.save_for_backward(x, weight)
        ctx.grads = (grad_weight, grad_bias)
        return torch.baddbmm(bias.unsqueeze(1), x, weight.mT)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grad = grad.to(w.dtype)
        grad_weight, grad_bias = ctx.grads
        if grad_weight.dtype == w.dtype:
            torch.bmm(grad.mT, x, out=grad_weight)
            torch.sum(grad, 1, out=grad_bias)
        elif grad.is_cuda and FLOAT32_OUT_BMM:
            # bf16 on a GPU: the products' float32 accumulators written straight into the float32 bank, the bias's
            # as a product with ones. A view of the bank across the pack spans past 2**31 bytes from a pack of 8
            # of BERT-base, so an elementwise copy or a reduction into it is split into several kernels each
            # (about 800 a pack-of-34 step on an H200, 12 ms); cuBLAS takes the strides whole. The gradients are
            # then not rounded to bf16 on the way, as autocast's are: a little more exact.
            torch.bmm(grad.mT, x, out_dtype=grad_weight.dtype, out=grad_weight)
            ones = grad.new_ones(grad.shape[0], 1, grad.shape[1])
            torch.bmm(ones, grad, out_dtype=grad_bias.dtype, out=grad_bias.unsqueeze(1))
        else:
            grad_weight.copy_(torch.bmm(grad.mT, x))
            grad_bias.copy_(grad.sum(1))
        return torch.bmm(grad, w), None, None, None, None


def rows_of(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index] along dim 0, by index_select: its backward adds the gradient into rows with index_add_, where
    indexing's uses index_put with accumulation. That one sorts the indices and walks each row's repeats in
    turn, and every padded attention slot reads one row of its trial: on an H100 its 23 calls took 7.8 ms of a
    pack-of-34 step, 340 us each. The repeats carry exact zeros (a masked key, an unread query, a padding
    token), so the order in which index_add_ adds them changes no number."""
    return x.index_select(0, index)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=eps) * weight.unsqueeze(1) + bias.unsqueeze(1)


def embed(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each trial's rows of its own table [P, V, H] (any strides) for ids [P, N]."""
    return table[torch.arange(table.shape[0], device=ids.device).unsqueeze(1), ids]


class RowGradient:
    """The gradient of a large embedding table (the vocabulary's), kept in its bank from step to step: a step's
    batches touch a few hundred of its rows, and on a CPU a dense gradient built afresh each step (autograd's)
    cost more than the step's matmuls (zeroing [P, 30522, H] on newly mapped memory, then reading it whole for
    the clipping norm). `lookup` reads rows; backward adds into the rows it read; `clear` zeroes the rows the
    last step touched. On a CPU (`sparse`) the clipping norm and scale read only those rows; on a GPU they
    read the whole table, which is fast there, since listing the distinct rows would make every step wait for
    the device. The optimizer reads the rows a trial's data can touch (vocabulary_rows), or, with weight
    decay on the table, all of it, as torch's AdamW over nn.Embedding does."""

    def __init__(self, table: torch.Tensor, grad: torch.Tensor | None, sparse: bool | None = None):
        self.table = table  # [P, V, H], contiguous
        self.sparse = (table.device.type == "cpu") if sparse is None else sparse
        P, V, H = table.shape
        self.offsets = torch.arange(P, device=table.device).unsqueeze(1) * V
        self.touched: list[torch.Tensor] = []  # flat rows [P * V] read since the last clear, repeats included
        self.bind(grad)

    def bind(self, grad: torch.Tensor | None) -> None:
        """The table's gradient, [P, V, H] (zeros), from now on."""
        self.grad = grad
        self.rows = None if grad is None else grad.view(-1, grad.shape[-1])
        self.touched = []

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        flat = (ids + self.offsets).reshape(-1)
        self.touched.append(flat)
        return _RowLookup.apply(self.table, flat, self).view(*ids.shape, self.table.shape[-1])

    def read(self) -> torch.Tensor | None:
        """The rows read since the last clear, in one tensor (made before a step's update: see run_step)."""
        return torch.cat(self.touched) if self.touched else None

    def clear(self, read: torch.Tensor | None) -> None:
        """Zero the rows `read` (self.read()) and start listing anew."""
        if read is not None:
            self.rows.index_fill_(0, read, 0.0)
        self.touched = []

    def _distinct(self) -> torch.Tensor:
        return torch.unique(torch.cat(self.touched)) if self.touched else self.offsets.new_zeros(0)

    def squared_norms(self) -> torch.Tensor:
        """[P]: each trial's squared gradient norm over its table."""
        P, V, _ = self.table.shape
        if not self.sparse:
            return torch.linalg.vector_norm(self.grad.flatten(1), dim=1, dtype=torch.float32).pow(2)
        rows = self._distinct()
        norms = torch.zeros(P, dtype=torch.float32, device=self.table.device)
        return norms.index_add_(0, torch.div(rows, V, rounding_mode="floor"), self.rows[rows].float().pow(2).sum(1))

    def scale(self, coef: torch.Tensor) -> None:
        """Trial p's gradient times coef[p], in the rows read since the last clear (`sparse` alone; the whole
        table is a plain tensor, `grad`)."""
        P, V, _ = self.table.shape
        rows = self._distinct()
        factor = coef[torch.div(rows, V, rounding_mode="floor")].unsqueeze(1).to(self.rows.dtype)
        self.rows.index_copy_(0, rows, self.rows[rows] * factor)


class _RowLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, flat, owner):
        ctx.flat, ctx.owner = flat, owner
        return table.view(-1, table.shape[-1]).index_select(0, flat)

    @staticmethod
    def backward(ctx, grad):
        ctx.owner.rows.index_add_(0, ctx.flat, grad.reshape(-1, grad.shape[-1]).to(ctx.owner.rows.dtype))
        return None, None, None


class PackEncoder:
    """BERT's sequence classifier, every parameter stacked over the pack's trials."""

    def __init__(self, pack: "Pack", config):
        from transformers.activations import ACT2FN

        self.pack = pack
        self.heads = int(config.num_attention_heads)
        self.eps = float(config.layer_norm_eps)
        self.num_layers = int(config.num_hidden_layers)
        self.act = ACT2FN[config.hidden_act]
        layout, bank = pack.layout, pack.banks[1]
        # what the linear layers read: in bf16 views of a copy of bank 1 in that dtype (see refresh)
        self.low = torch.empty_like(bank, dtype=torch.bfloat16) if pack.compute.precision == "bf16" else None
        self.compute_weights = {n: layout.view([None, self.low if self.low is not None else bank], n)
                                for n in layout.shapes if layout.places[n][0] == 1}
        # The biases are read from a contiguous copy in the compute dtype, gathered with the cast (Pack.small
        # says why).
        biases = [n for n in layout.names(1) if n.endswith("_b") and kind(n) not in ACCUMULATED]
        self.bias_columns = torch.cat([torch.arange(layout.places[n][1], layout.places[n][1] + layout.shapes[n][0])
                                       for n in biases]).to(bank.device)
        self.biases = bank.new_empty((len(pack.cfgs), len(self.bias_columns)),
                                     dtype=(self.low if self.low is not None else bank).dtype)
        start = 0
        for name in biases:
            self.compute_weights[name] = self.biases[:, start:start + layout.shapes[name][0]]
            start += layout.shapes[name][0]
        self.cast_at: int | None = None
        self.low_at: int | None = None  # the step count at which the update kernel last wrote `low`

    def refresh(self) -> None:
        """The weights as the step reads them, made anew after an update: the small tensors' contiguous copies
        (the ACCUMULATED ones, Pack.small, and the biases), and the linear layers' weights in the compute dtype.
        In bf16 (as autocast casts them) bank 1 is cast in one pass into a copy kept for the pack's life, whose
        views serve every layer: one contiguous kernel and no new views a step, instead of a strided cast of each
        weight and bias, which ran at about half the memory's speed on an H100. Its 2 bytes a parameter stand in
        for the per-layer casts that the backward kept until its end anyway. Keyed on the optimizer's step count: bank
        1 changes only in PackOptimizer.step, run or replayed (a replay sets `cast_at` to None, as its recording
        refreshed before its update; a resume, a split or a selection builds a new Pack), and torch's fused AdamW
        leaves tensors' version counters as they were. The update kernel (triton_kernels) writes the cast itself
        and says so in `low_at`, and then the copy is skipped, in a recording too (its replays' updates write
        it); with torch's update every forward and every recording casts."""
        step = self.pack.optimizer.step_count
        if self.cast_at == step:
            return
        with torch.no_grad():
            bank = self.pack.banks[1]
            self.pack.small.copy_(bank[:, :self.pack.small.shape[1]])
            if self.low is not None and self.low_at != step:  # low_at: set by the update kernel alone
                self.low.copy_(bank)
            torch.index_select(self.low if self.low is not None else bank, 1, self.bias_columns, out=self.biases)
        self.cast_at = step

    def linear(self, x: torch.Tensor, name: str, outputs: slice | None = None) -> torch.Tensor:
        """x through linear layer `name`, or through its `outputs` alone (their rows of its weight and bias)."""
        part = (lambda t: t) if outputs is None else (lambda t: t[:, outputs])  # noqa: E731 (no view when whole)
        weight, bias = part(self.compute_weights[f"{name}_w"]), part(self.compute_weights[f"{name}_b"])
        if not torch.is_grad_enabled():
            return torch.baddbmm(bias.unsqueeze(1), x.to(weight.dtype), weight.mT)
        grads = self.pack.grad_views
        return _Linear.apply(x, weight, bias, part(grads[f"{name}_w"]), part(grads[f"{name}_b"]))

    def __call__(self, batch: PackBatch, dropout: Dropout | None) -> torch.Tensor:
        """Logits [P, B, labels]; dropout None: evaluation."""
        self.refresh()
        w, (P, B) = self.pack.weights, batch.lengths.shape
        H, T = w["emb_ln_w"].shape[-1], batch.keys.shape[-1]
        drop = dropout.hidden if dropout is not None else (lambda x, _, rows=None: x)
        words = self.pack.words.lookup(batch.ids) if torch.is_grad_enabled() else embed(w["word"], batch.ids)
        x = words + embed(w["token_type"], batch.types) + embed(w["position"], batch.positions)
        x = drop(layer_norm(x, w["emb_ln_w"], w["emb_ln_b"], self.eps), batch)
        firsts = lambda t: rows_of(t.reshape(-1, H), batch.first).view(P, B, H)  # noqa: E731
        # rows of n * H (n of query, key and value) into n tensors [P * B, heads, T or 1, H / heads]
        split_heads = lambda t, n: t.view(P * B, -1, n, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)  # noqa
        for i in range(1, self.num_layers + 1):
            if i < self.num_layers:
                q, k, v = split_heads(rows_of(self.linear(x, f"{i}.qkv").reshape(-1, 3 * H), batch.gather), 3)
                context = self.attention(q, k, v, batch, dropout).transpose(1, 2).reshape(P * B * T, H)
                context, rows = rows_of(context, batch.scatter).view(P, -1, H), None
            else:
                # Only each sequence's first token reaches the pooler, so the last layer attends from it alone:
                # its query, output projection and feed-forward run on that token alone, its keys and values on
                # all: 10 of a layer's 12 H x H products a token saved in the last of L layers (about 13% of
                # MiniLM's linear FLOPs, 7% of BERT-base's), the same numbers but for the order of float sums
                # (its dropout masks are its own rows of the full ones).
                kv = rows_of(self.linear(x, f"{i}.qkv", slice(H, None)).reshape(-1, 2 * H), batch.gather)
                k, v = split_heads(kv, 2)
                x, rows = firsts(x), batch.first
                (q,) = split_heads(self.linear(x, f"{i}.qkv", slice(H)), 1)
                context = self.attention(q, k, v, batch, dropout).reshape(P, B, H)
            x = layer_norm(x + drop(self.linear(context, f"{i}.attn_out"), batch, rows),
                           w[f"{i}.attn_ln_w"], w[f"{i}.attn_ln_b"], self.eps)
            h = self.act(self.linear(x, f"{i}.ffn_in"))
            x = layer_norm(x + drop(self.linear(h, f"{i}.ffn_out"), batch, rows),
                           w[f"{i}.ffn_ln_w"], w[f"{i}.ffn_ln_b"], self.eps)
        pooled = torch.tanh(self.linear(x if self.num_layers else firsts(x), "pool"))
        if dropout is not None:
            pooled = dropout.classifier(pooled)
        return self.linear(pooled, "head")

    @staticmethod
    def attention(q, k, v, batch: PackBatch, dropout: Dropout | None) -> torch.Tensor:
        if dropout is None or dropout.attention_p == 0:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=batch.keys)
        # Attention dropout drawn per trial: SDPA's own dropout would draw from the global stream.
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        probs = scores.masked_fill(batch.blocked, float("-inf")).softmax(-1)
        return dropout.attention(probs, batch) @ v


# --- the optimizer and clipping ----------------------------------------------------------------------------


class PackOptimizer:
    """AdamW over the banks, as torch's over each trial's parameters: torch's own fused AdamW kernel, called
    once for each distinct (learning rate, weight decay) among the pack's trials and tensors, over the runs of
    the banks that have it (a run: consecutive tensors of one trial's row with the same setting; a whole bank
    when every trial has one setting over it, as in the paper's grid). So a step is as many calls as there are
    settings, whatever the pack's size, one pass over the weights, gradients and moments (of the word table,
    the rows its trials' data can touch: vocabulary_rows), and the arithmetic of the trials' own optimizers.
    Every trial steps together (a diverged trial goes on stepping its
    non-finite weights, as it would alone; no report reads them), so one step count serves all.

    On GPUs (`pack.triton`) the update is triton_kernels' instead: the same arithmetic with each trial's clipping
    factor and the bf16 cast in its pass, one launch for each run of columns that every trial shares (one for
    a whole bank in the paper's grid; a trial's own run where they differ), and one over the word table's
    rows (`sweeps`)."""

    def __init__(self, pack: "Pack"):
        layout, setups = pack.layout, pack.setups
        first = setups[0]
        if any((s.betas, s.eps) != (first.betas, first.eps) for s in setups):
            raise ValueError("trials of one pack must share AdamW's betas and eps")
        self.pack, self.betas, self.eps, self.schedule = pack, first.betas, first.eps, first.schedule
        self.groups: dict[tuple[float, float], list[tuple]] = {}
        self.sweeps: list[tuple] = []  # (setting, bank, first trial, trials, begin, end): the kernel's launches
        self.word_rows = vocabulary_rows(pack)
        V = layout.shapes["word"][0]  # the trial of each of those rows, for the clipping norms
        self.word_trials = {lr: torch.div(rows, V, rounding_mode="floor") for lr, rows in (self.word_rows or {}).items()}
        for bank in (0, 1) if self.word_rows is None else (1,):
            rows = [runs(layout, bank, setup.hyper) for setup in setups]
            if all(r == rows[0] for r in rows):
                self.sweeps += [(setting, bank, 0, len(rows), begin, end) for setting, begin, end in rows[0]]
            else:
                self.sweeps += [(setting, bank, p, 1, begin, end) for p, row in enumerate(rows) for setting, begin, end in row]
        # torch's AdamW takes 1-d tensors: a whole bank flat where one sweep covers it, else each trial's runs
        for setting, bank, first, count, begin, end in self.sweeps:
            whole = count == len(setups) and (begin, end) == (0, layout.widths[bank])
            self.groups.setdefault(setting, []).extend(
                [(bank, None, 0, end)] if whole else [(bank, p, begin, end) for p in range(first, first + count)])
        self.rates = {lr for lr, _ in self.groups} | set(self.word_rows or {})
        self.steps = torch.zeros((), dtype=torch.float32, device=pack.banks[0].device)
        self.step_count = 0
        self._compact: dict[float, list[torch.Tensor]] = {}  # kept_word_rows
        self._compact_of: list[torch.Tensor] | None = None  # the moments they were gathered from
        self._views: dict[str, tuple] = {}
        self.lr_tables: dict[float, torch.Tensor] | None = None

    def counter(self) -> torch.Tensor:
        """The steps taken so far, on the device (int64; `steps`, AdamW's count, is float32 and exact here)."""
        return self.steps.long()

    def read_lr_from_device(self) -> None:
        """From now on every learning rate is read, at each step, from a table of lr * schedule(s) on the
        device, instead of passed as a number: a recorded step (a CUDA graph) then follows the schedule. The
        table holds float64 on CPUs (torch's CPU kernel reads it as a double: the same numbers as a Python
        float) and float32 on GPUs (its CUDA kernel reads a float)."""
        dtype = torch.float64 if self.steps.device.type == "cpu" else torch.float32
        total_steps = schedule_steps(len(self.pack.setups[0].rows), self.pack.cfgs[0])
        # one step beyond the run: an index past a CUDA table's end would be a device-side assert
        self.lr_tables = {lr: torch.tensor([lr * self.schedule(s) for s in range(total_steps + 1)], dtype=dtype,
                                           device=self.steps.device) for lr in self.rates}

    def views(self, what: str, banks: list[torch.Tensor]) -> dict[tuple, list[torch.Tensor]]:
        """Each group's runs in `banks` (the weights, gradients or a moment), made once per set of banks."""
        cached = self._views.get(what)
        if cached is None or cached[0] is not banks:
            piece = lambda bank, p, begin, end: banks[bank].view(-1) if p is None else banks[bank][p, begin:end]  # noqa: E731
            cached = self._views[what] = (banks, {g: [piece(*r) for r in rs] for g, rs in self.groups.items()})
        return cached[1]

    def resume_at(self, step_count: int) -> None:
        self.step_count = step_count
        self.steps.fill_(step_count)

    def step(self, coef: torch.Tensor) -> None:
        """One update; `coef` [P], each trial's clipping factor, which clip_per_trial applied already unless
        the kernel applies it here."""
        factor = self.schedule(self.step_count)
        at = self.counter().view(1) if self.lr_tables is not None else None
        rate = (lambda lr: lr * factor) if at is None else (lambda lr: self.lr_tables[lr].index_select(0, at).view(()))  # noqa: E731
        with torch.no_grad():
            self.steps += 1
            if self.pack.triton:
                self.kernel_step(coef, rate)
            else:
                self.torch_step(rate)
        self.step_count += 1

    def kernel_step(self, coef: torch.Tensor, rate: Callable) -> None:
        pack, low = self.pack, self.pack.encoder.low
        scalars = {lr: step_scalars(rate(lr), self.steps, self.betas) for lr in self.rates}
        banks = (pack.banks, pack.grads, pack.exp_avg, pack.exp_avg_sq)
        V, H = pack.layout.shapes["word"]
        for lr, rows in (self.word_rows or {}).items():
            adamw_clipped(*[b[0].view(-1, H) for b in banks], coef, scalars[lr], *self.betas, self.eps, 0.0,
                          index=rows, rows_per_trial=V)
        for (lr, decay), bank, first, count, begin, end in self.sweeps:
            views = [b[bank][first:first + count, begin:end] for b in banks]
            adamw_clipped(*views, coef[first:first + count], scalars[lr], *self.betas, self.eps, decay,
                          low=low[first:first + count, begin:end] if bank == 1 and low is not None else None)
        if low is not None:  # every column of bank 1 is in a sweep: the cast is made
            pack.encoder.low_at = self.step_count + 1

    def torch_step(self, rate: Callable) -> None:
        pack = self.pack
        weights, grads = self.views("weights", pack.banks), self.views("grads", pack.grads)
        exp_avg, exp_avg_sq = self.views("exp_avg", pack.exp_avg), self.views("exp_avg_sq", pack.exp_avg_sq)
        for lr, rows in (self.word_rows or {}).items():
            H = pack.layout.shapes["word"][-1]
            param, grad, m, v = self.kept_word_rows(lr, rows)
            torch.index_select(pack.grads[0].view(-1, H), 0, rows, out=grad)
            self.adamw([param], [grad], [m], [v], rate(lr), 0.0)
            write_rows(pack.banks[0].view(-1, H), rows, param)  # what the next step's lookups read
        for (lr, decay), params in weights.items():
            self.adamw(params, grads[lr, decay], exp_avg[lr, decay], exp_avg_sq[lr, decay], rate(lr), decay)

    def kept_word_rows(self, lr: float, rows: torch.Tensor) -> list[torch.Tensor]:
        """[weights, gradients, exp_avg, exp_avg_sq] of the word table's `rows` (vocabulary_rows), gathered at the
        first update after the pack's moments are made and kept from step to step. Only the updated weights go
        back to the table each step (the lookups read it); the moments go back when the pack's state is read
        (`put_back_word_rows`). On a CPU, gathering four [P * V, H] tables' rows and writing three back took
        5.3 ms of a MiniLM step (about 2,000 rows spread over 47 MB each), the update itself 0.4 ms."""
        pack = self.pack
        if self._compact_of is not pack.exp_avg:  # moments made anew: gather again
            self._compact, self._compact_of = {}, pack.exp_avg
        if lr not in self._compact:
            H = pack.layout.shapes["word"][-1]
            param, m, v = (bank[0].view(-1, H).index_select(0, rows)
                           for bank in (pack.banks, pack.exp_avg, pack.exp_avg_sq))
            self._compact[lr] = [param, torch.empty_like(param), m, v]
        return self._compact[lr]

    def put_back_word_rows(self) -> None:
        """The kept moments of the word rows written into the pack's moment tables, which are then whole."""
        pack = self.pack
        if self._compact_of is not pack.exp_avg:  # none kept, or kept from moments since given back
            return
        H = pack.layout.shapes["word"][-1]
        for lr, (_, _, m, v) in self._compact.items():
            write_rows(pack.exp_avg[0].view(-1, H), self.word_rows[lr], m)
            write_rows(pack.exp_avg_sq[0].view(-1, H), self.word_rows[lr], v)

    def adamw(self, params, grads, exp_avg, exp_avg_sq, lr: "float | torch.Tensor", decay: float) -> None:
        torch._fused_adamw_(params, grads, exp_avg, exp_avg_sq, [], [self.steps] * len(params), lr=lr,
                            beta1=self.betas[0], beta2=self.betas[1], weight_decay=decay, eps=self.eps,
                            amsgrad=False, maximize=False)

    def lr_last(self, p: int) -> float:
        """Trial p's first group's learning rate now, as LambdaLR.get_last_lr()[0] says after the last step."""
        return self.pack.setups[p].base_lr * self.schedule(self.step_count)


def vocabulary_rows(pack: "Pack") -> dict[float, torch.Tensor] | None:
    """Per learning rate, the rows of the stacked word table [P * V, H] that AdamW must update: those of the
    tokens in each trial's training subset, and padding's. No other row ever has a gradient, so without weight
    decay its moments stay zero and AdamW's update of it is exactly zero: leaving it out changes no number,
    and a step reads 7% of the table instead of all of it (a 500-example SST-2 subset uses about 2,000 of
    30,522 tokens). Fixed for the pack's life, so a GPU step lists no rows and waits for nothing. None (the
    whole table) when a trial decays the table's weights: decay moves every row."""
    if any(setup.hyper["word"][1] != 0 for setup in pack.setups):
        return None
    train, V = pack.data.train, pack.layout.shapes["word"][0]
    by_lr: dict[float, list[np.ndarray]] = {}
    for p, setup in enumerate(pack.setups):
        member = np.zeros(len(train.lengths), dtype=bool)
        member[setup.rows] = True
        tokens = np.append(train.input_ids[np.repeat(member, train.lengths)], pack.compute.pad_id)
        by_lr.setdefault(setup.hyper["word"][0], []).append(p * V + np.unique(tokens.astype(np.int64)))
    return {lr: torch.from_numpy(np.concatenate(rows)).to(pack.banks[0].device) for lr, rows in by_lr.items()}


def write_rows(table: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    """table[rows] = values. On a CPU through numpy, whose row assignment is 3x torch's index_copy_ there (125
    against 350 us for 2,000 rows of 384)."""
    if table.device.type == "cpu":
        table.numpy()[rows.numpy()] = values.numpy()
    else:
        table.index_copy_(0, rows, values)


def runs(layout: Layout, bank: int, hyper: dict[str, tuple[float, float]]) -> list[tuple[tuple[float, float], int, int]]:
    """(setting, begin, end) of one trial's row of `bank`: its tensors in order, consecutive ones of the same
    (learning rate, weight decay) merged, each run to the next one's start (the row's end for the last): over
    the padding between tensors (Layout.of), zeros AdamW leaves zero, so that a run of a padded row keeps its
    length a multiple of 4, as CUDA's vectorized AdamW needs."""
    names = layout.names(bank)
    found: list = []
    for i, name in enumerate(names):
        begin = layout.places[name][1]
        end = layout.places[names[i + 1]][1] if i + 1 < len(names) else layout.widths[bank]
        if found and found[-1][0] == hyper[name]:
            found[-1] = (hyper[name], found[-1][1], end)
        else:
            found.append((hyper[name], begin, end))
    return found


def scale_rows(rows: list[list[torch.Tensor]], coef: torch.Tensor) -> None:
    """Each trial's tensors (rows[p]) times coef[p], read on the device: one vectorized multi-tensor pass a
    trial. A [P, 1] broadcast multiply runs as a strided kernel, which on an H100 took 18.4 ms a pack-of-34
    step for what the memory's speed allows in about 9."""
    for tensors, factor in zip(rows, coef.unbind()):
        torch._foreach_mul_(tensors, factor)


def word_squared_norms(pack: "Pack") -> torch.Tensor:
    """[P]: each trial's squared gradient norm over its word table. A GPU's table gradient is dense, but only
    the rows of the trials' own tokens (vocabulary_rows) can be other than zero: reading those alone reads 7%
    of it (on an H100, a millisecond of a pack-of-34 step saved). The same sum, in another order."""
    rows = pack.optimizer.word_rows
    if pack.words.sparse or rows is None:
        return pack.words.squared_norms()
    V, H = pack.layout.shapes["word"]
    table = pack.grads[0].view(-1, H)
    norms = torch.zeros(len(pack), dtype=torch.float32, device=table.device)
    for trials, flat in zip(pack.optimizer.word_trials.values(), rows.values()):
        norms.index_add_(0, trials, torch.linalg.vector_norm(table.index_select(0, flat), dim=1).pow(2))
    return norms


def clip_per_trial(pack: "Pack", max_norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each trial's gradient scaled to at most its max norm (0: not clipped), as clip_grad_norm_ over its own
    parameters (the word table's through `words`); returns the factors [P] and which trials were clipped. With
    the update kernel the gradients stay as they are: the update multiplies them as it reads them."""
    grads = pack.grads[1]
    norms = (torch.linalg.vector_norm(grads, dim=1, dtype=torch.float32).pow(2) + word_squared_norms(pack)).sqrt()
    coef = torch.where(max_norms > 0, (max_norms / (norms + 1e-6)).clamp(max=1.0), 1.0)
    clipped = (max_norms > 0) & (norms > max_norms)
    # A coefficient of exactly 1 changes no gradient: on a CPU, where asking costs nothing, a step with no trial
    # clipped skips the pass over the gradients (1.6 ms of a MiniLM step); a GPU would have to wait to know.
    if pack.triton:  # the update multiplies the gradients as it reads them
        return coef, clipped
    if not pack.words.sparse:
        scale_rows(pack.grad_rows, coef)
    elif bool((coef < 1).any()):
        grads.mul_(coef.unsqueeze(1))
        pack.words.scale(coef)
    return coef, clipped


# --- a pack ------------------------------------------------------------------------------------------------


def trials_that_fit(free_bytes: int, parameters: int) -> int:
    """How many trials of `parameters` each fit in MEMORY_SHARE of `free_bytes` (at least one)."""
    return max(1, int(MEMORY_SHARE * free_bytes // (PEAK_BYTES_PER_PARAMETER * parameters)))


# At most this many trials a group on a GPU, however many fit: a pack's later groups are set up while one trains,
# and a small model's 168 on an 80 GiB card as one group would leave that set-up nothing to overlap.
MAX_GROUP = 64


def group_size(trials: int, budget: int | None, parameters: int) -> int:
    """The trials of a pack that train at once: on a GPU as many as fit in `budget` bytes, at most MAX_GROUP;
    on a CPU (`budget` None) all of them."""
    return trials if budget is None else min(trials, MAX_GROUP, trials_that_fit(budget, parameters))


def device_budget(device: torch.device, gpu_fraction: float) -> int | None:
    """Bytes a pack may take on `device`: a GPU's free memory, within the share of it Ray gave (None: a CPU).
    An ended pack of this process reads as taken until collected (release_memory, finetune_pack's first step)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(min(free, gpu_fraction * total)) if gpu_fraction < 1 else int(free)


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


def oom_injected(size: int, step: int) -> bool:
    """Whether the test-only OOM_ABOVE setting makes a pack of `size` run out of memory at optimizer step `step`."""
    setting = os.environ.get(OOM_ABOVE)
    if not setting:
        return False
    above, _, at = setting.partition(":")
    return size > int(above) and step == int(at or 0)


class Pack:
    """P trials' state: the banks, gradients and moments, batch orders, dropout streams; one step trains all.
    Built by setting the trials up (`Pack(cfgs, data, pretrained)`), or from `parts` that an earlier pack
    handed over (a split, a checkpoint)."""

    def __init__(self, cfgs: list[FinetuneConfig], data: TokenizedTask, pretrained: Pretrained,
                 parts: "PackParts | None" = None, device=None):
        check_pack(cfgs, pretrained)
        cfg, config = cfgs[0], pretrained.config
        self.cfgs, self.data = cfgs, data
        device = torch.device(device) if device is not None else pick_device(cfg.gpu_fraction)
        if parts is None:
            parts = PackParts.set_up(cfgs, data, pretrained, device)
        self.layout, self.setups = parts.layout, parts.setups
        self.banks = [b.to(device) for b in parts.banks]
        # Adam's moments and the gradients are made by the first step that needs them (a pack split at its
        # last evaluation never does)
        self.exp_avg = [m.to(device) for m in parts.exp_avg] if parts.exp_avg else None
        self.exp_avg_sq = [v.to(device) for v in parts.exp_avg_sq] if parts.exp_avg_sq else None
        self.start = parts.start  # the linear weights after surgery, for weight_distance
        self.compute = Compute(device, cfg.precision, int(config.pad_token_id or 0), self.setups[0].shape)
        # The small tensors (the ACCUMULATED ones: LayerNorms, the position and token-type tables) are read from a
        # contiguous float32 copy of bank 1's leading columns, made with the cast (PackEncoder.refresh), and their
        # gradients gathered in one (small_grad), copied into the gradient bank after backward. Read as views of
        # a bank, every op on one spans the pack's rows, past 2**31 bytes at packs of 8 or more of BERT-base, and
        # CUDA splits each such op into several kernels (with the biases', about 180 ops a step). So their
        # views here are as fresh as the last forward: read the banks for their values after an update.
        self.small = self.banks[1][:, :self.layout.accumulated].clone()
        self.weights = {n: self.layout.view([None, self.small] if kind(n) in ACCUMULATED else self.banks, n)
                        for n in self.layout.shapes}
        self.grads: list[torch.Tensor] | None = None
        self.small_grad: torch.Tensor | None = None
        self.grad_views: dict[str, torch.Tensor] = {}
        self.grad_rows: list[list[torch.Tensor]] = []
        P, (V, H) = len(cfgs), self.layout.shapes["word"]
        # requires_grad: autograd then calls the lookup's backward, which adds into the gradient bank itself
        self.words = RowGradient(self.banks[0].view(P, V, H).requires_grad_(True), None)
        self.triton = use_triton(device)  # the update and the dropout masks by triton_kernels' (GPUs)
        self.encoder = PackEncoder(self, config)
        self.optimizer = PackOptimizer(self)
        self.optimizer.resume_at(parts.step_count)
        self.rngs = [np.random.default_rng(np.random.SeedSequence([c.seed, 1])) for c in cfgs]
        for rng, saved in zip(self.rngs, parts.rng_states or []):
            rng.bit_generator.state = saved
        classifier_p = config.classifier_dropout if getattr(config, "classifier_dropout", None) is not None \
            else config.hidden_dropout_prob
        self.dropout = Dropout([c.seed for c in cfgs], float(config.hidden_dropout_prob),
                               float(config.attention_probs_dropout_prob), float(classifier_p),
                               int(config.num_hidden_layers), device, self.triton)
        self.max_norms = torch.tensor([c.max_grad_norm for c in cfgs], dtype=torch.float32, device=device)
        self.active = torch.tensor(parts.active, device=device) if parts.active is not None else \
            torch.ones(len(cfgs), dtype=torch.bool, device=device)
        self.clipped = torch.tensor(parts.clipped, device=device) if parts.clipped is not None else \
            torch.zeros(len(cfgs), dtype=torch.long, device=device)
        # Widths bucketed to few sizes: on GPUs for CUDA graphs; in bf16 on CPUs for oneDNN, which builds its
        # bf16 matmul for each new shape and keeps a thousand: a token count that changes every batch made a bf16
        # MiniLM step on an AMX Xeon 116 ms, slower than fp32's 97 (84 bucketed; docs/benchmarks.md). In fp32
        # padding changes no number (test_bucketed_widths_change_no_number); bf16's kernels for other shapes round
        # otherwise, as for another thread count, and the same settings and threads give the same numbers.
        self.bucketed = device.type == "cuda" or self.compute.precision == "bf16"
        self.graphs = step_graphs(self)
        # for its rows: graphs given up (StepGraphs.give_up) leave the learning rates read in float32
        self.graphs_on = self.graphs is not None
        self.epoch_flops = np.array([self.compute.flops(data.train.lengths[s.rows], True, cfg.batch_size)
                                     for s in self.setups])
        self._eval: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self.cfgs)

    def bind_gradients(self) -> None:
        """Gradient banks (zeros), and the views of them each tensor's gradient goes to: autograd's .grad for
        the ACCUMULATED tensors, the encoder's own writes for the linear layers, RowGradient's for the table."""
        self.grads = [torch.zeros_like(b) for b in self.banks]
        self.grad_views = {n: self.layout.view(self.grads, n) for n in self.layout.shapes}
        self.grad_rows = [[g[p] for g in self.grads] for p in range(len(self))]  # each trial's, for clipping
        self.small_grad = torch.zeros_like(self.small)  # copied into the bank after backward (see self.small)
        for name in self.layout.shapes:
            if kind(name) in ACCUMULATED:
                self.weights[name].requires_grad_(True).grad = self.layout.view([None, self.small_grad], name)
        self.words.bind(self.grads[0].view_as(self.words.table))

    def free_gradients(self) -> None:
        """Give the gradient banks back, and the recorded steps that write them; the next step makes them anew."""
        self.grads, self.grad_views, self.grad_rows, self.small_grad = None, {}, [], None
        if self.graphs is not None:
            self.graphs.reset()
        self.words.bind(None)
        for name in self.layout.shapes:
            if kind(name) in ACCUMULATED:
                self.weights[name].grad = None

    def make_training_state(self, gradients: bool = True) -> None:
        """Adam's moments (zeros), and with `gradients` the gradient banks, unless made already."""
        if self.exp_avg is None:
            self.exp_avg, self.exp_avg_sq = [torch.zeros_like(b) for b in self.banks], [torch.zeros_like(b) for b in self.banks]
        if gradients and self.grads is None:
            self.bind_gradients()

    def check_replays(self) -> None:
        """With graphs on, at an epoch's end, where the host waits for the device anyway: the optimizer's count
        on the device must equal the steps taken. A replay that ran nothing (an empty recording) leaves it
        behind, and the trials would go on with weights that never change, and no error."""
        if not self.graphs_on:
            return
        on_device = int(self.optimizer.steps.item())
        if on_device != self.optimizer.step_count:
            raise RuntimeError(f"fused pack of {len(self)}: after {self.optimizer.step_count} steps the optimizer's "
                               f"count on the device is {on_device}: steps replayed as CUDA graphs did not run. "
                               f"Set {CUDA_GRAPHS}=0 to run steps op by op.")

    def before_evaluation(self) -> None:
        """Before an evaluation that more epochs follow: the gradient banks go back, unless recorded steps write
        them (StepGraphs). Given back, every shape would be warmed up and recorded again after each evaluation.
        The memory probe measured an evaluation beside the banks (Pack.peak_memory), not beside the recordings'
        pool, which stays too: an evaluation that runs out of memory splits the pack."""
        if self.graphs is None:
            self.free_gradients()

    def finite_weights(self) -> np.ndarray:
        """Per member, whether its weights are all finite: an epoch's last update can leave inf or nan weights
        after a finite loss, which then only an evaluation (of a constant guess) would meet. A row's sum is
        non-finite if any of its weights is, at a tenth of isfinite's cost."""
        return torch.isfinite(sum(bank.sum(1) for bank in self.banks)).cpu().numpy()

    def free_training_state(self) -> None:
        """Gradients and Adam's moments given back: after the last step, the evaluation has the memory."""
        self.free_gradients()
        self.exp_avg = self.exp_avg_sq = None

    def orders(self) -> list[list[np.ndarray]]:
        """Each trial's batches of the next epoch, in its own seeded order (draws from its batch-order stream)."""
        return [train_batches(s.rows, self.cfgs[0].batch_size, rng) for s, rng in zip(self.setups, self.rngs)]

    def orders_ahead(self) -> tuple[list[list[np.ndarray]], list[dict]]:
        """(orders(), the streams' states after drawing them), the streams left as they were until those states
        are put back (`streams`): work lost before then (an out-of-memory split) draws the same orders again."""
        before = [rng.bit_generator.state for rng in self.rngs]
        orders = self.orders()
        after = [rng.bit_generator.state for rng in self.rngs]
        self.streams(before)
        return orders, after

    def streams(self, states: list[dict]) -> None:
        for rng, state in zip(self.rngs, states):
            rng.bit_generator.state = state

    def plan(self, orders: list[list[np.ndarray]], first_step: int = 0) -> tuple[list[PackBatch], list[torch.Tensor]]:
        """The epoch's batches from `first_step` on, and their labels [P, B], on the device in one move."""
        steps = list(zip(*orders))[first_step:]
        arrays = [batch_arrays(self.data.train, list(rows), self.compute.pad_id, self.bucketed) for rows in steps]
        labels = [np.stack([self.data.train.labels[r] for r in rows]) for rows in steps]
        return to_device(arrays, labels, self.compute.device)

    def step(self, batch: PackBatch, labels: torch.Tensor, update: bool = True) -> torch.Tensor:
        """One optimizer step of every trial on its own batch; returns the per-trial losses [P]. With
        `update` False everything but the update runs (a memory probe): the weights, moments and counts stay.
        With `graphs` (StepGraphs) a step of a batch shape seen before is replayed from its recording."""
        if oom_injected(len(self), self.optimizer.step_count):  # here, where a replayed step passes too
            raise torch.OutOfMemoryError(f"{OOM_ABOVE}: a pack of {len(self)} does not fit (injected)")
        if update and self.graphs is not None:
            return self.graphs.step(batch, labels)
        return self.run_step(batch, labels, update)

    def run_step(self, batch: PackBatch, labels: torch.Tensor, update: bool = True, cache: bool = True) -> torch.Tensor:
        """The step itself, run op by op (`cache` False: autocast keeps no casts, as a CUDA graph's capture
        requires). Everything that changes from step to step is read from the device (the batch, the step
        count, the learning rates under `read_lr_from_device`), and nothing waits for it: a recording of it
        replays as a step (tests/test_step_graphs.py)."""
        self.make_training_state()
        self.small_grad.zero_()
        self.dropout.begin(self.optimizer.counter())
        with self.compute.autocast(cache=cache):
            logits = self.encoder(batch, self.dropout).float()
        if self.data.num_labels == 1:
            losses = F.mse_loss(logits.squeeze(-1), labels.float(), reduction="none").mean(1)
        else:
            losses = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(1)
        finite = torch.isfinite(losses)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LAYOUT_WARNING)
            torch.where(finite, losses, 0.0).sum().backward()
        self.grads[1][:, :self.layout.accumulated].copy_(self.small_grad)
        coef, clipped = clip_per_trial(self, self.max_norms)
        # What the step still needs is allocated before its update: after it, an out-of-memory error would leave
        # the pack a step ahead of its position, and a split's halves would take the step again.
        read, kept = self.words.read(), clipped & self.active & finite
        if update:
            try:
                self.optimizer.step(coef)
            except torch.OutOfMemoryError as error:  # not one a split could take: see the message
                raise RuntimeError(f"a pack of {len(self)} ran out of memory while its weights were updated: they "
                                   "are partly updated, and a split's halves would take the step again; it goes "
                                   "on from its last checkpoint, if it has one, when run again") from error
            self.active &= finite
            self.clipped += kept
        self.words.clear(read)  # here, not at the next step's start: a recorded step then zeroes the rows it read
        return losses.detach()

    def train_epoch(self) -> tuple[torch.Tensor, float]:
        """One pass of every trial over its subset in its own seeded order: (losses [steps, P], mean FLOPs)."""
        batches, labels = self.plan(self.orders())
        losses = torch.stack([self.step(b, y) for b, y in zip(batches, labels)])
        return losses, float(self.epoch_flops.mean())

    def _eval_plan(self, split: TokenizedSplit) -> tuple[list[np.ndarray], list[PackBatch]]:
        """The split's length-sorted batches, the same for every trial, moved once and kept."""
        if id(split) not in self._eval:
            batches = eval_batches(split, self.cfgs[0].eval_batch_size)
            arrays = [batch_arrays(split, [rows] * len(self), self.compute.pad_id, self.bucketed) for rows in batches]
            self._eval[id(split)] = (batches, to_device(arrays, [np.zeros(0)] * len(arrays), self.compute.device)[0])
        return self._eval[id(split)]

    @torch.inference_mode()
    def evaluate(self, split: TokenizedSplit) -> list[dict]:
        """Every trial's metrics on the whole split (the same length-sorted batches for all)."""
        batches, moved = self._eval_plan(split)
        preds = []
        with self.compute.autocast():
            for batch in moved:
                logits = self.encoder(batch, None).float()
                preds.append(logits.squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1))
        order, predictions = np.concatenate(batches), torch.cat(preds, dim=1).cpu().numpy()
        ordered = np.empty_like(predictions)
        ordered[:, order] = predictions
        return [{**compute_metrics(self.data.definition, ordered[p], split.labels),
                 **chance_figures(self.data.definition, ordered[p], split.labels)} for p in range(len(self))]

    def weight_distance(self) -> list[list[float]]:
        """Per trial, per layer, the Frobenius distance of its nn.Linear weights from where finetuning started."""
        per_layer = []
        for i in range(1, self.encoder.num_layers + 1):
            squares = 0
            for n in LINEAR_WEIGHTS:
                start = self.start.stacked(f"{i}.{n}", len(self), self.compute.device)
                squares = squares + (self.weights[f"{i}.{n}"].detach().float() - start).pow(2).flatten(1).sum(1)
            per_layer.append(squares.sqrt())
        return torch.stack(per_layer, dim=1).cpu().tolist()

    def peak_memory(self, split: TokenizedSplit | None = None) -> int:
        """Bytes this pack holds at its peak: a training step (nothing updated) on each trial's `batch_size`
        longest examples, and, with `split`, its evaluation batch of the most slots (GPUs: the allocator's count;
        CPUs: a MemoryAccountant's). No step of any epoch holds more packed tokens or a longer sequence than that
        batch, whatever the orders draw: the step of the most tokens summed over the pack (what was probed before)
        can be shorter on both counts than another, whose one long-running trial sets the pack's width. No
        batch-order stream is drawn from."""
        size, lengths = self.cfgs[0].batch_size, self.data.train.lengths
        largest = [s.rows[np.argsort(lengths[s.rows], kind="stable")[-size:]] for s in self.setups]
        batches, labels = self.plan([[rows] for rows in largest])

        def run():
            self.step(batches[0], labels[0], update=False)
            if split is not None:
                _, moved = self._eval_plan(split)
                with torch.inference_mode(), self.compute.autocast():
                    self.encoder(max(moved, key=lambda b: b.keys.numel()), None)

        if self.exp_avg is None:  # the first step would make them: they count
            self.make_training_state(gradients=False)
        tracked = [*self.banks, *(self.grads or []), *self.exp_avg, *self.exp_avg_sq,
                   *[t for t in self.start.tensors() if t.device == self.banks[0].device],
                   *([self.encoder.low] if self.encoder.low is not None else []), self.small,
                   self.encoder.biases, *([self.small_grad] if self.small_grad is not None else [])]
        return peak_bytes(run, self.compute.device, tracked)

    def parts(self, device="cpu") -> "PackParts":
        """The pack's state copied to `device` (the host: nothing is allocated on a GPU, which may be out of
        memory), to build packs of its members later; `device` None: the live tensors, no copy (a checkpoint
        writes them out)."""
        self.optimizer.put_back_word_rows()
        move = (lambda tensors: list(tensors) if tensors else None) if device is None else \
            (lambda tensors: [t.to(device, copy=True) for t in tensors] if tensors else None)  # noqa: E731
        return PackParts(layout=self.layout, setups=list(self.setups), banks=move(self.banks),
                         exp_avg=move(self.exp_avg), exp_avg_sq=move(self.exp_avg_sq), start=self.start,
                         step_count=self.optimizer.step_count,
                         rng_states=[rng.bit_generator.state for rng in self.rngs],
                         active=self.active.tolist(), clipped=self.clipped.tolist())


GRAPH_INPUTS = (*INDEX_FIELDS, "keys", "blocked")  # the PackBatch tensors a recorded step reads


@dataclasses.dataclass
class Recorded:
    """One batch shape's recorded pack-step: the graph, and the tensors it reads its batch from and writes its
    losses to."""

    graph: object
    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor
    losses: torch.Tensor


class SideStream:
    """The CUDA stream a StepGraphs warms up and records on, as torch's CUDA graph notes ask: whatever a first
    use sets up lazily for a stream (cuBLAS's workspace for it among them) is then set up by a warm-up step,
    not inside a recording, where what it allocates would stay in the recordings' shared pool."""

    def __init__(self):
        self.stream = torch.cuda.Stream()

    def run(self, work: Callable[[], torch.Tensor]) -> torch.Tensor:
        """work() on this stream, after what the current stream has queued, and before what it queues next,
        even when work fails (an out-of-memory error splits the pack, whose state is then copied on the current
        stream). Tensors it makes and keeps need no record_stream: every later use on the current stream is
        queued after this wait, and every later step here after the current stream's work."""
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        try:
            with torch.cuda.stream(self.stream):
                out = work()
        finally:
            current.wait_stream(self.stream)
        out.record_stream(current)
        return out

    @contextlib.contextmanager
    def capture(self, graph, pool):
        """torch.cuda.graph on this stream, capturing errors of this thread alone (the next group is set up on
        another), and the current stream as it was even when the capture fails (torch's leaves its own then)."""
        current = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=self.stream, capture_error_mode="thread_local"):
                yield
        finally:
            torch.cuda.set_stream(current)


def step_graphs(pack: "Pack") -> "StepGraphs | None":
    """A GPU pack's StepGraphs, unless CUDA_GRAPHS is "0": None, its steps run op by op (so on CPUs)."""
    if pack.compute.device.type != "cuda":
        return None
    return StepGraphs(pack) if switch_on(CUDA_GRAPHS) else None


class StepGraphs:
    """A pack's training steps as CUDA graphs: the first `warm_up` steps of each batch shape (bucketed widths
    make few) run op by op; the next is recorded, and from then on every step of that shape is one replay,
    its batch copied into the recording's inputs. On an H100 the host took 52-78 ms to issue a step's ~1,500
    kernels, more than the kernels' own 8-33 ms at packs of 1-8 (docs/benchmarks.md).

    What it relies on (tests/test_step_graphs.py holds it on a CPU): every value that changes from step to
    step is read from the device (Pack.run_step), the learning rates from a table there (in float32 on GPUs,
    as torch's CUDA kernel reads a tensor learning rate: the numbers differ from steps run without graphs by
    that rounding); and a recording allocates nothing that outlives it. The recordings share one memory pool
    and replay in whatever order the batches come, so a tensor a recording made and kept (a cache entry)
    could lie where another recording keeps its intermediates: the dropout coordinates are made by each
    shape's warm-up steps and kept for every shape, and a recording that makes any is refused.
    The gradient banks stay through evaluations between epochs (Pack.before_evaluation); banks made anew drop
    the recordings, which write into the old ones. A recording that runs out of memory (torch's allocator says
    so: torch.OutOfMemoryError; the capture ended, nothing ran) turns the pack's graphs off, and it goes on op by
    op: its shape's warm-up step fit, a recording needs its pool besides. A recording that fails otherwise
    raises, an out-of-memory error that CUDA or a library reports among them (instantiating the graph, cuBLAS's
    workspace): a failed capture can leave CUDA's allocator and streams in a state this process should not go
    on in. The memory probe (Pack.peak_memory) does not count the pool, about one step's activations, nor a
    new shape's warm-up step beside it. The steps run op by op and the recordings are on a stream of their own
    (SideStream); replays on the current one. `graph` and `side` are torch's CUDAGraph and a SideStream unless
    a test gives stand-ins."""

    def __init__(self, pack: "Pack", graph=None, side=None, warm_up: int = 1):
        self.pack, self.warm_up = pack, warm_up
        self.new_graph, self.side = graph or torch.cuda.CUDAGraph, side or SideStream()
        self.recorded: dict[tuple, Recorded] = {}
        self.seen: dict[tuple, int] = {}
        self.pool, self.bound, self.replays, self.recordings = None, None, 0, 0
        pack.dropout.keep_every_shape(True)
        pack.optimizer.read_lr_from_device()

    def figures(self) -> dict:
        return {"graphs_recorded_shapes": len(self.recorded), "graphs_recordings": self.recordings,
                "graphs_replays": self.replays}

    def reset(self) -> None:
        """Drop the recordings (and the memory they hold)."""
        self.recorded, self.pool, self.bound = {}, None, self.pack.grads

    def step(self, batch: PackBatch, labels: torch.Tensor) -> torch.Tensor:
        pack = self.pack
        pack.make_training_state()  # here, on the current stream: the memory evaluation gives back is reused
        if pack.grads is not self.bound:
            self.reset()
        key = (tuple(batch.ids.shape), tuple(batch.keys.shape))
        recorded = self.recorded.get(key)
        if recorded is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= self.warm_up:
                return self.side.run(lambda: pack.run_step(batch, labels))
            try:
                recorded, cause = self.record(key, batch, labels), None
            except torch.OutOfMemoryError as error:
                recorded, cause = None, str(error)
            if recorded is None:  # out of the handler, whose traceback holds the recording's tensors
                self.give_up(cause)
                return pack.step(batch, labels)  # nothing ran: the step is still to take
        for name, buffer in recorded.inputs.items():
            buffer.copy_(getattr(batch, name))
        recorded.labels.copy_(labels)
        losses = torch.empty_like(recorded.losses)  # before the update (see run_step)
        recorded.graph.replay()
        self.replays += 1
        pack.optimizer.step_count += 1
        pack.encoder.cast_at = None  # the replay cast the weights before its update
        if pack.triton:  # and its update made the cast anew
            pack.encoder.low_at = pack.optimizer.step_count
        return losses.copy_(recorded.losses)  # before another recording's replay reuses the memory

    def give_up(self, cause: str) -> None:
        """The pack's steps run op by op from now on, and the recordings' memory goes back."""
        print(f"fused pack of {len(self.pack)}: CUDA graphs off, its steps run op by op: recording a step ran out "
              f"of memory ({(cause.splitlines() or [''])[0][:200]})", flush=True)
        self.reset()
        self.pack.graphs = None
        self.pack.dropout.keep_every_shape(False)

    def record(self, key: tuple, batch: PackBatch, labels: torch.Tensor) -> Recorded:
        """Record one step of this batch's shape (recording runs nothing: the caller's replay does)."""
        pack = self.pack
        inputs = {name: getattr(batch, name).clone() for name in GRAPH_INPUTS}
        static, y = dataclasses.replace(batch, **inputs), labels.clone()
        step_count, graph, cached = pack.optimizer.step_count, self.new_graph(), set(pack.dropout._ids)
        low_at = pack.encoder.low_at
        pack.encoder.cast_at = None  # the recording must hold the weights' cast
        self.recordings += 1
        try:
            with self.side.capture(graph, self.pool):
                losses = pack.run_step(static, y, cache=False)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:
            cause = f"{type(error).__name__}: {error}".strip()
            if error.__context__ is not None:
                cause += f" (while handling {type(error.__context__).__name__}: {error.__context__})"
            raise RuntimeError(f"recording a pack-step of {len(pack)} trials as a CUDA graph failed: {cause}. "
                               f"Set {CUDA_GRAPHS}=0 to run steps op by op.") from error
        finally:
            pack.optimizer.step_count, pack.encoder.cast_at, pack.words.touched = step_count, None, []
            pack.encoder.low_at = low_at  # the recording's update ran nothing
        made = set(pack.dropout._ids) - cached
        if made:
            raise RuntimeError(f"a pack-step recorded as a CUDA graph made dropout coordinates for {sorted(made)}, "
                               "which its warm-up steps should have made: kept, they could share memory with "
                               "another recording's intermediates")
        self.pool = graph.pool()
        self.recorded[key] = Recorded(graph, inputs, y, losses)
        return self.recorded[key]


@dataclasses.dataclass
class PackParts:
    """Everything a Pack is made of but its computation: what a split hands each half, what a checkpoint
    holds (less `setups` and `start`, which setting the trials up again draws the same)."""

    layout: Layout
    setups: list[TrialSetup]
    banks: list[torch.Tensor]
    start: StartWeights
    exp_avg: list[torch.Tensor] | None = None
    exp_avg_sq: list[torch.Tensor] | None = None
    step_count: int = 0
    rng_states: list[dict] | None = None
    active: list[bool] | None = None
    clipped: list[int] | None = None

    def select(self, members: list[int]) -> "PackParts":
        """The parts of some members only (in this order)."""
        pick = lambda tensors: [t[members] for t in tensors] if tensors else None  # noqa: E731
        # a fresh set-up's parts (a group that ran out of memory as it moved to the device) have no streams,
        # flags or counts yet: the Pack makes them
        each = lambda values: None if values is None else [values[i] for i in members]  # noqa: E731
        return dataclasses.replace(
            self, setups=each(self.setups), banks=pick(self.banks), exp_avg=pick(self.exp_avg),
            exp_avg_sq=pick(self.exp_avg_sq), start=self.start.select(members), rng_states=each(self.rng_states),
            active=each(self.active), clipped=each(self.clipped))

    @classmethod
    def set_up(cls, cfgs, data, pretrained, device, workers: int | None = None, align: int | None = None,
               pin: bool = False, held: HostBanks | None = None) -> "PackParts":
        return cls(*set_up_pack(cfgs, data, pretrained, device, workers, align=align, pin=pin, held=held))


# --- training a pack to the end ----------------------------------------------------------------------------


@dataclasses.dataclass
class Ledger:
    """One member's figures so far: what each epoch adds to, a checkpoint keeps and a split hands on."""

    flops: float = 0.0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    wall_seconds: float = 0.0  # before the current stretch of work
    by_epoch: list[float] = dataclasses.field(default_factory=list)
    dev_epochs: list[int] = dataclasses.field(default_factory=list)
    running: bool = True
    result: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Position:
    """Where a pack is in its training: the epoch under way (1-based), the steps of it done, its batch orders
    (drawn while the epoch before ran, or when the first began), the losses of those steps [steps, P] and
    each trial's share of their seconds (`seconds`: a split's halves carry what the whole pack spent on them)."""

    epoch: int = 1
    step: int = 0
    orders: list[list[np.ndarray]] | None = None
    losses: list[torch.Tensor] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


class PackRun:
    """A pack of some of `finetune_pack`'s trials (`members`: their indices there) on its way to the end: not
    set up yet, being set up (`pending`), set up in host memory (`parts`) or on its device (`pack`)."""

    def __init__(self, members: list[int], pack: Pack | None = None, parts: PackParts | None = None,
                 position: Position | None = None, ledgers: list[Ledger] | None = None, resumed_from: int = 0):
        self.members, self.pack, self.parts = members, pack, parts
        self.position = position or Position()
        self.ledgers = ledgers or [Ledger() for _ in members]
        self.resumed_from = resumed_from
        self.pending: concurrent.futures.Future | None = None

    def prepare(self, cfgs, data, pretrained, executor: concurrent.futures.Executor, device,
                held: HostBanks | None = None) -> None:
        """Set the members up in the background, in host memory (laid out for `device`, where they will train;
        for a GPU in `held`'s page-locked buffer, where given), unless that is done or under way."""
        if self.pack is None and self.parts is None and self.pending is None:
            self.pending = executor.submit(PackParts.set_up, [cfgs[i] for i in self.members], data, pretrained, "cpu",
                                           align=bank_alignment(device), pin=torch.device(device).type == "cuda",
                                           held=held)

    def materialize(self, cfgs, data, pretrained) -> Pack:
        if self.pack is None:
            if self.pending is not None:
                self.parts, self.pending = self.pending.result(), None
            self.pack = Pack([cfgs[i] for i in self.members], data, pretrained, parts=self.parts)
            self.parts = None
        return self.pack

    def split(self) -> list["PackRun"]:
        """Two runs of half the members each, going on from this one's position (the step under way is done
        again), their state in host memory until each is materialized; this run's memory is given back. A run
        whose set-up ran out of memory (on the device, or in the background) has trained nothing: its halves are
        set up afresh, with the same draws."""
        host = self.pack.parts() if self.pack is not None else self.parts  # an OOM may strike as it moves over
        half = len(self.members) // 2
        self.pack = self.pending = None
        halves = []
        for members in (list(range(half)), list(range(half, len(self.members)))):
            parts = None if host is None else host.select(members)
            position = dataclasses.replace(
                self.position, orders=None if self.position.orders is None else [self.position.orders[i] for i in members],
                losses=[loss[members] for loss in self.position.losses])
            halves.append(PackRun([self.members[i] for i in members], None, parts, position,
                                  [self.ledgers[i] for i in members], self.resumed_from))
        return halves

    def state(self, elapsed: float) -> dict:
        """This run's checkpoint entry (trainables.state), `elapsed` seconds into the current process's work:
        live tensors (no copy), to be written out before training goes on. A run that has not started holds
        nothing but its members: it is set up afresh."""
        ledgers = [{**dataclasses.asdict(ledger), "wall_seconds": ledger.wall_seconds + elapsed}
                   for ledger in self.ledgers]
        if self.pack is None and self.parts is None:
            return {"members": list(self.members), "fresh": True, "ledgers": ledgers}
        parts = self.parts if self.pack is None else self.pack.parts(device=None)
        position = self.position
        return {
            "members": list(self.members), "banks": parts.banks, "exp_avg": parts.exp_avg,
            "exp_avg_sq": parts.exp_avg_sq, "step_count": parts.step_count, "rng_states": parts.rng_states,
            "active": parts.active, "clipped": parts.clipped, "epoch": position.epoch, "step": position.step,
            "orders": None if position.orders is None else [list(o) for o in position.orders],
            "losses": list(position.losses), "seconds": position.seconds, "ledgers": ledgers,
            "align": parts.layout.align,  # the banks' layout, kept wherever the run resumes
        }

    @classmethod
    def from_state(cls, saved: dict, set_up: Callable[[list[int], int], PackParts]) -> "PackRun":
        """A run from its checkpoint entry; `set_up(members, align)` sets them up again (their start weights and
        optimizer settings, drawn the same as the first time) in the banks' layout as saved (checkpoints written
        before layouts were aligned: unpadded), on whatever device this process has."""
        ledgers = [Ledger(**ledger) for ledger in saved["ledgers"]]
        if saved.get("fresh"):
            return cls(list(saved["members"]), ledgers=ledgers)
        fresh = set_up(list(saved["members"]), int(saved.get("align", 1)))
        parts = dataclasses.replace(
            fresh, banks=saved["banks"], exp_avg=saved["exp_avg"], exp_avg_sq=saved["exp_avg_sq"],
            step_count=int(saved["step_count"]), rng_states=saved["rng_states"], active=saved["active"],
            clipped=saved["clipped"])
        orders = saved["orders"]
        position = Position(int(saved["epoch"]), int(saved["step"]),
                            None if orders is None else [[np.asarray(b) for b in o] for o in orders],
                            list(saved["losses"]), float(saved.get("seconds", 0.0)))
        return cls(list(saved["members"]), None, parts, position, ledgers, resumed_from=position.epoch - 1)


def finetune_pack(cfgs: list[FinetuneConfig], data: TokenizedTask, pretrained: Pretrained,
                  report: Callable[[dict[int, dict]], None] | None = None, pack_id: str | None = None,
                  save: Callable[[dict], None] | None = None, resume: dict | None = None,
                  device_size: int | None = None, planned: Callable[[list[list[int]]], None] | None = None
                  ) -> list[dict]:
    """Finetune and evaluate P trials as one computation; returns one dict per trial with the keys `finetune`
    returns, plus pack_size and pack_id (default: a random one). After each epoch `report({i: result})` gets the
    figures of every trial i that trained in it (a diverged trial's last report says so; it is in no later one).
    Seconds are each trial's share of the pack's: train_seconds and eval_seconds are the pack's divided by its
    size, so rows add up to the machine time.

    `save`, if given, receives at every epoch end but the last, just before `report`, the pack's state, from
    which `resume=` goes on to the same numbers (its first report holds again every member that had ended,
    finished or diverged). `device_size`: the trials that train at once (default all); the rest wait their turn,
    each group set up in the background while the one before trains. An out-of-memory
    error splits the group training in two halves that go on one after the other from the step it stopped at.
    Whatever the grouping, each trial's numbers are the ones it would have had alone. `planned`, if given, gets
    the groups (trial indices, in the order they train) once they are sized, before any trains."""
    started = time.perf_counter()
    torch.set_num_threads(max(1, max(c.threads for c in cfgs)))
    check_pack(cfgs, pretrained)
    pack_id = pack_id or (resume or {}).get("pack_id") or uuid.uuid4().hex[:12]
    results: list[dict] = [{} for _ in cfgs]
    device = pick_device(cfgs[0].gpu_fraction)
    # The ended packs of an earlier call in this process (a reused trial actor) go first: on a GPU their memory
    # would read as taken (device_budget), and frozen below with the rest they would stay through this call.
    # (On a CPU a call of one group does not freeze, and leaves them to the collector.)
    if device.type == "cuda":
        release_memory()
    if resume is not None:
        # In host memory, as a background set-up: the saved banks replace the set-up's, which on the device would
        # take its memory for nothing, and out of memory there would fail the call before any run could split.
        def set_up(members: list[int], align: int) -> PackParts:
            return PackParts.set_up([cfgs[i] for i in members], data, pretrained, "cpu", align=align)
        runs = [PackRun.from_state(saved, set_up) for saved in resume["runs"]]
        finished = {int(i): result for i, result in resume.get("finished", {}).items()}
        for i, result in finished.items():
            results[i] = result
        # A member that diverged in a run still going reports no more; its row went out with the checkpoint's own
        # report, which a driver lost between the two never wrote. So do finished members': report them again.
        ended = {i: ledger.result for run in runs for i, ledger in zip(run.members, run.ledgers) if not ledger.running}
        if (finished or ended) and report is not None:
            report({**finished, **ended})
    else:
        budget = device_budget(device, cfgs[0].gpu_fraction)
        size = device_size or group_size(len(cfgs), budget, parameter_count(pretrained))
        runs = [PackRun(list(range(first, min(first + size, len(cfgs))))) for first in range(0, len(cfgs), size)]
    if planned is not None:
        planned([list(run.members) for run in runs])
    probed = 0  # the largest group that trained past its memory probe
    groups = len(runs)
    held = HostBanks() if device.type == "cuda" and groups > 1 else None
    if held is not None:
        register_pinned_pages()
    # Between groups release_memory collects, so that an ended pack's memory is gone before the next is built.
    # What lived before the call (modules, checkpoint, data: 400,000 objects) is collected once, then frozen,
    # and those collections scan the groups' own objects: 0.04 s against 0.29 on a CPU. A call of one group
    # collects nothing between groups; a freeze made elsewhere is its owner's to undo.
    freezing = groups > 1 and gc.get_freeze_count() == 0
    if freezing:
        if device.type != "cuda":  # collected above on GPUs
            gc.collect()
        gc.freeze()
    try:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pack-setup") as background:
            while runs:
                run = runs[0]
                try:
                    run.materialize(cfgs, data, pretrained)
                    if len(runs) > 1:  # the next group is set up while this one trains
                        runs[1].prepare(cfgs, data, pretrained, background, device, held)
                    trainer = Trainer(cfgs, data, pretrained, pack_id, started, report, save)
                    trainer.train(run, parked=runs[1:], done=results, probed=probed)
                    probed = max(probed, len(run.members))
                    out_of_memory = False
                except torch.OutOfMemoryError:
                    if len(run.members) == 1:
                        raise
                    out_of_memory = True
                if out_of_memory:  # out of the handler: the failed step's tensors, held by its traceback, are gone
                    runs[:1] = run.split()
                else:
                    for i, ledger in zip(run.members, run.ledgers):
                        results[i] = ledger.result
                    runs.pop(0)
                if runs:  # the pack that ended (finished, or split) gives its memory back before the next is built
                    release_memory(device_cache=False)
    finally:  # the page-locked host buffers the groups came through (`pin`), on an error too
        try:
            if held is not None:
                runs = run = held = None  # what is left of the groups, an error's traceback aside
                release_memory(host_cache=True)
        finally:
            if freezing:
                gc.unfreeze()
    return results


def release_memory(device_cache: bool = True, host_cache: bool = False) -> None:
    """Give back the memory of a pack that has ended. A Pack and its parts refer to each other (its encoder,
    optimizer and gradients hold it), so dropping it frees nothing until Python's cycle collector happens to
    run: on an H100 a finished pack of 34 still held about 56 GiB while the next group was probed and set up,
    which then ran out of memory at a pack of 1. (A collection of all the process's objects costs about 0.3 s on
    a CPU: a CPU trial's last pack, whose process moves on to other work or ends, is left to the collector.)
    `device_cache`: the blocks torch's CUDA allocator keeps go back to the driver, for other processes or a
    reading of the card's free memory; the next group of the same call reuses them instead (the allocator
    itself frees them and tries again before it reports a lack of memory). `host_cache`: likewise the
    page-locked host buffers."""
    gc.collect()
    if torch.cuda.is_available():
        if device_cache:
            torch.cuda.empty_cache()
        if host_cache and (empty := host_cache_emptier()):
            empty()


def host_cache_emptier():
    """What gives torch's cached page-locked host buffers back: torch.accelerator's public call (torch 2.12 on,
    pytorch/pytorch#171270; install.sh pins 2.13), else the private binding of CUDA builds before it (2.11)."""
    public = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)  # torch.accelerator: 2.6 on
    return public or getattr(torch._C, "_host_emptyCache", None)


def needs_probe(device: torch.device, run: PackRun, probed: int) -> bool:
    """Whether a run's memory is probed before it trains: on GPUs, at its start, unless a group of at least its
    size has trained in this call already. The groups of one call are drawn from the same trials' data and
    bucketed to the same few shapes, so the first one's probe speaks for them all (a probe is a step and an
    evaluation batch, about half a second a group of 34 on an H100); were a later group to run out of memory
    all the same, it would split and go on like any other."""
    return device.type == "cuda" and run.position.epoch == 1 and run.position.step == 0 and len(run.members) > probed


class Trainer:
    """Trains one PackRun to its end: epochs of lock-step steps, evaluations, reports and checkpoints."""

    def __init__(self, cfgs, data, pretrained, pack_id, started, report, save):
        self.cfgs, self.data, self.pretrained, self.pack_id = cfgs, data, pretrained, pack_id
        self.started, self.report, self.save = started, report, save

    def train(self, run: PackRun, parked: list[PackRun], done: list[dict], probed: int = 0) -> None:
        """Train `run` to its end; `parked`: the runs still to come, `done`: every member's final result so far
        (empty for those not finished): a checkpoint holds them all. `probed`: the largest group of this call
        that has trained past its memory probe (see needs_probe)."""
        cfg, data = self.cfgs[0], self.data
        pack = run.materialize(self.cfgs, data, self.pretrained)
        if needs_probe(pack.compute.device, run, probed):
            # the real peak, before any work is at stake: a step and an evaluation batch at their largest shapes
            # (an out-of-memory error here splits the pack like one mid-epoch)
            peak = pack.peak_memory(data.validation)
            print(f"fused pack of {len(pack)}: peak {peak / 2**30:.1f} GiB, "
                  f"{peak / len(pack) / parameter_count(self.pretrained):.1f} bytes a parameter a trial", flush=True)
        peak_flops(str(pack.compute.device), pack.compute.precision)  # measured (CPU) outside every timed stretch
        eval_flops = pack.compute.flops(data.validation.lengths, False, pack.cfgs[0].eval_batch_size)
        P, position = len(pack), run.position
        # the next epoch's orders, the streams' states after drawing them, and its batches on the device
        ahead: tuple[list, list[dict], tuple] | None = None
        while position.epoch <= cfg.epochs:
            tick = time.perf_counter()
            if position.orders is None:
                position.orders = pack.orders()
            batches, labels = ahead[2] if ahead else pack.plan(position.orders, position.step)
            try:
                for batch, y in zip(batches, labels):
                    position.losses.append(pack.step(batch, y))
                    position.step += 1
            except torch.OutOfMemoryError:  # the steps taken stay taken (the pack splits): so do their seconds
                position.seconds += (time.perf_counter() - tick) / P
                raise
            ahead = None
            if position.epoch < cfg.epochs:
                # drawn and moved while the device works through the steps just issued (a GPU's host waits
                # for their losses otherwise); the streams move past them at the epoch's end, where a
                # checkpoint keeps these orders with the streams' state after them
                orders, streams = pack.orders_ahead()
                ahead = (orders, streams, pack.plan(orders))
            # a checkpoint gives back the losses of a half parked mid-epoch in host memory, beside the device's
            losses = torch.stack([loss.to(pack.compute.device) for loss in position.losses]).mean(0).cpu().numpy()
            pack.compute.synchronize()
            pack.check_replays()
            position.seconds += (time.perf_counter() - tick) / P  # an evaluation that fails keeps it
            train_share = position.seconds
            running = np.array([ledger.running for ledger in run.ledgers])
            diverging = running & ~(np.isfinite(losses) & pack.finite_weights())
            epoch, last = position.epoch, position.epoch == cfg.epochs
            tick = time.perf_counter()
            metrics = [{} for _ in range(P)]
            if last:
                pack.free_training_state()
            elif evaluated_at(epoch, cfg):
                pack.before_evaluation()
            if evaluated_at(epoch, cfg) and (running & ~diverging).any():
                metrics = pack.evaluate(data.validation)
            eval_share = (time.perf_counter() - tick) / P
            clipped = pack.clipped.cpu().tolist()
            distances = pack.weight_distance() if last or diverging.any() else None
            reports = {}
            for p in np.flatnonzero(running):
                ledger = run.ledgers[p]
                ledger.flops += pack.epoch_flops[p] + (eval_flops if metrics[p] and not diverging[p] else 0.0)
                ledger.train_seconds += train_share
                ledger.eval_seconds += eval_share
                own = metrics[p] if not diverging[p] else {}
                if own:  # as finetune: only evaluated epochs are listed, no nan placeholders
                    ledger.by_epoch.append(float(own[data.metric]))
                    ledger.dev_epochs.append(epoch)
                ledger.result = self.result(run, p, pack, epoch, float(losses[p]), own, clipped[p],
                                            diverging[p], distances)
                reports[run.members[p]] = ledger.result
                ledger.running = not diverging[p]
            position.epoch, position.step, position.orders, position.losses = epoch + 1, 0, None, []
            position.seconds = 0.0
            if ahead:
                position.orders = ahead[0]
                pack.streams(ahead[1])
            if self.save is not None and not last and any(ledger.running for ledger in run.ledgers):
                elapsed = time.perf_counter() - self.started
                self.save({"pack_id": self.pack_id, "runs": [r.state(elapsed) for r in [run, *parked]],
                           "finished": {i: result for i, result in enumerate(done) if result}})
            if self.report is not None and reports:
                self.report(reports)
            if not any(ledger.running for ledger in run.ledgers):
                break
        run.pack = None  # its memory goes back before the next run starts

    def result(self, run: PackRun, p: int, pack: Pack, epoch: int, loss: float, own: dict, clipped: int,
               diverging: bool, distances) -> dict:
        cfg, ledger, member = self.cfgs[0], run.ledgers[p], self.cfgs[run.members[p]]
        result = {
            "status": "diverged" if diverging else "ok",
            "epoch": epoch,
            "epochs": cfg.epochs,
            "epochs_run": epoch,
            "train_loss": loss,
            "lr_last": pack.optimizer.lr_last(p),
            "metric_name": self.data.metric,
            "model_type": self.pretrained.model_type,
            **self.data.columns(),
            **({"dev_metric": ledger.by_epoch[-1]} if own else {}),
            "dev_metrics_by_epoch": list(ledger.by_epoch),
            "dev_epochs": list(ledger.dev_epochs),
            **{f"dev_{name}": float(value) for name, value in own.items()},
            "max_grad_norm": member.max_grad_norm,
            "clipped_steps": int(clipped),
            "eval_every": cfg.eval_every,
            "precision": cfg.precision,
            "cuda_graphs": pack.graphs_on,
            "triton_kernels": pack.triton,
            "recipe_version": recipe_version((member.task, member.intermediate_task)),
            "train_seconds": ledger.train_seconds,
            "eval_seconds": ledger.eval_seconds,
            "wall_seconds": ledger.wall_seconds + time.perf_counter() - self.started,
            **cost_fields(ledger.flops, ledger.train_seconds + ledger.eval_seconds, pack.compute.device,
                          pack.compute.precision),
            "resumed_from_epoch": run.resumed_from,
            "pack_size": len(self.cfgs),
            "pack_id": self.pack_id,
        }
        if member.layer_lr_multipliers is not None:
            result["layer_lrs"] = [member.lr * m for m in member.layer_lr_multipliers]
        if distances is not None and (epoch == cfg.epochs or diverging):
            result["weight_distance"] = distances[p]
        return result
