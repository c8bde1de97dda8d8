"""Profiles from experiments/profiles/*.yaml and ``--set`` overrides: parse, refuse what does not fit
the schema, build the frozen dataclasses, run the cross-field checks, settle the features mode.

Unknown or misspelled keys are errors; every value is checked before any work starts, each field
against the rule in its class's ``RULES`` (type and range), then the cross-field checks. A bad
profile is refused with one line: the file (and the ``--set`` that caused it), the key, what is
allowed and what was given. ``--set a.b=c`` overrides parse ``c`` as YAML (numbers, lists, booleans).
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Hashable
from pathlib import Path

import yaml

from common.rules import Rule, is_int
from orchestrator.profile.checks import check_profile
from orchestrator.profile.errors import ProfileError
from orchestrator.profile.schema import Profile

PROFILE_DIR = Path(__file__).resolve().parents[2] / "experiments" / "profiles"


def _float_text(v, rule: Rule) -> str:
    """PyYAML reads 3e-5 (no dot) as a string: say so when that is what went wrong."""
    if isinstance(v, str) and "number" in rule.allowed:
        try:
            float(v)
        except ValueError:
            return ""
        return " (a string: YAML 1.1 reads a float without a dot as text; write 3.0e-5, not 3e-5)"
    return ""


def _float_hint(hint) -> bool:
    return hint is float or float in typing.get_args(hint)


def _check_structure(cls, data, path: str) -> None:
    """``data`` (parsed YAML) against ``cls``'s shape, whole document first: sections are mappings
    and every key is known."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not isinstance(data, dict):
        what = f"{path} must be a mapping" if path else "the profile must be a mapping (key: value lines)"
        got = f"{type(data).__name__} {_short(data)}"
        raise ProfileError(f"{what} of keys {sorted(fields)}, got {got}", path or None)
    for k in data:
        if k not in fields:
            where = f"{path}.{k}" if path else str(k)
            close = difflib.get_close_matches(str(k), fields, n=1)
            guess = f" (did you mean {(f'{path}.' if path else '') + close[0]!r}?)" if close else ""
            section = path or "the profile"
            raise ProfileError(f"unknown key {where!r}{guess}; allowed in {section}: {sorted(fields)}", where)
    hints = typing.get_type_hints(cls)
    for k, v in data.items():
        if dataclasses.is_dataclass(hints[k]):
            _check_structure(hints[k], v, f"{path}.{k}" if path else k)


def _build(cls, data: dict, path: str):
    """``data`` into ``cls``, each value checked against its rule in field order (a nested section
    where its field stands), so the first bad value is the one it always was. Valid ints for float
    fields become floats (stable unit keys)."""
    hints, kwargs = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        v = data[f.name]
        key = f"{path}.{f.name}" if path else f.name
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            kwargs[f.name] = _build(hint, v, key)
            continue
        rule: Rule = cls.RULES[f.name]  # every field has one (tests/test_bad_input.py)
        if not rule.ok(v):
            raise ProfileError(f"{key} must be {rule.allowed}, got {v!r}{_float_text(v, rule)}", key)
        kwargs[f.name] = float(v) if _float_hint(hint) and is_int(v) else v
    try:
        return cls(**kwargs)
    except ValueError as e:  # a rule across fields (__post_init__): one line, as every other refusal
        raise ProfileError(str(e), path or None) from None


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for k, _ in node.value:
            if k.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' may be overridden by explicit keys
                continue
            key = self.construct_object(k, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", k.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: where, and what the parser expected."""
    mark = getattr(e, "problem_mark", None)
    at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = getattr(e, "problem", None) or str(e)
    ctx = getattr(e, "context", None)
    return " ".join(f"{at}{what}{f' ({ctx})' if ctx else ''}".split())


def _apply_set(data: dict, assignment: str) -> str:
    """Apply one ``--set a.b=c`` to ``data``; returns the dotted key."""
    if "=" not in assignment:
        raise ProfileError(f"expected key=value (e.g. train.epochs=2), got {assignment!r}")
    key, raw = assignment.split("=", 1)
    parts = [p.strip() for p in key.split(".")]
    if not all(parts):
        raise ProfileError(f"expected a dotted key such as train.epochs before '=', got {key!r}")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ProfileError(f"the value {raw!r} is not valid YAML: {_yaml_problem(e)}", key) from None
    node = data
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            section = ".".join(parts[: i + 1])
            raise ProfileError(f"{section} is a value ({_short(node)}), not a section with keys", key)
    node[parts[-1]] = value
    return ".".join(parts)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_profile(name_or_path: str, overrides: list[str] = (), finish=None) -> Profile:
    """Read a profile by name (experiments/profiles/NAME.yaml) or path, apply --set, validate; then
    ``finish`` (the plan's ``data.feature_mode auto`` resolution: orchestrator.plan.sizing.load_profile),
    whose refusals name the file and the --set at fault as every other one does.

    Every refusal is one ProfileError line:
    ``<file>[ with --set <assignment>]: <key> must be <what is allowed>, got <value>``."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise ProfileError(f"profile {name_or_path!r} not found (looked for {path}); shipped profiles: "
                           f"{known}")
    shown = _shown(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.YAMLError as e:
        raise ProfileError(f"{shown}: not valid YAML: {_yaml_problem(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{shown}: cannot be read: {e}") from None
    data = {} if data is None else data  # an empty file: every default
    if not isinstance(data, dict):  # a list or a scalar: _check_structure says what a profile is instead
        _fail_at(shown, lambda: _check_structure(Profile, data, ""))
    set_keys = {}
    for s in overrides:
        try:
            set_keys[_apply_set(data, s)] = s
        except ProfileError as e:
            raise ProfileError(f"{shown} with --set {s}: {e}", e.key) from None
    data.setdefault("name", path.stem)
    return _fail_at(shown, lambda: _validated(data, finish), set_keys=set_keys)


def _validated(data: dict, finish=None) -> Profile:
    """Structure, then every field's rule, then the cross-field checks, then ``finish``."""
    _check_structure(Profile, data, "")
    p = _build(Profile, data, "")
    check_profile(p)
    return finish(p) if finish else p


def _fail_at(shown: str, fn, set_keys: dict | None = None):
    """Run ``fn``; a ProfileError gets the file (and the --set that set the key at fault) in front."""
    try:
        return fn()
    except ProfileError as e:
        k = e.key or ""
        culprits = [s for key, s in (set_keys or {}).items()
                    if k == key or k.startswith(key + ".") or key.startswith(k + ".")] if k else []
        where = shown + "".join(f" with --set {s}" for s in culprits)
        raise ProfileError(f"{where}: {e}", e.key) from None


def profile_dict(p: Profile) -> dict:
    return dataclasses.asdict(p)
