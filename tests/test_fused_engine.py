"""The fused engine's machinery (trainables.fused): trials drawn straight into the banks as `finetune` draws
them, bucketed batches, memory measured, an out-of-memory split and a checkpoint that change no trial's numbers."""
from __future__ import annotations

import dataclasses
import os
import threading
import types

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.test_fused import LAYERS, MIXED, trial, without_dropout
from trainables.ablations import HeadReinit, Permute, Reinit, apply_ablation
from trainables.finetune import make_optimizer
from trainables.fused import (BANK_ALIGNMENT, OOM_ABOVE, Pack, PackOptimizer, PackParts, PackRun, Position,
                              RowGradient, batch_arrays, bucket, cgroup_headroom, finetune_pack, hf_parameters,
                              host_memory_available, needs_probe, pinned_allocator_settings, register_pinned_pages,
                              set_up_pack, worth_pinning)
from trainables.memory import MemoryAccountant
from trainables.models import build_classifier
from trainables.state import load_state, save_state


@pytest.fixture(scope="module")
def quiet(pretrained):
    return without_dropout(pretrained)


def finetune_model(cfg, data, pretrained):
    model = build_classifier(pretrained, data.num_labels, cfg.seed)
    return apply_ablation(cfg.ablation, model, cfg.seed)


def as_on_gpu(pack: Pack) -> Pack:
    """What a CUDA pack does differently, on this CPU: the vocabulary's gradient read whole, widths bucketed."""
    pack.words.sparse, pack.bucketed = False, True
    return pack


@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "staged"])
def test_trials_are_drawn_into_the_banks_exactly_as_finetune_draws_them(pretrained, synthetic, staged):
    cfgs = [MIXED[i] for i in (0, 1, 2, 3, 4)] + [trial(9, Permute.from_seed(2, LAYERS)), trial(10, Reinit())]
    layout, setups, banks, start = set_up_pack(cfgs, synthetic, pretrained, "cpu", workers=2, staged=staged)
    for p, cfg in enumerate(cfgs):
        model = finetune_model(cfg, synthetic, pretrained)
        for name, params in hf_parameters(model).items():
            expected = torch.cat([q.detach() for q in params]) if len(params) > 1 else params[0].detach()
            assert torch.equal(layout.view(banks, name)[p], expected), (cfg.ablation, name)
        optimizer, _ = make_optimizer(model, cfg, setups[p].rows)
        lrs = {(g["initial_lr"], g["weight_decay"]) for g in optimizer.param_groups}
        assert set(setups[p].hyper.values()) == lrs
    # a trial's head is its seed's, whatever its surgery; two seeds give two heads
    heads = layout.view(banks, "head_w")
    assert not torch.equal(heads[0], heads[1])
    alone = set_up_pack([cfgs[3]], synthetic, pretrained, "cpu")
    assert torch.equal(alone[2][1], banks[1][3:4])
    # the start weights: every trial's as set up, a copy of its own only where surgery changed the checkpoint's
    for name, checkpoint in start.pretrained.items():
        assert torch.equal(start.stacked(name, len(cfgs), "cpu"), layout.view(banks, name))
        changed = {p for p in range(len(cfgs)) if not torch.equal(layout.view(banks, name)[p], checkpoint)}
        assert set(start.own[name]) == changed, name
    assert not any(6 in own for own in start.own.values())  # Reinit() changes no layer
    assert sum(0 in own for own in start.own.values()) == 2 * 4  # two layers reinitialized, 4 weights each
    picked = start.select([6, 0])
    assert all(torch.equal(picked.stacked(n, 2, "cpu"), layout.view(banks, n)[[6, 0]]) for n in start.pretrained)
    # a weight every member changed is kept once a member, not beside the checkpoint's as well
    alone_layout, _, alone_banks, alone_start = set_up_pack([cfgs[0]], synthetic, pretrained, "cpu")
    owned = [n for n, own in alone_start.own.items() if own]
    assert owned and not set(owned) & set(alone_start.pretrained)
    assert all(torch.equal(alone_start.stacked(n, 1, "cpu"), alone_layout.view(alone_banks, n)) for n in owned)


def test_build_classifier_draws_only_the_head_and_leaves_the_global_stream_alone(pretrained):
    before = torch.get_rng_state()
    a, b, c = (build_classifier(pretrained, 2, seed) for seed in (4, 4, 5))
    assert torch.equal(torch.get_rng_state(), before)
    for name, tensor in pretrained.state_dict.items():
        assert torch.equal(a.base_model.state_dict()[name], tensor), name
    assert torch.equal(a.classifier.weight, b.classifier.weight) and not torch.equal(a.classifier.weight, c.classifier.weight)
    assert not a.classifier.bias.any() and 0.01 < float(a.classifier.weight.detach().std()) < 0.03
    assert a.base_model.embeddings.position_ids.tolist()[0][:3] == [0, 1, 2]


def test_bucketed_widths_change_no_number(pretrained, synthetic):
    cfgs = [MIXED[1], MIXED[6]]  # dropout on: its masks must not see the padding either
    exact, bucketed = Pack(cfgs, synthetic, pretrained), Pack(cfgs, synthetic, pretrained)
    bucketed.bucketed = True
    a, b = exact.train_epoch()[0], bucketed.train_epoch()[0]
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert exact.plan(exact.orders())[0][0].keys.shape[-1] not in (8, 12, 16, 24, 32, 48, 64)  # it did pad


def test_in_bf16_on_a_cpu_a_pack_buckets_its_widths_and_in_fp32_it_does_not(pretrained, synthetic):
    """oneDNN builds a bf16 matmul for each new shape: a token count that changes every batch made bf16 steps
    slower than fp32's on an AMX CPU. fp32 (MKL) needs no bucketing, and padding would only add work."""
    sizes = {bucket(n) for n in range(1, 4096)}
    for precision, bucketed in (("bf16", True), ("fp32", False)):
        pack = Pack([dataclasses.replace(MIXED[i], precision=precision) for i in (0, 6)], synthetic, pretrained)
        batches = pack.plan(pack.orders())[0] + pack._eval_plan(synthetic.validation)[1]
        widths = {b.ids.shape[1] for b in batches} | {b.keys.shape[-1] for b in batches}
        assert (widths <= sizes) == bucketed, (precision, widths)


