"""The scratch experiment: every layer and the embeddings reset (the floor), and as a real Ray sweep."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import LAYERWISE_FAMILIES
from tests.test_experiments import sweep
from trainables.ablations import Reinit, Scratch, ablation_from_dict, ablation_to_dict, apply_ablation
from trainables.models import build_classifier, family, load_pretrained


@pytest.fixture(scope="module", params=LAYERWISE_FAMILIES)
def pretrained(request, tiny_family):
    return load_pretrained(tiny_family(request.param))


def test_everything_but_the_pooler_is_redrawn_and_layers_as_incremental_k0(pretrained):
    layers = tuple(range(1, pretrained.num_layers + 1))
    model = apply_ablation(Scratch(layers), build_classifier(pretrained, num_labels=2, seed=0), 3)
    k0 = apply_ablation(Reinit(layers), build_classifier(pretrained, num_labels=2, seed=0), 3)
    norms = {n for n, m in model.base_model.named_modules() if isinstance(m, nn.LayerNorm)}
    prefix = family(pretrained.config).layers + "."
    k0_state = k0.base_model.state_dict()
    for name, value in model.base_model.state_dict().items():
        if name.startswith(prefix):  # the very draws of incremental k = 0: the two differ in the embeddings alone
            assert torch.equal(value, k0_state[name]), name
        elif name.startswith("pooler."):
            assert torch.equal(value, pretrained.state_dict[name]), "the pooler is kept unless reinit_pooler"
        elif name in pretrained.state_dict and name.rpartition(".")[0] not in norms and "position_ids" not in name:
            assert not torch.equal(value, pretrained.state_dict[name]), f"{name} is still pretrained"
            assert torch.equal(k0_state[name], pretrained.state_dict[name])  # k = 0 keeps it
    words = model.base_model.embeddings.word_embeddings
    assert words.weight.abs().max() < 0.04
    if words.padding_idx is not None:
        assert not words.weight[words.padding_idx].any()


def test_scratch_round_trips_and_says_so_in_its_row():
    ablation = Scratch((1, 2), mode="paper-code")
    assert ablation_from_dict(ablation_to_dict(ablation)) == ablation
    assert ablation.columns()["reinit_embeddings"] is True and ablation.columns()["reinit_layers"] == [1, 2]


def test_scratch_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "scratch")
    assert list(rows["reinit_embeddings"]) == [True] and list(rows["reinit_layers"].iloc[0]) == [1, 2, 3, 4]
