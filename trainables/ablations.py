"""Ablations: small immutable values, and the one function that applies each to a model.

Layers are numbered as in the paper: 1..L from the bottom, so "keep layers 1..k" reads the same in code,
in the Parquet rows and in the figures. Adding an ablation means adding a frozen dataclass and registering
its `apply_ablation` case here; the trainable never needs to know which one it got.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
from torch import nn

from trainables.models import layer_stack, pooler

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


@functools.singledispatch
def apply_ablation(ablation, model: nn.Module, seed: int) -> nn.Module:
    raise TypeError(f"no apply_ablation case for {type(ablation).__name__}")


@apply_ablation.register
def _(ablation: Reinit, model: nn.Module, seed: int) -> nn.Module:
    stack = layer_stack(model)
    bad = [i for i in ablation.layers if not 1 <= i <= len(stack)]
    if bad:
        raise ValueError(f"reinit_layers {bad} are outside 1..{len(stack)} for this {len(stack)}-layer model")
    for i in ablation.layers:
        reinit_module(stack[i - 1], ablation.mode, ablation.keep_layernorm, layer_generator(seed, i))
    if ablation.reinit_pooler:
        found = pooler(model)
        if found is None:
            raise ValueError("reinit_pooler=True but this model has no pooler")
        reinit_module(found, ablation.mode, ablation.keep_layernorm, layer_generator(seed, 0))
    return model


# The ablations a trial config may name; the dict form is what travels in Ray configs and Parquet rows.
ABLATIONS = {"reinit": Reinit}


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
