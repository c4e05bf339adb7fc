"""The benchmarks' stand-ins, held to what they stand in for."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.torch_version.TorchVersion(torch.__version__) < (2, 13), reason="a copy of torch 2.13's")
def test_the_torch_2_13_draws_are_the_installed_torch_2_13s():
    """fused_bench --draws torch-2.13 times a user's set-up on a host whose torch draws otherwise (the lent GPU
    machines' 2.11): its copy must draw 2.13's very values and leave the generator where 2.13 does."""
    fused_bench = benchmark("fused_bench")
    for shape, seed in (((768, 768), 0), ((3072, 768), 1), ((37,), 2), ((5, 3), 3)):
        ours, theirs = torch.empty(shape), torch.empty(shape)
        g_ours, g_theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(2):
            fused_bench.torch_2_13_trunc_normal(ours, 0.0, 0.02, -0.04, 0.04, generator=g_ours)
            torch.nn.init.trunc_normal_(theirs, 0.0, 0.02, -0.04, 0.04, generator=g_theirs)
            assert torch.equal(ours, theirs), shape
        assert torch.equal(g_ours.get_state(), g_theirs.get_state()), shape
    with fused_bench.drawn_as("torch-2.13"):  # what nn.init.trunc_normal_ calls, looked up at each call
        assert torch.nn.init._no_grad_trunc_normal_ is fused_bench.torch_2_13_trunc_normal
    assert torch.nn.init._no_grad_trunc_normal_ is not fused_bench.torch_2_13_trunc_normal
    with pytest.raises(ValueError, match="over 30% of the mass"):
        fused_bench.torch_2_13_trunc_normal(torch.empty(4), 0.0, 1.0, 3.0, 4.0)


def test_the_torch_cache_arm_gives_each_group_a_fresh_page_locked_buffer(monkeypatch):
    """fused_bench --host-banks torch-cache: the engine as it was before a call held one buffer for its groups'
    banks (trainables.fused.HostBanks), for the next GPU session to time against."""
    from trainables import fused

    fused_bench = benchmark("fused_bench")
    locked = []
    monkeypatch.setattr(fused, "page_locked", lambda numel: locked.append(numel) or torch.empty(numel))
    held = fused.HostBanks()
    with fused_bench.banks_from("torch-cache"):
        first, second = held.take(64), held.take(64)
    assert len(locked) == 2 and first.data_ptr() != second.data_ptr()
    with fused_bench.banks_from("held"):
        first, second = held.take(64), held.take(48)
    assert len(locked) == 3 and first.data_ptr() == second.data_ptr()
