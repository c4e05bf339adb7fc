"""Model surgery: what reinitialization changes, and exactly what it leaves alone."""
from __future__ import annotations

import pytest
import torch
from scipy import stats
from torch import nn

from tests.conftest import FAMILY_CONFIGS, LAYERWISE_FAMILIES
from trainables.ablations import (
    HeadReinit, Permute, Reinit, ablation_from_dict, ablation_to_dict, apply_ablation, attention_projections,
)
from trainables.models import FAMILIES, build_classifier, embeddings, family, layer_stack, load_pretrained, pooler


@pytest.fixture(scope="module", params=LAYERWISE_FAMILIES)
def pretrained(request, tiny_family):
    """Every test below that takes `pretrained` runs on a tiny model of each family that takes surgery."""
    return load_pretrained(tiny_family(request.param))


def layer_prefix(pretrained, i: int) -> str:
    """Layer i's (1-based) name prefix in the base model's state dict."""
    return f"{family(pretrained.config).layers}.{i - 1}."


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
    # A random model's LayerNorms are already the identity a reset gives them.
    norms = {n for n, m in model.base_model.named_modules() if isinstance(m, nn.LayerNorm)}
    for name, value in base.items():
        if name.startswith((layer_prefix(pretrained, 3), layer_prefix(pretrained, 4))):
            assert not torch.equal(value, original[name]) or name.rpartition(".")[0] in norms, name
        elif name in original:
            assert torch.equal(value, original[name]), f"{name} changed although it was not reinitialized"
    assert any(n.startswith("embeddings.") for n in base)
    if family(pretrained.config).pooler:
        assert any(n.startswith("pooler.") for n in base), "the pooler is kept by default"
    else:  # RoBERTa's and ELECTRA's saved base models may carry a pooler that their classifier has no use for
        assert not any(n.startswith("pooler.") for n in base)


def test_pooler_reinit_is_an_option(pretrained):
    if not family(pretrained.config).pooler:
        with pytest.raises(ValueError, match="reinit_pooler=True but this model has no pooler"):
            surgery(pretrained, Reinit(layers=(), reinit_pooler=True))
        return
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
            assert torch.equal(p, pretrained.state_dict[layer_prefix(pretrained, 1) + name.lstrip(".")]), name
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in norms.items() if n.endswith("weight"))


def test_keep_layernorm_keeps_pretrained_statistics(pretrained):
    model = surgery(pretrained, Reinit(layers=(1,), keep_layernorm=True))
    norms, _ = split_params(layer_stack(model)[0])
    for name, p in norms.items():
        assert torch.equal(p, pretrained.state_dict[layer_prefix(pretrained, 1) + name.lstrip(".")]), name


def test_reinit_is_seeded_and_layerwise_stable(pretrained):
    a = surgery(pretrained, Reinit(layers=(3, 4)), seed=7)
    b = surgery(pretrained, Reinit(layers=(3, 4)), seed=7)
    c = surgery(pretrained, Reinit(layers=(3, 4)), seed=8)
    d = surgery(pretrained, Reinit(layers=(4,)), seed=7)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)
    w = lambda m: attention_projections(m, layer_stack(m)[3])[0][0].weight  # noqa: E731  the query
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


@pytest.mark.parametrize("name", LAYERWISE_FAMILIES)
def test_family_table_names_the_real_parts(tiny_family, name):
    """Every path of the family table leads to the module it says: the layer stack, attention projections,
    feed-forward maps, LayerNorms, the pooler or its absence, and a classification head on top."""
    pretrained = load_pretrained(tiny_family(name))
    assert pretrained.model_type == FAMILY_CONFIGS[name][0]
    model = build_classifier(pretrained, num_labels=3, seed=0)
    fam = family(model.config)
    stack = layer_stack(model)
    assert len(stack) == 4 and embeddings(model) is not None
    for layer in stack:
        linears = [layer.get_submodule(p) for p in (*fam.attention, *fam.feed_forward)]
        assert all(isinstance(m, nn.Linear) for m in linears)
        assert all(isinstance(layer.get_submodule(p), nn.LayerNorm) for p in fam.layer_norms)
        inputs, output = attention_projections(model, layer)
        assert output.in_features == output.out_features == 64
        assert all(m.out_features == 64 for m in inputs)
    assert (pooler(model) is not None) == (fam.pooler is not None)
    logits = model(input_ids=torch.tensor([[101, 2023, 102]])).logits
    assert logits.shape == (1, 3), "the classification head gives one logit per label"


def test_albert_is_refused_for_layer_surgery_with_the_reason(tiny_family):
    pretrained = load_pretrained(tiny_family("albert"))
    model = build_classifier(pretrained, num_labels=2, seed=0)  # builds: probing uses it frozen
    with pytest.raises(ValueError, match="ALBERT shares one set of weights across all its layers"):
        apply_ablation(Reinit(layers=(1,)), model, 0)
    assert FAMILIES["albert"].not_layerwise and not any(FAMILIES[f].not_layerwise for f in FAMILIES if f != "albert")


