"""Sequential finetuning (an intermediate task, then the final one): its grid's checks, its trials and its rows."""
from __future__ import annotations

import numpy as np
import pytest

from sweep.cli import main
from tests.conftest import save_tiny_bert
from trainables.data import TokenizedSplit, TokenizedTask
from trainables.finetune import FinetuneConfig, finetune
from trainables.state import load_state, save_state
from trainables.tasks import Task


def test_a_skipped_cell_does_not_hide_an_intermediate_task_too_small_for_the_others(tmp_path, capsys):
    # CoLA's own 9000 cell is skipped, but the cola -> sst2 cell still trains on 9000 CoLA examples first, which
    # its 8,551 cannot give: refused before any work, not a trial that fails once its intermediate round starts.
    (tmp_path / "skip.yaml").write_text("skip: [cola=9000]\n")
    argv = ["sequential", "--model", "minilm", "--tasks", "sst2", "cola", "--sizes", "9000", "--trials", "1",
            "--config", str(tmp_path / "skip.yaml"), "--storage", str(tmp_path), "--dry-run"]
    assert main(argv) == 2
    assert "--sizes: 9000 is larger than the cola train split (8,551 examples), which --intermediate-tasks trains " \
           "on first" in capsys.readouterr().err
    assert main([*argv[:6], "--intermediate-tasks", "sst2", *argv[6:]]) == 0  # nothing trains on cola


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trainables.models import load_pretrained

    return load_pretrained(str(save_tiny_bert(tmp_path_factory.mktemp("sequential"), num_layers=2, hidden=32)))


def made_task(name: str, num_labels: int, seed: int) -> TokenizedTask:
    """A task of random token ids, 40 training and 20 dev examples: classes, or scores (num_labels 1)."""
    rng = np.random.default_rng(seed)

    def split(n: int) -> TokenizedSplit:
        offsets = np.concatenate([[0], np.cumsum(rng.integers(5, 16, n))])
        ids = rng.integers(1000, 3000, offsets[-1]).astype(np.int32)
        labels = rng.random(n).astype(np.float32) * 5 if num_labels == 1 else rng.integers(0, num_labels, n)
        return TokenizedSplit(ids, np.zeros_like(ids, dtype=np.int8), offsets, labels)

    definition = Task(name, ("text",), num_labels, "pearson" if num_labels == 1 else "accuracy", None)
    return TokenizedTask(name, num_labels, definition.metric, "synthetic", "tiny", 32, split(40), split(20), definition)


def test_a_trial_resumed_after_a_head_swap_ends_as_it_would_have(tiny, tmp_path):
    # A regression task first, then three classes: the final task's fresh head, optimizer and schedule, and its
    # weight change from its own start survive a checkpoint at each of its epochs; the regression round and its
    # weight change, one at each of that round's.
    first, final = made_task("scores", 1, 1), made_task("three", 3, 2)
    cfg = FinetuneConfig(task="three", train_size=24, subset_seed=2, seed=2, epochs=3, lr=1e-3,
                         intermediate_task="scores")
    saved = []

    def save(state: dict) -> None:
        saved.append(tmp_path / f"state{len(saved)}")
        save_state(saved[-1], state)

    clean = finetune(cfg, final, tiny, intermediate=first, save=save)
    assert [load_state(path).get("phase") for path in saved] == ["intermediate", "intermediate", None, None]
    assert clean["status"] == "ok"
    assert len(clean["intermediate_weight_distance"]) == len(clean["weight_distance"]) == 2
    timings = {"train_seconds", "eval_seconds", "wall_seconds", "mfu", "hfu", "resumed_from_epoch"}
    for path in saved:
        resumed = finetune(cfg, final, tiny, intermediate=first, resume=load_state(path))
        assert {k: (clean.get(k), resumed.get(k)) for k in clean.keys() | resumed.keys()
                if k not in timings and clean.get(k) != resumed.get(k)} == {}


def test_an_intermediate_round_that_diverges_stops_at_once(tiny, monkeypatch):
    # A diverged trial stops (README): its intermediate round too, not every epoch of it trained on nan weights
    # before the final task's first epoch says so.
    import trainables.finetune as ft

    epochs, train_epoch = [], ft.train_epoch
    monkeypatch.setattr(ft, "train_epoch", lambda model, *args: epochs.append(model) or train_epoch(model, *args))
    cfg = FinetuneConfig(task="two", train_size=24, subset_seed=0, seed=0, epochs=3, lr=1e8, max_grad_norm=0,
                         intermediate_task="scores")
    result = finetune(cfg, made_task("two", 2, 3), tiny, intermediate=made_task("scores", 1, 4))
    assert result["status"] == "diverged" and result["epoch"] == 1
    assert len(epochs) == 2 and epochs[0] is not epochs[1]  # one intermediate epoch, then one of the final task


def test_an_intermediate_rounds_checkpoints_are_not_counted_as_training_time(tiny, monkeypatch):
    # train_seconds (and the MFU made from it) is time spent training: a checkpoint's writing, and Tune copying it to
    # the storage before its report returns, are not, in the intermediate round as in the final task. A clock that
    # moves 1 s an epoch trained and 100 s a checkpoint written.
    import types

    import trainables.finetune as ft

    clock, train_epoch = [0.0], ft.train_epoch

    def timed_epoch(*args):
        clock[0] += 1.0
        return train_epoch(*args)

    monkeypatch.setattr(ft, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(ft, "train_epoch", timed_epoch)
    cfg = FinetuneConfig(task="three", train_size=24, subset_seed=2, seed=2, epochs=3, intermediate_task="scores")
    result = finetune(cfg, made_task("three", 3, 2), tiny, intermediate=made_task("scores", 1, 1),
                      save=lambda state: clock.__setitem__(0, clock[0] + 100.0))
    assert result["train_seconds"] == 6.0  # three epochs of each round
    assert result["wall_seconds"] == 406.0  # and the four checkpoints
