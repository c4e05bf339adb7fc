"""Fused packs in the sweep (--pack): grouping, sizing, and a real Ray sweep whose rows match --pack 1's."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from analysis.results import read_results
from sweep.cli import main
from sweep.experiments import EXPERIMENTS, GridSettings
from sweep.packs import group_into_packs, members, memory_sized_pack, pack_config, resolve_pack, resumed_packs
from trainables.fused import MAX_GROUP, MEMORY_SHARE, PEAK_BYTES_PER_PARAMETER, group_size
from trainables.models import load_pretrained


@pytest.fixture(scope="module")
def quiet_bert(tiny_bert, tmp_path_factory):
    """The tiny BERT with dropout off: then a trial's numbers do not depend on its dropout stream."""
    folder = tmp_path_factory.mktemp("quiet-bert")
    shutil.copytree(tiny_bert, folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def grid(experiment: str, tiny_bert: str, **fields):
    settings = GridSettings.of(model=tiny_bert, tasks=("synthetic",), sizes=(24,), trials=((0, 3),), epochs=1, **fields)
    return [spec.to_config() for spec in EXPERIMENTS[experiment].build(settings, 4, 4)]


def test_packs_group_trials_of_one_shape_and_leave_the_rest_alone(tiny_bert):
    pretrained = {tiny_bert: load_pretrained(tiny_bert)}
    trials = grid("incremental", tiny_bert, k=(0, 2, 4))  # 9 trials of one shape
    units = group_into_packs(trials, 4, pretrained)
    assert [len(members(u)) for u in units] == [4, 4, 1]
    assert [m["trial_id"] for u in units for m in members(u)] == [t["trial_id"] for t in trials]
    assert units[2] is trials[8] and "pack" not in units[2]  # a pack of one is a plain trial
    again = group_into_packs(grid("incremental", tiny_bert, k=(0, 2, 4)), 4, pretrained)
    assert [u["trial_id"] for u in again] == [u["trial_id"] for u in units]  # resumable: same pack ids
    assert group_into_packs(trials, 1, pretrained) == trials
    # --pack auto on CPUs: every fusable trial is a pack of its own (the fused encoder is the faster one there).
    alone = group_into_packs(trials, 1, pretrained, fuse_alone=True)
    assert [members(u) for u in alone] == [[t] for t in trials] and all("pack" in u for u in alone)
    assert [len(members(u)) for u in group_into_packs(trials, 4, pretrained, fuse_alone=True)] == [4, 4, 1]
    assert "pack" in group_into_packs(trials, 4, pretrained, fuse_alone=True)[2]

    # Trials of different shapes never share a pack; sequential finetuning is never fused.
    longer = [{**t, "finetune": {**t["finetune"], "epochs": 2}} for t in trials[:2]]
    units = group_into_packs([*trials[:2], *longer], 8, pretrained)
    assert sorted(len(members(u)) for u in units) == [2, 2]
    sequential = grid("sequential", tiny_bert, intermediate_tasks=("sst2",), k=(0,))
    units = group_into_packs(sequential, 8, pretrained)
    staged = [t for t in sequential if t["finetune"].get("intermediate_task")]
    assert staged and all(any(u is t for u in units) for t in staged)


def test_auto_pack_size_comes_from_the_device():
    # CPUs: each trial fused alone (docs/benchmarks.md, "Fused packs"); --pack N as given, a lone trial unfused.
    assert resolve_pack("auto", 0.0, 110_000_000) == (1, True)
    assert resolve_pack(5, 0.0, 110_000_000) == (5, False)
    assert resolve_pack(1, 0.0, 110_000_000) == (1, False)
    h100 = 79 * 2**30  # an idle H100's free memory
    assert memory_sized_pack(h100, 110_000_000) == int(MEMORY_SHARE * h100 // (PEAK_BYTES_PER_PARAMETER * 110e6)) >= 24
    assert memory_sized_pack(h100, 1_000_000) == MAX_GROUP
    assert memory_sized_pack(8 * 2**30, 340_000_000) == 1  # BERT-large on a small card: one at a time


def test_a_trainable_on_a_gpu_trains_its_pack_in_groups_of_at_most_the_sweeps_size():
    # The sweep gives a Tune trial three groups of at most MAX_GROUP; the trainable sized its groups again from
    # its card without that bound, so MiniLM's 192 on an H100 trained as 168 and 24, the 168's set-up overlapped
    # with nothing
    h100, minilm = 79 * 2**30, 22_700_000
    assert group_size(3 * memory_sized_pack(h100, minilm), h100, minilm) == memory_sized_pack(h100, minilm) == 64
    assert group_size(3 * 34, h100, 110_000_000) == memory_sized_pack(h100, 110_000_000)
    assert group_size(192, None, minilm) == 192  # a CPU: one group


def test_bad_pack_option_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["incremental", "--pack", "0", "--dry-run"])
    assert "--pack: '0' is neither a whole number of trials >= 1 nor 'auto'" in capsys.readouterr().err


def test_real_sweep_with_packs_writes_the_rows_of_unfused_trials(ray_local, quiet_bert, tmp_path):
    argv = ["incremental", "--model", quiet_bert, "--tasks", "synthetic", "--sizes", "24", "--k", "0", "4",
            "--trials", "2", "--epochs", "2", "--weight-decay", "0.01", "--storage", str(tmp_path)]
    assert main([*argv, "--pack", "1", "--name", "alone"]) == 0
    assert main([*argv, "--pack", "3", "--name", "packed"]) == 0
    alone, packed = (read_results(tmp_path / n).set_index("trial_id").sort_index() for n in ("alone", "packed"))
    assert list(packed.index) == list(alone.index) and len(alone) == 4
    assert set(packed["status"]) == set(alone["status"]) == {"ok"}
    assert set(alone.columns) <= set(packed.columns)
    assert set(alone["pack_size"]) == {1} and alone["pack_id"].isna().all()
    assert sorted(packed["pack_size"]) == [1, 3, 3, 3]
    assert packed.loc[packed["pack_size"] == 3, "pack_id"].nunique() == 1
    assert packed.loc[packed["pack_size"] == 1, "pack_id"].isna().all()
    # With dropout off, a trial's numbers do not depend on whom it trained with.
    np.testing.assert_allclose(packed["dev_metric"], alone["dev_metric"], atol=1e-9)
    np.testing.assert_allclose(packed["train_loss"], alone["train_loss"], rtol=2e-4)
    assert packed["clipped_steps"].tolist() == alone["clipped_steps"].tolist()
    for a, b in zip(packed["weight_distance"], alone["weight_distance"]):
        np.testing.assert_allclose(a, b, rtol=1e-3)
    identity = [c for c in alone.columns if c in ("k", "seed", "subset_seed", "epochs", "lr", "max_grad_norm")]
    assert packed[identity].equals(alone[identity])

    # TensorBoard: a pack's folder holds each member's curves under pack_results/<trial_id>/.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "packed").glob("tune-*/pack-*/events.out.tfevents*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    fused = packed[packed["pack_size"] == 3]
    assert {f"ray/tune/pack_results/{t}/train_loss" for t in fused.index} <= tags
    assert [e.value for e in accumulator.Scalars(f"ray/tune/pack_results/{fused.index[0]}/dev_metric")] == \
        pytest.approx([fused["dev_metric"].iloc[0]])

    # Skip-done works per trial: a rerun with another pack size finds every trial done and runs nothing.
    files = sorted(p.name for p in (tmp_path / "packed" / "rows").iterdir())
    assert main([*argv, "--pack", "2", "--name", "packed"]) == 0
    assert sorted(p.name for p in (tmp_path / "packed" / "rows").iterdir()) == files
    # The default on a CPU (auto), each trial a pack of its own: tests/test_sweep.py's real sweep; a pack of one
    # trains as the trial alone: tests/test_fused.py (pack1).


def test_a_resume_forms_again_each_earlier_pack_it_can_and_groups_the_rest_as_before():
    def config(name: str) -> dict:
        return {"trial_id": name, "model_key": "m", "data_key": "d",
                "row": {"experiment": "incremental", "task": "sst2", "train_size": 24}}

    known = {name: config(name) for name in "abcdefgh"}
    todo = [known[name] for name in "bcdefh"]  # a and g have rows
    earlier = [["a", "b"],  # newest: b still to run, a's row stands
               ["b", "c"],  # b claimed by the newer pack: this one cannot go on whole
               ["d", "x"],  # x is no trial of this sweep (another grid)
               ["e", "f", "g"],  # more than a pack holds now
               ["h", "c"]]  # all still to run (c is free again: the pack that claimed b is not formed)
    units, rest, standing = resumed_packs(todo, known, earlier, size=2)
    assert [[m["trial_id"] for m in members(u)] for u in units] == [["a", "b"], ["h", "c"]]
    assert units[0] == pack_config([known["a"], known["b"]]), "the same members, so the same id as before"
    assert [t["trial_id"] for t in rest] == ["d", "e", "f"] and standing == {"a"}
    assert resumed_packs(todo, known, [], size=2) == ([], todo, set())
    # --pack auto (size None): an earlier pack larger than today's cards would size one is formed again too
    units, rest, standing = resumed_packs(todo, known, [["e", "f", "g"]], size=None)
    assert [m["trial_id"] for m in members(units[0])] == ["e", "f", "g"] and standing == {"g"}


def test_a_precision_sweep_gives_its_resume_only_trials_done_or_to_run_as_a_packs_members(tiny_bert, tmp_path,
                                                                                        monkeypatch):
    """A member of an earlier pack that is neither done nor to run now (a later stage's trial, or one a loosened
    --target-ci no longer asks for) has no row that stands: a pack formed again with it would train it along
    and drop its row, saying that it stands."""
    from sweep.cli import RaySession

    runs = []
    monkeypatch.setattr(RaySession, "run", lambda self, todo, sweep, folder, raw, known=(): runs.append((todo, known)))
    main(["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--k", "0", "--epochs", "1",
          "--target-ci", "0.05", "--pilot-trials", "2", "--max-trials", "4", "--pack", "2", "--resume",
          "--storage", str(tmp_path), "--name", "stages"])
    (todo, known), = runs  # the pilot: stage 2 waits for its rows
    assert {s.trial_id for s in known} == {s.trial_id for s in todo}, "none is done: only the pilot is known"
