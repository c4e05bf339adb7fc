"""A setting declared once: its name, type, default, help and allowed values.

A setting is a field of a frozen dataclass (`setting(...)` gives the field its declaration) or, for an
experiment's own options, a standalone `Option`. The command line (its flag, `--help`, the type each word is
read as), a config file's key, the checks (dry runs too), the Tune config, a trial's identity and its row's
column are all made from the declaration, so a setting cannot be read one way and checked or stored another.

A check returns why a value is refused (the value first, then what is allowed); the flag is put in front, so
every refusal reads `--flag: VALUE why`. This module is pure Python: the sweep, the trainables and the
analysis all import it.
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Iterable, Mapping
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the checks may compare against: the model's shape and the tasks that can be named."""

    model: str = ""
    num_layers: int = 0
    num_heads: int | None = None
    max_positions: int | None = None  # None: the model has no fixed number of positions (or it is not known)
    known_tasks: tuple[str, ...] = ()
    model_type: str = ""
    has_pooler: bool = True  # whether its classifier has a pretrained pooler (its family's, and its checkpoint's)

    def no_pooler(self) -> str:
        """Why a model without one has no pretrained pooler, for a refusal."""
        return (f"has no pretrained pooler (a '{self.model_type}' model's classifier, or one from a checkpoint saved "
                "without a pooler, draws it fresh in every trial)")


