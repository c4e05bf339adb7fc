"""The declarations of settings live in trialrows.declare (the sweep, the trainables and the analysis all read
them); this name stays for code that imports them from here."""
from trialrows.declare import (Check, Limits, Option, at_least, declared, each, fraction, in_heads,  # noqa: F401
                               in_layers, known_task, non_negative, parse_groups, positive, setting)
