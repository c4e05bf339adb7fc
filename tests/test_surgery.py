"""Model surgery: what reinitialization changes, and exactly what it leaves alone."""
from __future__ import annotations

import pytest
import torch
from scipy import stats
from torch import nn

from trainables.ablations import Reinit, ablation_from_dict, ablation_to_dict, apply_ablation
from trainables.models import build_classifier, embeddings, layer_stack, load_pretrained, pooler


@pytest.fixture(scope="module")
def pretrained(tiny_bert):
    return load_pretrained(tiny_bert)


def surgery(pretrained, ablation, seed=0):
    model = build_classifier(pretrained, num_labels=2, seed=seed)
    return apply_ablation(ablation, model, seed)


def split_params(module):
    """(LayerNorm params, every other param) of a module, by name."""
    norms, others = {}, {}
    for sub_name, sub in module.named_modules():
        for name, p in sub.named_parameters(recurse=False):
            (norms if isinstance(sub, nn.LayerNorm) else others)[f"{sub_name}.{name}"] = p
    return norms, others


def test_intended_reinit_draws_truncated_normal_and_resets_layernorm(pretrained):
    model = surgery(pretrained, Reinit(layers=(2, 3)))
    norms, others = split_params(layer_stack(model)[1])
    values = torch.cat([p.flatten() for p in others.values()])
    assert values.abs().max() < 0.04
    # N(0, 0.02) cut at +-2 std has std 0.0176; a non-truncated or mis-scaled draw misses this by far.
    expected = stats.truncnorm(-2, 2, scale=0.02).std()
    assert values.std().item() == pytest.approx(expected, rel=0.03)
    assert abs(values.mean().item()) < 1e-3
    biases = [p for n, p in others.items() if n.endswith("bias")]
    assert biases and all(b.abs().sum() > 0 for b in biases), "intended mode redraws biases too"
    for name, p in norms.items():
        assert torch.equal(p, torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)), name


def test_untouched_parts_are_bit_identical_to_pretrained(pretrained):
    model = surgery(pretrained, Reinit(layers=(3, 4)))
    original = pretrained.state_dict
    base = model.base_model.state_dict()
    for name, value in base.items():
        if name.startswith(("encoder.layer.2.", "encoder.layer.3.")):
            assert not torch.equal(value, original[name]) or "LayerNorm" in name or value.numel() == 0, name
        elif name in original:
            assert torch.equal(value, original[name]), f"{name} changed although it was not reinitialized"
    assert any(n.startswith("embeddings.") for n in base)
    assert any(n.startswith("pooler.") for n in base), "the pooler is kept by default"


def test_pooler_reinit_is_an_option(pretrained):
    model = surgery(pretrained, Reinit(layers=(), reinit_pooler=True))
    weight = pooler(model).dense.weight
    assert not torch.equal(weight, pretrained.state_dict["pooler.dense.weight"])
    assert weight.abs().max() < 0.04
    for name, value in model.base_model.state_dict().items():
        if not name.startswith("pooler."):
            assert torch.equal(value, pretrained.state_dict[name]), name


def test_paper_code_mode_keeps_biases_and_draws_43x_too_small(pretrained):
    model = surgery(pretrained, Reinit(layers=(1,), mode="paper-code"))
    norms, others = split_params(layer_stack(model)[0])
    weights = torch.cat([p.flatten() for n, p in others.items() if n.endswith("weight")])
    # The original passed +-0.04 to scipy's truncnorm as if absolute: bounds are +-0.04 * 0.02 = +-0.0008.
    assert weights.abs().max() <= 0.0008
    expected = stats.truncnorm(-0.04, 0.04, scale=0.02).std()
    assert weights.std().item() == pytest.approx(expected, rel=0.03)
    for name, p in others.items():
        if name.endswith("bias"):
            assert torch.equal(p, pretrained.state_dict[f"encoder.layer.0.{name.lstrip('.')}"]), name
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in norms.items() if n.endswith("weight"))


def test_keep_layernorm_keeps_pretrained_statistics(pretrained):
    model = surgery(pretrained, Reinit(layers=(1,), keep_layernorm=True))
    norms, _ = split_params(layer_stack(model)[0])
    for name, p in norms.items():
        assert torch.equal(p, pretrained.state_dict[f"encoder.layer.0.{name.lstrip('.')}"]), name


def test_reinit_is_seeded_and_layerwise_stable(pretrained):
    a = surgery(pretrained, Reinit(layers=(3, 4)), seed=7)
    b = surgery(pretrained, Reinit(layers=(3, 4)), seed=7)
    c = surgery(pretrained, Reinit(layers=(3, 4)), seed=8)
    d = surgery(pretrained, Reinit(layers=(4,)), seed=7)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)
    w = lambda m: layer_stack(m)[3].attention.self.query.weight  # noqa: E731
    assert not torch.equal(w(a), w(c))
    # Layer 4 gets the same fresh weights at k=2 and k=3: conditions differ only in which layers were reset.
    assert torch.equal(w(a), w(d))


def test_incremental_layers_and_bounds():
    assert Reinit.incremental(0, 4).layers == (1, 2, 3, 4)
    assert Reinit.incremental(3, 4).layers == (4,)
    assert Reinit.incremental(4, 4).layers == ()
    with pytest.raises(ValueError, match="k=5 is outside 0..4"):
        Reinit.incremental(5, 4)
    with pytest.raises(ValueError, match="reinit_mode 'bogus'"):
        Reinit(mode="bogus")


def test_ablation_round_trips_through_a_dict():
    ablation = Reinit(layers=(2, 3), mode="paper-code", reinit_pooler=True)
    assert ablation_from_dict(ablation_to_dict(ablation)) == ablation
    with pytest.raises(ValueError, match="ablation kind 'nope'"):
        ablation_from_dict({"kind": "nope"})


def test_out_of_range_layer_is_refused(pretrained):
    with pytest.raises(ValueError, match=r"reinit_layers \[5\] are outside 1..4"):
        surgery(pretrained, Reinit(layers=(5,)))


@pytest.mark.parametrize("family", ["distilbert", "roberta", "electra"])
def test_layer_stack_is_found_in_other_families(family):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.for_model(
        family, vocab_size=100, hidden_size=32, dim=32, num_hidden_layers=3, n_layers=3, num_attention_heads=2,
        n_heads=2, intermediate_size=64, hidden_dim=64, embedding_size=32,
    )
    model = AutoModelForSequenceClassification.from_config(config)
    assert len(layer_stack(model)) == 3
    assert embeddings(model) is not None


def test_architecture_without_layer_stack_gets_a_clear_error():
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100))
    with pytest.raises(ValueError, match="no layer stack we recognise"):
        layer_stack(model)