Check = Callable[[object, Limits], Iterable[str]]


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting's declaration. `name` is its config-file key, the attribute that holds it and, where it
    is a row column, the column; the flag is `--name-with-dashes` unless given. `Option("--flag", ...)`
    (a flag for a name) declares the same as `Option("flag", ...)`."""

    name: str
    help: str = ""
    type: Callable | None = None  # converts one command-line word (a config file's strings too)
    default: object = None
    nargs: object = None  # "+": a list (held as a tuple); 2: exactly two words
    metavar: object = None
    switch: bool = False  # on/off: --flag and --no-flag
    check: Check | None = None  # applied to the value in effect (after presets), not to None
    bad: tuple[str, ...] = ()  # words that must be refused: the test feeding every option a bad value uses them
    group: str = "grid"
    choices: tuple | None = None  # shown in --help and checked like any other range
    flag: str | None = None
    cli: bool = True  # False: set by a config file or a preset only
    saved: bool = True  # written to the sweep's resolved config (False: what to do this time, e.g. --dry-run)
    identity: bool = True  # for a trial's own settings: part of what it computes (False: changes no number)
    repeats: bool = False  # a list whose values may repeat (else a value given twice is refused)
    show: Callable | None = None  # a value as a config file writes it (default: as it is)
    # The word the value None stands for (--checkpoint-every off): a config file's null means it too. Else
    # null is taken only where None is the declared default ("not given": every k, the recipe's rule).
    null_word: str | None = None
    required: bool = False  # no declared default (a preset gives it), so null has no meaning

    def __post_init__(self):
        if self.name.startswith("--"):  # today's style: the flag names it
            object.__setattr__(self, "flag", self.flag or self.name)
            object.__setattr__(self, "name", self.name[2:].replace("-", "_"))
        if self.flag is None:
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))

    @property
    def dest(self) -> str:
        return self.name

    @property
    def action(self) -> str | None:  # the argparse action of a switch
        return "switch" if self.switch else None

    def add_to(self, group) -> None:
        """Add to an argparse group whose parser sets no default (argument_default=SUPPRESS), so that what the
        user gave can be told from what a preset or the declaration fills in."""
        import argparse

        if not self.cli:
            return
        if self.switch:
            group.add_argument(self.flag, dest=self.name, action=argparse.BooleanOptionalAction, help=self.help)
            return
        kwargs = {"help": self.help, "dest": self.name, "type": self.type, "nargs": self.nargs, "metavar": self.metavar}
        if self.choices and not self.metavar:
            kwargs["metavar"] = "{" + ",".join(map(str, self.choices)) + "}"
        group.add_argument(self.flag, **{k: v for k, v in kwargs.items() if v is not None})

    def read(self, value, where: str = "", *, empty: bool = False):
        """A config file's (or the Python API's) value as this option holds it: words go through `type` as
        on the command line, a list becomes a tuple, a number of the wrong kind is converted (1 for a float
        is 1.0, so the trial's identity is the same whichever way it was written). Raises ValueError naming
        the option. `empty`: an empty list is taken even where the command line needs a value (the caller
        knows it means something, e.g. --sizes replaced by --fractions)."""
        name = where or self.flag
        if value is None:
            if self.holds_none:
                return None
            raise ValueError(f"{name}: null has no meaning here; allowed: {self.allowed()}"
                             + ("" if self.required else f" (or leave it out: default {self._default_word()})"))
        if self.switch:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
                return value.lower() in ("true", "yes", "on")
            raise ValueError(f"{name}: {value!r} is not true or false")
        if self.nargs is not None:
            items = list(value) if _is_list(value) else [value]
            # The command line's nargs "+" needs a value; a file's [] would otherwise mean none (k, tasks) or,
            # for a default of None, every one (layers): the opposite of what an empty list looks like.
            if not items and self.nargs == "+" and self.default != () and not empty:
                raise ValueError(f"{name}: [] names nothing; give at least one value: {self._one_value()}")
            if self.nargs not in ("+", "*") and len(items) != self.nargs:
                raise ValueError(f"{name}: {value!r} must be {self.nargs} values")
            return tuple(self._one(item, name) for item in items)
        return self._one(value, name)

    @property
    def holds_none(self) -> bool:
        """Whether None is a value of this option (its default, or what its null_word means)."""
        return self.null_word is not None or (self.default is None and not self.required)

    def allowed(self) -> str:
        """What a value of this option is, in words, for a refusal."""
        return self._one_value() if self.nargs is None else f"{self._one_value()} (one or more)"

    def _one_value(self) -> str:
        if self.switch:
            return "true or false"
        if self.choices:
            word = "one of " + ", ".join(map(str, self.choices))
        else:
            word = {int: "a whole number", float: "a number"}.get(self.type)
            if word is None and isinstance(self.metavar, str) and len(self.metavar) > 1:
                word = self.metavar
            word = word or _first_clause(self.help)
        return f"{word} or {self.null_word}" if self.null_word else word

    def _default_word(self) -> str:
        shown = self.written(self.default)
        if isinstance(shown, list):
            return " ".join(map(str, shown)) or "none"
        return str(shown).lower() if isinstance(shown, bool) else str(shown)

    def _one(self, value, name: str):
        if value is None:
            return None
        convert = self.type or str
        if convert in (int, float, str) and isinstance(value, (Mapping, list, tuple, set, frozenset)):
            # str() would make a list of one a sweep named "['a']" or a folder "['x']"
            kind = "a mapping" if isinstance(value, Mapping) else "a list"
            raise ValueError(f"{name}: {value!r} is {kind}, not one value; allowed: {self.allowed()}")
        if isinstance(value, bool) and convert not in (int, float):
            value = self._boolean_word(value, name)
        if isinstance(value, bool) and convert in (int, float):
            raise ValueError(f"{name}: {value!r} is not a number")
        if convert in (int, float, str) and isinstance(value, (int, float, str)):
            if convert is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{name}: {value!r} is not a whole number")
            try:
                return convert(value) if not (convert is int and isinstance(value, float)) else int(value)
            except ValueError:
                raise ValueError(f"{name}: {value!r} is not {'a whole number' if convert is int else 'a number'}") \
                    from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # a number where a word is read (--trials 3, --checkpoint-every 0)
        try:  # a word, or a held form the converter takes back (a config file's mapping, the API's tuple)
            return convert(value)
        except Exception as err:  # argparse.ArgumentTypeError, ValueError: the converter says why
            raise ValueError(f"{name}: {err}") from None

    def _boolean_word(self, value: bool, name: str) -> str:
        """The word a YAML/TOML boolean was written as, for an option that is not a switch. YAML reads a bare
        off (no, false) as False, which a converter would read as 0 (--checkpoint-every 0: every epoch, where
        off is never); so the option's own word for it is taken, or the value refused."""
        words = ("on", "yes", "true") if value else ("off", "no", "false")
        if self.type not in (None, str) or self.choices is not None:  # else any word is a value: which one?
            for word in words:
                if self.choices is not None and word not in self.choices:
                    continue
                try:
                    if self.type not in (None, str):
                        self.type(word)
                except Exception:  # the converter refuses this spelling: try the next
                    continue
                return word
        shown = str(value).lower()
        raise ValueError(f"{name}: {shown} (YAML reads a bare {'/'.join(words)} as {shown}) is not a value here; "
                         f"allowed: {self._one_value()} (quote a word: '{words[0]}')")

    def written(self, value):
        """The value as a config file holds it."""
        if self.show is not None:
            return self.show(value)
        if value is None:
            return None
        if isinstance(value, (tuple, list, frozenset)):
            return [self.written_item(v) for v in value]
        return value

    def written_item(self, value):
        return list(value) if isinstance(value, tuple) else value

    def problems(self, value, limits: Limits) -> list[str]:
        if value is None:
            return []
        reasons = []
        items = list(value) if isinstance(value, (list, tuple)) and self.nargs is not None else [value]
        if self.choices is not None:
            for item in items:
                if item not in self.choices:
                    reasons.append(f"'{item}' is not one of {', '.join(map(str, self.choices))}")
        if self.nargs is not None and not self.repeats:
            seen = set()
            for item in items:
                key = repr(item)
                if key in seen:
                    shown = self.show([item])[0] if self.show is not None else self.written_item(item)
                    reasons.append(f"{shown!s} is given twice; give each value once")
                seen.add(key)
        if self.check is not None and not reasons:
            reasons += list(self.check(value, limits))
        return [f"{self.flag}: {reason}" for reason in reasons]


def _is_list(value) -> bool:
    """Whether a value given for a list is its items: a list, a tuple, or another Python sequence (the API's
    k=range(0, 13, 6), a numpy array), but not a word or a mapping (one --task-file's own columns)."""
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))