def test_bank_rows_are_aligned_and_their_padding_changes_no_number(pretrained, synthetic, monkeypatch):
    """Every trial's view of bank 1 starts 256 bytes apart from the bank's start and its row is a multiple of
    64 floats (vectorized CUDA kernels and cuBLAS's fast paths need it; fused.BANK_ALIGNMENT). The zeros between
    tensors stay zero through training (of trials that stay finite) (mixed learning rates, decay, per-layer rates: AdamW runs over them),
    and a pack ends with the numbers of the same pack laid out unpadded, as on a CPU, up to rounding."""
    import trainables.fused as fused

    cfgs = [MIXED[i] for i in (0, 3, 4, 6)]
    # as on a GPU, thrice its alignment: the tiny model's tensors (multiples of 64) then have zeros between them
    monkeypatch.setattr(fused, "bank_alignment", lambda device: 3 * fused.BANK_ALIGNMENT)
    padded = as_on_gpu(Pack(cfgs, synthetic, pretrained))
    layout, bank = padded.layout, padded.banks[1]
    assert layout.widths[1] % 64 == 0
    for name in layout.names(1):
        view = layout.view(padded.banks, name)
        assert all((view[p].data_ptr() - bank.data_ptr()) % 256 == 0 for p in range(len(cfgs))), name
    # AdamW's runs of a trial's row (per-layer rates: several) tile it, each a multiple of 4 long
    tilings = [fused.runs(layout, 1, setup.hyper) for setup in padded.setups]
    assert max(map(len, tilings)) > 1
    for found in tilings:
        assert found[0][1] == 0 and found[-1][2] == layout.widths[1]
        assert all(a[2] == b[1] for a, b in zip(found, found[1:])) and all((e - b) % 4 == 0 for _, b, e in found)
    monkeypatch.undo()  # a CPU's layout: unpadded
    plain = as_on_gpu(Pack(cfgs, synthetic, pretrained))
    assert plain.layout.widths[1] == sum(plain.layout.sizes(1))
    assert plain.layout.places["2.qkv_w"][1] < layout.places["2.qkv_w"][1], "zeros between tensors, not only at the end"
    for _ in range(2):  # the rounding of a few CPU ops moves with the layout (fused.BANK_ALIGNMENT)
        torch.testing.assert_close(padded.train_epoch()[0], plain.train_epoch()[0], rtol=1e-5, atol=1e-6)
    used = torch.zeros(layout.widths[1], dtype=torch.bool)
    for name in layout.names(1):
        begin = layout.places[name][1]
        used[begin:begin + layout.sizes(1)[layout.names(1).index(name)]] = True
        torch.testing.assert_close(layout.view(padded.banks, name), plain.layout.view(plain.banks, name),
                                   rtol=1e-5, atol=1e-5)
    for state in (padded.banks, padded.grads, padded.exp_avg, padded.exp_avg_sq):
        assert not state[1][:, ~used].any(), "the padding stays zero"
    # the next group of a GPU pack, set up in host memory while the one before trains, is laid out for the GPU
    import concurrent.futures

    ahead = fused.PackRun([0, 1])
    with concurrent.futures.ThreadPoolExecutor(1) as background:
        ahead.prepare(cfgs, synthetic, pretrained, background, torch.device("cuda", 0))
        parts = ahead.pending.result()
    assert parts.layout.align == fused.BANK_ALIGNMENT and parts.banks[1].device.type == "cpu"


def test_a_pack_measures_its_peak_memory_and_the_probe_changes_nothing(quiet, synthetic):
    peaks = {}
    for size in (1, 2, 3):
        pack = Pack([trial(s, Reinit.incremental(2, LAYERS)) for s in range(size)], synthetic, quiet)
        peaks[size] = pack.peak_memory(synthetic.validation)
    per_trial = peaks[2] - peaks[1]
    assert abs((peaks[3] - peaks[2]) - per_trial) < 0.05 * per_trial, peaks
    params = sum(t.numel() for t in quiet.state_dict.values())
    # weights, gradients, two moments and the optimizer's temporaries: 16 to 32 bytes a parameter
    assert 16 <= per_trial / params <= 32, per_trial / params

    probed, plain = Pack(MIXED[:2], synthetic, quiet), Pack(MIXED[:2], synthetic, quiet)
    probed.peak_memory(synthetic.validation)
    assert torch.equal(probed.train_epoch()[0], plain.train_epoch()[0])


def test_the_memory_probe_steps_on_a_batch_no_step_of_any_epoch_exceeds(quiet, synthetic):
    # The probe stepped on the next epoch's step of the most tokens summed over the pack; a step where one trial's
    # long sequences set the pack's width and packed length holds more (both count: [P, N, H] activations, and
    # [P * B, heads, T, T] attention), so a pack sized by the probe could run out of memory at such a step.
    from trainables.data import TokenizedSplit

    rng = np.random.default_rng(0)
    lengths = np.where(rng.random(200) < 0.1, 100, 4)  # a few long sequences among short ones
    ids = rng.choice(synthetic.train.input_ids, size=int(lengths.sum())).astype(np.int32)
    train = TokenizedSplit(input_ids=ids, token_type_ids=np.zeros_like(ids, dtype=np.int8),
                           offsets=np.concatenate([[0], np.cumsum(lengths)]), labels=rng.integers(0, 2, size=200))
    varied = dataclasses.replace(synthetic, train=train)
    cfgs = [dataclasses.replace(c, train_size=120, subset_seed=s) for s, c in enumerate(MIXED[:3])]
    pack = Pack(cfgs, varied, quiet)
    probed: list = []
    plan = pack.plan
    pack.plan = lambda orders, *rest: probed.append(plan(orders, *rest)[0][0]) or plan(orders, *rest)
    pack.peak_memory()
    (batch,) = probed
    bound = (batch.ids.shape[1], batch.keys.shape[-1])
    for _ in range(3):
        for step in plan(pack.orders())[0]:
            assert step.ids.shape[1] <= bound[0] and step.keys.shape[-1] <= bound[1], (step.ids.shape, bound)


def test_the_memory_accountant_counts_live_storages():
    weight = torch.zeros(1000, 250)  # 1 MB
    with MemoryAccountant() as accountant:
        accountant.track(weight, weight[0])  # a view is the same storage: counted once
        a = torch.ones(500, 500)  # 1 MB
        b = a * 2  # 1 MB: peak 3 MB
        del a, b
        c = torch.ones(250, 250)  # 0.25 MB
    assert accountant.peak == 3_000_000 and accountant.now == 1_250_000 and c.numel()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the allocator's count needs a GPU"))])
def test_a_probe_counts_what_it_tracks_and_makes_not_what_others_hold(device):
    """A pack's probe must not read another pack's memory as its own: on an H100 a finished pack's 58 GiB,
    counted in, made the planner shrink the next group to one trial."""
    from trainables.memory import peak_bytes

    device = torch.device(device, 0) if device == "cuda" else torch.device(device)
    others = torch.ones(4_000_000, device=device)  # 16 MB held by someone else, allocated before the probe
    tracked = torch.zeros(1_000_000, device=device)  # 4 MB: the pack's own state

    def run():
        scratch = torch.ones(500_000, device=device) * 2  # 2 MB each, both alive at the peak
        return scratch.sum()

    held = peak_bytes(run, device, [tracked, tracked[:10]])  # a view is the same storage: counted once
    assert 8_000_000 <= held <= 8_500_000 and others.numel(), held


