"""What a trial costs and how it is reported (trainables.cost, sweep.estimate): FLOPs against torch's own count,
the peaks MFU is taken against, and the estimates made from a store's rows."""
from __future__ import annotations

import types

import pandas as pd
import pytest
import torch

from sweep import estimate
from tests.conftest import FAMILY_CONFIGS
from trainables.cost import flop_shape, peak_flops, sequence_flops

H100 = "NVIDIA H100 80GB HBM3"


def counted_by_torch(model, ids) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids).last_hidden_state.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("family", ["bert", "albert", "deberta-v2", "deberta-v3"])
def test_a_training_steps_flops_agree_with_torchs_count_in_every_family(family):
    from transformers import AutoConfig, AutoModel

    model_type, extra = {**FAMILY_CONFIGS, "albert": ("albert", {"embedding_size": 32})}[family]
    config = AutoConfig.for_model(model_type, vocab_size=100, hidden_size=64, num_hidden_layers=6,
                                  num_attention_heads=4, intermediate_size=256, max_position_embeddings=64, **extra)
    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    ids = torch.randint(1, 100, (3, 12))
    # ALBERT's one layer runs 6 times: counted once, its FLOPs came out 4.5x too few. DeBERTa's scores against
    # its position table, and that table's projections in every pass, had been left out: 2.1x too few here.
    for batch_size, passes in ((3, 1), (1, 3)):
        counted = sum(counted_by_torch(model, ids[i:i + batch_size]) for i in range(0, 3, batch_size))
        formula = sequence_flops([12] * 3, flop_shape(model), True, batch_size)
        assert formula == pytest.approx(counted, rel=0.08), passes


@pytest.mark.parametrize("name, peak, kind", [
    ("Tesla V100-SXM2-16GB", 15.7e12, "v100"), ("Tesla T4", 8.1e12, "t4"),  # fp32's, not fp16's 125 and 65
    ("NVIDIA L40", 181e12, None), ("NVIDIA L40S", 362e12, "l40s"), ("NVIDIA L4", 121e12, "l4")])
def test_each_card_is_measured_against_its_own_peak(monkeypatch, name, peak, kind):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops("cuda:0", "bf16")[0] == pytest.approx(peak, rel=0.1)
    assert estimate.device_kind(name) == kind  # an L40's rows are not an L4's
    if kind is not None:
        source = estimate.rate_for(kind, None, "m", cpus_per_trial=1).source
        assert f"data-sheet dense {'fp32' if kind in ('v100', 't4') else 'bf16'} peak" in source


def pack_rows(walls, finished="2026-11-24T00:10:00+0000") -> pd.DataFrame:
    """The rows of one fused pack of len(walls) trials on an H100, 1e14 FLOPs each."""
    n = len(walls)
    return pd.DataFrame({"trial_id": [f"t{i}" for i in range(n)], "status": ["ok"] * n, "model": ["m"] * n,
                         "device": [H100] * n, "model_flops": [1e14] * n, "wall_seconds": list(map(float, walls)),
                         "peak_flops": [989e12] * n, "pack_size": [n] * n, "pack_id": ["pack-a"] * n,
                         "task": ["sst2"] * n, "train_size": [500] * n, "epochs": [3] * n,
                         "finished_at": [finished] * n})


def test_a_pack_trained_in_two_groups_counts_its_wall_clock_once():
    # Two groups of two: the second group's rows carry the whole pack's 20 s, the first group's its own 10 s.
    rows = pack_rows([10, 10, 20, 20])
    mfu = estimate.measured_mfu(rows, "h100", "m")[0]
    assert mfu == pytest.approx(4e14 / 20 / 989e12)  # was 4 x 4e14 / 60 s: a third too fast


def test_what_a_running_sweep_has_left_counts_a_pack_as_one_slot():
    stored = pack_rows([100, 100, 100, 100])  # one pack of 4 on one GPU, 100 s
    trials = pd.DataFrame({"task": ["sst2"] * 4, "train_size": [500] * 4, "epochs": [3] * 4,
                           "state": ["not yet run"] * 4})
    line = estimate.remaining_line(trials, stored, "not yet run")
    assert "about 100 s on 1 slot " in line, line  # another pack of 4: not 25 s on 4 slots


def grid_specs(n: int = 2):
    from sweep.experiments import EXPERIMENTS, GridSettings

    settings = GridSettings.of(model="m", tasks=("synthetic",), sizes=(40,), trials=((0, 1),), epochs=1)
    return EXPERIMENTS["incremental"].build(settings, 4, 4)[:n], settings


