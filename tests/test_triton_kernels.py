"""The GPU's update kernel (trainables.triton_kernels), run on this CPU by Triton's interpreter: AdamW with each
trial's clipping factor and the bf16 cast in one pass gives torch's fused AdamW after the clipping multiply, on
raw tensors and through whole packs, with steps run op by op or recorded and replayed."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.test_fused import MIXED
from tests.test_fused_engine import as_on_gpu
from tests.test_step_graphs import CFGS, Here, RecordedOps, epochs, state
from trainables import fused, triton_kernels
from trainables.fused import Pack, StepGraphs
from trainables.triton_kernels import TRITON, adamw_clipped, step_scalars

pytest.importorskip("triton")

BETAS, EPS = (0.9, 0.999), 1e-8


@pytest.fixture
def interpreted(monkeypatch):
    """The kernel run by Triton's interpreter, on CPU tensors (the interpreter is chosen when it is made)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for made in (triton_kernels._update_kernel, triton_kernels._mask_kernel):
        made.cache_clear()
    yield
    for made in (triton_kernels._update_kernel, triton_kernels._mask_kernel):
        made.cache_clear()


@pytest.fixture
def few_blocks(monkeypatch):
    """Two blocks a row where the kernels' own choice makes more: the interpreter runs a launch's programs one
    by one, a few milliseconds each whatever its block, and the banks' rows in blocks of 4096 made each step of
    a pack take seconds. A row still spans blocks and its last block is still masked."""
    chosen = triton_kernels.block_for
    monkeypatch.setattr(triton_kernels, "block_for", lambda triton, width: max(
        chosen(triton, width), triton.next_power_of_2(triton.cdiv(width, 2))))


def torch_update(param, grad, m, v, coef, lr, steps, decay):
    """What the kernel replaces: the clipping multiply, then torch's fused AdamW, on copies."""
    param, grad, m, v = (t.clone() for t in (param, grad, m, v))
    grad.mul_(coef.unsqueeze(1))
    torch._fused_adamw_(list(param), list(grad), list(m), list(v), [], [steps] * len(param), lr=lr, beta1=BETAS[0],
                        beta2=BETAS[1], weight_decay=decay, eps=EPS, amsgrad=False, maximize=False)
    return param, m, v


def moments(*shape):
    g = torch.Generator().manual_seed(sum(shape))
    return (torch.randn(*shape, generator=g), torch.randn(*shape, generator=g), 0.1 * torch.randn(*shape, generator=g),
            0.01 * torch.rand(*shape, generator=g))


