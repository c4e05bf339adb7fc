"""A command-line option declared once: its flag, type, default, help, and what values it allows.

The parser, the validation (dry runs too) and `--help` are all made from these declarations, so an option
cannot be parsed one way and checked another. A check returns why a value is refused (the value first,
then what is allowed); the flag is put in front, so every refusal reads `--flag: VALUE why`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the checks may compare against: the model's shape and the tasks that can be named."""

    model: str = ""
    num_layers: int = 0
    num_heads: int | None = None
    max_positions: int | None = None  # None: the model has no fixed number of positions (or it is not known)
    known_tasks: tuple[str, ...] = ()
    model_type: str = ""
    has_pooler: bool = True  # whether its classifier has a pretrained pooler


Check = Callable[[object, Limits], Iterable[str]]


@dataclasses.dataclass(frozen=True)
class Option:
    flag: str  # "--block-size"
    help: str = ""
    type: Callable | None = None  # converts one command-line word
    default: object = None
    nargs: object = None
    metavar: object = None
    action: str | None = None  # "store_true" for switches
    check: Check | None = None  # applied to the value in effect (after presets), not to None
    bad: tuple[str, ...] = ()  # words that must be refused: the test feeding every option a bad value uses them
    group: str = "grid"
    field: str | None = None  # the GridSettings field it fills, when not named like the flag
    choices: tuple | None = None  # shown in --help and checked like any other range

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def setting(self) -> str:
        return self.field or self.dest

    def add_to(self, group, default) -> None:
        kwargs = {"help": self.help, "dest": self.dest}
        if self.action:
            kwargs["action"] = self.action
        else:
            kwargs.update(type=self.type, nargs=self.nargs, metavar=self.metavar)
            if self.choices and not self.metavar:
                kwargs["metavar"] = "{" + ",".join(map(str, self.choices)) + "}"
        kwargs["default"] = False if self.action == "store_true" else default
        group.add_argument(self.flag, **{k: v for k, v in kwargs.items() if v is not None or k == "default"})

    def problems(self, value, limits: Limits) -> list[str]:
        if value is None:
            return []
        reasons = []
        if self.choices is not None:
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if item not in self.choices:
                    reasons.append(f"'{item}' is not one of {', '.join(map(str, self.choices))}")
        if self.check is not None and not reasons:
            reasons += list(self.check(value, limits))
        return [f"{self.flag}: {reason}" for reason in reasons]


# --- checks: each says why a value is refused, or nothing -----------------------------------------------


def at_least(low, unit: str = "") -> Check:
    return lambda v, _: [] if v >= low else [f"{v:g} must be at least {low}{unit}"]


def positive(v, _) -> list[str]:
    return [] if 0 < v < math.inf else [f"{v} must be a positive finite number"]


def non_negative(v, _) -> list[str]:
    return [] if 0 <= v < math.inf else [f"{v} must be a finite number >= 0"]


def fraction(v, _) -> list[str]:
    return [] if 0 < v < 1 else [f"{v} must be in (0, 1)"]


def each(check: Check) -> Check:
    return lambda values, limits: [reason for v in values for reason in check(v, limits)]


def in_layers(lowest: int = 1) -> Check:
    """A layer number of this model: 1..L, or 0..L where layer 0 (the embeddings' output) means something."""
    def check(layer, limits):
        if lowest <= layer <= limits.num_layers:
            return []
        return [f"{layer} is outside {lowest}..{limits.num_layers} for {limits.model} ({limits.num_layers} layers)"]
    return check


def in_heads(head, limits) -> list[str]:
    if limits.num_heads is None or 0 <= head < limits.num_heads:
        return []
    return [f"{head} is outside 0..{limits.num_heads - 1} for {limits.model} ({limits.num_heads} attention heads "
            "per layer)"]


def known_task(task, limits) -> list[str]:
    return [] if task in limits.known_tasks else [f"unknown task '{task}'; allowed: {', '.join(limits.known_tasks)}"]


def parse_groups(options: Iterable[Option]) -> dict[str, list[Option]]:
    groups: dict[str, list[Option]] = {}
    for option in options:
        groups.setdefault(option.group, []).append(option)
    return groups
