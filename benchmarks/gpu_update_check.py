"""The update kernel (trainables.triton_kernels) on a GPU: checked against torch's way (each trial's clipping
multiply, torch's fused AdamW, the bf16 cast) on small banks, then both timed with CUDA events over a pack of
34's bank 1 at BERT-base's width (86,042,944 floats a trial, aligned: 47 GiB of weights, gradients and moments).

    python3 benchmarks/gpu_update_check.py [PACK]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BETAS, EPS, LR, DECAY = (0.9, 0.999), 1e-8, 2e-5, 0.0


def banks(P: int, width: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    param, grad = (torch.randn(P, width, device="cuda", generator=gen) for _ in range(2))
    return [param, grad, 0.01 * torch.randn(P, width, device="cuda", generator=gen),
            1e-4 * torch.rand(P, width, device="cuda", generator=gen)]


def torch_way(param, grad, m, v, low, coef, steps, lr):
    for p in range(len(param)):
        torch._foreach_mul_([grad[p]], coef[p])
    torch._fused_adamw_([param.view(-1)], [grad.view(-1)], [m.view(-1)], [v.view(-1)], [], [steps], lr=lr,
                        beta1=BETAS[0], beta2=BETAS[1], weight_decay=DECAY, eps=EPS, amsgrad=False, maximize=False)
    low.copy_(param)


def kernel_way(param, grad, m, v, low, coef, steps, lr):
    from trainables.triton_kernels import adamw_clipped, step_scalars

    adamw_clipped(param, grad, m, v, coef, step_scalars(lr, steps, BETAS), *BETAS, EPS, DECAY, low=low)


def timed(way, state, repeats: int = 10) -> float:
    for _ in range(2):
        way(*state)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        way(*state)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main(P: int = 34, width: int = 86_042_944) -> None:
    from trainables.triton_kernels import use_triton

    assert torch.cuda.is_available(), "this check needs a GPU"
    print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
          f"kernel used by packs here: {use_triton(torch.device('cuda'))}", flush=True)
    coef = torch.tensor([0.5, 1.0, 0.3, 1.0], device="cuda")
    steps, lr = torch.tensor(7.0, device="cuda"), torch.tensor(LR, device="cuda")
    state = {}
    for name, way in (("torch", torch_way), ("kernel", kernel_way)):
        param, grad, m, v = banks(4, 1_000_003)
        low = torch.empty_like(param, dtype=torch.bfloat16)
        way(param, grad, m, v, low, coef, steps, lr)
        state[name] = (param, m, v, low)
    for what, got, want in zip(("weights", "exp_avg", "exp_avg_sq"), state["kernel"], state["torch"]):
        print(f"{what}: |kernel - torch| / |torch| {float((got - want).norm() / want.norm()):.2e}, max abs "
              f"difference {float((got - want).abs().max()):.3g}, NaN: {bool(got.isnan().any())}", flush=True)
    print(f"bf16 cast equal to torch's from the kernel's weights: "
          f"{torch.equal(state['kernel'][3], state['kernel'][0].bfloat16())}", flush=True)
    del state
    for size in (8, P):
        try:
            param, grad, m, v = banks(size, width, seed=size)
        except torch.OutOfMemoryError:
            print(f"pack of {size}: does not fit", flush=True)
            continue
        low = torch.empty_like(param, dtype=torch.bfloat16)
        coef = torch.full((size,), 0.7, device="cuda")
        figures = {name: timed(way, (param, grad, m, v, low, coef, steps, lr))
                   for name, way in (("torch", torch_way), ("kernel", kernel_way))}
        moved = size * width * 30 / 1e9  # the kernel's bytes: 16 read, 12 written, 2 of bf16
        print(f"pack of {size}, bank 1 of BERT-base: clipping multiply + fused AdamW + cast {figures['torch']:.2f} ms, "
              f"the kernel {figures['kernel']:.2f} ms ({moved / figures['kernel']:.2f} TB/s at its 30 bytes a "
              "parameter)", flush=True)
        del param, grad, m, v, low
        torch.cuda.empty_cache()


def masks(P: int = 34) -> None:
    """One step's dropout masks at a pack of 34's shapes (8 sequences of 64 tokens, BERT-base: 25 hidden sites
    drawn at once, 11 attention sites and the last layer's first-token one, the classifier's), by the kernel
    and by torch's ops: the same bits, and the time of each."""
    from types import SimpleNamespace

    from trainables.fused import Dropout

    B, T, H, heads = 8, 64, 768, 12
    batch = SimpleNamespace(lengths=torch.zeros(P, B))
    x, probs, first = (torch.ones(P, B * T, H, device="cuda", dtype=torch.bfloat16),
                       torch.ones(P * B, heads, T, T, device="cuda", dtype=torch.bfloat16),
                       torch.ones(P * B, heads, 1, T, device="cuda", dtype=torch.bfloat16))

    def step(drop):
        drop.begin(torch.tensor(3, device="cuda"))
        out = [drop.hidden(x, None) for _ in range(25)]
        out += [drop.attention(probs, batch) for _ in range(11)] + [drop.attention(first, batch)]
        return out + [drop.classifier(x[:, :B])]

    drops = {}
    for name, kernel in (("torch", False), ("kernel", True)):
        drops[name] = Dropout(list(range(P)), 0.1, 0.1, 0.1, 12, "cuda")
        drops[name].triton = kernel
    same = all(torch.equal(a, b) for a, b in zip(step(drops["kernel"]), step(drops["torch"])))
    times = {name: timed(lambda d=drop: step(d), (), repeats=5) for name, drop in drops.items()}
    print(f"dropout masks of a pack-of-34 step (batches of 8 x 64 tokens): torch's ops {times['torch']:.2f} ms, "
          f"the kernel {times['kernel']:.2f} ms; the same bits: {same}", flush=True)


if __name__ == "__main__":
    masks()
    main(*map(int, sys.argv[1:2]))