def test_architecture_without_layer_stack_gets_a_clear_error():
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100))
    with pytest.raises(ValueError, match="no layer stack we recognise"):
        layer_stack(model)


# --- permutation, head and block surgery; optimizer groups; weight distance ----------------------------


def layer_state(model, i):
    """Layer i's (1-based) weights, keyed by their name inside the layer."""
    return layer_stack(model)[i - 1].state_dict()


def pretrained_layer(pretrained, i):
    prefix = layer_prefix(pretrained, i)
    return {k[len(prefix):]: v for k, v in pretrained.state_dict.items() if k.startswith(prefix)}


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_permuted_layer_i_holds_pretrained_layer_perm_i(pretrained, seed):
    ablation = Permute.from_seed(seed, 4)
    assert sorted(ablation.order) == [1, 2, 3, 4]
    model = surgery(pretrained, ablation)
    for i, source in enumerate(ablation.order, start=1):
        expected = pretrained_layer(pretrained, source)
        got = layer_state(model, i)
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in got), (i, source)
    for name, value in model.base_model.state_dict().items():
        if not name.startswith(layer_prefix(pretrained, 1)[: -len("0.")]):
            assert torch.equal(value, pretrained.state_dict[name]), name


def test_permutation_seeds_zero_included_any_depth():
    assert Permute.from_seed(0, 12) == Permute.from_seed(0, 12)  # seed 0 is a seed like any other
    orders = {Permute.from_seed(s, 12).order for s in range(10)}
    assert len(orders) == 10
    for depth in (1, 2, 5, 24):
        assert sorted(Permute.from_seed(3, depth).order) == list(range(1, depth + 1))
    with pytest.raises(ValueError, match="not an ordering of layers 1..3"):
        Permute(order=(1, 1, 3))


def test_permutation_of_wrong_depth_is_refused(pretrained):
    with pytest.raises(ValueError, match="has 3 layers; this model has 4"):
        surgery(pretrained, Permute(order=(3, 1, 2)))


def test_head_reinit_changes_only_that_heads_slices(pretrained):
    layer, head = 2, 1
    model = surgery(pretrained, HeadReinit(layer=layer, head=head))
    width = 64 // 4
    rows = slice(head * width, (head + 1) * width)
    names = {id(p): n for n, p in model.base_model.named_parameters()}
    inputs, output = attention_projections(model, layer_stack(model)[layer - 1])
    head_rows = {names[id(p)] for m in inputs for p in (m.weight, m.bias)}
    changed = set()
    for name, value in model.base_model.state_dict().items():
        before = pretrained.state_dict[name]
        if torch.equal(value, before):
            continue
        diff = (value != before)
        changed.add(name)
        if name in head_rows:
            assert diff[rows].all() and not torch.cat([diff[: rows.start], diff[rows.stop:]]).any(), name
        elif name == names[id(output.weight)]:
            assert diff[:, rows].all() and not diff[:, : rows.start].any() and not diff[:, rows.stop:].any()
        else:
            raise AssertionError(f"{name} changed although it is not part of head {head} of layer {layer}")
    # q, k, v (and DeBERTa-v2's unshared position projections) weights and biases, the output's columns
    assert changed == head_rows | {names[id(output.weight)]}
    assert len(head_rows) == (10 if pretrained.config.to_dict().get("share_att_key") is False else 6)
    assert inputs[0].weight[rows].abs().max() < 0.04


def test_head_reinit_refuses_a_head_the_model_does_not_have(pretrained):
    with pytest.raises(ValueError, match=r"head 4 is outside 0..3"):
        surgery(pretrained, HeadReinit(layer=1, head=4))


def test_block_preserve_keeps_exactly_the_block(pretrained):
    from sweep.experiments import GridSettings
    from trialrows.experiments import localized

    settings = GridSettings.of(model="m", tasks=("synthetic",), sizes=(16,), trials=((0, 1),), block_size=2)
    specs = localized(settings, num_layers=4)
    assert {(s.row()["block_mode"], s.row()["block_start"]) for s in specs} == {
        (m, b) for m in ("block-reinit", "block-preserve") for b in (1, 2, 3)}
    for spec in specs:
        row = spec.row()
        block = set(range(row["block_start"], row["block_start"] + 2))
        model = surgery(pretrained, spec.ablation)
        for i in range(1, 5):
            got, expected = layer_state(model, i), pretrained_layer(pretrained, i)
            kept = all(torch.equal(got[k], expected[k]) for k in got)
            assert kept == ((i in block) == (row["block_mode"] == "block-preserve")), (row, i)