def _first_clause(help: str) -> str:
    """A help text's description of the value, without what follows it: `a folder (default ./results; ...`
    gives `a folder`."""
    clause = help.split(";")[0]
    if clause.count("(") > clause.count(")"):
        clause = clause[:clause.rindex("(")]
    return re.sub(r"\s*\(default [^()]*\)$", "", clause.strip())


def setting(default=dataclasses.MISSING, help: str = "", **declaration) -> dataclasses.Field:
    """A dataclass field declared as a setting: `lr: float = setting(2e-5, "learning rate", check=positive)`.
    The field's type gives the word type and nargs unless the declaration says."""
    option_default = None if default is dataclasses.MISSING else default
    declaration.setdefault("required", default is dataclasses.MISSING)
    return dataclasses.field(default=default, metadata={"option": {"help": help, "default": option_default,
                                                                   **declaration}})


def declared(cls) -> tuple[Option, ...]:
    """The Options of a dataclass's fields declared with `setting`, in field order."""
    hints = typing.get_type_hints(cls)
    options = []
    for field in dataclasses.fields(cls):
        if "option" not in field.metadata:
            continue
        declaration = dict(field.metadata["option"])
        word, many, switch = _word_type(hints[field.name])
        declaration.setdefault("type", None if switch else word)
        if many:
            declaration.setdefault("nargs", "+")
        declaration.setdefault("switch", switch)
        options.append(Option(field.name, **declaration))
    return tuple(options)


def _word_type(hint) -> tuple[Callable | None, bool, bool]:
    """(how one word is read, whether it is a list, whether it is a switch) from a field's type."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        return _word_type(args[0])
    if hint is bool:
        return None, False, True
    if typing.get_origin(hint) is tuple:
        inner = typing.get_args(hint)[0] if typing.get_args(hint) else str
        return (inner if inner in (int, float, str) else None), True, False
    if hint in (int, float, str):
        return hint, False, False
    return None, False, False


ARROW_TYPES = {int: "int64", float: "float64", str: "string", bool: "bool"}


def arrow_type(cls, name: str) -> str:
    """The Arrow type (an alias pyarrow knows) of a declared field's row column."""
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args and typing.get_origin(hint) is not tuple else hint
    if typing.get_origin(base) is tuple:
        return f"list<item: {ARROW_TYPES[typing.get_args(base)[0]]}>"
    return ARROW_TYPES[base]


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
