"""What a computation holds in memory at its peak, on any device: the GPU's allocator says it
(torch.cuda.max_memory_allocated), and on a CPU, which keeps no such count, `MemoryAccountant` keeps it.

The accountant watches every aten op (a TorchDispatchMode) and adds up the bytes of the distinct storages
alive: each storage an op returns is counted once, from the op that made it until it is freed (checked by a
weak reference at every op). Storages that exist before it starts are counted only if handed to `track` (a
pack's weights, its optimizer's moments). It counts what tensors hold, as the GPU allocator's
max_memory_allocated does, not what a caching allocator reserves around it.
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class MemoryAccountant(TorchDispatchMode):
    """Live and peak bytes of the storages that ops make (and those given to `track`) while it is active."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0

    def track(self, *tensors: torch.Tensor) -> None:
        for tensor in tensors:
            self._add(tensor)
        self.peak = max(self.peak, self.now)

    def _add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in self.live:
            return
        self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.now += storage.nbytes()

    def _collect(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.now -= self.live.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._collect()
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
                self._add(leaf)
        self.peak = max(self.peak, self.now)
        return out


def peak_bytes(run, device: torch.device, tracked=()) -> int:
    """Bytes held at the peak of `run()`: the storages of `tracked` and whatever `run` makes on top of what was
    allocated when it began. On a GPU the allocator counts it: its peak minus what it held before (which is not
    only `tracked`: what other packs of this process hold), plus `tracked`'s own. Elsewhere a
    `MemoryAccountant` counts the same."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        card = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        own = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tracked if t.device == card}
        return int(torch.cuda.max_memory_allocated(device) - before + sum(own.values()))
    with MemoryAccountant() as accountant:
        accountant.track(*tracked)
        run()
    return accountant.peak
