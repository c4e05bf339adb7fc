"""Model FLOPs and model-FLOPs utilisation (MFU), counted the way nanoGPT counts them.

A training token costs 6 FLOPs per non-embedding parameter (forward + backward) plus the attention
score/value products, 12 * layers * hidden * sequence length; evaluation costs a third of that. MFU is the
model FLOPs done per second over the device's peak in the precision the trial ran in, so padding and overhead
show up as lost utilisation.
"""
from __future__ import annotations

import functools
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


def non_embedding_params(model: nn.Module) -> int:
    """Parameters a token meets outside the embeddings, each as often as it is applied: ALBERT's layer groups
    run num_hidden_layers / num_hidden_groups times each, and a token pays their FLOPs every time."""
    base = getattr(model, "base_model", model)
    emb = getattr(base, "embeddings", None)
    skip = {id(p) for p in emb.parameters()} if emb is not None else set()
    uses = {}
    groups = getattr(getattr(model, "config", None), "num_hidden_groups", None)
    shared = getattr(getattr(base, "encoder", None), "albert_layer_groups", None)
    if groups and shared is not None:
        uses = {id(p): model.config.num_hidden_layers // groups for p in shared.parameters()}
    return sum(p.numel() * uses.get(id(p), 1) for p in model.parameters() if id(p) not in skip)


def sequence_flops(lengths: np.ndarray, n_params: int, num_layers: int, hidden: int, train: bool) -> float:
    lengths = np.asarray(lengths, dtype=np.float64)
    per_pass = 2.0 * n_params * lengths.sum() + 4.0 * num_layers * hidden * np.square(lengths).sum()
    return float(per_pass * (3.0 if train else 1.0))


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
