"""The embeddings experiment: only the embeddings reinitialized, every layer and the pooler kept."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import LAYERWISE_FAMILIES
from trainables.ablations import Embeddings, Scratch, apply_ablation
from trainables.models import build_classifier, family, load_pretrained


@pytest.fixture(scope="module", params=LAYERWISE_FAMILIES)
def pretrained(request, tiny_family):
    return load_pretrained(tiny_family(request.param))


def test_only_the_embeddings_are_redrawn_as_scratch_draws_them(pretrained):
    model = apply_ablation(Embeddings(), build_classifier(pretrained, num_labels=2, seed=0), 3)
    layers = tuple(range(1, pretrained.num_layers + 1))
    scratch = apply_ablation(Scratch(layers), build_classifier(pretrained, num_labels=2, seed=0), 3)
    prefix = family(pretrained.config).layers + "."
    redrawn = 0
    for name, value in model.base_model.state_dict().items():
        if name.startswith(prefix) or name.startswith("pooler.") or name not in pretrained.state_dict:
            assert name not in pretrained.state_dict or torch.equal(value, pretrained.state_dict[name]), name
        elif not torch.equal(value, pretrained.state_dict[name]):
            redrawn += 1
            assert torch.equal(value, scratch.base_model.state_dict()[name]), f"{name}: not scratch's draw"
    assert redrawn >= 2  # word and position embeddings at least (their LayerNorm resets to the identity)


def test_the_embeddings_grid_and_its_rows():
    from sweep.experiments import EXPERIMENTS, GridSettings

    specs = EXPERIMENTS["embeddings"].build(GridSettings.of(model="m", tasks=("sst2", "cola"), sizes=(100,),
                                                             trials=((0, 2),)), 4, 4)
    assert len(specs) == 4 and {s.row()["reinit_embeddings"] for s in specs} == {True}
    assert all(s.row()["reinit_layers"] == [] for s in specs)
