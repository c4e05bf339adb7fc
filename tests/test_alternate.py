"""The alternate experiment: every other layer reset (the odd or the even ones), and as a real Ray sweep."""
from __future__ import annotations

import torch

from tests.test_experiments import sweep
from trainables.ablations import apply_ablation
from trainables.models import build_classifier, layer_stack, load_pretrained


def test_alternate_grid_resets_the_odd_or_the_even_layers():
    from sweep.experiments import GridSettings
    from trialrows.experiments import alternate

    specs = alternate(GridSettings.of(model="m", tasks=("sst2",), sizes=(100,), trials=((0, 2),)), 5)
    got = {(s.trial_index, s.row()["parity"], tuple(s.row()["reinit_layers"])) for s in specs}
    assert got == {(t, "odd", (1, 3, 5)) for t in (0, 1)} | {(t, "even", (2, 4)) for t in (0, 1)}


def test_only_the_layers_of_that_parity_change(tiny_bert):
    from sweep.experiments import GridSettings
    from trialrows.experiments import alternate

    pretrained = load_pretrained(tiny_bert)
    for spec in alternate(GridSettings.of(model="m", tasks=("sst2",), sizes=(100,), trials=((0, 1),)), 4):
        model = apply_ablation(spec.ablation, build_classifier(pretrained, num_labels=2, seed=0), spec.seed)
        reset = set(spec.row()["reinit_layers"])
        for i, layer in enumerate(layer_stack(model), start=1):
            prefix = f"encoder.layer.{i - 1}."
            same = [torch.equal(v, pretrained.state_dict[prefix + n]) for n, v in layer.state_dict().items()
                    if "LayerNorm" not in n]
            assert (not any(same)) if i in reset else all(same), (spec.row()["parity"], i)
        for name, value in model.base_model.state_dict().items():
            if not name.startswith("encoder.layer.") and name in pretrained.state_dict:
                assert torch.equal(value, pretrained.state_dict[name]), name


def test_alternate_sweep(ray_local, tiny_bert, tmp_path):
    rows = sweep(ray_local, tiny_bert, tmp_path, "alternate")
    got = sorted(zip(rows["parity"], map(tuple, rows["reinit_layers"])))
    assert got == [("even", (2, 4)), ("odd", (1, 3))]