def small_dev(data, n: int = 200):
    """`data` with its first `n` dev examples (two evaluation batches, the second partial): evaluating the whole
    dev set took a pack longer than an epoch of its steps, and a run's numbers are compared with another's."""
    from trainables.finetune import select_rows

    return dataclasses.replace(data, validation=select_rows(data.validation, np.arange(n)))


def run(cfgs, data, pretrained, **options):
    reports = []
    results = finetune_pack(cfgs, data, pretrained, report=reports.append, **options)
    return results, reports


def same_numbers(got: list[dict], expected: list[dict]) -> None:
    for g, e in zip(got, expected):
        assert g["status"] == e["status"] == "ok"
        assert g["dev_metrics_by_epoch"] == pytest.approx(e["dev_metrics_by_epoch"], abs=1e-9)
        assert g["train_loss"] == pytest.approx(e["train_loss"], rel=1e-5)
        assert g["clipped_steps"] == e["clipped_steps"] and g["lr_last"] == pytest.approx(e["lr_last"])
        np.testing.assert_allclose(g["weight_distance"], e["weight_distance"], rtol=1e-4)


SPLIT = [dataclasses.replace(c, eval_every=1) for c in (MIXED[0], MIXED[1], MIXED[5], MIXED[6])]


@pytest.fixture(scope="module")
def whole(pretrained, synthetic):
    """SPLIT's results as one pack that never runs out of memory (on small_dev, as the tests that read it)."""
    return run(SPLIT, small_dev(synthetic), pretrained)[0]


def test_an_out_of_memory_pack_splits_and_every_member_ends_as_it_would_have(pretrained, synthetic, whole,
                                                                              monkeypatch):
    cfgs, synthetic = SPLIT, small_dev(synthetic)
    monkeypatch.setenv(OOM_ABOVE, "2:4")  # 3 steps an epoch: the pack of 4 fails at epoch 2's second step
    split, reports = run(cfgs, synthetic, pretrained)
    same_numbers(split, whole)
    assert [r["pack_size"] for r in split] == [4] * 4 and len({r["pack_id"] for r in split}) == 1
    # epoch 1 as a pack of 4, then the first half's epoch 2, then the second half's
    assert [sorted(r) for r in reports] == [[0, 1, 2, 3], [0, 1], [2, 3]]
    assert [r[min(r)]["epoch"] for r in reports] == [1, 2, 2]
    monkeypatch.delenv(OOM_ABOVE)
    # Three at a time: trials 0-2 train while trial 3 is set up in the background, then trial 3.
    grouped, reports = run(cfgs, synthetic, pretrained, device_size=3)
    same_numbers(grouped, whole)
    assert [sorted(r) for r in reports] == [[0, 1, 2]] * 2 + [[3]] * 2


def evaluation_fails_once(monkeypatch, size: int) -> list:
    """A pack of `size` runs out of memory at its first evaluation; the list returned says whether it did."""
    original, failed = Pack.evaluate, []

    def evaluate(self, split):
        if len(self) == size and not failed:
            failed.append(True)
            raise torch.OutOfMemoryError(f"injected at a pack of {size}'s evaluation")
        return original(self, split)

    monkeypatch.setattr(Pack, "evaluate", evaluate)
    return failed


def test_a_pack_out_of_memory_at_its_evaluation_splits_and_its_halves_draw_the_next_epoch_as_it_would_have(
        pretrained, synthetic, monkeypatch):
    """The next epoch's batch orders are drawn while an epoch's steps run; an evaluation that fails after them
    hands the halves the streams as they were before that draw."""
    cfgs = [dataclasses.replace(c, epochs=2, eval_every=1) for c in (MIXED[0], MIXED[1], MIXED[5], MIXED[6])]
    synthetic = small_dev(synthetic)
    whole, _ = run(cfgs, synthetic, pretrained)
    failed = evaluation_fails_once(monkeypatch, size=4)  # the first one
    split, reports = run(cfgs, synthetic, pretrained)
    assert failed and [sorted(r) for r in reports] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    same_numbers(split, whole)


def test_a_pack_out_of_memory_while_it_is_set_up_splits_and_every_member_ends_as_it_would_have(
        pretrained, synthetic, whole, monkeypatch):
    """The set-up's own allocations can fail too: the first group's banks made on the card, or a later group's
    host memory made in the background while the group before trains. Nothing has trained; the halves are set
    up afresh, with the same draws."""
    cfgs, synthetic = SPLIT, small_dev(synthetic)
    original, failed = PackParts.set_up.__func__, []

    def set_up(cls, cfgs, *args, **kwargs):
        if fails(cfgs):
            failed.append(len(cfgs))
            raise torch.OutOfMemoryError(f"injected: a set-up of {len(cfgs)}")
        return original(cls, cfgs, *args, **kwargs)

    monkeypatch.setattr(PackParts, "set_up", classmethod(set_up))
    fails = lambda cfgs: len(cfgs) > 2  # noqa: E731  the one group of 4, set up where it trains
    split, reports = run(cfgs, synthetic, pretrained)
    assert failed == [4] and [sorted(r) for r in reports] == [[0, 1]] * 2 + [[2, 3]] * 2
    same_numbers(split, whole)
    failed.clear()
    # two groups of 2: the second, set up in the background while the first trains, does not fit
    fails = lambda cfgs: len(cfgs) > 1 and threading.current_thread().name.startswith("pack-setup")  # noqa: E731
    grouped, reports = run(cfgs, synthetic, pretrained, device_size=2, pack_id="g")
    assert failed == [2] and [sorted(r) for r in reports] == [[0, 1]] * 2 + [[2]] * 2 + [[3]] * 2
    same_numbers(grouped, whole)
    assert {r["pack_id"] for r in grouped} == {"g"}
    # the second group set up, then too large to move to the card: its parts, fresh (no streams yet), split
    monkeypatch.undo()
    original, failed = Pack.__init__, []

    def build(self, cfgs, data, pretrained, parts=None, device=None):
        if parts is not None and parts.rng_states is None and len(cfgs) > 1:
            failed.append(len(cfgs))
            raise torch.OutOfMemoryError(f"injected: moving a set-up group of {len(cfgs)} to the device")
        original(self, cfgs, data, pretrained, parts=parts, device=device)

    monkeypatch.setattr(Pack, "__init__", build)
    moved, reports = run(cfgs, synthetic, pretrained, device_size=2)
    assert failed == [2] and [sorted(r) for r in reports] == [[0, 1]] * 2 + [[2]] * 2 + [[3]] * 2
    same_numbers(moved, whole)


