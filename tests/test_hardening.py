"""Each fault a researcher's sweep can meet, triggered for real: refused before any work with a message that
names the option, the value and what to do, or landed as an honest row while the sweep goes on."""
from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest

from sweep.checks import gpu_problems
from sweep.cli import main, prepare_data
from sweep.config import RunSettings
from sweep.experiments import GridSettings
from trialrows.experiments import incremental
from trainables.ablations import Reinit
from trainables.tasks import load_task


def refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nothing listens there


def test_unreachable_address_is_refused_before_ray_starts(tiny_bert, tmp_path, capsys):
    port = free_port()
    err = refused(["incremental", "--model", tiny_bert, "--address", f"127.0.0.1:{port}",
                   "--storage", str(tmp_path)], capsys)
    assert f"--address: no Ray cluster answers at 127.0.0.1:{port}" in err and "ray start --head" in err
    err = refused(["incremental", "--model", tiny_bert, "--address", "headnode", "--storage", str(tmp_path)], capsys)
    assert "--address: 'headnode' is not HOST:PORT" in err
    assert not any(tmp_path.iterdir())


def test_bad_gpu_settings_are_refused_before_any_work(tiny_bert, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REINIT_SWEEP_CUDA_GRAPHS", "off")
    monkeypatch.setenv("REINIT_SWEEP_TRITON", "triton")
    err = refused(["incremental", "--model", tiny_bert, "--storage", str(tmp_path / "out")], capsys)
    assert "REINIT_SWEEP_CUDA_GRAPHS='off': allowed are 1 (steps replayed as CUDA graphs on GPUs, the default) " \
           "and 0 (every step run op by op)" in err
    assert "REINIT_SWEEP_TRITON='triton': allowed are 1 (Triton kernels on GPUs for the update and the dropout " \
           "masks, the default) and 0 (torch's ops alone)" in err
    assert not (tmp_path / "out").exists()


def test_unwritable_storage_is_refused(tiny_bert, tmp_path, capsys):
    blocker = tmp_path / "results.txt"
    blocker.write_text("a file where the results folder would go")
    err = refused(["incremental", "--model", tiny_bert, "--storage", str(blocker / "sweeps")], capsys)
    assert f"--storage: '{blocker / 'sweeps'}' cannot be created: {blocker} is a file" in err
    # /proc refuses new files even to root, which os.access would have let through.
    err = refused(["incremental", "--model", tiny_bert, "--storage", "/proc/reinit-results"], capsys)
    assert "--storage: '/proc/reinit-results' is not writable" in err


def test_data_dir_missing_a_task_or_a_split_is_refused(tiny_bert, glue_dir, tmp_path, capsys):
    local = tmp_path / "glue"
    (local / "SST-2").mkdir(parents=True)
    (local / "SST-2" / "train.tsv").write_bytes((glue_dir / "SST-2" / "train.tsv").read_bytes())
    err = refused(["incremental", "--model", tiny_bert, "--tasks", "sst2", "cola", "--data-dir", str(local),
                   "--storage", str(tmp_path / "out")], capsys)
    assert f"--data-dir: {local} has no SST-2/dev.tsv for task 'sst2'" in err
    assert f"has no CoLA/train.tsv or dev.tsv for task 'cola'; expected {local / 'CoLA' / 'train.tsv'}" in err
    err = refused(["incremental", "--model", tiny_bert, "--tasks", "sst2", "--data-dir", str(tmp_path / "none"),
                   "--storage", str(tmp_path / "out")], capsys)
    assert "--data-dir: " in err and "is not a folder" in err
    assert not (tmp_path / "out").exists()


def test_model_folder_without_weights_is_refused_with_one_line(tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    err = refused(["incremental", "--model", str(folder), "--storage", str(tmp_path / "out")], capsys)
    assert f"--model: '{folder}' cannot be loaded" in err and "holds no *.safetensors weights" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--gpus-per-trial", "1.5"], "--gpus-per-trial: 1.5 must be a share of one GPU in [0, 1]"),
    (["--gpus-per-trial", "-2"], "--gpus-per-trial: -2.0 must be a share of one GPU"),
    (["--lr", "inf"], "--lr: inf must be a positive finite number"),
    (["--sizes", "0"], "--sizes: 0 is not a positive number of training examples"),
    (["--block-size", "9"], "--block-size: 9 is outside 1..4"),
])
def test_bad_numbers_are_refused(tiny_bert, tmp_path, capsys, argv, message):
    assert message in refused(["localized", "--model", tiny_bert, "--storage", str(tmp_path), *argv], capsys)


def test_gpu_request_on_a_cluster_without_gpus_is_refused_before_any_trial(ray_local, tiny_bert, tmp_path, capsys):
    assert main(["incremental", "--model", tiny_bert, "--k", "0", "--trials", "1", "--sizes", "16",
                 "--gpus-per-trial", "0.5", "--storage", str(tmp_path)]) == 2
    assert "--gpus-per-trial: 0.5 asked, but this Ray cluster has no GPU" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.parquet"))


def test_an_autoscaler_that_brings_gpus_lets_a_gpu_sweep_wait_for_them(tmp_path):
    bootstrap = tmp_path / "ray_bootstrap_config.yaml"
    bootstrap.write_text((Path(__file__).resolve().parents[1] / "cluster.yaml").read_text())
    assert gpu_problems(0.25, {"CPU": 2.0}, str(bootstrap)) == []  # cluster.yaml's GPU workers start on demand
    bootstrap.write_text("available_node_types:\n  cpu: {resources: {CPU: 4}, max_workers: 3}\n")
    assert gpu_problems(0.25, {"CPU": 2.0}, str(bootstrap))
    assert gpu_problems(2, {"CPU": 2.0, "GPU": 1.0}, str(tmp_path / "none"))[0].startswith(
        "--gpus-per-trial: 2 asked, but this Ray cluster has 1 GPUs")
    assert gpu_problems(0, {"CPU": 2.0}) == []


