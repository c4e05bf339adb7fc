"""A fused pack in a real sweep whose worker dies mid-run goes on from its checkpoint to the same numbers (its
own module: the fault injection must be in the environment before this module's Ray starts its workers)."""
from __future__ import annotations

import dataclasses

from analysis.results import read_results
from sweep.cli import main, parse_command_line
from sweep.experiments import EXPERIMENTS
from trainables.data import tokenize_task
from trainables.fused import finetune_pack
from trainables.models import load_pretrained, load_tokenizer
from trainables.tasks import load_task
from trainables.tune_trainable import FAIL_AFTER_EPOCH, finetune_config


def test_a_pack_killed_mid_run_resumes_from_its_checkpoint_to_the_same_numbers(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_AFTER_EPOCH, "2")  # the pack's worker dies right after reporting epoch 2
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--k", "0", "4",
            "--trials", "1", "--epochs", "3", "--eval-every", "1", "--pack", "2", "--checkpoint-every", "0",
            "--max-failures", "1", "--storage", str(tmp_path), "--name", "crash"]
    assert main(argv) == 0
    table = read_results(tmp_path / "crash").set_index("trial_id").sort_index()
    assert len(table) == 2 and set(table["status"]) == {"ok"} and set(table["pack_size"]) == {2}
    assert set(table["resumed_from_epoch"]) == {2}, "the pack must have gone on from its epoch-2 checkpoint"

    # The same pack, uninterrupted and without Ray (dropout on: its streams resumed too), gives the same numbers.
    specs = EXPERIMENTS["incremental"].build(parse_command_line(argv).grid, 4, 4)  # a dry run's: no fingerprints
    prints = table.iloc[0][["data_fingerprint", "model_fingerprint"]].to_dict()
    specs = [dataclasses.replace(s, **prints) for s in specs]
    # threads=2: the pack had both CPUs (a pack gets its members'), and thread counts move float sums
    cfgs = [finetune_config(s.to_config(), gpu_fraction=0.0, threads=2) for s in specs]
    data = tokenize_task(load_task("synthetic"), load_tokenizer(tiny_bert), tiny_bert, 128)
    clean = {s.trial_id: r for s, r in zip(specs, finetune_pack(cfgs, data, load_pretrained(tiny_bert)))}
    assert sorted(clean) == list(table.index)
    for trial_id, row in table.iterrows():
        assert list(row["dev_metrics_by_epoch"]) == clean[trial_id]["dev_metrics_by_epoch"]
        assert row["train_loss"] == clean[trial_id]["train_loss"]
        assert list(row["weight_distance"]) == clean[trial_id]["weight_distance"]


def test_a_pack_resumed_from_the_checkpoint_of_a_members_divergence_reports_that_member_again(
        pretrained, synthetic, tmp_path):
    """A checkpoint is written just before the report that carries a diverged member's row: a driver lost between
    the two leaves the row unlanded, and `--resume` (the same members: the same pack) goes on from that checkpoint.
    The member reports no more after it diverged, so its row must come from the resumed call's first report, as a
    finished member's does; else the sweep gives it an error row, "ended without a final report"."""
    from tests.test_fused import LAYERS, trial
    from trainables.ablations import Reinit
    from trainables.state import load_state, save_state

    calm, wild = (trial(seed, Reinit.incremental(2, LAYERS), epochs=2, **extra)
                  for seed, extra in ((0, {}), (11, {"lr": float("inf")})))
    saved = []

    def save(state):
        saved.append(tmp_path / f"state{len(saved)}")
        save_state(saved[-1], state)

    clean = finetune_pack([calm, wild], synthetic, pretrained, save=save, pack_id="p")
    assert clean[1]["status"] == "diverged" and clean[1]["epoch"] == 1 and len(saved) == 1
    reports = []
    resumed = finetune_pack([calm, wild], synthetic, pretrained, report=reports.append,
                            resume=load_state(saved[0]))
    assert [r[1] for r in reports if 1 in r] == [resumed[1]], "the diverged member's result is reported once"
    assert resumed[1]["status"] == "diverged" and resumed[1]["train_loss"] != resumed[1]["train_loss"]  # nan
    assert resumed[0]["train_loss"] == clean[0]["train_loss"]


def test_a_resumed_pack_whose_member_landed_goes_on_from_its_checkpoint_as_the_same_pack(tiny_bert, tmp_path):
    """A member of a pack can land its row before the pack ends (it diverged, or its group finished first). A
    `--resume` after the pack was stopped must form that pack again, to go on from its checkpoint: a pack of the
    members left would be another pack (here a lone trial, unfused) and start over."""
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--k", "0", "4",
            "--trials", "1", "--epochs", "3", "--pack", "2", "--checkpoint-every", "0", "--keep-checkpoints",
            "--storage", str(tmp_path), "--name", "landed"]
    assert main(argv) == 0
    first = read_results(tmp_path / "landed").set_index("trial_id").sort_index()
    assert set(first["pack_size"]) == {2} and set(first["resumed_from_epoch"]) == {0}
    # As if the pack had been stopped after one member's row landed: the other's row is not there, the pack's
    # checkpoints (epochs 1 and 2) are.
    gone, kept = first.index
    (tmp_path / "landed" / "rows" / f"{gone}.parquet").unlink()
    assert main([*argv, "--resume"]) == 0
    again = read_results(tmp_path / "landed").set_index("trial_id").sort_index()
    assert list(again.index) == [gone, kept]
    assert again.loc[gone, "resumed_from_epoch"] == 2, "the pack must go on from its epoch-2 checkpoint"
    assert again.loc[gone, "pack_id"] == first.loc[gone, "pack_id"] and again.loc[gone, "pack_size"] == 2
    for column in ("train_loss", "dev_metric"):
        assert again.loc[gone, column] == first.loc[gone, column], column
    assert list(again.loc[gone, "weight_distance"]) == list(first.loc[gone, "weight_distance"])
    assert again.loc[kept, "finished_at"] == first.loc[kept, "finished_at"], "the landed row is not written again"
