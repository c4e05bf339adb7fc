"""Triton kernels for a pack's step on GPUs, where torch's ops would each make a pass over memory.

The update: AdamW with each trial's gradient-clipping factor and the bf16 cast of the new weights, in one pass
over the banks. On an H200 a pack-of-34 BERT-base step spent 23.9 ms in torch's fused AdamW, 14.4 ms in the
clipping multiply before it (a read and a write of every gradient) and 2.2 ms in the cast after it
(docs/benchmarks.md). torch's fused AdamW takes one `grad_scale` a call, and called once a trial with it, it
ran at half its speed. Here the factor is read per row and the weights are written in bf16 too: 30 bytes a
parameter a step instead of 46. The arithmetic is torch's fused AdamW's (ATen's fused_adam_utils.cuh, ADAMW
mode), in float32, on the gradient times the factor, as clip_grad_norm_ then AdamW would compute it, within an
ulp of it (torch's kernel writes the moments' updates as fused multiply-adds); the gradient bank keeps the
unscaled gradient.

The dropout masks: fused.Dropout's counter-based masks, the same bits, made in one pass that writes only the
mask. Made with torch's ops, each hash is a dozen int64 passes over a tensor of a quarter of the mask's
elements, eight bytes each, and the lanes' comparison and scaling three more.

`TRITON=0` turns both off (torch's ops, as on CPUs). On a CPU the kernels run only under Triton's interpreter
(TRITON_INTERPRET=1), which the tests use."""
from __future__ import annotations

import functools
import os

import torch

from trainables.switches import TRITON, switch_on

MAX_BLOCKS = 65535  # CUDA's limit on a grid's second dimension


def use_triton(device: torch.device) -> bool:
    """Whether a pack on `device` runs the kernels: on a GPU unless turned off or Triton is missing; on a CPU
    only under Triton's interpreter."""
    if not switch_on(TRITON):
        return False
    if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        _update_kernel()
    except ImportError:
        return False
    return True


def launch(name: str, kernel, grid: tuple, *args, **options) -> None:
    """kernel[grid](...): a kernel compiles at its first launch on a node, and a node that cannot compile it (no C
    compiler for Triton's launcher, a Triton too old for the card) fails every pack there; the error says how to
    run the pack without the kernels, as a failed CUDA graph recording does."""
    try:
        kernel[grid](*args, **options)
    except torch.OutOfMemoryError:
        raise
    except Exception as error:
        raise RuntimeError(f"the Triton kernel {name} failed to compile or launch: {type(error).__name__}: "
                           f"{error}. Set {TRITON}=0 to run torch's ops instead.") from error


@functools.cache
def _update_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def update(param, grad, exp_avg, exp_avg_sq, low, coef, scalars, index, width, stride, rows_per_trial,
               beta1, beta2, eps, decay, WRITE_LOW: tl.constexpr, INDEXED: tl.constexpr, BLOCK: tl.constexpr):
        # one row of `width` elements a program along axis 0 (a trial's, or with INDEXED the row index[r] of a
        # table), BLOCK of them along axis 1
        if INDEXED:
            row = tl.load(index + tl.program_id(0))
        else:
            row = tl.program_id(0).to(tl.int64)
        factor = tl.load(coef + row // rows_per_trial)
        lr, step_size, bias_correction2_sqrt = tl.load(scalars), tl.load(scalars + 1), tl.load(scalars + 2)
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < width
        at = row * stride + offsets
        g = tl.load(grad + at, mask=mask, other=0.0) * factor
        p = tl.load(param + at, mask=mask, other=0.0)
        m = tl.load(exp_avg + at, mask=mask, other=0.0)
        v = tl.load(exp_avg_sq + at, mask=mask, other=0.0)
        p = p - lr * decay * p
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        # IEEE square root and division, as torch's kernel computes them (Triton's own are approximate)
        p = p - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps)
        tl.store(param + at, p, mask=mask)
        tl.store(exp_avg + at, m, mask=mask)
        tl.store(exp_avg_sq + at, v, mask=mask)
        if WRITE_LOW:
            tl.store(low + at, p.to(low.dtype.element_ty), mask=mask)

    return triton, update


def block_for(triton, width: int) -> int:
    """Elements a program: 1024-4096, more where the grid's second dimension would pass CUDA's limit."""
    block = max(1024, min(4096, triton.next_power_of_2(width)))
    while triton.cdiv(width, block) > MAX_BLOCKS:
        block *= 2
    return block


def step_scalars(lr: "float | torch.Tensor", steps: torch.Tensor, betas: tuple[float, float]) -> torch.Tensor:
    """[lr, lr / (1 - beta1^step), sqrt(1 - beta2^step)] in float32 on the device, from the step count there (a
    recorded step follows it), as torch's fused AdamW computes them."""
    lr = torch.full((), lr, dtype=torch.float32, device=steps.device) if not torch.is_tensor(lr) else lr.float()
    return torch.stack([lr, lr / (1 - torch.pow(betas[0], steps)), (1 - torch.pow(betas[1], steps)).sqrt()])