def test_a_dry_run_takes_a_trials_flops_from_its_fingerprinted_row(monkeypatch):
    (spec,), settings = grid_specs(1)

    def counted_again(*args, **kwargs):
        raise AssertionError("the stored row was passed over: its FLOPs counted again from the data")

    monkeypatch.setattr(estimate, "local_data", counted_again)
    # a real run's row: its id hashes the data and weights, which a dry run does not read
    stored = pd.DataFrame({"trial_id": [spec.trial_id + "-fingerprinted"], "settings_id": [spec.trial_id],
                           "status": ["ok"], "model_flops": [123.0]})
    assert estimate.spec_flops([spec], settings, 4, stored) == ([123.0], "FLOPs from the store's rows")


def test_a_dry_run_prices_only_the_trials_a_rerun_would_run(monkeypatch, tmp_path):
    specs, settings = grid_specs(2)
    stored = pd.DataFrame({"trial_id": ["done-fingerprinted"], "settings_id": [specs[0].trial_id],
                           "status": ["ok"], "model_flops": [1e12]})
    monkeypatch.setattr(estimate, "stored_rows", lambda folder: stored)
    monkeypatch.setattr(estimate, "spec_flops", lambda specs, *a, **k: ([1e12, 2e12][:len(specs)], "counted"))
    args = types.SimpleNamespace(storage=str(tmp_path), estimate_for="h100", gpus_per_trial=0, cpus_per_trial=1)
    out = estimate.estimate_text(specs, settings, args, 4, tmp_path / "rows")
    assert "total (1 of 2 already done at these settings): 1 trials, 2e+12 FLOPs" in out, out


def test_trials_given_half_a_core_each_share_it():
    # 4 trials on 2 CPUs at 0.5 each run one thread apiece, two to a core: the same work as 2 at 1 CPU each.
    half = estimate.rate_for("cpu", None, "m", cpus_per_trial=0.5, cpus=2)
    whole = estimate.rate_for("cpu", None, "m", cpus_per_trial=1, cpus=2)
    flops = [1e14] * 4
    assert estimate.sweep_seconds(flops, half, started=True) == \
        pytest.approx(estimate.sweep_seconds(flops, whole, started=True), rel=0.02)  # was half of it
    assert estimate.device_hours(flops, half) == pytest.approx(estimate.device_hours(flops, whole), rel=0.02)


def test_a_dry_run_of_a_sweep_half_done_prices_the_rest(tiny_bert, tmp_path, monkeypatch, capsys):
    import sweep.cli
    from tests.test_status import fake_run

    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "0", "2",
            "--trials", "2", "--epochs", "1", "--storage", str(tmp_path), "--name", "sw", "--estimate-for", "h100"]
    monkeypatch.setattr(sweep.cli, "run", fake_run({}))  # rows as a real run lands them: fingerprinted ids
    monkeypatch.setattr(sweep.cli, "start_ray_if_none", lambda address: False)  # no trial runs on Ray here
    assert sweep.cli.main(argv) == 1  # ok, diverged, error; the fourth never ran
    capsys.readouterr()
    assert sweep.cli.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "total (2 of 4 already done at these settings): 2 trials" in out, out


# --- the peak of the precision a trial ran in -------------------------------------------------------------------

CPU_PEAKS = {"fp32": 150e9, "bf16": 50e9}  # measured stand-ins: told apart, and no matmul timed in a test


@pytest.fixture
def cpu_peaks(monkeypatch):
    """Each precision's CPU matmul peak as CPU_PEAKS says, with every cached peak forgotten before and after (a
    stand-in's figure must not outlive its test)."""
    from trainables import cost

    def forget():
        for module in (cost, estimate):
            for function in vars(module).values():
                if hasattr(function, "cache_clear"):
                    function.cache_clear()

    monkeypatch.setattr(cost, "_measured_cpu_matmul_flops", lambda precision="fp32", **_: CPU_PEAKS[precision])
    forget()
    yield CPU_PEAKS
    monkeypatch.undo()
    forget()


@pytest.mark.parametrize("name, precision, peak", [
    (H100, "bf16", 989e12), (H100, "fp32", 67e12),  # torch leaves TF32 off: fp32's non-tensor-core peak
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12), ("Tesla V100-SXM2-16GB", "bf16", 15.7e12)])  # no bf16 cores
def test_a_rows_mfu_is_taken_against_the_peak_of_its_precision_on_a_gpu(monkeypatch, cpu_peaks, name, precision,
                                                                         peak):
    from trainables.cost import cost_fields

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    row = cost_fields(1e15, 10.0, torch.device("cuda:0"), precision)
    assert row["peak_flops"] == pytest.approx(peak) and row["mfu"] == pytest.approx(1e14 / peak)
    assert row["device"] == name


def test_a_cpu_rows_peak_is_a_matmul_measured_in_its_precision(cpu_peaks):
    from trainables.cost import cost_fields

    for precision, peak in cpu_peaks.items():
        row = cost_fields(1e12, 10.0, torch.device("cpu"), precision)
        assert row["peak_flops"] == peak and row["mfu"] == pytest.approx(1e11 / peak), precision


