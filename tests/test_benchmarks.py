"""The benchmarks' stand-ins, held to what they stand in for."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.torch_version.TorchVersion(torch.__version__) < (2, 13), reason="a copy of torch 2.13's")
def test_the_torch_2_13_draws_are_the_installed_torch_2_13s():
    """fused_bench --draws torch-2.13 times a user's set-up on a host whose torch draws otherwise (the lent GPU
    machines' 2.11): its copy must draw 2.13's very values and leave the generator where 2.13 does."""
    fused_bench = benchmark("fused_bench")
    for shape, seed in (((768, 768), 0), ((3072, 768), 1), ((37,), 2), ((5, 3), 3)):
        ours, theirs = torch.empty(shape), torch.empty(shape)
        g_ours, g_theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(2):
            fused_bench.torch_2_13_trunc_normal(ours, 0.0, 0.02, -0.04, 0.04, generator=g_ours)
            torch.nn.init.trunc_normal_(theirs, 0.0, 0.02, -0.04, 0.04, generator=g_theirs)
            assert torch.equal(ours, theirs), shape
        assert torch.equal(g_ours.get_state(), g_theirs.get_state()), shape
    with fused_bench.drawn_as("torch-2.13"):  # what nn.init.trunc_normal_ calls, looked up at each call
        assert torch.nn.init._no_grad_trunc_normal_ is fused_bench.torch_2_13_trunc_normal
    assert torch.nn.init._no_grad_trunc_normal_ is not fused_bench.torch_2_13_trunc_normal
    with pytest.raises(ValueError, match="over 30% of the mass"):
        fused_bench.torch_2_13_trunc_normal(torch.empty(4), 0.0, 1.0, 3.0, 4.0)


def test_the_torch_cache_arm_gives_each_group_a_fresh_page_locked_buffer(monkeypatch):
    """fused_bench --host-banks torch-cache: the engine as it was before a call held one buffer for its groups'
    banks (trainables.fused.HostBanks), for the next GPU session to time against."""
    from trainables import fused

    fused_bench = benchmark("fused_bench")
    locked = []
    monkeypatch.setattr(fused, "page_locked", lambda numel: locked.append(numel) or torch.empty(numel))
    held = fused.HostBanks()
    with fused_bench.banks_from("torch-cache"):
        first, second = held.take(64), held.take(64)
    assert len(locked) == 2 and first.data_ptr() != second.data_ptr()
    with fused_bench.banks_from("held"):
        first, second = held.take(64), held.take(48)
    assert len(locked) == 3 and first.data_ptr() == second.data_ptr()


def peer_result(command, **kwargs):
    """A peer process's last line, without the process."""
    return subprocess.CompletedProcess(command, 0, stdout=json.dumps({"wall_seconds": 1.0, "dev_accuracy": 0.5}))


def test_the_peer_on_a_gpu_gets_its_share_of_the_threads_and_our_card_alone(monkeypatch):
    """fused_bench's docstring gives each peer process threads/N threads, on a GPU too: it got one, for its
    surgery's draws and its model's build, against our 16. And it must see the one card our rows train on: with
    more, Trainer wraps the model in DataParallel and trains batches of 8 times their count."""
    fused_bench = benchmark("fused_bench")
    seen = []
    monkeypatch.setattr(fused_bench.subprocess, "run", lambda command, **kw: seen.append(
        (json.loads(command[command.index("--peer-trial") + 1]), kw["env"])) or peer_result(command))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    args = SimpleNamespace(device="cuda", threads=16, trials=4, data_dir="glue", size=500, epochs=5,
                           precision="bf16", draws="installed")
    fused_bench.time_peer(args, "model", 12, 4)
    assert [spec["threads"] for spec, _ in seen] == [4] * 4
    assert {(env["OMP_NUM_THREADS"], env["CUDA_VISIBLE_DEVICES"]) for _, env in seen} == {("4", "2")}


