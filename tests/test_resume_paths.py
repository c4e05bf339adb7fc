"""Resuming a trial: an unfused trial resumed ends with every number of an uninterrupted one but its timings;
the Tune trainable finds the state to go on from (across a sweep's runs, in a bucket, from another --pack) and
reports each epoch as its step; a checkpoint holds each entry as it went in, and a CPU trial's none of a GPU's."""
from __future__ import annotations

import pytest

from tests.conftest import save_tiny_bert
from trainables.ablations import Reinit
from trainables.finetune import FinetuneConfig, finetune
from trainables.state import load_state, save_state

# Measured, so never equal across two runs; and the one column that says a run was resumed.
TIMINGS = {"train_seconds", "eval_seconds", "wall_seconds", "mfu", "hfu", "resumed_from_epoch"}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 2-layer model and the synthetic task at 32 tokens: a trial of a few steps takes well under a second."""
    from trainables.data import tokenize_task
    from trainables.models import load_pretrained, load_tokenizer
    from trainables.tasks import load_task

    folder = str(save_tiny_bert(tmp_path_factory.mktemp("resume-review"), num_layers=2, hidden=32))
    return load_pretrained(folder), tokenize_task(load_task("synthetic"), load_tokenizer(folder), "small", 32), folder


def clean_and_resumed(cfg, data, pretrained, tmp_path, **options):
    """(the uninterrupted run's last figures, the figures of a run resumed from each of its checkpoints)."""
    saved = []

    def save(state: dict) -> None:
        saved.append(tmp_path / f"state{len(saved)}")
        save_state(saved[-1], state)

    clean = finetune(cfg, data, pretrained, save=save, **options)
    assert saved, "the run saved no state"
    return clean, [finetune(cfg, data, pretrained, resume=load_state(path), **options) for path in saved]


def differences(clean: dict, resumed: dict) -> dict:
    return {k: (clean.get(k), resumed.get(k)) for k in clean.keys() | resumed.keys()
            if k not in TIMINGS and clean.get(k) != resumed.get(k)}


def test_a_resumed_sequential_trial_measures_weight_change_from_the_final_tasks_start(small, tmp_path):
    pretrained, data, _ = small
    cfg = FinetuneConfig(task="synthetic", train_size=24, subset_seed=2, seed=2, epochs=3,
                         intermediate_task="synthetic", ablation=Reinit(layers=(2,)))
    clean, resumed = clean_and_resumed(cfg, data, pretrained, tmp_path, intermediate=data)
    # the intermediate round's epochs 1 and 2 (it goes on in that round, then the final task from its start),
    # counted back from the final task's start, then the final task's: a row of 0 was never restarted
    assert [run["resumed_from_epoch"] for run in resumed] == [-2, -1, 1, 2]
    for run in resumed:
        assert differences(clean, run) == {}


class FakeTune:
    """What finetune_trainable calls of `ray.tune`, numbering reports as Tune's Trainable.train does: its own
    count from 1 in a new experiment, unless the report names its `training_iteration`."""

    def __init__(self):
        self.reports: list[dict] = []

    def get_context(self):
        resources = type("Resources", (), {"required_resources": {"CPU": 1}})()
        return type("Context", (), {"get_trial_resources": lambda _: resources})()

    def get_checkpoint(self):
        return None  # a new experiment's trial: what it goes on from is found under `resume_from`

    def report(self, metrics: dict, checkpoint=None) -> None:
        self.reports.append({**metrics, "training_iteration": metrics.get("training_iteration",
                                                                          len(self.reports) + 1)})


def sweep_trial(model_folder: str, *options: str) -> dict:
    from sweep.cli import parse_command_line
    from sweep.experiments import EXPERIMENTS

    argv = ["incremental", "--model", model_folder, "--tasks", "synthetic", "--sizes", "24", "--k", "1",
            "--trials", "1", "--epochs", "3", "--max-length", "32", "--pack", "1", *options]
    [spec] = EXPERIMENTS["incremental"].build(parse_command_line(argv).grid, 2, 4)
    return spec.to_config()


def run_trainable(trial: dict, data, pretrained, monkeypatch, **options) -> list[dict]:
    """`finetune_trainable` on one trial outside Ray; what it reported to Tune."""
    import sys

    from ray import tune

    from trainables.tune_trainable import finetune_trainable

    fake = FakeTune()
    for name in ("get_context", "get_checkpoint", "report"):
        monkeypatch.setattr(tune, name, getattr(fake, name))
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # the trainable sets its own
    finetune_trainable({"trial": trial}, {trial["data_key"]: data}, {trial["model_key"]: pretrained}, **options)
    return fake.reports


def test_a_trial_resumed_in_a_new_experiment_reports_each_epoch_as_its_training_iteration(
        small, tmp_path, monkeypatch):
    from trainables.tune_trainable import finetune_config

    pretrained, data, folder = small
    trial = sweep_trial(folder, "--eval-every", "1")
    saved = tmp_path / "store" / "tune-20261128-000000-000000" / trial["trial_id"] / "checkpoint_000000"
    finetune(finetune_config(trial, gpu_fraction=0.0, threads=1), data, pretrained,
             save=lambda state: state["epoch"] == 1 and save_state(saved, state))
    reports = run_trainable(trial, data, pretrained, monkeypatch, resume_from=str(tmp_path / "store"))
    assert [(r["epoch"], r["training_iteration"]) for r in reports] == [(2, 2), (3, 3)]


def test_a_resume_passes_over_a_checkpoint_cut_short_for_the_one_an_earlier_run_left(small, tmp_path, monkeypatch):
    """The first run checkpointed epoch 1; a resumed run went on from it and was killed while its epoch-2
    checkpoint was copied to the storage (its tensors cut short). A second resume goes on from epoch 1, the one
    before it, not from scratch."""
    from trainables.state import TENSORS_FILE
    from trainables.tune_trainable import finetune_config

    pretrained, data, folder = small
    trial = sweep_trial(folder)
    first, second = (tmp_path / "store" / f"tune-20261128-00000{i}-000000" / trial["trial_id"] for i in (1, 2))

    def save(state: dict) -> None:
        save_state((first if state["epoch"] == 1 else second) / "checkpoint_000000", state)

    clean = finetune(finetune_config(trial, gpu_fraction=0.0, threads=1), data, pretrained, save=save)
    cut = second / "checkpoint_000000" / TENSORS_FILE
    cut.write_bytes(cut.read_bytes()[:300])
    reports = run_trainable(trial, data, pretrained, monkeypatch, resume_from=str(tmp_path / "store"))
    assert [r["epoch"] for r in reports] == [2, 3] and reports[-1]["resumed_from_epoch"] == 1
    assert reports[-1]["train_loss"] == clean["train_loss"]


def test_a_recorded_checkpoint_deleted_since_from_a_bucket_falls_back_too(s3_bucket, tmp_path):
    """In a bucket, as in a local folder, a checkpoint Tune's record names but that is gone since gives way to
    the newest surviving one (a bucket's copy of a missing folder raised instead)."""
    import pyarrow.fs
    from ray import tune

    from trainables.tune_trainable import load_state

    fs, root = pyarrow.fs.FileSystem.from_uri(s3_bucket)
    save_state(tmp_path / "saved", {"epoch": 2})
    pyarrow.fs.copy_files(str(tmp_path / "saved"), f"{root}/trial/checkpoint_000001", destination_filesystem=fs)
    assert load_state(tune.Checkpoint(f"{root}/trial/checkpoint_000000", filesystem=fs)) == {"epoch": 2}


def test_entries_whose_paths_coincide_come_back_each_as_it_went_in(tmp_path):
    import torch

    state = {"a/b": torch.zeros(2), "a": {"b": torch.ones(2)}, "a/b#1": torch.full((2,), 2.0)}
    save_state(tmp_path / "s", state)
    back = load_state(tmp_path / "s")
    assert [back["a/b"].tolist(), back["a"]["b"].tolist(), back["a/b#1"].tolist()] == [[0, 0], [1, 1], [2, 2]]


def fused_alone_checkpoint(trial: dict, data, pretrained, store) -> None:
    """What a run with `--pack auto` on CPUs leaves: the trial trained as a pack of one, named by the trial
    (sweep.packs.pack_config), its first checkpoint in `store`'s first run."""
    from trainables.fused import finetune_pack
    from trainables.tune_trainable import finetune_config

    saved = store / "tune-20261128-000000-000000" / trial["trial_id"] / "checkpoint_000000"
    finetune_pack([finetune_config(trial, gpu_fraction=0.0, threads=1)], data, pretrained, pack_id=trial["trial_id"],
                  save=lambda state: saved.exists() or save_state(saved, {**state, "trial_ids": [trial["trial_id"]]}))
    assert saved.is_dir()


def test_a_trial_resumed_unfused_where_an_earlier_run_fused_it_alone_starts_over(small, tmp_path, monkeypatch):
    """A sweep first run with `--pack auto` and resumed with `--pack 1` finds the pack's checkpoint under the
    trial's id: not a state this trainable can go on from. The trial starts over, as a pack does from a state
    not its own, instead of failing."""
    pretrained, data, folder = small
    trial = sweep_trial(folder)
    fused_alone_checkpoint(trial, data, pretrained, tmp_path / "store")
    reports = run_trainable(trial, data, pretrained, monkeypatch, resume_from=str(tmp_path / "store"))
    assert [r["epoch"] for r in reports] == [1, 2, 3] and reports[-1]["resumed_from_epoch"] == 0


def test_a_pack_of_one_resumed_in_a_new_experiment_reports_each_epoch_as_its_training_iteration(
        small, tmp_path, monkeypatch):
    from sweep.packs import pack_config

    pretrained, data, folder = small
    trial = sweep_trial(folder)
    fused_alone_checkpoint(trial, data, pretrained, tmp_path / "store")
    reports = run_trainable(pack_config([trial]), data, pretrained, monkeypatch, resume_from=str(tmp_path / "store"))
    assert [(r["epoch"], r["training_iteration"]) for r in reports] == [(2, 2), (3, 3)]


def test_a_cpu_trial_on_a_gpu_node_checkpoints_without_touching_the_gpus(small, tmp_path, monkeypatch):
    """Ray leaves CUDA_VISIBLE_DEVICES alone for a trial given no GPU share, so a CPU trial on a GPU node sees
    every card: reading their random streams for its checkpoint would open a CUDA context on each."""
    import torch

    def touched():
        raise AssertionError("a CPU trial read the GPUs' random streams")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", touched)
    pretrained, data, _ = small
    cfg = FinetuneConfig(task="synthetic", train_size=24, subset_seed=2, seed=2, epochs=2)
    clean, [resumed] = clean_and_resumed(cfg, data, pretrained, tmp_path)
    assert differences(clean, resumed) == {}
