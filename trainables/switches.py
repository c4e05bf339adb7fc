"""The GPU path's environment switches, each declared once with what its two values mean: read where a pack
decides (`switch_on`), and every one checked before a sweep starts (`switch_problems`, sweep.cli), so that a
misspelt value is refused before any work rather than taken as on or off."""
from __future__ import annotations

import os

CUDA_GRAPHS = "REINIT_SWEEP_CUDA_GRAPHS"
TRITON = "REINIT_SWEEP_TRITON"
# name -> (what 1, the default, means; what 0 means)
SWITCHES = {
    CUDA_GRAPHS: ("steps replayed as CUDA graphs on GPUs", "every step run op by op"),
    TRITON: ("Triton kernels on GPUs for the update and the dropout masks", "torch's ops alone"),
}


def switch_problem(name: str) -> str | None:
    """What is wrong with switch `name`'s value, if anything (unset or empty: the default, on)."""
    value = os.environ.get(name)
    if value in (None, "", "0", "1"):
        return None
    on, off = SWITCHES[name]
    return f"{name}={value!r}: allowed are 1 ({on}, the default) and 0 ({off})"


def switch_problems() -> list[str]:
    return [problem for problem in map(switch_problem, SWITCHES) if problem]


def switch_on(name: str) -> bool:
    """Whether switch `name` is on (unless "0"); a value it does not allow raises, naming what is allowed."""
    problem = switch_problem(name)
    if problem:
        raise ValueError(problem)
    return os.environ.get(name) != "0"