def test_the_cpu_matmul_peak_is_measured_in_each_precision():
    from trainables.cost import cpu_matmul_flops

    # a real measurement, each in its own dtype (cheap: nine 512x512 products each)
    assert cpu_matmul_flops(1, "fp32") > 0 and cpu_matmul_flops(1, "bf16") > 0


def test_an_unfused_cpu_trial_in_bf16_is_measured_against_a_bf16_peak(cpu_peaks, pretrained, synthetic):
    from trainables.finetune import FinetuneConfig, finetune

    cfg = FinetuneConfig(task="synthetic", train_size=16, subset_seed=0, seed=0, epochs=1, precision="bf16")
    row = finetune(cfg, synthetic, pretrained)
    assert row["precision"] == "bf16" and row["peak_flops"] == cpu_peaks["bf16"]  # was fp32's
    assert row["mfu"] == pytest.approx(row["model_flops"] / (row["train_seconds"] + row["eval_seconds"]) / 50e9)


def test_a_fused_packs_rows_carry_the_peak_of_their_precision(cpu_peaks, pretrained, synthetic):
    from trainables.finetune import FinetuneConfig
    from trainables.fused import finetune_pack

    cfgs = [FinetuneConfig(task="synthetic", train_size=16, subset_seed=0, seed=s, epochs=1, precision="bf16")
            for s in (0, 1)]
    rows = finetune_pack(cfgs, synthetic, pretrained)
    assert [r["peak_flops"] for r in rows] == [cpu_peaks["bf16"]] * 2


def test_a_probe_in_bf16_is_measured_against_a_bf16_peak(cpu_peaks, pretrained, synthetic):
    from trainables.probing import ProbeConfig, probe_subset

    cfg = ProbeConfig(task="synthetic", train_size=20, subset_seed=0, seed=0, max_epochs=1, precision="bf16")
    (row,) = probe_subset(cfg, synthetic, pretrained, [("mean-pool", 1)])
    assert row["peak_flops"] == cpu_peaks["bf16"]


@pytest.mark.parametrize("flags, peak", [
    (["--precision", "fp32", "--estimate-for", "h100"], "67 TFLOP/s, H100's data-sheet dense fp32 peak"),
    (["--estimate-for", "h100"], "989 TFLOP/s, H100's data-sheet dense bf16 peak"),  # auto: bf16 on a GPU
    (["--precision", "bf16", "--estimate-for", "a100"], "312 TFLOP/s, A100's data-sheet dense bf16 peak"),
    (["--precision", "bf16"], "50 GFLOP/s bf16 matmul peak of 1 thread"),
    ([], "150 GFLOP/s fp32 matmul peak of 1 thread")])  # auto: fp32 on a CPU
def test_a_dry_run_prices_trials_at_the_peak_of_their_precision(cpu_peaks, tiny_bert, tmp_path, capsys, flags, peak):
    import sweep.cli

    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "0", "--trials", "1",
            "--epochs", "1", "--storage", str(tmp_path), "--dry-run", *flags]
    assert sweep.cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"cost on {flags[-1] if '--estimate-for' in flags else 'cpu'}: {peak}" in out, out


@pytest.mark.parametrize("pack, mfu", [("auto", "MFU 0.022, the stated default"),
                                       ("1", "MFU 0.0015, the stated default of unfused trials (--pack 1) on a GPU")])
def test_a_gpu_dry_run_of_unfused_trials_is_priced_at_their_own_default(cpu_peaks, tiny_bert, tmp_path, capsys,
                                                                        pack, mfu):
    # --pack 1 trains every trial unfused (0.001-0.002 of an H100 measured), and was priced at --pack auto's 0.022.
    import sweep.cli

    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--k", "0", "--trials", "1",
            "--epochs", "1", "--storage", str(tmp_path), "--dry-run", "--estimate-for", "h100", "--pack", pack]
    assert sweep.cli.main(argv) == 0
    assert mfu in capsys.readouterr().out


def test_a_rate_is_learned_from_rows_of_the_precision_it_prices():
    # bf16 and fp32 rows on one card are measured against different peaks: mixed, their MFU would mean nothing.
    rows = pd.DataFrame({"status": ["ok"] * 4, "model": ["m"] * 4, "device": ["NVIDIA H100 80GB HBM3"] * 4,
                         "precision": ["bf16", "bf16", "fp32", "fp32"], "model_flops": [1e15, 1e15, 1e14, 1e14],
                         "wall_seconds": [100.0, 100.0, 100.0, 100.0], "peak_flops": [989e12, 989e12, 67e12, 67e12]})
    assert estimate.measured_mfu(rows, "h100", "m", "bf16")[0] == pytest.approx(1e13 / 989e12)
    assert estimate.measured_mfu(rows, "h100", "m", "fp32")[0] == pytest.approx(1e12 / 67e12)
    assert estimate.measured_mfu(rows[rows["precision"] == "fp32"], "h100", "m", "bf16")[2] == 2, "else every row"
