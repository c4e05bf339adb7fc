"""Ablations: small immutable values, and the one function that applies each to a model.

Layers are numbered as in the paper: 1..L from the bottom, so "keep layers 1..k" reads the same in code,
in the Parquet rows and in the figures; attention heads are numbered 0..H-1. Adding an ablation means adding
a frozen dataclass (with a `columns()` method: what it contributes to a trial's row), registering its
`apply_ablation` case and naming it in ABLATIONS, all here; the trainable never needs to know which one it got.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
from torch import nn

from trainables.models import FAMILIES, family, layer_stack, pooler
from trialrows.experiments import SUBLAYERS  # the row vocabulary, declared once

# What the paper intends (appendix B): N(0, 0.02) truncated to (-0.04, 0.04) for every non-LayerNorm
# parameter, LayerNorm reset to the identity.
INIT_STD = 0.02
INIT_BOUND = 0.04
REINIT_MODES = ("intended", "paper-code")


@dataclasses.dataclass(frozen=True)
class Reinit:
    """Reinitialize the given layers (1-based), optionally the pooler, as `mode` says.

    mode "intended" is the paper's description; "paper-code" reproduces the original code: nn.Linear weights
    only (biases stay pretrained), drawn from scipy's truncnorm with the bounds misread as absolute values,
    i.e. truncated at +-0.04 * 0.02, so the draws are ~43x smaller than intended.
    """

    layers: tuple[int, ...] = ()
    mode: str = "intended"
    keep_layernorm: bool = False
    reinit_pooler: bool = False

    def __post_init__(self):
        if self.mode not in REINIT_MODES:
            raise ValueError(f"reinit_mode '{self.mode}' is not one of {', '.join(REINIT_MODES)}")
        object.__setattr__(self, "layers", tuple(sorted(set(int(i) for i in self.layers))))

    @classmethod
    def incremental(cls, k: int, num_layers: int, **options) -> "Reinit":
        """Keep layers 1..k pretrained and reinitialize k+1..L (k = L is the original model)."""
        if not 0 <= k <= num_layers:
            raise ValueError(f"k={k} is outside 0..{num_layers} for a model with {num_layers} layers")
        return cls(layers=tuple(range(k + 1, num_layers + 1)), **options)

    def columns(self) -> dict:
        return {"reinit_layers": list(self.layers), "reinit_mode": self.mode,
                "keep_layernorm": self.keep_layernorm, "reinit_pooler": self.reinit_pooler}


@dataclasses.dataclass(frozen=True)
class Permute:
    """Every layer pretrained, in a shuffled order: the permuted model's layer i (1-based) holds pretrained
    layer order[i-1] (values 1-based too). Embeddings, pooler and head stay where they are."""

    order: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "order", tuple(int(i) for i in self.order))
        if sorted(self.order) != list(range(1, len(self.order) + 1)):
            raise ValueError(f"permutation {list(self.order)} is not an ordering of layers 1..{len(self.order)}")

    @classmethod
    def from_seed(cls, permutation_seed: int, num_layers: int) -> "Permute":
        """The layer order a seed gives; any non-negative seed (0 included) and any layer count."""
        if permutation_seed < 0:
            raise ValueError(f"permutation_seed {permutation_seed} must be non-negative")
        rng = np.random.default_rng(np.random.SeedSequence([int(permutation_seed), PERMUTATION_STREAM]))
        return cls(order=tuple(int(i) + 1 for i in rng.permutation(num_layers)))

    def columns(self) -> dict:
        return {"reinit_layers": [], "reinit_mode": None, "keep_layernorm": False, "reinit_pooler": False,
                "permutation": list(self.order)}


PERMUTATION_STREAM = 0x5E12  # keeps permutation draws apart from every other use of the same integer seed


@dataclasses.dataclass(frozen=True)
class HeadReinit:
    """Reinitialize one attention head (0-based `head`) of one layer (1-based `layer`): the head's rows of
    the query, key and value projections (weights and, in intended mode, biases) and the matching input
    columns of the attention output projection. Everything else, that projection's bias included, is kept.
    mode "paper-code" draws as the original code did (weights only, its ~43x too small truncation)."""

    layer: int
    head: int
    mode: str = "intended"

    def __post_init__(self):
        if self.mode not in REINIT_MODES:
            raise ValueError(f"reinit_mode '{self.mode}' is not one of {', '.join(REINIT_MODES)}")

    def columns(self) -> dict:
        return {"reinit_layers": [], "reinit_mode": self.mode, "keep_layernorm": False, "reinit_pooler": False}


def layer_generator(seed: int, layer: int) -> torch.Generator:
    """One stream per (seed, layer): layer j gets the same fresh weights whichever other layers are reset,
    so conditions that share a seed differ only in which layers were reset."""
    state = np.random.SeedSequence([int(seed), int(layer)]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def _reset_layernorm(module: nn.LayerNorm) -> None:
    nn.init.ones_(module.weight)
    nn.init.zeros_(module.bias)


@torch.no_grad()
def reinit_module(module: nn.Module, mode: str, keep_layernorm: bool, generator: torch.Generator) -> None:
    bound = INIT_BOUND if mode == "intended" else INIT_BOUND * INIT_STD
    for sub in module.modules():
        if isinstance(sub, nn.LayerNorm):
            if not keep_layernorm:
                _reset_layernorm(sub)
            continue
        own = list(sub.named_parameters(recurse=False))
        if mode == "paper-code":
            own = [(n, p) for n, p in own if isinstance(sub, nn.Linear) and n == "weight"]
        for _, param in own:
            nn.init.trunc_normal_(param, mean=0.0, std=INIT_STD, a=-bound, b=bound, generator=generator)


def checked_stack(model: nn.Module, layers, what: str) -> nn.ModuleList:
    """The model's layer stack, once every 1-based layer an ablation names is known to be in it."""
    stack = layer_stack(model)
    bad = [i for i in layers if not 1 <= i <= len(stack)]
    if bad:
        raise ValueError(f"{what} {bad} are outside 1..{len(stack)} for this {len(stack)}-layer model")
    return stack