def test_the_kernel_is_torchs_adamw_after_the_clipping_multiply(interpreted):
    coef, steps, lr = torch.tensor([0.5, 1.0, 0.25]), torch.tensor(7.0), 2e-5
    # whole rows, a run of columns of every row (a stride of its own), with decay, and the bf16 cast
    for columns, decay in ((slice(None), 0.0), (slice(96, 608), 0.01)):
        param, grad, m, v = moments(3, 1000)
        expected = torch_update(*(t[:, columns] for t in (param, grad, m, v)), coef, lr, steps, decay)
        low = torch.zeros(3, 1000, dtype=torch.bfloat16)
        before = [t.clone() for t in (param, grad, m, v)]
        adamw_clipped(*(t[:, columns] for t in (param, grad, m, v)), coef, step_scalars(lr, steps, BETAS), *BETAS, EPS,
                      decay, low=low[:, columns])
        for got, want in zip((param, m, v), expected):
            torch.testing.assert_close(got[:, columns], want, rtol=2e-6, atol=1e-7)
        assert torch.equal(grad, before[1]), "the gradient bank keeps the unscaled gradient"
        outside = torch.ones(1000, dtype=torch.bool)
        outside[columns] = False
        assert all(torch.equal(t[:, outside], b[:, outside]) for t, b in zip((param, m, v), before[::2] + before[3:]))
        assert not low[:, outside].any()
        # the interpreter truncates to bf16 where a GPU rounds: within one of its steps
        torch.testing.assert_close(low[:, columns].float(), param[:, columns], rtol=2 ** -7, atol=0)
    # rows of a table [P * V, H] by index, each trial's factor by its row's trial
    V, H = 50, 96
    tables = moments(3 * V, H)
    index = torch.tensor([0, 3, 49, 50, 77, 120, 149])
    picked = torch_update(*(t[index] for t in tables), coef[index // V], lr, steps, 0.0)
    untouched = [t.clone() for t in tables]
    adamw_clipped(*tables, coef, step_scalars(lr, steps, BETAS), *BETAS, EPS, 0.0, index=index, rows_per_trial=V)
    others = torch.ones(3 * V, dtype=torch.bool)
    others[index] = False
    for got, want, before in zip((tables[0], tables[2], tables[3]), picked, (untouched[0], untouched[2], untouched[3])):
        torch.testing.assert_close(got[index], want, rtol=2e-6, atol=1e-7)
        assert torch.equal(got[others], before[others])
    with pytest.raises(ValueError, match="every view must be"):
        adamw_clipped(param.t(), grad.t(), m.t(), v.t(), coef, step_scalars(lr, steps, BETAS), *BETAS, EPS, 0.0)


def kernel_and_torch_packs(cfgs, data, pretrained, monkeypatch):
    monkeypatch.setenv(TRITON, "0")
    plain = as_on_gpu(Pack(cfgs, data, pretrained))
    monkeypatch.setenv(TRITON, "1")
    kernel = as_on_gpu(Pack(cfgs, data, pretrained))
    assert kernel.triton and not plain.triton
    return kernel, plain


@pytest.mark.parametrize("decay", [0.01, 0.0], ids=["decay", "vocabulary-rows"])
def test_a_pack_updated_by_the_kernel_trains_as_one_updated_by_torch(pretrained, synthetic, interpreted, few_blocks,
                                                                      monkeypatch, decay):
    """Mixed learning rates and per-layer rates (a trial's own runs of columns), clipped and unclipped trials, and
    without decay the word table's rows by index."""
    # each trial's runs are launches of their own, and each launch's programs take the interpreter a while: three
    # trials, two steps an epoch (the second reads the moments the first wrote)
    cfgs = [dataclasses.replace(MIXED[i], weight_decay=decay, train_size=12) for i in (3, 4, 5)]
    kernel, plain = kernel_and_torch_packs(cfgs, synthetic, pretrained, monkeypatch)
    assert (kernel.optimizer.word_rows is None) == (decay != 0)
    assert any(count == 1 for _, _, _, count, _, _ in kernel.optimizer.sweeps), "per-layer rates: a trial's own runs"
    for _ in range(1 if decay else 2):  # with decay, a launch for each run of columns: slow in the interpreter
        losses = kernel.train_epoch()[0]
        assert len(losses) == 2
        torch.testing.assert_close(losses, plain.train_epoch()[0], rtol=1e-5, atol=1e-6)
    assert kernel.clipped.tolist() == plain.clipped.tolist() and kernel.clipped.any() and not kernel.clipped.all()
    for got, want in zip(state(kernel), state(plain)):  # Adam's m / sqrt(v) of tiny moments moves a few ulps
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_word_tables_clipping_norm_over_the_vocabulary_rows_is_the_whole_tables(pretrained, synthetic):
    """On GPUs the word table's gradient is dense, and its clipping norm reads only the rows the trials' tokens can
    touch (fused.word_squared_norms): the same sums as over the whole table, two learning rates among them."""
    cfgs = [dataclasses.replace(MIXED[i], weight_decay=0.0) for i in (0, 3, 7)]
    pack = as_on_gpu(Pack(cfgs, synthetic, pretrained))
    batches, labels = pack.plan(pack.orders())
    pack.step(batches[0], labels[0])
    rows = pack.optimizer.word_rows
    assert rows is not None and len(rows) == 2
    H = pack.layout.shapes["word"][1]
    table = pack.grads[0].view(-1, H)
    for flat in rows.values():  # gradients in those rows alone, as a step leaves them
        table[flat] = torch.randn(len(flat), H, generator=torch.Generator().manual_seed(len(flat)))
    torch.testing.assert_close(fused.word_squared_norms(pack), pack.words.squared_norms(), rtol=1e-5, atol=0)
    assert (fused.word_squared_norms(pack) > 0).all()


def test_in_bf16_the_kernel_writes_the_cast_and_the_step_makes_none(pretrained, synthetic, interpreted, few_blocks,
                                                                    monkeypatch):
    cfgs = [dataclasses.replace(MIXED[i], precision="bf16", train_size=12) for i in (0, 6)]
    kernel, plain = kernel_and_torch_packs(cfgs, synthetic, pretrained, monkeypatch)
    batches, labels = kernel.plan(kernel.orders())
    assert len(batches) == 2  # the interpreter takes seconds over a step: one, then one that reads its cast
    for pack in (kernel, plain):
        pack.step(batches[0], labels[0])
    low = kernel.encoder.low
    torch.testing.assert_close(low.float(), kernel.banks[1], rtol=2 ** -7, atol=0)
    # torch's update writes no cast: a forward (or a recording of one) must make it, whatever it made before
    assert plain.encoder.low_at is None
    low.zero_()  # so that a cast made by the next forward would show
    kernel.encoder.refresh()
    assert not low.any(), "the update made the cast: refresh makes none"
    kernel.encoder.low_at = kernel.encoder.cast_at = None
    kernel.encoder.refresh()
    assert torch.equal(low, kernel.banks[1].to(torch.bfloat16)), "a cast not made by the update is made"
    for b, y in zip(batches[1:], labels[1:]):
        torch.testing.assert_close(kernel.step(b, y), plain.step(b, y), rtol=0.02, atol=0.02)


def test_recorded_steps_updated_by_the_kernel_keep_the_cast_and_the_numbers(pretrained, synthetic, interpreted,
                                                                              few_blocks, monkeypatch):
    """As tests/test_step_graphs.py records and replays steps, with the kernel: the recording's update (an
    operator of its own) replays, and each replay leaves the cast made, so that the next step reads the new
    weights: the very numbers of the same steps run op by op."""
    monkeypatch.setattr(fused, "write_rows", lambda table, rows, values: table.index_copy_(0, rows, values))
    monkeypatch.setenv(TRITON, "1")
    # no decay: a launch a bank and one over the word rows (the interpreter takes a while over each launch, and
    # over each trial's rows): a clipped trial and one never clipped, an epoch of 6 steps
    cfgs = [dataclasses.replace(CFGS[i], precision="bf16", weight_decay=0.0, train_size=24) for i in (0, 2)]
    recorded, op_by_op = as_on_gpu(Pack(cfgs, synthetic, pretrained)), as_on_gpu(Pack(cfgs, synthetic, pretrained))
    graphs = recorded.graphs = StepGraphs(recorded, graph=RecordedOps, side=Here())
    op_by_op.optimizer.read_lr_from_device()  # as the graphs read them
    ran = []

    def step(batch, labels, take=recorded.step):
        replays = graphs.replays
        losses = take(batch, labels)
        ran.append("replayed" if graphs.replays > replays else "op by op")
        return losses

    recorded.step = step
    for got, want in zip(epochs(recorded, 1), epochs(op_by_op, 1)):
        assert torch.equal(got, want)
    # a new shape's step op by op after a replay, a replay after it, replays in a row: each reads the cast of
    # the step before
    assert ran == ["op by op", "replayed", "op by op", "replayed", "replayed", "replayed"], ran
    assert recorded.encoder.low_at == recorded.optimizer.step_count == 6
    assert recorded.clipped.tolist()[1] == 0 < recorded.clipped.tolist()[0] < 6
    assert all(torch.equal(a, b) for a, b in zip(state(recorded), state(op_by_op)))
    assert torch.equal(recorded.encoder.low, op_by_op.encoder.low)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_mask_kernel_draws_the_very_masks_of_torchs_ops(interpreted, dtype):
    """Hidden (a width not a multiple of 4, every hidden site at once), attention (every query, and the first
    alone) and classifier masks, bit for bit."""
    from types import SimpleNamespace

    from trainables.fused import Dropout

    def masks(kernel: bool, step: int):
        drop = Dropout([7, 8, 11], hidden=0.1, attention=0.25, classifier=0.5, num_layers=2, device="cpu")
        drop.triton = kernel
        drop.begin(torch.tensor(step))
        hidden = [drop.hidden(torch.ones(3, 37, 10, dtype=dtype), None) for _ in range(5)]
        batch = SimpleNamespace(lengths=torch.zeros(3, 2))
        attention = [drop.attention(torch.ones(6, 3, q, 61, dtype=dtype), batch) for q in (61, 1)]
        return [*hidden, *attention, drop.classifier(torch.ones(3, 2, 10, dtype=dtype))]

    for step in (0, 5):
        for got, want in zip(masks(True, step), masks(False, step)):
            assert got.dtype == want.dtype and torch.equal(got, want)
    assert not torch.equal(masks(True, 0)[0], masks(True, 5)[0])


def test_the_kernel_setting_is_checked(monkeypatch):
    monkeypatch.setenv(TRITON, "yes")
    with pytest.raises(ValueError, match="REINIT_SWEEP_TRITON='yes': allowed are 1 .* and 0 .torch's ops alone."):
        triton_kernels.use_triton(torch.device("cpu"))
    monkeypatch.setenv(TRITON, "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_kernels.use_triton(torch.device("cpu")), "on a CPU only under the interpreter"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a GPU")
def test_on_a_gpu_the_compiled_kernel_is_torchs_update_and_its_cast_torchs():
    coef, steps = torch.tensor([0.5, 1.0, 0.25], device="cuda"), torch.tensor(3.0, device="cuda")
    param, grad, m, v = (t.cuda() for t in moments(3, 100_003))
    expected = torch_update(param, grad, m, v, coef, 2e-5, steps, 0.01)
    low = torch.empty_like(param, dtype=torch.bfloat16)
    adamw_clipped(param, grad, m, v, coef, step_scalars(2e-5, steps, BETAS), *BETAS, EPS, 0.01, low=low)
    for got, want in zip((param, m, v), expected):
        assert float((got - want).norm() / want.norm()) < 1e-6
    assert torch.equal(low, param.bfloat16())


def test_a_kernel_that_cannot_compile_on_a_node_says_how_to_run_without_it(monkeypatch):
    # Triton compiles a kernel at its first launch; a node without a C compiler for its launcher had failed every
    # pack there with Triton's own error, which names no way round it
    class Uncompilable:
        def __getitem__(self, grid):
            def run(*args, **options):
                raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
            return run

    import triton

    monkeypatch.setattr(triton_kernels, "_update_kernel", lambda: (triton, Uncompilable()))
    weights = [torch.zeros(2, 4) for _ in range(4)]
    with pytest.raises(RuntimeError, match=rf"adamw_clipped failed to compile.*C compiler.*Set {TRITON}=0"):
        adamw_clipped(*weights, torch.ones(2), step_scalars(1e-3, torch.tensor(1.0), BETAS), *BETAS, EPS, 0.0)


def test_a_packs_rows_say_whether_the_kernels_updated_it(pretrained, synthetic, interpreted):
    # within an ulp of torch's ops a step, which training grows: a row says which ran, as it says cuda_graphs
    from trainables.rows import make_row

    (result,) = fused.finetune_pack([dataclasses.replace(MIXED[0], train_size=8, epochs=1)], synthetic, pretrained)
    assert make_row({"trial_id": "t"}, result, result["status"])["triton_kernels"] is True