def test_empty_files_name_the_file(tmp_path):
    sst = tmp_path / "SST-2"
    sst.mkdir()
    (sst / "train.tsv").write_text("")
    (sst / "dev.tsv").write_text("sentence\tlabel\ngood\t1\n")
    with pytest.raises(ValueError, match=f"{sst / 'train.tsv'}: the file is empty"):
        load_task("sst2", str(tmp_path))
    (sst / "train.tsv").write_text("sentence\tlabel\n")
    with pytest.raises(ValueError, match="train.tsv: the file holds no examples after its header"):
        load_task("sst2", str(tmp_path))
    cola = tmp_path / "CoLA"  # CoLA's files have no header line
    cola.mkdir()
    (cola / "train.tsv").write_text("")
    (cola / "dev.tsv").write_text("src\t1\t\tA sentence.\n")
    with pytest.raises(ValueError, match="CoLA/train.tsv: the file holds no examples$"):
        load_task("cola", str(tmp_path))


def test_failed_and_diverged_trials_land_as_rows_and_the_sweep_goes_on(ray_local, tiny_bert, tmp_path):
    from analysis.results import read_results
    from analysis.stats import summarize
    from sweep.runner import run_trials
    from trainables.models import load_pretrained

    settings = GridSettings.of(model=tiny_bert, tasks=("synthetic",), sizes=(32,), trials=((0, 1),), k=(4,), epochs=2)
    (ok,) = incremental(settings, num_layers=4)
    diverged = dataclasses.replace(ok, lr=float("inf"))
    broken = dataclasses.replace(ok, ablation=Reinit(layers=(9,)))  # a layer this 4-layer model lacks
    folder = tmp_path / "rows"
    run_trials([broken, diverged, ok], data=prepare_data(settings, [ok]),
               pretrained={tiny_bert: load_pretrained(tiny_bert)}, folder=folder, tune_dir=tmp_path,
               cpus_per_trial=1, gpus_per_trial=0, options=RunSettings(pack=1))  # each trial alone, unfused

    rows = read_results(folder).set_index("trial_id")
    assert len(rows) == 3
    assert rows.loc[ok.trial_id, "status"] == "ok" and rows.loc[ok.trial_id, "dev_metric"] >= 0
    assert rows.loc[diverged.trial_id, "status"] == "diverged"
    assert rows.loc[diverged.trial_id, "epochs_run"] == 1  # stopped after the first epoch
    assert rows.loc[diverged.trial_id, "dev_metrics_by_epoch"].size == 0  # a diverged model is not evaluated
    assert rows.loc[broken.trial_id, "status"] == "error"
    assert "reinit_layers [9] are outside 1..4" in rows.loc[broken.trial_id, "error"]

    # The analysis keeps the failed trials out of the means and says how many it left out (pooling the
    # settings this test changed to make them fail, which otherwise keep them three conditions).
    assert len(summarize(read_results(folder), ["task", "k"])) == 3
    (summary,) = summarize(read_results(folder), ["task", "k"], pooled=("lr", "reinit_layers")).to_dict("records")
    assert summary["n"] == 1 and summary["mean"] == rows.loc[ok.trial_id, "dev_metric"]
    assert summary["excluded"] == 2 and summary["diverged"] == 1 and summary["failed"] == 1


def test_a_subset_larger_than_the_train_split_is_refused_before_any_trial(tiny_bert, glue_dir, tmp_path, capsys,
                                                                          monkeypatch):
    import sweep.cli

    def no_ray(*_, **__):
        raise AssertionError("refused before Ray starts: nothing may reach sweep.cli.run")

    monkeypatch.setattr(sweep.cli, "run", no_ray)  # (another test's Ray may be up in this process)
    assert main(["incremental", "--model", tiny_bert, "--tasks", "sst2", "--data-dir", str(glue_dir), "--k", "0",
                 "--sizes", "100000", "--trials", "1", "--storage", str(tmp_path)]) == 2
    assert "--sizes: 100000 is larger than the sst2 train split (67,349 examples)" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.parquet"))


def test_unknown_experiment_names_the_choices(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["incremantal", "--storage", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice: 'incremantal'" in err
    assert "incremental" in err and "probing" in err and "lr-multipliers" in err
    assert not any(tmp_path.iterdir())


def test_a_hub_name_with_its_owner_is_not_taken_for_a_missing_folder(tmp_path, monkeypatch):
    """Most checkpoints of the supported families live under an owner on the hub (google/electra-*,
    microsoft/deberta-v3-*): the '/' in their names made them 'folders that do not exist'."""
    from trainables.models import resolve_model_path

    monkeypatch.chdir(tmp_path)
    for name in ("google/electra-small-discriminator", "microsoft/deberta-v3-base", "bert-base-uncased"):
        assert resolve_model_path(name) == name
    for missing in ("./no-such-model", str(tmp_path / "no-such-model"), "models/owner/name"):
        with pytest.raises(ValueError, match="looks like a folder but no such folder exists"):
            resolve_model_path(missing)
    (tmp_path / "owner" / "name").mkdir(parents=True)  # a local folder wins over the hub name it spells
    (tmp_path / "owner" / "name" / "model.safetensors").write_bytes(b"")
    assert resolve_model_path("owner/name") == str((tmp_path / "owner" / "name").resolve())