def test_the_peer_draws_its_classifier_head_from_the_trials_seed(tiny_bert, tmp_path, monkeypatch):
    """Trainer seeds once the model exists: a head drawn before that is the same in every trial of a run (a
    fresh process's generator), where run_glue, the script a user starts from, seeds before it loads the model."""
    import transformers

    fused_bench = benchmark("fused_bench")
    (tmp_path / "SST-2").mkdir()
    for split, n in (("train", 12), ("dev", 4)):
        rows = [f"a {'good ' * i}film\t{i % 2}" for i in range(n)]
        (tmp_path / "SST-2" / f"{split}.tsv").write_text("\n".join(["sentence\tlabel", *rows]) + "\n")
    heads = []

    class Received:  # the model as the Trainer receives it, nothing trained
        def __init__(self, model, **kwargs):
            heads.append(model.classifier.weight.detach().clone())

        def train(self):
            pass

        def evaluate(self):
            return {"eval_accuracy": 0.5}

    monkeypatch.setitem(transformers.__dict__, "Trainer", Received)  # not setattr: that imports the real one
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    spec = {"model_path": tiny_bert, "data_dir": str(tmp_path), "size": 8, "epochs": 1, "k": 4, "threads": 1,
            "device": "cpu", "precision": "fp32", "subset_seed": 0}
    for seed in (0, 1, 0):
        torch.manual_seed(1234)  # the generator as each trial's fresh process has it
        fused_bench.peer_trial({**spec, "seed": seed})
    assert torch.equal(heads[0], heads[2]) and not torch.equal(heads[0], heads[1])


def gpu_compare(fused_bench, monkeypatch, pretrained, data, fits: int, time_pack, **options) -> dict:
    """fused_bench's rows as a GPU run makes them on a card where `fits` trials fit, with `time_pack` in place of
    the packs' training and each peer row at once (no card here)."""
    from trainables import cost, fused

    monkeypatch.setattr(fused_bench, "fitting_trials", lambda pretrained: fits)
    monkeypatch.setattr(fused_bench, "time_pack", time_pack)
    monkeypatch.setattr(fused_bench, "time_peer", lambda args, path, layers, processes: (8.0, [0.5] * args.trials))
    monkeypatch.setattr(cost, "peak_flops", lambda device, precision: (1e12, "datasheet:test"))
    monkeypatch.setattr(fused, "release_memory", lambda *a, **kw: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 0)
    args = SimpleNamespace(device="cuda", trials=2, packs=[1], groups=2, group_size=None, size=16, epochs=1,
                           precision="bf16", threads=1, pairs=1, sweep=False, step_profile=False, op_by_op=False,
                           skip_unfused=True, peer_processes=[1], compare_func=False, out=None)
    for key, value in options.items():
        setattr(args, key, value)
    return fused_bench.compare(args, pretrained, data, "peer-model", "cuda:0", {})


def test_a_gpu_run_whose_groups_cannot_fit_skips_that_row_and_runs_the_peer(pretrained, synthetic, monkeypatch):
    """A pack size that cannot fit is skipped with its reason (the issue's ask), the --pack auto row's too: it
    ended the run, and the peer's rows after it were never timed."""
    fused_bench = benchmark("fused_bench")

    def time_pack(cfgs, data, pretrained, device_size=None):
        if len(cfgs) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return 1.0, [0.5], {}

    rows = gpu_compare(fused_bench, monkeypatch, pretrained, synthetic, 3, time_pack)
    assert rows["ours, --pack auto: 2 groups of 3, set up in the background"] == {
        "skipped": "OutOfMemoryError: CUDA out of memory. Tried to allocate 9.00 GiB"}
    assert rows["peer, HF Trainer, 1 processes at a time"]["seconds_per_trial"] == 4.0


def test_a_gpu_runs_pack_auto_row_holds_groups_as_the_engine_sizes_them(pretrained, synthetic, monkeypatch):
    """On a card that fits more than trainables.fused.MAX_GROUP trials, --pack auto trains groups of MAX_GROUP:
    the row said '2 groups of 80' over 160 trials, which the engine trained as 64, 64 and 32."""
    from trainables.fused import MAX_GROUP

    fused_bench = benchmark("fused_bench")
    timed = []

    def time_pack(cfgs, data, pretrained, device_size=None):
        timed.append(len(cfgs))
        return 1.0, [0.5] * len(cfgs), {}

    rows = gpu_compare(fused_bench, monkeypatch, pretrained, synthetic, MAX_GROUP + 16, time_pack)
    assert f"ours, --pack auto: 2 groups of {MAX_GROUP}, set up in the background" in rows
    assert timed == [1, 2 * MAX_GROUP]


