"""A training state on disk, readable without unpickling: tensors in safetensors, everything else in JSON.

A state is any nesting of dicts, lists and tuples over tensors, numpy arrays, numbers, strings, booleans and
None: a model's and an optimizer's state_dict, numpy bit-generator states (arbitrarily large integers),
figures so far. `save_state` writes it into a folder as two files: `tensors.safetensors` holds every tensor
and array, `state.json` the rest, with each tensor replaced by a reference to its entry; `load_state` puts it
back. What JSON cannot say on its own is spelled out: tuples, dicts whose keys are not strings (an optimizer's
state is keyed by parameter index), numpy arrays. Loading executes nothing from the files (no pickle, no
torch.load), so a checkpoint from a shared bucket is safe to read.
"""
from __future__ import annotations

import itertools
import json
import os

import numpy as np
import torch

STATE_FILE = "state.json"  # its presence marks a folder holding a state
TENSORS_FILE = "tensors.safetensors"
FORMAT = 1


def has_state(folder: str | os.PathLike) -> bool:
    return os.path.exists(os.path.join(folder, STATE_FILE))


def save_state(folder: str | os.PathLike, state: dict) -> None:
    """Write `state` into `folder` (made if missing). Tensors are copied to the CPU as they are written."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(state, "", tensors)
    save_file(_unshared(tensors), os.path.join(folder, TENSORS_FILE))
    with open(os.path.join(folder, STATE_FILE), "w", encoding="utf-8") as handle:
        json.dump({"format": FORMAT, "state": skeleton}, handle)


class UnreadableState(ValueError):
    """A folder marked as holding a state whose files cannot be read whole: cut short (a node or driver killed
    while the folder was copied to the storage: the marker there, the tensors not, or not all of them), or
    damaged."""


def load_state(folder: str | os.PathLike, device: str | torch.device = "cpu") -> dict:
    """The state `save_state` wrote into `folder`, its tensors on `device`. Raises UnreadableState when its
    files cannot be read whole, ValueError when they are another version's."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        with open(os.path.join(folder, STATE_FILE), encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError) as err:  # json's decoding errors are ValueErrors
        raise UnreadableState(f"{folder}: {STATE_FILE} cannot be read ({err})") from err
    if saved.get("format") != FORMAT:
        raise ValueError(f"state in {folder} has format {saved.get('format')!r}; this version reads {FORMAT}")
    path = os.path.join(folder, TENSORS_FILE)
    try:
        tensors = load_file(path, device=str(device)) if os.path.exists(path) else {}
        return _decode(saved["state"], tensors)
    except (OSError, SafetensorError, KeyError) as err:  # KeyError: a tensor the file should hold is not there
        raise UnreadableState(f"{folder}: {TENSORS_FILE} is missing or cut short ({err!r})") from err


def _encode(value, path: str, tensors: dict):
    if isinstance(value, torch.Tensor):
        return {"__tensor__": _stored(tensors, path, value.detach().to("cpu").contiguous())}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": _stored(tensors, path, torch.from_numpy(np.ascontiguousarray(value)))}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, f"{path}/{k}", tensors) for k, v in value.items()}
        return {"__items__": [[_encode(k, f"{path}/key{i}", tensors), _encode(v, f"{path}/{i}", tensors)]
                              for i, (k, v) in enumerate(value.items())]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"state entry '{path or '/'}' is a {type(value).__name__}; a state holds tensors, arrays, "
                    "numbers, strings, booleans, None and dicts, lists or tuples of them")


def _stored(tensors: dict, path: str, tensor: torch.Tensor) -> str:
    """The name `tensor` is stored under: its path, unless an entry already took it (keys holding '/':
    {"a/b": x} and {"a": {"b": y}} have one path), which would overwrite that entry."""
    name = path
    for n in itertools.count(1):
        if name not in tensors:
            break
        name = f"{path}#{n}"
    tensors[name] = tensor
    return name


def _decode(value, tensors: dict):
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__ndarray__" in value:
        return tensors[value["__ndarray__"]].numpy()
    if "__tuple__" in value:
        return tuple(_decode(v, tensors) for v in value["__tuple__"])
    if "__items__" in value:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__items__"]}
    return {k: _decode(v, tensors) for k, v in value.items()}


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied weights, views of one buffer): those get a copy."""
    seen: set[int] = set()
    out = {}
    for name, tensor in tensors.items():
        pointer = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        out[name] = tensor.clone() if pointer is not None and pointer in seen else tensor
        if pointer is not None:
            seen.add(pointer)
    return out
