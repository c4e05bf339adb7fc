"""Model FLOPs and model-FLOPs utilisation (MFU), counted the way nanoGPT counts them.

A training token costs 6 FLOPs per non-embedding parameter (forward + backward) plus the attention
score/value products, 12 * layers * hidden * sequence length; evaluation costs a third of that. DeBERTa's
disentangled attention adds its scores against the relative-position table (per token) and the projections of
that table (per forward pass, whatever the batch holds). MFU is the model FLOPs done per second over the device's
peak in the precision the trial ran in, so padding and overhead show up as lost utilisation.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time

import numpy as np
import torch
from torch import nn

# Dense peak FLOP/s by precision, from the vendors' data sheets (SXM parts): a row's MFU is taken against the peak
# of the precision its trial ran in. bf16: the tensor cores' dense figure. fp32: the figure without tensor cores,
# since torch leaves TF32 matmuls off (torch.backends.cuda.matmul.allow_tf32) and nothing here turns them on.
GPU_PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp32": 91.6e12},
    "L40": {"bf16": 181e12, "fp32": 90.5e12},  # before L4, whose name is part of its own
    "A10G": {"bf16": 70e12, "fp32": 31.2e12},
    "L4": {"bf16": 121e12, "fp32": 30.3e12},
    # Volta, Turing and Pascal have no bf16 tensor cores (V100's 125 and T4's 65 TFLOP/s are fp16's): bf16 runs
    # at fp32's rate
    "V100": {"bf16": 15.7e12, "fp32": 15.7e12},
    "T4": {"bf16": 8.1e12, "fp32": 8.1e12},
    "TITAN Xp": {"bf16": 12.1e12, "fp32": 12.1e12},
}
NO_BF16_CORES = ("V100", "T4", "TITAN Xp")  # the cards whose bf16 figure above is fp32's


@dataclasses.dataclass(frozen=True)
class FlopShape:
    """A model as its FLOPs are counted: its non-embedding parameters (each as often as a token meets it), layers
    and hidden size; for DeBERTa's relative attention, the rows of the position table a layer scores against
    (twice its span), how many of its score products meet them (content->position, position->content) and how
    many projections of the table a layer makes each forward pass."""

    params: int
    layers: int
    hidden: int
    position_rows: int = 0
    position_scores: int = 0
    position_projections: int = 0


def flop_shape(model: nn.Module) -> FlopShape:
    config = model.config
    dense = (non_embedding_params(model), int(config.num_hidden_layers), int(config.hidden_size))
    if config.model_type != "deberta-v2" or not getattr(config, "relative_attention", False):
        return FlopShape(*dense)
    # As transformers' DisentangledSelfAttention sizes them: position buckets, else the relative span, else the
    # absolute positions; the table's first two spans are scored against whatever the sequence's length.
    buckets, span = getattr(config, "position_buckets", -1), getattr(config, "max_relative_positions", -1)
    span = buckets if buckets > 0 else span if span >= 1 else config.max_position_embeddings
    kinds = config.pos_att_type
    kinds = {k.strip() for k in (kinds.split("|") if isinstance(kinds, str) else kinds or ())} & {"c2p", "p2c"}
    # A shared key projects the table through both the key and the query, whichever scores use them.
    projections = 2 if getattr(config, "share_att_key", False) else len(kinds)
    return FlopShape(*dense, position_rows=2 * span, position_scores=len(kinds), position_projections=projections)


POSITION_PROJECTIONS = (".pos_key_proj", ".pos_query_proj")  # DeBERTa-v2's, when not shared with key and query


def non_embedding_params(model: nn.Module) -> int:
    """Parameters a token meets outside the embeddings, each as often as it is applied: ALBERT's layer groups
    run num_hidden_layers / num_hidden_groups times each, and a token pays their FLOPs every time. DeBERTa's
    relative-position table is an embedding too, and the projections of its own that DeBERTa-v2 keeps meet no
    token: they are counted once a pass (`FlopShape`)."""
    base = getattr(model, "base_model", model)
    tables = [getattr(base, "embeddings", None), getattr(getattr(base, "encoder", None), "rel_embeddings", None)]
    tables += [m for name, m in model.named_modules() if name.endswith(POSITION_PROJECTIONS)]
    skip = {id(p) for table in tables if table is not None for p in table.parameters()}
    uses = {}
    groups = getattr(getattr(model, "config", None), "num_hidden_groups", None)
    shared = getattr(getattr(base, "encoder", None), "albert_layer_groups", None)
    if groups and shared is not None:
        uses = {id(p): model.config.num_hidden_layers // groups for p in shared.parameters()}
    return sum(p.numel() * uses.get(id(p), 1) for p in model.parameters() if id(p) not in skip)


def sequence_flops(lengths: np.ndarray, shape: FlopShape, train: bool, batch_size: int) -> float:
    """The FLOPs of sequences of `lengths`, in forward passes of `batch_size` (the last one partial)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return token_flops(lengths.sum(), np.square(lengths).sum(), math.ceil(len(lengths) / batch_size), shape, train)


