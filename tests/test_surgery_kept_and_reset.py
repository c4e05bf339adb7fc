"""Surgery on a checkpoint whose LayerNorms and biases are not what a random model starts with.

The tiny checkpoints of the other surgery tests are random models: every LayerNorm is the identity and every bias
zero, so there a LayerNorm or bias that surgery wrongly resets looks exactly like one it kept. Here every pretrained
tensor is shifted off those values, and each ablation must keep, reset or redraw each parameter as REFERENCE.md
says, on every family that takes surgery.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from tests.conftest import LAYERWISE_FAMILIES
from trainables.ablations import HeadReinit, Reinit, SublayerReinit, apply_ablation, attention_projections
from trainables.models import build_classifier, family, layer_stack, load_pretrained


@pytest.fixture(scope="module", params=LAYERWISE_FAMILIES)
def pretrained(request, tiny_family):
    loaded = load_pretrained(tiny_family(request.param))
    generator = torch.Generator().manual_seed(0)
    shifted = {k: v + 0.5 + 0.1 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
               for k, v in loaded.state_dict.items()}
    return dataclasses.replace(loaded, state_dict=shifted)


def outcome(model, pretrained, ablation) -> dict[str, str]:
    """Each base-model parameter after surgery: 'kept', 'identity' (LayerNorm reset), 'drawn' (fresh values
    within the intended truncation) or 'drawn-small' (within the paper code's +-0.0008), else 'other'."""
    norms = {f"{n}.{p}" for n, m in model.base_model.named_modules() if isinstance(m, nn.LayerNorm)
             for p in ("weight", "bias")}
    apply_ablation(ablation, model, 3)
    got = {}
    for name, value in model.base_model.state_dict().items():
        before = pretrained.state_dict[name]
        if torch.equal(value, before):
            got[name] = "kept"
        elif name in norms and torch.equal(value, torch.full_like(value, float(name.endswith("weight")))):
            got[name] = "identity"
        elif value.abs().max() <= 0.0008:
            got[name] = "drawn-small"
        elif value.abs().max() < 0.04:
            got[name] = "drawn"
        else:
            got[name] = "other"
    return got


def in_layer(pretrained, i: int, name: str) -> str | None:
    """The name inside layer i (1-based) of a base-model parameter, or None when it lies outside that layer."""
    prefix = f"{family(pretrained.config).layers}.{i - 1}."
    return name[len(prefix):] if name.startswith(prefix) else None


def test_building_keeps_every_pretrained_value(pretrained):
    model = build_classifier(pretrained, num_labels=2, seed=0)
    for name, value in model.base_model.state_dict().items():
        assert torch.equal(value, pretrained.state_dict[name]), f"{name} is not the checkpoint's"


@pytest.mark.parametrize("mode,keep_layernorm", [("intended", False), ("intended", True), ("paper-code", False)])
def test_reinit_resets_exactly_what_its_mode_says(pretrained, mode, keep_layernorm):
    model = build_classifier(pretrained, num_labels=2, seed=0)
    norms = {f"{n}.{p}" for n, m in layer_stack(model)[1].named_modules() if isinstance(m, nn.LayerNorm)
             for p in ("weight", "bias")}
    got = outcome(model, pretrained, Reinit((2,), mode=mode, keep_layernorm=keep_layernorm))
    for name, result in got.items():
        inner = in_layer(pretrained, 2, name)
        if inner is None:
            expected = "kept"
        elif inner in norms:
            expected = "kept" if keep_layernorm else "identity"
        elif mode == "paper-code":  # nn.Linear weights only, the original code's too-small draw; biases kept
            expected = "drawn-small" if inner.endswith("weight") else "kept"
        else:
            expected = "drawn"
        assert result == expected, f"{name}: {result}, expected {expected}"


def test_head_reinit_leaves_layernorms_and_the_output_bias(pretrained):
    model = build_classifier(pretrained, num_labels=2, seed=0)
    names = {id(p): n for n, p in model.base_model.named_parameters()}
    inputs, output = attention_projections(model, layer_stack(model)[1])
    sliced = {names[id(p)] for m in inputs for p in (m.weight, m.bias)} | {names[id(output.weight)]}
    got = outcome(model, pretrained, HeadReinit(layer=2, head=1))
    assert {n for n, r in got.items() if r != "kept"} == sliced  # LayerNorms and the output bias stay pretrained


@pytest.mark.parametrize("sublayer", ["attention", "feed-forward"])
def test_sublayer_resets_its_own_layernorm_only(pretrained, sublayer):
    fam = family(pretrained.config)
    own, other = fam.layer_norms if sublayer == "attention" else fam.layer_norms[::-1]
    got = outcome(build_classifier(pretrained, num_labels=2, seed=0), pretrained, SublayerReinit((2,), sublayer))
    for name, result in got.items():
        inner = in_layer(pretrained, 2, name) or ""
        if inner.startswith(own + "."):
            assert result == "identity", name
        elif inner.startswith(other + ".") or not inner:
            assert result == "kept", name
        else:
            assert result in ("kept", "drawn"), name