@functools.singledispatch
def apply_ablation(ablation, model: nn.Module, seed: int) -> nn.Module:
    raise TypeError(f"no apply_ablation case for {type(ablation).__name__}")


@apply_ablation.register
def _(ablation: Reinit, model: nn.Module, seed: int) -> nn.Module:
    stack = checked_stack(model, ablation.layers, "reinit_layers")
    found = pooler(model) if ablation.reinit_pooler else None
    if ablation.reinit_pooler and found is None:  # refused before a layer is touched
        with_pooler = [name for name, fam in FAMILIES.items() if fam.pooler and not fam.not_layerwise]
        raise ValueError(f"reinit_pooler=True but this model has no pooler: a '{model.config.model_type}' "
                         f"classifier draws its head fresh in every trial; allowed for: {', '.join(with_pooler)}")
    for i in ablation.layers:
        reinit_module(stack[i - 1], ablation.mode, ablation.keep_layernorm, layer_generator(seed, i))
    if found is not None:
        reinit_module(found, ablation.mode, ablation.keep_layernorm, layer_generator(seed, 0))
    return model


@apply_ablation.register
def _(ablation: Permute, model: nn.Module, seed: int) -> nn.Module:
    stack = layer_stack(model)
    if len(ablation.order) != len(stack):
        raise ValueError(f"permutation {list(ablation.order)} has {len(ablation.order)} layers; "
                         f"this model has {len(stack)}")
    layers = list(stack)
    for i, source in enumerate(ablation.order):
        stack[i] = layers[source - 1]
    for i, layer in enumerate(stack):  # layers that know their index (cache bookkeeping) learn the new one
        attention = getattr(getattr(layer, "attention", None), "self", None)
        if attention is not None and hasattr(attention, "layer_idx"):
            attention.layer_idx = i
    return model


