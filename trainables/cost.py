"""Model FLOPs and model-FLOPs utilisation (MFU), counted the way nanoGPT counts them.

A training token costs 6 FLOPs per non-embedding parameter (forward + backward) plus the attention
score/value products, 12 * layers * hidden * sequence length; evaluation costs a third of that. MFU is the
model FLOPs done per second over the device's peak, so padding and overhead show up as lost utilisation.
"""
from __future__ import annotations

import functools
import time

import numpy as np
import torch
from torch import nn

# Dense bf16 peak FLOP/s (fp32 for cards without bf16 tensor cores), from the vendors' data sheets.
GPU_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L40": 181e12,  # before L4, whose name is part of its own
    "A10G": 70e12,
    "L4": 121e12,
    # Volta and Turing have no bf16 tensor cores (their 125 and 65 TFLOP/s are fp16's): bf16 runs at fp32's rate
    "V100": 15.7e12,
    "T4": 8.1e12,
    "TITAN Xp": 12.1e12,
}
FP32_PEAKS = ("V100", "T4", "TITAN Xp")  # the cards whose figure above is fp32's


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


@functools.lru_cache(maxsize=None)
def peak_flops(device: str) -> tuple[float, str]:
    """(peak FLOP/s, where the figure comes from) for a torch device string."""
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        for key, flops in GPU_PEAK_FLOPS.items():
            if key.lower() in name.lower():
                return flops, f"datasheet:{key}"
        return 0.0, f"unknown-gpu:{name}"
    return _measured_cpu_matmul_flops(), "measured-cpu-matmul"


def cost_fields(flops: float, seconds: float, device: torch.device) -> dict:
    """The cost columns of a row: model FLOPs, MFU over `seconds` against the device's peak, the peak and
    where it comes from, the device and the CPU threads torch used."""
    peak, source = peak_flops(str(device))
    return {
        "model_flops": flops,
        "mfu": flops / seconds / peak if peak and seconds > 0 else float("nan"),
        "peak_flops": peak,
        "peak_flops_source": source,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(),
    }


def cpu_matmul_flops(threads: int) -> float:
    """This CPU's fp32 matmul peak on `threads` threads: what a trial given that many CPUs measures as its peak
    (for estimates made outside a trial)."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        return _measured_cpu_matmul_flops()
    finally:
        torch.set_num_threads(before)


def _measured_cpu_matmul_flops(n: int = 512, repeats: int = 8) -> float:
    # CPUs have no datasheet figure we can trust across machines: the best fp32 matmul rate this process
    # reaches with its thread count is the practical ceiling.
    g = torch.Generator().manual_seed(0)  # never the global stream: trials seed that for dropout
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best
