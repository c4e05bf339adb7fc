"""Operations: a killed driver loses no finished trial, and a rerun (or `--resume`, continuing the trials from
their checkpoints) completes the sweep; a trial whose worker dies resumes from its checkpoint in an S3 bucket
to the same numbers. (Sweeps on multi-node clusters: tests/test_final_rows_cluster.py, tests/test_multinode.py.)"""
from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow.fs
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from analysis.results import read_results
from sweep.cli import main, parse_command_line
from sweep.experiments import EXPERIMENTS
from sweep.store import sweep_dir
from tests.commands import overridden
from trainables.data import tokenize_task
from trainables.finetune import finetune
from trainables.models import load_pretrained, load_tokenizer
from trainables.tasks import load_task
from tests.conftest import run_then_sigkill
from trainables.state import save_state
from trainables.tune_trainable import FAIL_AFTER_EPOCH, STATE_FILE, finetune_config


def sweep_argv(model: str, storage, name: str, *extra: str) -> list[str]:
    return overridden(["incremental", "--model", model, "--tasks", "synthetic", "--sizes", "48", "--epochs", "2",
                       "--storage", str(storage), "--name", name], extra)


def test_sigkilled_driver_then_rerun_finishes_with_each_trial_once(tiny_bert, tmp_path):
    argv = [sys.executable, "-m", "sweep", *sweep_argv(tiny_bert, tmp_path, "kill", "--trials", "2", "--k", "0", "2", "4")]
    rows = tmp_path / "kill" / "rows"
    run_then_sigkill(argv, ready=lambda: len(list(rows.glob("*.parquet"))) >= 2)
    before = {p.name: p.stat().st_mtime_ns for p in rows.glob("*.parquet")}
    assert 2 <= len(before) < 6, f"the kill should land mid-sweep; {len(before)} rows were written"
    # A row killed mid-write stays a hidden .tmp that readers skip; every visible file reads whole.
    assert len(read_results(rows)) == len(before)

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"{len(before)} already done, {6 - len(before)} to run" in rerun.stdout
    table = read_results(tmp_path / "kill")
    assert len(table) == 6 and table["trial_id"].is_unique and set(table["status"]) == {"ok"}
    assert {name: (rows / name).stat().st_mtime_ns for name in before} == before, "finished rows were rewritten"


def bucket_files(uri: str) -> dict[str, bytes]:
    """Every object under a URI, by its path below it."""
    fs, root = pyarrow.fs.FileSystem.from_uri(uri)
    found = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
    return {f.path[len(root) + 1:]: fs.open_input_file(f.path).readall() for f in found if f.is_file}


