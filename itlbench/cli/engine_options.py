"""The bundled engine's command-line options, derived once from `EngineConfig`'s fields.

Every field is the flag of the same name (`chunk_budget` is `--chunk-budget`, a bool `mixed` is
`--mixed/--no-mixed`) with the field's own help text and default, so a new engine setting is one
new field and every command that takes engine options (run, serve, sweep, capacity, phases) has it.
A command receives them as one `engine_flags` dict and turns it into an `EngineConfig` with
`engine_config_from_flags`.
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable, Iterable
from dataclasses import fields
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer

from itlbench.core.engine_config import EngineConfig, flag_of
from itlbench.core.presets import default_preset
from itlbench.system import nvidia

ENGINE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EngineConfig))
_HINTS = typing.get_type_hints(EngineConfig)


def _cli_type(hint: Any, parse: Callable[[str], object] | None) -> Any:
    """The type typer parses the flag as: text where the field parses its own, str for Literals."""
    if parse is not None:
        return str
    optional = get_origin(hint) in (Union, UnionType) and type(None) in get_args(hint)
    base = next(a for a in get_args(hint) if a is not type(None)) if optional else hint
    if get_origin(base) is Literal:
        base = str
    return base | None if optional else base


def _parameter(name: str, default: Any) -> inspect.Parameter:
    field = EngineConfig.__dataclass_fields__[name]
    parse = field.metadata.get("parse")
    hint = _cli_type(_HINTS[name], parse)
    is_bool = hint in (bool, bool | None)
    decls = [f"{flag_of(name)}/--no-{name.replace('_', '-')}"] if is_bool else [flag_of(name)]
    if parse is not None and default is not None and not isinstance(default, str):
        default = str(default)
    if parse is not None and default is None:
        default = "none"
    option = typer.Option(*decls, help=field.metadata.get("help", ""), show_default=True)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[hint, option])


def engine_options(*, exclude: Iterable[str] = (), only: Iterable[str] | None = None,
                   defaults: dict[str, Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the engine flags to a typer command; the command takes them as `engine_flags: dict`.

    `exclude`: fields the command defines itself (run's `--model` also names an external server's
    model); `only`: the subset it takes; `defaults`: command-specific defaults (phases: unchunked)."""
    skip = set(exclude)
    names = [n for n in (only if only is not None else ENGINE_FIELDS) if n not in skip]
    overrides = defaults or {}

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        # resolved here, in the command's own module: typer would resolve the string annotations in this
        # module's namespace and miss the command's Annotated aliases (their flag name and help)
        hints = typing.get_type_hints(fn, include_extras=True)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
               if p.name != "engine_flags"]
        extra = [_parameter(n, overrides.get(n, _field_default(n))) for n in names]

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            flags = {n: kwargs.pop(n) for n in names}
            return fn(*args, engine_flags=flags, **kwargs)

        command.__signature__ = sig.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
        return command

    return decorate


def _field_default(name: str) -> Any:
    default = EngineConfig.__dataclass_fields__[name].default
    return None if name == "model" else default  # the model's default depends on the device


def engine_config_from_flags(flags: dict[str, Any], **changes: Any) -> EngineConfig:
    """An EngineConfig from a command's `engine_flags` (text parsed where the field says how)."""
    values = {**flags, **changes}
    for name, value in values.items():
        parse = EngineConfig.__dataclass_fields__[name].metadata.get("parse")
        if parse is not None and isinstance(value, str):
            values[name] = parse(value)
    if values.get("model") is None:
        sim = values.get("engine") == "sim"
        values["model"] = default_preset(not sim and _cuda_for(values.get("device", "auto")), sim=sim)
    return EngineConfig(**values)


def _cuda_for(device: str) -> bool:
    """Whether a run on `device` gets a GPU: asks torch, where it is installed and a driver is, unless told cpu."""
    if device == "cpu" or ("torch" not in sys.modules and not nvidia.driver_present()):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def given_on_command_line(ctx: typer.Context, names: Iterable[str]) -> list[str]:
    """Which of these parameters the user typed (not defaults)."""
    return [n for n in names if n in ctx.params
            and getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]