def test_a_step_runs_out_of_memory_before_its_update_or_fails_whole_never_taken_twice(
        pretrained, synthetic, whole, monkeypatch):
    """A step allocates what it needs before it updates the weights: an out-of-memory error up to there splits
    the pack, whose halves take the step once. One during the update itself (left partly done) fails the call,
    where its halves would have taken the step again from the partly updated weights."""
    synthetic = small_dev(synthetic)
    read, calls = RowGradient.read, []

    def reading(self):
        calls.append(self.table.shape[0])
        if self.table.shape[0] == 4 and len(calls) == 5:  # the pack of 4's fifth step (epoch 2's second)
            raise torch.OutOfMemoryError("injected: the rows the step read, listed before its update")
        return read(self)

    monkeypatch.setattr(RowGradient, "read", reading)
    split, reports = run(SPLIT, synthetic, pretrained)
    assert len(calls) > 5 and [sorted(r) for r in reports] == [[0, 1, 2, 3], [0, 1], [2, 3]]
    same_numbers(split, whole)
    monkeypatch.undo()
    update, steps = PackOptimizer.step, []

    def updating(self, coef):
        update(self, coef)
        steps.append(len(coef))
        if len(steps) == 5:
            raise torch.OutOfMemoryError("injected: a temporary of the update")

    monkeypatch.setattr(PackOptimizer, "step", updating)
    with pytest.raises(RuntimeError, match="ran out of memory while its weights were updated"):
        run(SPLIT, synthetic, pretrained)