def token_flops(tokens: float, squares: float, passes: int, shape: FlopShape, train: bool) -> float:
    """The FLOPs of `passes` forward passes (and their backward ones when `train`) over `tokens` tokens in all,
    whose sequences' squared lengths sum to `squares`."""
    per_token = 2.0 * shape.params + 2.0 * shape.layers * shape.hidden * shape.position_rows * shape.position_scores
    per_pass = 2.0 * shape.layers * shape.position_projections * shape.position_rows * shape.hidden ** 2
    flops = per_token * tokens + 4.0 * shape.layers * shape.hidden * squares + per_pass * passes
    return float(flops * (3.0 if train else 1.0))


def peak_flops(device: str, precision: str) -> tuple[float, str]:
    """(peak FLOP/s in `precision`, where the figure comes from) for a torch device string: a GPU's data sheet,
    a CPU's matmul measured on the threads torch now runs (once per precision and thread count)."""
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        for key, peaks in GPU_PEAK_FLOPS.items():
            if key.lower() in name.lower():
                return peaks[precision], f"datasheet:{key}"
        return 0.0, f"unknown-gpu:{name}"
    return cpu_peak(torch.get_num_threads(), precision), "measured-cpu-matmul"


def cost_fields(flops: float, seconds: float, device: torch.device, precision: str) -> dict:
    """The cost columns of a row: model FLOPs, MFU over `seconds` against the device's peak in the trial's
    `precision`, the peak and where it comes from, the device and the CPU threads torch used."""
    peak, source = peak_flops(str(device), precision)
    return {
        "model_flops": flops,
        "mfu": flops / seconds / peak if peak and seconds > 0 else float("nan"),
        "peak_flops": peak,
        "peak_flops_source": source,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(),
    }


def cpu_matmul_flops(threads: int, precision: str = "fp32") -> float:
    """This CPU's matmul peak in `precision` on `threads` threads, measured now: what a trial given that many
    CPUs measures as its peak (for estimates made outside a trial)."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        return _measured_cpu_matmul_flops(precision)
    finally:
        torch.set_num_threads(before)


# A trial measures its peak once, outside its timed stretches; trials that follow in the same process (a Ray
# actor reused, a test run) read it back, unless they run on another thread count or precision.
@functools.lru_cache(maxsize=None)
def cpu_peak(threads: int, precision: str) -> float:
    """`cpu_matmul_flops`, measured once per thread count and precision in a process."""
    return cpu_matmul_flops(threads, precision)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _measured_cpu_matmul_flops(precision: str = "fp32", n: int = 512, repeats: int = 8) -> float:
    # CPUs have no datasheet figure we can trust across machines: the best matmul rate this process reaches
    # with its thread count is the practical ceiling. In the trial's own dtype: bf16's rate is not fp32's (2.4x
    # it on this project's VM, which has AVX512-BF16; a CPU without bf16 instructions may run it below fp32's).
    g = torch.Generator().manual_seed(0)  # never the global stream: trials seed that for dropout
    a, b = (torch.randn(n, n, generator=g).to(DTYPES[precision]) for _ in range(2))
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best
