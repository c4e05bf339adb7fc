"""The cost estimate (sweep.estimate): its arithmetic by hand, its FLOPs against what a trial counts, and what
a dry run prints."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from sweep.cli import main
from trainables.cost import cpu_peak
from sweep.estimate import (DEFAULT_MFU, DERIVED_FP32_GPU_MFU, PRIOR_ROWS, Rate, device_hours, device_kind,
                            measured_mfu, observed_slots, rate_for, schedule_seconds, sweep_seconds, trial_flops)


def test_the_estimates_arithmetic():
    rate = Rate("cpu", peak=100e9, mfu=0.25, slots=2, source="", startup=20.0, overhead=2.0, share=1)
    assert rate.trial_seconds(50e12) == pytest.approx(50e12 / 25e9 + 2)  # 2,002 s
    assert schedule_seconds([10, 10, 10], 2) == 20  # two at once, then the third
    assert schedule_seconds([30, 10, 10, 10], 2) == 30  # the short ones share the second slot
    assert schedule_seconds([5, 5, 5, 5, 5], 1) == 25
    flops = [2.5e12, 2.5e12, 2.5e12]  # 100 + 2 s each
    assert sweep_seconds(flops, rate) == 20 + 204
    assert sweep_seconds(flops, rate, started=True) == 204
    assert sweep_seconds([], rate) == 0
    assert device_hours(flops, rate) == pytest.approx(3 * 102 / 3600)
    gpu = rate_for("a100", None, "m", cpus_per_trial=1)
    assert gpu.peak == 312e12 and gpu.mfu == DEFAULT_MFU["gpu"] and gpu.slots == 1 and "stated default" in gpu.source
    # no per-trial actor start on GPUs: the MFU is measured over whole packs, setup and evaluation included
    assert gpu.trial_seconds(312e12) == pytest.approx(1 / DEFAULT_MFU["gpu"])
    # the paper's grid on an H100 at the default: about the 30.1 minutes projected from fused_bench's runs of
    # four groups (rounded toward the slower side)
    h100 = rate_for("h100", None, "m", cpus_per_trial=1)
    assert 30.1 <= 1950 * h100.trial_seconds(2.06e13) / 60 <= 31.5
    assert device_kind("NVIDIA A100-SXM4-80GB") == "a100" and device_kind("NVIDIA L40S") == "l40s"
    assert device_kind("NVIDIA L4") == "l4" and device_kind("cpu") == "cpu" and device_kind(None) is None


def test_mfu_comes_from_the_stores_finished_rows_on_that_device():
    rows = pd.DataFrame({
        "status": ["ok", "ok", "ok", "error", "ok", "ok"],
        "model": ["a", "a", "a", "a", "b", "a"],
        "device": ["cpu", "cpu", "cpu", "cpu", "cpu", "NVIDIA H100 80GB HBM3"],
        "model_flops": [1e12, 2e12, 3e12, 9e12, 1e12, 1e14],
        "wall_seconds": [100.0, 100.0, 100.0, 1.0, 10.0, 10.0],
        "peak_flops": [1e11, 1e11, 1e11, 1e11, 1e11, 989e12],
        "pack_size": [1, 1, 1, 1, 1, 4],
    })
    mfu, peak, n, which = measured_mfu(rows, "cpu", "a")
    assert (mfu, peak, n) == (pytest.approx(0.2), 1e11, 3)  # 6e12 FLOPs in 300 s over 1e11; the failed row left out
    assert measured_mfu(rows, "cpu", "c")[0] == pytest.approx(7e12 / 310 / 1e11)  # no row of c: every model's
    # A pack of 4 on one GPU: 4 x its share of FLOPs over the pack's wall clock.
    assert measured_mfu(rows, "h100", "a")[0] == pytest.approx(4e14 / (10 * 989e12))
    assert measured_mfu(rows, "a100", "a") is None
    # A dry run weighs those 3 rows' 0.2 against the default as 4 rows, and prices it at this CPU's peak now.
    rate = rate_for("cpu", rows, "a", cpus_per_trial=1, cpus=2)
    assert rate.mfu == pytest.approx((3 * 0.2 + PRIOR_ROWS * DEFAULT_MFU["cpu"]) / (3 + PRIOR_ROWS))
    assert rate.peak == cpu_peak(1, "fp32") and rate.slots == 2 and "over the wall seconds of the store's 3 finished" in rate.source
    many = pd.concat([rows.iloc[:3]] * 100, ignore_index=True)  # 300 rows: theirs, nearly
    assert rate_for("cpu", many, "a", cpus_per_trial=1, cpus=2).mfu == pytest.approx(0.2, abs=0.004)
    assert rate_for("cpu", None, "a", cpus_per_trial=1, cpus=2).mfu == DEFAULT_MFU["cpu"]
    # Three trials ran 0-100 s, 50-150 s, 60-160 s: three at once at 60-100 s; a fourth began as the first ended.
    spans = pd.DataFrame({"finished_at": ["2026-11-24T00:01:40+0000", "2026-11-24T00:02:30+0000",
                                          "2026-11-24T00:02:40+0000"], "wall_seconds": [100.0, 100.0, 100.0]})
    assert observed_slots(spans) == 3
    spans = pd.DataFrame({"finished_at": ["2026-11-24T00:01:40+0000", "2026-11-24T00:01:41+0000",
                                          "2026-11-24T00:03:20+0000"], "wall_seconds": [100.0, 100.0, 100.4]})
    assert observed_slots(spans) == 2


def test_a_trials_flops_are_counted_before_it_runs_exactly_as_it_counts_them(pretrained, synthetic, tiny_bert):
    from sweep.experiments import EXPERIMENTS, GridSettings
    from trainables.finetune import FinetuneConfig, finetune
    from sweep.estimate import model_shape

    settings = GridSettings.of(model=tiny_bert, tasks=("synthetic",), sizes=(40,), trials=((0, 2),), k=(2,),
                            epochs=2, eval_every=1, max_length=128)
    spec = EXPERIMENTS["incremental"].build(settings, 4, 4)[1]
    cfg = FinetuneConfig(task="synthetic", train_size=spec.train_size, subset_seed=spec.subset_seed, seed=spec.seed,
                         ablation=spec.ablation, epochs=spec.epochs, eval_every=spec.eval_every)
    measured = finetune(cfg, synthetic, pretrained)["model_flops"]
    data = {f"synthetic@{spec.max_length}": synthetic}
    assert trial_flops(spec, data, model_shape(tiny_bert, 4, synthetic.num_labels)) == pytest.approx(measured)
    # Without the data (a hub task in a dry run): typical lengths, the same order of magnitude.
    assert trial_flops(dataclasses.replace(spec, task="sst2"), None, model_shape(tiny_bert, 4, 2)) > 0


def test_a_dry_run_prints_each_trials_flops_and_the_cost_on_a_named_device(tiny_bert, tmp_path, capsys):
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "0", "4",
            "--epochs", "1", "--storage", str(tmp_path), "--dry-run"]
    assert main([*argv, "--trials", "2", "--estimate-for", "h100"]) == 0
    out = capsys.readouterr().out
    assert "cost on h100: 989 TFLOP/s, H100's data-sheet dense bf16 peak; MFU 0.022, the stated default" in out
    assert out.count("incremental-synthetic-n16-") == 4 and "GPU-hours" in out
    assert main([*argv, "--target-ci", "0.05", "--pilot-trials", "2", "--max-trials", "4"]) == 0
    out = capsys.readouterr().out
    assert "pilot stage (0 of 4 done): 4 trials" in out and "stage 2 at most (every condition to --max-trials): 4 trials" in out
    assert "stage 2 expected: not known for 2 of 2 conditions until their pilots are in" in out
    assert "core-hours" in out
    assert not any(tmp_path.iterdir()), "a dry run writes nothing"


@pytest.mark.parametrize("device, precision", [("h100", "fp32"), ("v100", "bf16")])
def test_an_fp32_gpu_estimate_without_rows_uses_a_default_derived_for_fp32(device, precision):
    # bf16's measured 0.022 of the fp32 peak had priced an fp32 H100 sweep at 15x bf16's time: the update's
    # memory traffic, most of a bf16 step, does not slow down with the matmuls
    fp32 = rate_for(device, None, "m", cpus_per_trial=1, precision=precision)
    assert fp32.mfu == DERIVED_FP32_GPU_MFU and "derived for fp32" in fp32.source
    bf16 = rate_for("h100", None, "m", cpus_per_trial=1, precision="bf16")
    assert bf16.mfu == DEFAULT_MFU["gpu"] and "stated default" in bf16.source
    if device == "h100":
        assert 3 < (bf16.mfu * bf16.peak) / (fp32.mfu * fp32.peak) < 7


def test_status_prices_a_cell_with_no_finished_row_by_its_own_size_and_epochs():
    from sweep.estimate import remaining_line

    # Two 500-example, 5-epoch trials ran side by side at 1e11 FLOP/s each; a 5k-example, 3-epoch one is left
    # (the paper's grid runs its small subsets first): 6x their work, not their mean.
    stored = pd.DataFrame({
        "trial_id": ["a", "b"], "status": ["ok", "ok"], "task": ["sst2"] * 2, "model": ["m"] * 2,
        "train_size": pd.array([500, 500], dtype="Int64"), "epochs": pd.array([5, 5], dtype="Int64"),
        "device": ["cpu"] * 2, "model_flops": [1e13, 1e13], "wall_seconds": [100.0, 100.0], "peak_flops": [2e11] * 2,
        "finished_at": ["2026-11-24T00:01:40+0000"] * 2})
    trials = pd.DataFrame({"trial_id": ["a", "b", "c", "d"], "task": ["sst2"] * 4, "train_size": [500, 500, 500, 5000],
                           "epochs": [5, 5, 5, 3], "state": ["ok", "ok", "not yet run", "not yet run"]})
    line = remaining_line(trials, stored, "not yet run")
    assert line.startswith("remaining: 2 trials not yet run (or running), about 10.0 min on 2 slots"), line


def test_a_squad_v2_trial_a_dry_run_cannot_read_is_priced_at_squad_windows_not_sentences(tiny_bert, monkeypatch):
    # Counted from 64 tokens a question (any unknown task's), a hub squad_v2 sweep was priced at a third of its
    # FLOPs: its questions come with their contexts, 170-odd tokens a window at 384.
    from pathlib import Path

    from sweep import estimate
    from sweep.experiments import EXPERIMENTS, GridSettings
    from sweep.grid import data_key
    from trainables.models import load_tokenizer
    from trainables.qa import tokenize_qa_task
    from trainables.tasks import load_squad

    folder = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2"
    if not (folder / "train-v2.0.json").exists():
        pytest.skip(f"the shared SQuAD 2.0 slices are not at {folder}")
    raw = load_squad(str(folder))
    raw = dataclasses.replace(raw, train=raw.train.select(range(0, len(raw.train), 16)))  # every article's questions
    tokenized = tokenize_qa_task(raw, load_tokenizer(tiny_bert), "tiny", 384)
    settings = GridSettings.of(model=tiny_bert, tasks=("squad_v2",), sizes=(200,), trials=((0, 1),), k=(2,), epochs=2,
                               max_length=384)
    spec = EXPERIMENTS["incremental"].build(settings, 4, 4)[0]
    shape = estimate.model_shape(tiny_bert, 4, 2)
    counted = trial_flops(spec, {data_key("squad_v2", 384): tokenized}, shape)
    monkeypatch.setitem(estimate.DEV_SIZES, "squad_v2", len(raw.validation))  # the slice's dev split, not the hub's
    assert 0.8 < trial_flops(spec, None, shape) / counted < 1.25, "typical lengths within 25% of a subset's own"