def test_trial_killed_mid_run_resumes_from_its_checkpoint_in_the_bucket_to_the_same_numbers(
        tiny_bert, s3_bucket, tmp_path, monkeypatch):
    # The trial's worker process dies right after epoch 2 (checkpointed, from the worker, to the bucket);
    # Tune restarts it from there. Set before this test's own Ray starts: its workers inherit it.
    monkeypatch.setenv(FAIL_AFTER_EPOCH, "2")
    argv = sweep_argv(tiny_bert, s3_bucket, "crash", "--trials", "1", "--k", "2", "--epochs", "4", "--eval-every", "1",
                      "--checkpoint-every", "0", "--max-failures", "1", "--pack", "1")  # unfused (packs: test_pack_checkpoints)
    assert main(argv) == 0
    sweep = sweep_dir(s3_bucket, "crash")
    table = read_results(sweep)
    assert len(table) == 1 and table.loc[0, "status"] == "ok"
    assert table.loc[0, "resumed_from_epoch"] == 2, "the trial must have gone on from its epoch-2 checkpoint"

    # The same trial, uninterrupted and without Ray, gives exactly the same numbers.
    [spec] = EXPERIMENTS["incremental"].build(parse_command_line(argv).grid, 4, 4)  # no fingerprints: a dry run's
    assert spec.trial_id == table.loc[0, "settings_id"]
    spec = dataclasses.replace(spec, data_fingerprint=table.loc[0, "data_fingerprint"],
                               model_fingerprint=table.loc[0, "model_fingerprint"])
    assert spec.trial_id == table.loc[0, "trial_id"]
    data = tokenize_task(load_task("synthetic"), load_tokenizer(tiny_bert), tiny_bert, 128)
    clean = finetune(finetune_config(spec.to_config(), gpu_fraction=0.0, threads=1), data, load_pretrained(tiny_bert))
    assert clean["resumed_from_epoch"] == 0
    assert list(table.loc[0, "dev_metrics_by_epoch"]) == clean["dev_metrics_by_epoch"]
    assert table.loc[0, "train_loss"] == clean["train_loss"]
    assert list(table.loc[0, "weight_distance"]) == clean["weight_distance"]

    # In the bucket: one row; the trial's checkpoints emptied once it was written (a note stays); TensorBoard
    # events of both attempts in the trial's one folder, all four epochs of loss, dev metric and lr.
    files = bucket_files(sweep)
    assert [f for f in files if f.startswith("rows/")] == [f"rows/{spec.trial_id}.parquet"]
    in_trial_folders = {f.split("/", 1)[1]: payload for f, payload in files.items()
                        if f.startswith("tune-") and f.count("/") >= 2}  # tune-*/<trial folder>/...
    assert {f.split("/", 1)[0] for f in in_trial_folders} == {spec.trial_id}
    mine = {f.split("/", 1)[1]: payload for f, payload in in_trial_folders.items()}
    assert {f.rsplit("/", 1)[1] for f in mine if f.startswith("checkpoint_")} == {"FINISHED"}
    logged = {}
    for name, payload in mine.items():
        if name.startswith("events.out.tfevents"):
            (tmp_path / name).write_bytes(payload)
            accumulator = EventAccumulator(str(tmp_path / name))
            accumulator.Reload()
            for tag in ("ray/tune/dev_metric", "ray/tune/train_loss", "ray/tune/lr_last"):
                logged.setdefault(tag, {}).update({e.step: e.value for e in accumulator.Scalars(tag)})
    assert all(sorted(steps) == [1, 2, 3, 4] for steps in logged.values()) and len(logged) == 3
    assert [logged["ray/tune/dev_metric"][e] for e in (1, 2, 3, 4)] == pytest.approx(clean["dev_metrics_by_epoch"])


def test_sigkilled_driver_then_resume_continues_trials_from_their_checkpoints(tiny_bert, tmp_path):
    argv = [sys.executable, "-m", "sweep", *sweep_argv(tiny_bert, tmp_path, "resume", "--trials", "1", "--k", "0", "4",
                                                      "--sizes", "200", "--epochs", "5", "--checkpoint-every", "0")]
    sweep = tmp_path / "resume"

    def mid_trial() -> bool:  # a trial has a checkpoint and no row yet
        rows = {p.stem for p in (sweep / "rows").glob("*.parquet")}
        return any(path.parts[-3] not in rows for path in sweep.glob(f"tune-*/*/checkpoint_*/{STATE_FILE}"))

    run_then_sigkill(argv, ready=mid_trial, poll=0.05)
    before = {p.name: p.read_bytes() for p in (sweep / "rows").glob("*.parquet")}
    assert len(before) < 2, "the kill should land mid-sweep"
    # A planted tuner.pkl, as anyone who can write to the store could plant: a resume never unpickles it.
    planted = tmp_path / "ran"
    for experiment in sweep.glob("tune-*"):
        (experiment / "tuner.pkl").write_bytes(pickle.dumps(Planted(str(planted))))

    resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{len(before)} already done, {2 - len(before)} to run" in resumed.stdout
    assert "--resume: each unfinished trial goes on from the newest checkpoint" in resumed.stdout
    assert not planted.exists(), "a resume unpickled the store's Tune state"
    table = read_results(sweep)
    assert len(table) == 2 and table["trial_id"].is_unique and set(table["status"]) == {"ok"}
    assert (table["resumed_from_epoch"] >= 1).any(), "an interrupted trial must go on from its checkpoint"
    assert {p.name: p.read_bytes() for p in (sweep / "rows").glob("*.parquet") if p.name in before} == before
    assert not list(sweep.glob(f"tune-*/*/checkpoint_*/{STATE_FILE}")), "finished trials keep no weights"

    again = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "2 already done, 0 to run" in again.stdout