def attention_projections(model: nn.Module, layer: nn.Module) -> tuple[list[nn.Linear], nn.Linear]:
    """(the projections whose output rows belong to heads, the attention output projection whose input
    columns do) of one layer. DeBERTa's relative-position projections, when not shared with key and query,
    belong to heads too."""
    fam = family(model.config)
    *inputs, output = (layer.get_submodule(path) for path in fam.attention)
    attention = layer.get_submodule(fam.attention[0].rpartition(".")[0])
    inputs += [getattr(attention, name) for name in ("pos_key_proj", "pos_query_proj") if hasattr(attention, name)]
    return inputs, output


def num_attention_heads(model: nn.Module) -> int:
    return int(model.config.num_attention_heads)


@apply_ablation.register
def _(ablation: HeadReinit, model: nn.Module, seed: int) -> nn.Module:
    stack = layer_stack(model)
    heads = num_attention_heads(model)
    if not 1 <= ablation.layer <= len(stack):
        raise ValueError(f"head reinit layer {ablation.layer} is outside 1..{len(stack)} for this model")
    if not 0 <= ablation.head < heads:
        raise ValueError(f"head {ablation.head} is outside 0..{heads - 1} (this model has {heads} heads per layer)")
    inputs, output = attention_projections(model, stack[ablation.layer - 1])
    width = output.in_features // heads
    rows = slice(ablation.head * width, (ablation.head + 1) * width)
    bound = INIT_BOUND if ablation.mode == "intended" else INIT_BOUND * INIT_STD
    generator = layer_generator(seed, 1000 * ablation.layer + ablation.head)
    draw = lambda t: nn.init.trunc_normal_(t, mean=0.0, std=INIT_STD, a=-bound, b=bound, generator=generator)  # noqa: E731
    with torch.no_grad():
        for linear in inputs:
            fresh = draw(torch.empty_like(linear.weight[rows]))
            linear.weight[rows] = fresh
            if ablation.mode == "intended" and linear.bias is not None:
                linear.bias[rows] = draw(torch.empty_like(linear.bias[rows]))
        output.weight[:, rows] = draw(torch.empty_like(output.weight[:, rows]))
    return model


@dataclasses.dataclass(frozen=True)
class SublayerReinit:
    """Reinitialize one block of each given layer (1-based): its attention (query, key, value and output
    projections, and DeBERTa's own relative-position projections) or its feed-forward block, each with the
    LayerNorm that follows it (kept with keep_layernorm). The rest of the layer stays pretrained."""

    layers: tuple[int, ...]
    sublayer: str
    mode: str = "intended"
    keep_layernorm: bool = False

    def __post_init__(self):
        if self.mode not in REINIT_MODES:
            raise ValueError(f"reinit_mode '{self.mode}' is not one of {', '.join(REINIT_MODES)}")
        if self.sublayer not in SUBLAYERS:
            raise ValueError(f"sublayer '{self.sublayer}' is not one of {', '.join(SUBLAYERS)}")
        object.__setattr__(self, "layers", tuple(sorted(set(int(i) for i in self.layers))))

    def columns(self) -> dict:
        # No whole layer is new: reinit_layers stays empty, so learning-rate multipliers leave it alone.
        return {"reinit_layers": [], "reinit_mode": self.mode, "keep_layernorm": self.keep_layernorm,
                "reinit_pooler": False}


@apply_ablation.register
def _(ablation: SublayerReinit, model: nn.Module, seed: int) -> nn.Module:
    stack = checked_stack(model, ablation.layers, "sublayer layers")
    fam = family(model.config)
    part = SUBLAYERS.index(ablation.sublayer)
    for i in ablation.layers:
        layer = stack[i - 1]
        if part == 0:
            inputs, output = attention_projections(model, layer)
            modules = [*inputs, output]
        else:
            modules = [layer.get_submodule(path) for path in fam.feed_forward]
        modules.append(layer.get_submodule(fam.layer_norms[part]))
        # Its own stream per (layer, block): the attention draw is the same whether or not the feed-forward
        # block of that layer is reset too.
        generator = layer_generator(seed, SUBLAYER_STREAM + 10 * i + part)
        for module in modules:
            reinit_module(module, ablation.mode, ablation.keep_layernorm, generator)
    return model


