"""Dataclasses from plain dicts (YAML, JSON) with one-line errors, and their fields' documentation.

The typed configs of runs, data, tasks and mixers are all built here. A field typed ``Literal["a", "b"]`` takes
one of those values, and any other is refused naming the field, the value, the choices and the likely one. This
module imports nothing else of attnlab but its errors, so any module can use it without an import cycle.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing

from .errors import ConfigError, unknown_name


def from_dict(cls, values: dict, where: str = ""):
    """Build dataclass ``cls`` from a plain dict, rejecting unknown fields and values of the wrong type. A class
    whose fields moved defines ``upgrade(values) -> values``, which moves them from where they were (the configs
    of saved runs keep the names of their time)."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping of fields, got {values!r}")
    if callable(getattr(cls, "upgrade", None)):
        values = cls.upgrade(values)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise ConfigError(unknown_name("field", path, [f"{where}.{f}" if where else f for f in fields]))
        kwargs[key] = _coerce(hints[key], value, path)
    return cls(**kwargs)


def check_choices(obj, where: str) -> None:
    """The fields typed Literal[...] of a dataclass built directly (not by from_dict) hold one of their choices:
    a config's validate() calls it, so that a config made in Python is refused as one read from YAML is."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if _has_choices(hints[f.name]):
            _coerce(hints[f.name], getattr(obj, f.name), f"{where}.{f.name}" if where else f.name)


def _has_choices(hint) -> bool:
    return typing.get_origin(hint) is typing.Literal or any(_has_choices(arg) for arg in typing.get_args(hint))


def _coerce(hint, value, path: str):
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value or {}, path)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, path)
    if value is None and hint is not typing.Any:  # `field=` on the command line, or `field:` in YAML
        raise ConfigError(f"{path}= needs a value: give {_kind(hint, origin)}")
    if origin is typing.Literal:
        if value not in args or isinstance(value, bool) != isinstance(args[0], bool):  # True == 1 in Python
            raise ConfigError(unknown_name(path, str(value), [str(a) for a in args]))
        return value
    if origin is list:
        if isinstance(value, (str, int, float, bool)):  # one name is a list of one: train.log_to=tensorboard
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path} must be a list, e.g. {path}=[a,b], got {value!r}")
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a mapping, got {value!r}")
        if _has_choices(args[0]):  # keys from a fixed set, e.g. the sources of a mix
            value = {_coerce(args[0], k, f"{path} key"): v for k, v in value.items()}
        return {k: _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if hint is typing.Any:
        return value
    if hint is float and isinstance(value, (int, str)) and not isinstance(value, bool):
        try:  # YAML 1.1 reads 3e-4 (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if hint is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{path}={value!r} must be of type {hint.__name__}")
    return value


def _kind(hint, origin) -> str:
    """What a field of this type takes, for messages: 'an int', 'a str', 'a list, ...'."""
    if origin is list:
        return "a list, e.g. [a,b], or one name"
    if origin is dict:
        return "a mapping, e.g. {a: 1}"
    if origin is typing.Literal:
        return f"one of {', '.join(map(str, typing.get_args(hint)))}"
    name = getattr(hint, "__name__", str(hint))
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def choices(hint) -> tuple | None:
    """The values a field typed Literal[...] (or Optional of one) takes; None for any other type."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    inner = [a for a in typing.get_args(hint) if a is not type(None)]
    return choices(inner[0]) if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(inner) == 1 else None


def field_docs(cls) -> dict[str, str]:
    """{field: its documentation} for a dataclass: the comment on the field's line in the source, else the
    comment lines just above it, taken from the class that declares it or, if that has none, a base."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # subclasses last, so that their comments win
        if dataclasses.is_dataclass(klass):
            docs.update({name: doc for name, doc in _source_comments(klass).items() if doc})
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


FIELD_LINE = re.compile(r"^    (\w+)\s*:[^#]*(?:#\s*(.*))?$")


def _source_comments(klass) -> dict[str, str]:
    try:
        lines = inspect.getsource(klass).splitlines()
    except (OSError, TypeError):  # no source to read (e.g. a frozen application)
        return {}
    comments, above = {}, []
    for line in lines:
        if line.startswith("    #"):
            above.append(line.strip().lstrip("#").strip())
            continue
        match = FIELD_LINE.match(line)
        if match:
            comments[match[1]] = match[2] or " ".join(above)
        above = []
    return comments
