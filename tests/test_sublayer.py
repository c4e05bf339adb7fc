"""The sublayer experiment: only the attention block or only the feed-forward block of a layer reset, on every
family that takes surgery, and as a real Ray sweep."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import LAYERWISE_FAMILIES
from tests.test_experiments import sweep
from trainables.ablations import SublayerReinit, ablation_from_dict, ablation_to_dict, apply_ablation
from trainables.models import build_classifier, family, load_pretrained


@pytest.fixture(scope="module", params=LAYERWISE_FAMILIES)
def pretrained(request, tiny_family):
    return load_pretrained(tiny_family(request.param))


def named_parts(pretrained, layer: int, sublayer: str) -> tuple[set[str], set[str]]:
    """(the block's parameter names but its LayerNorm's, its LayerNorm's), from the family table."""
    fam = family(pretrained.config)
    prefix = f"{fam.layers}.{layer - 1}."
    if sublayer == "attention":
        paths = [*fam.attention]
        if pretrained.config.to_dict().get("share_att_key") is False:  # DeBERTa-v2's own position projections
            paths += [f"{fam.attention[0].rpartition('.')[0]}.{n}" for n in ("pos_key_proj", "pos_query_proj")]
        norm = fam.layer_norms[0]
    else:
        paths, norm = [*fam.feed_forward], fam.layer_norms[1]
    names = set(pretrained.state_dict)
    block = {n for n in names for p in paths if n.startswith(prefix + p + ".")}
    norms = {n for n in names if n.startswith(prefix + norm + ".")}
    return block, norms


@pytest.mark.parametrize("sublayer", ["attention", "feed-forward"])
def test_only_the_named_block_of_the_layer_changes(pretrained, sublayer):
    model = apply_ablation(SublayerReinit((2,), sublayer), build_classifier(pretrained, num_labels=2, seed=0), 0)
    block, norms = named_parts(pretrained, 2, sublayer)
    assert block and norms
    for name, value in model.base_model.state_dict().items():
        before = pretrained.state_dict.get(name)
        if name in block:
            assert not torch.equal(value, before), f"{name} was not reinitialized"
            assert value.abs().max() < 0.04  # the paper's truncated N(0, 0.02)
        elif name in norms:  # reset to the identity
            assert torch.equal(value, torch.ones_like(value) if name.endswith("weight") else torch.zeros_like(value))
        elif before is not None:
            assert torch.equal(value, before), f"{name} changed although it is outside the {sublayer} block"


def test_the_two_blocks_draw_apart_and_are_seeded(pretrained):
    fresh = lambda part, seed: apply_ablation(  # noqa: E731
        SublayerReinit((1, 3), part), build_classifier(pretrained, num_labels=2, seed=0), seed).base_model.state_dict()
    a, again, other = fresh("attention", 0), fresh("attention", 0), fresh("attention", 1)
    assert all(torch.equal(a[n], again[n]) for n in a)
    block, _ = named_parts(pretrained, 3, "attention")
    assert any(not torch.equal(a[n], other[n]) for n in block)


def test_sublayer_round_trips_and_refuses_what_it_cannot_reset():
    ablation = SublayerReinit((4, 2), "feed-forward", mode="paper-code")
    assert ablation.layers == (2, 4) and ablation_from_dict(ablation_to_dict(ablation)) == ablation
    with pytest.raises(ValueError, match="sublayer 'pooler' is not one of attention, feed-forward"):
        SublayerReinit((1,), "pooler")


def test_sublayer_grid_is_layer_by_block_plus_the_full_model():
    from sweep.experiments import GridSettings
    from trialrows.experiments import sublayer

    specs = sublayer(GridSettings.of(model="m", tasks=("sst2",), sizes=(100,), trials=((0, 1),)), 3)
    cells = [(s.row()["layer"], s.row()["sublayer"]) for s in specs]
    assert cells == [(None, None)] + [(layer, part) for layer in (1, 2, 3) for part in ("attention", "feed-forward")]
    assert len({s.trial_id for s in specs}) == len(specs)


def test_sublayer_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "sublayer", "--layers", "2", "--sublayers", "feed-forward")
    got = sorted(zip(rows["layer"].fillna(-1), rows["sublayer"].fillna("")))
    assert got == [(-1, ""), (2, "feed-forward")]
    assert all(len(r) == 0 for r in rows["reinit_layers"])