@torch.library.custom_op("reinit_sweep::adamw_clipped", mutates_args=("param", "exp_avg", "exp_avg_sq", "low"))
def adamw_clipped(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  coef: torch.Tensor, scalars: torch.Tensor, beta1: float, beta2: float, eps: float, decay: float,
                  low: torch.Tensor | None = None, index: torch.Tensor | None = None, rows_per_trial: int = 1) -> None:
    """AdamW on rows of 2-d views [R, width] that share their strides (row stride any, elements contiguous),
    row r's gradient times coef[r] (with `index`: the rows index[i] of the tables, row i's factor
    coef[index[i] // rows_per_trial]); with `low`, the new weights written there too, in its dtype. An operator
    of torch's own (torch.library): dispatch modes see it, as they see torch's fused AdamW."""
    triton, kernel = _update_kernel()
    views = [param, grad, exp_avg, exp_avg_sq] + ([low] if low is not None else [])
    if any(v.dim() != 2 or v.stride() != param.stride() or v.shape != param.shape or v.stride(1) != 1 for v in views):
        raise ValueError("adamw_clipped: every view must be [R, width], with the weights' strides, elements contiguous")
    rows, width = param.shape if index is None else (len(index), param.shape[1])
    if rows == 0 or width == 0:
        return
    block = block_for(triton, width)
    launch("adamw_clipped", kernel, (rows, triton.cdiv(width, block)),
           param, grad, exp_avg, exp_avg_sq, low if low is not None else param, coef, scalars,
           index if index is not None else coef, width, param.stride(0), rows_per_trial, beta1, beta2, eps, decay,
           WRITE_LOW=low is not None, INDEXED=index is not None, BLOCK=block, num_warps=8)


@functools.cache
def _mask_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def masks(out, groups, keys, per_key, width, lanes_per_row, bound, scale, mix0, mix1,
              low34, low37, low33, BLOCK: tl.constexpr):
        # out[k, j, w] for key k (axis 0) and the element j * width + w of its [J, width] grid (axis 1): lane
        # w % 4 of mix64(groups[j, w // 4] + keys[k]), as fused.Dropout._masks computes it with torch's ops
        k = tl.program_id(0).to(tl.int64)
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < per_key
        j, w = offsets // width, offsets % width
        z = tl.load(groups + j * lanes_per_row + w // 4, mask=inside, other=0) + tl.load(keys + k)
        z = (z ^ ((z >> 30) & low34)) * mix0
        z = (z ^ ((z >> 27) & low37)) * mix1
        z = z ^ ((z >> 31) & low33)
        lane = (z >> ((w % 4) * 16).to(tl.int64)) & 0xFFFF
        lane = tl.where(lane >= 32768, lane - 65536, lane)  # read as int16, as the torch version views it
        value = tl.where(lane <= bound, scale, 0.0)
        tl.store(out + k * per_key + offsets, value.to(out.dtype.element_ty), mask=inside)

    return triton, masks


@functools.cache
def exact_in(value: float, dtype: torch.dtype) -> float:
    """`value` as torch's ops make a kept mask element (a float32 product cast to dtype): exact in dtype, so
    the kernel's own cast has nothing to round (Triton's interpreter truncates where a GPU rounds)."""
    return float(torch.tensor(value, dtype=torch.float32).to(dtype))


@torch.library.custom_op("reinit_sweep::dropout_masks", mutates_args=())
def dropout_masks(groups: torch.Tensor, keys: torch.Tensor, bound: int, scale: float, width: int,
                  dtype: torch.dtype, mix0: int, mix1: int) -> torch.Tensor:
    """[keys..., rows..., width] masks: `groups` [rows..., G] the hashed ids of 4 elements each (contiguous),
    `keys` any shape (its elements in order), an element kept (as `scale`) where its signed 16-bit lane is at
    most `bound`, else 0, in `dtype`."""
    triton, kernel = _mask_kernel()
    lanes_per_row = groups.shape[-1]
    rows = groups.numel() // lanes_per_row
    out = torch.empty((*keys.shape, *groups.shape[:-1], width), dtype=dtype, device=groups.device)
    per_key = rows * width
    if out.numel() == 0:
        return out
    scale = exact_in(scale, dtype)
    block = block_for(triton, per_key)
    launch("dropout_masks", kernel, (keys.numel(), triton.cdiv(per_key, block)),
           out, groups.contiguous(), keys.contiguous(), per_key, width, lanes_per_row, bound, scale, mix0, mix1,
           (1 << 34) - 1, (1 << 37) - 1, (1 << 33) - 1, BLOCK=block, num_warps=4)
    return out