def test_a_split_pack_keeps_the_seconds_of_the_steps_it_keeps(pretrained, synthetic, monkeypatch):
    """A member's train_seconds (whence its row's MFU) count the steps that made its numbers: those the whole
    pack took before an out-of-memory error (a share of each) as well as its half's."""
    # The engine's clock moves STEP a step and nowhere else, so that the seconds counted are the steps' alone: on a
    # wall clock the halves' own compute nearly made up the seconds of the steps before the split, and a defect
    # losing those missed the bound below by only 0.02 s, which a busy machine's slower steps would have made up.
    import trainables.fused as fused

    STEP, now = 0.25, [0.0]
    original = Pack.step

    def step(self, *args, **kwargs):
        now[0] += STEP
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Pack, "step", step)
    monkeypatch.setattr(fused, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    cfgs = [dataclasses.replace(c, epochs=2, eval_every=0) for c in SPLIT]  # 3 steps an epoch
    synthetic = small_dev(synthetic)
    monkeypatch.setenv(OOM_ABOVE, "2:4")  # the pack of 4's fifth step fails (it slept first), then halves of 2
    split, _ = run(cfgs, synthetic, pretrained)
    assert all(r["train_seconds"] >= 5 * STEP / 4 + 2 * STEP / 2 for r in split), [r["train_seconds"] for r in split]
    monkeypatch.delenv(OOM_ABOVE)
    failed = evaluation_fails_once(monkeypatch, size=4)  # the only one, the last, after all six steps
    split, _ = run(cfgs, synthetic, pretrained)
    assert failed and all(r["train_seconds"] >= 6 * STEP / 4 for r in split), [r["train_seconds"] for r in split]


def test_a_pack_resumed_from_its_checkpoint_ends_with_the_same_numbers(pretrained, synthetic, tmp_path, monkeypatch):
    cfgs = [dataclasses.replace(c, epochs=3, eval_every=1) for c in (MIXED[2], MIXED[3], MIXED[4])]
    synthetic, saved = small_dev(synthetic), []

    def save(state):  # written at once, as EpochCheckpoints does: training goes on changing the live tensors
        saved.append(tmp_path / f"state{len(saved)}")
        save_state(saved[-1], state)

    clean, _ = run(cfgs, synthetic, pretrained, save=save, pack_id="p")
    assert len(saved) == 2  # after epochs 1 and 2, none after the last
    resumed, reports = run(cfgs, synthetic, pretrained, resume=load_state(saved[0]))  # the checkpoint's pack id
    same_numbers(resumed, clean)
    assert {r["pack_id"] for r in resumed} == {"p"}
    assert [r[0]["epoch"] for r in reports] == [2, 3] and {r["resumed_from_epoch"] for r in resumed} == {1}
    assert resumed[0]["wall_seconds"] > reports[0][0]["train_seconds"]

    # A pack split by an out-of-memory error (at epoch 2's second step) checkpoints all its members: the
    # half that waits mid-epoch, and later the half that has already finished.
    monkeypatch.setenv(OOM_ABOVE, "2:4")
    saved.clear()
    run(cfgs, synthetic, pretrained, save=save, pack_id="p")
    monkeypatch.delenv(OOM_ABOVE)
    states = [load_state(path) for path in saved]
    assert [[(r["members"], r["epoch"], r["step"]) for r in s["runs"]] for s in states] == \
        [[([0, 1, 2], 2, 0)], [([0], 3, 0), ([1, 2], 2, 1)], [([1, 2], 3, 0)]]
    assert list(states[2]["finished"]) == [0]
    for state in states[1:]:
        resumed, reports = run(cfgs, synthetic, pretrained, resume=state, pack_id="p")
        same_numbers(resumed, clean)
        assert set().union(*reports) == {0, 1, 2}

    # A GPU's checkpoint (its banks padded: BANK_ALIGNMENT) resumed where no GPU is keeps its layout, and its
    # numbers: the same as the padded pack run through.
    import trainables.fused as fused

    monkeypatch.setattr(fused, "bank_alignment", lambda device: 3 * fused.BANK_ALIGNMENT)  # zeros between tensors
    saved.clear()
    padded, _ = run(cfgs, synthetic, pretrained, save=save, pack_id="p")
    monkeypatch.undo()
    state = load_state(saved[0])
    assert state["runs"][0]["align"] == 3 * fused.BANK_ALIGNMENT
    resumed, _ = run(cfgs, synthetic, pretrained, resume=state, pack_id="p")
    assert [r["train_loss"] for r in resumed] == [r["train_loss"] for r in padded]
    assert [r["weight_distance"] for r in resumed] == [r["weight_distance"] for r in padded]

    # A resumed pack that does not fit the device it lands on splits as it moves there, from its saved state
    original, failed = Pack.__init__, []

    def build(self, cfgs, data, pretrained, parts=None, device=None):
        if parts is not None and parts.rng_states is not None and len(cfgs) > 1 and not failed:
            failed.append(len(cfgs))
            raise torch.OutOfMemoryError("injected: moving a resumed pack to the device")
        original(self, cfgs, data, pretrained, parts=parts, device=device)

    monkeypatch.setattr(Pack, "__init__", build)
    halves, reports = run(cfgs, synthetic, pretrained, resume=load_state(saved[0]), pack_id="p")
    assert failed == [3] and [sorted(r) for r in reports] == [[0], [0], [1, 2], [1, 2]]
    assert [r["train_loss"] for r in halves] == pytest.approx([r["train_loss"] for r in padded], rel=1e-6)


def test_parts_of_a_pack_make_the_same_pack(quiet, synthetic):
    pack = Pack(MIXED[:3], synthetic, quiet)
    pack.train_epoch()
    rebuilt = Pack([MIXED[2], MIXED[0]], synthetic, quiet, parts=pack.parts().select([2, 0]))
    clone = Pack([MIXED[2], MIXED[0]], synthetic, quiet, parts=pack.parts().select([2, 0]))
    assert torch.equal(rebuilt.banks[1], pack.banks[1][[2, 0]])
    a, b = rebuilt.train_epoch()[0], pack.train_epoch()[0]
    np.testing.assert_allclose(a.numpy(), b[:, [2, 0]].numpy(), rtol=1e-5)
    assert isinstance(clone.parts(), PackParts)


def test_dropout_keeps_its_rate_and_a_trials_masks_see_neither_padding_nor_pack_mates():
    from types import SimpleNamespace

    from trainables.fused import Dropout

    def masks(seeds, tokens, width, step=3):
        drop = Dropout(seeds, hidden=0.1, attention=0.25, classifier=0.5, num_layers=2, device="cpu")
        drop.begin(step)
        x = torch.ones(len(seeds), tokens, 10)  # a hidden width that is not a multiple of 4
        hidden = drop.hidden(x, None)
        probs = torch.ones(len(seeds) * 2, 3, width, width)
        attention = drop.attention(probs, SimpleNamespace(lengths=torch.zeros(len(seeds), 2))).view(
            len(seeds), 2, 3, width, width)
        return hidden, attention, drop.classifier(torch.ones(len(seeds), 2, 10))

    hidden, attention, classifier = masks([7, 8], 700, 61)
    for mask, rate in ((hidden, 0.1), (attention, 0.25), (classifier, 0.5)):
        kept = (mask > 0).float().mean().item()
        assert mask.unique().tolist() == [0.0, pytest.approx(1 / (1 - rate))]
        assert abs(kept - (1 - rate)) < 4 * ((rate * (1 - rate) / mask.numel()) ** 0.5) + 1e-3, (rate, kept)
    assert not torch.equal(hidden[0], hidden[1]) and not torch.equal(attention[0], attention[1])
    alone, padded = masks([8], 650, 58), masks([5, 8], 700, 61)  # trial 8 alone, shorter; then second in a pack
    assert torch.equal(alone[0][0], padded[0][1, :650]) and torch.equal(alone[0][0], hidden[1, :650])
    assert torch.equal(alone[1][0], padded[1][1, :, :, :58, :58])
    assert torch.equal(alone[2][0], padded[2][1])
    assert not torch.equal(masks([8], 650, 58, step=4)[0], alone[0]), "each step draws anew"
    tiny = Dropout([7], hidden=1e-6, attention=0.0, classifier=0.0, num_layers=2, device="cpu")
    assert (tiny.hidden(torch.ones(1, 700, 10), None) > 0).all(), "a rate below 2^-17 keeps every element"


def test_the_last_layers_first_token_masks_are_the_rows_of_the_whole_ones():
    """The last layer runs on each sequence's first token alone; its dropout must be what the whole layer's
    would have been there."""
    from types import SimpleNamespace

    from trainables.fused import Dropout

    def drawn(first_only: bool):
        drop = Dropout([7, 8], hidden=0.1, attention=0.25, classifier=0.0, num_layers=1, device="cpu")
        drop.begin(5)
        batch, rows = SimpleNamespace(lengths=torch.zeros(2, 3)), torch.tensor([0, 4, 9, 50, 53, 60])
        embeddings = drop.hidden(torch.ones(2, 50, 10), batch)
        queries = 1 if first_only else 13
        attention = drop.attention(torch.ones(6, 4, queries, 13), batch)
        after = [drop.hidden(torch.ones(2, 3, 10), batch, rows) if first_only else
                 drop.hidden(torch.ones(2, 50, 10), batch).reshape(-1, 10)[rows].view(2, 3, 10) for _ in range(2)]
        return embeddings, attention, after

    (emb, first, after), (whole_emb, whole, whole_after) = drawn(True), drawn(False)
    assert torch.equal(emb, whole_emb) and torch.equal(first, whole[:, :, :1])
    assert all(torch.equal(a, b) for a, b in zip(after, whole_after)) and not torch.equal(after[0], after[1])
    assert (first == 0).any() and (after[0] == 0).any(), "the masks drop something"


def test_adamw_over_the_vocabulary_rows_the_data_touches_changes_no_number(quiet, synthetic, monkeypatch):
    """Without weight decay only the word rows of the trials' own tokens are stepped; the whole table stepped
    must give the very same bits (two learning rates: two groups of rows)."""
    import trainables.fused as fused

    cfgs = [dataclasses.replace(MIXED[i], weight_decay=0.0) for i in (0, 3, 7)]
    pack = Pack(cfgs, synthetic, quiet)
    rows = pack.optimizer.word_rows
    V = pack.layout.shapes["word"][0]
    assert rows is not None and len(rows) == 2 and sum(len(r) for r in rows.values()) < 3 * V / 2
    assert Pack([MIXED[0], cfgs[1]], synthetic, quiet).optimizer.word_rows is None, "decay moves every row"
    monkeypatch.setattr(fused, "vocabulary_rows", lambda pack: None)
    whole = Pack(cfgs, synthetic, quiet)
    for _ in range(2):
        pack.train_epoch(), whole.train_epoch()
    assert all(torch.equal(a, b) for a, b in zip(pack.banks, whole.banks))
    # the word rows' moments are kept by the optimizer between steps: a pack's state is read through parts()
    mine, theirs = pack.parts(), whole.parts()
    assert all(torch.equal(a, b) for a, b in zip(mine.exp_avg + mine.exp_avg_sq, theirs.exp_avg + theirs.exp_avg_sq))
    assert not torch.equal(pack.banks[0], Pack(cfgs, synthetic, quiet).banks[0]), "the word table did train"


def test_a_finished_or_split_pack_is_gone_before_the_next_one_is_built(quiet, synthetic, monkeypatch):
    """A Pack refers to itself through its encoder and optimizer, so dropping it frees nothing until the cycle
    collector runs. On an H100 a finished pack of 34 still held 58 GiB while the next group was set up and
    probed, which then ran out of memory at a pack of 1. With automatic collection off, as in a long step
    that allocates few Python objects, each group's pack must still be gone before the next one is built."""
    import gc
    import weakref

    built: list[weakref.ref] = []
    alive_at_build: list[int] = []
    original = Pack.__init__

    def watched(self, *args, **kwargs):
        alive_at_build.append(sum(ref() is not None for ref in built))
        frozen.append(gc.get_freeze_count())
        original(self, *args, **kwargs)
        built.append(weakref.ref(self))

    frozen: list[int] = []  # what lived before the call is left out of its collections, and only during it

    monkeypatch.setattr(Pack, "__init__", watched)
    cfgs = [dataclasses.replace(c, epochs=1) for c in (MIXED[0], MIXED[1], MIXED[5], MIXED[6])]
    synthetic = small_dev(synthetic)
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        run(cfgs, synthetic, quiet, device_size=2)  # two groups, one after the other
        grouped = list(alive_at_build)
        assert len(frozen) == 2 and min(frozen) > 1000 and gc.get_freeze_count() == 0
        gc.collect()  # the last group's pack: its call has ended, and the process moves on (see release_memory)
        built.clear(), alive_at_build.clear()
        monkeypatch.setenv(OOM_ABOVE, "2:1")  # a pack of 4 fails at its second step and splits into two
        run(cfgs, synthetic, quiet)
    finally:
        if was_enabled:
            gc.enable()
    assert grouped == [0, 0]
    assert len(built) == 3 and alive_at_build == [0, 0, 0]  # the pack of 4, then each half
    monkeypatch.setenv(OOM_ABOVE, "0:0")  # a group of 1 that runs out of memory: the call raises, and unfreezes
    with pytest.raises(torch.OutOfMemoryError):
        run(cfgs[:2], synthetic, quiet, device_size=1)
    assert gc.get_freeze_count() == 0
    monkeypatch.delenv(OOM_ABOVE)
    # A call of one group leaves its pack to the collector (a CPU trial's process moves on); a later call of
    # several groups in the same process (a reused trial actor) must not freeze it, nor build beside it.
    gc.collect()
    gc.disable()
    try:
        built.clear(), alive_at_build.clear()
        run(cfgs[:1], synthetic, quiet)
        run(cfgs[:2], synthetic, quiet, device_size=1)
    finally:
        if was_enabled:
            gc.enable()
    assert alive_at_build == [0, 0, 0]
    gc.freeze()  # someone else's freeze: the call leaves it as it found it
    try:
        run(cfgs[:2], synthetic, quiet, device_size=1)
        assert gc.get_freeze_count() > 1000  # not undone (some frozen objects were freed as the call went)
    finally:
        gc.unfreeze()


class Calls(TorchDispatchMode):
    """Every aten op a block dispatches, with its arguments."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func.overloadpacket, args))
        return func(*args, **(kwargs or {}))

    def count(self, op) -> int:
        return sum(f is op for f, _ in self.calls)


def test_a_gpu_group_is_probed_at_its_start_unless_one_as_large_trained_before_it():
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    fresh = PackRun(list(range(34)))
    assert needs_probe(gpu, fresh, probed=0) and needs_probe(gpu, fresh, probed=33)
    assert not needs_probe(gpu, fresh, probed=34) and not needs_probe(cpu, fresh, probed=0)
    assert needs_probe(gpu, PackRun(list(range(17))), probed=0)
    resumed = PackRun(list(range(4)), position=Position(epoch=2))
    assert not needs_probe(gpu, resumed, probed=0)


def test_host_copies_are_page_locked_only_where_the_host_can_spare_twice_their_size():
    available = host_memory_available()
    with open("/proc/meminfo") as meminfo:  # Linux reports MemAvailable; a container's limit may cut it
        assert 0 < available <= next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    assert worth_pinning(available // 2, available) and not worth_pinning(available // 2 + 1, available)
    assert not worth_pinning(0, available) and not worth_pinning(1, 0)


def test_a_containers_memory_limit_bounds_what_is_page_locked(tmp_path):
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True), v2.mkdir()
    (v2 / "memory.max").write_text("1000\n"), (v2 / "memory.current").write_text("300\n")
    assert cgroup_headroom(str(v2)) == 700
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_headroom(str(v2)) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (v1 / "memory" / "memory.usage_in_bytes").write_text("5")
    assert cgroup_headroom(str(v1)) is None  # v1's "no limit"
    (v1 / "memory" / "memory.limit_in_bytes").write_text("4")
    assert cgroup_headroom(str(v1)) == 0 and cgroup_headroom(str(tmp_path)) is None


def test_page_locked_memory_is_registered_unless_the_user_configured_torchs_allocator(monkeypatch):
    settings = pinned_allocator_settings({}, cores=16)
    assert settings == "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
    threads = lambda cores: int(pinned_allocator_settings({}, cores).rpartition(":")[2])  # noqa: E731
    assert [threads(c) for c in (1, 2, 4, 6, 12, 17, 64)] == [1, 1, 2, 2, 4, 8, 8]  # powers of two, at most 8
    assert pinned_allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, 16) is None
    assert pinned_allocator_settings({"PYTORCH_ALLOC_CONF": "pinned_use_cuda_host_register:False"}, 16) is None
    assert pinned_allocator_settings({"PYTORCH_ALLOC_CONF": ""}, 16) == settings
    assert pinned_allocator_settings({}, 16, configured="max_split_size_mb:512") is None  # set in-process: kept
    # applied to this process through torch's own setter, once. (A CPU build keeps the string and nothing
    # else; on a CUDA build the setting stays on after the test, as it would in a trial process.)
    before = torch._C._accelerator_getAllocatorSettings()
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    try:
        torch._C._accelerator_setAllocatorSettings("")
        register_pinned_pages.cache_clear()
        register_pinned_pages()
        cores = len(os.sched_getaffinity(0))
        assert torch._C._accelerator_getAllocatorSettings() == pinned_allocator_settings({}, cores)
        torch._C._accelerator_setAllocatorSettings("")
        register_pinned_pages()  # done already: nothing set again
        assert torch._C._accelerator_getAllocatorSettings() == ""
        torch._C._accelerator_setAllocatorSettings("max_split_size_mb:512")  # someone's own, in-process
        register_pinned_pages.cache_clear()
        register_pinned_pages()
        assert torch._C._accelerator_getAllocatorSettings() == "max_split_size_mb:512"
    finally:
        torch._C._accelerator_setAllocatorSettings(before)
        register_pinned_pages.cache_clear()

    def refused(settings):  # a torch without these settings: the pack goes on with CUDA's own allocation
        raise RuntimeError(f"Unrecognized key '{settings.partition(':')[0]}' in Accelerator allocator config.")

    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", refused)
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: "")
    try:
        with pytest.warns(UserWarning, match="allocated by CUDA, not registered: torch refused 'pinned_use_cuda"):
            register_pinned_pages()
    finally:
        register_pinned_pages.cache_clear()


def test_a_calls_groups_are_set_up_one_after_another_in_one_page_locked_buffer_it_holds(pretrained, synthetic,
                                                                                        monkeypatch):
    """torch.cuda.graph empties torch's page-locked cache as each recording begins: a group's banks left to it
    were freed in the group's own first epoch, and the next group's locked anew. A call holds one buffer
    (HostBanks) that each group's set-up writes into, and a group set up there holds exactly what a set-up in
    memory of its own holds."""
    from trainables import fused

    locked = []

    def page_locked(numel):  # what torch's page-locked allocator gives, counted (a CPU has none)
        locked.append(numel)
        return torch.empty(numel)

    monkeypatch.setattr(fused, "page_locked", page_locked)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU host's set-up, in host memory
    held = fused.HostBanks()
    groups = [[MIXED[i] for i in (0, 1, 2)], [MIXED[i] for i in (5, 6, 3)], [MIXED[i] for i in (4, 1, 0, 2)]]
    buffers = []
    for cfgs in groups:
        *_, banks, _ = set_up_pack(cfgs, synthetic, pretrained, "cpu", align=BANK_ALIGNMENT, pin=True, held=held)
        buffers.append((held.buffer.data_ptr(), held.buffer.numel()))
        assert all(b.untyped_storage().data_ptr() == held.buffer.untyped_storage().data_ptr() for b in banks)
        _, _, own, _ = set_up_pack(cfgs, synthetic, pretrained, "cpu", align=BANK_ALIGNMENT)
        assert all(torch.equal(a, b) for a, b in zip(banks, own)), "the group before's values are all overwritten"
    assert buffers[1] == buffers[0], "a group of the same size reuses the buffer"
    # the host reads the held buffer as taken memory: a group that fits in it goes there however little is free
    monkeypatch.setattr(fused, "host_memory_available", lambda: 0)
    *_, banks, _ = set_up_pack(groups[0], synthetic, pretrained, "cpu", align=BANK_ALIGNMENT, pin=True, held=held)
    assert banks[0].untyped_storage().data_ptr() == held.buffer.untyped_storage().data_ptr()
    *_, banks, _ = set_up_pack(groups[0], synthetic, pretrained, "cpu", align=BANK_ALIGNMENT, pin=True)
    assert banks[0].untyped_storage().data_ptr() != held.buffer.untyped_storage().data_ptr(), "else: pageable"
    assert buffers[2][1] > buffers[0][1], "a larger group gets a larger one"
    banks_locked = [n for n in locked if n in {numel for _, numel in buffers}]
    assert len(banks_locked) == 2, locked


def test_a_calls_page_locked_buffers_go_back_through_torchs_public_call_and_else_its_cuda_builds(monkeypatch):
    """`torch.accelerator.empty_host_cache` is public from torch 2.12 (install.sh pins 2.13): a GPU host calls it.
    A torch before it (the lent GPU machines' 2.11) has only the private binding of its CUDA builds."""
    from trainables import fused

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what runs on a GPU host, recorded
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("device"))
    monkeypatch.setattr(torch.accelerator, "empty_host_cache", lambda: calls.append("public"), raising=False)
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: calls.append("private"), raising=False)
    fused.release_memory(host_cache=True)
    assert calls == ["device", "public"]
    calls.clear()
    fused.release_memory()  # between the groups of a call the buffers stay, for the next group's set-up
    assert calls == ["device"]
    monkeypatch.delattr(torch.accelerator, "empty_host_cache")  # a torch before 2.12
    calls.clear()
    fused.release_memory(host_cache=True)
    assert calls == ["device", "private"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked host memory needs CUDA")
def test_groups_set_up_in_pinned_host_memory_train_as_pageable_ones_do(pretrained, synthetic, monkeypatch):
    cfgs = [dataclasses.replace(c, gpu_fraction=1.0) for c in (MIXED[0], MIXED[1], MIXED[5], MIXED[6])]
    pinned, _ = run(cfgs, synthetic, pretrained, device_size=2)
    monkeypatch.setattr("trainables.fused.worth_pinning", lambda nbytes, available: False)
    pageable, _ = run(cfgs, synthetic, pretrained, device_size=2)
    for a, b in zip(pinned, pageable):  # a GPU's atomic adds may sum in another order: near, not equal
        assert a["status"] == b["status"] == "ok"
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3)
        np.testing.assert_allclose(a["weight_distance"], b["weight_distance"], rtol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked host memory needs CUDA")
def test_a_group_set_up_for_a_gpu_in_pinned_host_memory_holds_what_a_pageable_one_holds(pretrained, synthetic):
    cfgs = [MIXED[i] for i in (0, 1, 2)]
    layout, _, banks, start = set_up_pack(cfgs, synthetic, pretrained, "cpu", align=BANK_ALIGNMENT)
    _, _, pinned, pinned_start = set_up_pack(cfgs, synthetic, pretrained, "cpu", align=BANK_ALIGNMENT, pin=True)
    assert all(b.is_pinned() and b.data_ptr() % (4 * BANK_ALIGNMENT) == 0 for b in pinned)
    assert all(torch.equal(a, b) for a, b in zip(banks, pinned))
    assert all(w.is_pinned() for own in pinned_start.own.values() for w in own.values())
    for name in start.own:
        assert torch.equal(pinned_start.stacked(name, 3, "cuda").cpu(), layout.view(banks, name))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bmm's float32 output needs a GPU")
def test_on_a_gpu_bf16_linear_gradients_land_in_the_float32_bank_unrounded():
    """On GPUs the bf16 products' float32 accumulators go straight into the float32 gradient bank's strided rows
    (benchmarks/gpu_linear_check.py times it): as exact as float64 from the same bf16 inputs, not rounded to
    bf16 on the way (about 1e-3), and nothing of the bank written outside the layer's own rows."""
    from trainables.fused import _Linear

    P, N, inner, out = 3, 9, 16, 8
    weight = torch.randn(P, out, inner, device="cuda").bfloat16()
    bias = torch.randn(P, out, device="cuda").bfloat16()
    bank = torch.full((P, out * inner + out + 4), float("nan"), device="cuda")
    grad_weight = bank[:, 2:2 + out * inner].view(P, out, inner)
    grad_bias = bank[:, 2 + out * inner:2 + out * inner + out]
    x = torch.randn(P, N, inner, device="cuda", requires_grad=True)
    grad = torch.randn(P, N, out, device="cuda")
    _Linear.apply(x, weight, bias, grad_weight, grad_bias).backward(grad)
    x64, grad64 = x.bfloat16().double(), grad.bfloat16().double()
    for got, expected in ((grad_weight, grad64.mT @ x64), (grad_bias, grad64.sum(1))):
        assert float((got.double() - expected).norm() / expected.norm()) < 1e-5
    assert bank[:, :2].isnan().all() and bank[:, -2:].isnan().all()


def test_a_gpu_step_casts_the_weights_once_and_sorts_no_activation_gradients(pretrained, synthetic):
    """Three things an H100's profile of a pack-of-34 step showed and that a CPU can only count: each weight and
    bias cast to bf16 on its own by a strided kernel; autograd's index_put, which sorts, for the gradients of
    the attention gathers (7.8 ms a step); the clipping multiply as a broadcast over the pack (18.4 ms)."""
    cfgs = [dataclasses.replace(MIXED[i], precision="bf16") for i in (0, 6, 1)]
    pack = Pack(cfgs, synthetic, pretrained)
    as_on_gpu(pack)
    batches, labels = pack.plan(pack.orders())
    pack.step(batches[0], labels[0])
    with Calls() as ops:
        pack.step(batches[1], labels[1])
    aten = torch.ops.aten
    bank = pack.banks[1].untyped_storage().data_ptr()
    reads = lambda args, storages: [a for a in args if isinstance(a, torch.Tensor)  # noqa: E731
                                    and a.untyped_storage().data_ptr() in storages]
    casts = [args for f, args in ops.calls if f in (aten._to_copy, aten.copy_) and args[0].dtype == torch.bfloat16
             and reads(args, {bank})]
    assert len(casts) == 1, f"bank 1 was read by {len(casts)} casts: one a step serves every linear layer"
    # No elementwise op reads or writes a view of a bank across the pack's trials: at BERT-base's width such a
    # view spans more than 2**31 bytes at packs of 8 or more, and CUDA splits the op into several kernels. The
    # small tensors (LayerNorms, the position and token-type tables, the biases) are read from contiguous copies,
    # one copy in and one out a step (PackEncoder.small); weights go to matrix products, which take any stride.
    banks = {t.untyped_storage().data_ptr() for t in (*pack.banks, *pack.grads, *pack.exp_avg, *pack.exp_avg_sq,
                                                      pack.encoder.low)}
    views = {"view", "_unsafe_view", "slice", "select", "unsqueeze", "transpose", "t", "expand", "as_strided",
             "alias", "permute", "detach"}
    spanning = [f for f, args in ops.calls  # index_select: the biases' gather, a kernel of its own, unsplit
                if f not in (aten.bmm, aten.baddbmm, aten._fused_adamw_, aten.copy_, aten.index_select)
                and str(f).removeprefix("aten.") not in views
                and any(a.dim() and a.shape[0] == len(cfgs) and a.stride(0) >= pack.layout.widths[1]
                        for a in reads(args, banks))]
    assert spanning == [aten.linalg_vector_norm] * 2, spanning  # the clipping norms: the bank's, the table's
    copies = [args for f, args in ops.calls if f is aten.copy_ and reads(args[1:], banks)]
    assert len(copies) == 2, "the cast, and the small tensors' copy"
    small_grad = pack.small_grad.untyped_storage().data_ptr()
    assert len([args for f, args in ops.calls if f is aten.copy_ and reads(args[1:], {small_grad})]) == 1
    assert all(not reads(args[:1], banks) for f, args in ops.calls if f is aten.baddbmm), "biases: contiguous"
    # left: the position and token-type tables, whose repeats carry real gradients
    assert ops.count(aten.index_put) + ops.count(aten.index_put_) + ops.count(aten._index_put_impl_) == 2
    assert ops.count(aten.index_add) >= 2 * LAYERS - 1  # index_select's backward
    assert ops.count(aten._foreach_mul_) == len(cfgs)


@pytest.mark.parametrize("bucketed", [False, True])
def test_a_batch_lays_every_sequence_out_as_pack_batch_says(synthetic, bucketed):
    split, rng = synthetic.train, np.random.default_rng(3)
    shortest = int(np.argmin(split.lengths))
    cases = [[np.array([shortest])], [np.array([0])], [np.array([shortest]), np.array([1])]]
    cases += [[rng.choice(len(split), B, replace=False) for _ in range(P)]
              for P, B in rng.integers(1, [6, 5], size=(20, 2)).tolist()]
    for rows in cases:
        P, B = len(rows), len(rows[0])
        a = batch_arrays(split, rows, pad_id=7, bucketed=bucketed)
        n, T = a["ids"].shape[1], a["keys"].shape[-1]
        assert a["lengths"].tolist() == [[int(split.lengths[r]) for r in trial] for trial in rows]
        real = np.zeros((P, n), dtype=bool)
        for p, trial in enumerate(rows):
            for b, r in enumerate(trial):
                tokens = slice(split.offsets[r], split.offsets[r + 1])
                L, start = len(split.input_ids[tokens]), a["first"][p * B + b] - p * n
                here = slice(start, start + L)
                assert a["ids"][p, here].tolist() == split.input_ids[tokens].tolist()
                assert a["types"][p, here].tolist() == split.token_type_ids[tokens].tolist()
                assert a["positions"][p, here].tolist() == list(range(L))
                slots = (p * B + b) * T + np.arange(T)
                assert a["gather"][slots[:L]].tolist() == list(range(p * n + start, p * n + start + L))
                assert ((a["gather"][slots[L:]] >= p * n) & (a["gather"][slots[L:]] < (p + 1) * n)).all()
                assert a["scatter"][p * n + start + np.arange(L)].tolist() == slots[:L].tolist()
                assert a["keys"][p * B + b, 0, 0].tolist() == [j < L for j in range(T)]
                real[p, here] = True
            assert (a["ids"][p][~real[p]] == 7).all()  # padding
            assert not a["positions"][p][~real[p]].any() and not a["types"][p][~real[p]].any()
            pads = a["scatter"][p * n + np.flatnonzero(~real[p])]
            assert ((pads >= p * B * T) & (pads < (p + 1) * B * T)).all()  # padding reads a slot of its own trial
        widest, most = int(a["lengths"].max()), int(a["lengths"].sum(1).max())
        assert (T, n) == ((bucket(widest), bucket(most)) if bucketed else (widest, most))