def test_a_gpu_run_refuses_the_cpu_only_torch_func_step(pretrained, synthetic, monkeypatch):
    """--compare-func builds torch.func's models on the CPU, never on the card: with --device cuda its row set a
    CPU step against our pack's on the GPU. Refused before any row runs."""
    fused_bench = benchmark("fused_bench")
    timed = []
    with pytest.raises(SystemExit, match="--compare-func"):
        gpu_compare(fused_bench, monkeypatch, pretrained, synthetic, 3,
                    lambda cfgs, *a, **kw: timed.append(cfgs) or (1.0, [0.5] * len(cfgs), {}), compare_func=True)
    assert timed == []


def test_the_rows_flops_build_one_classifier_not_one_a_trial(pretrained, synthetic, monkeypatch):
    """Every trial of a run has the same FlopShape: building BERT-base's classifier for each of a GPU call's 102
    trials took 13 s (0.13 s each on this VM) before its first row."""
    from trainables import models

    fused_bench = benchmark("fused_bench")
    built = []
    build = models.build_classifier
    monkeypatch.setattr(models, "build_classifier", lambda *a, **kw: built.append(1) or build(*a, **kw))
    args = SimpleNamespace(size=16, epochs=1, precision="fp32", threads=1)
    figures = fused_bench.Figures(fused_bench.trial_configs(6, args, pretrained.num_layers, False), synthetic,
                                  pretrained, 1e12)
    assert len(built) == 1 and len(set(figures.flops)) > 1


def test_the_json_keeps_the_peak_the_rows_mfu_is_against(pretrained, synthetic, monkeypatch, tmp_path):
    """--out is written as each row lands, with the peak; main then wrote it once more at the end without the
    peak, so only a run cut short kept it."""
    fused_bench = benchmark("fused_bench")
    out = tmp_path / "rows.json"

    def gpu_mode(args):
        rows = gpu_compare(fused_bench, monkeypatch, pretrained, synthetic, 3,
                           lambda cfgs, *a, **kw: (1.0, [0.5] * len(cfgs), {}), out=str(out))
        return {"rows": rows}

    monkeypatch.setattr(fused_bench, "gpu_mode", gpu_mode)
    monkeypatch.setattr(sys, "argv", ["fused_bench.py", "--device", "cuda", "--threads",
                                      str(torch.get_num_threads()), "--out", str(out)])
    fused_bench.main()
    written = json.loads(out.read_text())
    assert written["peak_flops"] == 1e12 and written["rows"]["ours, fused pack of 1"]["mfu"] > 0


def test_each_pair_of_the_sweep_command_and_the_peer_records_wall_time_and_mfu(pretrained, synthetic, monkeypatch):
    """Every row records wall time and MFU: the --pairs rows held seconds per trial and a ratio alone."""
    fused_bench = benchmark("fused_bench")
    args = SimpleNamespace(size=16, epochs=1, precision="fp32", threads=1, trials=2, pairs=2)
    figures = fused_bench.Figures(fused_bench.trial_configs(2, args, pretrained.num_layers, False), synthetic,
                                  pretrained, 1e12)
    figures.add(fused_bench.SWEEP_ROW, 2, 20.0, [0.5, 0.5])
    figures.add(fused_bench.peer_row(len(os.sched_getaffinity(0))), 2, 40.0, [0.5, 0.5])
    monkeypatch.setattr(fused_bench, "time_sweep", lambda args: (10.0, [0.5, 0.5], {}))
    monkeypatch.setattr(fused_bench, "time_peer", lambda args, path, layers, processes: (30.0, [0.5, 0.5]))
    fused_bench.paired_runs(args, figures, "peer-model", pretrained.num_layers)
    pair = figures.rows["pair 2: the sweep command against the peer"]
    assert (pair["sweep_wall_seconds"], pair["peer_wall_seconds"]) == (10.0, 30.0)
    assert pair["sweep_mfu"] == pytest.approx(3 * pair["peer_mfu"]) and pair["peer_mfu"] > 0