SUBLAYER_STREAM = 0x5B1A0000


@dataclasses.dataclass(frozen=True)
class Scratch:
    """Every layer as Reinit draws it, and every other pretrained part of the encoder but the pooler too:
    the embeddings (word, position, token type, their LayerNorm; ELECTRA's projection; DeBERTa's relative
    positions), drawn as BERT initializes them (N(0, 0.02) truncated, padding rows zero, LayerNorm the
    identity). Nothing pretrained is left but the tokenizer (and the pooler, unless reinit_pooler). In
    paper-code mode the layers are drawn as the original code drew them; the rest, which that code never
    reset, as intended."""

    layers: tuple[int, ...]
    mode: str = "intended"
    reinit_pooler: bool = False

    def __post_init__(self):
        if self.mode not in REINIT_MODES:
            raise ValueError(f"reinit_mode '{self.mode}' is not one of {', '.join(REINIT_MODES)}")
        object.__setattr__(self, "layers", tuple(sorted(set(int(i) for i in self.layers))))

    def columns(self) -> dict:
        return {"reinit_layers": list(self.layers), "reinit_mode": self.mode, "keep_layernorm": False,
                "reinit_pooler": self.reinit_pooler, "reinit_embeddings": True}


EMBEDDINGS_STREAM = 0xE3B  # keeps the embeddings' draw apart from every layer's (layers use 0..L)


@apply_ablation.register
def _(ablation: Scratch, model: nn.Module, seed: int) -> nn.Module:
    # The layers get the very draws of Reinit (incremental k = 0): the two differ in the embeddings alone.
    apply_ablation(Reinit(ablation.layers, ablation.mode, reinit_pooler=ablation.reinit_pooler), model, seed)
    return apply_ablation(Embeddings(), model, seed)


@dataclasses.dataclass(frozen=True)
class Embeddings:
    """Every pretrained part of the encoder outside its layers and pooler, drawn as BERT initializes it: the
    embeddings (word, position, token type, their LayerNorm; ELECTRA's projection; DeBERTa's relative
    positions). Every layer and the pooler stay pretrained. The original code never reset them, so there is
    no paper-code way to."""

    def columns(self) -> dict:
        return {"reinit_layers": [], "reinit_mode": "intended", "keep_layernorm": False, "reinit_pooler": False,
                "reinit_embeddings": True}


@apply_ablation.register
def _(ablation: Embeddings, model: nn.Module, seed: int) -> nn.Module:
    base = getattr(model, "base_model", model)
    found = pooler(model)
    done = {id(p) for part in (layer_stack(model), found) if part is not None for p in part.parameters()}
    generator = layer_generator(seed, EMBEDDINGS_STREAM)
    with torch.no_grad():
        for module in base.modules():
            if any(id(p) not in done for p in module.parameters(recurse=False)):
                reinit_module(module, "intended", keep_layernorm=False, generator=generator)
                done |= {id(p) for p in module.parameters()}
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
    return model


def reinitialized_layers(ablation) -> tuple[int, ...]:
    """The layers (1-based) an ablation replaced with fresh weights: those a learning-rate multiplier scales."""
    return tuple(ablation.columns()["reinit_layers"])


# The ablations a trial config may name; the dict form is what travels in Ray configs and Parquet rows.
ABLATIONS = {"reinit": Reinit, "permute": Permute, "head": HeadReinit, "sublayer": SublayerReinit,
             "scratch": Scratch, "embeddings": Embeddings}


def ablation_to_dict(ablation) -> dict:
    kind = next(name for name, cls in ABLATIONS.items() if isinstance(ablation, cls))
    fields = dataclasses.asdict(ablation)
    return {"kind": kind, **{k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}}


def ablation_from_dict(spec: dict):
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind not in ABLATIONS:
        raise ValueError(f"ablation kind '{kind}' is not one of {', '.join(ABLATIONS)}")
    cls = ABLATIONS[kind]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) and k in fields else v for k, v in spec.items()})
