"""A field's rule as data: what is allowed, said in words, and the test (torch-free).

A config dataclass declares ``RULES = {field: Rule}``; ``check`` holds an instance to them in field
order and refuses the first bad value with one line, ``<field> must be <allowed>, got <value>``.
The profile (orchestrator/profile) reads the same rules for its own sections and for the decoding
settings it embeds (decoding/config.py's TreeConfig), so a range is written down once.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    allowed: str  # completes "<key> must be ..."
    ok: Callable[[object], bool]


class RuleError(ValueError):
    """A value its field's rule refuses: ``field``, ``rule`` and ``value`` for callers that reword it."""

    def __init__(self, msg: str, field: str, rule: Rule, value):
        super().__init__(msg)
        self.field = field
        self.rule = rule
        self.value = value


def check(obj, prefix: str = "") -> None:
    """Every field of ``obj`` that its class's RULES names, in field order (``prefix`` goes before
    the field's name in the message)."""
    rules = type(obj).RULES
    for f in dataclasses.fields(obj):
        if f.name in rules and not rules[f.name].ok(v := getattr(obj, f.name)):
            rule = rules[f.name]
            raise RuleError(f"{prefix}{f.name} must be {rule.allowed}, got {v!r}", f.name, rule, v)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # YAML true/false are bools, and bool is an int


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bounds(lo, hi, lo_open: bool) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    return f" {'>' if lo_open else '>='} {lo:g}" if lo is not None else ""


def _in(v, lo, hi, lo_open: bool) -> bool:
    return (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or v <= hi)


def integer(lo: int | None = None, hi: int | None = None) -> Rule:
    return Rule("an integer" + _bounds(lo, hi, False), lambda v: is_int(v) and _in(v, lo, hi, False))


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Rule:
    return Rule("a number" + _bounds(lo, hi, lo_open), lambda v: is_num(v) and _in(v, lo, hi, lo_open))


def _words(choices) -> str:
    w = ["null" if c is None else str(c) for c in choices]
    return w[0] if len(w) == 1 else ", ".join(w[:-1]) + " or " + w[-1]


def one_of(*choices) -> Rule:  # strings (and None): 1 == True, so never for ints
    return Rule(_words(choices), lambda v: (v is None or isinstance(v, str)) and v in choices)


def optional(rule: Rule) -> Rule:
    return Rule("null or " + rule.allowed, lambda v: v is None or rule.ok(v))


def text(nonempty: bool = False) -> Rule:
    return Rule("a non-empty string" if nonempty else "a string",
                lambda v: isinstance(v, str) and (v.strip() != "" or not nonempty))


def subset(choices, min_len: int = 1) -> Rule:
    n = {0: "a list", 1: "a non-empty list"}.get(min_len, f"a list of >= {min_len}")
    return Rule(f"{n} of distinct values from [{', '.join(choices)}]",
                lambda v: isinstance(v, list) and len(v) >= min_len and len(set(map(str, v))) == len(v)
                and all(isinstance(x, str) and x in choices for x in v))


def numbers(lo: float, hi: float | None = None, nonempty: bool = True) -> Rule:
    return Rule(f"{'a non-empty' if nonempty else 'a'} list of distinct numbers{_bounds(lo, hi, False)}",
                lambda v: isinstance(v, list) and (bool(v) or not nonempty)
                and all(is_num(x) and _in(x, lo, hi, False) for x in v) and len(set(v)) == len(v))


def integers(lo: int, hi: int) -> Rule:
    return Rule(f"a non-empty list of distinct integers{_bounds(lo, hi, False)}",
                lambda v: isinstance(v, list) and bool(v) and len(set(v)) == len(v)
                and all(is_int(x) and lo <= x <= hi for x in v))


def booleans() -> Rule:
    return Rule("a non-empty list of distinct true/false values",
                lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, bool) for x in v)
                and len(set(v)) == len(v))


def mapping(of: str) -> Rule:
    return Rule(f"a mapping of {of}", lambda v: isinstance(v, dict))


BOOL = Rule("true or false", lambda v: isinstance(v, bool))