def test_the_torch_func_step_of_compare_func_runs(pretrained, synthetic):
    """--compare-func's step (functional_call and vmap over the trials' stacked models) failed at its first step
    under transformers 5: from a 2-d attention mask the model asks whether any token is padding, data-dependent
    control flow that vmap refuses."""
    fused_bench = benchmark("fused_bench")
    args = SimpleNamespace(size=16, epochs=1, precision="fp32", threads=1)
    cfgs = fused_bench.trial_configs(2, args, pretrained.num_layers, False)
    assert fused_bench.func_step_seconds(cfgs, synthetic, pretrained, steps=1) > 0


# As on a lent GPU machine, which has torch and transformers but not these: find_spec finds none of them.
WITHOUT = """
import sys
class Without:
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"ray", "datasets", "optuna"}:
            return None
        return self.finder.find_spec(name, path, target) if hasattr(self.finder, "find_spec") else None
    def __getattr__(self, name):  # find_distributions: the packages' metadata
        return getattr(self.finder, name)
sys.meta_path[:] = [Without(f) for f in sys.meta_path]
"""


def test_the_gpu_calls_paths_run_without_ray_datasets_or_optuna(tiny_bert, tmp_path):
    """What a GPU call of fused_bench runs (its SST-2 read from the TSV files and tokenized, the rows' FLOPs, a
    fused pack, a peer trial), here on a CPU in a process where Ray, datasets and optuna cannot be imported."""
    (tmp_path / "SST-2").mkdir()
    for split, n in (("train", 24), ("dev", 8)):
        rows = [f"a {'good ' * i}film\t{i % 2}" for i in range(n)]
        (tmp_path / "SST-2" / f"{split}.tsv").write_text("\n".join(["sentence\tlabel", *rows]) + "\n")
    code = WITHOUT + f"""
import types
sys.path[:0] = [{str(BENCHMARKS.parent)!r}, {str(BENCHMARKS)!r}]
import fused_bench as fb
from transformers import AutoTokenizer
from trainables.models import load_pretrained
pretrained = load_pretrained({tiny_bert!r})
data = fb.sst2_task({str(tmp_path)!r}, AutoTokenizer.from_pretrained({tiny_bert!r}), "tiny")
cfgs = fb.trial_configs(2, types.SimpleNamespace(size=16, epochs=1, precision="fp32", threads=1), 4, False)
fb.Figures(cfgs, data, pretrained, 1e12)
fb.time_pack(cfgs, data, pretrained, device_size=2)
fb.peer_trial(dict(model_path={tiny_bert!r}, data_dir={str(tmp_path)!r}, size=16, epochs=1, subset_seed=0, seed=0, k=2,
                   threads=1, device="cpu", precision="fp32"))
print(sorted(m for m in ("ray", "datasets", "optuna") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_every_row_and_the_peer_train_the_trials_the_sweep_command_trains():
    # The --sweep row's command draws each trial index's seeds from the sweep's own stream, shared by its k's; the
    # other rows and the peer had trained subsets 0, 1, 2, ... (1.7% more tokens than the command at 4 trials)
    from sweep.experiments import EXPERIMENTS, GridSettings

    settings = GridSettings.of(model="m", tasks=("sst2",), sizes=(500,), k=(0, 1, 2, 3), trials=((0, 1),))
    command = sorted(EXPERIMENTS["incremental"].build(settings, 6, 6), key=lambda spec: spec.k)
    fused_bench, args = benchmark("fused_bench"), SimpleNamespace(size=500, epochs=5, precision="fp32", threads=1)
    assert [(c.ablation, c.subset_seed, c.seed) for c in fused_bench.trial_configs(4, args, 6, False)] == [
        (spec.ablation, spec.subset_seed, spec.seed) for spec in command]
    # past k = L, the next trial index: the paired design of the paper's grid
    (k, *seeds), = fused_bench.grid_trials(8, 6)[7:]
    assert k == 0 and seeds != [command[0].subset_seed, command[0].seed]
