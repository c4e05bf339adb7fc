"""A bf16 linear layer's weight and bias gradients written into the float32 gradient bank on a GPU, two ways, at
a pack of 34's shapes (BERT-base's feed-forward input: [34, 3072, 768] over 512 tokens a trial): bmm's float32
output straight into the bank's strided rows, the bias's as a product with ones (trainables.fused._Linear on
GPUs), against a bf16 product copied in. Checks each against a float64 reference (bf16 inputs are exact there)
and times both with CUDA events.

    python3 benchmarks/gpu_linear_check.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(P: int = 34, out: int = 3072, inner: int = 768, tokens: int = 512) -> None:
    from trainables.fused import FLOAT32_OUT_BMM

    assert torch.cuda.is_available(), "this check needs a GPU"
    gen = torch.Generator(device="cuda").manual_seed(0)
    grad = torch.randn(P, tokens, out, device="cuda", generator=gen).bfloat16()
    x = torch.randn(P, tokens, inner, device="cuda", generator=gen).bfloat16()
    bank = torch.full((P, out * inner + 1000), float("nan"), device="cuda")  # a bank's rows: strided over the pack
    view = bank[:, 500:500 + out * inner].view(P, out, inner)
    reference = grad.double().mT @ x.double()

    bias_bank = torch.full((P, out + 1000), float("nan"), device="cuda")
    bias = bias_bank[:, 500:500 + out]
    bias_reference = grad.double().sum(1)

    def straight():
        torch.bmm(grad.mT, x, out_dtype=torch.float32, out=view)
        torch.bmm(grad.new_ones(P, 1, tokens), grad, out_dtype=torch.float32, out=bias.unsqueeze(1))

    def copied():
        view.copy_(torch.bmm(grad.mT, x))
        bias.copy_(grad.sum(1))

    print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; FLOAT32_OUT_BMM {FLOAT32_OUT_BMM}")
    for name, way in (("float32 out, straight into the bank", straight), ("bf16 product, copied in", copied)):
        bank.fill_(float("nan")), bias_bank.fill_(float("nan"))
        way()
        error = float((view.double() - reference).norm() / reference.norm())
        bias_error = float((bias.double() - bias_reference).norm() / bias_reference.norm())
        untouched = all(bool(b[:, :500].isnan().all() and b[:, 500 + n:].isnan().all())
                        for b, n in ((bank, out * inner), (bias_bank, out)))
        for _ in range(3):
            way()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            way()
        end.record()
        torch.cuda.synchronize()
        print(f"{name}: {start.elapsed_time(end) / 20:.3f} ms, relative error {error:.2e} (bias {bias_error:.2e}), "
              f"written only its rows: {untouched}, no NaN left: {not (view.isnan().any() or bias.isnan().any()).item()}",
              flush=True)


if __name__ == "__main__":
    main()