class Planted:
    """A pickle that, once loaded, leaves a file behind: what a payload in the store would do."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path(self.path).write_text, ("a resume unpickled the store",))


def test_checkpoint_frequency_is_a_setting():
    from trainables.tune_trainable import EpochCheckpoints

    def epochs_checkpointed(every) -> list[int]:
        saved = []

        def to_tune(result, checkpoint=None):  # stands in for tune.report; the folder exists while it runs
            if checkpoint is not None and (Path(checkpoint.path) / STATE_FILE).is_file():
                saved.append(result["epoch"])

        checkpoints = EpochCheckpoints(every, to_tune)
        for epoch in (1, 2, 3):
            checkpoints.save({"epoch": epoch})
            checkpoints.report({"epoch": epoch})
        return saved

    assert epochs_checkpointed(0) == [1, 2, 3]
    assert epochs_checkpointed(None) == [] and epochs_checkpointed(3600) == []
    assert parse_command_line(["incremental"]).run.checkpoint_every == 900
    assert parse_command_line(["incremental", "--checkpoint-every", "off"]).run.checkpoint_every is None


def test_a_recorded_checkpoint_deleted_since_falls_back_to_the_newest_surviving_one(tmp_path):
    from ray import tune

    from trainables.tune_trainable import load_state

    trial = tmp_path / "trial"
    for index, epoch in ((1, 2), (2, 3)):  # Tune kept the last two; checkpoint_000000 (epoch 1) is gone
        save_state(trial / f"checkpoint_00000{index}", {"epoch": epoch})
    (trial / "checkpoint_000003").mkdir()
    (trial / "checkpoint_000003" / "FINISHED").write_text("a note, no weights")
    assert load_state(tune.Checkpoint(str(trial / "checkpoint_000000"))) == {"epoch": 3}
    assert load_state(tune.Checkpoint(str(trial / "checkpoint_000001"))) == {"epoch": 2}  # it exists: use it
    (trial / "checkpoint_000001" / STATE_FILE).unlink()
    (trial / "checkpoint_000002" / STATE_FILE).unlink()
    assert load_state(tune.Checkpoint(str(trial / "checkpoint_000000"))) is None  # a finished trial's notes


def test_a_checkpoint_cut_short_is_passed_over_for_the_one_before_it(tmp_path, capsys):
    """A node or driver killed while Tune copied a checkpoint to the storage can leave its state's marker with
    its tensors cut short: a resumed trial names it and goes on from the checkpoint before it."""
    import torch
    from ray import tune

    from trainables.state import TENSORS_FILE
    from trainables.tune_trainable import load_state

    trial = tmp_path / "trial"
    for index, epoch in ((1, 2), (2, 3)):
        save_state(trial / f"checkpoint_00000{index}", {"epoch": epoch, "weights": torch.full((256,), float(epoch))})
    cut = trial / "checkpoint_000002" / TENSORS_FILE
    cut.write_bytes(cut.read_bytes()[:200])
    state = load_state(tune.Checkpoint(str(trial / "checkpoint_000002")))
    assert state["epoch"] == 2 and torch.equal(state["weights"], torch.full((256,), 2.0))
    assert "checkpoint_000002 cannot be read" in capsys.readouterr().err
    cut.unlink()  # the marker copied, the tensors not yet
    assert load_state(tune.Checkpoint(str(trial / "checkpoint_000002")))["epoch"] == 2
    (trial / "checkpoint_000001" / TENSORS_FILE).write_bytes(b"")
    assert load_state(tune.Checkpoint(str(trial / "checkpoint_000002"))) is None  # none whole: a fresh start
