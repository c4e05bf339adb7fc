"""Training states on disk (trainables.state): everything a checkpoint holds comes back as it went in, with no
pickle anywhere in the files."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from trainables.state import STATE_FILE, TENSORS_FILE, has_state, load_state, save_state


def test_a_state_comes_back_as_it_went_in(tmp_path):
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    rng = np.random.default_rng(np.random.SeedSequence([7, 1]))
    rng.permutation(10)
    table = torch.arange(12.0).view(3, 4)
    state = {"epoch": 2, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "batch_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "cuda_rng": [],
             "by_epoch": [0.5, float("nan")], "loss": float("inf"), "order": np.array([3, 1, 2]),
             "views": {"a": table[0], "b": table[1:]}, "pair": (1, "x"), "nothing": None}
    save_state(tmp_path / "s", state)
    assert has_state(tmp_path / "s") and not has_state(tmp_path)
    back = load_state(tmp_path / "s")

    assert back["epoch"] == 2 and back["pair"] == (1, "x") and back["nothing"] is None
    assert back["by_epoch"][0] == 0.5 and math.isnan(back["by_epoch"][1]) and back["loss"] == math.inf
    for name, tensor in model.state_dict().items():
        assert torch.equal(back["model"][name], tensor)
    assert torch.equal(back["views"]["a"], table[0]) and torch.equal(back["views"]["b"], table[1:])
    np.testing.assert_array_equal(back["order"], [3, 1, 2])
    assert torch.equal(back["torch_rng"], torch.get_rng_state())
    # The optimizer's state is keyed by parameter index (ints) and its betas are a tuple: both survive, so a
    # fresh optimizer takes it back and steps exactly as the first would.
    assert set(back["optimizer"]["state"]) == {0, 1}
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    again = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    again.load_state_dict(back["optimizer"])
    assert torch.equal(again.state[model.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"])
    # The batch-order stream goes on where it was (its 128-bit state is a JSON integer).
    resumed = np.random.default_rng()
    resumed.bit_generator.state = back["batch_rng"]
    np.testing.assert_array_equal(resumed.permutation(10), rng.permutation(10))

    # The files: JSON and safetensors only.
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted([STATE_FILE, TENSORS_FILE])
    json.loads((tmp_path / "s" / STATE_FILE).read_text())


def test_what_a_state_cannot_hold_is_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match="state entry '/figures/when' is a set"):
        save_state(tmp_path / "s", {"figures": {"when": {1, 2}}})


def test_an_unfused_trial_resumed_from_its_saved_state_ends_with_the_same_numbers(pretrained, synthetic, tmp_path):
    from trainables.ablations import Reinit
    from trainables.finetune import FinetuneConfig, finetune

    cfg = FinetuneConfig(task="synthetic", train_size=24, subset_seed=2, seed=2, epochs=3, eval_every=1,
                         weight_decay=0.01, ablation=Reinit(layers=(4,)))
    saved = []

    def save(state: dict) -> None:
        saved.append(tmp_path / f"epoch{state['epoch']}")
        save_state(saved[-1], state)

    clean = finetune(cfg, synthetic, pretrained, save=save)
    assert [p.name for p in saved] == ["epoch1", "epoch2"]
    resumed = finetune(cfg, synthetic, pretrained, resume=load_state(saved[0]))
    assert resumed["resumed_from_epoch"] == 1
    assert resumed["dev_metrics_by_epoch"] == clean["dev_metrics_by_epoch"]
    assert resumed["train_loss"] == clean["train_loss"] and resumed["weight_distance"] == clean["weight_distance"]
