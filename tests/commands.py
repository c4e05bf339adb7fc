"""Command lines for tests that run a base command with some of its options changed."""
from __future__ import annotations


def overridden(argv: list[str], extra) -> list[str]:
    """`argv` with the options in `extra` in place of its own (values and all), then `extra`: the command line
    refuses an option given twice, where argparse would keep the last."""
    replaced = {word.partition("=")[0] for word in extra if word.startswith("--")}
    kept, dropping = [], False
    for word in argv:
        if word.startswith("--"):
            dropping = word.partition("=")[0] in replaced
        if not dropping:
            kept.append(word)
    return [*kept, *extra]