def test_new_ablations_round_trip_through_a_dict():
    for ablation in (Permute(order=(2, 1, 3)), HeadReinit(layer=3, head=2, mode="paper-code"),
                     Reinit(layers=(1,), keep_layernorm=True)):
        assert ablation_from_dict(ablation_to_dict(ablation)) == ablation


def test_param_groups_hold_every_parameter_once_with_the_multiplier(pretrained):
    from trainables.finetune import param_groups

    model = surgery(pretrained, Reinit(layers=(3, 4)))
    groups = param_groups(model, (3, 4), lr=2e-5, multiplier=5.0)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)), "a parameter appears in two groups"
    assert set(ids) == {id(p) for p in model.parameters()}, "every parameter must be optimized"
    by_name = {g["name"]: g for g in groups}
    assert by_name["reinit"]["lr"] == pytest.approx(2e-5 * 5.0) and by_name["base"]["lr"] == 2e-5
    stack = layer_stack(model)
    assert {id(p) for p in by_name["reinit"]["params"]} == {
        id(p) for i in (2, 3) for p in stack[i].parameters()}
    # The last layer is in its group too (the original code dropped it from both optimizers).
    assert all(id(p) in ids for p in stack[-1].parameters())


def test_weight_distance_is_zero_without_change_and_per_layer(pretrained):
    from trainables.finetune import layer_weights, weight_distance

    model = surgery(pretrained, Reinit())
    start = layer_weights(model)
    assert weight_distance(start, model) == [0.0] * 4
    feed_forward = layer_stack(model)[1].get_submodule(family(model.config).feed_forward[0])
    with torch.no_grad():
        feed_forward.weight.add_(1.0)
    distance = weight_distance(start, model)
    size = feed_forward.weight.numel()
    assert distance[1] == pytest.approx(size ** 0.5) and distance[0] == distance[2] == distance[3] == 0.0


# --- a BERT checkpoint saved without its pooler ------------------------------------------------------------


@pytest.fixture(scope="module")
def poolerless(tmp_path_factory):
    """A BERT saved as masked-LM training saves it: no pooler weights (the classifier draws one fresh)."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    folder = tmp_path_factory.mktemp("bert-without-pooler")
    BertModel(config, add_pooling_layer=False).save_pretrained(folder, safe_serialization=True)
    return load_pretrained(str(folder))


def test_a_pooler_the_checkpoint_lacks_is_not_read_as_a_pretrained_one(poolerless, tiny_bert):
    from trainables.models import classifier_skeleton, encoder_state, mark_loaded, pretrained_pooler
    from trainables.probing import ProbeConfig, probe_subset

    assert not any(k.startswith("pooler.") for k in poolerless.state_dict)
    model = build_classifier(poolerless, num_labels=2, seed=0)
    assert pooler(model) is not None and pretrained_pooler(model) is None  # fresh: the classifier needs one
    skeleton = classifier_skeleton(poolerless, 2)
    mark_loaded(skeleton.base_model, encoder_state(skeleton.base_model, poolerless))  # the fused engine's way
    assert pretrained_pooler(skeleton) is None
    with_pooler = build_classifier(load_pretrained(tiny_bert), num_labels=2, seed=0)
    assert pretrained_pooler(with_pooler) is pooler(with_pooler) is not None
    # [CLS] probes read "the pretrained pooler": on a random one they would report numbers about nothing.
    cfg = ProbeConfig(task="sst2", train_size=10, subset_seed=0, seed=0)
    for probe in ("cls-pooler", "truncated"):
        with pytest.raises(ValueError, match=f"probe '{probe}' reads the pooler"):
            probe_subset(cfg, None, poolerless, [(probe, 1)])


def test_a_sweep_that_reads_or_resets_a_pooler_the_checkpoint_lacks_is_refused_before_ray(poolerless):
    # Each of its trials would fail (a [CLS] probe) or compare two random poolers (--reinit-pooler).
    from sweep.api import configure
    from sweep.cli import buildable, model_limits
    from sweep.config import Refused

    folder = poolerless.path
    limits = model_limits(folder, dry_run=False)
    assert limits.has_pooler, "its family has one: the checkpoint's weights tell"
    with pytest.raises(Refused, match="--probes: cls-pooler read the pooler; .* from a checkpoint saved without a "
                                      "pooler.*; allowed for it: mean-pool"):
        buildable(folder, configure("probing", model=folder, probes=["cls-pooler", "mean-pool"]), limits)
    with pytest.raises(Refused, match="--reinit-pooler: .* has no pretrained pooler .* saved without a pooler"):
        buildable(folder, configure("incremental", model=folder, reinit_pooler=True), limits)
    built = buildable(folder, configure("incremental", model=folder), limits)
    assert built.state_dict.keys() == poolerless.state_dict.keys()
