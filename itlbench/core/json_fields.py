"""Whether a JSON value can stand for a dataclass field of a given type, and the type in words: the check that
makes a hand-written `--engine-config` or hardware profile a one-line error instead of a TypeError later."""

from __future__ import annotations

import json
import types
from typing import Any, Literal, Union, get_args, get_origin


def fits(value: object, hint: Any) -> bool:
    """Whether a JSON value can stand for a field of this type (JSON's numbers: an int where a float goes;
    containers and other types are not checked here)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(fits(value, arg) for arg in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        return isinstance(value, int if hint is int else int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True


def type_name(hint: Any) -> str:
    """The type in words, for the fix: "an integer or null", "\\"budget\\" or \\"prefill-first\\"", ..."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in get_args(hint))
    if origin is Literal:
        return " or ".join(json.dumps(arg) for arg in get_args(hint))
    names = {type(None): "null", bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))
